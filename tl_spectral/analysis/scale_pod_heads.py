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
from tl_spectral.analysis.pod import effective_rank, spectral_concentration
from tl_spectral.analysis.scale_pod_engine import Chunk, Setup, prepare
from tl_spectral.analysis.scale_pod_engine import head_chunk as head_chunk_of
from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.analysis.wavelets import FIXED_BANDS
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
    out["scale_classes"] = _scale_classes(peak_scale, idx, H, class_ratio)
    out["n_scale_classes"] = max((c for c in out["scale_classes"] if c is not None),
                                 default=-1) + 1
    out.update(_band_stats(band_energy, act, idx, list(band_names)))
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


def _scale_classes(peak_scale: Tensor, idx: list[int], H: int, class_ratio: float
                   ) -> list[int | None]:
    """Per head its scale class (None: inactive): the active heads ``idx`` sorted by peak
    scale, a new class wherever consecutive peak scales differ by at least ``class_ratio``
    (single linkage in ``log a``), numbered by increasing scale."""
    classes: list[int | None] = [None] * H
    c, prev = -1, None
    for h in sorted(idx, key=lambda h: float(peak_scale[h])):
        a = float(peak_scale[h])
        if prev is None or a / prev >= class_ratio:
            c += 1
        classes[h] = c
        prev = a
    return classes


def _band_stats(band_energy: Tensor, act: Tensor, idx: list[int], names: list[str]
                ) -> dict[str, Any]:
    """Band shares over the active heads (mean, std), each head's band and the entropy of
    the assignment (:func:`head_diversity`)."""
    nan = math.nan
    be = band_energy.to(torch.float64)[act]
    out: dict[str, Any] = {
        "band_share_mean": {k: (float(be[:, b].mean()) if idx else nan)
                            for b, k in enumerate(names)},
        "band_share_std": {k: (float(be[:, b].std(unbiased=False)) if idx else nan)
                           for b, k in enumerate(names)},
    }
    assign: list[str | None] = [None] * int(act.numel())
    for h in idx:
        assign[h] = names[int(torch.argmax(band_energy[h]))]
    counts = {k: sum(1 for h in idx if assign[h] == k) for k in names}
    out["band_assignment"] = assign
    out["band_counts"] = counts
    out["band_entropy_bits"] = _class_entropy_bits(list(counts.values()))
    out["band_entropy_norm"] = out["band_entropy_bits"] / math.log2(len(names))
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
    head_chunk: int | None = None,
    scalogram_method: str = "auto",
    inactive_rtol: float | None = None,
    options: ScalePODOptions | None = None,
    **old_options: Any,
) -> ScalePODHeadsLayer:
    """Scale-selective POD of every head of one layer, batched over heads.

    F: ``[N, H, T, n_lags]`` per-head fluctuation fields ``F_{s,h}(i, tau)`` (or a sequence of
        ``N`` fields ``[H, T, n_lags]``); float32 is fine. options: a
        :class:`~tl_spectral.analysis.scale_pod_options.ScalePODOptions` (default
        ``ScalePODOptions()``); its settings mean what they mean in :func:`scale_pod_layer`,
        and each head gets exactly what :func:`scale_pod_layer` computes for that head's
        field alone (one engine, :mod:`~tl_spectral.analysis.scale_pod_engine`) — scalogram,
        scale energy, fixed-band shares, dominant scales, its own band windows, POD
        eigenvalues, ``T_spec`` and ``H*`` of the whole field and of each band — without
        modes, coefficients or coherence.
    head_chunk: heads per batch (default all): the lag-major copy of the fields, the per-lag
        Grams and the ``[H, 1 + max_dominant, N, N]`` Gram stack are formed for that many heads
        at once. Memory: the caller's ``F``, one lag-major copy of ``head_chunk`` heads, and
        ``(1 + max_dominant) head_chunk`` ``[N, N]`` float64 matrices.
    scalogram_method: see :func:`~tl_spectral.analysis.wavelets.scalogram_from_moments`.
    inactive_rtol: a head whose fluctuation energy ``sum u^2 / N`` is at most ``inactive_rtol``
        times the larger of the layer's largest head fluctuation energy and the head's own
        field energy (``sum F^2 / N`` as passed, before centring) is *inactive* (e.g. a head
        that always attends to the first token: its field never fluctuates) and reported
        with NaN scales and ``H* = 0`` instead of raising; default ``(1e3 eps)^2`` of the
        field dtype. A layer with no active head raises.

    Batching: moments, scalograms, per-lag Grams, their band-weighted sums and the
    eigenvalues (one batched ``eigvalsh``) treat heads as a batch dimension; only the peak
    picking on ``E_h(a)`` and the scalar summaries of each eigenvalue vector run per head.
    The settings as keywords (``center=True``, ...) are deprecated: pass ``options``.
    """
    o = ScalePODOptions.of(options, old_options, "scale_pod_heads_layer")
    s = prepare(_stack_head_fields(F), lags, o)
    N, H, T, n_lags = s.shape
    acc = _Heads.empty(H, int(s.scales.numel()), n_lags, N, int(o.max_dominant))
    hc = H if head_chunk is None else max(1, int(head_chunk))
    for h0 in range(0, H, hc):
        c = head_chunk_of(s, h0, min(H, h0 + hc), scalogram_method=scalogram_method)
        c.Ft = None  # the per-head path keeps no modes: release the lag-major copy
        acc.add(s, c)
        del c
    rtol = (1e3 * s.eps) ** 2 if inactive_rtol is None else float(inactive_rtol)
    return _heads_layer(s, acc, rtol, layer)


@dataclasses.dataclass
class _Heads:
    """Per-head outputs of :func:`scale_pod_heads_layer`, filled chunk by chunk."""

    E_at: Tensor  # [H, S, n_lags]
    lam_full: Tensor  # [H, N]
    lam_band: Tensor  # [H, M, N]
    band_scales: Tensor  # [H, M]
    raw_energy: Tensor  # [H] sum F^2 / N of the fields passed
    fluct_energy: Tensor  # [H] sum u^2 / N of the fluctuations
    centered: list
    dominant: list
    full: list
    bands: list

    @classmethod
    def empty(cls, H: int, S: int, n_lags: int, N: int, M: int) -> _Heads:
        f64 = torch.float64
        return cls(E_at=torch.zeros(H, S, n_lags, dtype=f64), lam_full=torch.zeros(H, N, dtype=f64),
                   lam_band=torch.zeros(H, M, N, dtype=f64),
                   band_scales=torch.full((H, M), math.nan, dtype=f64),
                   raw_energy=torch.zeros(H, dtype=f64), fluct_energy=torch.zeros(H, dtype=f64),
                   centered=[False] * H, dominant=[[] for _ in range(H)], full=[None] * H,
                   bands=[[] for _ in range(H)])

    def add(self, s: Setup, c: Chunk) -> None:
        """Record one chunk: scalograms, dominant scales, energies, and the eigenvalues and
        POD summaries of every used Gram (one batched ``eigvalsh``)."""
        N, _, T, n_lags = s.shape
        h0, nh = c.h0, int(c.held.numel())
        sl = slice(h0, h0 + nh)
        self.E_at[sl] = c.E_at
        self.band_scales[sl] = c.band_scales
        self.fluct_energy[sl] = c.held
        self.raw_energy[sl] = c.held + c.mean_sq if s.options.center else c.held
        self.centered[sl] = c.centered(s.options.center, s.eps)
        for j, dom in enumerate(c.dominant):
            self.dominant[h0 + j] = [float(s.scales[i]) for i in dom]
        has_band = ~torch.isnan(c.band_scales)
        has_band = has_band[:, : c.grams.shape[1] - 1]  # the slots the chunk has Grams of
        use = torch.cat([(c.E_at.sum(-1).sum(-1) > 0)[:, None], has_band], dim=1)  # [nh, 1+B]
        sel = torch.nonzero(use).tolist()
        if not sel:
            return
        K = c.grams[use]  # [B, N, N]
        c.grams = None
        K = 0.5 * (K + K.transpose(-1, -2))
        totals = torch.diagonal(K, dim1=-2, dim2=-1).sum(-1).tolist()
        lam_all = torch.linalg.eigvalsh(K).flip(-1)  # [B, N] descending
        del K
        for (j, m), lam, tot in zip(sel, lam_all, totals):
            h = h0 + j
            if not tot > 0:
                continue
            dim = T * (n_lags if m == 0 else int(c.masks[j, m - 1].sum()))
            summ, n = _pod_summary(lam, tot, N, s.eps, s.options.epsilon, self.centered[h], dim)
            if m == 0:
                self.full[h] = summ
                self.lam_full[h, :n] = lam[:n]
            else:
                self.lam_band[h, m - 1, :n] = lam[:n]
                self.bands[h].append(band_row(m - 1, float(c.band_scales[j, m - 1]),
                                              s.lags[c.masks[j, m - 1]], summ))


def band_row(band: int, scale: float, band_lags: Tensor, summary: dict) -> dict[str, Any]:
    """The JSON row of one band: its number, scale ``a*_m``, ``sigma_m = a*_m / 2``, the lags
    its window keeps, and the POD summary."""
    return {"band": band, "scale": scale, "sigma": scale / 2.0,
            "lag_min": int(band_lags.min()), "lag_max": int(band_lags.max()),
            "n_lags": int(band_lags.numel()), **summary}


def _heads_layer(s: Setup, acc: _Heads, rtol: float, layer: int) -> ScalePODHeadsLayer:
    """The result of :func:`scale_pod_heads_layer`: inactive heads cleared, per-head shares,
    peak and centroid scales, band tables and the diversity summary."""
    N, H, T, _ = s.shape
    o, scales = s.options, s.scales
    E_a = acc.E_at.sum(-1)  # [H, S]
    ref_energy = torch.maximum(acc.raw_energy, acc.fluct_energy.max().expand(H))
    act_t = (acc.fluct_energy > rtol * ref_energy) & (E_a.sum(-1) > 0)
    active = [bool(x) for x in act_t]
    if not any(active):
        raise ValueError(
            "the fields have zero fluctuation energy in every head; pass fluctuations "
            "A_s - mean (or ScalePODOptions(center=True)) of an ensemble whose fields differ"
        )
    for h in (h for h in range(H) if not active[h]):  # inactive heads: no scales, no POD
        acc.dominant[h], acc.full[h], acc.bands[h] = [], None, []
        acc.band_scales[h] = math.nan
        acc.lam_full[h] = 0.0
        acc.lam_band[h] = 0.0
    names = list(FIXED_BANDS)
    band_mask = torch.stack([((scales >= lo) if lo_in else (scales > lo))
                             & ((scales <= hi) if hi_in else (scales < hi))
                             for lo, hi, lo_in, hi_in in FIXED_BANDS.values()]).to(torch.float64)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    tot = E_a.sum(-1, keepdim=True)
    band_energy = torch.where(act_t[:, None], (E_a @ band_mask.T) / tot.clamp_min(1e-300), nan)
    peak = torch.where(act_t, scales[E_a.argmax(-1)], nan)
    centroid = torch.where(
        act_t, torch.exp((E_a * torch.log(scales)).sum(-1) / tot.squeeze(-1).clamp_min(1e-300)),
        nan)
    H_star = torch.tensor([f["H_star"] if f else 0 for f in acc.full], dtype=torch.int64)
    T_spec = torch.tensor([f["T_spec"] if f else math.nan for f in acc.full], dtype=torch.float64)
    M = int(o.max_dominant)
    band_H = torch.full((H, M), -1, dtype=torch.int64)
    band_T = torch.full((H, M), math.nan, dtype=torch.float64)
    for h in range(H):
        for b in acc.bands[h]:
            band_H[h, b["band"]], band_T[h, b["band"]] = b["H_star"], b["T_spec"]
    return ScalePODHeadsLayer(
        layer=int(layer), causal=s.causal, n_documents=N, n_queries=T, n_heads=H, lags=s.lags,
        scales=scales.clone(), scalogram=acc.E_at, scale_energy=E_a, band_energy=band_energy,
        peak_scale=peak, centroid_scale=centroid, band_scales=acc.band_scales,
        full_eigenvalues=acc.lam_full, band_eigenvalues=acc.lam_band, H_star=H_star,
        T_spec=T_spec, band_H_star=band_H, band_T_spec=band_T, active=active,
        centered=acc.centered, dominant_scales=acc.dominant, full=acc.full, bands=acc.bands,
        diversity=head_diversity(E_a, scales, band_energy, peak, centroid, H_star, active,
                                 band_names=names, class_ratio=o.min_ratio),
        config={**options_config(o, int(scales.numel())), "bands": names,
                "inactive_rtol": rtol},
    )


def options_config(o: ScalePODOptions, n_scales: int, n_modes: int | None = None
                   ) -> dict[str, Any]:
    """The ``config`` of a scale-POD result: the options (and ``n_modes``, when given)."""
    return {
        "wavelet": o.wavelet,
        "epsilon": float(o.epsilon),
        "max_dominant": int(o.max_dominant),
        "min_ratio": float(o.min_ratio),
        "min_peak_fraction": float(o.min_peak_fraction),
        "window_threshold": float(o.window_threshold),
        "lag_window": o.lag_window,
        **({} if n_modes is None else {"n_modes": int(n_modes)}),
        "center": bool(o.center),
        "n_scales": int(n_scales),
    }


def scale_pod_heads(
    fields: Sequence[Tensor] | Tensor,
    lags: Tensor | None = None,
    *,
    layer_ids: Sequence[int] | None = None,
    options: ScalePODOptions | None = None,
    **layer_kwargs: Any,
) -> ScalePODHeadsResult:
    """Per-head scale-selective POD of every layer.

    fields: per layer ``[N, H, T, n_lags]`` per-head fluctuation fields (a sequence, or a
        tensor ``[L, N, H, T, n_lags]``), all of the same shape; lags: ``[n_lags]``.
    layer_ids: layer numbers (default ``0..L-1``). options: a
    :class:`~tl_spectral.analysis.scale_pod_options.ScalePODOptions`. Other keyword
    arguments (``head_chunk``, ``scalogram_method``, ``inactive_rtol``) go to
    :func:`scale_pod_heads_layer`.
    """
    o = ScalePODOptions.of(options, ScalePODOptions.split(layer_kwargs), "scale_pod_heads")
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
    layers = [scale_pod_heads_layer(f, lags, layer=li, options=o, **layer_kwargs)
              for li, f in zip(ids, fields)]
    return ScalePODHeadsResult(layers=layers, config=dict(layers[0].config))
