"""Contribution weights and their attention baselines (SPEC part C.1–C.2).

For one layer, head ``h``, query ``i`` and source ``j`` the projected value is
``ṽ_j^h = v_j^h W_O^h`` (d_model), the head output ``o_i^h = Σ_j α_ij^h ṽ_j^h`` and the
layer output ``o_i = Σ_h o_i^h`` (no ``b_O``). The contribution weight of ``j`` is the
projection of its weighted projected value on the output, in units of the output:

* intra-head  ``c_ij^h = ⟨o_i^h, α_ij^h ṽ_j^h⟩ / ‖o_i^h‖²``       (Σ_j c_ij^h = 1)
* inter-head  ``c_ij^h = ⟨o_i,   α_ij^h ṽ_j^h⟩ / ‖o_i‖²``          (Σ_h Σ_j c_ij^h = 1)
* token level ``C_ij = Σ_h c_ij^h``                                 (Σ_j C_ij = 1, inter)

and it factorizes as ``c = α · (‖ṽ_j‖ / ‖o‖) · cos(o, ṽ_j)`` (``o`` = ``o_i^h`` intra,
``o_i`` inter). Contributions can be negative (destructive interference).

Nothing of shape ``[.., query, key, .., d_model]`` is ever formed. Every inner product
goes through d_head space:

1. ``z_i^h = Σ_j α_ij^h v_j^h``                      [batch, head, query, d_head]  (attention cost)
2. ``G^h = W_O^h W_O^hᵀ``                            [head, d_head, d_head]
3. ``‖ṽ_j^h‖² = v_j^h G^h v_j^hᵀ``                   [batch, head, key]
4. intra: ``⟨o_i^h, ṽ_j^h⟩ = (z_i^h G^h) · v_j^h`` and ``‖o_i^h‖² = z_i^h G^h z_i^hᵀ``;
   inter: ``o_i = Σ_h z_i^h W_O^h`` [batch, query, d_model], ``u_i^h = o_i W_O^hᵀ``
   [batch, head, query, d_head], ``⟨o_i, ṽ_j^h⟩ = u_i^h · v_j^h``.

Step 4 is one batched ``[query, d_head] × [d_head, key]`` product per head, so the whole
map costs what attention costs, O(T² · H · d_head).

Outputs of (numerically) zero norm cannot be divided by: where ``‖o‖ ≤ rtol · Σ_j α_ij
‖ṽ_j‖`` (the triangle-inequality bound on ``‖o‖``, so the test is scale-free), or where
the query is padding, every map that divides by ``‖o‖`` is set to 0 and ``valid`` is
False; ``masked_reason`` says how many entries were masked and why. No NaN is returned.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, get_args

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_spectral._deprecation import check_choice
from tl_spectral.results import Result, register_result
from tl_spectral.types import ContributionMode

MODES = get_args(ContributionMode)
MEASURES = ("attention", "value_weighted", "output_normalized", "contribution")
"""The measures of token importance, worst to best in the paper's hierarchy (SPEC C.2)."""


# ----------------------------------------------------------------------------- inputs
def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (half precisions are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def default_rtol(dtype: torch.dtype) -> float:
    """Relative tolerance under which a norm counts as zero: 100 machine epsilons."""
    return 100.0 * torch.finfo(dtype).eps


def all_finite(t: Tensor) -> bool:
    """True when every entry is finite. Fast path: a sum is finite only if all terms are
    (inf and NaN propagate); a non-finite sum (possibly plain overflow) falls back to the
    elementwise check."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_layer_inputs(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    query_mask: Bool[Tensor, "batch query"] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate one layer's tensors and bring them to a common layout and dtype.

    pattern: ``[batch, head, query, key]`` (TransformerLens ``hook_pattern``);
    v: ``[batch, key, kv_head, d_head]`` (``hook_v``; ``kv_head`` divides ``head``; value head
    ``g`` serves query heads ``g·n, …, g·n + n − 1`` with ``n = head / kv_head``);
    W_O: ``[head, d_head, d_model]``; query_mask: ``[batch, query]`` bool, True = real token.

    Returns ``(pattern, v_heads, W_O, query_mask)`` in float32/float64 with
    ``v_heads: [batch, head, key, d_head]`` and the rows of padded queries of ``pattern``
    set to 0 (their content is ignored, NaN included). Raises ``ValueError`` on bad input.
    """
    for name, t, nd, layout in (
        ("pattern", pattern, 4, "[batch, head, query, key]"),
        ("v", v, 4, "[batch, key, kv_head, d_head] (the hook_v layout)"),
        ("W_O", W_O, 3, "[head, d_head, d_model]"),
    ):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {type(t)}")
        if t.ndim != nd:
            raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    b, h, q, k = pattern.shape
    bv, kv_len, kv_heads, d_head = v.shape
    if bv != b or kv_len != k:
        raise ValueError(
            f"v has shape {tuple(v.shape)} but pattern {tuple(pattern.shape)} needs "
            f"v: [batch={b}, key={k}, kv_head, d_head]; pass hook_v "
            "([batch, pos, kv_head, d_head]), not hook_z or a head-first layout"
        )
    if W_O.shape[0] != h or W_O.shape[1] != d_head:
        raise ValueError(
            f"W_O has shape {tuple(W_O.shape)}; expected [head={h}, d_head={d_head}, d_model] "
            "to match pattern and v (TransformerLens W_O[layer] is [head, d_head, d_model])"
        )
    if kv_heads < 1 or h % kv_heads != 0:
        raise ValueError(
            f"v has {kv_heads} value heads, which does not divide the {h} query heads; "
            "grouped-query attention needs head % kv_head == 0"
        )
    dtype = compute_dtype(pattern, v, W_O)
    pattern = pattern.to(dtype)
    if query_mask is None:
        qm = torch.ones(b, q, dtype=torch.bool, device=pattern.device)
    else:
        if not isinstance(query_mask, Tensor) or tuple(query_mask.shape) != (b, q):
            shape = tuple(query_mask.shape) if isinstance(query_mask, Tensor) else type(query_mask)
            raise ValueError(f"query_mask must be a [batch={b}, query={q}] tensor, got {shape}")
        if query_mask.is_floating_point():
            raise ValueError("query_mask must be bool (True = real token), not floating point")
        qm = query_mask.to(device=pattern.device, dtype=torch.bool)
        pattern = pattern.masked_fill(~qm[:, None, :, None], 0.0)
    if not all_finite(pattern):
        raise ValueError(
            "pattern has NaN/inf entries on real queries; pass query_mask to mark padded "
            "queries (their rows are ignored)"
        )
    vh = v.to(dtype).permute(0, 2, 1, 3)
    if kv_heads != h:
        vh = vh.repeat_interleave(h // kv_heads, dim=1)
    W = W_O.to(dtype=dtype, device=pattern.device)
    if not (all_finite(vh) and all_finite(W)):
        raise ValueError("v or W_O has NaN/inf entries")
    return pattern, vh, W, qm


def value_gram(W_O: Float[Tensor, "head d_head d_model"]) -> Float[Tensor, "head d_head d_head"]:
    """Per-head Gram ``G^h = W_O^h W_O^hᵀ``: ``⟨ṽ, ṽ'⟩ = v G v'ᵀ`` for ``ṽ = v W_O``."""
    return W_O @ W_O.transpose(-1, -2)


def projected_value_norms(
    v_heads: Float[Tensor, "batch head key d_head"], gram: Float[Tensor, "head d_head d_head"]
) -> Float[Tensor, "batch head key"]:
    """``‖ṽ_j^h‖ = sqrt(v_j^h G^h v_j^hᵀ)`` without forming ``ṽ`` (v already head-first)."""
    vG = torch.einsum("bhkd,hde->bhke", v_heads, gram)
    return (vG * v_heads).sum(-1).clamp_min(0.0).sqrt()


def _mask_reason(valid: Tensor, qm: Tensor, rtol: float, what: str) -> str:
    """Human-readable account of the masked entries of ``valid`` [batch, head|1, query]."""
    padded = (~qm)[:, None, :].expand_as(valid)
    n_pad = int(padded.sum())
    n_zero = int((~valid & ~padded).sum())
    if n_pad == 0 and n_zero == 0:
        return ""
    parts = []
    if n_pad:
        parts.append(f"{n_pad} on padded queries (query_mask False)")
    if n_zero:
        parts.append(f"{n_zero} with a zero-norm output {what} (‖o‖ ≤ {rtol:.1e} · Σ_j α_ij ‖ṽ_j‖)")
    return (
        f"{n_pad + n_zero} of {valid.numel()} (batch, head, query) outputs masked: "
        + "; ".join(parts)
        + ". Maps that divide by ‖o‖ are 0 there."
    )


# ----------------------------------------------------------------------------- result
@register_result
@dataclasses.dataclass
class ContributionMaps(Result):
    """Contribution weights of one layer, their factorization and the baselines.

    Shapes (``H`` = query heads; ``head|1`` = ``head`` in intra mode, 1 in inter mode):

    * ``contribution``       [batch, head, query, key]  ``c_ij^h``
    * ``token``              [batch, query, key]  ``C_ij = Σ_h c_ij^h`` (rows sum to 1 in inter
      mode; in intra mode they sum to the number of valid heads)
    * ``attention``          [batch, head, query, key]  raw ``α_ij`` (padded query rows 0)
    * ``value_weighted``     [batch, head, query, key]  ``α_ij ‖ṽ_j‖`` (Kobayashi et al. 2020)
    * ``output_normalized``  [batch, head, query, key]  ``α_ij ‖ṽ_j‖ / ‖o‖``
    * ``relative_norm``      [batch, head, query, key]  ``‖ṽ_j‖ / ‖o‖``
    * ``cosine``             [batch, head, query, key]  ``cos(o, ṽ_j)`` (0 where ``ṽ_j = 0``)
    * ``value_norm``         [batch, head, key]         ``‖ṽ_j^h‖``
    * ``output_norm``        [batch, head|1, query]     ``‖o_i^h‖`` (intra) or ``‖o_i‖`` (inter)
    * ``valid``              [batch, head|1, query] bool; where False the maps dividing by
      ``‖o‖`` (contribution, relative_norm, cosine, output_normalized) are 0.

    ``o`` is ``o_i^h`` in intra mode and ``o_i`` in inter mode, so that
    ``contribution == attention · relative_norm · cosine`` in both.
    """

    kind: ClassVar[str] = "contribution_maps"
    main_plot: ClassVar[str | None] = "plot_maps"
    measure_names: ClassVar[tuple[str, ...]] = MEASURES
    array_shapes = {
        "contribution": "float[batch, head, query, key]", "token": "float[batch, query, key]",
        "attention": "float[batch, head, query, key]",
        "value_weighted": "float[batch, head, query, key]",
        "output_normalized": "float[batch, head, query, key]",
        "relative_norm": "float[batch, head, query, key]",
        "cosine": "float[batch, head, query, key]", "value_norm": "float[batch, head, key]",
        "output_norm": "float[batch, head_or_1, query]", "valid": "bool[batch, head_or_1, query]",
    }

    mode: str
    contribution: Tensor
    token: Tensor
    attention: Tensor
    value_weighted: Tensor
    output_normalized: Tensor
    relative_norm: Tensor
    cosine: Tensor
    value_norm: Tensor
    output_norm: Tensor
    valid: Tensor
    masked_reason: str = ""

    # -------------------------------------------------------------- accessors
    def measure(self, name: str) -> Float[Tensor, "batch head query key"]:
        """The per-head map of measure ``name`` (one of ``MEASURES``)."""
        if name not in MEASURES:
            raise ValueError(f"unknown measure {name!r}; choose one of {MEASURES}")
        return getattr(self, name)

    def measures(self) -> dict[str, Tensor]:
        """All four per-head maps ``[batch, head, query, key]``, worst to best."""
        return {name: self.measure(name) for name in MEASURES}

    def token_level(self, name: str = "contribution") -> Float[Tensor, "batch 1 query key"]:
        """Token-level map ``[batch, 1, query, key]``: the sum over heads of measure ``name``.

        For ``contribution`` in inter mode this is ``C_ij`` (rows sum to 1). For raw
        attention the sum is H times the head mean, which ranks sources identically.
        The singleton head axis lets it broadcast over heads (e.g. in ``removal_mask``).
        """
        return self.measure(name).sum(1, keepdim=True)

    # -------------------------------------------------------------- plots
    def view(self, tokens=None, batch: int = 0, measure: str = "contribution", **kwargs):
        """circuitsvis view of one document's signed map (red positive, blue negative;
        see ``contribution_view`` of viz/contribution_plots.py); ``tokens``:
        the document's token strings (default: position indices)."""
        return self._draw("view", tokens=tokens, batch=batch, measure=measure, **kwargs)

    def plot_maps(self, batch: int = 0, head: int | None = None, *, max_tokens: int = 64):
        """Heatmaps (query × key) of the four measures for one head or the token level.

        ``head=None`` plots the token level (sum over heads). Signed maps (contribution,
        and any map with negative entries) use a diverging colormap centred on 0 with
        symmetric limits (red = positive, blue = negative); non-negative maps use a
        sequential one. Returns a matplotlib Figure.
        """
        return self._draw("plot_maps", batch=batch, head=head, max_tokens=max_tokens)

    def plot_factorization(self, batch: int = 0, head: int = 0, query: int = -1):
        """Bars over sources j of ``α``, ``‖ṽ_j‖/‖o‖``, ``cos(o, ṽ_j)`` and ``c = α·ratio·cos``
        for one query of one head. Returns a matplotlib Figure."""
        return self._draw("plot_factorization", batch=batch, head=head, query=query)


# ----------------------------------------------------------------------------- main entry
def contribution_weights(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    mode: ContributionMode = "inter",
    query_mask: Bool[Tensor, "batch query"] | None = None,
    *,
    rtol: float | None = None,
) -> ContributionMaps:
    """Contribution weights of one layer (SPEC C.1) with factorization and baselines (C.2).

    pattern: ``[batch, head, query, key]`` attention (rows sum to 1 over allowed keys;
    padded keys carry 0); v: ``[batch, key, kv_head, d_head]`` (``hook_v``; grouped-query
    value heads are repeated over their query heads); W_O: ``[head, d_head, d_model]``;
    mode: ``"intra"`` (project on the head output ``o_i^h``) or ``"inter"`` (on the layer
    output ``o_i``); query_mask: ``[batch, query]`` bool, True = real token; rtol: an output
    with ``‖o‖ ≤ rtol · Σ_j α_ij ‖ṽ_j‖`` counts as zero (default 100 machine epsilons of the
    compute dtype, float32 or float64).

    Steps: 1. ``z = α v`` per head; 2. ``G = W_O W_Oᵀ``, ``‖ṽ_j‖² = v_j G v_jᵀ``; 3. intra:
    ``⟨o_i^h, ṽ_j^h⟩ = (z_i G) · v_j``; inter: ``o = Σ_h z^h W_O^h``, ``⟨o_i, ṽ_j^h⟩ =
    (o_i W_O^hᵀ) · v_j``; 4. ``c = α ⟨o, ṽ⟩ / ‖o‖²``, ``ratio = ‖ṽ‖/‖o‖``,
    ``cos = ⟨o, ṽ⟩ / (‖o‖ ‖ṽ‖)``, masked where ``‖o‖`` is zero. Cost O(T²·H·d_head).
    """
    check_choice("mode", mode, ContributionMode)
    p, vh, W, qm = check_layer_inputs(pattern, v, W_O, query_mask)
    if rtol is None:
        rtol = default_rtol(p.dtype)
    G = value_gram(W)  # [H, d, d]
    vnorm = projected_value_norms(vh, G)  # [b, H, k]
    z = p @ vh  # [b, H, q, d]
    bound = p @ vnorm.unsqueeze(-1)  # [b, H, q, 1]  Σ_j α_ij ‖ṽ_j‖
    if mode == "intra":
        zG = torch.einsum("bhqd,hde->bhqe", z, G)  # o_i^h W_O^hᵀ
        dots = zG @ vh.transpose(-1, -2)  # [b, H, q, k]  ⟨o_i^h, ṽ_j^h⟩
        onorm = (zG * z).sum(-1).clamp_min(0.0).sqrt()  # [b, H, q]
        bound = bound.squeeze(-1)
    else:
        o = torch.einsum("bhqd,hdm->bqm", z, W)  # [b, q, d_model]
        u = torch.einsum("bqm,hdm->bhqd", o, W)  # [b, H, q, d]   o_i W_O^hᵀ
        dots = u @ vh.transpose(-1, -2)  # [b, H, q, k]  ⟨o_i, ṽ_j^h⟩
        onorm = o.norm(dim=-1).unsqueeze(1)  # [b, 1, q]
        bound = bound.squeeze(-1).sum(1, keepdim=True)  # [b, 1, q]
    valid = (onorm > 0) & (onorm > rtol * bound) & qm[:, None, :]
    inv = torch.where(valid, 1.0 / torch.where(valid, onorm, 1.0), 0.0)  # [b, H|1, q]
    inv_q = inv.unsqueeze(-1)  # [b, H|1, q, 1]
    vn = vnorm.unsqueeze(2)  # [b, H, 1, k]
    contribution = p * dots * (inv_q * inv_q)
    relative_norm = vn * inv_q
    inv_v = torch.where(vnorm > 0, 1.0 / torch.where(vnorm > 0, vnorm, 1.0), 0.0)
    cosine = dots * (inv_q * inv_v.unsqueeze(2))  # 0 where ‖ṽ_j‖ = 0 or invalid
    value_weighted = p * vn
    output_normalized = value_weighted * inv_q
    reason = _mask_reason(valid, qm, rtol, "of the head" if mode == "intra" else "of the layer")
    return ContributionMaps(
        mode=mode,
        contribution=contribution,
        token=contribution.sum(1),
        attention=p,
        value_weighted=value_weighted,
        output_normalized=output_normalized,
        relative_norm=relative_norm,
        cosine=cosine,
        value_norm=vnorm,
        output_norm=onorm,
        valid=valid,
        masked_reason=reason,
    )
