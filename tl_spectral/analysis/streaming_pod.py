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

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral.analysis.pod import PODResult, effective_rank, spectral_concentration

__all__ = ["StreamingFactors", "fold", "streaming_pod_result"]


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
        M = torch.cat([W.to(torch.float64), between])
    else:
        M = W.to(torch.float64)
    if M.shape[0] == 0:
        return W[:0], tot[None], torch.tensor([n], dtype=torch.float64, device=dev), torch.zeros(1, dtype=torch.float64, device=dev)
    G = M @ M.T
    G = 0.5 * (G + G.T)
    lam, U = torch.linalg.eigh(G)
    lam, U = lam.flip(0), U.flip(1)
    trace = float(lam.clamp_min(0).sum())
    tol = max(float(lam[0]) if lam.numel() else 0.0, 0.0) * M.shape[0] * torch.finfo(torch.float64).eps
    k = min(int(rank), int((lam > tol).sum()))
    Wn = (U[:, :k].T @ M).to(W.dtype)  # rows sigma_k v_k^T
    dropped = torch.tensor([max(0.0, trace - float(lam[:k].sum()))], dtype=torch.float64, device=dev)
    return Wn, tot[None], torch.tensor([n], dtype=torch.float64, device=dev), dropped


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
    it, e.g. from an exact lag moment). ``H_star`` is exact when the kept eigenvalues reach
    ``1 - epsilon`` of the exact total; otherwise ``H_star`` = the number kept and
    ``H_star_saturated`` (a lower bound: ``H* > rank_cap``). ``spectrum_complete``: no
    truncation dropped energy. ``T_spec``: the power-law fit over the modes holding 99% of the
    exact energy, exact when those are all kept (else fitted on the kept ones; see
    ``tspec_n_fit``).
    """
    st = state.fold(rank_cap or max(1, state.W.shape[0]))
    N = st.n
    if N < 2:
        raise ValueError(f"POD needs at least N=2 snapshots (got N={int(N)})")
    total = st.total_scatter / N if total_energy is None else float(total_energy)
    if not total > 0:
        raise ValueError("the snapshots have zero energy (all fluctuations are zero); nothing to decompose")
    W = st.W.to(torch.float64)
    sq = W.pow(2).sum(1)  # sigma_k^2, descending
    order = torch.argsort(sq, descending=True)
    W, sq = W[order], sq[order]
    lam = sq / N
    eps = torch.finfo(torch.float32).eps
    keep = lam > max(float(lam[0]) * W.shape[0] * torch.finfo(torch.float64).eps, eps * total) if lam.numel() else lam > 0
    lam, W = lam[keep].contiguous(), W[keep]
    k = min(int(n_modes), int(lam.numel()))
    modes = W[:k] / torch.sqrt(sq[keep][:k])[:, None]
    # sign convention of pod(): the largest-magnitude entry of each mode is positive
    if k:
        idx = modes.abs().argmax(dim=1)
        sgn = torch.sign(modes.gather(1, idx[:, None]).squeeze(1))
        sgn[sgn == 0] = 1
        modes = modes * sgn[:, None]
    H, reached = effective_rank(lam, epsilon, total_energy=total)
    complete = float(st.dropped) <= 1e-12 * max(total * N, 1e-300)
    fit = spectral_concentration(lam, total_energy=total)
    return PODResult(
        eigenvalues=lam,
        modes=modes,
        coefficients=torch.zeros(0, k, dtype=torch.float64),
        mean=None,
        total_energy=total,
        n_snapshots=int(round(N)),
        dim=st.dim,
        method="streaming",
        centered=True,
        spectrum_complete=bool(complete),
        epsilon=float(epsilon),
        H_star=H,
        H_star_saturated=(not reached) or H >= int(round(N)) - 1,
        beta=fit["beta"],
        T_spec=fit["T_spec"],
        tspec_r2=fit["r2"],
        tspec_n_fit=int(fit["n_fit"]),
        eigen_rel_error=float(st.dropped) / max(N * float(lam[-1]), 1e-300) if lam.numel() and not complete else 0.0,
    )

