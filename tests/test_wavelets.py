"""analysis.wavelets: the batched lag CWT against pywt.cwt, scalograms, dominant scales."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pywt
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.wavelets import (
    FIXED_BANDS,
    LagCWT,
    band_energies,
    cwt,
    default_scales,
    dominant_scales,
    scale_energy,
    scalogram,
    scalogram_from_moment,
    scalogram_from_moments,
)


def _rel(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_default_scales():
    s = default_scales(256)
    assert s.shape == (48,)
    assert float(s[0]) == pytest.approx(1.0) and float(s[-1]) == pytest.approx(128.0)
    r = s[1:] / s[:-1]
    assert torch.allclose(r, r[0].expand_as(r))  # geometric
    with pytest.raises(ValueError, match="T >= 4"):
        default_scales(2)


@pytest.mark.parametrize("method", ["fft", "matmul"])
@pytest.mark.parametrize("wavelet", ["cmor1.5-1.0", "mexh", "morl", "cgau2", "cmor1.0-0.5"])
def test_cwt_matches_pywt_float64(method, wavelet):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40))
    scales = np.array([1.0, 1.7, 3.0, 7.5, 20.0, 33.0])
    ref, _ = pywt.cwt(x, scales, wavelet, method="fft", axis=-1)
    out = cwt(x, scales, wavelet, method=method)
    assert out.shape == ref.shape
    assert out.is_complex() == np.iscomplexobj(ref)
    assert _rel(out.numpy(), ref) < 1e-10


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 70),
    n_scales=st.integers(1, 6),
    axis=st.sampled_from([0, 1, -1]),
    seed=st.integers(0, 10_000),
)
def test_cwt_matches_pywt_property(n, n_scales, axis, seed):
    """float32 torch CWT vs pywt.cwt(method="fft") to 1e-4 relative, any axis and length."""
    rng = np.random.default_rng(seed)
    shape = [2, 3]
    shape.insert(axis % 3 if axis >= 0 else 2, n)
    x = rng.standard_normal(shape)
    scales = np.sort(np.exp(rng.uniform(0.0, math.log(40.0), n_scales)))
    ref, _ = pywt.cwt(x, scales, "cmor1.5-1.0", method="fft", axis=axis)
    out = cwt(torch.tensor(x, dtype=torch.float32), scales, axis=axis)
    assert out.dtype == torch.complex64 and out.shape == ref.shape
    # per-scale relative error (each scale's coefficients against their own norm)
    for k in range(len(scales)):
        num = np.linalg.norm(out[k].numpy() - ref[k])
        assert num <= 1e-4 * np.linalg.norm(ref[k]) + 1e-6


def test_lagcwt_batched_and_matrix_consistent():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 32, dtype=torch.float64)
    op = LagCWT(32, default_scales(32), dtype=torch.float64)
    W = op(x)  # [4, 5, S, 32]
    assert W.shape == (4, 5, op.n_scales, 32)
    W2 = torch.einsum("atu,bcu->bcat", op.matrix(), x.to(torch.complex128))
    assert torch.allclose(W, W2, atol=1e-12)
    # chunking does not change the answer
    assert torch.allclose(op(x, chunk_size=3), W, atol=1e-13)
    opm = LagCWT(32, default_scales(32), dtype=torch.float64, method="matmul")
    assert torch.allclose(opm(x), W, atol=1e-12)


def test_cwt_errors():
    op = LagCWT(16, [1.0, 2.0])
    with pytest.raises(ValueError, match="length 8"):
        op(torch.zeros(3, 8))
    with pytest.raises(ValueError, match="positive"):
        LagCWT(16, [0.0, 1.0])
    with pytest.raises(ValueError, match="discrete wavelet"):
        LagCWT(16, [1.0], "db2")
    with pytest.raises(ValueError, match="too small"):
        LagCWT(16, [0.01])


def test_scalogram_equals_brute_force_pywt():
    """E(a, tau) = mean over documents and queries of |W|^2, with W from pywt itself."""
    rng = np.random.default_rng(1)
    F = rng.standard_normal((6, 8, 24))  # [N, T, lags]
    scales = default_scales(16).numpy()
    W, _ = pywt.cwt(F, scales, "cmor1.5-1.0", method="fft", axis=-1)  # [S, N, T, lags]
    ref = (np.abs(W) ** 2).mean(axis=(1, 2))
    x = torch.tensor(F)
    for method in ("moments", "direct"):
        E = scalogram(x, scales=scales, method=method)
        assert E.shape == (len(scales), 24)
        assert _rel(E.numpy(), ref) < 1e-10
    C = torch.einsum("sit,siu->tu", x, x) / (6 * 8)
    op = LagCWT(24, scales, dtype=torch.float64)
    assert _rel(scalogram_from_moment(C, op).numpy(), ref) < 1e-10


def _packet(n, period, centre, width):
    t = torch.arange(n, dtype=torch.float64)
    return torch.cos(2 * math.pi * t / period) * torch.exp(-((t - centre) ** 2) / (2 * width**2))


@pytest.mark.parametrize("periods", [(4.0, 16.0), (3.0, 9.0), (6.0, 24.0)])
def test_dominant_scales_recover_oscillation_periods(periods):
    """cmor1.5-1.0 has centre frequency 1: a wave packet of period p peaks at scale ~p."""
    n = 64
    g = torch.Generator().manual_seed(0)
    p1, p2 = periods
    x = torch.randn(200, 1, generator=g, dtype=torch.float64) * _packet(
        n, p1, 2 * p1, p1
    ) + torch.randn(200, 1, generator=g, dtype=torch.float64) * _packet(n, p2, 1.5 * p2, p2)
    sc = default_scales(n, 64)
    E = scale_energy(scalogram(x, scales=sc))
    idx = dominant_scales(E, sc, max_scales=2)
    found = [float(sc[i]) for i in idx]
    assert len(found) == 2
    for f, p in zip(found, periods):
        assert abs(math.log(f / p)) < math.log(1.2), (found, periods)


def test_dominant_scales_rules():
    s = torch.tensor([1.0, 1.2, 1.5, 2.0, 3.0, 4.5, 7.0, 10.0])
    E = torch.tensor([0.0, 5.0, 1.0, 4.0, 1.0, 3.0, 2.0, 1.0])  # maxima at 1.2, 2.0, 4.5
    assert dominant_scales(E, s) == [1, 3, 5]
    assert dominant_scales(E, s, max_scales=1) == [1]
    assert dominant_scales(E, s, min_ratio=2.0) == [1, 5]  # 2.0/1.2 < 2
    # end points count against their one neighbour
    assert dominant_scales(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 4.0])) == [0]
    assert dominant_scales(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 4.0])) == [2]
    # ripple below 1% of the maximum is ignored unless asked for
    E2 = torch.tensor([0.005, 0.001, 1.0, 0.5])
    s2 = torch.tensor([1.0, 2.0, 4.0, 8.0])
    assert dominant_scales(E2, s2) == [2]
    assert dominant_scales(E2, s2, min_peak_fraction=0.0) == [0, 2]
    with pytest.raises(ValueError, match="increasing"):
        dominant_scales(E2, s2.flip(0))


def test_band_energies():
    s = torch.tensor([1.0, 5.0, 7.0, 7.5, 19.9, 20.0, 50.0])
    E = torch.tensor([1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0])
    b = band_energies(E, s)
    assert set(b) == set(FIXED_BANDS)
    assert b["fine"] == pytest.approx(3 / 13)  # a <= 7 (7 included)
    assert b["medium"] == pytest.approx(4 / 13)  # 7 < a < 20
    assert b["coarse"] == pytest.approx(6 / 13)  # a >= 20 (20 included)
    assert sum(b.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="zero"):
        band_energies(torch.zeros(7), s)


@pytest.mark.parametrize("wavelet", ["cmor1.5-1.0", "mexh"])
@pytest.mark.parametrize("n", [5, 33, 64])
def test_scalogram_from_moments_batched(wavelet, n):
    """Both forms of the batched scalogram equal scalogram_from_moment matrix by matrix."""
    g = torch.Generator().manual_seed(n)
    X = torch.randn(3, n, 40, generator=g, dtype=torch.float64).cumsum(1)
    C = (X @ X.transpose(1, 2) / 40).reshape(3, 1, n, n)
    op = LagCWT(n, default_scales(max(n, 4))[:20], wavelet, dtype=torch.float64)
    ref = torch.stack([scalogram_from_moment(C[b, 0], op) for b in range(3)])[:, None]
    for method in ("fft", "matmul", "auto"):
        E = scalogram_from_moments(C, op, method=method, scale_chunk=7)
        assert E.shape == (3, 1, op.n_scales, n) and E.dtype == torch.float64
        assert _rel(E.numpy(), ref.numpy()) < 1e-12, method
    with pytest.raises(ValueError, match="method"):
        scalogram_from_moments(C, op, method="x")
    with pytest.raises(ValueError, match="C must be"):
        scalogram_from_moments(C[..., :-1], op)


def test_scalogram_kernels_kept_on_the_operator(monkeypatch):
    """The FFT form's wavelet-side products are kept on the LagCWT (one per scale chunk,
    within MOMENT_KERNEL_CACHE entries): a second call (the next layer) gives the very same
    bits as a fresh operator, and chunks past the cap are recomputed, not kept."""
    from tl_spectral.analysis import wavelets

    n = 48
    g = torch.Generator().manual_seed(1)
    X = torch.randn(4, n, 30, generator=g, dtype=torch.float64)
    C = X @ X.transpose(1, 2) / 30
    op = LagCWT(n, default_scales(n)[:12], dtype=torch.float64)
    E1 = scalogram_from_moments(C, op, method="fft", scale_chunk=5)
    assert sorted(op._moment_kernels) == [(0, 5), (5, 10), (10, 12)]
    E2 = scalogram_from_moments(C.flip(0), op, method="fft", scale_chunk=5)
    fresh = LagCWT(n, default_scales(n)[:12], dtype=torch.float64)
    assert torch.equal(E2, scalogram_from_moments(C.flip(0), fresh, method="fft",
                                                  scale_chunk=5))
    assert torch.equal(E1, scalogram_from_moments(C, fresh, method="fft", scale_chunk=5))
    P = op.P
    monkeypatch.setattr(wavelets, "MOMENT_KERNEL_CACHE", (P // 2 + 1) * 5 * P)
    capped = LagCWT(n, default_scales(n)[:12], dtype=torch.float64)
    assert torch.equal(scalogram_from_moments(C, capped, method="fft", scale_chunk=5), E1)
    assert sorted(capped._moment_kernels) == [(0, 5)]  # the next 5 would pass the cap


def test_matmul_operator_parts_shared_by_operators_alike(monkeypatch):
    """The matmul form's operator parts are built once for every LagCWT of the same wavelet,
    length and scales (a scale POD builds one per layer): the same values as the operator's
    real and imaginary parts, the same scalogram bits as a fresh operator's, none kept past
    MATRIX_PARTS_CACHE entries."""
    from tl_spectral.analysis import wavelets

    n = 40
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, n, 25, generator=g, dtype=torch.float64)
    C = X @ X.transpose(1, 2) / 25
    a, b = (LagCWT(n, default_scales(n), dtype=torch.float32) for _ in range(2))
    pa = wavelets._matrix_parts(a)
    assert wavelets._matrix_parts(b) is pa  # the second operator reuses the first's
    M = a.matrix(torch.complex128)
    assert torch.equal(pa[0], M.real) and torch.equal(pa[1], M.imag)
    E = scalogram_from_moments(C, b, method="matmul")
    monkeypatch.setattr(wavelets, "_MATRIX_PARTS", {})
    monkeypatch.setattr(wavelets, "MATRIX_PARTS_CACHE", 0)
    fresh = LagCWT(n, default_scales(n), dtype=torch.float32)
    assert torch.equal(scalogram_from_moments(C, fresh, method="matmul"), E)
    assert not wavelets._MATRIX_PARTS  # over the cap: not kept
