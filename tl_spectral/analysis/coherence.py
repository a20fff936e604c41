"""Wavelet cross-coherence between the lag profiles of two queries (SPEC A.9, *choice*).

With the complex CWT coefficients ``W_{s,i}(a, tau)`` of the lag profile of query ``i`` in
document ``s``, the cross-spectrum and the coherence are

    G_ij(a)     = sum_{s, tau} W_{s,i}(a, tau) conj(W_{s,j}(a, tau))
    gamma_ij(a) = |G_ij(a)|^2 / (G_ii(a) G_jj(a))          in [0, 1] (Cauchy-Schwarz).

``gamma_ij(a) = 1`` exactly when ``W_{s,j}(a, .) = c W_{s,i}(a, .)`` for one complex ``c``
across every document: the two queries' patterns at scale ``a`` move together (are
phase-locked) over the ensemble. Where a query has no fluctuation energy at a scale
(``G_ii(a) <= 1e-12 max G``; e.g. query 0 of a causal model, whose row is always
``[1, 0, ...]``) ``gamma`` is undefined and set to 0 (its diagonal too).

Two exact ways to get ``G``: ``method="direct"`` transforms every profile (chunked over
documents); ``method="moments"`` (default) never forms the coefficients:
``G_ij(a) = sum_{tau, tau'} R_ij[tau, tau'] P_a[tau, tau']`` with the lag cross-moment
``R_ij = sum_s x_{s,i} x_{s,j}^T`` and ``P_a = M_a^T conj(M_a)`` (``M_a`` the Toeplitz CWT
operator of :class:`~tl_spectral.analysis.wavelets.LagCWT`).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from tl_spectral.analysis.wavelets import DEFAULT_WAVELET, LagCWT, default_scales

__all__ = ["coherence_from_spectrum", "cross_coherence", "cross_spectrum", "default_queries"]


def default_queries(T: int, n_queries: int = 16) -> Tensor:
    """A strided subset of query positions: ``[Q]`` int64, ending at ``T - 1`` with stride
    ``ceil(T / n_queries)`` (so query 0, fixed in causal models, is avoided when possible)."""
    if T < 1 or n_queries < 1:
        raise ValueError(f"need T >= 1 and n_queries >= 1 (got T={T}, n_queries={n_queries})")
    stride = max(1, math.ceil(T / n_queries))
    return torch.arange(T - 1, -1, -stride).flip(0)[-n_queries:].contiguous()


def _check_profiles(profiles: Tensor) -> Tensor:
    if not isinstance(profiles, Tensor) or profiles.ndim != 3:
        raise ValueError(
            "profiles must be a tensor [N documents, Q queries, n lags] (got "
            f"{tuple(profiles.shape) if isinstance(profiles, Tensor) else type(profiles).__name__})"
        )
    if profiles.shape[0] < 1 or profiles.shape[1] < 1:
        raise ValueError("profiles needs at least one document and one query")
    if profiles.is_complex():
        raise ValueError("profiles must be real")
    if not torch.isfinite(profiles).all():
        raise ValueError("profiles contains NaN or inf")
    return profiles if profiles.is_floating_point() else profiles.to(torch.float64)


def cross_spectrum(
    profiles: Float[Tensor, "N Q n"],
    op: LagCWT,
    *,
    method: str = "moments",
    chunk_docs: int | None = None,
) -> Tensor:
    """Cross-spectrum ``G_ij(a) = sum_{s,tau} W_{s,i}(a,tau) conj(W_{s,j}(a,tau))``.

    profiles: ``[N, Q, n]`` lag profiles of ``Q`` queries in ``N`` documents.
    op: the CWT (``op.n == n``). Returns ``[S, Q, Q]`` complex128 (Hermitian in ``i, j``;
    float64 for real wavelets).
    """
    x = _check_profiles(profiles)
    N, Q, n = x.shape
    if op.n != n:
        raise ValueError(f"op was built for n={op.n} lags but profiles have {n}")
    S = op.n_scales
    if method == "moments":
        M = op.matrix(torch.complex128 if op.is_complex else torch.float64)  # [S, n, n]
        P = M.transpose(1, 2) @ M.conj()  # P_a = M_a^T conj(M_a): [S, n, n]
        Pr = P.real.reshape(S, n * n).contiguous()
        Pi = P.imag.reshape(S, n * n).contiguous() if op.is_complex else None
        flat = x.reshape(N, Q * n)
        G = torch.zeros(S, Q, Q, dtype=torch.complex128 if op.is_complex else torch.float64)
        for i in range(Q):
            Ri = (x[:, i, :].T @ flat).to(torch.float64)  # [n(tau), Q*n(j, tau')]
            Ri = Ri.view(n, Q, n).permute(0, 2, 1).reshape(n * n, Q)  # [(tau,tau'), j]
            if Pi is None:
                G[:, i, :] = Pr @ Ri
            else:
                G[:, i, :] = torch.complex(Pr @ Ri, Pi @ Ri)
        return G
    if method == "direct":
        G = torch.zeros(S, Q, Q, dtype=torch.complex128 if op.is_complex else torch.float64)
        if chunk_docs is None:
            chunk_docs = max(1, (1 << 23) // (Q * S * n))
        for s0 in range(0, N, chunk_docs):
            W = op(x[s0 : s0 + chunk_docs])  # [c, Q, S, n]
            Wc = W.permute(2, 1, 0, 3).reshape(S, Q, -1).to(G.dtype)  # [S, Q, c*n]
            G += Wc @ Wc.conj().transpose(1, 2)
        return G
    raise ValueError(f"method must be 'moments' or 'direct' (got {method!r})")


def coherence_from_spectrum(G: Tensor, *, rtol: float = 1e-12) -> Float[Tensor, "S Q Q"]:
    """``gamma_ij(a) = |G_ij|^2 / (G_ii G_jj)`` from a cross-spectrum ``G: [S, Q, Q]``;
    float64 in ``[0, 1]``, 0 where a query's energy ``G_ii(a) <= rtol * max G_ii``."""
    d = torch.diagonal(G, dim1=-2, dim2=-1).real.to(torch.float64)  # [S, Q]
    ok = d > rtol * float(d.max()) if float(d.max()) > 0 else torch.zeros_like(d, dtype=torch.bool)
    denom = d[:, :, None] * d[:, None, :]
    pair = ok[:, :, None] & ok[:, None, :]
    num = G.abs().to(torch.float64) ** 2
    gamma = torch.where(
        pair, num / torch.where(pair, denom, torch.ones_like(denom)), torch.zeros_like(denom)
    )
    return gamma.clamp_(0.0, 1.0)


def cross_coherence(
    profiles: Float[Tensor, "N Q n"],
    op: LagCWT | None = None,
    *,
    scales=None,
    wavelet: str = DEFAULT_WAVELET,
    method: str = "moments",
) -> Float[Tensor, "S Q Q"]:
    """Cross-coherence ``gamma_ij(a)`` of the lag profiles of ``Q`` queries (SPEC A.9).

    profiles: ``[N, Q, n]``; op: a :class:`LagCWT` for ``n`` lags (else one is built from
    ``scales``, default :func:`default_scales` of ``n``, and ``wavelet``).
    Returns ``[S, Q, Q]`` float64 in ``[0, 1]``.
    """
    x = _check_profiles(profiles)
    n = x.shape[-1]
    if op is None:
        op = LagCWT(
            n,
            default_scales(n) if scales is None else scales,
            wavelet,
            dtype=torch.float64 if x.dtype == torch.float64 else torch.float32,
        )
    return coherence_from_spectrum(cross_spectrum(x, op, method=method))
