"""Removal masks and curve areas for ERASER-style faithfulness (SPEC part C.3).

A measure scores every (query ``i``, source ``j``) pair. For a removal fraction ``r`` each
query ranks its *allowed* sources (causal ∧ not padding) by the measure and removes
``k_i = round(r · n_i)`` of them, ``n_i`` = number of allowed sources of query ``i``:

* ``which="top"``    removes the ``k_i`` highest-scoring sources (comprehensiveness);
* ``which="bottom"`` removes the ``k_i`` lowest-scoring sources (sufficiency).

Rounding is half up, ``k_i = floor(r · n_i + 1/2)``, computed with a 1e-9 guard so that
products such as ``0.7 × 5 = 3.4999999999999996`` count as 3.5 → 4. ``r = 0`` removes
nothing, ``r = 1`` removes every allowed source. Ties are broken by position: among equal
scores the earlier key (smaller ``j``) is removed first, for both ``top`` and ``bottom``.

Global ranking (``scope="layer"``): instead of each query ranking its own sources, all
allowed (query, source) pairs of one document in one layer (per head at head level) are
ranked together and ``k = round(r · N)`` of them removed, ``N`` = number of allowed pairs;
ties are broken by flattened position (earlier query, then earlier key). Measures that give
the same order within every query (value-weighted and output-normalized, which differ by
a positive factor ``1/‖o_i‖`` per query) can then give different removal sets, so their
curves can differ.

The returned boolean mask marks the pairs to remove; the intervention (zeroing ``α_ij`` of
those pairs without renormalizing, the same as masking the projected value of ``j`` for
query ``i``) is ``remove_pairs``; the model-side loop lives with the probes.
"""

from __future__ import annotations

import math
from typing import get_args

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_spectral._deprecation import check_choice
from tl_spectral.types import FaithfulnessScope

WHICH = ("top", "bottom")
SCOPES = get_args(FaithfulnessScope)
"""Ranking scopes: ``"query"`` (each query ranks its sources, SPEC C.3) or ``"layer"``
(every allowed pair of a document's layer — and head, at head level — ranked together)."""


def check_scope(scope: str) -> str:
    """``scope`` checked: one of ``SCOPES``."""
    return check_choice("scope", scope, FaithfulnessScope, "'query': each query ranks its "
                        "sources; 'layer': all pairs of a layer together")


def allowed_mask(
    n_query: int,
    n_key: int | None = None,
    *,
    causal: bool = True,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
) -> Bool[Tensor, "batch_or_1 1 query key"]:
    """Allowed (query, source) pairs: ``j ≤ i`` if ``causal`` (query and key positions
    aligned at the end), ``j`` a real key (``key_mask``), ``i`` a real query (``query_mask``).

    Returns ``[batch or 1, 1, query, key]`` bool, broadcastable over heads.
    """
    n_key = n_query if n_key is None else n_key
    if causal:
        m = torch.ones(n_query, n_key, dtype=torch.bool).tril(n_key - n_query)
    else:
        m = torch.ones(n_query, n_key, dtype=torch.bool)
    m = m[None, None]
    if key_mask is not None:
        if key_mask.ndim != 2 or key_mask.shape[1] != n_key:
            raise ValueError(f"key_mask must be [batch, key={n_key}], got {tuple(key_mask.shape)}")
        m = m.to(key_mask.device) & key_mask.bool()[:, None, None, :]
    if query_mask is not None:
        if query_mask.ndim != 2 or query_mask.shape[1] != n_query:
            raise ValueError(
                f"query_mask must be [batch, query={n_query}], got {tuple(query_mask.shape)}"
            )
        m = m.to(query_mask.device) & query_mask.bool()[:, None, :, None]
    return m


def removal_counts(allowed: Bool[Tensor, "... key"], fraction: float) -> torch.Tensor:
    """``k_i = floor(fraction · n_i + 1/2)`` per row, ``n_i = allowed.sum(-1)``. [...] int64."""
    _check_fraction(fraction)
    n = allowed.sum(-1).to(torch.float64)
    return torch.floor(n * fraction + 0.5 + 1e-9).to(torch.int64)


def _check_fraction(fraction: float) -> None:
    if not isinstance(fraction, (int, float)) or not 0.0 <= float(fraction) <= 1.0:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")


def removal_mask(
    scores: Float[Tensor, "batch head_or_1 query key"],
    fraction: float,
    which: str = "top",
    allowed: Bool[Tensor, "batch_or_1 head_or_1 query key"] | None = None,
    *,
    n_heads: int | None = None,
    scope: str = "query",
) -> Bool[Tensor, "batch head query key"]:
    """Boolean mask of the (query, source) pairs to zero for one removal fraction.

    scores: ``[batch, head or 1, query, key]`` — a per-head measure or a token-level one
    (head axis 1); allowed: bool, broadcastable to scores' shape (e.g. ``allowed_mask(...)``,
    ``[batch or 1, 1, query, key]``); None = every key allowed; fraction in [0, 1];
    which: ``"top"`` (comprehensiveness) or ``"bottom"`` (sufficiency); n_heads: expand a
    token-level result (head axis 1) to this many heads (the same pairs in every head);
    scope: ``"query"`` (rank each query's sources, ``k_i`` per query) or ``"layer"`` (rank
    all allowed pairs of each [batch, head] slice together, one ``k``; see the module
    docstring).

    Steps: 1. per row, ``k_i = floor(fraction · n_allowed_i + 1/2)``; 2. stable sort of the
    scores (descending for top, ascending for bottom; ties keep key order), then a stable
    sort that moves the disallowed keys last; 3. remove the pairs ranked below ``k_i``.
    Only allowed pairs are ever removed. Returns ``[batch, head, query, key]`` bool
    (head = broadcast of scores' and allowed's head axes, or ``n_heads``).
    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    _check_fraction(fraction)
    check_scope(scope)
    if not isinstance(scores, Tensor) or scores.ndim != 4:
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores)
        raise ValueError(
            f"scores must be [batch, head or 1, query, key], got {shape}; add a head axis of "
            "size 1 to token-level scores (scores[:, None])"
        )
    if allowed is None:
        allowed = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=scores.device)
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor, got {allowed.dtype}")
    try:
        shape = torch.broadcast_shapes(scores.shape, allowed.shape)
    except RuntimeError as exc:
        raise ValueError(
            f"allowed {tuple(allowed.shape)} does not broadcast with scores {tuple(scores.shape)}"
        ) from exc
    if shape[-2:] != scores.shape[-2:]:
        raise ValueError(f"allowed {tuple(allowed.shape)} must not enlarge scores' query/key axes")
    s = scores.expand(shape)
    a = allowed.to(scores.device).expand(shape)
    if torch.isnan(s[a]).any():
        raise ValueError("scores have NaN on allowed pairs; mask or replace them first")
    full_shape = shape
    if scope == "layer":  # one row of every pair of the [batch, head] slice, query-major
        s = s.reshape(*shape[:-2], 1, shape[-2] * shape[-1])
        a = a.reshape(s.shape)
        shape = s.shape
    k = removal_counts(a, float(fraction))  # [b, h, q] (q = 1 for the layer scope)
    key = s.double() if which == "bottom" else -s.double()
    order = torch.sort(key, dim=-1, stable=True).indices
    a_sorted = a.gather(-1, order)
    # second stable sort: allowed first (key 0), disallowed last (key 1), order kept
    order = order.gather(-1, torch.sort((~a_sorted).to(torch.uint8), dim=-1, stable=True).indices)
    ranks = torch.empty_like(order)
    ranks.scatter_(
        -1, order, torch.arange(shape[-1], device=order.device).expand(shape).contiguous()
    )
    mask = ((ranks < k.unsqueeze(-1)) & a).reshape(full_shape)
    if n_heads is not None:
        if mask.shape[1] not in (1, n_heads):
            raise ValueError(f"cannot expand {mask.shape[1]} heads to n_heads={n_heads}")
        mask = mask.expand(-1, n_heads, -1, -1)
    return mask


def remove_pairs(
    pattern: Float[Tensor, "batch head query key"], mask: Bool[Tensor, "batch head query key"]
) -> Float[Tensor, "batch head query key"]:
    """Zero ``α_ij`` of the removed pairs, without renormalizing (SPEC C.3)."""
    return pattern.masked_fill(mask, 0.0)


def curve_area(
    fractions: Float[Tensor, " n_fraction"] | list[float],
    values: Float[Tensor, "*curves n_fraction"] | list[float],
    *,
    normalize: bool = True,
) -> Float[Tensor, "*curves"]:
    """Trapezoid area under a removal curve ``values(fraction)`` over its last axis.

    fractions: strictly increasing 1-D grid (e.g. 0, 0.1, …, 0.9); values: ``[..., n]``
    (e.g. ΔPPL per measure). With ``normalize`` (default) the area is divided by the span
    ``fractions[-1] − fractions[0]``, i.e. the mean of the curve over the grid's range, so
    areas from grids of different span compare; otherwise the raw integral. Returns
    ``[...]`` (0-dim for one curve) in float64.
    """
    f = torch.as_tensor(fractions, dtype=torch.float64)
    y = torch.as_tensor(values, dtype=torch.float64)
    if f.ndim != 1 or f.numel() < 2:
        raise ValueError(f"fractions must be a 1-D grid of at least 2 points, got {tuple(f.shape)}")
    if y.ndim < 1 or y.shape[-1] != f.numel():
        raise ValueError(
            f"values must end with an axis of {f.numel()} points (one per fraction), "
            f"got shape {tuple(y.shape)}"
        )
    if not bool((f[1:] > f[:-1]).all()):
        raise ValueError("fractions must be strictly increasing")
    if not torch.isfinite(y).all():
        raise ValueError("values have NaN/inf; drop those curves first")
    area = torch.trapezoid(y, f.to(y.device), dim=-1)
    if normalize:
        area = area / float(f[-1] - f[0])
    return area


def fraction_grid(step: float = 0.1, stop: float = 0.9) -> list[float]:
    """The removal fractions 0, step, …, stop (SPEC: 0, 0.1, …, 0.9), rounded to 1e-9."""
    n = math.floor(stop / step + 1e-9)
    return [round(i * step, 9) for i in range(n + 1)]
