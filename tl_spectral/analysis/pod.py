"""Proper orthogonal decomposition (POD) of an ensemble of snapshots (SPEC A.6-A.8).

Snapshots are the rows of ``X: [N, dim]`` — for attention fields, one flattened fluctuation
field per document. POD finds the orthonormal modes ``phi_k`` and eigenvalues ``lambda_k``
of the ensemble covariance ``X^T X / N``; they minimise the mean squared error of every
rank-K reconstruction, which equals the tail energy ``sum_{k>K} lambda_k`` (Theorem 1 of the
paper; :meth:`PODResult.tail_energy` vs :meth:`PODResult.reconstruction_mse`).

Three algorithms behind one ``method`` argument, one ``rank`` argument for truncation:

* ``"snapshots"`` (Sirovich's method of snapshots; used when ``N <= dim``):
  1. ``K = X X^T / N`` (``[N, N]``, accumulated in ``dtype``, float64 by default);
  2. ``K a_k = lambda_k a_k`` (``torch.linalg.eigh`` in float64, sorted descending);
  3. ``phi_k = X^T a_k / sqrt(N lambda_k)`` (orthonormal), coefficients
     ``c_{s,k} = <X_s, phi_k> = sqrt(N lambda_k) a_{s,k}``.
* ``"direct"`` (``N > dim``): thin SVD ``X = U S V^T``, ``lambda_k = S_k^2 / N``,
  ``phi_k = V_k``, ``c = U S``.
* ``"randomized"`` (top-k only, for large ``N``; Halko, Martinsson & Tropp 2011): Gaussian
  sketch of ``k + n_oversamples`` columns, at least ``n_power_iter`` QR-stabilised power
  iterations, SVD of the small projected matrix. With an accuracy target ``tol`` (default
  1e-3) the iteration goes on until an a posteriori estimate of the relative error of each
  of the top-k eigenvalues is below ``tol``: the Ritz values ``θ_j`` of the sketch are
  tracked after every iteration; they converge geometrically, so with the last changes
  ``δ`` and their ratio ``ρ`` (the rate) the remaining error is about ``δ ρ / (1 − ρ)``
  (counted twice, for safety). When the rate is too slow to reach ``tol`` within 10 more
  iterations (flat spectra: the rate of ``λ_j`` is ``(λ_{ℓ+1} / λ_j)²`` for a sketch of
  ``ℓ`` columns) the oversampling is doubled with fresh Gaussian columns; a sketch of
  ``min(N, dim)`` columns is exact. The estimate is reported as ``eigen_rel_error`` (a
  warning if ``max_power_iter`` iterations do not reach ``tol``). ``tol=None`` runs exactly
  ``n_power_iter`` iterations with fixed oversampling (the former behaviour).
  Only the first ``k`` eigenvalues are computed; the
  total energy ``trace(K) = ||X||_F^2 / N`` is still exact, so energy fractions are exact,
  and ``H*`` / ``T_spec`` use the modes available (reported as lower bounds / flagged).

``rank`` (PyDMD's ``svd_rank`` spirit): ``int k >= 1`` keeps ``k`` modes; ``float`` in
``(0, 1)`` keeps the fewest modes whose cumulative energy fraction reaches it;
``None`` or ``-1`` keeps every nonzero mode. Eigenvalues are always reported in full
(except for ``"randomized"``); ``rank`` only truncates the modes and coefficients kept.

Eigenvalues at or below ``tol = max(lambda_max * N * eps64, eps * trace(K))`` are rounding
noise (the first term: the eigen-solver's, numpy's ``matrix_rank`` rule in float64; the
second: a bound on the Frobenius norm of the rounding error of a Gram built in the
arithmetic dtype, ``eps`` its machine epsilon): they are dropped, and ``n_available`` counts
the rest. Mean-free snapshots (fluctuations) have at most ``N - 1`` nonzero modes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral.checks import is_int
from tl_spectral.results import Result, register_result

__all__ = [
    "PODResult",
    "effective_rank",
    "pod",
    "pod_from_gram",
    "resolve_rank",
    "spectral_concentration",
]

Rank = int | float | None


# ----------------------------------------------------------------------------- summaries
def effective_rank(
    eigenvalues: Float[Tensor, " k"],
    epsilon: float = 0.10,
    *,
    total_energy: float | None = None,
) -> tuple[int, bool]:
    """``H*(eps) = min{K : sum_{k<=K} lambda_k / sum_k lambda_k >= 1 - eps}`` (SPEC A.8).

    eigenvalues: ``[k]`` descending. ``total_energy`` defaults to their sum (pass the exact
    trace when only the top of the spectrum is known). Returns ``(H, reached)``;
    ``reached`` is False when the known eigenvalues never reach ``1 - eps`` (then ``H`` is
    their count, a lower bound).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1) (got {epsilon})")
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).flatten()
    total = float(lam.sum()) if total_energy is None else float(total_energy)
    if not total > 0:
        raise ValueError("total energy is zero: the ensemble has no fluctuation")
    cum = torch.cumsum(lam, 0) / total
    target = (1.0 - epsilon) * (1.0 - 1e-12)
    hit = torch.nonzero(cum >= target).flatten()
    if hit.numel() == 0:
        return int(lam.numel()), False
    return int(hit[0]) + 1, True


def spectral_concentration(
    eigenvalues: Float[Tensor, " k"],
    *,
    energy: float = 0.99,
    total_energy: float | None = None,
) -> dict[str, float]:
    """Spectral concentration index ``T_spec = 1 / beta`` (SPEC A.7).

    Least-squares fit of ``log lambda_k = c - beta log k`` over ``k = 1..K`` with ``K`` the
    number of modes holding the first ``energy`` (99%) of the energy (at least 2 modes; only
    positive eigenvalues). Returns ``{"beta", "T_spec", "r2", "n_fit", "intercept"}``.
    Conventions: a single nonzero mode gives ``beta = inf``, ``T_spec = 0``, ``r2 = 1``; a flat
    spectrum gives ``beta = 0``, ``T_spec = inf``; two points fit exactly (``r2 = 1``).
    """
    lam = torch.as_tensor(eigenvalues, dtype=torch.float64).flatten()
    lam = lam[lam > 0]
    if lam.numel() == 0:
        raise ValueError("no positive eigenvalue: the ensemble has no fluctuation")
    total = float(lam.sum()) if total_energy is None else float(total_energy)
    cum = torch.cumsum(lam, 0) / total
    hit = torch.nonzero(cum >= energy * (1.0 - 1e-12)).flatten()
    K = int(hit[0]) + 1 if hit.numel() else int(lam.numel())
    K = min(max(K, 2), int(lam.numel()))
    if K < 2:
        return {
            "beta": math.inf,
            "T_spec": 0.0,
            "r2": 1.0,
            "n_fit": 1,
            "intercept": math.log(float(lam[0])),
        }
    x = torch.log(torch.arange(1, K + 1, dtype=torch.float64))
    y = torch.log(lam[:K])
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    intercept = float(ym - slope * xm)
    ss_tot = float(((y - ym) ** 2).sum())
    ss_res = float(((y - (intercept + slope * x)) ** 2).sum())
    r2 = 1.0 if ss_tot <= 1e-300 else max(0.0, 1.0 - ss_res / ss_tot)
    beta = -slope
    if abs(beta) < 1e-12:
        beta = 0.0
    T_spec = 1.0 / beta if beta > 0 else math.inf
    return {"beta": beta, "T_spec": T_spec, "r2": r2, "n_fit": K, "intercept": intercept}


def resolve_rank(rank: Rank, eigenvalues: Tensor, total_energy: float, n_available: int) -> int:
    """Number of modes to keep for ``rank`` (see the module docstring)."""
    if rank is None or (is_int(rank) and rank == -1):
        return n_available
    if isinstance(rank, bool):
        raise TypeError("rank must be an int, a float in (0, 1), or None; got a bool")
    if isinstance(rank, int):
        if rank < 1:
            raise ValueError(
                f"rank={rank} is not valid; pass an int >= 1, a float in (0, 1) (energy "
                "fraction), or None / -1 (all modes)"
            )
        if rank > n_available:
            raise ValueError(
                f"rank={rank} exceeds the {n_available} nonzero POD modes available (N "
                "snapshots give at most N - 1 modes once the mean is removed, and never more "
                f"than dim); pass rank <= {n_available} or rank=None"
            )
        return rank
    if isinstance(rank, float):
        if not 0.0 < rank < 1.0:
            raise ValueError(
                f"a float rank is an energy fraction and must lie in (0, 1) (got {rank}); "
                "pass an int for a fixed number of modes"
            )
        cum = torch.cumsum(eigenvalues.to(torch.float64), 0) / total_energy
        hit = torch.nonzero(cum >= rank * (1.0 - 1e-12)).flatten()
        if hit.numel() == 0:
            raise ValueError(
                f"the {n_available} modes computed hold only {float(cum[-1]):.4f} of the "
                f"energy, less than rank={rank}; use an exact method or a larger int rank"
            )
        return int(hit[0]) + 1
    raise TypeError(f"rank must be int, float or None (got {type(rank).__name__})")


# ----------------------------------------------------------------------------- result
@register_result
@dataclasses.dataclass
class PODResult(Result):
    """POD of ``N`` snapshots of dimension ``dim``.

    Tensors: ``eigenvalues [n_available]`` (float64, descending, nonzero ones; the top
    ``rank`` only for the randomized method), ``modes [rank, dim]`` (orthonormal rows),
    ``coefficients [N, rank]`` (``X ≈ coefficients @ modes (+ mean)``), ``mean [dim]`` or
    ``None`` (the mean subtracted when ``center=True``).
    Scalars: ``total_energy = trace(X^T X) / N``; ``H_star`` = ``H*(epsilon)``;
    ``H_star_saturated``: ``H_star`` is only a lower bound — it reached the ``N - 1`` modes
    a mean-free ensemble of ``N`` snapshots can hold (``N`` if not mean-free), or the top-k
    computed by the randomized method; print ``H_star_str`` ("≥ 149"). ``beta``, ``T_spec``,
    ``tspec_r2``, ``tspec_n_fit``: the power-law fit of :func:`spectral_concentration`.
    ``eigen_rel_error``: for the randomized method, the a posteriori estimate of the largest
    relative error of the computed eigenvalues (0 for the exact methods; NaN when the
    iteration could not estimate it, e.g. ``tol=None``).
    """

    kind: ClassVar[str] = "pod"
    main_plot: ClassVar[str | None] = "plot_spectrum"
    array_shapes = {
        "eigenvalues": "float[_]", "modes": "float[rank, dim]",
        "coefficients": "float[snapshot, rank]", "mean": "float[dim]",
    }
    array_dims = {"dim": "dim", "snapshot": "n_snapshots"}

    eigenvalues: Tensor
    modes: Tensor
    coefficients: Tensor
    mean: Tensor | None
    total_energy: float
    n_snapshots: int
    dim: int
    method: str
    centered: bool
    spectrum_complete: bool
    epsilon: float
    H_star: int
    H_star_saturated: bool
    beta: float
    T_spec: float
    tspec_r2: float
    tspec_n_fit: int
    eigen_rel_error: float = 0.0

    # ------------------------------------------------------------------ derived
    @property
    def rank(self) -> int:
        """Number of modes kept."""
        return int(self.modes.shape[0])

    @property
    def n_available(self) -> int:
        """Number of eigenvalues known (the nonzero ones for exact methods)."""
        return int(self.eigenvalues.numel())

    @property
    def energy_fraction(self) -> Tensor:
        """``lambda_k / total_energy``: ``[n_available]``."""
        return self.eigenvalues / self.total_energy

    @property
    def cumulative_energy(self) -> Tensor:
        """``sum_{j<=k} lambda_j / total_energy``: ``[n_available]``."""
        return torch.cumsum(self.energy_fraction, 0)

    @property
    def H_star_str(self) -> str:
        """H* for a table: ``"≥ n"`` when saturated (every mode was needed), else ``"n"``."""
        return f"≥ {self.H_star}" if self.H_star_saturated else str(self.H_star)

    def h_star(self, epsilon: float) -> tuple[int, bool]:
        """``(H*(epsilon), saturated)`` for another tolerance."""
        return _h_star(
            self.eigenvalues,
            epsilon,
            self.total_energy,
            self.n_snapshots,
            self.centered,
            self.spectrum_complete,
        )

    def tail_energy(self, K: int) -> float:
        """``sum_{k>K} lambda_k`` (= ``total_energy - sum_{k<=K} lambda_k``, exact also for
        the randomized method): the predicted mean squared error of the rank-K
        reconstruction (Theorem 1)."""
        if not 0 <= K <= self.n_available:
            raise ValueError(f"K must lie in [0, {self.n_available}] (got {K})")
        return max(0.0, self.total_energy - float(self.eigenvalues[:K].sum()))

    def reconstruct(self, K: int | None = None) -> Float[Tensor, "N dim"]:
        """Rank-K reconstruction of the snapshots (``K <= rank``; default all kept modes),
        with the mean added back when it was subtracted."""
        K = self.rank if K is None else K
        if not 0 <= K <= self.rank:
            raise ValueError(f"K must lie in [0, {self.rank}] (the modes kept); got {K}")
        rec = self.coefficients[:, :K].to(self.modes.dtype) @ self.modes[:K]
        if self.mean is not None:
            rec = rec + self.mean.to(rec.dtype)
        return rec

    def reconstruction_mse(self, X: Float[Tensor, "N dim"], K: int) -> float:
        """Measured ``(1/N) sum_s ||X_s - X_s^(K)||^2`` for the snapshots ``X``."""
        if X.shape != (self.n_snapshots, self.dim):
            raise ValueError(f"X must be [{self.n_snapshots}, {self.dim}] (got {tuple(X.shape)})")
        err = X.to(torch.float64) - self.reconstruct(K).to(torch.float64)
        return float((err**2).sum()) / self.n_snapshots

    def headline(self) -> dict[str, Any]:
        """JSON-able scalars (no tensors)."""
        return {
            "n_snapshots": self.n_snapshots,
            "dim": self.dim,
            "method": self.method,
            "rank": self.rank,
            "n_available": self.n_available,
            "total_energy": self.total_energy,
            "epsilon": self.epsilon,
            "H_star": self.H_star,
            "H_star_saturated": self.H_star_saturated,
            "H_star_str": self.H_star_str,
            "beta": self.beta,
            "T_spec": self.T_spec,
            "tspec_r2": self.tspec_r2,
            "tspec_n_fit": self.tspec_n_fit,
            "spectrum_complete": self.spectrum_complete,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary plus the eigenvalues and energy fractions as lists."""
        d = self.headline()
        d["eigenvalues"] = self.eigenvalues.tolist()
        d["energy_fraction"] = self.energy_fraction.tolist()
        return d

    def plot_spectrum(self, **kwargs: Any):
        """Eigenvalue spectrum (log-log) with the power-law fit. Returns a Figure."""
        return self._draw("plot_spectrum", **kwargs)


def _h_star(
    lam: Tensor, epsilon: float, total: float, N: int, centered: bool, complete: bool
) -> tuple[int, bool]:
    H, reached = effective_rank(lam, epsilon, total_energy=total)
    cap = N - 1 if centered else N
    return H, (not reached) or (H >= cap)


# ----------------------------------------------------------------------------- algorithms
def _check_snapshots(X: Tensor) -> Tensor:
    if not isinstance(X, Tensor):
        raise TypeError(f"X must be a torch.Tensor [N, dim] (got {type(X).__name__})")
    if X.ndim != 2:
        raise ValueError(
            f"X must be 2-D [N snapshots, dim] (got shape {tuple(X.shape)}); flatten each "
            "snapshot, e.g. X = fields.reshape(N, -1)"
        )
    if X.shape[0] < 2:
        raise ValueError(f"POD needs at least N=2 snapshots (got N={X.shape[0]})")
    if X.shape[1] < 1:
        raise ValueError("snapshots have dimension 0")
    if X.is_complex():
        raise ValueError("X must be real-valued")
    if not X.is_floating_point():
        X = X.to(torch.float64)
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or inf")
    return X


def _fix_signs(modes: Tensor, coeffs: Tensor) -> None:
    """Make the largest-magnitude entry of each mode positive (in place)."""
    if modes.shape[0] == 0:
        return
    idx = modes.abs().argmax(dim=1)
    sgn = torch.sign(modes.gather(1, idx[:, None]).squeeze(1))
    sgn[sgn == 0] = 1
    modes.mul_(sgn[:, None].to(modes.dtype))
    coeffs.mul_(sgn[None, :].to(coeffs.dtype))


def _finish(
    lam: Tensor,
    total: float,
    modes: Tensor,
    coeffs: Tensor,
    *,
    N: int,
    dim: int,
    method: str,
    centered: bool,
    complete: bool,
    epsilon: float,
    mean: Tensor | None,
    eigen_rel_error: float = 0.0,
) -> PODResult:
    H, sat = _h_star(lam, epsilon, total, N, centered, complete)
    fit = spectral_concentration(lam, total_energy=total)
    return PODResult(
        eigenvalues=lam,
        modes=modes,
        coefficients=coeffs,
        mean=mean,
        total_energy=total,
        n_snapshots=N,
        dim=dim,
        method=method,
        centered=centered,
        spectrum_complete=complete,
        epsilon=float(epsilon),
        H_star=H,
        H_star_saturated=sat,
        beta=fit["beta"],
        T_spec=fit["T_spec"],
        tspec_r2=fit["r2"],
        tspec_n_fit=int(fit["n_fit"]),
        eigen_rel_error=float(eigen_rel_error),
    )


def _zero_tol(lam_max: float, trace: float, N: int, eps: float) -> float:
    """Eigenvalues at or below this are rounding noise (see the module docstring)."""
    return max(lam_max * N * torch.finfo(torch.float64).eps, eps * trace)


def _eig_gram(gram: Tensor, eps: float) -> tuple[Tensor, Tensor, float, int]:
    """Eigen-decomposition of a PSD Gram ``[N, N]`` (float64), descending, with the
    rounding-noise eigenvalues dropped. Returns ``(lam [n], A [N, n], trace, n)``."""
    K = gram.to(torch.float64)
    K = 0.5 * (K + K.T)
    total = float(torch.diagonal(K).sum())
    if not total > 0:
        raise ValueError(
            "the snapshots have zero energy (all fluctuations are zero); nothing to decompose"
        )
    lam, A = torch.linalg.eigh(K)
    lam, A = lam.flip(0), A.flip(1)
    tol = _zero_tol(float(lam[0]), total, K.shape[0], eps)
    n = int((lam > tol).sum())
    return lam[:n].contiguous(), A[:, :n].contiguous(), total, n


def pod_from_gram(
    gram: Float[Tensor, "N N"],
    project: Callable[[Tensor], Tensor],
    dim: int,
    *,
    rank: Rank = None,
    epsilon: float = 0.10,
    centered: bool = True,
    eps: float | None = None,
    mean: Tensor | None = None,
    method: str = "snapshots",
    clip_rank: bool = False,
) -> PODResult:
    """Method of snapshots from a precomputed Gram matrix.

    gram: ``[N, N]`` = ``X X^T / N`` (any real dtype; decomposed in float64).
    project: ``B [N, r] -> B^T X [r, dim]`` (lets structured snapshot sets — e.g. windowed
        fields — avoid forming ``X``).
    dim: snapshot dimension. centered: the snapshots are mean-free (at most ``N - 1``
    modes; used by the saturation flag). eps: machine epsilon of the arithmetic that built
    the Gram (default float64's). clip_rank: an int ``rank`` above the modes available
    keeps them all instead of raising. Returns a :class:`PODResult`.
    """
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"gram must be square [N, N] (got {tuple(gram.shape)})")
    N = int(gram.shape[0])
    if N < 2:
        raise ValueError(f"POD needs at least N=2 snapshots (got N={N})")
    eps = torch.finfo(torch.float64).eps if eps is None else eps
    lam, A, total, n = _eig_gram(gram, eps)
    if clip_rank and is_int(rank) and rank > n:
        rank = n
    r = resolve_rank(rank, lam, total, n)
    Ar = A[:, :r]
    scale = torch.sqrt(N * lam[:r])
    modes = project(Ar.to(torch.float64))  # [r, dim]
    if modes.shape != (r, dim):
        raise ValueError(f"project returned {tuple(modes.shape)}, expected ({r}, {dim})")
    modes = modes / scale[:, None].to(modes.dtype)
    coeffs = Ar * scale[None, :]
    _fix_signs(modes, coeffs)
    return _finish(
        lam,
        total,
        modes,
        coeffs,
        N=N,
        dim=dim,
        method=method,
        centered=centered,
        complete=True,
        epsilon=epsilon,
        mean=mean,
    )


def _gram(X: Tensor, dtype: torch.dtype, chunk_cols: int = 8192) -> Tensor:
    N, dim = X.shape
    if X.dtype == dtype:
        return X @ X.T
    K = torch.zeros(N, N, dtype=dtype)
    for c0 in range(0, dim, chunk_cols):
        xc = X[:, c0 : c0 + chunk_cols].to(dtype)
        K += xc @ xc.T
    return K


def _randomized(
    X: Tensor,
    k: int,
    p: int,
    q: int,
    seed: int,
    tol: float | None = None,
    max_iter: int = 100,
) -> tuple[Tensor, Tensor, Tensor, float]:
    """Top-k SVD of ``X [N, dim]`` (Halko et al. Alg. 4.4), adaptive when ``tol`` is set
    (see the module docstring). Returns ``(U [N,k], S [k], Vh [k,dim], rel_error)`` with
    ``rel_error`` the estimated largest relative error of ``S²`` (0 when exact, NaN when
    not estimated)."""
    N, dim = X.shape
    n_max = min(N, dim)
    ell = min(k + p, n_max)
    g = torch.Generator().manual_seed(seed)
    Omega = torch.randn(dim, ell, generator=g, dtype=X.dtype)
    Q, _ = torch.linalg.qr(X @ Omega)
    floor = 10.0 * torch.finfo(X.dtype).eps
    hist: list[Tensor] = []  # top-k Ritz values θ = σ² after each iteration (since growth)
    err = math.nan
    it = 0
    while True:
        Y = X.T @ Q  # [dim, ell]; B = Yᵀ
        if tol is None:
            if it >= q:
                break
        else:
            if ell >= n_max:  # Q spans the range of X: the sketch is exact
                err = 0.0
                break
            th = torch.linalg.eigvalsh((Y.T @ Y).to(torch.float64)).flip(0)[:k].clamp_min(0.0)
            hist.append(th)
            err, rate = _ritz_error(hist, floor)
            if it >= q and err <= tol:
                break
            if it >= max_iter:
                import warnings

                warnings.warn(
                    f"randomized POD: {max_iter} power iterations with {ell} columns reached an "
                    f"estimated relative eigenvalue error of {err:.2g}, not tol={tol:g}; use "
                    "method='snapshots' or raise n_oversamples / max_power_iter",
                    stacklevel=3,
                )
                break
            if _too_slow(err, rate, tol, len(hist)) and ell < n_max:
                grow = min(n_max, k + 2 * max(ell - k, 1)) - ell
                Om = torch.randn(dim, grow, generator=g, dtype=X.dtype)
                Q, _ = torch.linalg.qr(torch.cat([Q, X @ Om], 1))
                ell += grow
                hist = []
                continue
        Z, _ = torch.linalg.qr(Y)
        Q, _ = torch.linalg.qr(X @ Z)
        it += 1
    Ub, S, Vh = torch.linalg.svd(Y.T, full_matrices=False)
    U = Q @ Ub
    return U[:, :k], S[:k], Vh[:k], err


def _ritz_error(hist: list[Tensor], floor: float) -> tuple[float, float]:
    """A posteriori relative error of the latest Ritz values ``hist[-1]`` and the worst
    convergence rate, from their last changes (geometric extrapolation). Needs three
    iterates; ``(inf, nan)`` before, or while the changes do not shrink yet."""
    if len(hist) < 3:
        return math.inf, math.nan
    th = hist[-1]
    scale = th.clamp_min(torch.finfo(torch.float64).tiny)
    d1 = (hist[-1] - hist[-2]).abs()
    d0 = (hist[-2] - hist[-3]).abs()
    at_floor = d1 <= floor * scale  # converged to round-off
    rate = torch.where(d0 > 0, d1 / d0.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    if len(hist) >= 4:  # the slower of the last two rates (rates settle from above or below)
        dm = (hist[-3] - hist[-4]).abs()
        rate = torch.maximum(rate, torch.where(dm > 0, d0 / dm.clamp_min(1e-300), 0.0))
    slow = (rate >= 1.0) & ~at_floor
    if bool(slow.any()):
        return math.inf, float(rate.max())
    est = torch.where(at_floor, d1, 2.0 * d1 * rate / (1.0 - rate).clamp_min(1e-12)) / scale
    live = ~at_floor
    worst = float(rate[live].max()) if bool(live.any()) else 0.0
    return float(est.max()), worst


def _too_slow(err: float, rate: float, tol: float, n_hist: int) -> bool:
    """Whether the sketch should grow, after ``n_hist`` iterations with its current size:
    the estimated iterations left to reach ``tol`` exceed 10 at the current rate, or the
    changes have not started to shrink after 6 iterations."""
    if err <= tol or n_hist < 3:
        return False
    if math.isfinite(err) and 0.0 < rate < 1.0:
        return math.log(tol / err) / math.log(rate) > 10.0
    return n_hist >= 6


def pod(
    X: Float[Tensor, "N dim"],
    rank: Rank = None,
    *,
    method: str = "auto",
    center: bool = False,
    epsilon: float = 0.10,
    dtype: torch.dtype = torch.float64,
    n_oversamples: int = 10,
    n_power_iter: int = 4,
    seed: int = 0,
    tol: float | None = 1e-3,
    max_power_iter: int = 100,
) -> PODResult:
    """POD of the snapshots ``X: [N, dim]`` (rows = snapshots).

    X: the fluctuations (already mean-removed), or raw snapshots with ``center=True`` to
        subtract the ensemble mean here (stored in ``result.mean``).
    rank: ``int k`` modes, ``float`` in (0, 1) energy fraction, ``None`` / ``-1`` all.
    method: ``"snapshots"``, ``"direct"``, ``"randomized"`` (needs an int ``rank``) or
        ``"auto"``: randomized when ``rank`` is an int with ``4 (rank + n_oversamples) <=
        min(N, dim)`` and ``min(N, dim) >= 2000``; else snapshots when ``N <= dim``; else direct.
    epsilon: tolerance of ``H*(epsilon)`` (default 0.10).
    dtype: arithmetic dtype of the Gram / SVD (default float64; the eigen-decomposition is
        always float64). Modes are returned in this dtype.
    The snapshots count as mean-free (``centered``: at most ``N - 1`` modes) when
    ``center=True`` or their mean is below ``1e3 eps`` of their RMS norm.
    n_oversamples, n_power_iter, seed, tol, max_power_iter: the randomized method (its
    initial oversampling, least number of power iterations, sketch seed, target relative
    accuracy of the top-k eigenvalues — ``None`` for the fixed iteration count — and the
    most power iterations); see the module docstring. The exact methods ignore them.
    """
    # scikit-learn's PCA._fit: every argument validated here once, then one solver runs.
    # One name per tolerance: ``epsilon`` (the energy left out by H*), ``tol`` (the
    # randomized solver's target accuracy), ``zero_tol`` inside the solvers (eigenvalues at
    # or below it are numerical zeros, from the machine epsilon ``machine_eps``).
    # Long on purpose: the docstring (every method and option); the code is 46 lines.
    X = _check_snapshots(X)
    N, dim = X.shape
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64 (got {dtype})")
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1) (got {epsilon})")
    if method not in ("auto", "snapshots", "direct", "randomized"):
        raise ValueError(
            f"method must be 'auto', 'snapshots', 'direct' or 'randomized' (got {method!r})"
        )
    mean = None
    if center:
        mean = X.to(dtype).mean(0)
        X = X.to(dtype) - mean
        centered = True
    else:
        mu = X.to(torch.float64).mean(0)
        rms = float(X.to(torch.float64).pow(2).sum(1).mean().sqrt())
        centered = float(mu.norm()) <= 1e3 * torch.finfo(X.dtype).eps * max(rms, 1e-300)
    n_max = min(N, dim)
    int_rank = is_int(rank) and rank >= 1
    if method == "auto":
        if int_rank and 4 * (rank + n_oversamples) <= n_max and n_max >= 2000:
            method = "randomized"
        elif N <= dim:
            method = "snapshots"
        else:
            method = "direct"
    if method == "randomized":
        if not int_rank:
            raise ValueError(
                f"method='randomized' computes the top-k modes and needs an int rank >= 1 (got "
                f"{rank!r}); use method='snapshots' for an energy-fraction or full rank"
            )
        if rank > n_max:
            raise ValueError(
                f"rank={rank} exceeds min(N, dim) = {n_max}: no more modes are available; pass "
                f"rank <= {n_max}"
            )
    common = dict(rank=rank, dtype=dtype, epsilon=epsilon, centered=centered, mean=mean)
    if method == "snapshots":
        return _pod_snapshots(X, **common)
    if method == "direct":
        return _pod_direct(X, **common)
    return _pod_randomized(X, **common, n_oversamples=n_oversamples, n_power_iter=n_power_iter,
                           seed=seed, tol=tol, max_power_iter=max_power_iter)


def _pod_snapshots(X: Tensor, *, rank: Rank, dtype: torch.dtype, epsilon: float,
                   centered: bool, mean: Tensor | None) -> PODResult:
    """Method of snapshots: eigen-decomposition of the ``[N, N]`` Gram matrix."""
    N, dim = X.shape
    K = _gram(X, dtype) / N

    def project(B: Tensor) -> Tensor:
        Bt = B.T.to(dtype)
        if X.dtype == dtype:
            return Bt @ X
        return torch.cat([Bt @ X[:, c : c + 8192].to(dtype) for c in range(0, dim, 8192)], 1)

    return pod_from_gram(
        K,
        project,
        dim,
        rank=rank,
        epsilon=epsilon,
        centered=centered,
        eps=torch.finfo(dtype).eps,
        mean=mean,
        method="snapshots",
    )


def _pod_direct(X: Tensor, *, rank: Rank, dtype: torch.dtype, epsilon: float, centered: bool,
                mean: Tensor | None) -> PODResult:
    """Thin SVD of the snapshot matrix."""
    N, dim = X.shape
    machine_eps = torch.finfo(dtype).eps
    U, S, Vh = torch.linalg.svd(X.to(dtype), full_matrices=False)
    lam_all = S.to(torch.float64) ** 2 / N
    total = float(X.to(torch.float64).pow(2).sum()) / N
    if not total > 0:
        raise ValueError("the snapshots have zero energy; nothing to decompose")
    zero_tol = _zero_tol(float(lam_all[0]), total, N, machine_eps)
    n = int((lam_all > zero_tol).sum())
    lam = lam_all[:n].contiguous()
    r = resolve_rank(rank, lam, total, n)
    modes = Vh[:r].clone()
    coeffs = (U[:, :r] * S[:r]).to(torch.float64)
    _fix_signs(modes, coeffs)
    return _finish(
        lam,
        total,
        modes,
        coeffs,
        N=N,
        dim=dim,
        method="direct",
        centered=centered,
        complete=True,
        epsilon=epsilon,
        mean=mean,
    )


def _pod_randomized(X: Tensor, *, rank: Rank, dtype: torch.dtype, epsilon: float,
                    centered: bool, mean: Tensor | None, n_oversamples: int, n_power_iter: int,
                    seed: int, tol: float | None, max_power_iter: int) -> PODResult:
    """Randomized range finder with adaptive power iterations (top-``rank`` modes)."""
    N, dim = X.shape
    Xd = X.to(dtype)
    total = float(Xd.to(torch.float64).pow(2).sum()) / N
    if not total > 0:
        raise ValueError("the snapshots have zero energy; nothing to decompose")
    if tol is not None and not 0.0 < tol < 1.0:
        raise ValueError(f"tol must lie in (0, 1) or be None (got {tol})")
    U, S, Vh, rel_err = _randomized(
        Xd, int(rank), n_oversamples, n_power_iter, seed, tol, max_power_iter
    )
    lam = S.to(torch.float64) ** 2 / N
    modes = Vh.clone()
    coeffs = (U * S).to(torch.float64)
    _fix_signs(modes, coeffs)
    return _finish(
        lam,
        total,
        modes,
        coeffs,
        N=N,
        dim=dim,
        method="randomized",
        centered=centered,
        complete=int(rank) >= min(N, dim),
        epsilon=epsilon,
        mean=mean,
        eigen_rel_error=rel_err,
    )
