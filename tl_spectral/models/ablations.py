"""Deprecated path of :mod:`tl_spectral.interventions.ablations` (moved there: an experiment on
a model, not part of the model family). Importing it warns once and binds the new module
itself under the old name, so both names are one module object; removed in tl_spectral 0.3
(docs/api.md, "Deprecated spellings")."""

import sys

from tl_spectral import _deprecation
from tl_spectral.interventions import ablations as _moved

_deprecation.warn_deprecated("tl_spectral.models.ablations", "tl_spectral.interventions.ablations",
                             stacklevel=3)
sys.modules[__name__] = _moved
