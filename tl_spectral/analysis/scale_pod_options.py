"""The knobs shared by every scale-POD path (per layer, per head): one frozen, validated
parameter object, :class:`ScalePODOptions`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tl_spectral.analysis.wavelets import DEFAULT_WAVELET

__all__ = ["ScalePODOptions"]


@dataclasses.dataclass(frozen=True)
class ScalePODOptions:
    """Settings of :func:`~tl_spectral.analysis.scale_pod.scale_pod_layer` and
    :func:`~tl_spectral.analysis.scale_pod.scale_pod_heads_layer` (and of ``scale_pod`` /
    ``scale_pod_heads``, which pass them on); see ``scale_pod_layer`` for what each means.

    Pass ``options=ScalePODOptions(...)`` or the same names as keywords (not both).

    Attributes:
        center: subtract the ensemble mean first.
        scales: CWT scales (default ``default_scales(T)``).
        wavelet: PyWavelets continuous wavelet name.
        max_dominant: most dominant scales kept (>= 1).
        min_ratio: least factor between two dominant scales.
        min_peak_fraction: least share of the largest ``E(a)`` of a dominant scale.
        window_threshold: band snapshots keep the lags where ``G_m`` exceeds it.
        lag_window: ``"signed"`` or ``"absolute"``.
        epsilon: tolerance of ``H*(epsilon)``, in ``[0, 1)``.
        lag_chunk: lags per batched Gram GEMM (>= 1).
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
    def resolve(cls, options: ScalePODOptions | None, **keywords: Any) -> ScalePODOptions:
        """``options`` if given (then every keyword must keep its default), else the
        options of ``keywords``."""
        if options is None:
            return cls(**keywords)
        if not isinstance(options, cls):
            raise ValueError(f"options must be a ScalePODOptions (got {type(options).__name__})")
        defaults = cls()
        changed = sorted(k for k, v in keywords.items()
                         if not _same(v, getattr(defaults, k)))
        if changed:
            raise ValueError(f"pass either options=ScalePODOptions(...) or the keywords "
                             f"{changed}, not both (put them into the options)")
        return options


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # tensors, arrays
        return False
