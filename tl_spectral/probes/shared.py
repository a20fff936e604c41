"""Per-layer quantities several probes need, formed once per capture and shared.

The runner hands every probe that reads a layer the same :class:`LayerCapture`; its
``shared`` dict memoises what the probes derive from it, so when ContributionProbe and
SinkProbe read one layer the value products are formed once:

* :func:`query_pattern` — the pattern in float32/64 with the rows of padded queries 0;
  :func:`pattern_sum`, its sum over the batch, with its sums by key
  (:func:`pattern_source_sums`) and by lag (:func:`pattern_lag_sums`);
* :func:`value_products` — per head, with the sink key ``s`` (default 0) left out of the
  sum so that nothing cancels when the sink holds most of the mass (SinkProbe's choice):
  ``w_i = Σ_{j≠s} α_ij v_j``, ``Σ_{j≠s} α_ij ‖ṽ_j‖``, ``m_i = Σ_{j≠s} α_ij``, and from them
  the head output ``z_i = w_i + α_is v_s`` and its scale-free bound
  ``Σ_j α_ij ‖ṽ_j‖`` (ContributionProbe's). One ``[query, key] × [key, d_head + 2]``
  product per head, query blocks of causal models stopping their keys at the block's last
  query (the zero upper triangle is never read);
* :func:`head_outputs` — the layer output without the sink ``s = Σ_h w^h W_O^h`` and the
  layer output ``o = Σ_h z^h W_O^h = s + Σ_h α_is^h v_s^h W_O^h`` (``[batch, query,
  d_model]``; one product for both, the sink's part a rank-H correction).

Values equal the direct formulas up to float rounding (the sums run in another order);
``tests/test_probe_sharing.py`` checks them against brute force and checks that a probe
run alone and beside the others gives the same results.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from tl_spectral.analysis.contributions import projected_value_norms, value_gram
from tl_spectral.probes.base import LayerCapture


def memo(cap: LayerCapture, key: Any, make: Callable[[], Any]) -> Any:
    """``cap.shared[key]``, made by ``make()`` the first time it is asked for."""
    d = cap.shared
    if key not in d:
        d[key] = make()
    return d[key]


def padless(cap: LayerCapture) -> bool:
    """True when the batch has no padded position (memoised: one reduction per capture)."""
    return memo(cap, "padless", lambda: bool(cap.mask.all()))


def query_pattern(cap: LayerCapture) -> Tensor:
    """The pattern ``[b, H, q, k]`` in the analysis dtype with padded query rows set to 0
    (the capture itself when nothing is padded: no copy)."""
    assert cap.pattern is not None

    def make() -> Tensor:
        p = cap.pattern.float() if cap.pattern.dtype not in (torch.float32, torch.float64) \
            else cap.pattern
        if padless(cap):
            return p
        return p.masked_fill(~cap.mask[:, None, :, None], 0.0)

    return memo(cap, "query_pattern", make)


def pattern_sum(cap: LayerCapture) -> Tensor:
    """``Σ_b`` of :func:`query_pattern`: ``[H, q, k]`` (a view of the capture for a batch of
    one document; otherwise in-place adds of each document, faster than a reduction over a
    short leading axis). Read-only: probes must not modify it."""

    def make() -> Tensor:
        p = query_pattern(cap)
        if p.shape[0] == 1:
            return p[0]
        out = p[0].clone()
        for d in range(1, p.shape[0]):
            out += p[d]
        return out

    return memo(cap, "pattern_sum", make)


def pattern_source_sums(cap: LayerCapture) -> Tensor:
    """``Σ_b Σ_q`` of :func:`query_pattern` per head and key: ``[H, k]``."""

    def make() -> Tensor:
        if "pattern_doc_source_sums" in cap.shared:
            return cap.shared["pattern_doc_source_sums"].sum(0)
        return pattern_sum(cap).sum(1)

    return memo(cap, "pattern_source_sums", make)


def pattern_doc_source_sums(cap: LayerCapture) -> Tensor:
    """``Σ_q`` of :func:`query_pattern` per document, head and key: ``[b, H, k]`` (the
    totals of the Gu key score)."""
    return memo(cap, "pattern_doc_source_sums", lambda: query_pattern(cap).sum(-2))


def pattern_lag_sums(cap: LayerCapture, causal: bool) -> tuple[Tensor, Tensor]:
    """Diagonal sums of :func:`pattern_sum` per head (``_lag_sums`` of ContributionProbe):
    ``(pos [H, T], neg [H, T])``, ``pos[ℓ] = Σ_{i−j=ℓ}``, ``neg[ℓ] = Σ_{j−i=ℓ}``."""
    return memo(cap, ("pattern_lag_sums", bool(causal)),
                lambda: lag_sums(pattern_sum(cap), causal))


def add_block_lag_sums(m: Tensor, a: int, e: int, pos: Tensor) -> None:
    """``pos[:, ℓ] += Σ_{a ≤ i < e} m[:, i, i − ℓ]`` for ``ℓ < e``: the causal lag sums
    (:func:`lag_sums`) of the rows ``a … e − 1`` of ``m [n, T, T]`` (zero above the
    diagonal, standard contiguous strides), read while a block of rows is in cache.

    Row ``i`` seen from ``e − 1`` entries before its diagonal (stride ``T + 1`` between
    rows) holds ``m[i, i − ℓ]`` at column ``e − 1 − ℓ``; where ``ℓ > i`` the view reaches
    into the zero upper triangle of row ``i − 1``. The first block (``a = 0``) would reach
    before the tensor and is summed by :func:`lag_sums` on its ``e × e`` corner."""
    n, T, _ = m.shape
    if a == 0:
        pos[:, :e] += lag_sums(m[:, :e, :e], causal=True)[0]
        return
    rows = m.as_strided((n, e - a, e), (T * T, T + 1, 1),
                        m.storage_offset() + a * (T + 1) - (e - 1))
    pos[:, :e] += rows.sum(1).flip(-1)


class BlockSums:
    """The pattern's sums by key (:func:`pattern_source_sums`) and by lag
    (:func:`pattern_lag_sums`) gathered block by block by the first probe that walks over
    the pattern's query blocks (AttentionStatsProbe's entropy, the value products), while each
    block is in cache: one pass over the pattern fewer for each. Only for causal patterns
    with standard strides whose sums no probe has asked for yet (otherwise inactive, and
    the memoised functions form them the usual way). ``add(a, e)`` for every block of
    rows ``a … e − 1`` (the blocks must tile the queries), then ``finish()``."""

    def __init__(self, cap: LayerCapture, causal: bool):
        p = query_pattern(cap)
        b, H, T, K = p.shape
        d = cap.shared
        self.active = (bool(causal) and T == K and T > 1 and "pattern_source_sums" not in d
                       and "pattern_doc_source_sums" not in d
                       and ("pattern_lag_sums", True) not in d
                       and p.stride() == (H * T * T, T * T, T, 1))
        if self.active:
            self.cap, self.p = cap, p
            self.src = torch.zeros(b, H, T, dtype=p.dtype, device=p.device)  # per document
            self.lag = torch.zeros(H, T, dtype=p.dtype, device=p.device)

    def add(self, a: int, e: int) -> None:
        """Fold the rows ``a … e − 1`` of every document (keys ``< e``: causal)."""
        if not self.active:
            return
        for d in range(self.p.shape[0]):
            self.src[d, :, :e] += self.p[d, :, a:e, :e].sum(1)
            add_block_lag_sums(self.p[d], a, e, self.lag)

    def finish(self) -> None:
        """Memoise the sums in the capture."""
        if self.active:
            d = self.cap.shared
            d["pattern_doc_source_sums"] = self.src
            d["pattern_source_sums"] = self.src[0] if self.src.shape[0] == 1 else self.src.sum(0)
            d[("pattern_lag_sums", True)] = (self.lag, torch.zeros_like(self.lag))
            self.active = False


def query_blocks(T: int, causal: bool, rows: int = 64) -> list[tuple[int, int, int]]:
    """Blocks ``(a, e, k)`` of query rows ``a … e − 1`` with the keys ``0 … k − 1`` they may
    see: causal blocks stop their keys at the block's last query (``k = e``); bidirectional
    ones keep every key. At most 16 blocks of at least ``rows`` queries each: at T = 1,024,
    16 blocks of 64 rows, small enough that a block of a 9–12-head map stays in the
    processor's cache for every pass over it, few enough that per-operation overheads stay
    small (and a causal block wastes ~1/32 of the full square on its upper triangle)."""
    n = max(1, min(16, T // rows))
    edges = [round(T * i / n) for i in range(n + 1)]
    return [(a, e, e if causal else T) for a, e in zip(edges[:-1], edges[1:])]


class ValueProducts(NamedTuple):
    """What :func:`value_products` returns (head-first, ``[b, H, q, …]``)."""

    vh: Tensor  # [b, H, k, d] values, heads first (kv heads repeated)
    gram: Tensor  # [H, d, d] W_O^h W_O^hᵀ
    vnorm: Tensor  # [b, H, k] ‖ṽ_j‖ = ‖v_j W_O^h‖
    w: Tensor  # [b, H, q, d] Σ_{j≠s} α_ij v_j
    w_bound: Tensor  # [b, H, q] Σ_{j≠s} α_ij ‖ṽ_j‖
    mass: Tensor  # [b, H, q] Σ_{j≠s} α_ij
    z: Tensor  # [b, H, q, d] Σ_j α_ij v_j = w + α_is v_s
    bound: Tensor  # [b, H, q] Σ_j α_ij ‖ṽ_j‖


def value_products(cap: LayerCapture, W_O: Tensor, causal: bool, sink_index: int = 0
                   ) -> ValueProducts:
    """The value products of the capture's layer (see the module docstring); ``W_O``
    ``[H, d_head, d_model]`` in the pattern's dtype and device."""
    assert cap.v is not None

    def make() -> ValueProducts:
        p = query_pattern(cap)
        b, H, T, K = p.shape
        vh = cap.v.to(p.dtype).permute(0, 2, 1, 3)  # [b, H, k, d]
        G = value_gram(W_O)
        vnorm = projected_value_norms(vh, G)
        d = vh.shape[-1]
        X = torch.cat([vh, vnorm.unsqueeze(-1), torch.ones_like(vnorm).unsqueeze(-1)], -1)
        out = torch.zeros(b, H, T, d + 2, dtype=p.dtype, device=p.device)
        s = int(sink_index)
        sums = BlockSums(cap, causal)
        for a, e, k in query_blocks(T, causal):
            k = min(k, K)
            o_b = out[:, :, a:e]
            for lo, hi in ((0, min(s, k)), (s + 1, k)):
                if hi > lo:
                    o_b += p[:, :, a:e, lo:hi] @ X[:, :, lo:hi]
            sums.add(a, e)
        sums.finish()
        w, w_bound, mass = out[..., :d], out[..., d], out[..., d + 1]
        if 0 <= s < K:
            a_s = p[..., s]  # [b, H, q]
            z = w + a_s.unsqueeze(-1) * vh[:, :, s].unsqueeze(2)
            bound = w_bound + a_s * vnorm[..., s].unsqueeze(-1)
        else:
            z, bound = w, w_bound
        return ValueProducts(vh, G, vnorm, w, w_bound, mass, z, bound)

    return memo(cap, ("value_products", int(sink_index), bool(causal)), make)


def head_outputs(cap: LayerCapture, W_O: Tensor, causal: bool, sink_index: int = 0,
                 which: str = "o") -> Tensor:
    """``o = Σ_h z^h W_O^h`` (``which="o"``) or ``s = Σ_h w^h W_O^h`` (``"s"``), ``[b, q,
    d_model]``, from :func:`value_products`."""
    vp = value_products(cap, W_O, causal, sink_index)

    if which not in ("o", "s"):
        raise ValueError(f"which must be 'o' or 's', got {which!r}")
    key = ("head_outputs", int(sink_index), bool(causal))

    def make() -> tuple[Tensor, Tensor]:
        # s from w (no sink term, nothing cancels); o = s + Σ_h α_is^h ṽ_s^h, a rank-H
        # correction: one [q, H·d_head] × [H·d_head, d_model] product for both
        s = torch.einsum("bhqd,hdm->bqm", vp.w, W_O)
        K = vp.vh.shape[2]
        if not 0 <= sink_index < K:
            return s, s
        p = query_pattern(cap)
        vs_out = torch.einsum("bhd,hdm->bhm", vp.vh[:, :, sink_index], W_O)  # [b, H, m]
        return torch.baddbmm(s, p[..., sink_index].transpose(1, 2), vs_out), s

    o, s = memo(cap, key, make)
    return o if which == "o" else s


def lag_sums(m: Tensor, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Diagonal sums of ``m [..., T, T]`` (query, key): ``pos[..., ℓ] = Σ_j m[j+ℓ, j]`` (i − j
    = ℓ ≥ 0) and ``neg[..., ℓ] = Σ_i m[i, i+ℓ]`` (j − i = ℓ; ``neg[..., 0]`` = 0).

    ``causal=True`` takes ``m`` to be zero above the diagonal (as causal patterns and every
    map built from them are): ``neg`` is 0 and ``pos`` is read in place, without a copy —
    row ``i ≥ 1`` seen from ``T − 1`` entries before its diagonal (stride ``T + 1`` between
    rows) holds ``m[i, i − ℓ]`` at column ``T − 1 − ℓ``; where ``ℓ > i`` the view reaches into
    the zero upper triangle of the rows above, so one contiguous sum over rows gives every lag.

    Otherwise, skew trick: flip the key axis (anti-diagonals become diagonals), pad each row
    with T zeros, and read the flat buffer as ``[T, 2T − 1]`` rows: column ``c`` then holds the
    entries with ``i − j = c − (T − 1)``, and one contiguous sum over rows gives every lag.
    """
    if causal and m.shape[-1] > 1:
        T = m.shape[-1]
        lead = m.shape[:-2]
        x = m.reshape(-1, T, T).contiguous()
        n = x.shape[0]
        rows = x.as_strided((n, T - 1, T), (T * T, T + 1, 1), x.storage_offset() + 2)
        pos = rows.sum(1).flip(-1)  # [n, T], lag ℓ at column ℓ
        pos[:, 0] += x[:, 0, 0]
        return pos.reshape(*lead, T), torch.zeros_like(pos).reshape(*lead, T)
    T = m.shape[-1]
    lead = m.shape[:-2]
    x = m.reshape(-1, T, T).flip(-1)
    n = x.shape[0]
    pad = torch.zeros(n, T, 2 * T, dtype=m.dtype, device=m.device)
    pad[..., :T] = x
    skew = pad.view(n, -1)[:, : T * (2 * T - 1)].view(n, T, 2 * T - 1).sum(1)  # [n, 2T − 1]
    pos = skew[:, T - 1 :]
    neg = torch.zeros_like(pos)
    neg[:, 1:] = skew[:, : T - 1].flip(-1)
    return pos.reshape(*lead, T), neg.reshape(*lead, T)
