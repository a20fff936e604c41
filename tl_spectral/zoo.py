"""Reference models that load with no network: ``tl_spectral.zoo.load(name)``.

Re-exports :mod:`tl_spectral.models.zoo`.
"""

from tl_spectral.models.zoo import *  # noqa: F401,F403
from tl_spectral.models.zoo import available, load  # noqa: F401
