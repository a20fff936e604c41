"""ContributionProbe: contribution weights inside the forward pass (SPEC C.1–C.2).

Per layer and batch the probe folds into mergeable sums:

* the mean contribution ``c_ij^h`` by source position ``j`` and by lag ``i − j`` (per head
  and at token level ``C_ij = Σ_h c_ij^h``), beside the mean attention ``α_ij^h`` on the
  same axes;
* the share of negative contribution: the fraction of pairs with ``c < 0`` and the
  negative mass ``Σ|c_neg| / Σ|c|`` (per head and token level);
* the Spearman rank correlation between the four measures (raw attention, value-weighted,
  output-normalized, contribution) over each query's allowed sources, averaged over a
  subsample of ``rank_queries`` queries per document (per head and token level);
* on request (``keep_docs``), every map of chosen documents, for views.

The mean statistics use a streaming path that forms only the contribution map: with
``u_i^h = o_i W_O^hᵀ / ‖o_i‖²`` (inter) or ``o_i^h W_O^hᵀ / ‖o_i^h‖²`` (intra), ``c = α ⊙ (u vᵀ)``
— one ``[query, d_head] × [d_head, key]`` product per head, the cost of attention. It is
tested equal to :func:`tl_spectral.analysis.contributions.contribution_weights` (which
also forms the three baselines and the factorization; the rank subsample and the kept
maps call it directly).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Any, ClassVar, Optional, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_spectral._deprecation import check_choice, deprecated_method
from tl_spectral.analysis.contributions import (
    MEASURES,
    ContributionMaps,
    contribution_weights,
    default_rtol,
    projected_value_norms,
    value_gram,
)
from tl_spectral.model_view import ModelView, layer_windows, window_allowed
from tl_spectral.probes import shared
from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral.probes.shared import lag_sums as _lag_sums  # noqa: F401 - the old name
from tl_spectral.results import Result, register_result
from tl_spectral.types import ContributionMode


# ----------------------------------------------------------------------------- maths
def contribution_map(
    pattern: Float[Tensor, "batch head query key"],
    v_heads: Float[Tensor, "batch head key d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    mode: str = "inter",
    query_mask: Optional[Bool[Tensor, "batch query"]] = None,
    rtol: Optional[float] = None,
) -> Float[Tensor, "batch head query key"]:
    """The contribution map ``c_ij^h`` alone (same values and masking as
    ``contribution_weights(...).contribution``), for streaming statistics.

    pattern: ``[batch, head, query, key]`` with padded query rows already 0 (or
    ``query_mask`` None); v_heads: ``[batch, head, key, d_head]`` (value heads repeated to
    the query heads); W_O: ``[head, d_head, d_model]``. Same dtype for all three.

    Steps: 1. ``z = α v``; 2. ``‖ṽ_j‖`` from ``G = W_O W_Oᵀ`` and the scale-free zero-norm
    bound ``Σ_j α_ij ‖ṽ_j‖``; 3. inter: ``o = Σ_h z^h W_O^h``, ``u^h = o W_O^hᵀ / ‖o‖²``;
    intra: ``u^h = z^h G^h / ‖o^h‖²``; 4. ``c = α ⊙ (u vᵀ)``.
    """
    check_choice("mode", mode, ContributionMode)
    rtol = default_rtol(pattern.dtype) if rtol is None else rtol
    G = value_gram(W_O)
    vnorm = projected_value_norms(v_heads, G)  # [b, H, k]
    zb = pattern @ torch.cat([v_heads, vnorm.unsqueeze(-1)], -1)  # [b, H, q, d + 1]
    z, bound = zb[..., :-1], zb[..., -1]  # α v and Σ_j α_ij ‖ṽ_j‖
    if mode == "intra":
        u = torch.einsum("bhqd,hde->bhqe", z, G)
        n2 = (u * z).sum(-1).clamp_min(0.0)  # [b, H, q]
    else:
        o = torch.einsum("bhqd,hdm->bqm", z, W_O)
        u = torch.einsum("bqm,hdm->bhqd", o, W_O)
        n2 = (o * o).sum(-1).unsqueeze(1)  # [b, 1, q]
        bound = bound.sum(1, keepdim=True)
    onorm = n2.sqrt()
    valid = (onorm > 0) & (onorm > rtol * bound)
    if query_mask is not None:
        valid = valid & query_mask[:, None, :]
    inv2 = torch.where(valid, 1.0 / torch.where(valid, n2, 1.0), 0.0)
    u = u * inv2.unsqueeze(-1)
    c = u @ v_heads.transpose(-1, -2)  # [b, H, q, k]
    return c.mul_(pattern)


def _query_blocks(T: int, causal: bool, rows: int = 64) -> list[tuple[int, int, int]]:
    """Blocks ``(a, e, k)`` of query rows ``a … e − 1`` with the keys ``0 … k − 1`` they may
    see: causal blocks stop their keys at the block's last query (``k = e``); bidirectional
    ones keep every key (:func:`tl_spectral.probes.shared.query_blocks`)."""
    return shared.query_blocks(T, causal, rows)


def _scaled_u(vp: "shared.ValueProducts", W_O: Tensor, mode: str, query_mask: Optional[Tensor],
              rtol: float, o: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``u^h`` of :func:`contribution_map` (step 3, divided by ``‖o‖²`` where the output is
    valid, 0 elsewhere) from the shared value products: ``[b, H, q, d_head]``, and
    ``1 / ‖o‖`` (0 where not valid; ``[b, 1, q]`` inter, ``[b, H, q]`` intra). ``o``: the
    layer output ``Σ_h z^h W_O^h`` (inter; formed here when None)."""
    z = vp.z
    if mode == "intra":
        u = torch.einsum("bhqd,hde->bhqe", z, vp.gram)
        n2 = (u * z).sum(-1).clamp_min(0.0)  # [b, H, q]
        bound = vp.bound
    else:
        if o is None:
            o = torch.einsum("bhqd,hdm->bqm", z, W_O)
        u = torch.einsum("bqm,hdm->bhqd", o, W_O)
        n2 = (o * o).sum(-1).unsqueeze(1)  # [b, 1, q]
        bound = vp.bound.sum(1, keepdim=True)
    onorm = n2.sqrt()
    valid = (onorm > 0) & (onorm > rtol * bound)
    if query_mask is not None:
        valid = valid & query_mask[:, None, :]
    inv = torch.where(valid, 1.0 / torch.where(valid, onorm, 1.0), 0.0)
    inv2 = torch.where(valid, 1.0 / torch.where(valid, n2, 1.0), 0.0)
    return u.mul_(inv2.unsqueeze(-1)), inv


def _full_window_counts(T: int, b: int, causal: bool, device: Any,
                        window: Optional[int] = None
                        ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor]:
    """Allowed (query, key) pairs of ``b`` unpadded documents of ``T`` tokens, float64:
    per key ``[T]``, per lag ``(pos [T], neg [T])`` as :func:`_lag_sums` of the pair
    count matrix, and in all ``[1]`` (causal: ``j <= i``, and ``i − j < W`` for a
    sliding-window layer of width ``window``; bidirectional: every pair)."""
    n = torch.arange(T, 0, -1, dtype=torch.float64, device=device) * b  # b (T − x)
    if causal:
        if window is not None and int(window) < T:
            src = n.clamp(max=float(b * int(window)))  # b min(T − j, W)
            lag = n.clone()
            lag[int(window):] = 0.0  # b (T − ℓ) for ℓ < W
            return src, (lag, torch.zeros_like(n)), lag.sum().reshape(1)
        return n.clone(), (n.clone(), torch.zeros_like(n)), n.sum().reshape(1)
    neg = n.clone()
    neg[0] = 0.0
    full = torch.full((T,), float(b * T), dtype=torch.float64, device=device)
    return full, (n.clone(), neg), full.sum().reshape(1)


def _row_ranks(x: Tensor, allowed: Tensor) -> Tensor:
    """Ordinal rank (0 = smallest; ties by position) of each allowed entry of ``x [..., key]``
    among the allowed keys of its row; disallowed entries rank after them. int32."""
    x = x.masked_fill(~allowed, float("inf"))
    order = torch.sort(x, dim=-1, stable=True).indices
    r = torch.empty(order.shape, dtype=torch.int32, device=x.device)
    ar = torch.arange(x.shape[-1], device=x.device, dtype=torch.int32)
    r.scatter_(-1, order, ar.expand(order.shape).contiguous())
    return r


def _spearman_rows(
    ra: Tensor, rb: Tensor, allowed: Tensor
) -> tuple[Tensor, Tensor]:
    """Spearman correlation ``1 − 6 Σ d² / (n (n² − 1))`` of two rank arrays (``_row_ranks``)
    over the allowed keys of each row. ra, rb: ``[..., key]``; allowed: bool ``[..., key]``.
    Returns (rho ``[...]`` float64, defined ``[...]`` bool: at least 3 allowed keys)."""
    n = allowed.sum(-1).to(torch.float64)
    d = (ra - rb).masked_fill_(~allowed, 0).long()
    ok = n >= 3
    denom = torch.where(ok, n * (n * n - 1), 1.0)
    rho = torch.where(ok, 1.0 - 6.0 * (d * d).sum(-1).double() / denom, 0.0)
    return rho, ok


def rank_query_positions(lengths: Sequence[int] | Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Query positions sampled for the rank correlations, per document, from its own
    length ``L`` (never the batch's padded length): ``round(linspace(2, L − 1, min(n, L − 2)))``
    without repeats (none when ``L < 3``).

    Returns ``(qidx [batch, m] long, ok [batch, m] bool)``: the positions of each document,
    left-aligned and padded with position 0 where ``ok`` is False (``m`` the longest list).
    """
    ls = [int(x) for x in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]
    rows = []
    for L in ls:
        k = min(n, L - 2)
        rows.append(torch.linspace(2, L - 1, k).round().long().unique() if k > 0
                    else torch.zeros(0, dtype=torch.long))
    m = max((r.numel() for r in rows), default=0)
    qidx = torch.zeros(len(ls), m, dtype=torch.long)
    ok = torch.zeros(len(ls), m, dtype=torch.bool)
    for i, r in enumerate(rows):
        qidx[i, : r.numel()] = r
        ok[i, : r.numel()] = True
    return qidx, ok


def _negative_rows(c: Tensor, rtol: float, out: Optional[tuple[Tensor, Tensor, Tensor]] = None
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of ``c [..., key]``: ``(Σ_key |c|, #{c < −τ_row}, #{c < 0})`` with
    ``τ_row = rtol · Σ_key |c|``, each ``[...]`` in ``c``'s dtype (counts negated: ``−#``);
    ``out``: three tensors of that shape to write them into (e.g. a block of a layer's row
    buffers, reduced once after the last block instead of a few reductions per block).

    The counts come from signs: ``sign(x)`` clamped to ``[−1, 0]`` is −1 exactly where
    ``x < 0`` (0 at ``±0``), and its row sum, at most ``key`` ones, is an exact float —
    about three times faster than a bool comparison and its count. ``c + τ < 0`` exactly
    when ``c < −τ``: a float sum has the sign of the exact sum (it rounds to 0 only when
    the exact sum is 0), so the strict count equals the comparison's."""
    o1, o2, o3 = out if out is not None else (None, None, None)
    l1 = torch.sum(c.abs(), -1, out=o1)  # (abs + sum: ~3x faster than vector_norm(ord=1))
    strict = torch.sum(torch.sign(c + (l1 * rtol).unsqueeze(-1)).clamp_(max=0.0), -1, out=o2)
    anyneg = torch.sum(torch.sign(c).clamp_(max=0.0), -1, out=o3)
    return l1, strict, anyneg


def _row_negatives(c: Tensor, rtol: float, abs_sum: Optional[Tensor] = None
                   ) -> tuple[Tensor, Tensor]:
    """Counts of negative entries of ``c [..., key]`` summed over every axis but ``dim 1``
    (heads) of a ``[n, h, q, k]`` map: ``(#{c < −τ_row}, #{c < 0})`` with
    ``τ_row = rtol · Σ_key |c|`` per row (float64 ``[h]`` each; :func:`_negative_rows`).
    ``abs_sum``: a float64 ``[h]`` tensor to which ``Σ |c|`` (every row, per head) is
    added, from the same row norms (the probe's negative mass is ``(Σ c − Σ |c|) / 2``: no
    clamped copy of ``c``)."""
    l1, strict, anyneg = _negative_rows(c, rtol)
    heads = (0, 2)
    if abs_sum is not None:
        abs_sum += l1.sum(heads, dtype=torch.float64)
    return strict.sum(heads, dtype=torch.float64).neg_(), anyneg.sum(heads, dtype=torch.float64).neg_()


# ----------------------------------------------------------------------------- result
@register_result
@dataclasses.dataclass
class ContributionStats(Result):
    """Ensemble statistics of contribution weights, per layer.

    Head axis ``head+1``: the ``H`` heads, then the token level (``C = Σ_h c``; for raw
    attention the head sum). Shapes:

    * ``source_mean`` [layer, head+1, pos]: mean over real queries ``i`` that may attend
      to ``j`` (``i ≥ j``, and ``i − j < W`` in a sliding-window layer of width ``W``:
      :func:`~tl_spectral.model_view.layer_windows`; every pair count, negative share and
      rank correlation below counts only such pairs) of ``c_ij`` (token level: of ``C_ij``); ``source_attention`` [layer, head,
      pos]: the same mean of ``α_ij``; ``source_count`` [layer, pos] pairs averaged;
    * ``lag_mean`` / ``lag_attention`` / ``lag_count``: the same by lag ``ℓ = i − j``, on the
      axis ``lags`` (``0 … T−1`` for causal models, ``−(T−1) … T−1`` for bidirectional ones);
    * ``negative_fraction`` [layer, head+1]: share of allowed pairs with ``c_ij < −τ_i``,
      ``τ_i = negative_rtol · Σ_j |c_ij|`` (the query's row of the map counted: ``c^h`` for
      head ``h``, ``C`` at token level; ``negative_rtol`` = 1e-6 by default, about 8 float32
      epsilons of the row's absolute mass, so round-off zeros are not counted);
      ``negative_fraction_raw``: the same share at ``τ = 0`` (every ``c < 0``; ``None`` in
      files written before it existed, whose ``negative_fraction`` is this τ = 0 count and
      whose ``negative_rtol`` reads 0); ``negative_mass`` [layer, head+1]: ``Σ|c_neg| / Σ|c|``;
    * ``rank_corr`` [layer, head+1, 4, 4]: mean Spearman correlation between the measures
      (order ``measures``) over the sampled queries' allowed sources (ordinal ranks, ties by
      position; queries sampled over each document's own length, see
      :func:`rank_query_positions`); ``rank_rows`` [layer, head+1] rows used (0 for heads unless
      ``rank_per_head``);
    * ``kept_maps``: ``"{layer}.{measure}"`` → [n_kept, head, query, key] for the documents
      ``kept_docs`` (tokens ``kept_tokens``, mask ``kept_mask``), measures as in
      ``ContributionMaps`` plus ``"token"`` ([n_kept, query, key]).
    """

    kind: ClassVar[str] = "contribution_stats"
    main_plot: ClassVar[str | None] = "plot_source"
    array_shapes = {
        "source_mean": "float[layer, head+1, pos]", "source_attention": "float[layer, head, pos]",
        "source_count": "float[layer, pos]", "lag_mean": "float[layer, head+1, lag]",
        "lag_attention": "float[layer, head, lag]", "lag_count": "float[layer, lag]",
        "lags": "int[lag]", "negative_fraction": "float[layer, head+1]",
        "negative_mass": "float[layer, head+1]",
        "rank_corr": "float?[layer, head+1, measure, measure]", "rank_rows": "float[layer, head+1]",
        "kept_docs": "int[kept]", "kept_tokens": "int[kept, kpos]", "kept_mask": "bool[kept, kpos]",
        "kept_maps": "float[kept, head, kpos, kpos] | float[kept, kpos, kpos]",
        "negative_fraction_raw": "float[layer, head+1]",
    }
    array_dims = {"layer": "layers", "measure": "measures"}

    layers: list
    mode: str
    causal: bool
    source_mean: Tensor
    source_attention: Tensor
    source_count: Tensor
    lag_mean: Tensor
    lag_attention: Tensor
    lag_count: Tensor
    lags: Tensor
    negative_fraction: Tensor
    negative_mass: Tensor
    rank_corr: Tensor
    rank_rows: Tensor
    measures: list = dataclasses.field(default_factory=lambda: list(MEASURES))
    model_name: str = ""
    kept_docs: Optional[Tensor] = None
    kept_tokens: Optional[Tensor] = None
    kept_mask: Optional[Tensor] = None
    kept_maps: dict = dataclasses.field(default_factory=dict)
    negative_fraction_raw: Optional[Tensor] = None
    negative_rtol: float = 0.0

    # -------------------------------------------------------------- access
    def maps(self, layer: int, doc: int = 0) -> ContributionMaps:
        """The kept maps of document ``kept_docs[doc]`` at ``layer`` as ContributionMaps
        (batch axis 1; factorization maps not kept are zeros)."""
        key = f"{layer}.contribution"
        if key not in self.kept_maps:
            raise KeyError(
                f"no kept maps for layer {layer}; run ContributionProbe(keep_docs=[...]) "
                "with that layer"
            )
        g = {n: self.kept_maps[f"{layer}.{n}"][doc : doc + 1] for n in (*MEASURES, "token")}
        c = g["contribution"]
        z = torch.zeros_like(c)
        qm = self.kept_mask[doc : doc + 1]
        return ContributionMaps(
            mode=self.mode, contribution=c, token=g["token"], attention=g["attention"],
            value_weighted=g["value_weighted"], output_normalized=g["output_normalized"],
            relative_norm=z, cosine=z, value_norm=torch.zeros(c.shape[:2] + c.shape[-1:]),
            output_norm=torch.zeros(1, 1, c.shape[-2]), valid=qm[:, None, :],
        )

    def view(self, layer: int | None = None, doc: int = 0, **kwargs):
        """circuitsvis view of a kept document's contribution map (``keep_docs`` of the
        probe); default: the last layer."""
        return self._draw("view", layer=layer, doc=doc, **kwargs)

    rows = deprecated_method("to_rows", "rows")
    summary_rows = deprecated_method("to_rows", "summary_rows")

    def to_rows(self) -> list[dict]:
        """One row per layer: token-level negative shares, the sink's (source 0) mean
        contribution and attention, and the token-level rank correlation of each baseline
        with the contribution."""
        rows = []
        ci = self.measures.index("contribution")
        for li, layer in enumerate(self.layers):
            row: dict[str, Any] = {"layer": int(layer)}
            row["neg_pair_share"] = float(self.negative_fraction[li, -1])
            if self.negative_fraction_raw is not None:
                row["neg_pair_share_tau0"] = float(self.negative_fraction_raw[li, -1])
            row["neg_mass_share"] = float(self.negative_mass[li, -1])
            row["C_on_first_token"] = float(self.source_mean[li, -1, 0])
            row["attn_on_first_token"] = float(self.source_attention[li, :, 0].mean())
            for mi, m in enumerate(self.measures):
                if m != "contribution":
                    row[f"spearman_{m}_vs_c"] = float(self.rank_corr[li, -1, mi, ci])
            rows.append(row)
        return rows

    # -------------------------------------------------------------- plots
    def plot_source(self, max_pos: int = 64):
        """Mean token-level contribution and mean attention (head mean) by source
        position, one line per layer, first ``max_pos`` positions."""
        return self._draw("plot_source", max_pos=max_pos)

    def plot_lag(self, max_lag: int = 64):
        """Mean token-level contribution and mean attention by lag ``i − j``."""
        return self._draw("plot_lag", max_lag=max_lag)

    def plot_rank_corr(self):
        """Token-level Spearman correlation matrices between the measures, one per layer."""
        return self._draw("plot_rank_corr")

    def plot_negative(self):
        """Heat maps (layer × head, last column = token level) of the negative shares."""
        return self._draw("plot_negative")


# ----------------------------------------------------------------------------- probe
class ContributionProbe(Probe):
    """Contribution weights of every (or the chosen) layer vs attention measures, as corpus
    statistics (SPEC C.1–C.2).

    layers: layers to read (default all); mode: ``"inter"`` (default, token level
    ``C_ij`` rows sum to 1) or ``"intra"``; keep_docs: corpus indices of documents whose
    full maps (four measures per head + token level) are kept for views; rank_queries:
    queries per document (evenly spaced over positions 2 … L − 1 of the document's own
    length L, so independent of batching and padding) used for the rank
    correlations (0 = none), at token level and, with ``rank_per_head``, per head (8 times
    the sorting; off by default), on every ``rank_stride``-th document of the corpus (by
    corpus index, so independent of batching); chunk_docs: accepted for compatibility and
    no longer used (the streaming map is formed one document and one block of queries at
    a time, in the probe's workspace);
    negative_rtol: relative threshold of ``negative_fraction`` (a pair counts as negative
    when ``c_ij < −negative_rtol · Σ_j |c_ij|``, see :class:`ContributionStats`).
    """

    name = "contributions"

    def __init__(
        self,
        layers: Optional[Sequence[int]] = None,
        mode: ContributionMode = "inter",
        keep_docs: Sequence[int] = (),
        rank_queries: int = 8,
        name: Optional[str] = None,
        chunk_docs: int = 2,
        rank_per_head: bool = False,
        rank_stride: int = 4,
        negative_rtol: float = 1e-6,
        keep_positions: Optional[int] = None,
    ):
        super().__init__()
        if keep_positions is not None and int(keep_positions) < 1:
            raise ValueError(f"keep_positions must be a positive int or None, got {keep_positions}")
        #: kept maps cut to the first ``keep_positions`` queries and keys (None: whole)
        self.keep_positions = None if keep_positions is None else int(keep_positions)
        check_choice("mode", mode, ContributionMode)
        if rank_queries < 0:
            raise ValueError(f"rank_queries must be >= 0, got {rank_queries}")
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        self.mode = mode
        if isinstance(keep_docs, numbers.Integral):
            raise TypeError(
                f"keep_docs takes the corpus indices of the documents whose maps to keep, not a "
                f"count: keep_docs=[{keep_docs}] keeps document {keep_docs}, "
                f"keep_docs=range({keep_docs}) the first {keep_docs}")
        try:
            if isinstance(keep_docs, str):
                raise TypeError
            kept = [operator.index(d) for d in keep_docs]
        except TypeError:
            raise TypeError(f"keep_docs takes corpus indices (ints), e.g. keep_docs=[0, 3]; got "
                            f"{keep_docs!r}") from None
        if any(d < 0 for d in kept):
            raise ValueError(f"keep_docs are corpus indices (>= 0), got {kept}")
        self.keep_docs = sorted(set(kept))
        self.rank_queries = int(rank_queries)
        if chunk_docs < 1:
            raise ValueError(f"chunk_docs must be >= 1, got {chunk_docs}")
        self.chunk_docs = int(chunk_docs)
        self.rank_per_head = bool(rank_per_head)
        if rank_stride < 1:
            raise ValueError(f"rank_stride must be >= 1, got {rank_stride}")
        self.rank_stride = int(rank_stride)
        if not 0.0 <= negative_rtol < 1.0:
            raise ValueError(f"negative_rtol must lie in [0, 1), got {negative_rtol}")
        self.negative_rtol = float(negative_rtol)
        if name is not None:
            self.name = name
        self._W: dict[int, Tensor] = {}
        self.reductions = {}  # instance level: kept-map keys are added per layer

    def requires(self, view: ModelView) -> dict[int, set[str]]:
        layers = self._read_layers(view)
        self._W = {}  # W_O is read from this run's model (weights edited in place between runs)
        return {layer: {"pattern", "v"} for layer in layers}

    def _window(self, layer: int) -> Optional[int]:
        """The layer's sliding window (None: full attention; :func:`~tl_spectral.
        model_view.layer_windows`), read once per model."""
        if self.view is None:
            return None
        if getattr(self, "_windows_of", None) is not self.view:
            self._windows, self._windows_of = layer_windows(self.view), self.view
        return self._windows[layer]

    def _workspace(self, n: int, T: int, like: Tensor) -> Tensor:
        """A ``[n, T, T]`` buffer kept between updates, zero outside the query blocks of
        :func:`_query_blocks` (``update`` overwrites every block, so nothing else is ever
        written): no fresh ``T²`` allocation, zero fill and page faults per layer. Freed
        by :meth:`result`."""
        buf = getattr(self, "_ws", None)
        if buf is None or buf.shape != (n, T, T) or buf.dtype != like.dtype \
                or buf.device != like.device:
            self._ws = buf = torch.zeros(n, T, T, dtype=like.dtype, device=like.device)
        return buf

    def _w_o(self, layer: int, device: torch.device) -> Tensor:
        W = self._W.get(layer)
        if W is None or W.device != device:
            assert self.view is not None
            # the current layer's only: a copy per layer would stay for the whole run
            W = self.view.weights(layer).W_O.to(device)
            self._W = {layer: W}
        return W

    def update(self, cap: LayerCapture) -> None:
        # Long on purpose: the hot loop of the probe, blocked by queries for the cache (see
        # the comments); split, the block state would travel through many arguments.
        assert cap.pattern is not None and cap.v is not None
        layer = cap.layer
        p = shared.query_pattern(cap)  # padded query rows 0
        b, H, T, _ = p.shape
        qm = cap.mask
        padless = shared.padless(cap)
        W = self._w_o(layer, p.device).to(p.dtype)
        causal = self.view.causal if self.view is not None else True
        window = self._window(layer)
        pair_count = None
        if not padless:
            allow = window_allowed(T, window, causal=causal, device=p.device)
            pairs = allow & qm[:, :, None] & qm[:, None, :]  # [b, q, k]
            pair_count = pairs.double().sum(0)

        # u^h (inter: o W_O^hᵀ / ‖o‖², intra: z^h G^h / ‖o^h‖²) for every query at once, from
        # the value products shared with other probes of this layer (SinkProbe); then
        # c = α ⊙ (u vᵀ) per document in blocks of queries (a block stays in cache for
        # everything read from it; a causal block's keys stop at its last query, so the
        # zero upper triangle is never formed); sums over the batch are in-place adds of
        # the hot block (a reduction over a short leading axis is several times slower)
        vp = shared.value_products(cap, W, causal)
        u, inv = _scaled_u(vp, W, self.mode, None if padless else qm, default_rtol(p.dtype),
                           o=shared.head_outputs(cap, W, causal) if self.mode == "inter" else None)
        vT = vp.vh.transpose(-1, -2)  # [b, H, d, k]
        cs = self._workspace(H + 1, T, p)  # Σ_b c, Σ_b C; 0 outside the query blocks
        src = torch.zeros(H + 1, T, dtype=p.dtype, device=p.device)  # Σ_b Σ_q of cs
        # per document, head (then the token level) and query: Σ_k |c|, −#{c < −τ_row} and
        # −#{c < 0} (_negative_rows), written block by block and reduced once at the end
        neg_rows = torch.zeros(3, b, H + 1, T, dtype=p.dtype, device=p.device)
        lag_c = torch.zeros(H + 1, T, dtype=p.dtype, device=p.device) if causal else None
        sums = shared.BlockSums(cap, causal)  # the pattern's, if nothing formed them yet
        for a, e, k in _query_blocks(T, causal):
            cs_b = cs[:, a:e, :k]  # [H + 1, q, k]: this block of Σ_b c and Σ_b C
            for d in range(b):
                # the first document's map is formed in the workspace itself; later ones
                # in a block-sized buffer (in cache) added to it
                first = d == 0
                c = cs_b[:H] if first else torch.empty_like(cs_b[:H])
                torch.matmul(u[d, :, a:e], vT[d, :, :, :k], out=c)
                c.mul_(p[d, :, a:e, :k])
                C = cs_b[H] if first else torch.empty_like(cs_b[H])
                torch.sum(c, 0, out=C)  # token level
                rows = neg_rows[:, d, :, a:e]  # [3, H + 1, q]
                _negative_rows(c, self.negative_rtol, tuple(rows[:, :H]))
                _negative_rows(C, self.negative_rtol, tuple(rows[:, H]))
                if not first:
                    cs_b[:H] += c
                    cs_b[H] += C
                del c, C
            src[:, :k] += cs_b.sum(1)  # sums by key and lag while the block is in cache
            if lag_c is not None:
                shared.add_block_lag_sums(cs, a, e, lag_c)
            sums.add(a, e)
        sums.finish()
        absum, n_neg, n_neg0 = neg_rows.sum((1, 3), dtype=torch.float64)  # [H + 1] each
        n_neg, n_neg0 = n_neg.neg_(), n_neg0.neg_()
        # the state stays on the model's device (moved to the CPU in result())
        acc = self.accumulate
        acc(f"{layer}.src_c", src.double())
        acc(f"{layer}.src_a", shared.pattern_source_sums(cap).double())
        if pair_count is None:  # full windows: the counts in closed form (exact integers)
            src_n, lag_n, pairs_n = _full_window_counts(T, b, causal, p.device, window)
        else:
            src_n, lag_n = pair_count.sum(0), _lag_sums(pair_count, causal)
            pairs_n = pair_count.sum().reshape(1)
        acc(f"{layer}.src_n", src_n)
        lags_c = (lag_c, torch.zeros_like(lag_c)) if lag_c is not None else _lag_sums(cs, causal)
        for key, (pos, negl) in (("c", lags_c),
                                 ("a", shared.pattern_lag_sums(cap, causal)), ("n", lag_n)):
            acc(f"{layer}.lagp_{key}", pos.double())
            acc(f"{layer}.lagn_{key}", negl.double())
        sum_c = src.sum(-1).double()  # (a float64 accumulation: 10x slower)
        acc(f"{layer}.sum_c", sum_c)
        # Σ c⁻ = (Σ c − Σ |c|) / 2 (both exact sums of what the map holds; no clamped copy)
        acc(f"{layer}.neg_sum", ((sum_c - absum) * 0.5).clamp_(max=0.0))
        acc(f"{layer}.neg_n", n_neg)
        acc(f"{layer}.neg_n0", n_neg0)
        acc(f"{layer}.pairs", pairs_n)
        del cs

        if self.rank_queries > 0 and T >= 3:
            sel = (cap.doc_index % self.rank_stride == 0).nonzero().flatten()
            if sel.numel():
                idx = sel.to(p.device)
                self._rank_update(layer, p, vp, u, inv, qm, causal, idx, window)
        if self.keep_docs:
            self._keep_update(layer, p, cap, W)

    def _rank_update(self, layer, p, vp, u, inv, qm, causal, idx, window=None) -> None:
        # p: the batch's pattern; idx: its documents to use. Only the sampled query rows of
        # those documents are gathered (never a copy of their whole pattern), and their
        # four measures (those of contribution_weights) are formed from what update()
        # already holds: the value products' ‖ṽ_j‖, u (scaled by 1 / ‖o‖², 0 where the
        # output is not valid) and 1 / ‖o‖ (0 there too)
        H, T = p.shape[1], p.shape[-1]
        qm = qm[idx]
        qidx, qok = rank_query_positions(qm.sum(1).cpu(), self.rank_queries)
        M = len(MEASURES)
        if qidx.shape[1] == 0:
            return
        qidx, qok = qidx.to(p.device), qok.to(p.device)
        docs = idx.tolist()
        rows_p = torch.stack([p[d].index_select(1, qi) for d, qi in zip(docs, qidx)])
        rows_u = torch.stack([u[d].index_select(1, qi) for d, qi in zip(docs, qidx)])
        rows_inv = torch.stack([inv[d].index_select(1, qi) for d, qi in zip(docs, qidx)])
        rows_inv = rows_inv * qok[:, None, :]  # [n, H|1, m]
        vn = vp.vnorm[idx].unsqueeze(2)  # [n, H, 1, k]
        value_weighted = rows_p * vn
        measures = {
            "attention": rows_p,
            "value_weighted": value_weighted,
            "output_normalized": value_weighted * rows_inv.unsqueeze(-1),
            "contribution": rows_p * (rows_u @ vp.vh[idx].transpose(-1, -2)),
        }
        keys = torch.arange(T, device=p.device)
        allowed = qok[:, :, None] & qm[:, None, :]  # [b, n, k]
        if causal:
            allowed = allowed & (keys[None, None, :] <= qidx[:, :, None])
            if window is not None:  # a sliding-window layer: only the keys it may see
                allowed = allowed & (qidx[:, :, None] - keys[None, None, :] < int(window))
        sums = torch.zeros(H + 1, M, M, dtype=torch.float64, device=p.device)
        rows = torch.zeros(H + 1, dtype=torch.float64, device=p.device)
        al_h = allowed[:, None].expand(-1, H, -1, -1)
        al_t = allowed[:, None]
        # the four measures stacked on a leading axis: one sort for all, and every pair of
        # measures at once by broadcasting ([M, 1, …] against [1, M, …])
        r_t = _row_ranks(torch.stack([measures[m].sum(1, keepdim=True) for m in MEASURES]),
                         al_t)  # [M, b, 1, n, k]
        rho, ok = _spearman_rows(r_t[:, None], r_t[None, :], al_t)  # [M, M, b, 1, n]
        sums[H] = (rho * ok).sum((2, 3, 4))
        r_h = None
        if self.rank_per_head:
            r_h = _row_ranks(torch.stack([measures[m] for m in MEASURES]), al_h)  # [M, b, H, n, k]
            rho, ok = _spearman_rows(r_h[:, None], r_h[None, :], al_h)  # [M, M, b, H, n]
            sums[:H] = (rho * ok).sum((2, 4)).permute(2, 0, 1)
        if r_h is not None:
            rows[:H] = (al_h.sum(-1) >= 3).sum((0, 2)).double()
        rows[H] = (al_t.sum(-1) >= 3).sum().double()
        self.accumulate(f"{layer}.rank_sum", sums)
        self.accumulate(f"{layer}.rank_rows", rows)

    def _keep_update(self, layer, p, cap: LayerCapture, W) -> None:
        sel = [i for i, d in enumerate(cap.doc_index.tolist()) if d in self.keep_docs]
        if not sel:
            return
        idx = torch.tensor(sel, device=p.device)
        n = self.keep_positions
        pk, vk, mk = p[idx], cap.v[idx], cap.mask[idx]
        causal = self.view.causal if self.view is not None else True
        if n is not None and causal:  # causal: the first n queries see only the first n keys
            pk, vk, mk = pk[..., :n, :n], vk[:, :n], mk[:, :n]
        maps = contribution_weights(pk, vk, W, self.mode, mk)
        for name in (*MEASURES, "token"):
            key = f"{layer}.kept.{name}"
            self.reductions[key] = "cat"
            t = getattr(maps, name)
            self.accumulate(key, (t if n is None else t[..., :n, :n]).cpu())
        if layer == (self.layers or [layer])[0]:
            cut = slice(None) if n is None else slice(0, n)
            for key, t in (("kept_docs", cap.doc_index[idx.cpu()]),
                           ("kept_tokens", cap.tokens[idx.cpu()][:, cut]),
                           ("kept_mask", cap.mask[idx].cpu()[:, cut])):
                self.reductions[key] = "cat"
                self.accumulate(key, t.cpu())

    def result(self) -> ContributionStats:
        # Long on purpose: the summed state turned into per-layer means, field by field,
        # then one ContributionStats; each field is a few lines of the same kind.
        self._ws = None  # the update workspace
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items()}  # state lives on the model's device
        layers = list(self.layers or [])
        T = max(s[f"{layer}.src_n"].shape[-1] for layer in layers)

        def pad(t: Tensor) -> Tensor:
            return torch.nn.functional.pad(t, (0, T - t.shape[-1]))

        def get(layer: int, key: str) -> Tensor:
            return pad(s[f"{layer}.{key}"])

        causal = self.view.causal if self.view is not None else True

        def lag_axis(layer: int, key: str) -> Tensor:
            pos, neg = get(layer, f"lagp_{key}"), get(layer, f"lagn_{key}")
            if causal:
                return pos
            return torch.cat([neg.flip(-1)[..., :-1], pos], -1)

        lags = torch.arange(T) if causal else torch.arange(-(T - 1), T)

        def mean(num: Tensor, den: Tensor) -> Tensor:
            return torch.where(den > 0, num / den.clamp_min(1e-300), 0.0).float()

        src_c, src_a, src_n, lag_c, lag_a, lag_n = [], [], [], [], [], []
        negf, negf0, negm, rc, rr = [], [], [], [], []
        M = len(MEASURES)
        for layer in layers:
            n = get(layer, "src_n")
            src_n.append(n)
            src_c.append(mean(get(layer, "src_c"), n))
            src_a.append(mean(get(layer, "src_a"), n))
            ln = lag_axis(layer, "n")
            lag_n.append(ln)
            lag_c.append(mean(lag_axis(layer, "c"), ln))
            lag_a.append(mean(lag_axis(layer, "a"), ln))
            pairs = s[f"{layer}.pairs"]
            negf.append(mean(s[f"{layer}.neg_n"], pairs.expand_as(s[f"{layer}.neg_n"])))
            if f"{layer}.neg_n0" in s:
                negf0.append(mean(s[f"{layer}.neg_n0"], pairs.expand_as(s[f"{layer}.neg_n0"])))
            neg = -s[f"{layer}.neg_sum"]
            absum = s[f"{layer}.sum_c"] + 2 * neg
            negm.append(mean(neg, absum))
            if f"{layer}.rank_sum" in s:
                rows = s[f"{layer}.rank_rows"]
                rc.append(mean(s[f"{layer}.rank_sum"], rows[:, None, None].expand(-1, M, M)))
                rr.append(rows)
            else:
                Hp = s[f"{layer}.neg_n"].shape[0]
                rc.append(torch.zeros(Hp, M, M))
                rr.append(torch.zeros(Hp, dtype=torch.float64))
        kept: dict[str, Tensor] = {}
        for layer in layers:
            for name in (*MEASURES, "token"):
                key = f"{layer}.kept.{name}"
                if key in s:
                    kept[f"{layer}.{name}"] = s[key].float()
        return ContributionStats(
            layers=layers,
            mode=self.mode,
            causal=causal,
            source_mean=torch.stack(src_c),
            source_attention=torch.stack(src_a),
            source_count=torch.stack(src_n).float(),
            lag_mean=torch.stack(lag_c),
            lag_attention=torch.stack(lag_a),
            lag_count=torch.stack(lag_n).float(),
            lags=lags,
            negative_fraction=torch.stack(negf),
            negative_mass=torch.stack(negm),
            negative_fraction_raw=torch.stack(negf0) if len(negf0) == len(layers) else None,
            negative_rtol=self.negative_rtol,
            rank_corr=torch.stack(rc),
            rank_rows=torch.stack(rr).float(),
            model_name=self.view.name if self.view is not None else "",
            kept_docs=s.get("kept_docs"),
            kept_tokens=s.get("kept_tokens"),
            kept_mask=s.get("kept_mask"),
            kept_maps=kept,
        )


def layer_maps(
    model: Any,
    tokens: Tensor,
    layers: Optional[Sequence[int]] = None,
    mode: ContributionMode = "inter",
    attention_mask: Optional[Tensor] = None,
) -> dict[int, ContributionMaps]:
    """Contribution maps of one batch, on request: ``{layer: ContributionMaps}``.

    tokens: ``[batch, pos]``; attention_mask: ``[batch, pos]`` (1 = real, right padded).
    One forward pass with pattern and value hooks on the wanted layers only, stopped after
    the last of them (no later block, no logits); the maps come from
    ``contribution_weights`` (batch axis = the rows of ``tokens``).
    """
    from tl_spectral.model_view import PatternsNotExposedError

    view = model if isinstance(model, ModelView) else ModelView(model)
    if tokens.ndim == 1:
        tokens = tokens[None]
    mask = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    wanted = sorted({int(x) for x in (range(view.n_layers) if layers is None else layers)})
    caps: dict[int, dict[str, Tensor]] = {l: {} for l in wanted}

    def grab(layer: int, kind: str):
        def hook(t: Tensor, hook: Any = None) -> Tensor:
            caps[layer][kind] = t.detach()
            return t

        return hook

    hooks = [(view.hook_name(kind, l), grab(l, kind)) for l in wanted for kind in ("v", "pattern")]
    # causal decoders never see right padding; encoders need the padding mask of the keys
    am = None if (view.causal or bool(mask.all())) else mask.long()
    with torch.no_grad():
        view.run(tokens, attention_mask=am, fwd_hooks=hooks, return_type=None)
    for l in wanted:
        if "pattern" not in caps[l]:
            raise PatternsNotExposedError(view.patterns_not_exposed_message(l))
    qm = mask.to(view.device)
    return {
        l: contribution_weights(caps[l]["pattern"], view.repeat_kv(caps[l]["v"], 2),
                                view.weights(l).W_O.to(view.device), mode, qm)
        for l in wanted
    }
