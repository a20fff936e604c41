"""The knobs shared by every scale-POD path (per layer, per head): one frozen, validated
parameter object, :class:`ScalePODOptions`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tl_spectral._deprecation import warn_deprecated
from tl_spectral.analysis.wavelets import DEFAULT_WAVELET

__all__ = ["OPTION_NAMES", "ScalePODOptions"]


@dataclasses.dataclass(frozen=True)
class ScalePODOptions:
    """Settings of :func:`~tl_spectral.analysis.scale_pod.scale_pod_layer` and
    :func:`~tl_spectral.analysis.scale_pod.scale_pod_heads_layer` (and of ``scale_pod`` /
    ``scale_pod_heads``, which pass them on); see ``scale_pod_layer`` for what each means.

    The one way to pass these settings: ``options=ScalePODOptions(...)`` (the same names as
    keywords are deprecated). Every value is validated here, once.

    The fields: ``center`` subtracts the ensemble mean first; ``scales`` are the CWT scales
    (default ``default_scales(T)``); ``wavelet`` is the PyWavelets continuous wavelet name;
    ``max_dominant`` the most dominant scales kept (>= 1); ``min_ratio`` the least factor
    between two dominant scales; ``min_peak_fraction`` the least share of the largest
    ``E(a)`` of a dominant scale; band snapshots keep the lags where ``G_m`` exceeds
    ``window_threshold``; ``lag_window`` is ``"signed"`` or ``"absolute"``; ``epsilon`` the
    tolerance of ``H*(epsilon)``, in ``[0, 1)``; ``lag_chunk`` the lags per batched Gram GEMM
    (>= 1).
    """

    center: bool = False
    scales: Any = None
    wavelet: str = DEFAULT_WAVELET
    max_dominant: int = 3
    min_ratio: float = 1.5
    min_peak_fraction: float = 0.01
    window_threshold: float = 1e-4
    lag_window: str = "signed"
    epsilon: float = 0.10
    lag_chunk: int = 16

    def __post_init__(self) -> None:
        if self.lag_window not in ("signed", "absolute"):
            raise ValueError(f"lag_window must be 'signed' or 'absolute' (got {self.lag_window!r})")
        if isinstance(self.max_dominant, bool) or int(self.max_dominant) != self.max_dominant \
                or self.max_dominant < 1:
            raise ValueError(f"max_dominant must be >= 1 (got {self.max_dominant})")
        if not 0.0 <= float(self.epsilon) < 1.0:
            raise ValueError(f"epsilon must lie in [0, 1) (got {self.epsilon})")
        if isinstance(self.lag_chunk, bool) or int(self.lag_chunk) != self.lag_chunk \
                or self.lag_chunk < 1:
            raise ValueError(f"lag_chunk must be a positive int (got {self.lag_chunk!r})")
        for name in ("min_ratio", "min_peak_fraction", "window_threshold"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (got {v!r})")
        if not isinstance(self.wavelet, str):
            raise ValueError(f"wavelet must be a PyWavelets wavelet name (got {self.wavelet!r})")

    @classmethod
    def of(cls, options: ScalePODOptions | None, old: dict[str, Any], where: str, *,
           stacklevel: int = 4) -> ScalePODOptions:
        """The options of a call to ``where``: ``options`` (default ``ScalePODOptions()``).
        ``old``: settings the call still passes as keywords (the spelling before
        ``options=``): they warn (deprecated) and become the options; with ``options`` too
        they are refused. ``stacklevel`` 4 points the warning at the caller of ``where``."""
        unknown = sorted(set(old) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
        if options is not None and not isinstance(options, cls):
            raise ValueError(f"options must be a ScalePODOptions (got {type(options).__name__})")
        if not old:
            return cls() if options is None else options
        spelled = ", ".join(f"{k}=..." for k in sorted(old))
        if options is not None:
            raise ValueError(f"{where}() got options= and the keywords {sorted(old)}; put them "
                             f"into options=ScalePODOptions({spelled}), not both")
        warn_deprecated(f"{where}({spelled})", f"{where}(options=ScalePODOptions({spelled}))",
                        stacklevel=stacklevel)
        return cls(**old)

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keywords of ``kwargs`` that name a field of the options, popped from it."""
        return {k: kwargs.pop(k) for k in list(kwargs) if k in OPTION_NAMES}


#: the fields of :class:`ScalePODOptions`, the settings no function takes as a keyword
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(ScalePODOptions))
