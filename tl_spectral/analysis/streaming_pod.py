"""Streaming POD with a rank cap: mergeable factor sets whose size does not grow with N.

A set of snapshots ``x_s`` (rows, dimension ``d``) is summarised by

- ``W [r, d]``: factor rows with ``W^T W ≈ sum_k S_k``, the sum of the *centred* scatter
  matrices ``S_k = sum_{s in k} (x_s - mu_k)(x_s - mu_k)^T`` of the groups ``k`` the rows came
  from (a group: one batch, one process's shard, ...);
- ``sums [g, d]`` and ``ns [g]``: each group's sum of snapshots and count;
- ``sumsq``: the exact ``sum_s ||x_s||^2`` (float64).

Every part is combined by concatenation (``sums``, ``ns``, ``W``) or addition (``sumsq``),
so two states — of two batches, two shards or two processes — merge exactly like the
probes' "cat" and "sum" states. :func:`fold` turns any such state into one group and at most
``rank`` factor rows with the exact within/between split of the scatter (Ross et al. 2008,
the mean update of incremental PCA; Brand 2002 for the truncated update):

    S(union) = sum_k S_k + sum_k n_k (mu_k - mu)(mu_k - mu)^T,   mu = sum_k n_k mu_k / n,

i.e. the rows ``sqrt(n_k) (mu_k - mu)`` are appended to ``W`` and the stack is truncated to
its top ``rank`` singular directions (an ``[r', r']`` Gram, float64, and its ``eigh``). The
mean is therefore never needed before the end, and the centring is exact.

What is exact and what is not. ``n``, the mean and the total energy ``sum_s ||x_s - mu||^2 =
sumsq - n ||mu||^2`` are exact. The eigenvalues are those of ``W^T W / n``: exact while the
snapshots' rank stays within the cap (no truncation ever drops energy), otherwise each
truncation drops the energy outside the kept directions, and the top eigenvalues carry a
relative error of the order of (dropped energy) / (gap to the cap) — small when the cap
exceeds the spectrum's knee. ``dropped`` (returned by :func:`fold` and accumulated in the
state) is the energy the truncations discarded, an upper bound of the total eigenvalue
error. Cost per snapshot: ``O((r + b)^2 d / b)`` for ``b`` rows folded at once, so ``O(N)`` in
time and ``O(r d)`` in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral.analysis.bootstrap import document_groups  # noqa: F401  (re-exported)
from tl_spectral.analysis.coherence import default_queries
from tl_spectral.analysis.pod import PODResult, effective_rank, spectral_concentration
from tl_spectral.analysis.scale_pod import ScalePODLayer, gaussian_lag_window
from tl_spectral.analysis.wavelets import (
    DEFAULT_WAVELET,
    LagCWT,
    band_energies,
    default_scales,
    dominant_scales,
    scale_energy,
    scalogram_from_moment,
)

__all__ = [
    "BAND_OPTIONS",
    "FactorBuffer",
    "StreamingFactors",
    "band_options",
    "fold",
    "hstar_bounds",
    "pod_from_spectrum",
    "scale_pod_layer_streamed",
    "select_bands",
    "spectrum",
    "streaming_pod_result",
]


@dataclass
class StreamingFactors:
    """One streaming-POD state (see the module docstring).

    W: ``[r, d]`` factor rows (float32 or float64); sums: ``[g, d]`` float64 per-group sums;
    ns: ``[g]`` float64 per-group counts; sumsq: ``[1]`` float64 sum of squared norms;
    dropped: ``[1]`` float64 energy discarded by truncations (times ``n``: a scatter, not a
    mean).
    """

    W: Tensor
    sums: Tensor
    ns: Tensor
    sumsq: Tensor
    dropped: Tensor

    @classmethod
    def empty(cls, dim: int, dtype: torch.dtype = torch.float32, device=None) -> StreamingFactors:
        z = torch.zeros(1, dtype=torch.float64, device=device)
        return cls(
            W=torch.zeros(0, dim, dtype=dtype, device=device),
            sums=torch.zeros(0, dim, dtype=torch.float64, device=device),
            ns=torch.zeros(0, dtype=torch.float64, device=device),
            sumsq=z,
            dropped=z.clone(),
        )

    @property
    def dim(self) -> int:
        return int(self.W.shape[1])

    @property
    def n(self) -> float:
        return float(self.ns.sum())

    def add(self, X: Float[Tensor, "b d"]) -> StreamingFactors:
        """Append the snapshots ``X`` as one new group (no truncation; see :meth:`fold`)."""
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"X must be [b, {self.dim}] (got {tuple(X.shape)})")
        X64 = X.to(torch.float64)
        s = X64.sum(0, keepdim=True)
        mu = s / X.shape[0]
        return StreamingFactors(
            W=torch.cat([self.W, (X64 - mu).to(self.W.dtype)]),
            sums=torch.cat([self.sums, s]),
            ns=torch.cat([self.ns, torch.tensor([float(X.shape[0])], dtype=torch.float64,
                                                device=self.ns.device)]),
            sumsq=self.sumsq + X64.pow(2).sum(),
            dropped=self.dropped,
        )

    def merge(self, other: StreamingFactors) -> StreamingFactors:
        """Concatenate two states (exact; fold afterwards to bound the size)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge streaming states of dimensions {self.dim} and {other.dim}")
        return StreamingFactors(
            W=torch.cat([self.W, other.W.to(self.W.dtype)]),
            sums=torch.cat([self.sums, other.sums]),
            ns=torch.cat([self.ns, other.ns]),
            sumsq=self.sumsq + other.sumsq,
            dropped=self.dropped + other.dropped,
        )

    def fold(self, rank: int) -> StreamingFactors:
        """One group and at most ``rank`` factor rows (see :func:`fold`)."""
        W, s, n, dropped = fold(self.W, self.sums, self.ns, rank)
        return StreamingFactors(W=W, sums=s, ns=n, sumsq=self.sumsq, dropped=self.dropped + dropped)

    @property
    def mean(self) -> Tensor:
        """``[d]`` float64 mean of all snapshots."""
        return self.sums.sum(0) / max(self.n, 1.0)

    @property
    def total_scatter(self) -> float:
        """Exact ``sum_s ||x_s - mu||^2``."""
        tot = self.sums.sum(0)
        return float(self.sumsq) - float(tot.pow(2).sum()) / max(self.n, 1.0)


def fold(
    W: Float[Tensor, "r d"],
    sums: Float[Tensor, "g d"],
    ns: Float[Tensor, " g"],
    rank: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Collapse the groups into one and truncate the factors to ``rank`` rows.

    W: ``[r, d]`` rows whose Gram ``W^T W`` is the sum of the groups' centred scatters;
    sums, ns: ``[g, d]``, ``[g]`` the groups' sums and counts. Returns ``(W' [r', d], sums'
    [1, d], ns' [1], dropped [1])`` with ``r' <= rank``, ``W'^T W'`` the best rank-``r'``
    approximation of ``W^T W + sum_k n_k (mu_k - mu)(mu_k - mu)^T`` (the centred scatter of
    all snapshots) and ``dropped`` the energy (trace) it leaves out.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1 (got {rank})")
    ns = ns.to(torch.float64)
    n = float(ns.sum())
    dev = W.device
    if n <= 0:
        return W[:0], sums[:0].sum(0, keepdim=True), ns.sum().reshape(1), torch.zeros(1, dtype=torch.float64, device=dev)
    tot = sums.sum(0)
    mu = tot / n
    if sums.shape[0] > 1:  # rows sqrt(n_k) (mu_k - mu): the scatter between the groups
        keep = ns > 0
        between = torch.sqrt(ns[keep])[:, None] * (sums[keep] / ns[keep][:, None] - mu)
        M = torch.cat([W, between.to(W.dtype)])
    else:
        M = W
    if M.shape[0] == 0:
        return W[:0], tot[None], torch.tensor([n], dtype=torch.float64, device=dev), torch.zeros(1, dtype=torch.float64, device=dev)
    # Gram of the stacked rows in the factors' dtype (float32 like the in-memory path's
    # per-lag Grams), eigen-decomposition in float64
    G = (M @ M.T).to(torch.float64)
    G = 0.5 * (G + G.T)
    lam, U = torch.linalg.eigh(G)
    lam, U = lam.flip(0), U.flip(1)
    trace = float(lam.clamp_min(0).sum())
    tol = max(float(lam[0]) if lam.numel() else 0.0, 0.0) * M.shape[0] * torch.finfo(M.dtype).eps
    k = min(int(rank), int((lam > tol).sum()))
    Wn = U[:, :k].T.to(M.dtype) @ M  # rows sigma_k v_k^T
    dropped = torch.tensor([max(0.0, trace - float(lam[:k].sum()))], dtype=torch.float64, device=dev)
    return Wn, tot[None], torch.tensor([n], dtype=torch.float64, device=dev), dropped


class FactorBuffer:
    """A :class:`StreamingFactors` state held in one fixed buffer and folded in place.

    ``buf [capacity, d]`` (float32) holds the factor rows ``W = buf[:r]`` followed by the
    snapshots appended since the last fold, raw (``pending = buf[r:r + p]``); ``sums [g, d]``,
    ``ns [g]``, ``sumsq``, ``dropped`` are the folded groups' as in :class:`StreamingFactors`.
    :meth:`fold` makes the pending rows one new group and folds exactly as :func:`fold` does
    (the same rows in the same order: ``W``, the new group minus its mean, the rows
    ``sqrt(n_k) (mu_k - mu)``), but in place: the group's sum and ``Σ‖x‖²`` are float64
    accumulations over column chunks, the centring is done chunk by chunk, the stack's Gram is
    one ``[m, m]`` product, and the new factors ``U_kᵀ M`` are written back over the stack's
    first ``k`` rows column chunk by column chunk. Memory: the buffer (``capacity × d``) plus
    temporaries of a few MiB, whatever the number of snapshots; the buffer grows only when a
    fold needs more rows than it has (the first allocation sizes it for ``rank`` factors and the
    largest pending block expected).
    """

    def __init__(self, dim: int, capacity: int, dtype: torch.dtype = torch.float32,
                 device=None) -> None:
        self.buf = torch.empty(max(int(capacity), 1), int(dim), dtype=dtype, device=device)
        self.r = 0
        self.p = 0
        self.sums = torch.zeros(0, int(dim), dtype=torch.float64, device=device)
        self.ns = torch.zeros(0, dtype=torch.float64, device=device)
        self.sumsq = torch.zeros(1, dtype=torch.float64, device=device)
        self.dropped = torch.zeros(1, dtype=torch.float64, device=device)

    @classmethod
    def adopt(cls, st: StreamingFactors, pending: Tensor | None = None,
              capacity: int = 0) -> FactorBuffer:
        """A buffer holding the state ``st`` (copied) and ``pending`` raw rows."""
        p = 0 if pending is None else int(pending.shape[0])
        r, g = int(st.W.shape[0]), int(st.sums.shape[0])
        fb = cls(st.dim, max(int(capacity), r + p + g + 2), st.W.dtype, st.W.device)
        fb.buf[:r] = st.W
        if p:
            fb.buf[r:r + p] = pending.to(fb.buf.device, fb.buf.dtype)  # type: ignore[union-attr]
        fb.r, fb.p = r, p
        fb.sums, fb.ns = st.sums.clone(), st.ns.to(torch.float64).clone()
        fb.sumsq, fb.dropped = st.sumsq.clone(), st.dropped.clone()
        return fb

    @property
    def dim(self) -> int:
        return int(self.buf.shape[1])

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[0])

    @property
    def W(self) -> Tensor:
        return self.buf[: self.r]

    @property
    def pending(self) -> Tensor:
        return self.buf[self.r: self.r + self.p]

    @property
    def folded(self) -> bool:
        """One group, nothing pending: :meth:`fold` would only rotate the rows."""
        return self.p == 0 and int(self.sums.shape[0]) <= 1

    def factors(self) -> StreamingFactors:
        """The folded part as a :class:`StreamingFactors` (views, no copy; pending rows not
        included)."""
        return StreamingFactors(W=self.W, sums=self.sums, ns=self.ns, sumsq=self.sumsq,
                                dropped=self.dropped)

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` more rows after the pending ones (grows the buffer when needed)."""
        need = self.r + self.p + int(rows)
        if need > self.capacity:
            new = torch.empty(need, self.dim, dtype=self.buf.dtype, device=self.buf.device)
            new[: self.r + self.p] = self.buf[: self.r + self.p]
            self.buf = new

    def append(self, src: Tensor, index: Tensor | None = None,
               weight: Tensor | None = None) -> None:
        """Append the rows ``src[:, index] * weight`` (``src [b, D]``; every column when
        ``index`` is None) as pending snapshots, written straight into the buffer."""
        b = int(src.shape[0])
        self.reserve(b)
        rows = self.buf[self.r + self.p: self.r + self.p + b]
        src = src.to(rows.device)
        if index is None:
            rows.copy_(src)
        else:
            torch.index_select(src.to(rows.dtype), 1, index.to(src.device), out=rows)
        if weight is not None:
            rows.mul_(weight.to(rows.device, rows.dtype))
        self.p += b

    def _take_pending(self) -> None:
        """The pending rows become one group: float64 sum and ``Σ‖x‖²``, rows centred on the
        group's mean in place (``(x − μ)`` formed in float64 per column chunk, as
        :meth:`StreamingFactors.add`)."""
        P = self.pending
        n_b = float(self.p)
        s = torch.zeros(self.dim, dtype=torch.float64, device=P.device)
        sq = torch.zeros((), dtype=torch.float64, device=P.device)
        step = _col_chunk(self.p)
        for a in range(0, self.dim, step):
            blk = P[:, a:a + step].to(torch.float64)
            s[a:a + step] = blk.sum(0)
            sq += blk.pow(2).sum()
            P[:, a:a + step] = (blk - s[a:a + step] / n_b).to(P.dtype)
        self.sums = torch.cat([self.sums, s[None]])
        self.ns = torch.cat([self.ns, torch.tensor([n_b], dtype=torch.float64, device=P.device)])
        self.sumsq = self.sumsq + sq
        self.r, self.p = self.r + self.p, 0

    def fold(self, rank: int) -> None:
        """Fold the pending rows in as one group, collapse the groups into one and keep at
        most ``rank`` factor rows (:func:`fold`'s result, computed in place)."""
        if rank < 1:
            raise ValueError(f"rank must be >= 1 (got {rank})")
        if self.p:
            self._take_pending()
        ns, dev = self.ns, self.buf.device
        n = float(ns.sum())
        if n <= 0:
            self.r, self.sums, self.ns = 0, self.sums[:0].sum(0, keepdim=True), ns.sum().reshape(1)
            return
        tot = self.sums.sum(0)
        m = self.r
        if self.sums.shape[0] > 1:  # rows sqrt(n_k) (mu_k - mu): the scatter between the groups
            keep = ns > 0
            between = torch.sqrt(ns[keep])[:, None] * (self.sums[keep] / ns[keep][:, None] - tot / n)
            self.reserve(int(between.shape[0]))
            self.buf[m:m + between.shape[0]] = between.to(self.buf.dtype)
            m += int(between.shape[0])
        self.sums, self.ns = tot[None], torch.tensor([n], dtype=torch.float64, device=dev)
        if m == 0:
            self.r = 0
            return
        M = self.buf[:m]
        G = (M @ M.T).to(torch.float64)  # as fold(): the Gram in the factors' dtype
        G = 0.5 * (G + G.T)
        lam, U = torch.linalg.eigh(G)
        lam, U = lam.flip(0), U.flip(1)
        trace = float(lam.clamp_min(0).sum())
        tol = max(float(lam[0]) if lam.numel() else 0.0, 0.0) * m * torch.finfo(M.dtype).eps
        k = min(int(rank), int((lam > tol).sum()))
        Ut = U[:, :k].T.to(M.dtype).contiguous()
        step = _col_chunk(m)
        for a in range(0, self.dim, step):  # rows sigma_k v_k^T over the first k rows
            self.buf[:k, a:a + step] = Ut @ M[:, a:a + step]
        self.r = k
        self.dropped = self.dropped + max(0.0, trace - float(lam[:k].sum()))

    def publish(self, store: dict, prefix: str) -> None:
        """The state as ``store``'s tensors (views, no copy): ``<prefix>.W``, ``.sums``,
        ``.ns``, ``.sumsq``, ``.dropped`` and ``.pending`` when rows are pending — the probes'
        "cat" and "sum" states, so they merge and reduce across processes as before."""
        views = {"W": self.W, "sums": self.sums, "ns": self.ns, "sumsq": self.sumsq,
                 "dropped": self.dropped, "pending": self.pending if self.p else None}
        for k, v in views.items():
            if v is None:
                store.pop(f"{prefix}.{k}", None)
            else:
                store[f"{prefix}.{k}"] = v
        self._views = views

    def owns(self, store: dict, prefix: str) -> bool:
        """True while ``store`` holds the views :meth:`publish` put there (not a merged,
        reduced or replaced state)."""
        views = getattr(self, "_views", None)
        return views is not None and all(store.get(f"{prefix}.{k}") is v
                                         for k, v in views.items())

    def compact(self) -> None:
        """Shrink the buffer to the factor rows (after the last fold of a pass)."""
        if self.capacity != self.r + self.p:
            self.buf = self.buf[: max(self.r + self.p, 1)].clone()


def streaming_pod_result(
    state: StreamingFactors,
    *,
    n_modes: int = 8,
    epsilon: float = 0.10,
    rank_cap: int | None = None,
    total_energy: float | None = None,
) -> PODResult:
    """The POD of a streaming state as a :class:`~tl_spectral.analysis.pod.PODResult`.

    eigenvalues: the top ``<= rank_cap`` eigenvalues of the centred covariance (``/ N``);
    modes: the first ``n_modes``; coefficients: ``[0, k]`` (per-snapshot coefficients would
    grow with N and are not kept); total_energy: the exact trace (``total_energy`` overrides
    it). See :func:`pod_from_spectrum` for ``H_star`` and ``T_spec``.
    """
    st = state.fold(rank_cap or max(1, state.W.shape[0]))
    lam, modes = spectrum(st, n_modes)
    N = st.n
    total = st.total_scatter / max(N, 1.0) if total_energy is None else float(total_energy)
    return pod_from_spectrum(
        lam, modes, total_energy=total, n_snapshots=int(round(N)), dim=st.dim,
        dropped=float(st.dropped) / max(N, 1.0), epsilon=epsilon,
    )


def _col_chunk(rows: int, budget: int = 1 << 21) -> int:
    """Columns per chunk so that a ``[rows, chunk]`` temporary holds about ``budget`` values
    (8 MiB in float32, 16 MiB in float64)."""
    return max(256, budget // max(int(rows), 1))


def row_sq(W: Tensor) -> Tensor:
    """``[r]`` float64 squared row norms of ``W``, accumulated by column chunks (no float64
    copy of ``W``)."""
    out = torch.zeros(W.shape[0], dtype=torch.float64, device=W.device)
    step = _col_chunk(W.shape[0])
    for a in range(0, int(W.shape[1]), step):
        out += W[:, a:a + step].to(torch.float64).pow(2).sum(1)
    return out


def spectrum_order(W: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows, sq)``: the rows of a folded factor set in descending squared norm, those above
    rounding noise (``sq > sq_0 · r · eps64``), and their squared norms (float64)."""
    sq = row_sq(W)
    order = torch.argsort(sq, descending=True)
    sq = sq[order]
    if sq.numel():
        tol = max(float(sq[0]) * W.shape[0] * torch.finfo(torch.float64).eps, 0.0)
        keep = sq > tol
        order, sq = order[keep], sq[keep]
    return order, sq


def row_signs(W: Tensor) -> Tensor:
    """``[r]`` float64 ``±1``: the sign of each row's largest-magnitude entry (its first, at
    ties; 1 for a zero row), by column chunks — the sign convention of
    :func:`~tl_spectral.analysis.pod.pod`."""
    r = int(W.shape[0])
    best = torch.full((r,), -1.0, dtype=W.dtype, device=W.device)
    sgn = torch.ones(r, dtype=torch.float64, device=W.device)
    step = _col_chunk(r)
    for a in range(0, int(W.shape[1]), step):
        blk = W[:, a:a + step]
        val, idx = blk.abs().max(dim=1)
        better = val > best
        best = torch.where(better, val, best)
        s = torch.sign(blk.gather(1, idx[:, None]).squeeze(1)).to(torch.float64)
        sgn = torch.where(better & (s != 0), s, sgn)
    return sgn


def spectrum(st: StreamingFactors, n_modes: int) -> tuple[Tensor, Tensor]:
    """``(eigenvalues [k] descending, modes [min(n_modes, k), d])`` of a folded state (one
    group): eigenvalues ``sigma^2 / N`` above rounding noise, modes ``v_k`` with their largest
    entry positive (the sign convention of :func:`~tl_spectral.analysis.pod.pod`). Only the
    ``n_modes`` rows returned are converted to float64."""
    N = max(st.n, 1.0)
    order, sq = spectrum_order(st.W)
    lam = (sq / N).contiguous()
    k = min(int(n_modes), int(lam.numel()))
    modes = st.W[order[:k]].to(torch.float64) / torch.sqrt(sq[:k])[:, None]
    if k:
        idx = modes.abs().argmax(dim=1)
        sgn = torch.sign(modes.gather(1, idx[:, None]).squeeze(1))
        sgn[sgn == 0] = 1
        modes = modes * sgn[:, None]
    return lam, modes


def pod_from_spectrum(
    eigenvalues: Tensor,
    modes: Tensor,
    *,
    total_energy: float,
    n_snapshots: int,
    dim: int,
    dropped: float = 0.0,
    epsilon: float = 0.10,
) -> PODResult:
    """A :class:`PODResult` from the top of a spectrum and the exact total energy.

    ``H_star`` is exact when the eigenvalues reach ``1 - epsilon`` of ``total_energy``;
    otherwise it is their count and ``H_star_saturated`` (a lower bound: ``H* >`` that
    count). ``T_spec`` fits the modes holding 99% of the exact energy: exact when those are
    all among the eigenvalues, else fitted on the ones there are (``tspec_n_fit`` = their
    count). ``dropped``: energy (a mean, like the eigenvalues) the truncations discarded;
    ``spectrum_complete`` when it is 0 to rounding; ``eigen_rel_error`` = ``dropped`` over the
    smallest eigenvalue kept, a bound on the relative error of every eigenvalue.
    """
    if n_snapshots < 2:
        raise ValueError(f"POD needs at least N=2 snapshots (got N={n_snapshots})")
    if not total_energy > 0:
        raise ValueError("the snapshots have zero energy (all fluctuations are zero); nothing to decompose")
    lam = eigenvalues.to(torch.float64)
    H, reached = effective_rank(lam, epsilon, total_energy=total_energy)
    complete = dropped <= 1e-12 * total_energy
    fit = spectral_concentration(lam, total_energy=total_energy)
    rel = 0.0 if complete or lam.numel() == 0 else dropped / max(float(lam[-1]), 1e-300)
    k = int(modes.shape[0])
    return PODResult(
        eigenvalues=lam,
        modes=modes,
        coefficients=torch.zeros(0, k, dtype=torch.float64),
        mean=None,
        total_energy=float(total_energy),
        n_snapshots=int(n_snapshots),
        dim=int(dim),
        method="streaming",
        centered=True,
        spectrum_complete=bool(complete),
        epsilon=float(epsilon),
        H_star=H,
        H_star_saturated=(not reached) or H >= n_snapshots - 1,
        beta=fit["beta"],
        T_spec=fit["T_spec"],
        tspec_r2=fit["r2"],
        tspec_n_fit=int(fit["n_fit"]),
        eigen_rel_error=float(rel),
    )


# ----------------------------------------------------------------------------- scale POD
#: scale_pod_layer options that choose the band windows and coherence queries: a streamed
#: ensemble fixes them before its second pass (they go to the probe, not to .scale_pod()).
BAND_OPTIONS = (
    "scales",
    "wavelet",
    "max_dominant",
    "min_ratio",
    "min_peak_fraction",
    "window_threshold",
    "lag_window",
    "coherence_queries",
)
_BAND_DEFAULTS: dict[str, Any] = {
    "scales": None,
    "wavelet": DEFAULT_WAVELET,
    "max_dominant": 3,
    "min_ratio": 1.5,
    "min_peak_fraction": 0.01,
    "window_threshold": 1e-4,
    "lag_window": "signed",
    "coherence_queries": 16,
}


def band_options(options: dict | None) -> dict[str, Any]:
    """The band options with defaults filled in; unknown keys raise."""
    opts = dict(options or {})
    bad = sorted(set(opts) - set(BAND_OPTIONS))
    if bad:
        raise ValueError(
            f"unknown band options {bad}; pass some of {list(BAND_OPTIONS)} (epsilon and "
            "n_modes go to .scale_pod())"
        )
    out = dict(_BAND_DEFAULTS)
    out.update(opts)
    if out["lag_window"] not in ("signed", "absolute"):
        raise ValueError(f"lag_window must be 'signed' or 'absolute' (got {out['lag_window']!r})")
    if int(out["max_dominant"]) < 1:
        raise ValueError(f"max_dominant must be >= 1 (got {out['max_dominant']})")
    return out


def coherence_query_index(spec, T: int) -> Tensor | None:
    """Query indices of the coherence (as :func:`scale_pod_layer`), or None to skip it."""
    if spec is None or (isinstance(spec, int) and spec == 0):
        return None
    if isinstance(spec, int):
        return default_queries(T, spec)
    q = torch.as_tensor(spec, dtype=torch.int64).flatten()
    if q.numel() == 0 or q.min() < 0 or q.max() >= T:
        raise ValueError(f"coherence_queries must be query indices in [0, {T - 1}]")
    return q


def select_bands(C: Tensor, lags: Tensor, T: int, options: dict) -> dict[str, Any]:
    """Scalogram, dominant scales and band windows from the centred lag second moment
    ``C = mean_{s,i} u u^T: [n_lags, n_lags]`` exactly as :func:`scale_pod_layer` picks them
    (same CWT operator in float32, same peak picking, same windows)."""
    n_lags = int(lags.numel())
    scales_t = default_scales(T) if options["scales"] is None else torch.as_tensor(
        options["scales"], dtype=torch.float64)
    op = LagCWT(n_lags, scales_t, options["wavelet"], dtype=torch.float32)
    scales_t = op.scales
    E_at = scalogram_from_moment(C, op)
    E_a = scale_energy(E_at)
    if not float(E_a.sum()) > 0:
        raise ValueError(
            "the fields have zero fluctuation energy; the ensemble's fields do not differ"
        )
    dom = dominant_scales(
        E_a, scales_t, max_scales=int(options["max_dominant"]), min_ratio=options["min_ratio"],
        min_peak_fraction=options["min_peak_fraction"],
    )
    a_star = [float(scales_t[i]) for i in dom]
    windows, masks = [], []
    for a in a_star:
        g = gaussian_lag_window(lags, a, absolute=options["lag_window"] == "absolute")
        m = g > options["window_threshold"]
        windows.append(torch.where(m, g, torch.zeros_like(g)))
        masks.append(m)
    return {
        "op": op, "scales": scales_t, "E_at": E_at, "E_a": E_a, "a_star": a_star,
        "band_energy": band_energies(E_a, scales_t), "windows": windows, "masks": masks,
    }


def hstar_bounds(
    eigenvalues: Tensor, total_energy: float, dropped: float, epsilon: float
) -> tuple[int | None, int | None]:
    """Bounds ``(low, high)`` of the true ``H*(epsilon)`` from a streamed spectrum.

    Truncation only removes a PSD part ``E`` of the scatter (``W^T W ≼ S``, ``trace E =
    dropped``), so every streamed eigenvalue is at most the true one (Weyl) and the true
    top-``m`` energy is at most the streamed one plus ``dropped`` (Ky Fan). Hence ``high`` = the
    streamed ``H*`` (None when the kept eigenvalues never reach ``1 - epsilon``) and ``low`` =
    the first ``m`` with streamed top-``m`` energy + ``dropped`` reaching it (None: the true
    ``H*`` exceeds the number kept). ``low == high``: ``H*`` is exact.
    """
    lam = eigenvalues.to(torch.float64)
    target = (1.0 - epsilon) * (1.0 - 1e-12) * total_energy
    cum = torch.cumsum(lam, 0)
    hit_hi = torch.nonzero(cum >= target).flatten()
    hit_lo = torch.nonzero(cum + dropped >= target).flatten()
    hi = int(hit_hi[0]) + 1 if hit_hi.numel() else None
    lo = int(hit_lo[0]) + 1 if hit_lo.numel() else None
    return lo, hi


def _summary(p: PODResult, rank_cap: int) -> dict[str, Any]:
    s = p.headline()
    out = {k: s[k] for k in ("dim", "rank", "n_available", "total_energy", "H_star",
                             "H_star_saturated", "H_star_str", "beta", "T_spec", "tspec_r2",
                             "tspec_n_fit")}
    K = int(p.eigenvalues.numel())
    dropped = 0.0 if p.spectrum_complete or K == 0 else p.eigen_rel_error * float(p.eigenvalues[-1])
    lo, hi = hstar_bounds(p.eigenvalues, p.total_energy, dropped, p.epsilon)
    N = p.n_snapshots
    if hi is not None and hi >= N - 1:
        pass  # the ensemble's own limit (N - 1 modes): "≥ N-1" as the in-memory path says
    elif hi is not None and lo == hi:
        out["H_star_str"] = str(hi)
    elif hi is not None:
        out["H_star_str"] = f"{lo}–{hi}"
    elif lo is None:
        out["H_star_str"] = f"> {K}"
    else:
        out["H_star_str"] = f"≥ {lo}"
    out["H_star_low"] = lo if lo is not None else K + 1
    out["H_star_exact"] = bool(hi is not None and lo == hi)
    out["rank_cap"] = int(rank_cap)
    out["spectrum_complete"] = bool(p.spectrum_complete)
    # T_spec is exact when the modes holding 99% of the energy are all within a complete
    # spectrum, or fitted on the kept eigenvalues (their count: tspec_n_fit)
    out["tspec_exact"] = bool(p.spectrum_complete)
    return out


def scale_pod_layer_streamed(
    *,
    layer: int,
    n_documents: int,
    T: int,
    lags: Tensor,
    selection: dict[str, Any],
    full: PODResult,
    bands: Sequence[PODResult],
    coherence: Tensor | None,
    coherence_queries: Tensor | None,
    rank_cap: int,
    config: dict[str, Any],
) -> ScalePODLayer:
    """A :class:`ScalePODLayer` from streamed statistics (see
    ``StreamedAttentionFields`` of probes/fields.py): the same fields as
    :func:`scale_pod_layer`, with empty per-document coefficients ``[0, k]`` and, in every POD
    summary, ``rank_cap``, ``spectrum_complete`` and ``tspec_exact``."""
    n_lags = int(lags.numel())
    masks = selection["masks"]
    band_list = []
    for b, (a, m, p) in enumerate(zip(selection["a_star"], masks, bands)):
        bl = lags[m]
        band_list.append({"band": b, "scale": a, "sigma": a / 2.0, "lag_min": int(bl.min()),
                          "lag_max": int(bl.max()), "n_lags": int(bl.numel()),
                          **_summary(p, rank_cap)})
    return ScalePODLayer(
        layer=int(layer),
        causal=bool(lags.min() >= 0),
        n_documents=int(n_documents),
        n_queries=int(T),
        lags=lags,
        scales=selection["scales"].clone(),
        scalogram=selection["E_at"],
        scale_energy=selection["E_a"],
        dominant_scales=list(selection["a_star"]),
        band_energy=selection["band_energy"],
        full_eigenvalues=full.eigenvalues,
        full_modes=full.modes.reshape(-1, T, n_lags).to(torch.float32),
        full_coefficients=full.coefficients,
        full=_summary(full, rank_cap),
        band_eigenvalues={str(b): p.eigenvalues for b, p in enumerate(bands)},
        band_modes={str(b): p.modes.reshape(-1, T, int(m.sum())).to(torch.float32)
                    for b, (p, m) in enumerate(zip(bands, masks))},
        band_coefficients={str(b): p.coefficients for b, p in enumerate(bands)},
        band_lags={str(b): lags[m].clone() for b, m in enumerate(masks)},
        bands=band_list,
        coherence=coherence,
        coherence_queries=coherence_queries,
        config=dict(config),
    )


# ----------------------------------------------------------------- jackknife when streamed
def projected_group_spectrum(stats: dict, keep: Sequence[int]) -> tuple[Tensor, float, int]:
    """Eigenvalues, exact total energy (both per document) and count of the whole-field POD
    of the documents in the groups ``keep``, from the per-group statistics the streaming
    probe gathers in its second pass (``AttentionFieldProbe(streaming=True)``).

    stats: ``C [G, K, K]`` = Σ c cᵀ, ``c [G, K]`` = Σ c, ``n [G]``, ``sumsq [G]`` = Σ ‖y‖²,
    ``gram [G, G]`` = the Gram of the groups' sums Σ y, where ``y = x − x̄`` is a document's
    field about the whole-ensemble mean and ``c = V y`` its coordinates in the first pass's
    ``K`` POD directions ``V``. The subset's centred scatter in those coordinates is
    ``Σ C − (Σ c)(Σ c)ᵀ / n``; its total scatter ``Σ sumsq − 1ᵀ gram 1 / n`` is exact. The
    eigenvalues are exact when the ensemble's fluctuations lie in the span of ``V`` (rank
    ``≤ K``: the streamed spectrum is complete); otherwise they are those of the projection
    on the top-``K`` subspace, and the energy outside it is ``total − Σ eigenvalues``.
    """
    k = torch.as_tensor(list(keep), dtype=torch.long)
    n = float(stats["n"][k].sum())
    cs = stats["c"][k].sum(0).to(torch.float64)
    S = stats["C"][k].sum(0).to(torch.float64) - torch.outer(cs, cs) / max(n, 1.0)
    S = 0.5 * (S + S.T)
    lam = torch.linalg.eigvalsh(S).flip(0).clamp_min(0.0) / max(n, 1.0)
    tol = float(lam[0]) * max(1, lam.numel()) * 1e-12 if lam.numel() else 0.0
    lam = lam[lam > tol]
    total = (float(stats["sumsq"][k].sum())
             - float(stats["gram"][k][:, k].sum()) / max(n, 1.0)) / max(n, 1.0)
    return lam, max(total, float(lam.sum())), int(round(n))
