"""Storage of the streamed lag fields (``AttentionFieldProbe(streaming=True)``): which entries
of a ``[T, n_lags]`` field are folded, and the helpers that move between them and the field.

A causal lag field is zero wherever the key lies before the document (``τ > i``: query ``i``
sees the lags ``0 … i``) and, in a sliding-window layer of width ``W``, wherever ``τ ≥ W``
— for every document, so those entries add nothing to any scatter. The streamed PODs fold
only the *valid* entries (``T(T + 1)/2`` of ``T²`` with every lag): the same eigenvalues,
and the same modes once scattered back into the rectangle (:func:`scatter_rows`).
Bidirectional fields keep the whole rectangle.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["band_index", "basis_matrix", "field_index", "jackknife_basis", "jackknife_moments", "lag_moment",
           "query_rows", "scatter_rows"]


def field_index(T: int, lags: Tensor, *, causal: bool, window: Optional[int] = None) -> dict:
    """``{"valid": [T, n_lags] bool, "index": [d] int64 | None, "dim": T · n_lags}``: the
    entries ``(i, τ)`` folded (row-major), ``index`` their flat positions in the rectangle
    (None: every entry, the bidirectional rectangle)."""
    n_lags = int(lags.numel())
    if not causal:
        valid = torch.ones(T, n_lags, dtype=torch.bool)
        return {"valid": valid, "index": None, "dim": T * n_lags}
    i = torch.arange(T)[:, None]
    lg = lags[None, :].to(torch.int64)
    valid = lg <= i
    if window is not None:
        valid = valid & (lg < int(window))
    return {"valid": valid, "index": torch.nonzero(valid.flatten()).flatten(), "dim": T * n_lags}


def band_index(valid: Tensor, mask: Tensor, window: Tensor) -> dict:
    """One band's folded entries: ``index`` (flat positions in the ``[T, n_lags]`` field),
    ``weight`` (the window ``G_m(τ)`` at each, float32), ``pos`` (their flat positions in the
    band's ``[T, n_band]`` rectangle; None when they fill it) and ``dim`` (``T · n_band``)."""
    T, n_lags = (int(x) for x in valid.shape)
    mask = mask.to(torch.bool).cpu()
    sel = valid & mask[None, :]
    index = torch.nonzero(sel.flatten()).flatten()
    weight = window.to(torch.float32).cpu().expand(T, n_lags).reshape(-1)[index]
    sub = valid[:, mask]
    pos = None if bool(sub.all()) else torch.nonzero(sub.flatten()).flatten()
    return {"index": index, "weight": weight, "pos": pos, "dim": int(sub.numel())}


def scatter_rows(rows: Tensor, pos: Optional[Tensor], dim: int) -> Tensor:
    """``rows [k, d]`` over the folded entries back into ``[k, dim]`` (zeros elsewhere).
    Rows of another width (a state merged from probes whose windows differed) are returned
    as they are."""
    if pos is None or int(rows.shape[1]) != int(pos.numel()):
        return rows
    out = rows.new_zeros(rows.shape[0], dim)
    out[:, pos.to(rows.device)] = rows
    return out


def query_rows(tri: Tensor, valid: Tensor, queries: Tensor) -> Tensor:
    """The lag profiles ``[b, Q, n_lags]`` (float64) of the queries ``queries`` from rows
    ``tri [b, d]`` over the valid entries (zeros at the others, as in the field)."""
    T, n_lags = (int(x) for x in valid.shape)
    flat = valid.flatten()
    at = torch.cumsum(flat.to(torch.int64), 0) - 1  # position of each valid entry in a row
    at = torch.where(flat, at, torch.full_like(at, -1)).view(T, n_lags)[queries.cpu()]
    ok = at >= 0
    out = torch.zeros(tri.shape[0], *at.shape, dtype=torch.float64, device=tri.device)
    out[:, ok.to(tri.device)] = tri[:, at[ok].to(tri.device)].to(torch.float64)
    return out


def lag_moment(F: Tensor, rows: int = 4096) -> Tensor:
    """``Σ_{s,i} F_s(i,·) F_s(i,·)ᵀ`` (float64 ``[n_lags, n_lags]``) of ``F [b, T, n_lags]``,
    by blocks of ``rows`` query rows (no float64 copy of the batch)."""
    n_lags = int(F.shape[-1])
    flat = F.reshape(-1, n_lags)
    M = torch.zeros(n_lags, n_lags, dtype=torch.float64, device=F.device)
    for a in range(0, int(flat.shape[0]), rows):
        P = flat[a:a + rows].to(torch.float64)
        M.addmm_(P.T, P)
    return M


def jackknife_basis(W: Tensor, mean: Tensor) -> tuple:
    """The whole field's POD directions as the jackknife reads them, without a copy of the
    factors: ``(W, rows, scale, mean)`` with ``V = scale[:, None] · W[rows]`` the unit modes
    of :func:`~tl_spectral.analysis.streaming_pod.spectrum` (descending, above rounding
    noise, largest entry positive); a document's coordinates are ``(y Wᵀ)[rows] · scale``."""
    from tl_spectral.analysis.streaming_pod import row_signs, spectrum_order

    rows, sq = spectrum_order(W)
    scale = row_signs(W)[rows] / torch.sqrt(sq)
    return W, rows, scale, mean


def basis_matrix(basis: tuple) -> Tensor:
    """``V [k, d]`` float32 of a :func:`jackknife_basis` (for comparisons only)."""
    W, rows, scale, _ = basis
    return (W[rows].to(torch.float64) * scale[:, None]).to(torch.float32)


def jackknife_moments(basis: tuple, group: Tensor, n_groups: int, Y: Tensor,
                      doc_index: Tensor) -> dict[str, Tensor]:
    """Per group of documents, the moments of the whole field's coordinates ``c = V (y − x̄)``
    in the first pass's POD directions ``V`` (a :func:`jackknife_basis`) and the exact energy
    (see :func:`~tl_spectral.analysis.streaming_pod.projected_group_spectrum`): ``{"C" [G, K,
    K], "c" [G, K], "n" [G], "sumsq" [G], "sums" [G, d]}`` of the documents ``Y [b, d]`` (their
    fields over the folded entries), ``group [N]`` each document's group, ``G = n_groups``
    (fixed: short chunks leave groups empty, dropped at the end)."""
    W, rows, scale, mu = basis
    G, dev = int(n_groups), W.device
    grp = group.to(dev)
    grp = grp[doc_index.to(dev) % grp.numel()]  # (modulo: runs that accumulate)
    Y = Y.to(dev, W.dtype) - mu.to(W.dtype)
    c = (Y @ W.T).to(torch.float64)[:, rows.to(dev)] * scale.to(dev)  # [b, K] = Y Vᵀ
    K = int(rows.numel())
    Y64 = Y.to(torch.float64)
    C = torch.zeros(G, K, K, dtype=torch.float64, device=dev)
    for g in torch.unique(grp).tolist():  # Σ c cᵀ per group: one [K, b_g] × [b_g, K]
        cg = c[grp == g]
        C[g] = cg.T @ cg
    z = {"dtype": torch.float64, "device": dev}
    return {
        "C": C,
        "c": torch.zeros(G, K, **z).index_add_(0, grp, c),
        "n": torch.zeros(G, **z).index_add_(0, grp, torch.ones_like(grp, dtype=torch.float64)),
        "sumsq": torch.zeros(G, **z).index_add_(0, grp, Y64.pow(2).sum(1)),
        "sums": torch.zeros(G, int(Y.shape[1]), **z).index_add_(0, grp, Y64),
    }
