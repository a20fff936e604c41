"""The one scale-POD engine (SPEC A, steps 1-2) over a head axis.

Fields ``F: [N, H, T, n_lags]`` (``N`` documents, ``H`` heads; the head-mean analysis of
:func:`~tl_spectral.analysis.scale_pod.scale_pod_layer` is the case ``H = 1``, its field
passed as ``F[:, None]``). :func:`prepare` checks the data and builds the CWT operator once;
:func:`head_chunk` runs, for heads ``h0:h1`` at once (heads are a batch dimension):

1. the lag-major (centred) copy ``Ft[h, tau, s, i]``, the lag second moments
   ``C_h = mean_{s,i} u u^T`` (one ``bmm``), the scalograms ``E_h(a, tau)`` and, per head,
   the dominant scales ``a*_{h,m}`` (peak picking on ``E_h(a)``);
2. the Gaussian band windows ``G_{h,m}`` and every Gram (whole field and bands) from one pass
   of per-lag Grams ``K_tau = F[:, :, tau] F[:, :, tau]^T``: ``K_full = sum_tau K_tau / N``,
   ``K_m = sum_tau G_m(tau)^2 K_tau / N`` (batched GEMMs over lag chunks).

What follows differs by path and lives beside its result: the head-mean layer decomposes its
Grams with modes and coefficients and adds the coherence (``scale_pod.py``); the per-head
path takes only the eigenvalues of every head's Grams in one batched ``eigvalsh``
(``scale_pod_heads.py``).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from tl_spectral.analysis.lags import check_lags
from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.analysis.wavelets import (
    LagCWT,
    default_scales,
    dominant_scales,
    scalogram_from_moments,
)


@dataclasses.dataclass
class Setup:
    """What every chunk of heads of one layer shares: the checked fields ``F [N, H, T,
    n_lags]``, the lag grid, the CWT operator and its scales, the options."""

    F: Tensor
    lags: Tensor
    causal: bool
    op: LagCWT
    scales: Tensor
    options: ScalePODOptions
    eps: float  # machine epsilon of the fields' dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        N, H, T, n_lags = (int(d) for d in self.F.shape)
        return N, H, T, n_lags


@dataclasses.dataclass
class Chunk:
    """Steps 1-2 for the heads ``h0 : h0 + nh`` (``M = max_dominant`` band slots).

    ``Ft [nh, n_lags, N, T]`` lag-major (centred) fields (None once released);
    ``E_at [nh, S, n_lags]`` float64 scalograms; ``held [nh]`` the energy ``sum u^2 / N`` of
    what ``Ft`` holds; ``mean_sq [nh]`` the squared norm of the ensemble mean;
    ``dominant`` per head the indices of its dominant scales (empty: no energy);
    ``band_scales [nh, M]`` their scales (NaN past a head's last band); ``windows`` and
    ``masks [nh, M, n_lags]`` the windows (0 where ``G <= window_threshold``) and where they
    are kept; ``grams [nh, 1 + B, N, N]`` float64, slot 0 the whole field, then the first
    ``B <= M`` band slots (``B``: the most bands of a head of the chunk; None once
    released)."""

    h0: int
    Ft: Tensor | None
    E_at: Tensor
    held: Tensor
    mean_sq: Tensor
    dominant: list
    band_scales: Tensor
    windows: Tensor
    masks: Tensor
    grams: Tensor | None

    def centered(self, center: bool, eps: float) -> list[bool]:
        """Per head: are the POD's snapshots mean-free (at most ``N - 1`` modes)? With
        ``center`` yes; else when the fields as passed have a mean that is zero up to
        rounding."""
        if center:
            return [True] * int(self.held.numel())
        return [bool(x) for x in self.mean_sq <= (1e3 * eps) ** 2 * self.held]


def prepare(F: Tensor, lags: Tensor | None, options: ScalePODOptions) -> Setup:
    """Check the fields ``F [N, H, T, n_lags]`` (real; integers become float32) and the lags;
    build the CWT operator on ``options.scales`` (default :func:`default_scales` ``(T)``)."""
    if F.is_complex():
        raise ValueError("F must be real")
    if not F.is_floating_point():
        F = F.to(torch.float32)
    N, H, T, n_lags = (int(d) for d in F.shape)
    if N < 2:
        raise ValueError(
            f"scale-selective POD needs at least N=2 documents (got N={N}); a single "
            "snapshot has no fluctuation"
        )
    if H < 1:
        raise ValueError("F has no heads (H = 0)")
    if T < 4:
        raise ValueError(f"need T >= 4 tokens per document (got T={T})")
    lags = check_lags(lags, n_lags)
    o = options
    scales = default_scales(T) if o.scales is None else torch.as_tensor(o.scales,
                                                                        dtype=torch.float64)
    dt = torch.float64 if F.dtype == torch.float64 else torch.float32
    op = LagCWT(n_lags, scales, o.wavelet, dtype=dt)
    return Setup(F=F, lags=lags, causal=bool(lags.min() >= 0), op=op, scales=op.scales,
                 options=o, eps=torch.finfo(F.dtype).eps)


def head_chunk(s: Setup, h0: int, h1: int, *, scalogram_method: str = "auto") -> Chunk:
    """Steps 1-2 of the heads ``h0:h1`` (see the module docstring)."""
    o = s.options
    N, _, T, n_lags = s.shape
    Ft, mean_sq = _lag_major(s.F[:, h0:h1], o.center)
    nh = h1 - h0
    prof = Ft.view(nh, n_lags, N * T)
    C = torch.bmm(prof, prof.transpose(1, 2)).to(torch.float64) / (N * T)
    # energy of what Ft holds, sum ||u||^2 / N (the trace of C times T)
    held = torch.diagonal(C, dim1=-2, dim2=-1).sum(-1) * T
    E_at = scalogram_from_moments(C, s.op, method=scalogram_method)
    del C, prof
    E_a = E_at.sum(-1)  # [nh, S]
    M = int(o.max_dominant)
    dominant: list[list[int]] = []
    band_scales = torch.full((nh, M), math.nan, dtype=torch.float64)
    for j in range(nh):  # peak picking on the S numbers of each head
        dom = [] if not float(E_a[j].sum()) > 0 else dominant_scales(
            E_a[j], s.scales, max_scales=M, min_ratio=o.min_ratio,
            min_peak_fraction=o.min_peak_fraction)
        dominant.append(dom)
        band_scales[j, : len(dom)] = s.scales[dom]
    windows, masks = _band_windows(s.lags, band_scales, o)
    used = max(len(d) for d in dominant)  # no Gram for a band slot no head of the chunk has
    weights = torch.cat([torch.ones(nh, 1, n_lags, dtype=torch.float64), windows[:, :used]**2],
                        dim=1)
    grams = _grams(Ft, weights.to(Ft.dtype), o.lag_chunk)
    return Chunk(h0=h0, Ft=Ft, E_at=E_at, held=held, mean_sq=mean_sq, dominant=dominant,
                 band_scales=band_scales, windows=windows, masks=masks, grams=grams)


def _lag_major(Fh: Tensor, center: bool) -> tuple[Tensor, Tensor]:
    """``Fh [N, nh, T, n_lags]`` as the lag-major copy ``[nh, n_lags, N, T]`` (minus the
    ensemble mean with ``center``) and the mean's squared norm ``[nh]`` (float64)."""
    N, nh, T, n_lags = (int(d) for d in Fh.shape)
    mean64 = Fh.mean(0, dtype=torch.float64)  # [nh, T, n_lags]
    if not bool(torch.isfinite(mean64).all()):  # NaN / inf anywhere reach the mean
        raise ValueError("F contains NaN or inf")
    mean_sq = mean64.pow(2).sum(dim=(1, 2))
    mean = mean64.to(Fh.dtype) if center else None
    del mean64
    Ft = torch.empty(nh, n_lags, N, T, dtype=Fh.dtype)
    step = max(1, (1 << 22) // (nh * T * n_lags))
    for s0 in range(0, N, step):
        blk = Fh[s0 : s0 + step]
        if mean is not None:
            blk = blk - mean
        Ft[:, :, s0 : s0 + step, :] = blk.permute(1, 3, 0, 2)
    return Ft, mean_sq


def _band_windows(lags: Tensor, band_scales: Tensor, o: ScalePODOptions) -> tuple[Tensor, Tensor]:
    """Gaussian lag windows ``G_m(tau) = exp(-(tau - a*_m)^2 / (2 sigma_m^2))``, ``sigma_m =
    a*_m / 2`` (``|tau|`` with ``lag_window="absolute"``) of every band slot ``[nh, M]``
    (NaN: no band), zero where ``G_m <= window_threshold``; and where they are kept."""
    tau = lags.to(torch.float64)
    if o.lag_window == "absolute":
        tau = tau.abs()
    has_band = ~torch.isnan(band_scales)
    a = torch.nan_to_num(band_scales, nan=1.0)[:, :, None]
    G = torch.exp(-((tau - a) ** 2) / (2.0 * (a / 2.0) ** 2))  # [nh, M, n_lags]
    masks = (G > o.window_threshold) & has_band[:, :, None]
    return torch.where(masks, G, torch.zeros_like(G)), masks


def _grams(Ft: Tensor, weights: Tensor, lag_chunk: int) -> Tensor:
    """``sum_tau weights[h, k, tau] K_tau[h] / N`` for every head ``h`` and weight row ``k``
    (``Ft [nh, n_lags, N, T]``, ``weights [nh, K, n_lags]``): ``[nh, K, N, N]`` float64."""
    nh, n_lags, N, _ = (int(d) for d in Ft.shape)
    grams = torch.zeros(nh, weights.shape[1], N * N, dtype=torch.float64)
    # lags per batched GEMM: lag_chunk, fewer when [nh, w, N, N] would pass 2^25 entries
    w = max(1, min(int(lag_chunk), (1 << 25) // (nh * N * N)))
    for c0 in range(0, n_lags, w):
        c1 = min(n_lags, c0 + w)
        Fc = Ft[:, c0:c1]  # [nh, w, N, T]
        Kc = torch.matmul(Fc, Fc.transpose(-1, -2)).view(nh, c1 - c0, N * N)
        grams += torch.bmm(weights[:, :, c0:c1].contiguous(), Kc).to(torch.float64)
        del Kc
    grams /= N
    return grams.view(nh, -1, N, N)
