"""analysis.scale_pod / coherence: scale-selective POD against brute force and synthetic
fields of known structure; head allocation; results and plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import pywt
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.coherence import (
    coherence_from_spectrum,
    cross_coherence,
    cross_spectrum,
    default_queries,
)
from tl_spectral.analysis.pod import pod
from tl_spectral.analysis.scale_pod import (
    ScalePODLayer,
    ScalePODOptions,
    ScalePODResult,
    allocate_heads,
    gaussian_lag_window,
    lag_fields,
    scale_pod,
    scale_pod_layer,
)
from tl_spectral.analysis.wavelets import LagCWT, default_scales
from tl_spectral.results import Result

CENTER = ScalePODOptions(center=True)

f64 = torch.float64


def _causal_patterns(N, T, seed=0, temp=2.0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    mask = torch.triu(torch.full((T, T), -torch.inf, dtype=dtype), 1)
    return torch.softmax(torch.randn(N, T, T, generator=g, dtype=dtype) * temp + mask, -1)


# ----------------------------------------------------------------------------- lag fields
def test_lag_fields_brute_force():
    A = torch.randn(2, 6, 6, dtype=f64)
    F, lags = lag_fields(A)
    assert lags.tolist() == list(range(6))
    Fb, lb = lag_fields(A, causal=False)
    assert lb.tolist() == list(range(-5, 6))
    Ft, lt = lag_fields(A, max_lag=2)
    assert lt.tolist() == [0, 1, 2]
    for s in range(2):
        for i in range(6):
            for k, tau in enumerate(lags.tolist()):
                want = A[s, i, i - tau] if tau <= i else 0.0
                assert F[s, i, k] == want
                if tau <= 2:
                    assert Ft[s, i, k] == want
            for k, tau in enumerate(lb.tolist()):
                j = i + tau  # bidirectional: tau = j - i
                assert Fb[s, i, k] == (A[s, i, j] if 0 <= j < 6 else 0.0)
    with pytest.raises(ValueError, match="max_lag"):
        lag_fields(A, max_lag=6)


def test_gaussian_window():
    lags = torch.arange(-3, 30)
    g = gaussian_lag_window(lags, 8.0)
    assert float(g[lags == 8]) == 1.0
    assert float(g[lags == 12]) == pytest.approx(math.exp(-0.5))  # sigma = a/2 = 4
    assert float(gaussian_lag_window(lags, 8.0, absolute=True)[lags == -3]) == pytest.approx(
        float(g[lags == 3])
    )


# ----------------------------------------------------------------------------- brute force
@pytest.mark.parametrize("causal", [True, False])
def test_layer_matches_brute_force(causal):
    """Whole-field POD = POD of the raw (i, j) fluctuations (lag coordinates only permute
    and zero-pad); band POD = POD of explicitly formed windowed snapshots; scalogram =
    mean |W|^2 with W from pywt.cwt itself."""
    N, T = 24, 32
    A = (
        _causal_patterns(N, T, seed=1)
        if causal
        else torch.softmax(
            torch.randn(N, T, T, dtype=f64, generator=torch.Generator().manual_seed(1)), -1
        )
    )
    F, lags = lag_fields(A, causal=causal)
    r = scale_pod_layer(F, lags, n_modes=4, coherence_queries=4, options=CENTER)
    assert r.causal == causal
    u = A - A.mean(0)
    ref = pod(u.reshape(N, -1))
    assert torch.allclose(r.full_eigenvalues, ref.eigenvalues, rtol=1e-9, atol=1e-15)
    assert r.H_star == ref.H_star and r.T_spec == pytest.approx(ref.T_spec)
    Fc = F - F.mean(0)
    scales = default_scales(T).numpy()
    W, _ = pywt.cwt(Fc.numpy(), scales, "cmor1.5-1.0", method="fft", axis=-1)
    E_ref = (np.abs(W) ** 2).mean(axis=(1, 2))
    assert np.allclose(r.scalogram.numpy(), E_ref, rtol=1e-8, atol=1e-14 * E_ref.max())
    assert np.allclose(r.scale_energy.numpy(), E_ref.sum(-1), rtol=1e-8)
    assert r.n_bands >= 1
    for b, band in enumerate(r.bands):
        g = gaussian_lag_window(lags, band["scale"])
        m = g > 1e-4
        X = (Fc * g)[:, :, m].reshape(N, -1)
        pb = pod(X)
        assert torch.equal(r.band_lags[str(b)], lags[m])
        assert band["dim"] == X.shape[1] and band["sigma"] == band["scale"] / 2
        assert torch.allclose(r.band_eigenvalues[str(b)], pb.eigenvalues, rtol=1e-9, atol=1e-15)
        k = r.band_modes[str(b)].shape[0]
        assert torch.allclose(r.band_modes[str(b)].reshape(k, -1), pb.modes[:k], atol=1e-9)
        assert torch.allclose(r.band_coefficients[str(b)], pb.coefficients[:, :k], atol=1e-9)
        assert band["H_star"] == pb.H_star
    # coherence equals the standalone function on the same queries
    q = r.coherence_queries
    op = LagCWT(F.shape[-1], default_scales(T), dtype=f64)
    assert torch.allclose(r.coherence.double(), cross_coherence(Fc[:, q, :], op), atol=1e-6)


def test_float32_fields_agree_with_float64():
    A = _causal_patterns(20, 32, seed=3)
    F, lags = lag_fields(A)
    r64 = scale_pod_layer(F, lags, coherence_queries=None, options=CENTER)
    r32 = scale_pod_layer(F.float(), lags, coherence_queries=None, options=CENTER)
    assert r32.dominant_scales == pytest.approx(r64.dominant_scales)
    assert torch.allclose(r32.full_eigenvalues[:10], r64.full_eigenvalues[:10], rtol=1e-4)
    assert torch.allclose(r32.scale_energy, r64.scale_energy, rtol=1e-4)
    k = r32.full_modes.shape[0]
    M = r32.full_modes.reshape(k, -1).double()
    assert torch.allclose(M @ M.T, torch.eye(k, dtype=f64), atol=1e-4)


# ----------------------------------------------------------------------------- synthetic
def _packet(T, period, centre, width):
    t = torch.arange(T, dtype=f64)
    return torch.cos(2 * math.pi * t / period) * torch.exp(-((t - centre) ** 2) / (2 * width**2))


def _orthogonal_coeffs(N, sds, seed=0):
    """Mean-free coefficient columns, exactly orthogonal, with the given norms / sqrt(N)."""
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(N, len(sds), generator=g, dtype=f64)
    Z = Z - Z.mean(0)
    Q, _ = torch.linalg.qr(Z)
    return Q * torch.tensor(sds, dtype=f64) * math.sqrt(N)


def test_synthetic_recovers_scales_ranks_and_modes():
    """Two wave packets (periods 4 and 16) plus a Gaussian bump, each with its own query
    profile: the dominant scales are the periods, the rank is 3, the modes are the
    structures, and each band's rank is at most 3."""
    N, T = 40, 64
    i = torch.arange(T, dtype=f64)[:, None]
    structures = [
        _packet(T, 4.0, 8.0, 4.0)[None, :] * torch.ones(T, 1, dtype=f64),  # period 4
        _packet(T, 16.0, 24.0, 12.0)[None, :] * torch.cos(math.pi * i / T),  # period 16
        torch.exp(-((torch.arange(T, dtype=f64) - 40.0) ** 2) / (2 * 3.0**2))[None, :]
        * torch.sin(2 * math.pi * i / T),  # a bump at lag 40
    ]
    B = torch.stack([s.reshape(-1) for s in structures])  # [3, T*T]
    Bo = torch.linalg.qr(B.T)[0].T  # orthonormal structures spanning the same space
    c = _orthogonal_coeffs(N, [3.0, 2.0, 1.0])
    F = (c @ Bo).reshape(N, T, T)
    r = scale_pod_layer(F, coherence_queries=8, options=ScalePODOptions(max_dominant=2))
    assert r.full["n_available"] == 3  # rank recovered exactly
    assert r.full["rank"] == 3
    # modes = the orthonormal structures (coefficients orthogonal => POD diagonalises)
    assert torch.allclose(r.full_eigenvalues, torch.tensor([9.0, 4.0, 1.0], dtype=f64))
    for k in range(3):
        mode = r.full_modes[k].reshape(-1)
        assert abs(float(mode @ Bo[k])) == pytest.approx(1.0, abs=1e-9)
    assert r.H_star == 2  # (9 + 4) / 14 >= 0.9
    # energies of the packets dominate: a* near 4 and 16
    found = r.dominant_scales
    assert len(found) == 2
    assert abs(math.log(found[0] / 4.0)) < math.log(1.2)
    assert abs(math.log(found[1] / 16.0)) < math.log(1.2)
    for band in r.bands:
        assert band["n_available"] <= 3
    # H* is not saturated with 40 documents and rank 3
    assert not r.H_star_saturated


def test_synthetic_band_isolates_its_structure():
    """A fine packet at lag ~4 and a coarse packet at lag ~60: the fine band's window
    (lags <= 12) sees only the fine structure, so its POD is rank 1 with that mode."""
    N, T = 30, 64
    fine = _packet(T, 4.0, 4.0, 2.0)
    coarse = _packet(T, 16.0, 56.0, 4.0)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(N, generator=g, dtype=f64)
    b = torch.randn(N, generator=g, dtype=f64)
    F = a[:, None, None] * fine + b[:, None, None] * coarse * torch.ones(T, 1, dtype=f64)
    r = scale_pod_layer(F, coherence_queries=None, options=CENTER)
    idx = int(np.argmin([abs(math.log(x / 4.0)) for x in r.dominant_scales]))
    band = r.bands[idx]
    assert band["lag_max"] < 40
    assert band["n_available"] == 1
    lags = r.band_lags[str(idx)]
    w = gaussian_lag_window(lags, band["scale"])
    want = (fine[lags] * w).expand(T, -1).reshape(-1)
    got = r.band_modes[str(idx)][0].reshape(-1)
    assert abs(float(got @ want / want.norm())) == pytest.approx(1.0, abs=1e-9)


# ----------------------------------------------------------------------------- coherence
@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 8), Q=st.integers(1, 5), n=st.integers(4, 24), seed=st.integers(0, 999))
def test_coherence_in_unit_interval(N, Q, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, Q, n, generator=g, dtype=f64)
    op = LagCWT(n, default_scales(max(n, 4), 6), dtype=f64)
    G = cross_spectrum(x, op)
    assert torch.allclose(G, cross_spectrum(x, op, method="direct"), atol=1e-10 * G.abs().max())
    gam = coherence_from_spectrum(G)
    assert gam.shape == (6, Q, Q)
    assert float(gam.min()) >= 0.0 and float(gam.max()) <= 1.0
    assert torch.allclose(gam, gam.transpose(1, 2))


def test_coherence_phase_locked_is_one_and_independent_is_low():
    N, Q, n = 50, 4, 32
    g = torch.Generator().manual_seed(0)
    common = torch.randn(N, 1, n, generator=g, dtype=f64)
    amp = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=f64)[None, :, None]
    gam = cross_coherence(common * amp)  # every query follows the same pattern
    assert torch.allclose(gam, torch.ones_like(gam), atol=1e-10)
    indep = cross_coherence(torch.randn(N, Q, n, generator=g, dtype=f64))
    off = indep[:, ~torch.eye(Q, dtype=torch.bool)]
    assert float(off.mean()) < 0.2
    # a query with no fluctuation gets gamma = 0, not NaN
    x = torch.randn(N, Q, n, generator=g, dtype=f64)
    x[:, 0] = 0.0
    gz = cross_coherence(x)
    assert torch.isfinite(gz).all() and float(gz[:, 0].abs().max()) == 0.0


def test_default_queries():
    assert default_queries(256).tolist() == list(range(15, 256, 16))
    assert default_queries(10, 16).tolist() == list(range(10))


# ----------------------------------------------------------------------------- errors
def test_errors():
    F = torch.randn(3, 8, 8)
    with pytest.raises(ValueError, match="at least N=2"):
        scale_pod_layer(F[:1])
    with pytest.raises(ValueError, match="unequal length"):
        scale_pod_layer([torch.randn(8, 8), torch.randn(7, 8)])
    with pytest.raises(ValueError, match="consecutive"):
        scale_pod_layer(F, torch.tensor([0, 1, 2, 3, 4, 5, 6, 8]))
    with pytest.raises(ValueError, match="8 entries"):
        scale_pod_layer(F, torch.arange(7))
    with pytest.raises(ValueError, match=r"\[N documents, T queries, n_lags\]"):
        scale_pod_layer(torch.randn(3, 8))
    with pytest.raises(ValueError, match="zero fluctuation"):
        scale_pod_layer(torch.ones(3, 8, 8), options=CENTER)
    with pytest.raises(ValueError, match="NaN"):
        scale_pod_layer(torch.full((3, 8, 8), float("nan")))
    with pytest.raises(ValueError, match="unequal shape across layers"):
        scale_pod([torch.randn(3, 8, 8), torch.randn(3, 8, 6)], n_heads=2)
    with pytest.raises(ValueError, match="budget"):
        scale_pod([F, F], n_heads=2, head_budget=1, options=CENTER)


# ----------------------------------------------------------------------------- allocation
def test_allocate_heads_examples():
    # quotas 10.84, 10.84, 6.58 x 4: floors 10, 10, 6, 6, 6, 6 (44), then largest remainders
    assert allocate_heads([150, 150, 91, 91, 91, 91], 48) == [11, 11, 7, 7, 6, 6]
    assert allocate_heads([1, 1, 1], 6) == [2, 2, 2]
    assert allocate_heads([100, 1, 1], 6) == [4, 1, 1]  # floor of 1 each
    assert allocate_heads([0, 0], 4) == [2, 2]
    with pytest.raises(ValueError, match="budget"):
        allocate_heads([1, 2, 3], 2)


@settings(max_examples=25, deadline=None)
@given(h=st.lists(st.integers(1, 1000), min_size=1, max_size=12), extra=st.integers(0, 60))
def test_allocate_heads_properties(h, extra):
    budget = len(h) + extra
    n = allocate_heads(h, budget)
    assert sum(n) == budget and min(n) >= 1 and all(isinstance(x, int) for x in n)
    q = [budget * x / sum(h) for x in h]
    if min(q) >= 1:  # the floor of 1 never binds: largest-remainder apportionment
        assert all(abs(a - b) < 1 for a, b in zip(n, q))
    # monotone: a layer with a larger H* never gets fewer heads
    for i in range(len(h)):
        for j in range(len(h)):
            if h[i] > h[j]:
                assert n[i] >= n[j]


# ----------------------------------------------------------------------------- model level
@pytest.fixture(scope="module")
def model_result():
    fields = []
    for layer in range(3):
        A = _causal_patterns(16, 32, seed=10 + layer, temp=1.0 + layer).float()
        F, lags = lag_fields(A, max_lag=24)
        fields.append(F)
    return scale_pod(fields, lags, n_heads=4, coherence_queries=6, n_modes=3, options=CENTER)


def test_model_result_table_and_roundtrip(model_result, tmp_path):
    res = model_result
    assert isinstance(res, ScalePODResult) and res.n_layers == 3
    rec = [row["recommended"] for row in res.allocation]
    assert sum(rec) == res.head_budget == 12 and min(rec) >= 1
    assert [row["uniform"] for row in res.allocation] == [4, 4, 4]
    hs = [lay.H_star for lay in res.layers]
    assert rec == allocate_heads(hs, 12)
    d = res.to_dict(include_curves=True)
    json.dumps(d)
    assert len(d["layers"]) == 3 and "allocation" in d
    assert len(res.to_rows()) == 3
    path = res.save(tmp_path / "spod.safetensors")
    back = Result.load(path)
    assert isinstance(back, ScalePODResult)
    for a, b in zip(res.layers, back.layers):
        assert isinstance(b, ScalePODLayer)
        assert torch.equal(a.scalogram, b.scalogram)
        assert torch.equal(a.coherence, b.coherence)
        assert a.bands == b.bands and a.full == b.full
        for k in a.band_modes:
            assert torch.equal(a.band_modes[k], b.band_modes[k])
    assert back.allocation == res.allocation
    one = res.layers[0].save(tmp_path / "layer.safetensors")
    assert torch.equal(Result.load(one).full_eigenvalues, res.layers[0].full_eigenvalues)
    p = res.layers[0].pod_result(0)
    assert p.rank == res.layers[0].band_modes["0"].shape[0]


def test_plots(model_result):
    import matplotlib.pyplot as plt

    layer = model_result.layers[1]
    figs = [
        layer.plot_scalogram(),
        layer.plot_scale_energy(),
        layer.plot_spectra(),
        layer.plot_band_modes(),
        layer.plot_mode_profiles(),
        layer.plot_coherence(),
        model_result.plot_tspec_hstar(),
        model_result.plot_scale_energies(),
        layer.pod_result().plot_spectrum(),
    ]
    for fig in figs:
        assert fig.axes
        plt.close(fig)


def test_saturation_cap_follows_centering():
    """White-noise fields need every mode: H* saturates at N - 1 for fluctuations, at N when
    the fields passed are not mean-free (center=False on raw fields)."""
    g = torch.Generator().manual_seed(0)
    F = torch.randn(6, 8, 8, generator=g, dtype=f64) + 1.0
    exact = ScalePODOptions(center=True, epsilon=0.0)
    fl = scale_pod_layer(F, coherence_queries=None, options=exact)
    assert fl.full["n_available"] == 5 and fl.H_star_saturated
    assert fl.full["H_star_str"] == "≥ 5"
    raw = scale_pod_layer(F, coherence_queries=None,
                          options=ScalePODOptions(center=False, epsilon=0.0))
    assert raw.full["n_available"] == 6 and raw.full["H_star_str"] == "≥ 6"
