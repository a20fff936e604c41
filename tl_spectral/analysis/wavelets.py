"""Continuous wavelet transform along the lag axis, scalograms and dominant scales.

The transform reproduces PyWavelets' ``pywt.cwt(data, scales, wavelet, method="fft")``
exactly (same integrated-wavelet sampling, same differentiation, same cropping), batched
in torch. PyWavelets computes, for each scale ``a``,

1. ``int_psi``: the wavelet integrated from ``-inf`` (rectangle rule on ``2**precision``
   samples over the wavelet's support ``[lb, ub]``), conjugated for complex wavelets;
2. the filter ``h_a = int_psi[j][::-1]`` with ``j = floor(arange(a (ub - lb) + 1) / (a step))``;
3. ``coef = -sqrt(a) * diff(x * h_a)`` (full linear convolution, first difference),
   centre-cropped to the input length: ``d = (len(h_a) - 2) / 2``, drop ``floor(d)`` on the
   left and ``ceil(d)`` on the right.

Steps 2-3 are one linear filter: ``W(a, t) = sum_tau x[tau] k_a[t - tau]`` with
``k_a[m] = -sqrt(a) (h_a[m + floor(d) + 1] - h_a[m + floor(d)])`` (``h_a`` zero outside its
support). Only ``m in [-(n-1), n-1]`` can touch an input of length ``n``, so a circular
convolution of length ``P >= 2n - 1`` is exact: one FFT of the data, one product with the
precomputed filter bank ``[S, P]``, one inverse FFT. PyWavelets instead pads every scale to
the next power of two above ``n + len(h_a) - 1`` (up to ``16 a``), which is what makes it
slow at large scales. The same kernel, written as a Toeplitz matrix ``M_a[t, tau] =
k_a[t - tau]`` (:meth:`LagCWT.matrix`), gives the transform as a matrix product
(``method="matmul"``), and second-moment shortcuts for ensemble statistics
(:func:`scalogram`).

With ``cmor1.5-1.0`` (centre frequency 1) the scale ``a`` is the oscillation period in
samples, i.e. in tokens of lag.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pywt
import torch

__all__ = [
    "DEFAULT_WAVELET",
    "FIXED_BANDS",
    "LagCWT",
    "band_energies",
    "cwt",
    "default_scales",
    "dominant_scales",
    "scale_energy",
    "scalogram",
    "scalogram_from_moment",
    "scalogram_from_moments",
]

DEFAULT_WAVELET = "cmor1.5-1.0"

#: The paper's three fixed scale bands (tokens): fine ``a <= 7``, medium ``7 < a < 20``,
#: coarse ``a >= 20``. Each entry is ``(low, high, low_inclusive, high_inclusive)``.
FIXED_BANDS: dict[str, tuple[float, float, bool, bool]] = {
    "fine": (-math.inf, 7.0, False, True),
    "medium": (7.0, 20.0, False, False),
    "coarse": (20.0, math.inf, True, False),
}


def default_scales(T: int, n_scales: int = 48, *, dtype=torch.float64) -> torch.Tensor:
    """The default scale grid: ``n_scales`` geometric scales from 1 to ``T / 2``.

    Returns ``[n_scales]``. Raises ``ValueError`` if ``T < 4`` (the grid would be empty or
    below the smallest scale PyWavelets accepts).
    """
    if T < 4:
        raise ValueError(f"default_scales needs T >= 4 tokens (got T={T}); pass scales explicitly")
    if n_scales < 1:
        raise ValueError(f"n_scales must be >= 1 (got {n_scales})")
    return torch.logspace(0.0, math.log10(T / 2), n_scales, dtype=dtype)


def _as_scales(scales) -> np.ndarray:
    s = np.atleast_1d(
        np.asarray(
            scales.detach().cpu().numpy() if isinstance(scales, torch.Tensor) else scales,
            dtype=np.float64,
        )
    )
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"scales must be a non-empty 1-D sequence (got shape {s.shape})")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("scales must be finite and positive; e.g. default_scales(T)")
    return s


@functools.lru_cache(maxsize=32)
def _kernel_bank(
    wavelet: str, scales: tuple[float, ...], n: int, precision: int
) -> tuple[np.ndarray, bool]:
    """Lag kernels ``k_a[m]`` for ``m = -(n-1) .. n-1``: ``[S, 2n - 1]`` (complex128 or
    float64) and whether the wavelet is complex. Follows ``pywt.cwt`` line by line."""
    w = pywt.DiscreteContinuousWavelet(wavelet)
    if not isinstance(w, pywt.ContinuousWavelet):
        raise ValueError(  # noqa: TRY004 - a wrong wavelet name is a value error
            f"wavelet {wavelet!r} is a discrete wavelet; pass a continuous one such as "
            f"{DEFAULT_WAVELET!r} (see pywt.wavelist(kind='continuous'))"
        )
    int_psi, x = pywt.integrate_wavelet(w, precision=precision)
    is_complex = bool(w.complex_cwt)
    int_psi = np.conj(int_psi) if is_complex else np.real(int_psi)
    step = x[1] - x[0]
    dtype = np.complex128 if is_complex else np.float64
    bank = np.zeros((len(scales), 2 * n - 1), dtype=dtype)
    m = np.arange(-(n - 1), n)
    for si, a in enumerate(scales):
        j = np.arange(a * (x[-1] - x[0]) + 1) / (a * step)
        j = j.astype(int)
        if j[-1] >= int_psi.size:
            j = np.extract(j < int_psi.size, j)
        h = int_psi[j][::-1]
        L = h.size
        if L < 2:
            raise ValueError(f"scale {a} is too small for wavelet {wavelet!r}; use scales >= 1")
        off = (L - 2) // 2 + 1  # floor(d) + 1
        idx = m + off
        hp = np.concatenate([np.zeros(1, dtype=h.dtype), h, np.zeros(1, dtype=h.dtype)])
        # g[k] = h[k] - h[k-1] for k in [0, L]; zero elsewhere. hp[k+1] = h[k].
        valid = (idx >= 0) & (idx <= L)
        g = np.zeros(m.size, dtype=dtype)
        g[valid] = hp[idx[valid] + 1] - hp[idx[valid]]
        bank[si] = -math.sqrt(a) * g
    bank.setflags(write=False)
    return bank, is_complex


def _next_fast_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (sizes pocketfft/MKL handle fastest)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            q = p35
            while q < n:
                q *= 2
            best = min(best, q)
            p35 *= 3
        p5 *= 5
    return best


class LagCWT:
    """A batched CWT for signals of fixed length ``n`` on a fixed scale grid.

    Parameters
    ----------
    n: signal length (number of lags).
    scales: ``[S]`` positive scales (e.g. :func:`default_scales`).
    wavelet: a PyWavelets continuous wavelet name (default ``"cmor1.5-1.0"``).
    precision: PyWavelets' ``precision`` (wavelet sampled on ``2**precision`` points).
    dtype: real dtype of the computation (``torch.float32`` or ``torch.float64``);
        complex wavelets give ``complex64`` / ``complex128`` coefficients.
    method: ``"fft"`` (circular convolution of length ``P = next_fast_len(2n - 1)``: one FFT
        per signal, one inverse FFT per signal and scale), ``"matmul"`` (one GEMM of the
        signals with the ``[n, S * n]`` Toeplitz operator, real and imaginary parts
        interleaved so the product is the complex output itself) or ``"auto"`` (default:
        ``"matmul"`` while the operator has at most ``2**23`` complex entries — ``n <= 418``
        at 48 scales — where one GEMM beats ``S`` batched FFTs on CPU; ``"fft"`` above).
        Both are exact to rounding and tested against each other and PyWavelets.

    Calling it on ``x: [..., n]`` returns ``[..., S, n]`` coefficients equal to
    ``pywt.cwt(x, scales, wavelet, method="fft", axis=-1)[0]`` moved to ``[..., S, n]``.
    """

    def __init__(
        self,
        n: int,
        scales,
        wavelet: str = DEFAULT_WAVELET,
        *,
        precision: int = 12,
        dtype: torch.dtype = torch.float32,
        method: str = "auto",
    ):
        if n < 1:
            raise ValueError(f"signal length n must be >= 1 (got {n})")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64 (got {dtype})")
        if method not in ("auto", "fft", "matmul"):
            raise ValueError(f"method must be 'auto', 'fft' or 'matmul' (got {method!r})")
        self.n = int(n)
        self.scales = torch.as_tensor(_as_scales(scales), dtype=torch.float64)
        if method == "auto":
            method = "matmul" if self.scales.numel() * self.n * self.n <= (1 << 23) else "fft"
        self.wavelet = str(wavelet)
        self.precision = int(precision)
        self.dtype = dtype
        self.method = method
        bank, self.is_complex = _kernel_bank(
            self.wavelet, tuple(float(a) for a in self.scales.tolist()), self.n, self.precision
        )
        self._bank64 = torch.from_numpy(np.array(bank))  # [S, 2n-1], float64/complex128
        self.out_dtype = (
            (torch.complex64 if dtype == torch.float32 else torch.complex128)
            if self.is_complex
            else dtype
        )
        self.P = _next_fast_len(2 * self.n - 1)
        self._fft_bank: torch.Tensor | None = None
        self._gemm: torch.Tensor | None = None
        self._matrix: dict[torch.dtype, torch.Tensor] = {}
        #: :func:`_moment_kernels` of scale chunks, kept between scalogram calls
        self._moment_kernels: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def n_scales(self) -> int:
        return int(self.scales.numel())

    def kernels(self) -> torch.Tensor:
        """Lag kernels ``k_a[m]`` for ``m = -(n-1) .. n-1``: ``[S, 2n - 1]`` (complex128 or float64)."""
        return self._bank64.clone()

    def matrix(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The Toeplitz operator ``M[a, t, tau] = k_a[t - tau]``: ``[S, n, n]``, with
        ``W[..., a, :] = M[a] @ x``. ``dtype`` defaults to the output dtype."""
        dtype = dtype or self.out_dtype
        if dtype not in self._matrix:
            t = torch.arange(self.n)
            idx = t[:, None] - t[None, :] + (self.n - 1)  # [n, n]
            self._matrix[dtype] = self._bank64[:, idx].to(dtype)
        return self._matrix[dtype]

    def _fft_filters(self) -> torch.Tensor:
        if self._fft_bank is None:
            n, P = self.n, self.P
            circ = torch.zeros(self.n_scales, P, dtype=self._bank64.dtype)
            circ[:, :n] = self._bank64[:, n - 1 :]  # m = 0 .. n-1
            if n > 1:
                circ[:, P - (n - 1) :] = self._bank64[:, : n - 1]  # m = -(n-1) .. -1
            cdt = torch.complex64 if self.dtype == torch.float32 else torch.complex128
            self._fft_bank = torch.fft.fft(circ.to(cdt), dim=-1)  # [S, P]
        return self._fft_bank

    def _gemm_operator(self) -> torch.Tensor:
        """``[n, S * n (* 2)]``: column ``(a, t[, re/im])`` holds ``M[a, t, :]``."""
        if self._gemm is None:
            M = self.matrix(torch.complex128 if self.is_complex else torch.float64)
            Mt = M.permute(2, 0, 1).contiguous()  # [tau, a, t]
            if self.is_complex:
                Mt = torch.view_as_real(Mt)  # [tau, a, t, 2]
            self._gemm = Mt.reshape(self.n, -1).to(self.dtype).contiguous()
        return self._gemm

    def __call__(self, x: torch.Tensor, *, chunk_size: int | None = None) -> torch.Tensor:
        """CWT of ``x: [..., n]`` along its last axis: returns ``[..., S, n]``."""
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(np.asarray(x))
        if x.shape[-1] != self.n:
            raise ValueError(
                f"signals have length {x.shape[-1]} on the last axis but this LagCWT was built "
                f"for n={self.n}; build LagCWT(n={x.shape[-1]}, ...)"
            )
        if x.is_complex():
            raise ValueError("x must be real-valued")
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.n).to(self.dtype)
        B, S, n = flat.shape[0], self.n_scales, self.n
        out = torch.empty(B, S, n, dtype=self.out_dtype)
        if self.method == "fft":
            # torch's CPU FFT has ~10 ms of overhead per batched call: few, large calls.
            if chunk_size is None:  # complex buffer of ~8M elements
                chunk_size = max(1, (1 << 23) // (S * self.P))
            filt = self._fft_filters()
            buf = torch.empty(min(chunk_size, B), S, self.P, dtype=filt.dtype)
            big = max(chunk_size, 8192)
            for b0 in range(0, B, big):
                xf_all = torch.fft.fft(flat[b0 : b0 + big], n=self.P, dim=-1)  # [rows, P]
                for s0 in range(0, xf_all.shape[0], chunk_size):
                    xf = xf_all[s0 : s0 + chunk_size]
                    b = xf.shape[0]
                    torch.mul(xf[:, None, :], filt, out=buf[:b])
                    y = torch.fft.ifft(buf[:b], dim=-1)[..., :n]
                    dst = out[b0 + s0 : b0 + s0 + b]
                    dst.copy_(y if self.is_complex else y.real)
        else:
            G = self._gemm_operator()  # [n, S * n * (2 if complex)]
            res = out if not self.is_complex else torch.view_as_real(out)
            res = res.view(B, -1)
            chunk_size = chunk_size or max(B, 1)  # no temporaries: one GEMM
            for s0 in range(0, B, chunk_size):
                torch.matmul(flat[s0 : s0 + chunk_size], G, out=res[s0 : s0 + chunk_size])
        return out.reshape(*lead, S, n)


def cwt(
    data,
    scales,
    wavelet: str = DEFAULT_WAVELET,
    *,
    axis: int = -1,
    precision: int = 12,
    dtype: torch.dtype | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """PyWavelets-compatible CWT: ``pywt.cwt(data, scales, wavelet, method="fft", axis=axis)[0]``.

    data: any shape, transformed along ``axis`` (length ``n``).
    Returns ``[S, *data.shape]`` (scales first, as PyWavelets does); complex for complex
    wavelets. ``dtype`` (real) defaults to float64 for float64 input, else float32.
    """
    x = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data))
    if dtype is None:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if x.ndim == 0:
        raise ValueError("data must have at least one axis")
    xm = x.movedim(axis, -1)
    op = LagCWT(xm.shape[-1], scales, wavelet, precision=precision, dtype=dtype, method=method)
    w = op(xm)  # [..., S, n]
    w = w.movedim(-2, 0)  # [S, ..., n]
    return w.movedim(-1, axis if axis < 0 else axis + 1)


def _second_moment(profiles: torch.Tensor, chunk_rows: int = 16384) -> tuple[torch.Tensor, int]:
    """``sum_b x_b x_b^T`` over the rows of ``profiles: [B, n]`` in float64 (each chunk's
    product in the input dtype, accumulated in float64). Returns ``([n, n], B)``."""
    B, n = profiles.shape
    acc = torch.zeros(n, n, dtype=torch.float64)
    for s0 in range(0, B, chunk_rows):
        xb = profiles[s0 : s0 + chunk_rows]
        acc += (xb.T @ xb).to(torch.float64)
    return acc, B


def scalogram(
    profiles: torch.Tensor,
    op: LagCWT | None = None,
    *,
    scales=None,
    wavelet: str = DEFAULT_WAVELET,
    method: str = "moments",
) -> torch.Tensor:
    """Ensemble scalogram ``E(a, tau) = mean_b |W_b(a, tau)|^2``.

    profiles: ``[..., n]`` real signals (for attention fields: ``[N, T, n_lags]`` lag
        profiles; the mean runs over every leading index, i.e. over documents and queries).
    op: a :class:`LagCWT` for length ``n`` (else built from ``scales`` / ``wavelet``;
        ``scales`` defaults to :func:`default_scales` of ``n``).
    method: ``"moments"`` (default) uses ``E(a, .) = diag(M_a C M_a^H)`` with the lag
        second-moment matrix ``C = mean_b x_b x_b^T`` (exact; cost ``B n^2 + S n^3`` instead
        of a transform of every profile); ``"direct"`` transforms every profile (chunked).

    Returns ``[S, n]`` float64.
    """
    n = profiles.shape[-1]
    if op is None:
        op = LagCWT(
            n,
            default_scales(n) if scales is None else scales,
            wavelet,
            dtype=torch.float64 if profiles.dtype == torch.float64 else torch.float32,
        )
    elif op.n != n:
        raise ValueError(f"op was built for n={op.n} lags but profiles have {n}")
    flat = profiles.reshape(-1, n)
    if flat.shape[0] == 0:
        raise ValueError("profiles is empty; pass at least one signal")
    if method == "moments":
        C, B = _second_moment(flat)
        return scalogram_from_moment(C / B, op)
    if method == "direct":
        E = torch.zeros(op.n_scales, n, dtype=torch.float64)
        rows = max(1, (1 << 22) // (op.n_scales * n))
        for s0 in range(0, flat.shape[0], rows):
            w = op(flat[s0 : s0 + rows])
            E += (w.abs() ** 2).sum(0).to(torch.float64)
        return E / flat.shape[0]
    raise ValueError(f"method must be 'moments' or 'direct' (got {method!r})")


def scalogram_from_moment(C: torch.Tensor, op: LagCWT) -> torch.Tensor:
    """``E(a, t) = (M_a C M_a^H)[t, t]`` from a lag second-moment matrix ``C = mean_b x_b
    x_b^T: [n, n]``: the ensemble scalogram without transforming any signal. Returns
    ``[S, n]`` float64."""
    n = op.n
    if C.shape != (n, n):
        raise ValueError(f"C must be [{n}, {n}] (got {tuple(C.shape)})")
    C = C.to(torch.float64)
    M = op.matrix(torch.complex128 if op.is_complex else torch.float64)  # [S, n, n]
    if op.is_complex:  # Re((M C) * conj(M)) summed over the second lag index
        E = ((M.real @ C) * M.real).sum(-1) + ((M.imag @ C) * M.imag).sum(-1)
    else:
        E = ((M @ C) * M).sum(-1)
    return E.clamp_min(0.0)


def scale_energy(E_at: torch.Tensor) -> torch.Tensor:
    """Scale energy ``E(a) = sum_tau E(a, tau)``: ``[S, n] -> [S]``."""
    return E_at.sum(-1)


def dominant_scales(
    E_a: torch.Tensor,
    scales,
    *,
    max_scales: int = 3,
    min_ratio: float = 1.5,
    min_peak_fraction: float = 0.01,
) -> list[int]:
    """Indices of the dominant scales: the largest local maxima of ``E(a)``.

    E_a: ``[S]`` scale energy on the grid ``scales: [S]`` (increasing).
    A grid point is a local maximum when it is strictly larger than each neighbour it has
    (the two ends count, against their one neighbour: a field whose energy sits at the
    finest or coarsest scale of the grid reports that scale). Candidates are taken by
    decreasing ``E(a)`` and kept when their scale is at least a factor ``min_ratio`` away
    from every scale already kept, up to ``max_scales``. Maxima below ``min_peak_fraction``
    of the largest ``E(a)`` are ignored (*our choice*, default 1%: ripples of the discretised
    wavelet near ``a = 1`` otherwise count as "dominant"; pass 0 for the literal rule).
    Returns indices sorted by scale (possibly empty only if ``E_a`` is all zero).
    """
    E = torch.as_tensor(E_a, dtype=torch.float64).flatten()
    s = torch.as_tensor(_as_scales(scales))
    if E.numel() != s.numel():
        raise ValueError(f"E_a has {E.numel()} entries but scales has {s.numel()}")
    if torch.any(s[1:] <= s[:-1]):
        raise ValueError("scales must be strictly increasing")
    if not torch.isfinite(E).all():
        raise ValueError("E_a contains NaN or inf")
    if max_scales < 1 or min_ratio < 1 or not 0 <= min_peak_fraction <= 1:
        raise ValueError("need max_scales >= 1, min_ratio >= 1 and 0 <= min_peak_fraction <= 1")
    S = E.numel()
    if S == 1:
        return [0] if E[0] > 0 else []
    left = torch.cat([torch.tensor([-math.inf], dtype=E.dtype), E[:-1]])
    right = torch.cat([E[1:], torch.tensor([-math.inf], dtype=E.dtype)])
    peak = (E > left) & (E > right) & (E > 0) & (E >= min_peak_fraction * E.max())
    cand = torch.nonzero(peak).flatten().tolist()
    cand.sort(key=lambda i: -float(E[i]))
    kept: list[int] = []
    for i in cand:
        ai = float(s[i])
        if all(max(ai / float(s[j]), float(s[j]) / ai) >= min_ratio for j in kept):
            kept.append(i)
        if len(kept) == max_scales:
            break
    return sorted(kept)


def band_energies(
    E_a: torch.Tensor,
    scales,
    bands: dict[str, tuple[float, float, bool, bool]] | None = None,
) -> dict[str, float]:
    """Share of the scale energy ``sum_a E(a)`` in each band (default :data:`FIXED_BANDS`).

    E_a: ``[S]``; scales: ``[S]``. The sum runs over grid scales (on a geometric grid this is
    the integral of ``E`` over ``log a``). Returns ``{band: fraction}``; fractions of the
    default bands sum to 1. Raises if the total energy is zero.
    """
    E = torch.as_tensor(E_a, dtype=torch.float64).flatten()
    s = torch.as_tensor(_as_scales(scales))
    if E.numel() != s.numel():
        raise ValueError(f"E_a has {E.numel()} entries but scales has {s.numel()}")
    total = float(E.sum())
    if not total > 0:
        raise ValueError("the scale energy is zero: the field has no fluctuation")
    out: dict[str, float] = {}
    for name, (lo, hi, lo_in, hi_in) in (bands or FIXED_BANDS).items():
        m = (s >= lo if lo_in else s > lo) & (s <= hi if hi_in else s < hi)
        out[name] = float(E[m].sum()) / total
    return out


#: the float64 parts (real and imaginary) of the Toeplitz operator of the LagCWT used last by
#: :func:`scalogram_from_moments`' matmul form, kept across operators of the same wavelet,
#: precision, length and scales (a scale POD builds one per layer, all alike) while the
#: operator has at most :data:`MATRIX_PARTS_CACHE` entries (T = 256: 3.1 M, 50 MB)
_MATRIX_PARTS: dict[tuple, tuple[torch.Tensor, ...]] = {}
MATRIX_PARTS_CACHE = 1 << 23


def _matrix_parts(op: LagCWT) -> tuple[torch.Tensor, ...]:
    """``op.matrix()`` in float64 as contiguous ``[S, n, n]`` parts (real and imaginary for
    a complex wavelet): the same values as ``M.real`` / ``M.imag``, built once for every
    operator alike (:data:`_MATRIX_PARTS`)."""
    key = (op.wavelet, op.precision, op.n, tuple(op.scales.tolist()))
    parts = _MATRIX_PARTS.get(key)
    if parts is None:
        M = op.matrix(torch.complex128 if op.is_complex else torch.float64)
        parts = (M.real.contiguous(), M.imag.contiguous()) if op.is_complex else (M,)
        if M.numel() <= MATRIX_PARTS_CACHE:
            _MATRIX_PARTS.clear()
            _MATRIX_PARTS[key] = parts
    return parts


#: complex entries of the data-independent kernel products :func:`scalogram_from_moments`
#: keeps on its ``LagCWT`` between calls (one call per layer of a scale POD reuses them);
#: 2**24 entries = 256 MB (T = 256: the 48 scales' 6.3 M entries are kept)
MOMENT_KERNEL_CACHE = 1 << 24


def _moment_kernels(op: LagCWT, a0: int, a1: int) -> torch.Tensor:
    """``Q[g, a, f] = K̂_a[f + g] conj(K̂_a[f])`` (indices mod ``P``) of the scales
    ``a0:a1``, contiguous ``[G, a1 - a0, P]`` complex128: the wavelet side of
    :func:`scalogram_from_moments`' FFT form. It depends on ``op`` only, so it is kept on
    ``op`` while all the kept chunks stay within :data:`MOMENT_KERNEL_CACHE` entries (the
    same values as recomputing them: the same operations on the same inputs)."""
    cache = op._moment_kernels
    if (a0, a1) in cache:
        return cache[(a0, a1)]
    n, P, S = op.n, op.P, op.n_scales
    G = P // 2 + 1
    circ = torch.zeros(S, P, dtype=torch.complex128)
    circ[:, :n] = op._bank64[:, n - 1 :]
    if n > 1:
        circ[:, P - (n - 1) :] = op._bank64[:, : n - 1]
    Kh = torch.fft.fft(circ, dim=-1)  # [S, P]
    # The wavelet spectra decay to ~1e-300: entries below 1e-20 of a scale's largest add
    # nothing at float64 precision but make subnormal products (slow on CPU): zero them.
    Kh = torch.where(Kh.abs() >= 1e-20 * Kh.abs().amax(-1, keepdim=True), Kh, 0)
    Kd = torch.cat([Kh, Kh], dim=-1).contiguous()  # [S, 2P]: Kd[a, f + g] = K̂_a[(f+g) % P]
    shifted = torch.as_strided(Kd[a0:a1], (G, a1 - a0, P), (1, 2 * P, 1))  # K̂[a, f + g]
    # contiguous [G, c, P]: bmm over a strided batch is ~100x slower
    Q = (shifted * Kh[None, a0:a1, :].conj()).contiguous()
    if sum(q.numel() for q in cache.values()) + Q.numel() <= MOMENT_KERNEL_CACHE:
        cache[(a0, a1)] = Q
    return Q


def scalogram_from_moments(
    C: torch.Tensor, op: LagCWT, *, method: str = "auto", scale_chunk: int | None = None
) -> torch.Tensor:
    """Batched :func:`scalogram_from_moment`: ``E[..., a, t] = (M_a C M_a^H)[t, t]`` for a
    batch of lag second-moment matrices ``C: [..., n, n]`` (e.g. one per head). Returns
    ``[..., S, n]`` float64.

    method: ``"matmul"`` (the Toeplitz operator: one GEMM of ``[S n, n] x [n, B n]`` per chunk
    of scales, ``O(B S n^3)``), ``"fft"`` (the double convolution in the frequency domain,
    ``O(B n^2 log n + (B + 1) S n^2)``; see below) or ``"auto"`` (``"fft"`` unless ``n < 32``).
    Both are exact to rounding (tested against each other and :func:`scalogram_from_moment`).
    scale_chunk: scales per batched product (default: as many as keep the temporaries under
    ``2**23`` complex entries).

    FFT form. ``E(a, t) = sum_{u,v} k_a[t-u] conj(k_a[t-v]) C[u, v]`` is the diagonal of a 2-D
    linear convolution, exact as a circular one of size ``P = op.P >= 2n - 1``. With
    ``Ĉ = fft2(C)`` (padded to ``P x P``) and ``K̂_a = fft(k_a)`` (circular layout), the
    diagonal's spectrum is ``s_a[g] = sum_f Ĉ[f + g, -f] K̂_a[f + g] conj(K̂_a[f])`` (indices
    mod ``P``) and ``E(a, t) = irfft(s_a)[t] / P``; only ``g <= P/2`` is needed (``E`` is
    real), one batched product over ``g`` for all matrices and a chunk of scales.
    """
    n = op.n
    if C.ndim < 2 or tuple(C.shape[-2:]) != (n, n):
        raise ValueError(f"C must be [..., {n}, {n}] (got {tuple(C.shape)})")
    if method == "auto":
        method = "fft" if n >= 32 else "matmul"
    lead = C.shape[:-2]
    Cb = C.reshape(-1, n, n).to(torch.float64)
    B = Cb.shape[0]
    S = op.n_scales
    out = torch.empty(B, S, n, dtype=torch.float64)
    if scale_chunk is None:
        per_scale = (op.P // 2 + 1) * op.P if method == "fft" else n * B * n
        scale_chunk = max(1, (1 << 23) // per_scale)
    if method == "matmul":
        parts = _matrix_parts(op)  # [S, n, n] each
        Ccat = Cb.permute(1, 0, 2).reshape(n, B * n)  # [u, (b, v)]
        for a0 in range(0, S, scale_chunk):
            a1 = min(S, a0 + scale_chunk)
            acc = torch.zeros(a1 - a0, n, B, dtype=torch.float64)
            for Mp in parts:
                Mc = Mp[a0:a1]  # [c, t, u]
                Y = (Mc.reshape(-1, n) @ Ccat).view(a1 - a0, n, B, n)  # [c, t, b, v]
                acc += (Y * Mc[:, :, None, :]).sum(-1)
            out[:, a0:a1] = acc.permute(2, 0, 1)
    elif method == "fft":
        P = op.P
        G = P // 2 + 1
        Ch = torch.fft.fft2(Cb.to(torch.complex128), s=(P, P))  # [B, P, P]
        # Bg[g, f, b] = Ĉ[b, (f + g) % P, -f % P]: one gather
        f = torch.arange(P)
        rows = (f[None, :] + torch.arange(G)[:, None]) % P  # [G, P]
        Bg = Ch[:, rows, (-f % P)[None, :]].permute(1, 2, 0).contiguous()  # [G, P, B]
        del Ch
        spec = torch.empty(B, S, G, dtype=torch.complex128)
        for a0 in range(0, S, scale_chunk):
            a1 = min(S, a0 + scale_chunk)
            spec[:, a0:a1] = torch.bmm(_moment_kernels(op, a0, a1), Bg).permute(2, 1, 0)
        out = torch.fft.irfft(spec, n=P, dim=-1)[..., :n] / P
    else:
        raise ValueError(f"method must be 'auto', 'fft' or 'matmul' (got {method!r})")
    return out.clamp_min(0.0).reshape(*lead, S, n)
