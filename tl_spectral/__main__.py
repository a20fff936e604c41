"""``python -m tl_spectral`` = ``tl-spectral`` (also under ``torchrun``)."""

import sys

from tl_spectral.cli import main

sys.exit(main())
