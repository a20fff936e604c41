"""Scale-selective POD of attention fields (SPEC A; arXiv 2606.06573).

Per layer, from the lag-coordinate fluctuation fields ``F: [N, T, n_lags]`` of ``N``
documents (``F_s(i, tau)``, query ``i``, lag ``tau`` on the grid ``lags``):

1. scalogram ``E(a, tau) = mean_{s,i} |W_{s,i}(a, tau)|^2`` of the Morlet CWT of every lag
   profile ``F_s(i, .)`` (computed exactly from the lag second-moment matrix, see
   :func:`~tl_spectral.analysis.wavelets.scalogram`), scale energy ``E(a)``, the three
   fixed bands' energy shares and the dominant scales ``a*_m``;
2. for each ``a*_m`` the Gaussian lag window ``G_m(tau) = exp(-(tau - a*_m)^2 / (2 sigma_m^2))``,
   ``sigma_m = a*_m / 2``, the band snapshots ``X^m_s = vec(F_s ⊙ G_m)`` restricted to the
   lags where ``G_m > 1e-4``, and their POD (eigenvalues, ``T_spec``, ``H*``, modes as
   ``(query, lag)`` images, per-document coefficients);
3. the POD of the whole (unfiltered) field — its ``H*`` is the layer's effective rank
   ``H*_l`` used for the head allocation — and the cross-coherence ``gamma_ij(a)`` of a
   strided subset of queries.

Across layers, :func:`scale_pod` adds the head allocation (SPEC A.10): head counts
proportional to ``H*_l`` under the model's head budget (integers, each >= 1, summing to the
budget), beside the uniform allocation.

Cost. Every Gram matrix (whole field and bands) comes from one pass of per-lag Gram
matrices ``K_tau = F[:, :, tau] F[:, :, tau]^T`` (batched GEMMs over lag chunks):
``K_full = sum_tau K_tau / N`` and ``K_m = sum_tau G_m(tau)^2 K_tau / N``, so all of them cost
one Gram of the full field, ``O(N^2 T n_lags)``; the band snapshots are never formed (modes
are recovered as ``X^T a_k / sqrt(N lambda_k)`` directly from the field). Memory: the
caller's ``F``, one lag-major (centred) copy of it, and a few ``[N, N]`` matrices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral.analysis.coherence import coherence_from_spectrum, cross_spectrum, default_queries
from tl_spectral.analysis.pod import (
    PODResult,
    effective_rank,
    pod_from_gram,
    spectral_concentration,
)
from tl_spectral.analysis.wavelets import (
    DEFAULT_WAVELET,
    FIXED_BANDS,
    LagCWT,
    band_energies,
    default_scales,
    dominant_scales,
    scale_energy,
    scalogram_from_moment,
    scalogram_from_moments,
)
from tl_spectral.results import Result, register_result

__all__ = [
    "ScalePODHeadsLayer",
    "ScalePODHeadsResult",
    "ScalePODLayer",
    "ScalePODResult",
    "allocate_heads",
    "allocation_table",
    "band_energy_operators",
    "gaussian_lag_window",
    "head_diversity",
    "lag_fields",
    "pod_statistics",
    "scale_pod",
    "scale_pod_bootstrap",
    "scale_pod_heads",
    "scale_pod_heads_layer",
    "scale_pod_grams",
    "scale_pod_layer",
]


# ----------------------------------------------------------------------------- inputs
def lag_fields(
    A: Float[Tensor, "... T T"],
    *,
    causal: bool = True,
    max_lag: int | None = None,
) -> tuple[Float[Tensor, "... T n_lags"], Tensor]:
    """Lag coordinates of fields ``A[..., i, j]`` (SPEC A.3).

    Causal: ``tau = i - j`` in ``[0, max_lag]`` (default ``T - 1``), ``F[..., i, tau] =
    A[..., i, i - tau]``, zero where ``tau > i``. Bidirectional: ``tau = j - i`` in
    ``[-max_lag, max_lag]``, ``F[..., i, tau] = A[..., i, i + tau]``, zero outside
    ``0 <= i + tau < T``. Returns ``(F [..., T, n_lags], lags [n_lags] int64)``.
    """
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must be [..., T, T] (got {tuple(A.shape)})")
    T = int(A.shape[-1])
    L = T - 1 if max_lag is None else int(max_lag)
    if not 0 <= L <= T - 1:
        raise ValueError(f"max_lag must lie in [0, T-1] = [0, {T - 1}] (got {max_lag})")
    lags = torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)
    i = torch.arange(T)[:, None]
    j = i - lags[None, :] if causal else i + lags[None, :]  # [T, n_lags]
    valid = (j >= 0) & (j < T)
    idx = j.clamp(0, T - 1).expand(*A.shape[:-2], T, lags.numel())
    F = torch.gather(A, -1, idx) * valid.to(A.dtype)
    return F, lags


def gaussian_lag_window(lags: Tensor, scale: float, *, absolute: bool = False) -> Tensor:
    """``G(tau) = exp(-(tau - a)^2 / (2 sigma^2))``, ``sigma = a / 2`` (SPEC A.5): ``[n_lags]``
    float64. ``absolute=True`` uses ``|tau|`` (both directions of a bidirectional field)."""
    if not scale > 0:
        raise ValueError(f"scale must be positive (got {scale})")
    tau = lags.to(torch.float64)
    if absolute:
        tau = tau.abs()
    sigma = scale / 2.0
    return torch.exp(-((tau - scale) ** 2) / (2.0 * sigma**2))


def _stack_fields(F) -> Tensor:
    if isinstance(F, Tensor):
        if F.ndim != 3:
            raise ValueError(
                f"F must be [N documents, T queries, n_lags] (got shape {tuple(F.shape)}); "
                "convert [N, T, T] fields with lag_fields()"
            )
        return F
    items = list(F)
    if not items:
        raise ValueError("no documents given; pass F [N, T, n_lags] with N >= 2")
    shapes = {tuple(x.shape) for x in items}
    if len(shapes) > 1:
        raise ValueError(
            f"fields of unequal length: documents have shapes {sorted(shapes)}; every document "
            "must be a window of exactly T tokens (cut equal windows, e.g. "
            "tl_spectral.data.windows)"
        )
    if items[0].ndim != 2:
        raise ValueError(f"each document field must be [T, n_lags] (got {tuple(items[0].shape)})")
    return torch.stack(items)


def _check_lags(lags: Tensor | None, n_lags: int) -> Tensor:
    if lags is None:
        return torch.arange(n_lags)
    lags = torch.as_tensor(lags)
    if lags.ndim != 1 or lags.numel() != n_lags:
        raise ValueError(f"lags must be 1-D with {n_lags} entries (the last axis of F)")
    if lags.is_floating_point():
        if not torch.equal(lags, lags.round()):
            raise ValueError("lags must be integers")
        lags = lags.round()
    lags = lags.to(torch.int64)
    if n_lags > 1 and not torch.all(lags[1:] - lags[:-1] == 1):
        raise ValueError(
            "lags must be consecutive increasing integers (e.g. 0..T-1 causal, "
            "-(T-1)..T-1 bidirectional)"
        )
    return lags


# ----------------------------------------------------------------------------- results
_LAYER_TENSORS = (
    "lags",
    "scales",
    "scalogram",
    "scale_energy",
    "full_eigenvalues",
    "full_modes",
    "full_coefficients",
    "coherence",
    "coherence_queries",
)
_LAYER_TENSOR_DICTS = ("band_eigenvalues", "band_modes", "band_coefficients", "band_lags")


@register_result
@dataclasses.dataclass
class ScalePODLayer(Result):
    """Scale-selective POD of one layer.

    Tensors: ``lags [n_lags]``; ``scales [S]``; ``scalogram [S, n_lags]`` = ``E(a, tau)``;
    ``scale_energy [S]`` = ``E(a)``; ``full_eigenvalues [n]`` (POD of the whole field);
    ``full_modes [k, T, n_lags]``; ``full_coefficients [N, k]``; ``coherence [S, Q, Q]``
    (``gamma_ij(a)``, or None) for the queries ``coherence_queries [Q]``.
    Per band ``m`` (keys ``"0", "1", ...`` by increasing scale): ``band_eigenvalues[m] [n_m]``,
    ``band_modes[m] [k, T, L_m]``, ``band_coefficients[m] [N, k]``, ``band_lags[m] [L_m]``;
    ``bands[m]``: scale, sigma, dim and the POD summary (``T_spec``, ``beta``, ``tspec_r2``,
    ``H_star``, ``H_star_saturated``, ``H_star_str``, ``total_energy``).
    ``full``: the POD summary of the whole field (its ``H_star`` is the layer's ``H*_l``).
    ``band_energy``: shares of ``sum_a E(a)`` in the fixed bands fine / medium / coarse.
    """

    kind: ClassVar[str] = "scale_pod_layer"

    layer: int
    causal: bool
    n_documents: int
    n_queries: int
    lags: Tensor
    scales: Tensor
    scalogram: Tensor
    scale_energy: Tensor
    dominant_scales: list
    band_energy: dict
    full_eigenvalues: Tensor
    full_modes: Tensor
    full_coefficients: Tensor
    full: dict
    band_eigenvalues: dict
    band_modes: dict
    band_coefficients: dict
    band_lags: dict
    bands: list
    coherence: Tensor | None
    coherence_queries: Tensor | None
    config: dict

    # ------------------------------------------------------------------ convenience
    @property
    def H_star(self) -> int:
        return int(self.full["H_star"])

    @property
    def H_star_saturated(self) -> bool:
        return bool(self.full["H_star_saturated"])

    @property
    def T_spec(self) -> float:
        return float(self.full["T_spec"])

    @property
    def n_bands(self) -> int:
        return len(self.bands)

    def pod_result(self, band: int | None = None) -> PODResult:
        """The whole-field POD (``band=None``) or band ``band``'s as a :class:`PODResult`
        (modes flattened to ``[k, T * L]``)."""
        if band is None:
            lam, modes, coef, s = (
                self.full_eigenvalues,
                self.full_modes,
                self.full_coefficients,
                self.full,
            )
        else:
            if not 0 <= band < self.n_bands:
                raise ValueError(f"band must lie in [0, {self.n_bands - 1}] (got {band})")
            k = str(band)
            lam, modes, coef, s = (
                self.band_eigenvalues[k],
                self.band_modes[k],
                self.band_coefficients[k],
                self.bands[band],
            )
        return PODResult(
            eigenvalues=lam,
            modes=modes.reshape(modes.shape[0], -1),
            coefficients=coef,
            mean=None,
            total_energy=float(s["total_energy"]),
            n_snapshots=self.n_documents,
            dim=int(s["dim"]),
            method="snapshots",
            centered=True,
            spectrum_complete=True,
            epsilon=float(self.config["epsilon"]),
            H_star=int(s["H_star"]),
            H_star_saturated=bool(s["H_star_saturated"]),
            beta=float(s["beta"]),
            T_spec=float(s["T_spec"]),
            tspec_r2=float(s["tspec_r2"]),
            tspec_n_fit=int(s["tspec_n_fit"]),
        )

    main_plot: ClassVar[str | None] = "plot_scale_energy"

    def headline(self) -> dict[str, Any]:
        """JSON-able scalars: dominant scales, band energies, whole-field and band POD."""
        return {
            "layer": self.layer,
            "causal": self.causal,
            "n_documents": self.n_documents,
            "T": self.n_queries,
            "n_lags": int(self.lags.numel()),
            "dominant_scales": list(self.dominant_scales),
            "band_energy": dict(self.band_energy),
            "full": dict(self.full),
            "bands": [dict(b) for b in self.bands],
        }

    def to_dict(self, *, include_curves: bool = True) -> dict[str, Any]:
        """JSON-able summary; with ``include_curves`` also ``scales``, ``E(a)``, the
        eigenvalue spectra and the mean off-diagonal coherence per scale."""
        d = self.headline()
        if include_curves:
            d["scales"] = self.scales.tolist()
            d["scale_energy"] = self.scale_energy.tolist()
            d["full_eigenvalues"] = self.full_eigenvalues.tolist()
            d["band_eigenvalues"] = {k: v.tolist() for k, v in self.band_eigenvalues.items()}
            if self.coherence is not None:
                d["coherence_queries"] = self.coherence_queries.tolist()
                d["mean_coherence"] = _mean_offdiag(self.coherence).tolist()
        return d

    # ------------------------------------------------------------------ plots
    def plot_scalogram(self, **kwargs: Any):
        """``E(a, tau)`` image. Returns a Figure."""
        return self._draw("plot_scalogram", **kwargs)

    def plot_scale_energy(self, **kwargs: Any):
        """``E(a)`` with the dominant scales and fixed bands marked. Returns a Figure."""
        return self._draw("plot_scale_energy", **kwargs)

    def plot_spectra(self, **kwargs: Any):
        """Eigen-spectra (log-log) of the whole field and each band with power-law fits."""
        return self._draw("plot_spectra", **kwargs)

    def plot_band_modes(self, **kwargs: Any):
        """First modes of each band as (query, lag) images. Returns a Figure."""
        return self._draw("plot_band_modes", **kwargs)

    def plot_mode_profiles(self, **kwargs: Any):
        """First modes of each band as mean lag profiles. Returns a Figure."""
        return self._draw("plot_mode_profiles", **kwargs)

    def plot_coherence(self, **kwargs: Any):
        """Coherence maps ``gamma_ij(a)`` at the dominant scales. Returns a Figure."""
        return self._draw("plot_coherence", **kwargs)

    # ------------------------------------------------------------------ flattening
    def _flatten(self) -> tuple[dict[str, Any], dict[str, Tensor]]:
        meta: dict[str, Any] = {}
        tensors: dict[str, Tensor] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in _LAYER_TENSORS:
                if v is not None:
                    tensors[f.name] = v
                else:
                    meta[f.name] = None
            elif f.name in _LAYER_TENSOR_DICTS:
                meta[f.name] = sorted(v)
                for k, t in v.items():
                    tensors[f"{f.name}/{k}"] = t
            else:
                meta[f.name] = v
        return meta, tensors

    @classmethod
    def _unflatten(cls, meta: dict[str, Any], tensors: dict[str, Tensor]) -> ScalePODLayer:
        kw = dict(meta)
        for name in _LAYER_TENSORS:
            kw[name] = tensors.get(name)
        for name in _LAYER_TENSOR_DICTS:
            kw[name] = {k: tensors[f"{name}/{k}"] for k in meta.get(name, [])}
        return cls(**kw)


def _mean_offdiag(g: Tensor) -> Tensor:
    Q = g.shape[-1]
    if Q < 2:
        return torch.zeros(g.shape[0], dtype=torch.float64)
    mask = ~torch.eye(Q, dtype=torch.bool)
    return g[:, mask].mean(-1)


@register_result
@dataclasses.dataclass
class ScalePODResult(Result):
    """Scale-selective POD of a model: one :class:`ScalePODLayer` per layer plus the head
    allocation table (SPEC A.10).

    ``allocation``: one row per layer — ``layer``, ``H_star`` (whole-field ``H*_l``),
    ``H_star_str`` (``"≥ N-1"`` when saturated), ``saturated``, ``share`` (``H*_l / sum``),
    ``quota`` (``budget * share``), ``recommended`` (integers >= 1 summing to ``head_budget``)
    and ``uniform`` (the model's heads per layer). Saturated layers enter with their lower
    bound ``N - 1``.
    """

    kind: ClassVar[str] = "scale_pod"
    main_plot: ClassVar[str | None] = "plot_scale_energies"

    layers: list
    allocation: list
    head_budget: int
    config: dict
    _tensors: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.layers and isinstance(self.layers[0], dict):  # rebuilt by Result.load
            flat = self._tensors
            self.layers = [
                ScalePODLayer._unflatten(
                    meta,
                    {
                        k.split("/", 1)[1]: t
                        for k, t in flat.items()
                        if k.split("/", 1)[0] == str(li)
                    },
                )
                for li, meta in enumerate(self.layers)
            ]
        self._tensors = {}

    def save(self, path, *, overwrite: bool = False):
        """Write to a ``.safetensors`` file (layers flattened); ``Result.load`` rebuilds it.
        An existing file is replaced only with ``overwrite=True``."""
        carrier = object.__new__(type(self))
        carrier.allocation = self.allocation
        carrier.head_budget = self.head_budget
        carrier.config = self.config
        metas, flat = [], {}
        for li, layer in enumerate(self.layers):
            meta, tensors = layer._flatten()
            metas.append(meta)
            # clones: layers may share storage (e.g. one ``lags`` tensor), safetensors refuses
            flat.update({f"{li}/{k}": t.clone() for k, t in tensors.items()})
        carrier.layers = metas
        carrier._tensors = flat
        return Result.save(carrier, path, overwrite=overwrite)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def table(self) -> list[dict[str, Any]]:
        """Per-layer summary rows: dominant scales, band energies, T_spec, H*, allocation."""
        rows = []
        for layer, alloc in zip(self.layers, self.allocation):
            rows.append(
                {
                    "layer": layer.layer,
                    "dominant_scales": [round(a, 2) for a in layer.dominant_scales],
                    **{f"E_{k}": v for k, v in layer.band_energy.items()},
                    "T_spec": layer.T_spec,
                    "beta": layer.full["beta"],
                    "tspec_r2": layer.full["tspec_r2"],
                    "H_star": alloc["H_star_str"],
                    "recommended_heads": alloc["recommended"],
                    "uniform_heads": alloc["uniform"],
                }
            )
        return rows

    def to_dict(self, *, include_curves: bool = False) -> dict[str, Any]:
        """JSON-able: config, head budget, allocation table and per-layer summaries."""
        return {
            "config": dict(self.config),
            "head_budget": self.head_budget,
            "allocation": [dict(r) for r in self.allocation],
            "layers": [layer.to_dict(include_curves=include_curves) for layer in self.layers],
        }

    def plot_tspec_hstar(self, **kwargs: Any):
        """``T_spec`` and ``H*`` across layers, with the head allocation. Returns a Figure."""
        return self._draw("plot_tspec_hstar", **kwargs)

    def plot_scale_energies(self, **kwargs: Any):
        """``E(a)`` of every layer (normalised) on one axis. Returns a Figure."""
        return self._draw("plot_scale_energies", **kwargs)


# ----------------------------------------------------------------------------- analysis
def scale_pod_layer(
    F: Float[Tensor, "N T n_lags"] | Sequence[Tensor],
    lags: Tensor | None = None,
    *,
    layer: int = 0,
    center: bool = False,
    scales=None,
    wavelet: str = DEFAULT_WAVELET,
    max_dominant: int = 3,
    min_ratio: float = 1.5,
    min_peak_fraction: float = 0.01,
    window_threshold: float = 1e-4,
    lag_window: str = "signed",
    epsilon: float = 0.10,
    n_modes: int = 8,
    coherence_queries: int | Sequence[int] | Tensor | None = 16,
    lag_chunk: int = 16,
) -> ScalePODLayer:
    """Scale-selective POD of one layer's lag-coordinate fields.

    F: ``[N, T, n_lags]`` fluctuation fields ``F_s(i, tau)`` (or a sequence of ``[T, n_lags]``
        fields, which must all have the same shape); float32 is fine (Grams accumulate in
        float64). With ``center=True`` the ensemble mean is subtracted here.
    lags: ``[n_lags]`` consecutive integer lags (default ``0..n_lags-1``, causal). Causal
        fields (``lags >= 0``): ``tau = i - j``; bidirectional: ``tau = j - i``. Truncated
        lag ranges (``max_lag``) are allowed; scales still default to ``1..T/2``.
    scales: ``[S]`` CWT scales (default :func:`default_scales` ``(T)``: 48 geometric, 1 to T/2).
    wavelet: PyWavelets continuous wavelet (default ``"cmor1.5-1.0"``).
    max_dominant, min_ratio: dominant scales = at most ``max_dominant`` largest local maxima
        of ``E(a)``, pairwise at least a factor ``min_ratio`` apart, each at least
        ``min_peak_fraction`` of the largest ``E(a)`` (see
        :func:`~tl_spectral.analysis.wavelets.dominant_scales`).
    window_threshold: band snapshots keep the lags where ``G_m > window_threshold``.
    lag_window: ``"signed"`` (SPEC: ``G_m(tau)``) or ``"absolute"`` (``G_m(|tau|)``, both
        directions of a bidirectional field).
    epsilon: tolerance of ``H*(epsilon)``. n_modes: modes kept per POD (eigenvalues are
        always all kept). coherence_queries: an int ``Q`` (strided subset,
        :func:`~tl_spectral.analysis.coherence.default_queries`), explicit query indices, or
        None / 0 to skip the coherence. lag_chunk: lags per batched Gram GEMM.
    """
    F = _stack_fields(F)
    if F.is_complex():
        raise ValueError("F must be real")
    if not F.is_floating_point():
        F = F.to(torch.float32)
    N, T, n_lags = (int(d) for d in F.shape)
    if N < 2:
        raise ValueError(
            f"scale-selective POD needs at least N=2 documents (got N={N}); a single "
            "snapshot has no fluctuation"
        )
    if T < 4:
        raise ValueError(f"need T >= 4 tokens per document (got T={T})")
    lags = _check_lags(lags, n_lags)
    if lag_window not in ("signed", "absolute"):
        raise ValueError(f"lag_window must be 'signed' or 'absolute' (got {lag_window!r})")
    if not bool(torch.isfinite(F.sum(dtype=torch.float64))):
        raise ValueError("F contains NaN or inf")
    causal = bool(lags.min() >= 0)
    # Lag-major copy Ft[tau, s, i] (centred if asked): every later step reads it contiguously.
    Ft = torch.empty(n_lags, N, T, dtype=F.dtype)
    mean64 = F.mean(0, dtype=torch.float64)  # [T, n_lags]
    if center:
        mean = mean64.to(F.dtype)
        centered = True
    else:  # fluctuations as passed: mean-free up to rounding? (then at most N - 1 modes)
        mean = None
        rms = float(F.pow(2).sum(dtype=torch.float64)) / N
        centered = float(mean64.pow(2).sum()) <= (1e3 * torch.finfo(F.dtype).eps) ** 2 * rms
    del mean64
    step = max(1, (1 << 22) // (T * n_lags))
    for s0 in range(0, N, step):
        blk = F[s0 : s0 + step]
        if mean is not None:
            blk = blk - mean
        Ft[:, s0 : s0 + step, :] = blk.permute(2, 0, 1)
    del mean
    eps = torch.finfo(F.dtype).eps
    scales_t = default_scales(T) if scales is None else torch.as_tensor(scales, dtype=torch.float64)
    op = LagCWT(
        n_lags,
        scales_t,
        wavelet,
        dtype=torch.float64 if F.dtype == torch.float64 else torch.float32,
    )
    scales_t = op.scales

    # 1. scalogram E(a, tau) = diag(M_a C M_a^H), C = mean_{s,i} x x^T; dominant scales; bands
    prof = Ft.view(n_lags, N * T)
    C = (prof @ prof.T).to(torch.float64) / (N * T)
    E_at = scalogram_from_moment(C, op)  # [S, n_lags]
    E_a = scale_energy(E_at)
    if not float(E_a.sum()) > 0:
        raise ValueError(
            "the fields have zero fluctuation energy; pass fluctuations A_s - mean (or "
            "center=True) of an ensemble whose fields differ"
        )
    dom = dominant_scales(
        E_a,
        scales_t,
        max_scales=max_dominant,
        min_ratio=min_ratio,
        min_peak_fraction=min_peak_fraction,
    )
    a_star = [float(scales_t[i]) for i in dom]
    fixed = band_energies(E_a, scales_t)

    # 2. windows and Gram matrices (whole field + bands) from per-lag Grams
    windows, masks = [], []
    for a in a_star:
        g = gaussian_lag_window(lags, a, absolute=lag_window == "absolute")
        m = g > window_threshold
        windows.append(torch.where(m, g, torch.zeros_like(g)))
        masks.append(m)
    weights = torch.stack([torch.ones(n_lags, dtype=torch.float64)] + [w**2 for w in windows])
    weights = weights.to(F.dtype)  # [1 + n_bands, n_lags]
    grams = torch.zeros(weights.shape[0], N * N, dtype=torch.float64)
    for c0 in range(0, n_lags, lag_chunk):
        c1 = min(n_lags, c0 + lag_chunk)
        Fc = Ft[c0:c1]  # [w, N, T]
        Kc = torch.bmm(Fc, Fc.transpose(1, 2)).view(c1 - c0, N * N)  # [w, N*N]
        grams += (weights[:, c0:c1] @ Kc).to(torch.float64)
        del Kc
    grams /= N
    grams = grams.view(-1, N, N)

    def projector(window: Tensor | None, mask: Tensor | None):
        def project(B: Tensor) -> Tensor:
            # B^T X as [r, T, lags]: (B^T Ft[tau]) for every lag, then window and crop
            Y = torch.matmul(B.T.to(F.dtype), Ft).permute(1, 2, 0)  # [r, T, n_lags]
            if window is not None:
                Y = Y[:, :, mask] * window[mask].to(F.dtype)
            return Y.reshape(Y.shape[0], -1)

        return project

    def run_pod(gram: Tensor, window, mask, dim: int) -> PODResult:
        return pod_from_gram(
            gram,
            projector(window, mask),
            dim,
            rank=n_modes,
            epsilon=epsilon,
            centered=centered,
            eps=eps,
            clip_rank=True,
        )

    full = run_pod(grams[0], None, None, T * n_lags)
    band_pods: list[PODResult] = []
    for b, (w, m) in enumerate(zip(windows, masks)):
        band_pods.append(run_pod(grams[1 + b], w, m, T * int(m.sum())))
    del grams

    # 3. coherence over a strided subset of queries
    if coherence_queries is None or (isinstance(coherence_queries, int) and coherence_queries == 0):
        coh, q_idx = None, None
    else:
        if isinstance(coherence_queries, int):
            q_idx = default_queries(T, coherence_queries)
        else:
            q_idx = torch.as_tensor(coherence_queries, dtype=torch.int64).flatten()
            if q_idx.numel() == 0 or q_idx.min() < 0 or q_idx.max() >= T:
                raise ValueError(f"coherence_queries must be query indices in [0, {T - 1}]")
        G = cross_spectrum(Ft[:, :, q_idx].permute(1, 2, 0), op, method="moments")
        coh = coherence_from_spectrum(G).to(torch.float32)

    def summ(p: PODResult) -> dict[str, Any]:
        s = p.headline()
        return {
            k: s[k]
            for k in (
                "dim",
                "rank",
                "n_available",
                "total_energy",
                "H_star",
                "H_star_saturated",
                "H_star_str",
                "beta",
                "T_spec",
                "tspec_r2",
                "tspec_n_fit",
            )
        }

    bands = []
    for b, (a, m, p) in enumerate(zip(a_star, masks, band_pods)):
        bl = lags[m]
        bands.append(
            {
                "band": b,
                "scale": a,
                "sigma": a / 2.0,
                "lag_min": int(bl.min()),
                "lag_max": int(bl.max()),
                "n_lags": int(bl.numel()),
                **summ(p),
            }
        )
    return ScalePODLayer(
        layer=int(layer),
        causal=causal,
        n_documents=N,
        n_queries=T,
        lags=lags,
        scales=scales_t.clone(),
        scalogram=E_at,
        scale_energy=E_a,
        dominant_scales=a_star,
        band_energy=fixed,
        full_eigenvalues=full.eigenvalues,
        full_modes=full.modes.reshape(-1, T, n_lags),
        full_coefficients=full.coefficients,
        full=summ(full),
        band_eigenvalues={str(b): p.eigenvalues for b, p in enumerate(band_pods)},
        band_modes={
            str(b): p.modes.reshape(-1, T, int(m.sum()))
            for b, (p, m) in enumerate(zip(band_pods, masks))
        },
        band_coefficients={str(b): p.coefficients for b, p in enumerate(band_pods)},
        band_lags={str(b): lags[m].clone() for b, m in enumerate(masks)},
        bands=bands,
        coherence=coh,
        coherence_queries=q_idx,
        config={
            "wavelet": wavelet,
            "epsilon": float(epsilon),
            "max_dominant": int(max_dominant),
            "min_ratio": float(min_ratio),
            "min_peak_fraction": float(min_peak_fraction),
            "window_threshold": float(window_threshold),
            "lag_window": lag_window,
            "n_modes": int(n_modes),
            "center": bool(center),
            "n_scales": int(scales_t.numel()),
        },
    )


def allocate_heads(h_star: Sequence[float], budget: int, *, min_heads: int = 1) -> list[int]:
    """Integer head counts proportional to ``h_star`` (SPEC A.10).

    Quotas ``q_l = budget * h_l / sum h``; start from ``max(min_heads, floor(q_l))`` and move
    single heads (largest remainder ``q_l - n_l`` first; when over budget, remove from the
    layer most above its quota that still has more than ``min_heads``) until the counts sum
    to ``budget``. Ties go to the lower layer index. Returns ``[L]`` ints.
    """
    h = [float(x) for x in h_star]
    L = len(h)
    if L == 0:
        raise ValueError("h_star is empty")
    if any(not math.isfinite(x) or x < 0 for x in h):
        raise ValueError("h_star must be finite and non-negative")
    if budget < L * min_heads:
        raise ValueError(
            f"budget={budget} heads cannot give {L} layers at least {min_heads} each; pass "
            f"budget >= {L * min_heads}"
        )
    total = sum(h)
    q = [budget * x / total for x in h] if total > 0 else [budget / L] * L
    n = [max(min_heads, math.floor(x)) for x in q]
    while sum(n) < budget:
        i = max(range(L), key=lambda k: (q[k] - n[k], -k))
        n[i] += 1
    while sum(n) > budget:
        cand = [k for k in range(L) if n[k] > min_heads]
        i = max(cand, key=lambda k: (n[k] - q[k], -k))
        n[i] -= 1
    return n


def scale_pod(
    fields: Sequence[Tensor] | Tensor,
    lags: Tensor | None = None,
    *,
    n_heads: int | Sequence[int],
    head_budget: int | None = None,
    layer_ids: Sequence[int] | None = None,
    **layer_kwargs: Any,
) -> ScalePODResult:
    """Scale-selective POD of every layer plus the head allocation.

    fields: per layer ``[N, T, n_lags]`` (a sequence, or a tensor ``[L, N, T, n_lags]``),
        all of the same shape; lags: ``[n_lags]`` shared by all layers.
    n_heads: heads per layer of the model (int or ``[L]``), the uniform allocation.
    head_budget: total heads to distribute (default ``sum(n_heads)``).
    layer_ids: layer numbers (default ``0..L-1``). Other keyword arguments go to
    :func:`scale_pod_layer`.
    """
    fields = list(fields)
    if not fields:
        raise ValueError("no layers given")
    shapes = {tuple(f.shape) for f in fields}
    if len(shapes) > 1:
        raise ValueError(
            f"fields of unequal shape across layers: {sorted(shapes)}; every layer must be "
            "[N, T, n_lags] on the same documents and lags"
        )
    L = len(fields)
    uniform = [int(n_heads)] * L if isinstance(n_heads, int) else [int(x) for x in n_heads]
    if len(uniform) != L:
        raise ValueError(f"n_heads has {len(uniform)} entries for {L} layers")
    budget = sum(uniform) if head_budget is None else int(head_budget)
    ids = list(range(L)) if layer_ids is None else [int(x) for x in layer_ids]
    if len(ids) != L:
        raise ValueError(f"layer_ids has {len(ids)} entries for {L} layers")
    layers = [scale_pod_layer(f, lags, layer=li, **layer_kwargs) for li, f in zip(ids, fields)]
    return ScalePODResult(
        layers=layers,
        allocation=allocation_table(layers, uniform, budget),
        head_budget=budget,
        config=dict(layers[0].config),
    )


def allocation_table(
    layers: Sequence[ScalePODLayer], uniform: Sequence[int], budget: int
) -> list[dict[str, Any]]:
    """The head-allocation rows of :class:`ScalePODResult` from per-layer results."""
    hs = [layer.H_star for layer in layers]
    rec = allocate_heads(hs, budget)
    total = sum(hs)
    return [
        {
            "layer": layer.layer,
            "H_star": h,
            "H_star_str": layer.full["H_star_str"],
            "saturated": layer.H_star_saturated,
            "share": h / total,
            "quota": budget * h / total,
            "recommended": r,
            "uniform": int(u),
        }
        for layer, h, r, u in zip(layers, hs, rec, uniform)
    ]


# ============================================================================= per head
#: Summary keys of every POD (whole field or band) in the per-head results.
_HEAD_POD_KEYS = (
    "dim",
    "n_available",
    "total_energy",
    "H_star",
    "H_star_saturated",
    "H_star_str",
    "beta",
    "T_spec",
    "tspec_r2",
    "tspec_n_fit",
)


def _tensor_fields(obj) -> tuple[dict[str, Any], dict[str, Tensor]]:
    meta: dict[str, Any] = {}
    tensors: dict[str, Tensor] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, Tensor):
            tensors[f.name] = v
        else:
            meta[f.name] = v
    return meta, tensors


@register_result
@dataclasses.dataclass
class ScalePODHeadsLayer(Result):
    """Scale-selective POD of every head of one layer (:func:`scale_pod_heads_layer`).

    ``H`` heads, ``S`` scales, ``M = max_dominant`` band slots, ``N`` documents.
    Tensors (per head, float64 unless said): ``lags [n_lags]`` (int64); ``scales [S]``;
    ``scalogram [H, S, n_lags]`` = ``E_h(a, tau)``; ``scale_energy [H, S]`` = ``E_h(a)``;
    ``band_energy [H, 3]`` shares of ``sum_a E_h(a)`` in the fixed bands ``config["bands"]``
    (fine, medium, coarse); ``peak_scale [H]`` the scale of the largest ``E_h(a)`` (the scale
    the head works at); ``centroid_scale [H]`` ``exp(sum_a E_h(a) log a / sum_a E_h(a))``;
    ``band_scales [H, M]`` the dominant scales ``a*_{h,m}`` (NaN where a head has fewer than
    ``M``); ``full_eigenvalues [H, N]`` and ``band_eigenvalues [H, M, N]`` POD eigenvalues,
    descending, zero-padded past each POD's ``n_available``; ``H_star [H]`` (int64) and
    ``T_spec [H]`` of the whole field; ``band_H_star [H, M]`` (-1 where no band) and
    ``band_T_spec [H, M]`` (NaN where no band). Inactive heads (no fluctuation energy) have
    NaN scales and shares, zero eigenvalues, ``H_star = 0``, ``T_spec = NaN``.

    JSON: ``active`` (per head), ``dominant_scales`` (per head, a list), ``full`` (per head,
    the POD summary of the whole field or None), ``bands`` (per head, a list of band dicts as
    in :class:`ScalePODLayer`), ``centered`` (per head), ``diversity`` (the head-diversity
    summary, :func:`head_diversity`), ``config``.
    """

    kind: ClassVar[str] = "scale_pod_heads_layer"

    layer: int
    causal: bool
    n_documents: int
    n_queries: int
    n_heads: int
    lags: Tensor
    scales: Tensor
    scalogram: Tensor
    scale_energy: Tensor
    band_energy: Tensor
    peak_scale: Tensor
    centroid_scale: Tensor
    band_scales: Tensor
    full_eigenvalues: Tensor
    band_eigenvalues: Tensor
    H_star: Tensor
    T_spec: Tensor
    band_H_star: Tensor
    band_T_spec: Tensor
    active: list
    centered: list
    dominant_scales: list
    full: list
    bands: list
    diversity: dict
    config: dict

    def eigenvalues(self, head: int, band: int | None = None) -> Tensor:
        """The nonzero POD eigenvalues of ``head``'s whole field (``band=None``) or of its
        band ``band``: ``[n_available]``."""
        if not 0 <= head < self.n_heads:
            raise ValueError(f"head must lie in [0, {self.n_heads - 1}] (got {head})")
        if band is None:
            s, lam = self.full[head], self.full_eigenvalues[head]
        else:
            if not 0 <= band < len(self.bands[head]):
                raise ValueError(
                    f"head {head} has {len(self.bands[head])} bands; band must lie in "
                    f"[0, {len(self.bands[head]) - 1}] (got {band})"
                )
            s, lam = self.bands[head][band], self.band_eigenvalues[head, band]
        return lam[: int(s["n_available"])] if s is not None else lam[:0]

    def band_names(self) -> list[str]:
        return list(self.config["bands"])

    def plot(self, ax: Any = None):
        """Scale energy E(a) of every head (one line per head; the peak scale marked)."""
        return self._draw("plot", ax=ax)

    def table(self) -> list[dict[str, Any]]:
        """One JSON-able row per head: scales, band shares, whole-field ``T_spec`` and ``H*``."""
        names = self.band_names()
        rows = []
        for h in range(self.n_heads):
            full = self.full[h]
            rows.append(
                {
                    "layer": self.layer,
                    "head": h,
                    "active": bool(self.active[h]),
                    "peak_scale": float(self.peak_scale[h]),
                    "centroid_scale": float(self.centroid_scale[h]),
                    "dominant_scales": [round(a, 2) for a in self.dominant_scales[h]],
                    **{f"E_{k}": float(self.band_energy[h, b]) for b, k in enumerate(names)},
                    "band": self.diversity["band_assignment"][h],
                    "scale_class": self.diversity["scale_classes"][h],
                    "T_spec": full["T_spec"] if full else math.nan,
                    "tspec_r2": full["tspec_r2"] if full else math.nan,
                    "H_star": full["H_star_str"] if full else "0",
                }
            )
        return rows

    def to_dict(self, *, include_curves: bool = False) -> dict[str, Any]:
        """JSON-able: per-head rows, band summaries and the diversity summary; with
        ``include_curves`` also ``scales`` and every head's ``E_h(a)``."""
        d = {
            "layer": self.layer,
            "causal": self.causal,
            "n_documents": self.n_documents,
            "T": self.n_queries,
            "n_lags": int(self.lags.numel()),
            "n_heads": self.n_heads,
            "heads": self.table(),
            "full": list(self.full),
            "bands": [list(b) for b in self.bands],
            "diversity": dict(self.diversity),
        }
        if include_curves:
            d["scales"] = self.scales.tolist()
            d["scale_energy"] = self.scale_energy.tolist()
        return d


@register_result
@dataclasses.dataclass
class ScalePODHeadsResult(Result):
    """Per-head scale-selective POD of a model: one :class:`ScalePODHeadsLayer` per layer
    (:func:`scale_pod_heads`). ``diversity_table()``: one row per layer."""

    kind: ClassVar[str] = "scale_pod_heads"

    layers: list
    config: dict
    _tensors: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.layers and isinstance(self.layers[0], dict):  # rebuilt by Result.load
            flat = self._tensors
            rebuilt = []
            for li, meta in enumerate(self.layers):
                tens = {
                    k.split("/", 1)[1]: t for k, t in flat.items() if k.split("/", 1)[0] == str(li)
                }
                rebuilt.append(ScalePODHeadsLayer(**meta, **tens))
            self.layers = rebuilt
        self._tensors = {}

    def save(self, path, *, overwrite: bool = False):
        """Write to a ``.safetensors`` file (layers flattened); ``Result.load`` rebuilds it."""
        carrier = object.__new__(type(self))
        carrier.config = self.config
        metas, flat = [], {}
        for li, layer in enumerate(self.layers):
            meta, tensors = _tensor_fields(layer)
            metas.append(meta)
            flat.update({f"{li}/{k}": t.clone() for k, t in tensors.items()})
        carrier.layers = metas
        carrier._tensors = flat
        return Result.save(carrier, path, overwrite=overwrite)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def table(self) -> list[dict[str, Any]]:
        """One row per (layer, head) (see :meth:`ScalePODHeadsLayer.table`)."""
        return [row for layer in self.layers for row in layer.table()]

    def plot(self, ax: Any = None):
        """Peak scale of every head (layer × head heat map, log colour scale, colour bar)."""
        return self._draw("plot", ax=ax)

    def diversity_table(self) -> list[dict[str, Any]]:
        """One row per layer: the head-diversity summary (:func:`head_diversity`) without
        the per-head lists."""
        rows = []
        for layer in self.layers:
            d = {
                k: v
                for k, v in layer.diversity.items()
                if k not in ("band_assignment", "scale_classes")
            }
            rows.append({"layer": layer.layer, **d})
        return rows

    def to_dict(self, *, include_curves: bool = False) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "diversity": self.diversity_table(),
            "layers": [layer.to_dict(include_curves=include_curves) for layer in self.layers],
        }


def _class_entropy_bits(counts: Sequence[int]) -> float:
    n = sum(counts)
    if n == 0:
        return math.nan
    return float(-sum((c / n) * math.log2(c / n) for c in counts if c > 0)) + 0.0


def head_diversity(
    scale_energy: Tensor,
    scales: Tensor,
    band_energy: Tensor,
    peak_scale: Tensor,
    centroid_scale: Tensor,
    H_star: Tensor,
    active: Sequence[bool],
    *,
    band_names: Sequence[str] = ("fine", "medium", "coarse"),
    class_ratio: float = 1.5,
) -> dict[str, Any]:
    """Head-diversity summary of one layer (over its active heads; ``H`` heads, ``S`` scales).

    Inputs as in :class:`ScalePODHeadsLayer`: ``scale_energy [H, S]``, ``scales [S]``,
    ``band_energy [H, 3]``, ``peak_scale [H]``, ``centroid_scale [H]``, ``H_star [H]``.
    Returns (JSON-able; NaN where undefined, e.g. no active head):

    - ``n_heads``, ``n_active``;
    - ``peak_scale_min``, ``peak_scale_max``, ``peak_scale_ratio`` (max / min) and
      ``log2_peak_scale_std``: population std of ``log2 a_h`` over heads (octaves; 0 when
      every head peaks at the same scale); ``log2_centroid_scale_std`` likewise for the
      energy centroids;
    - ``scale_classes`` (per head, None when inactive) and ``n_scale_classes``: heads sorted by
      peak scale, a new class starting wherever consecutive peak scales differ by at least
      the factor ``class_ratio`` (1.5, the dominant-scale separation; single linkage in
      ``log a``); classes numbered by increasing scale;
    - ``band_share_mean`` / ``band_share_std``: per fixed band, mean and population std over
      heads of the band's share of ``E_h(a)``;
    - ``band_assignment`` (per head: the band holding its largest share, None when inactive),
      ``band_counts`` and ``band_entropy_bits`` = ``-sum_c p_c log2 p_c`` with ``p_c`` the
      fraction of active heads assigned to band ``c`` (0: all heads in one band; at most
      ``log2 3 = 1.585``); ``band_entropy_norm`` = that / ``log2 3``;
    - ``mean_pairwise_tv``: mean over pairs of active heads of the total-variation distance
      ``(1/2) sum_a |p_h(a) - p_g(a)|`` between their normalised scale energies
      ``p_h = E_h / sum_a E_h`` (0: identical scale profiles, 1: disjoint);
    - ``H_star_min``, ``H_star_max``, ``H_star_mean`` over active heads.
    """
    act = torch.as_tensor(list(active), dtype=torch.bool)
    H = int(act.numel())
    idx = torch.nonzero(act).flatten().tolist()
    nan = math.nan
    out: dict[str, Any] = {"n_heads": H, "n_active": len(idx)}
    pk = peak_scale.to(torch.float64)[act]
    ce = centroid_scale.to(torch.float64)[act]
    if idx:
        out["peak_scale_min"] = float(pk.min())
        out["peak_scale_max"] = float(pk.max())
        out["peak_scale_ratio"] = float(pk.max() / pk.min())
        out["log2_peak_scale_std"] = float(torch.log2(pk).std(unbiased=False))
        out["log2_centroid_scale_std"] = float(torch.log2(ce).std(unbiased=False))
    else:
        for k in ("peak_scale_min", "peak_scale_max", "peak_scale_ratio",
                  "log2_peak_scale_std", "log2_centroid_scale_std"):
            out[k] = nan
    # scale classes: single linkage in log a with threshold log(class_ratio)
    classes: list[int | None] = [None] * H
    order = sorted(idx, key=lambda h: float(peak_scale[h]))
    c, prev = -1, None
    for h in order:
        a = float(peak_scale[h])
        if prev is None or a / prev >= class_ratio:
            c += 1
        classes[h] = c
        prev = a
    out["scale_classes"] = classes
    out["n_scale_classes"] = c + 1
    be = band_energy.to(torch.float64)[act]
    names = list(band_names)
    out["band_share_mean"] = {
        k: (float(be[:, b].mean()) if idx else nan) for b, k in enumerate(names)
    }
    out["band_share_std"] = {
        k: (float(be[:, b].std(unbiased=False)) if idx else nan) for b, k in enumerate(names)
    }
    assign: list[str | None] = [None] * H
    for h in idx:
        assign[h] = names[int(torch.argmax(band_energy[h]))]
    counts = {k: sum(1 for h in idx if assign[h] == k) for k in names}
    out["band_assignment"] = assign
    out["band_counts"] = counts
    out["band_entropy_bits"] = _class_entropy_bits(list(counts.values()))
    out["band_entropy_norm"] = out["band_entropy_bits"] / math.log2(len(names))
    if len(idx) >= 2:
        p = scale_energy.to(torch.float64)[act]
        p = p / p.sum(-1, keepdim=True)
        tv = 0.5 * (p[:, None, :] - p[None, :, :]).abs().sum(-1)
        iu = torch.triu_indices(len(idx), len(idx), 1)
        out["mean_pairwise_tv"] = float(tv[iu[0], iu[1]].mean())
    else:
        out["mean_pairwise_tv"] = 0.0 if idx else nan
    hs = H_star.to(torch.float64)[act]
    out["H_star_min"] = int(hs.min()) if idx else 0
    out["H_star_max"] = int(hs.max()) if idx else 0
    out["H_star_mean"] = float(hs.mean()) if idx else nan
    return out


def _pod_summary(lam_desc: Tensor, total: float, N: int, eps: float, epsilon: float,
                 centered: bool, dim: int) -> tuple[dict[str, Any], int]:
    """The POD summary of one Gram's eigenvalues (descending, float64), as
    :func:`~tl_spectral.analysis.pod.pod_from_gram` computes it: rounding-noise eigenvalues
    (at or below ``max(lambda_max N eps64, eps trace)``) dropped, ``H*`` and its saturation
    flag, the ``T_spec`` fit. Returns ``(summary, n_available)``."""
    tol = max(float(lam_desc[0]) * N * torch.finfo(torch.float64).eps, eps * total)
    n = int((lam_desc > tol).sum())
    lam = lam_desc[:n]
    H, reached = effective_rank(lam, epsilon, total_energy=total)
    cap = N - 1 if centered else N
    sat = (not reached) or (H >= cap)
    fit = spectral_concentration(lam, total_energy=total)
    return (
        {
            "dim": int(dim),
            "n_available": n,
            "total_energy": total,
            "H_star": H,
            "H_star_saturated": sat,
            "H_star_str": f"≥ {H}" if sat else str(H),
            "beta": fit["beta"],
            "T_spec": fit["T_spec"],
            "tspec_r2": fit["r2"],
            "tspec_n_fit": int(fit["n_fit"]),
        },
        n,
    )


def _stack_head_fields(F) -> Tensor:
    if isinstance(F, Tensor):
        if F.ndim != 4:
            raise ValueError(
                f"F must be [N documents, H heads, T queries, n_lags] (got shape "
                f"{tuple(F.shape)}); a head-mean field [N, T, n_lags] is F[:, None]"
            )
        return F
    items = list(F)
    if not items:
        raise ValueError("no documents given; pass F [N, H, T, n_lags] with N >= 2")
    shapes = {tuple(x.shape) for x in items}
    if len(shapes) > 1:
        raise ValueError(
            f"fields of unequal shape: documents have shapes {sorted(shapes)}; every document "
            "must be [H, T, n_lags] with the same T (cut equal windows)"
        )
    if items[0].ndim != 3:
        raise ValueError(f"each document field must be [H, T, n_lags] (got {tuple(items[0].shape)})")
    return torch.stack(items)


def scale_pod_heads_layer(
    F: Float[Tensor, "N H T n_lags"] | Sequence[Tensor],
    lags: Tensor | None = None,
    *,
    layer: int = 0,
    center: bool = False,
    scales=None,
    wavelet: str = DEFAULT_WAVELET,
    max_dominant: int = 3,
    min_ratio: float = 1.5,
    min_peak_fraction: float = 0.01,
    window_threshold: float = 1e-4,
    lag_window: str = "signed",
    epsilon: float = 0.10,
    lag_chunk: int = 16,
    head_chunk: int | None = None,
    scalogram_method: str = "auto",
    inactive_rtol: float | None = None,
) -> ScalePODHeadsLayer:
    """Scale-selective POD of every head of one layer, batched over heads.

    F: ``[N, H, T, n_lags]`` per-head fluctuation fields ``F_{s,h}(i, tau)`` (or a sequence of
        ``N`` fields ``[H, T, n_lags]``); float32 is fine. Every other argument means what it
        means in :func:`scale_pod_layer` (same defaults), and each head gets exactly what
        :func:`scale_pod_layer` computes for that head's field alone — scalogram, scale energy,
        fixed-band shares, dominant scales, its own Gaussian band windows, POD eigenvalues,
        ``T_spec`` and ``H*`` of the whole field and of each band — without modes,
        coefficients or coherence.
    head_chunk: heads per batch (default all): the lag-major copy of the fields, the per-lag
        Grams and the ``[H, 1 + max_dominant, N, N]`` Gram stack are formed for that many heads
        at once. Memory: the caller's ``F``, one lag-major copy of ``head_chunk`` heads, and
        ``(1 + max_dominant) head_chunk`` ``[N, N]`` float64 matrices.
    scalogram_method: see :func:`~tl_spectral.analysis.wavelets.scalogram_from_moments`.
    inactive_rtol: a head whose fluctuation energy ``sum u^2 / N`` is at most ``inactive_rtol``
        times the larger of the layer's largest head fluctuation energy and the head's own
        field energy (``sum F^2 / N`` as passed, before centring) is *inactive* (e.g. a head that always attends to the
        first token: its field never fluctuates) and reported with NaN scales and
        ``H* = 0`` instead of raising; default ``(1e3 eps)^2`` of the field dtype. A layer
        with no active head raises.

    Batching: the lag second moments ``C_h`` (one ``bmm``), the scalograms (one batched
    :func:`scalogram_from_moments`), the per-lag Grams (one batched GEMM per lag chunk for
    all heads), their band-weighted sums (one ``bmm`` with the per-head windows) and the
    eigen-decompositions (one batched ``eigh``) each treat heads as a batch dimension;
    only the peak picking on ``E_h(a)`` (``S`` numbers per head) and the scalar summaries of
    each eigenvalue vector run per head.
    """
    F = _stack_head_fields(F)
    if F.is_complex():
        raise ValueError("F must be real")
    if not F.is_floating_point():
        F = F.to(torch.float32)
    N, H, T, n_lags = (int(d) for d in F.shape)
    if N < 2:
        raise ValueError(
            f"scale-selective POD needs at least N=2 documents (got N={N}); a single "
            "snapshot has no fluctuation"
        )
    if H < 1:
        raise ValueError("F has no heads (H = 0)")
    if T < 4:
        raise ValueError(f"need T >= 4 tokens per document (got T={T})")
    lags = _check_lags(lags, n_lags)
    if lag_window not in ("signed", "absolute"):
        raise ValueError(f"lag_window must be 'signed' or 'absolute' (got {lag_window!r})")
    if max_dominant < 1:
        raise ValueError(f"max_dominant must be >= 1 (got {max_dominant})")
    causal = bool(lags.min() >= 0)
    eps = torch.finfo(F.dtype).eps
    rtol = (1e3 * eps) ** 2 if inactive_rtol is None else float(inactive_rtol)
    scales_t = default_scales(T) if scales is None else torch.as_tensor(scales, dtype=torch.float64)
    op = LagCWT(
        n_lags,
        scales_t,
        wavelet,
        dtype=torch.float64 if F.dtype == torch.float64 else torch.float32,
    )
    scales_t = op.scales
    S = int(scales_t.numel())
    M = int(max_dominant)
    hc = H if head_chunk is None else max(1, int(head_chunk))
    names = list(FIXED_BANDS)
    band_mask = torch.stack(
        [
            ((scales_t >= lo) if lo_in else (scales_t > lo)) & ((scales_t <= hi) if hi_in else (scales_t < hi))
            for lo, hi, lo_in, hi_in in FIXED_BANDS.values()
        ]
    ).to(torch.float64)  # [3, S]
    tau = lags.to(torch.float64)
    if lag_window == "absolute":
        tau = tau.abs()

    E_at = torch.zeros(H, S, n_lags, dtype=torch.float64)
    lam_full = torch.zeros(H, N, dtype=torch.float64)
    lam_band = torch.zeros(H, M, N, dtype=torch.float64)
    band_scales = torch.full((H, M), math.nan, dtype=torch.float64)
    centered_all: list[bool] = [bool(center)] * H
    dominant: list[list[float]] = [[] for _ in range(H)]
    raw_energy = torch.zeros(H, dtype=torch.float64)  # sum F^2 / N of the fields passed
    fluct_energy = torch.zeros(H, dtype=torch.float64)  # sum u^2 / N of the fluctuations
    full_s: list[dict | None] = [None] * H
    bands_s: list[list[dict]] = [[] for _ in range(H)]
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        nh = h1 - h0
        # lag-major (centred) copy Ft[h, tau, s, i] of this chunk of heads
        Fh = F[:, h0:h1]
        mean64 = Fh.mean(0, dtype=torch.float64)  # [nh, T, n_lags]
        if not bool(torch.isfinite(mean64).all()):  # NaN / inf anywhere reach the mean
            raise ValueError("F contains NaN or inf")
        mean_sq = mean64.pow(2).sum(dim=(1, 2))  # [nh] ||mean||^2
        mean = mean64.to(F.dtype) if center else None
        del mean64
        Ft = torch.empty(nh, n_lags, N, T, dtype=F.dtype)
        step = max(1, (1 << 22) // (nh * T * n_lags))
        for s0 in range(0, N, step):
            blk = Fh[s0 : s0 + step]
            if mean is not None:
                blk = blk - mean
            Ft[:, :, s0 : s0 + step, :] = blk.permute(1, 3, 0, 2)
        del mean, Fh
        # 1. lag second moments (one bmm) and scalograms (batched)
        prof = Ft.view(nh, n_lags, N * T)
        C = torch.bmm(prof, prof.transpose(1, 2)).to(torch.float64) / (N * T)
        # energy of what Ft holds, sum ||x||^2 / N; the raw fields' = that + ||mean||^2
        held = torch.diagonal(C, dim1=-2, dim2=-1).sum(-1) * T
        fluct_energy[h0:h1] = held
        if center:
            raw_energy[h0:h1] = held + mean_sq
        else:  # fields passed as fluctuations: mean-free up to rounding?
            raw_energy[h0:h1] = held
            cen = mean_sq <= (1e3 * eps) ** 2 * held
            centered_all[h0:h1] = [bool(x) for x in cen]
        E_at[h0:h1] = scalogram_from_moments(C, op, method=scalogram_method)
        del C, prof
        E_c = E_at[h0:h1].sum(-1)  # [nh, S]
        # dominant scales: peak picking on the S numbers of each head
        for j in range(nh):
            if not float(E_c[j].sum()) > 0:
                continue
            dom = dominant_scales(
                E_c[j],
                scales_t,
                max_scales=M,
                min_ratio=min_ratio,
                min_peak_fraction=min_peak_fraction,
            )
            dominant[h0 + j] = [float(scales_t[i]) for i in dom]
            band_scales[h0 + j, : len(dom)] = scales_t[dom]
        has_band = ~torch.isnan(band_scales[h0:h1])  # [nh, M]
        a = torch.nan_to_num(band_scales[h0:h1], nan=1.0)[:, :, None]
        G = torch.exp(-((tau - a) ** 2) / (2.0 * (a / 2.0) ** 2))  # [nh, M, n_lags]
        mk = (G > window_threshold) & has_band[:, :, None]
        windows = torch.where(mk, G, torch.zeros_like(G))
        weights = torch.cat(
            [torch.ones(nh, 1, n_lags, dtype=torch.float64), windows**2], dim=1
        ).to(F.dtype)  # [nh, 1 + M, n_lags]
        # 2. whole-field and band Grams from per-lag Grams (batched over heads)
        grams = torch.zeros(nh, 1 + M, N * N, dtype=torch.float64)
        # lags per batched GEMM: lag_chunk, fewer when [nh, w, N, N] would pass 2^25 entries
        w = max(1, min(lag_chunk, (1 << 25) // (nh * N * N)))
        for c0 in range(0, n_lags, w):
            c1 = min(n_lags, c0 + w)
            Fc = Ft[:, c0:c1]  # [nh, w, N, T]
            Kc = torch.matmul(Fc, Fc.transpose(-1, -2)).view(nh, c1 - c0, N * N)
            grams += torch.bmm(weights[:, :, c0:c1].contiguous(), Kc).to(torch.float64)
            del Kc
        del Ft
        grams /= N
        grams = grams.view(nh, 1 + M, N, N)
        use = torch.cat([(E_c.sum(-1) > 0)[:, None], has_band], dim=1)  # [nh, 1 + M]
        sel = torch.nonzero(use).tolist()
        if sel:
            K = grams[use]  # [B, N, N]
            del grams
            K = 0.5 * (K + K.transpose(-1, -2))
            totals = torch.diagonal(K, dim1=-2, dim2=-1).sum(-1).tolist()
            lam_all = torch.linalg.eigvalsh(K).flip(-1)  # [B, N] descending
            del K
            for (j, m), lam, tot in zip(sel, lam_all, totals):
                h = h0 + j
                if not tot > 0:
                    continue
                dim = T * n_lags if m == 0 else T * int(mk[j, m - 1].sum())
                summ, n = _pod_summary(lam, tot, N, eps, epsilon, centered_all[h], dim)
                if m == 0:
                    full_s[h] = summ
                    lam_full[h, :n] = lam[:n]
                else:
                    lam_band[h, m - 1, :n] = lam[:n]
                    a_m = float(band_scales[h, m - 1])
                    bl = lags[mk[j, m - 1]]
                    bands_s[h].append(
                        {
                            "band": m - 1,
                            "scale": a_m,
                            "sigma": a_m / 2.0,
                            "lag_min": int(bl.min()),
                            "lag_max": int(bl.max()),
                            "n_lags": int(bl.numel()),
                            **summ,
                        }
                    )
    E_a = E_at.sum(-1)  # [H, S]
    ref_energy = torch.maximum(raw_energy, fluct_energy.max().expand(H))
    act_t = (fluct_energy > rtol * ref_energy) & (E_a.sum(-1) > 0)
    active = [bool(x) for x in act_t]
    if not any(active):
        raise ValueError(
            "the fields have zero fluctuation energy in every head; pass fluctuations "
            "A_s - mean (or center=True) of an ensemble whose fields differ"
        )
    for h in range(H):  # inactive heads: no scales, no POD
        if not active[h]:
            dominant[h], full_s[h], bands_s[h] = [], None, []
            band_scales[h] = math.nan
            lam_full[h] = 0.0
            lam_band[h] = 0.0

    tot = E_a.sum(-1, keepdim=True)
    band_energy = torch.where(
        act_t[:, None], (E_a @ band_mask.T) / tot.clamp_min(1e-300), torch.tensor(math.nan)
    )
    peak = torch.where(act_t, scales_t[E_a.argmax(-1)], torch.tensor(math.nan, dtype=torch.float64))
    logs = torch.log(scales_t)
    centroid = torch.where(
        act_t,
        torch.exp((E_a * logs).sum(-1) / tot.squeeze(-1).clamp_min(1e-300)),
        torch.tensor(math.nan, dtype=torch.float64),
    )
    H_star = torch.tensor([s["H_star"] if s else 0 for s in full_s], dtype=torch.int64)
    T_spec = torch.tensor([s["T_spec"] if s else math.nan for s in full_s], dtype=torch.float64)
    band_H = torch.full((H, M), -1, dtype=torch.int64)
    band_T = torch.full((H, M), math.nan, dtype=torch.float64)
    for h in range(H):
        for b in bands_s[h]:
            band_H[h, b["band"]] = b["H_star"]
            band_T[h, b["band"]] = b["T_spec"]
    diversity = head_diversity(
        E_a, scales_t, band_energy, peak, centroid, H_star, active, band_names=names,
        class_ratio=min_ratio,
    )
    return ScalePODHeadsLayer(
        layer=int(layer),
        causal=causal,
        n_documents=N,
        n_queries=T,
        n_heads=H,
        lags=lags,
        scales=scales_t.clone(),
        scalogram=E_at,
        scale_energy=E_a,
        band_energy=band_energy,
        peak_scale=peak,
        centroid_scale=centroid,
        band_scales=band_scales,
        full_eigenvalues=lam_full,
        band_eigenvalues=lam_band,
        H_star=H_star,
        T_spec=T_spec,
        band_H_star=band_H,
        band_T_spec=band_T,
        active=active,
        centered=centered_all,
        dominant_scales=dominant,
        full=full_s,
        bands=bands_s,
        diversity=diversity,
        config={
            "wavelet": wavelet,
            "epsilon": float(epsilon),
            "max_dominant": M,
            "min_ratio": float(min_ratio),
            "min_peak_fraction": float(min_peak_fraction),
            "window_threshold": float(window_threshold),
            "lag_window": lag_window,
            "center": bool(center),
            "n_scales": S,
            "bands": names,
            "inactive_rtol": rtol,
        },
    )


def scale_pod_heads(
    fields: Sequence[Tensor] | Tensor,
    lags: Tensor | None = None,
    *,
    layer_ids: Sequence[int] | None = None,
    **layer_kwargs: Any,
) -> ScalePODHeadsResult:
    """Per-head scale-selective POD of every layer.

    fields: per layer ``[N, H, T, n_lags]`` per-head fluctuation fields (a sequence, or a
        tensor ``[L, N, H, T, n_lags]``), all of the same shape; lags: ``[n_lags]``.
    layer_ids: layer numbers (default ``0..L-1``). Other keyword arguments go to
    :func:`scale_pod_heads_layer`.
    """
    fields = list(fields)
    if not fields:
        raise ValueError("no layers given")
    shapes = {tuple(f.shape) for f in fields}
    if len(shapes) > 1:
        raise ValueError(
            f"fields of unequal shape across layers: {sorted(shapes)}; every layer must be "
            "[N, H, T, n_lags] on the same documents and lags"
        )
    L = len(fields)
    ids = list(range(L)) if layer_ids is None else [int(x) for x in layer_ids]
    if len(ids) != L:
        raise ValueError(f"layer_ids has {len(ids)} entries for {L} layers")
    layers = [scale_pod_heads_layer(f, lags, layer=li, **layer_kwargs) for li, f in zip(ids, fields)]
    return ScalePODHeadsResult(layers=layers, config=dict(layers[0].config))


# ----------------------------------------------------------------------------- bootstrap
def band_energy_operators(
    n_lags: int, scales: Tensor, wavelet: str = DEFAULT_WAVELET,
    bands: dict[str, tuple[float, float, bool, bool]] | None = None,
) -> dict[str, Tensor]:
    """``P_b = Σ_{a ∈ b} Re(M_aᴴ M_a)`` (``[n_lags, n_lags]`` float64) per band ``b`` (default
    :data:`FIXED_BANDS`), ``M_a`` the CWT operator of scale ``a`` over the lags.

    Since ``E(a) = Σ_τ (M_a C M_aᴴ)[τ, τ] = tr(C M_aᴴ M_a)`` and ``C`` is symmetric, the energy
    of band ``b`` is ``⟨C, P_b⟩``: linear in the fields' second moment, so it has an exact
    document Gram (:func:`scale_pod_grams`)."""
    s = torch.as_tensor(scales, dtype=torch.float64)
    op = LagCWT(n_lags, s, wavelet, dtype=torch.float64)
    M = op.matrix(torch.complex128 if op.is_complex else torch.float64)  # [S, n, n]
    if op.is_complex:
        P_a = M.real.transpose(1, 2) @ M.real + M.imag.transpose(1, 2) @ M.imag
    else:
        P_a = M.transpose(1, 2) @ M
    out: dict[str, Tensor] = {}
    for name, (lo, hi, lo_in, hi_in) in (bands or FIXED_BANDS).items():
        m = (s >= lo if lo_in else s > lo) & (s <= hi if hi_in else s < hi)
        out[name] = P_a[m].sum(0)
    return out


def scale_pod_grams(
    F: Float[Tensor, "N T n_lags"], *, scales=None, wavelet: str = DEFAULT_WAVELET,
    bands: dict[str, tuple[float, float, bool, bool]] | None = None,
) -> dict[str, Tensor]:
    """Document Grams of one layer's fields ``F [N, T, n_lags]`` (float64 ``[N, N]``):
    ``"field"``: ``G[s, t] = ⟨F_s, F_t⟩`` (the whole-field POD's Gram is ``G / N``), and per
    band ``b`` (:func:`band_energy_operators`) ``G_b[s, t] = Σ_i F_s(i) P_b F_t(i)ᵀ``, with
    ``E_b = tr(G_b) / (N T)`` the band's scale energy (:func:`band_energies`' numerator).

    One pass over the fields; afterwards the POD spectrum and band energies of any resample
    of the documents follow from :func:`~tl_spectral.analysis.bootstrap.centred_gram_resample`
    of these Grams, with no further pass (:func:`scale_pod_bootstrap`)."""
    F = _stack_fields(F)
    N, T, n_lags = (int(d) for d in F.shape)
    s = default_scales(T) if scales is None else torch.as_tensor(scales, dtype=torch.float64)
    X = F.reshape(N, T * n_lags)
    dt = torch.float64 if F.dtype == torch.float64 else torch.float32
    out = {"field": (X.to(dt) @ X.to(dt).T).to(torch.float64)}
    for name, P in band_energy_operators(n_lags, s, wavelet, bands).items():
        Y = (F.reshape(N * T, n_lags).to(dt) @ P.to(dt)).reshape(N, T * n_lags)
        out[name] = (Y @ X.to(dt).T).to(torch.float64)
        out[name] = 0.5 * (out[name] + out[name].T)
        del Y
    return out


def _spectrum_from_gram(K: Tensor) -> Tensor:
    """Positive eigenvalues (descending, rounding noise dropped) of a PSD Gram ``K``."""
    K = 0.5 * (K + K.T)
    lam = torch.linalg.eigvalsh(K).flip(0)
    total = float(torch.diagonal(K).sum())
    tol = max(float(lam[0]) * K.shape[0] * torch.finfo(torch.float64).eps,
              torch.finfo(torch.float64).eps * total)
    return lam[lam > tol]


def pod_statistics(
    grams: dict[str, Tensor], idx: Tensor | None = None, *, epsilon: float = 0.10,
    fit_energies: Sequence[float] = (0.90, 0.95, 0.99),
) -> dict[str, float]:
    """Band energy shares, ``H*(epsilon)`` and ``T_spec`` (one per ``fit_energies``: the power
    law fitted over the modes holding that share of the energy; 0.99 is the library's
    default) of the documents ``idx`` (repeats allowed; default all), from
    :func:`scale_pod_grams`. Fluctuations are taken about the resample's own mean. Also
    ``fit_overshoot_<e>``: ``exp(intercept) / λ_1``, how far the fitted line misses the first
    eigenvalue, ``n_fit_<e>``, and ``E_fine_minus_coarse`` when both bands exist."""
    from tl_spectral.analysis.bootstrap import centred_gram_resample

    N = int(grams["field"].shape[0])
    idx = torch.arange(N) if idx is None else idx
    n = int(idx.numel())
    lam = _spectrum_from_gram(centred_gram_resample(grams["field"], idx) / n)
    out: dict[str, float] = {}
    bands = [k for k in grams if k != "field"]
    e = torch.stack([torch.trace(centred_gram_resample(grams[k], idx)) for k in bands])
    for k, v in zip(bands, (e / e.sum()).tolist()):
        out[f"E_{k}"] = v
    if "fine" in bands and "coarse" in bands:
        out["E_fine_minus_coarse"] = out["E_fine"] - out["E_coarse"]
    H, _ = effective_rank(lam, epsilon)
    out["H_star"] = float(H)
    for fe in fit_energies:
        fit = spectral_concentration(lam, energy=fe)
        tag = f"{round(100 * fe)}"
        out[f"T_spec_{tag}"] = float(fit["T_spec"])
        out[f"n_fit_{tag}"] = float(fit["n_fit"])
        out[f"fit_overshoot_{tag}"] = float(math.exp(fit["intercept"]) / float(lam[0]))
    return out


def scale_pod_bootstrap(
    F: Float[Tensor, "N T n_lags"], *, n_resamples: int = 1000, seed: int = 0,
    epsilon: float = 0.10, fit_energies: Sequence[float] = (0.90, 0.95, 0.99),
    scales=None, wavelet: str = DEFAULT_WAVELET, level: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Percentile bootstrap over documents of :func:`pod_statistics` for one layer's
    fluctuation fields: one pass over the fields (:func:`scale_pod_grams`), then per
    resample one ``eigvalsh`` of an ``[N, N]`` matrix and three traces.

    Returns ``{statistic: {"estimate", "low", "high", "level", "n_resamples", "seed"}}``.
    Caveat: a resample holds about 63% distinct documents, so its POD has at most that many
    modes: ``H*`` (and the tail that sets ``T_spec``) are biased low in resamples; their
    intervals measure spread, and the estimate may sit near or above the upper end."""
    from tl_spectral.analysis.bootstrap import bootstrap

    grams = scale_pod_grams(F, scales=scales, wavelet=wavelet)
    keys = list(pod_statistics(grams, epsilon=epsilon, fit_energies=fit_energies))
    N = int(grams["field"].shape[0])

    def stat(idx: Tensor) -> Tensor:
        d = pod_statistics(grams, idx, epsilon=epsilon, fit_energies=fit_energies)
        return torch.tensor([d[k] for k in keys], dtype=torch.float64)

    iv = bootstrap(stat, N, n_resamples=n_resamples, seed=seed, level=level)
    return {k: iv[i].to_dict() for i, k in enumerate(keys)}
