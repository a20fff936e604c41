"""Attention-sink rates and sink geometry (SPEC part C.4).

Rates, for one layer (``α`` = pattern, sink = key ``sink_index``, 0 by default):

* sink rate of a head: mean over real queries of ``α_i0``;
* Gu et al. (arXiv 2410.10781) key score ``a_j = Σ_i α_ij / n_j`` where ``n_j`` counts the
  real queries that can attend to ``j``: ``n_j = T − j`` for a causal model without padding
  (Gu's formula) and ``n_j = T`` for a bidirectional one (*our choice*: the mean attention
  the key receives); a head is a sink head when ``a_0 > threshold`` (0.3 by default) and
  the layer's share of sink heads is their fraction.

Geometry, per head ``h`` and query ``i`` (``ṽ_j = v_j W_O^h``):

* semantic vector ``s_i = Σ_{j≠0} α_ij ṽ_j`` and its mean ``s̄_i = s_i / m_i`` with
  ``m_i = Σ_{j≠0} α_ij`` (``= 1 − α_i0`` when the row sums to 1; summing the other keys
  avoids the cancellation of ``1 − α_i0`` when ``α_i0 ≈ 1``);
* anti-alignment ``cos(ṽ_0, s_i)``;
* output norm under an imposed sink rate ``ρ`` (``α'_i0 = ρ``, the other weights rescaled
  to sum to ``1 − ρ``): ``f_i(ρ) = ‖ρ ṽ_0 + (1 − ρ) s̄_i‖``, a convex function of ``ρ``
  whose unconstrained minimizer is ``ρ*_i = ⟨s̄, s̄ − ṽ_0⟩ / ‖s̄ − ṽ_0‖²``. It is evaluated as
  ``f(ρ)² = ‖s̄ − ṽ_0‖² (ρ − ρ*)² + f(ρ*)²`` with ``f(ρ*) = ‖s̄ − ρ*(s̄ − ṽ_0)‖`` formed in
  d_head space, which stays accurate near the minimum;
* zero-the-sink-value intervention ``o' = o − α_i0 ṽ_0 = s`` (per head, and for the layer
  ``o'_i = o_i − Σ_h α^h_i0 ṽ^h_0 = Σ_h s^h_i``): ``Δ‖o‖ = ‖o'‖ − ‖o‖`` and
  ``Δcos = cos(o', s̄) − cos(o, s̄) = 1 − cos(o, s)`` (after the intervention the output *is*
  the semantic vector, so its cosine with ``s̄`` is 1; for the layer ``s̄`` is the direction
  of ``Σ_h s^h``).

All inner products between projected values go through d_head space:
``⟨a W_O, b W_O⟩ = a G bᵀ`` with ``G = W_O W_Oᵀ``. Nothing ``[query, key, d_model]`` is formed.

Undefined quantities are masked, never NaN: padded queries; ``m_i = 0`` (the query puts all
its mass on the sink, e.g. the first query of a causal model) for ``s̄``, the curve and
``ρ*``; ``‖s̄ − ṽ_0‖`` numerically zero for ``ρ*`` (flat curve); zero ``ṽ_0`` or zero ``s``
for cosines. "Numerically zero" means at most ``rtol`` times the triangle-inequality bound
of the norm (default 100 machine epsilons).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_spectral.analysis.contributions import (
    all_finite,
    check_layer_inputs,
    default_rtol,
    value_gram,
)
from tl_spectral.results import Result, register_result


# ----------------------------------------------------------------------------- rates
def _pattern_and_mask(pattern: Tensor, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    if not isinstance(pattern, Tensor) or pattern.ndim != 4 or not pattern.is_floating_point():
        shape = tuple(pattern.shape) if isinstance(pattern, Tensor) else type(pattern)
        raise ValueError(f"pattern must be a float [batch, head, query, key] tensor, got {shape}")
    b, _, q, _ = pattern.shape
    p = pattern.to(torch.float64 if pattern.dtype == torch.float64 else torch.float32)
    if query_mask is None:
        qm = torch.ones(b, q, dtype=torch.bool, device=p.device)
    else:
        if tuple(query_mask.shape) != (b, q) or query_mask.is_floating_point():
            raise ValueError(
                f"query_mask must be a bool [batch={b}, query={q}] tensor, "
                f"got {tuple(query_mask.shape)} {query_mask.dtype}"
            )
        qm = query_mask.to(device=p.device, dtype=torch.bool)
        p = p.masked_fill(~qm[:, None, :, None], 0.0)
    if not all_finite(p):
        raise ValueError("pattern has NaN/inf on real queries; mark padded queries with query_mask")
    if (qm.sum(-1) == 0).any():
        raise ValueError("a batch element has no real query (query_mask all False); drop it")
    return p, qm


def check_sink_index(sink_index: int, n_key: int) -> None:
    """One-line ValueError unless ``0 <= sink_index < n_key`` (the sink is a key position)."""
    if not 0 <= sink_index < n_key:
        raise ValueError(f"sink_index must be in [0, {n_key}), got {sink_index}")


def sink_rate(
    pattern: Float[Tensor, "batch head query key"],
    query_mask: Bool[Tensor, "batch query"] | None = None,
    sink_index: int = 0,
) -> Float[Tensor, "batch head"]:
    """Sink rate per head: mean over real queries ``i`` of ``α_i,sink``. [batch, head]."""
    p, qm = _pattern_and_mask(pattern, query_mask)
    check_sink_index(sink_index, p.shape[-1])
    return p[..., sink_index].sum(-1) / qm.sum(-1, keepdim=True).to(p.dtype)


def key_scores(
    pattern: Float[Tensor, "batch head query key"],
    causal: bool = True,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> Float[Tensor, "batch head key"]:
    """Gu et al. key score ``Σ_i α_ij / n_j`` per head and key. [batch, head, key].

    ``n_j`` = number of real queries that may attend to key ``j``: real queries with
    ``i ≥ j`` when ``causal`` (``T − j`` without padding; needs query == key positions) and,
    for a sliding-window layer (``window`` W, :func:`~tl_spectral.model_view.layer_windows`),
    ``i < j + W`` (``min(T − j, W)``); all real queries otherwise (``T``; our choice for
    bidirectional models). Keys that no real query can see score 0.
    """
    p, qm = _pattern_and_mask(pattern, query_mask)
    return _key_scores(p, qm, causal, window=window)


def _key_scores(p: Tensor, qm: Tensor, causal: bool, total: Tensor | None = None,
                window: int | None = None) -> Tensor:
    """:func:`key_scores` of a checked pattern (padded query rows already 0); ``total``:
    ``p.sum(-2)`` when the caller has it already."""
    q, k = p.shape[-2:]
    cnt = qm.to(p.dtype)
    if causal:
        if q != k:
            raise ValueError(
                f"causal key scores need query and key positions to coincide (got {q} "
                f"queries, {k} keys); pass causal=False or the square pattern"
            )
        n = cnt.flip(-1).cumsum(-1).flip(-1)  # [b, k]  #{real i >= j}
        if window is not None and int(window) < k:  # minus #{real i >= j + W}
            w = int(window)
            n = n - torch.nn.functional.pad(n[:, w:], (0, w))
    else:
        n = cnt.sum(-1, keepdim=True).expand(-1, k)
    if total is None:
        total = p.sum(-2)  # [b, h, k]
    n = n[:, None, :]
    return torch.where(n > 0, total / n.clamp_min(1.0), 0.0)


def sink_heads(
    pattern: Float[Tensor, "batch head query key"],
    causal: bool = True,
    threshold: float = 0.3,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> Bool[Tensor, "batch head"]:
    """Heads whose Gu key score of the first token exceeds ``threshold`` (``window``: the
    layer's sliding window, see :func:`key_scores`). [batch, head]."""
    return key_scores(pattern, causal, query_mask, window=window)[..., 0] > threshold


def sink_head_share(
    pattern: Float[Tensor, "batch head query key"],
    causal: bool = True,
    threshold: float = 0.3,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> Float[Tensor, " batch"]:
    """Share of the layer's heads that are sink heads (``sink_heads``), per batch element."""
    return sink_heads(pattern, causal, threshold, query_mask, window=window).float().mean(-1)


# ----------------------------------------------------------------------------- geometry
@register_result
@dataclasses.dataclass
class SinkGeometry(Result):
    """Sink rates and sink geometry of one layer.

    Shapes: rates ``sink_rate``, ``sink_head`` [batch, head]; ``key_score``
    [batch, head, key]; ``sink_head_share`` [batch]; per head and query [batch, head, query]:
    ``anti_alignment`` = cos(ṽ_0, s_i), ``semantic_norm`` = ‖s̄_i‖, ``head_output_norm`` =
    ‖o_i^h‖, ``rho_star``, ``min_norm`` = f(ρ*), ``sbar_minus_sink_norm`` = ‖s̄ − ṽ_0‖,
    ``head_delta_norm`` = ‖s^h‖ − ‖o^h‖, ``head_delta_cos`` = 1 − cos(o^h, s^h);
    ``sink_value_norm`` = ‖ṽ_0^h‖ [batch, head]; layer level [batch, query]:
    ``output_norm`` = ‖o_i‖, ``delta_norm`` = ‖Σ_h s^h‖ − ‖o_i‖, ``delta_cos`` =
    1 − cos(o_i, Σ_h s^h). Each ``*_valid`` bool mask says where its quantity is defined;
    the quantity is 0 elsewhere.
    """

    kind: ClassVar[str] = "sink_geometry"
    array_shapes = {
        "sink_rate": "float[batch, head]", "key_score": "float[batch, head, key]",
        "sink_head": "bool[batch, head]", "sink_head_share": "float[batch]",
        "sink_value_norm": "float[batch, head]", "anti_alignment": "float[batch, head, query]",
        "anti_alignment_valid": "bool[batch, head, query]",
        "semantic_norm": "float[batch, head, query]",
        "head_output_norm": "float[batch, head, query]", "curve_valid": "bool[batch, head, query]",
        "rho_star": "float[batch, head, query]", "min_norm": "float[batch, head, query]",
        "sbar_minus_sink_norm": "float[batch, head, query]",
        "rho_star_valid": "bool[batch, head, query]",
        "head_delta_norm": "float[batch, head, query]",
        "head_delta_cos": "float[batch, head, query]",
        "head_delta_cos_valid": "bool[batch, head, query]", "output_norm": "float[batch, query]",
        "delta_norm": "float[batch, query]", "delta_cos": "float[batch, query]",
        "delta_cos_valid": "bool[batch, query]", "query_mask": "bool[batch, query]",
    }

    causal: bool
    sink_index: int
    threshold: float
    sink_rate: Tensor
    key_score: Tensor
    sink_head: Tensor
    sink_head_share: Tensor
    sink_value_norm: Tensor
    anti_alignment: Tensor
    anti_alignment_valid: Tensor
    semantic_norm: Tensor
    head_output_norm: Tensor
    curve_valid: Tensor
    rho_star: Tensor
    min_norm: Tensor
    sbar_minus_sink_norm: Tensor
    rho_star_valid: Tensor
    head_delta_norm: Tensor
    head_delta_cos: Tensor
    head_delta_cos_valid: Tensor
    output_norm: Tensor
    delta_norm: Tensor
    delta_cos: Tensor
    delta_cos_valid: Tensor
    query_mask: Tensor
    masked_reason: str = ""

    def norm_curve(
        self, rho: Float[Tensor, " n_rho"] | list[float]
    ) -> Float[Tensor, "batch head query n_rho"]:
        """``f_i(ρ) = ‖ρ ṽ_0 + (1 − ρ) s̄_i‖`` on a grid of ``ρ``. [batch, head, query, n_rho].

        0 where ``curve_valid`` is False. A flat curve (``s̄ = ṽ_0``) is ``‖s̄‖`` everywhere.
        """
        r = torch.as_tensor(rho, dtype=self.rho_star.dtype, device=self.rho_star.device)
        if r.ndim != 1:
            raise ValueError(f"rho must be a 1-D grid, got shape {tuple(r.shape)}")
        dn = self.sbar_minus_sink_norm.unsqueeze(-1)
        quad = (dn * (r - self.rho_star.unsqueeze(-1))) ** 2 + self.min_norm.unsqueeze(-1) ** 2
        f = torch.where(
            self.rho_star_valid.unsqueeze(-1), quad.sqrt(), self.semantic_norm.unsqueeze(-1)
        )
        return f * self.curve_valid.unsqueeze(-1)

    main_plot: ClassVar[str | None] = "plot_rates"

    def headline(self) -> dict[str, float]:
        """Scalar digest over batch, heads and valid queries (JSON-able)."""

        def mean(x: Tensor, m: Tensor) -> float:
            return float((x * m).sum() / m.sum()) if m.any() else float("nan")

        rs = self.rho_star[self.rho_star_valid]
        return {
            "sink_rate": float(self.sink_rate.mean()),
            "sink_head_share": float(self.sink_head_share.mean()),
            "anti_alignment": mean(self.anti_alignment, self.anti_alignment_valid),
            "rho_star_median": float(rs.median()) if rs.numel() else float("nan"),
            "rho_star_in_0_1": float(((rs > 0) & (rs < 1)).float().mean())
            if rs.numel()
            else float("nan"),
            "delta_norm": mean(self.delta_norm, self.query_mask),
            "delta_cos": mean(self.delta_cos, self.delta_cos_valid),
        }

    # -------------------------------------------------------------- plots
    def plot_norm_curve(
        self, batch: int = 0, head: int = 0, queries: list[int] | None = None, n_rho: int = 101
    ):
        """Output norm vs imposed sink rate for a few queries of one head, with the
        observed rate (dot) and ``ρ*`` (cross) marked. Returns a matplotlib Figure."""
        return self._draw("plot_norm_curve", batch=batch, head=head, queries=queries, n_rho=n_rho)

    def plot_rates(self):
        """Per-head sink rate and Gu key score of the first token (batch mean), with the
        sink-head threshold. Returns a matplotlib Figure."""
        return self._draw("plot_rates")


def _norm(x: Tensor) -> Tensor:
    return x.clamp_min(0.0).sqrt()


def _safe_div(a: Tensor, b: Tensor, ok: Tensor) -> Tensor:
    return torch.where(ok, a / torch.where(ok, b, 1.0), 0.0)


def sink_geometry(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    *,
    causal: bool = True,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    sink_index: int = 0,
    threshold: float = 0.3,
    rtol: float | None = None,
    window: int | None = None,
) -> SinkGeometry:
    """Sink rates, anti-alignment, the ρ-curve and the zero-sink-value intervention.

    pattern: ``[batch, head, query, key]``; v: ``[batch, key, kv_head, d_head]`` (hook_v);
    W_O: ``[head, d_head, d_model]``; query_mask: ``[batch, query]`` bool (True = real);
    causal: how ``key_scores`` counts the queries that see a key; sink_index: the sink key
    (0; for left-padded batches call per element or pad on the right); threshold: sink-head
    threshold on the key score; rtol: relative zero-norm tolerance; window: the layer's
    sliding window W (None: full attention; :func:`~tl_spectral.model_view.layer_windows`):
    key scores count only the queries whose window holds the key, and queries that cannot
    see the sink (``i − sink_index ≥ W``) have no anti-alignment, ρ-curve or ρ* (invalid,
    0): the sink is not among their keys.

    Steps (per head, in d_head space; ``G = W_O W_Oᵀ``): 1. ``w_i = Σ_{j≠0} α_ij v_j`` (the
    sink column left out, so ``s_i = w_i W_O`` has no cancellation), ``m_i = Σ_{j≠0} α_ij``,
    ``z_i = w_i + α_i0 v_0``; 2. Grams ``v_0 G v_0ᵀ``, ``w G wᵀ``, ``v_0 G wᵀ``, ``z G zᵀ``,
    ``z G wᵀ``; 3. ``s̄ = w / m``, ``d = s̄ − v_0``, ``ρ* = s̄ G dᵀ / d G dᵀ``,
    ``f(ρ*) = ‖(s̄ − ρ* d) W_O‖``; 4. layer level ``o = Σ_h z^h W_O^h`` and
    ``s = Σ_h w^h W_O^h`` ([batch, query, d_model]).
    """
    p, vh, W, qm = check_layer_inputs(pattern, v, W_O, query_mask)
    if (qm.sum(-1) == 0).any():
        raise ValueError("a batch element has no real query (query_mask all False); drop it")
    k = p.shape[-1]
    check_sink_index(sink_index, k)
    if rtol is None:
        rtol = default_rtol(p.dtype)
    G = value_gram(W)  # [H, d, d]
    vnorm_all = _norm(_gdot(G, vh, vh))  # [b, H, k]
    # one product over the keys j ≠ sink (the pattern read in place, the sink column left
    # out rather than zeroed in a copy): w = Σ α_ij v_j, Σ α_ij ‖ṽ_j‖ and m_i = Σ α_ij
    X = torch.cat([vh, vnorm_all.unsqueeze(-1), torch.ones_like(vnorm_all).unsqueeze(-1)], -1)
    ws = None
    for lo, hi in ((0, sink_index), (sink_index + 1, k)):
        if hi > lo:
            t = p[..., lo:hi] @ X[:, :, lo:hi]
            ws = t if ws is None else ws.add_(t)
    if ws is None:  # a single key: the sink
        ws = torch.zeros(*p.shape[:-1], X.shape[-1], dtype=p.dtype, device=p.device)
    d_head = vh.shape[-1]
    w = ws[..., :d_head]  # [b, H, q, d]
    s_bound = ws[..., d_head]  # [b, H, q]  Σ_{j≠0} α_ij ‖ṽ_j‖
    mass = ws[..., d_head + 1]  # [b, H, q]  m_i
    z = w + p[..., sink_index].unsqueeze(-1) * vh[:, :, sink_index].unsqueeze(2)
    return sink_geometry_from_products(
        p, vh, W, qm, G, vnorm_all, w, s_bound, mass, z, causal=causal,
        sink_index=sink_index, threshold=threshold, rtol=rtol, window=window)


def _gdot(G: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """``⟨x W_O, y W_O⟩`` for ``[b, H, ..., d]`` with ``G = W_O W_Oᵀ`` per head."""
    shape = x.shape
    xg = torch.einsum("bhnd,hde->bhne", x.reshape(shape[0], shape[1], -1, shape[-1]), G)
    return (xg.reshape(shape) * y).sum(-1)


def sink_geometry_from_products(
    p: Tensor, vh: Tensor, W: Tensor, qm: Tensor, G: Tensor, vnorm_all: Tensor, w: Tensor,
    s_bound: Tensor, mass: Tensor, z: Tensor, *, causal: bool = True, sink_index: int = 0,
    threshold: float = 0.3, rtol: float | None = None, o: Tensor | None = None,
    s: Tensor | None = None, key_totals: Tensor | None = None, window: int | None = None,
) -> SinkGeometry:
    """:func:`sink_geometry` from its value products (steps 2–4), for callers that formed
    them already (the probes share them, ``probes/shared.py``): ``p`` the
    pattern with padded query rows 0, ``vh`` ``[b, H, k, d]``, ``qm`` ``[b, q]`` bool,
    ``G = W_O W_Oᵀ``, ``vnorm_all`` ``[b, H, k]`` = ``‖ṽ_j‖``, ``w``, ``s_bound``, ``mass``
    and ``z`` as in step 1; optionally the layer outputs ``o = Σ_h z^h W_O^h`` and
    ``s = Σ_h w^h W_O^h`` ``[b, q, d_model]``, and the key score's totals ``Σ_i α_ij``
    ``[b, H, k]`` (``key_totals``); ``window``: the layer's sliding window (see
    :func:`sink_geometry`). No input checks."""
    # Long on purpose: one derivation in formula order (Grams, anti-alignment, ρ-curve,
    # the two interventions), each step reusing the products of the one before.
    if rtol is None:
        rtol = default_rtol(p.dtype)
    a0 = p[..., sink_index]  # [b, H, q]
    v0 = vh[:, :, sink_index]  # [b, H, d]

    def gdot(x: Tensor, y: Tensor) -> Tensor:  # ⟨x W_O, y W_O⟩ for [b, H, ..., d]
        return _gdot(G, x, y)

    v0n = vnorm_all[..., sink_index]  # [b, H]
    w_fro = W.flatten(1).norm(dim=-1)  # [H]  ‖W_O^h‖_F bounds ‖v W_O^h‖ / ‖v‖
    v0_ok = (v0n > 0) & (v0n > rtol * v0.norm(dim=-1) * w_fro)  # [b, H]
    # w G and v_0 G once: the Grams of w, z = w + α_i0 v_0 and s̄ = w / m with w, v_0, z and
    # d are dot products with them (G symmetric; differences such as d = s̄ − v_0 are formed
    # in d_head space first, so nothing cancels after the product)
    wG = torch.einsum("bhqd,hde->bhqe", w, G)
    v0G = torch.einsum("bhd,hde->bhe", v0, G)
    sn = _norm((wG * w).sum(-1))  # ‖s_i‖
    s_ok = (sn > 0) & (sn > rtol * s_bound)
    real = qm[:, None, :].expand_as(a0)
    sees = real  # real queries whose keys include the sink
    if causal and window is not None:
        qpos = torch.arange(a0.shape[-1], device=a0.device)
        sees = real & ((qpos - sink_index) < int(window))[None, None, :]

    # anti-alignment cos(ṽ_0, s_i)
    aa_ok = sees & s_ok & v0_ok.unsqueeze(-1)
    anti = _safe_div((v0G.unsqueeze(2) * w).sum(-1), v0n.unsqueeze(-1) * sn, aa_ok)

    # ρ-curve and ρ*
    curve_ok = sees & (mass > 0)
    inv_m = (curve_ok / torch.where(curve_ok, mass, 1.0)).unsqueeze(-1)
    sbar = w * inv_m
    sbarG = wG * inv_m
    sbar_norm = _norm((sbarG * sbar).sum(-1))
    d = sbar - v0.unsqueeze(2)
    dn = _norm(gdot(d, d))
    sbar_bound = _safe_div(s_bound, mass, curve_ok)
    rho_ok = curve_ok & (dn > 0) & (dn > rtol * (sbar_bound + v0n.unsqueeze(-1)))
    rho_star = _safe_div((sbarG * d).sum(-1), dn * dn, rho_ok)
    resid = sbar - rho_star.unsqueeze(-1) * d
    min_norm = torch.where(rho_ok, _norm(gdot(resid, resid)), sbar_norm) * curve_ok

    # per-head intervention: o^h -> s^h
    zG = wG + a0.unsqueeze(-1) * v0G.unsqueeze(2)
    on = _norm((zG * z).sum(-1))  # ‖o_i^h‖
    o_bound = s_bound + a0 * v0n.unsqueeze(-1)
    o_ok = (on > 0) & (on > rtol * o_bound)
    hcos_ok = real & o_ok & s_ok
    head_cos = _safe_div((zG * w).sum(-1), on * sn, hcos_ok)
    head_delta_norm = (sn - on) * real
    head_delta_cos = torch.where(hcos_ok, 1.0 - head_cos, 0.0)

    # layer intervention: o -> Σ_h s^h   (d_model vectors, [b, q, d_model])
    if o is None:
        o = torch.einsum("bhqd,hdm->bqm", z, W)
    if s is None:
        s = torch.einsum("bhqd,hdm->bqm", w, W)
    o_norm, s_norm = o.norm(dim=-1), s.norm(dim=-1)
    lay_ok = (
        qm
        & (o_norm > 0)
        & (o_norm > rtol * o_bound.sum(1))
        & (s_norm > 0)
        & (s_norm > rtol * s_bound.sum(1))
    )
    lay_cos = _safe_div((o * s).sum(-1), o_norm * s_norm, lay_ok)
    delta_norm = (s_norm - o_norm) * qm
    delta_cos = torch.where(lay_ok, 1.0 - lay_cos, 0.0)

    ks = _key_scores(p, qm, causal, key_totals, window=window)
    reason = _sink_reason(real, curve_ok, rho_ok, aa_ok, hcos_ok, sees)
    return SinkGeometry(
        causal=bool(causal),
        sink_index=int(sink_index),
        threshold=float(threshold),
        sink_rate=a0.sum(-1) / qm.sum(-1, keepdim=True).to(p.dtype),
        key_score=ks,
        sink_head=ks[..., sink_index] > threshold,
        sink_head_share=(ks[..., sink_index] > threshold).to(p.dtype).mean(-1),
        sink_value_norm=v0n,
        anti_alignment=anti,
        anti_alignment_valid=aa_ok,
        semantic_norm=sbar_norm,
        head_output_norm=on * real,
        curve_valid=curve_ok,
        rho_star=rho_star,
        min_norm=min_norm,
        sbar_minus_sink_norm=dn * curve_ok,
        rho_star_valid=rho_ok,
        head_delta_norm=head_delta_norm,
        head_delta_cos=head_delta_cos,
        head_delta_cos_valid=hcos_ok,
        output_norm=o_norm * qm,
        delta_norm=delta_norm,
        delta_cos=delta_cos,
        delta_cos_valid=lay_ok,
        query_mask=qm,
        masked_reason=reason,
    )


def _sink_reason(
    real: Tensor, curve_ok: Tensor, rho_ok: Tensor, aa_ok: Tensor, hcos_ok: Tensor,
    sees: Tensor | None = None,
) -> str:
    n = real.numel()
    parts = []
    n_pad = int((~real).sum())
    if n_pad:
        parts.append(f"{n_pad} on padded queries")
    sees = real if sees is None else sees
    n_out = int((real & ~sees).sum())
    if n_out:
        parts.append(f"{n_out} on queries whose sliding window does not reach the sink "
                     "(no curve, ρ* or anti-alignment)")
    for label, ok, prev in (
        ("all attention on the sink (Σ_{j≠0} α_ij = 0): s̄, curve and ρ* undefined", curve_ok, sees),
        ("flat curve (s̄ = ṽ_0): ρ* undefined", rho_ok, curve_ok),
        ("zero ṽ_0 or zero s_i: anti-alignment undefined", aa_ok, sees),
        ("zero o^h or zero s^h: head Δcos undefined", hcos_ok, real),
    ):
        c = int((prev & ~ok).sum())
        if c:
            parts.append(f"{c} with {label}")
    if not parts:
        return ""
    return f"of {n} (batch, head, query) entries: " + "; ".join(parts) + " (masked, set to 0)"


def output_norm_curve(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    rho: Float[Tensor, " n_rho"] | list[float],
    *,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    sink_index: int = 0,
) -> tuple[Float[Tensor, "batch head query n_rho"], Bool[Tensor, "batch head query"]]:
    """``‖ρ ṽ_0 + (1 − ρ) s̄_i‖`` on a grid ``rho`` and its validity mask (see module doc)."""
    g = sink_geometry(pattern, v, W_O, query_mask=query_mask, sink_index=sink_index)
    return g.norm_curve(rho), g.curve_valid


def optimal_sink_rate(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    *,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    sink_index: int = 0,
) -> tuple[Float[Tensor, "batch head query"], Bool[Tensor, "batch head query"]]:
    """``ρ*_i = ⟨s̄, s̄ − ṽ_0⟩ / ‖s̄ − ṽ_0‖²`` (unconstrained; the minimizer on [0, 1] is
    ``ρ*.clamp(0, 1)`` since the curve is convex) and its validity mask."""
    g = sink_geometry(pattern, v, W_O, query_mask=query_mask, sink_index=sink_index)
    return g.rho_star, g.rho_star_valid
