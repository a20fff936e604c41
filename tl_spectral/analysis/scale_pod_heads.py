"""Scale-selective POD per head (SPEC A, per-head variant): the per-head results
(:class:`ScalePODHeadsLayer`, :class:`ScalePODHeadsResult`), :func:`scale_pod_heads_layer`,
:func:`scale_pod_heads` and :func:`head_diversity`. Re-exported by
:mod:`tl_spectral.analysis.scale_pod`, the public home of every scale-POD name.
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
from tl_spectral.analysis.lags import check_lags
from tl_spectral.analysis.pod import effective_rank, spectral_concentration
from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.analysis.wavelets import (
    DEFAULT_WAVELET,
    FIXED_BANDS,
    LagCWT,
    default_scales,
    dominant_scales,
    scalogram_from_moments,
)
from tl_spectral.results import Result, register_result

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
    array_shapes = {
        "lags": "int[lag]", "scales": "float[scale]", "scalogram": "float[head, scale, lag]",
        "scale_energy": "float[head, scale]", "band_energy": "float?[head, 3]",
        "peak_scale": "float?[head]", "centroid_scale": "float?[head]",
        "band_scales": "float?[head, slot]", "full_eigenvalues": "float[head, doc]",
        "band_eigenvalues": "float[head, slot, doc]", "H_star": "int[head]",
        "T_spec": "float?[head]", "band_H_star": "int[head, slot]",
        "band_T_spec": "float?[head, slot]",
    }
    array_dims = {
        "head": ("n_heads", "active", "centered", "dominant_scales", "full", "bands"),
        "doc": "n_documents",
    }

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

    rows = deprecated_method("to_rows", "rows")
    table = deprecated_method("to_rows", "table")

    def to_rows(self) -> list[dict[str, Any]]:
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
            "heads": self.to_rows(),
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

    rows = deprecated_method("to_rows", "rows")
    table = deprecated_method("to_rows", "table")

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per (layer, head) (see :meth:`ScalePODHeadsLayer.table`)."""
        return [row for layer in self.layers for row in layer.to_rows()]

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
    options: ScalePODOptions | None = None,
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
    options: a :class:`~tl_spectral.analysis.scale_pod_options.ScalePODOptions` holding the
        settings above (instead of the keywords; pass one or the other).
    """
    # Long on purpose: the batched-over-heads mirror of scale_pod_layer, step for step (a test
    # compares them); split, the chunked per-head intermediates would thread through helpers.
    o = ScalePODOptions.resolve(
        options, center=center, scales=scales, wavelet=wavelet, max_dominant=max_dominant,
        min_ratio=min_ratio, min_peak_fraction=min_peak_fraction,
        window_threshold=window_threshold, lag_window=lag_window, epsilon=epsilon,
        lag_chunk=lag_chunk)
    center, scales, wavelet, lag_window = o.center, o.scales, o.wavelet, o.lag_window
    max_dominant, min_ratio, min_peak_fraction = o.max_dominant, o.min_ratio, o.min_peak_fraction
    window_threshold, epsilon, lag_chunk = o.window_threshold, o.epsilon, o.lag_chunk
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
    lags = check_lags(lags, n_lags)
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
