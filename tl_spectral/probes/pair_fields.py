"""Per-pair fields of one layer: what :class:`~tl_spectral.probes.fields.AttentionFieldProbe`
takes as the map ``A_s(i, j)`` of a document (SPEC A.1 generalised to SPEC C's measures).

Every field is a ``[batch, (head,) query, key]`` map built from the captures of one forward
pass (``pattern`` and, beyond plain attention, ``v`` and the layer's ``W_O``); each costs
what attention costs (one ``[query, d_head] × [d_head, key]`` product per head, SPEC C.1).
With ``α`` the pattern, ``ṽ_j = v_j W_O^h`` the projected value, ``o_i^h = Σ_j α_ij ṽ_j`` and
``o_i = Σ_h o_i^h``:

=====================  ==============================================  =========================
kind                   per head ``A^h_ij``                             head-combined field
=====================  ==============================================  =========================
``attention``          ``α_ij``                     (rows sum to 1)    mean over heads (rows 1)
``contribution``       inter-head ``c_ij^h = ⟨o_i, α_ij ṽ_j⟩/‖o_i‖²``   ``C_ij = Σ_h c_ij^h``
                       (rows sum to the head's share ⟨o_i, o_i^h⟩/‖o_i‖²) (rows sum to 1)
``contribution_intra`` intra-head ``⟨o_i^h, α_ij ṽ_j⟩/‖o_i^h‖²``        mean over heads (rows 1)
                       (rows sum to 1)
``value_weighted``     ``α_ij ‖ṽ_j‖ / Σ_k α_ik ‖ṽ_k‖`` (rows sum to 1)  mean over heads (rows 1)
``value_weighted_raw`` ``α_ij ‖ṽ_j‖`` (Kobayashi et al.; rows sum to   mean over heads
                       ``Σ_j α_ij ‖ṽ_j‖``, in units of the residual)
=====================  ==============================================  =========================

Normalisation (*our choice*). Every field but ``value_weighted_raw`` has rows that sum to 1
per query, so the fields differ only in *where* a query's unit mass sits (contributions may
be negative: destructive interference), never in how much there is; the scale POD of
their fluctuations then compares like with like. The raw value-weighted map mixes that with
the size of the projected values (a per-query gain that varies between documents and
would dominate its fluctuation energy); it is kept for reference. The inter-head
combination is SPEC's token level ``C = Σ_h c^h`` (``H`` × the head mean), the one whose
rows sum to 1; its scale-POD statistics (dominant scales, band shares, ``H*``, ``T_spec``)
are those of the head mean, which differs only by the constant ``H``.

Where the output a contribution divides by has (numerically) zero norm, or where a query
is padding, the row is 0 (``contribution_map``'s rule); padded keys are 0 in every field.
"""

from __future__ import annotations

from typing import Optional, get_args

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral._deprecation import check_choice
from tl_spectral.analysis.contributions import projected_value_norms, value_gram
from tl_spectral.probes.base import LayerCapture
from tl_spectral.probes.contributions import contribution_map
from tl_spectral.types import FieldKind

#: the per-pair fields :func:`pair_field` computes (see the module docstring)
FIELD_KINDS = get_args(FieldKind)


def check_field_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`FIELD_KINDS`, else a one-line ``ValueError``."""
    return check_choice("field", kind, FieldKind)


def needs_values(kind: str) -> bool:
    """True when the field needs the values ``v`` and ``W_O`` (everything but attention)."""
    return check_field_kind(kind) != "attention"


def pair_field(
    cap: LayerCapture,
    kind: str = "attention",
    *,
    W_O: Optional[Float[Tensor, "head d_head d_model"]] = None,
    per_head: bool = False,
) -> Tensor:
    """The field ``A [batch, (head,) query, key]`` of one layer and batch, float32 (float64
    when the captures are).

    cap: the layer's capture (``pattern``; ``v`` too for every kind but ``"attention"``).
    kind: one of :data:`FIELD_KINDS`. W_O: ``[head, d_head, d_model]`` of the layer (needed
    with ``v``). per_head: every head's field ``[b, h, q, k]`` instead of the head-combined
    one ``[b, q, k]``. Padded pairs (query or key padding) are 0.
    """
    check_field_kind(kind)
    if cap.pattern is None:
        raise ValueError("the capture has no pattern; the probe must require 'pattern'")
    p = cap.pattern
    if not p.is_floating_point() or p.dtype not in (torch.float32, torch.float64):
        p = p.float()
    padless = bool(cap.mask.all())
    if kind == "attention":
        A = p if padless else p * cap.pair_mask.to(p.dtype)[:, None]
        return A if per_head else A.mean(dim=1)
    if cap.v is None or W_O is None:
        raise ValueError(f"field {kind!r} needs the values v and W_O of the layer; the probe "
                         "must require 'v' and pass the layer's W_O")
    qm = cap.mask
    if not padless:
        p = p.masked_fill(~qm[:, None, :, None], 0.0)
    vh = cap.v.to(p.dtype).permute(0, 2, 1, 3)  # [b, H, k, d_head] (kv heads already repeated)
    W = W_O.to(dtype=p.dtype, device=p.device)
    if kind in ("contribution", "contribution_intra"):
        mode = "inter" if kind == "contribution" else "intra"
        A = contribution_map(p, vh, W, mode, None if padless else qm)
        if not per_head:
            A = A.sum(dim=1) if mode == "inter" else A.mean(dim=1)
    else:
        vn = projected_value_norms(vh, value_gram(W))  # [b, H, k] ‖ṽ_j^h‖
        A = p * vn[:, :, None, :]
        if kind == "value_weighted":
            row = A.sum(-1, keepdim=True)
            A = torch.where(row > 0, A / torch.where(row > 0, row, 1.0), 0.0)
        if not per_head:
            A = A.mean(dim=1)
    if not padless:
        pm = cap.pair_mask.to(A.dtype)
        A = A * (pm[:, None] if per_head else pm)
    return A
