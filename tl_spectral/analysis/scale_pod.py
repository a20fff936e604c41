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

from tl_spectral._deprecation import deprecated_method
from tl_spectral.analysis.coherence import coherence_from_spectrum, cross_spectrum, default_queries
from tl_spectral.analysis.lags import gaussian_lag_window, lag_fields, stack_fields
from tl_spectral.analysis.pod import (
    PODResult,
    effective_rank,
    pod_from_gram,
    spectral_concentration,
)
from tl_spectral.analysis.scale_pod_engine import head_chunk, prepare
from tl_spectral.analysis.scale_pod_heads import (  # the per-head variant; public here too
    ScalePODHeadsLayer,
    ScalePODHeadsResult,
    band_row,
    head_diversity,
    options_config,
    scale_pod_heads,
    scale_pod_heads_layer,
)
from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.analysis.wavelets import (
    DEFAULT_WAVELET,
    FIXED_BANDS,
    LagCWT,
    band_energies,
    default_scales,
    scale_energy,
)
from tl_spectral.results import Result, register_result

__all__ = [
    "ScalePODHeadsLayer",
    "ScalePODOptions",
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
    array_shapes = {
        "lags": "int[lag]", "scales": "float[scale]", "scalogram": "float[scale, lag]",
        "scale_energy": "float[scale]", "full_eigenvalues": "float[_]",
        "full_modes": "float[_, pos, lag]", "full_coefficients": "float[row, _]",
        "band_eigenvalues": "float[_]", "band_modes": "float[_, pos, _]",
        "band_coefficients": "float[row, _]", "band_lags": "int[_]",
        "coherence": "float[scale, cq, cq]", "coherence_queries": "int[cq]",
    }  # coefficient rows: one per document, none in a streamed result

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
    and ``uniform`` (the model's heads per layer), ``bounded`` (H* bounded by the number of
    documents: :func:`h_star_bounded`), ``H_star_bound`` (the bound at the layer's N:
    :func:`h_star_bound`) and ``advice`` (``recommended`` when no layer is
    bounded, else None). Saturated layers enter with their lower bound ``N - 1``.
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

    rows = deprecated_method("to_rows", "rows")
    table = deprecated_method("to_rows", "table")

    def to_rows(self) -> list[dict[str, Any]]:
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
                    "H_star_bounded": bool(alloc.get("bounded", False)),
                    "recommended_heads": (alloc["advice"] if alloc.get("advice") is not None
                                          else "—") if "advice" in alloc
                    else alloc["recommended"],
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
#: summary keys of every POD (whole field or band) of a :class:`ScalePODLayer`
_LAYER_POD_KEYS = ("dim", "rank", "n_available", "total_energy", "H_star", "H_star_saturated",
                   "H_star_str", "beta", "T_spec", "tspec_r2", "tspec_n_fit")


def scale_pod_layer(
    F: Float[Tensor, "N T n_lags"] | Sequence[Tensor],
    lags: Tensor | None = None,
    *,
    layer: int = 0,
    n_modes: int = 8,
    coherence_queries: int | Sequence[int] | Tensor | None = 16,
    options: ScalePODOptions | None = None,
    **old_options: Any,
) -> ScalePODLayer:
    """Scale-selective POD of one layer's lag-coordinate fields.

    F: ``[N, T, n_lags]`` fluctuation fields ``F_s(i, tau)`` (or a sequence of ``[T, n_lags]``
        fields, which must all have the same shape); float32 is fine (Grams accumulate in
        float64). With ``ScalePODOptions(center=True)`` the ensemble mean is subtracted here.
    lags: ``[n_lags]`` consecutive integer lags (default ``0..n_lags-1``, causal). Causal
        fields (``lags >= 0``): ``tau = i - j``; bidirectional: ``tau = j - i``. Truncated
        lag ranges (``max_lag``) are allowed; scales still default to ``1..T/2``.
    n_modes: modes kept per POD (eigenvalues are always all kept). coherence_queries: an int
        ``Q`` (strided subset, :func:`~tl_spectral.analysis.coherence.default_queries`),
        explicit query indices, or None / 0 to skip the coherence.
    options: a :class:`~tl_spectral.analysis.scale_pod_options.ScalePODOptions` (default
        ``ScalePODOptions()``): centring, CWT scales and wavelet, the dominant-scale rule
        (``max_dominant``, ``min_ratio``, ``min_peak_fraction``), the band windows
        (``window_threshold``, ``lag_window``), ``epsilon`` of ``H*(epsilon)`` and
        ``lag_chunk``; what each means is said there. The same names as keywords
        (``center=True``, ...) are deprecated.

    Steps 1-2 (scalogram, dominant scales, windows, Grams) are the per-head engine's
    (:mod:`~tl_spectral.analysis.scale_pod_engine`) on one head, this field; here the Grams
    are decomposed with modes and per-document coefficients, and step 3 adds the coherence.
    """
    o = ScalePODOptions.of(options, old_options, "scale_pod_layer")
    s = prepare(stack_fields(F)[:, None], lags, o)  # the head-mean field: one head
    N, _, T, n_lags = s.shape
    c = head_chunk(s, 0, 1, scalogram_method="matmul")
    E_at = c.E_at[0]
    E_a = scale_energy(E_at)
    if not float(E_a.sum()) > 0:
        raise ValueError(
            "the fields have zero fluctuation energy; pass fluctuations A_s - mean (or "
            "ScalePODOptions(center=True)) of an ensemble whose fields differ"
        )
    a_star = [float(s.scales[i]) for i in c.dominant[0]]
    masks = list(c.masks[0, : len(a_star)])
    windows = list(c.windows[0, : len(a_star)])
    Ft, grams, centered = c.Ft[0], c.grams[0], c.centered(o.center, s.eps)[0]
    del c

    def run_pod(k: int, window: Tensor | None, mask: Tensor | None) -> PODResult:
        dim = T * (n_lags if mask is None else int(mask.sum()))
        return pod_from_gram(grams[k], _projector(Ft, window, mask), dim, rank=n_modes,
                             epsilon=o.epsilon, centered=centered, eps=s.eps, clip_rank=True)

    full = run_pod(0, None, None)
    band_pods = [run_pod(1 + b, w, m) for b, (w, m) in enumerate(zip(windows, masks))]
    coh, q_idx = _coherence(Ft, s.op, coherence_queries, T)
    lags_t = s.lags
    return ScalePODLayer(
        layer=int(layer), causal=s.causal, n_documents=N, n_queries=T, lags=lags_t,
        scales=s.scales.clone(), scalogram=E_at, scale_energy=E_a, dominant_scales=a_star,
        band_energy=band_energies(E_a, s.scales),
        full_eigenvalues=full.eigenvalues, full_modes=full.modes.reshape(-1, T, n_lags),
        full_coefficients=full.coefficients, full=_summary(full),
        band_eigenvalues={str(b): p.eigenvalues for b, p in enumerate(band_pods)},
        band_modes={str(b): p.modes.reshape(-1, T, int(m.sum()))
                    for b, (p, m) in enumerate(zip(band_pods, masks))},
        band_coefficients={str(b): p.coefficients for b, p in enumerate(band_pods)},
        band_lags={str(b): lags_t[m].clone() for b, m in enumerate(masks)},
        bands=[band_row(b, a, lags_t[m], _summary(p))
               for b, (a, m, p) in enumerate(zip(a_star, masks, band_pods))],
        coherence=coh, coherence_queries=q_idx,
        config=options_config(o, int(s.scales.numel()), n_modes=n_modes),
    )


def _summary(p: PODResult) -> dict[str, Any]:
    s = p.headline()
    return {k: s[k] for k in _LAYER_POD_KEYS}


def _projector(Ft: Tensor, window: Tensor | None, mask: Tensor | None):
    """``B -> B^T X`` for the (windowed, cropped) snapshots of the lag-major fields
    ``Ft [n_lags, N, T]``, as ``[r, T * L]``, without forming ``X``."""

    def project(B: Tensor) -> Tensor:
        Y = torch.matmul(B.T.to(Ft.dtype), Ft).permute(1, 2, 0)  # [r, T, n_lags]
        if window is not None:
            Y = Y[:, :, mask] * window[mask].to(Ft.dtype)
        return Y.reshape(Y.shape[0], -1)

    return project


def _coherence(Ft: Tensor, op: LagCWT, queries, T: int) -> tuple[Tensor | None, Tensor | None]:
    """Step 3: ``gamma_ij(a)`` over the queries ``queries`` (an int: a strided subset; None
    or 0: none) of the lag-major fields ``Ft [n_lags, N, T]``; ``(coherence, query index)``."""
    if queries is None or (isinstance(queries, int) and queries == 0):
        return None, None
    if isinstance(queries, int):
        q_idx = default_queries(T, queries)
    else:
        q_idx = torch.as_tensor(queries, dtype=torch.int64).flatten()
        if q_idx.numel() == 0 or q_idx.min() < 0 or q_idx.max() >= T:
            raise ValueError(f"coherence_queries must be query indices in [0, {T - 1}]")
    G = cross_spectrum(Ft[:, :, q_idx].permute(1, 2, 0), op, method="moments")
    return coherence_from_spectrum(G).to(torch.float32), q_idx


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
    options: ScalePODOptions | None = None,
    **layer_kwargs: Any,
) -> ScalePODResult:
    """Scale-selective POD of every layer plus the head allocation.

    fields: per layer ``[N, T, n_lags]`` (a sequence, or a tensor ``[L, N, T, n_lags]``),
        all of the same shape; lags: ``[n_lags]`` shared by all layers.
    n_heads: heads per layer of the model (int or ``[L]``), the uniform allocation.
    head_budget: total heads to distribute (default ``sum(n_heads)``).
    layer_ids: layer numbers (default ``0..L-1``). options: a
    :class:`~tl_spectral.analysis.scale_pod_options.ScalePODOptions`. Other keyword
    arguments (``n_modes``, ``coherence_queries``) go to :func:`scale_pod_layer`.
    """
    o = ScalePODOptions.of(options, ScalePODOptions.split(layer_kwargs), "scale_pod")
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
    layers = [scale_pod_layer(f, lags, layer=li, options=o, **layer_kwargs)
              for li, f in zip(ids, fields)]
    return ScalePODResult(
        layers=layers,
        allocation=allocation_table(layers, uniform, budget),
        head_budget=budget,
        config=dict(layers[0].config),
    )


def allocation_table(
    layers: Sequence[ScalePODLayer], uniform: Sequence[int], budget: int
) -> list[dict[str, Any]]:
    """The head-allocation rows of :class:`ScalePODResult` from per-layer results.

    ``recommended`` is the arithmetic allocation ∝ H*; ``bounded`` marks a layer whose H*
    the number of documents bounds (:func:`h_star_bounded`); ``advice`` is ``recommended``
    only when NO layer is bounded (the allocation divides the budget by shares of the sum,
    so one bounded H* — a lower bound — makes every share unreliable), else None."""
    hs = [layer.H_star for layer in layers]
    rec = allocate_heads(hs, budget)
    total = sum(hs)
    bounded = [layer_h_star_bounded(layer) for layer in layers]
    any_bounded = any(bounded)
    bounds = [h_star_bound(layer.n_documents, float(layer.config.get("epsilon", 0.1)))
              for layer in layers]
    return [
        {
            "layer": layer.layer,
            "H_star": h,
            "H_star_str": layer.full["H_star_str"],
            "saturated": layer.H_star_saturated,
            "bounded": b,
            "H_star_bound": hb,
            "share": h / total,
            "quota": budget * h / total,
            "recommended": r,
            "advice": None if any_bounded else r,
            "uniform": int(u),
        }
        for layer, h, r, u, b, hb in zip(layers, hs, rec, uniform, bounded, bounds)
    ]


# ------------------------------------------------------------------ H* bounded by N
def h_star_bound(n_docs: int, epsilon: float = 0.1) -> int:
    """The smallest H* that reads "bounded by the number of documents" at ``N = n_docs``:
    the H*(ε) of a 1/k spectrum over the ``N − 1`` modes an ensemble of N mean-removed
    fields has, ``min{K : H_K ≥ (1 − ε) H_{N−1}}`` with ``H_n = Σ_{k≤n} 1/k``
    (docs/scale_pod.md, "When N bounds H*"). A spectrum no steeper than 1/k has energy that
    keeps growing with the number of modes, so its H* grows with N without limit (about
    ``e^{−εγ} (N − 1)^{1−ε}``): it reports the number of documents, not the layer.
    Values at ε = 0.1: N = 4 → 3, 8 → 6, 16 → 11, 32 → 21, 64 → 40."""
    m = int(n_docs) - 1
    if m < 1:
        return 0
    if not 0.0 <= float(epsilon) < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1) (got {epsilon})")
    target = (1.0 - float(epsilon)) * sum(1.0 / k for k in range(1, m + 1))
    acc = 0.0
    for k in range(1, m + 1):
        acc += 1.0 / k
        if acc >= target * (1.0 - 1e-12):
            return k
    return m


def h_star_bounded(h_star: float, n_docs: int, epsilon: float = 0.1, *,
                   saturated: bool = False) -> bool:
    """Whether ``h_star`` at ``N = n_docs`` documents is bounded by N and says nothing about
    the layer: ``H* ≥`` :func:`h_star_bound` ``(N, ε)``, or ``saturated`` (H* reached the
    ``N − 1`` modes, or a streamed POD's rank cap before ``1 − ε`` of the energy). The ONE
    rule of the library, the report (findings, tables, figures) and the notebooks."""
    h = float(h_star)
    if saturated:
        return True
    if not math.isfinite(h) or int(n_docs) < 2:
        return True
    return h >= h_star_bound(int(n_docs), epsilon)


def layer_h_star_bounded(layer: Any) -> bool:
    """:func:`h_star_bounded` of a :class:`ScalePODLayer` (its own N, ε and saturation)."""
    return h_star_bounded(layer.H_star, layer.n_documents,
                          float(layer.config.get("epsilon", 0.1)),
                          saturated=bool(layer.H_star_saturated))


def docs_to_resolve(h_star: float, epsilon: float = 0.1) -> int:
    """The smallest number of documents N at which ``h_star`` would sit below the bound
    (:func:`h_star_bound` ``(N) > H*``): a floor for a bounded layer, whose true H* is at
    least the measured one — rerun there and check that H* stops growing."""
    h = float(h_star)
    n = max(2, int(h) + 2)
    while h_star_bound(n, epsilon) <= h:
        n += 1
    return n


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
    F = stack_fields(F)
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


def spectrum_from_gram(K: Tensor) -> Tensor:
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
    lam = spectrum_from_gram(centred_gram_resample(grams["field"], idx) / n)
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
