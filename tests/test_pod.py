"""analysis.pod: snapshot / direct / randomized POD, Theorem 1, T_spec, H*."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.pod import (
    PODResult,
    effective_rank,
    pod,
    pod_from_gram,
    spectral_concentration,
)
from tl_spectral.results import Result

f64 = torch.float64


def _low_rank(N=60, dim=120, rank=6, decay=0.6, noise=0.0, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(N, rank, generator=g, dtype=f64)
    V = torch.linalg.qr(torch.randn(dim, rank, generator=g, dtype=f64))[0]
    s = decay ** torch.arange(rank, dtype=f64)
    X = (U * s) @ V.T + noise * torch.randn(N, dim, generator=g, dtype=f64)
    return X - X.mean(0)


def test_snapshot_direct_randomized_agree():
    X = _low_rank(N=80, dim=200, rank=10, noise=1e-3)
    a = pod(X, method="snapshots")
    b = pod(X, method="direct")
    c = pod(X, 6, method="randomized")
    ref = np.linalg.svd(X.numpy(), compute_uv=False) ** 2 / 80
    assert a.method == "snapshots" and b.method == "direct" and c.method == "randomized"
    assert torch.allclose(a.eigenvalues, b.eigenvalues, rtol=1e-9, atol=1e-14)
    n = a.n_available
    assert np.allclose(a.eigenvalues.numpy(), ref[:n], rtol=1e-8)
    assert torch.allclose(c.eigenvalues, a.eigenvalues[:6], rtol=1e-8)
    assert not c.spectrum_complete and a.spectrum_complete
    assert c.total_energy == pytest.approx(a.total_energy, rel=1e-12)
    # same modes up to sign convention (the sign is fixed identically)
    for r in (b, c):
        assert torch.allclose(r.modes[:6], a.modes[:6], atol=1e-8)
        assert torch.allclose(r.coefficients[:, :6], a.coefficients[:, :6], atol=1e-8)


def test_direct_path_when_n_exceeds_dim():
    X = _low_rank(N=50, dim=12, rank=12, decay=0.8)
    r = pod(X)  # N > dim: direct SVD
    assert r.method == "direct"
    assert torch.allclose(r.eigenvalues, pod(X, method="snapshots").eigenvalues, rtol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    N=st.integers(3, 30),
    dim=st.integers(2, 40),
    seed=st.integers(0, 1000),
    method=st.sampled_from(["snapshots", "direct"]),
)
def test_theorem1_tail_energy_and_orthonormal_modes(N, dim, seed, method):
    """MSE of the rank-K reconstruction = sum_{k>K} lambda_k, for every K; modes orthonormal."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, dim, generator=g, dtype=f64) * torch.rand(dim, generator=g, dtype=f64)
    r = pod(X, method=method, center=True)
    Xc = X - X.mean(0)
    eye = torch.eye(r.rank, dtype=f64)
    assert torch.allclose(r.modes @ r.modes.T, eye, atol=1e-8)
    assert r.n_available <= min(N - 1, dim)
    total = float((Xc**2).sum()) / N
    assert r.total_energy == pytest.approx(total, rel=1e-10)
    for K in range(r.rank + 1):
        mse = r.reconstruction_mse(X, K)
        assert mse == pytest.approx(r.tail_energy(K), rel=1e-7, abs=1e-10 * total)
    assert r.reconstruction_mse(X, r.rank) == pytest.approx(0.0, abs=1e-9 * total)


def test_coefficients_and_centering():
    X = _low_rank(N=40, dim=30, rank=5) + 3.0  # non-zero mean
    r = pod(X, center=True)
    assert r.mean is not None and torch.allclose(r.mean, X.mean(0))
    assert r.centered and r.n_available == 5
    Xc = X - X.mean(0)
    assert torch.allclose(r.coefficients, Xc @ r.modes.T, atol=1e-10)
    assert torch.allclose(r.reconstruct(), X, atol=1e-10)
    # without centering the mean is a mode: rank 6, and the data are not flagged mean-free
    r2 = pod(X)
    assert not r2.centered and r2.n_available == 6


def test_rank_semantics():
    X = _low_rank(N=40, dim=60, rank=8, decay=0.5)
    full = pod(X)
    assert full.rank == full.n_available == 8
    assert pod(X, -1).rank == 8
    assert pod(X, 3).rank == 3 and pod(X, 3).n_available == 8  # eigenvalues always in full
    r = pod(X, 0.9)
    cum = full.cumulative_energy
    K = int(torch.nonzero(cum >= 0.9)[0]) + 1
    assert r.rank == K
    with pytest.raises(ValueError, match="exceeds the 8 nonzero POD modes"):
        pod(X, 9)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        pod(X, 1.5)
    with pytest.raises(ValueError, match="int >= 1"):
        pod(X, 0)
    with pytest.raises(ValueError, match="needs an int rank"):
        pod(X, 0.5, method="randomized")
    with pytest.raises(ValueError, match="exceeds min"):
        pod(X, 41, method="randomized")


def test_input_errors():
    with pytest.raises(ValueError, match="at least N=2"):
        pod(torch.randn(1, 10))
    with pytest.raises(ValueError, match="2-D"):
        pod(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="NaN"):
        pod(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="zero energy"):
        pod(torch.zeros(5, 7))
    with pytest.raises(ValueError, match="method must be"):
        pod(torch.randn(5, 7), method="qr")


def test_effective_rank_and_saturation():
    lam = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.5])
    assert effective_rank(lam, 0.1) == (3, True)
    assert effective_rank(lam[:2], 0.1, total_energy=10.0) == (2, False)  # not reached
    # white-noise ensemble: every mode is needed -> saturated at N - 1
    X = torch.randn(10, 500, dtype=f64, generator=torch.Generator().manual_seed(0))
    r = pod(X, center=True, epsilon=0.01)
    assert r.H_star == 9 and r.H_star_saturated and r.H_star_str == "≥ 9"
    # low-rank ensemble: H* resolved well below N - 1
    r2 = pod(_low_rank(N=40, dim=50, rank=4, decay=0.3))
    assert not r2.H_star_saturated and r2.H_star <= 4
    assert r2.h_star(0.5) == (effective_rank(r2.eigenvalues, 0.5)[0], False)


def test_effective_rank_exact_values():
    lam = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.5])
    # cumulative fractions 0.5, 0.8, 0.9, 0.95, 1.0
    assert effective_rank(lam, 0.5)[0] == 1
    assert effective_rank(lam, 0.2)[0] == 2
    assert effective_rank(lam, 0.1)[0] == 3
    assert effective_rank(lam, 0.0)[0] == 5


def test_spectral_concentration_power_law():
    k = torch.arange(1, 200, dtype=f64)
    for beta in (0.5, 1.0, 2.0):
        lam = 3.0 * k ** (-beta)
        fit = spectral_concentration(lam)
        assert fit["beta"] == pytest.approx(beta, rel=1e-10)
        assert fit["T_spec"] == pytest.approx(1 / beta, rel=1e-10)
        assert fit["r2"] == pytest.approx(1.0)
        cum = torch.cumsum(lam, 0) / lam.sum()
        assert fit["n_fit"] == max(2, int(torch.nonzero(cum >= 0.99)[0]) + 1)
    one = spectral_concentration(torch.tensor([2.0]))
    assert one["T_spec"] == 0.0 and math.isinf(one["beta"])
    flat = spectral_concentration(torch.ones(5))
    assert flat["beta"] == 0.0 and math.isinf(flat["T_spec"])
    with pytest.raises(ValueError):
        spectral_concentration(torch.zeros(3))


def test_pod_from_gram_matches_pod():
    X = _low_rank(N=30, dim=45, rank=7)
    K = X @ X.T / 30
    r = pod_from_gram(K, lambda B: B.T @ X, 45, rank=4)
    ref = pod(X, 4)
    assert torch.allclose(r.eigenvalues, ref.eigenvalues)
    assert torch.allclose(r.modes, ref.modes, atol=1e-10)
    with pytest.raises(ValueError, match="exceeds"):
        pod_from_gram(K, lambda B: B.T @ X, 45, rank=8)
    assert pod_from_gram(K, lambda B: B.T @ X, 45, rank=8, clip_rank=True).rank == 7


def test_float32_input_float64_gram():
    X = _low_rank(N=50, dim=300, rank=20, decay=0.8).to(torch.float32)
    r = pod(X)  # Gram in float64
    ref = np.linalg.svd(X.double().numpy(), compute_uv=False) ** 2 / 50
    assert np.allclose(r.eigenvalues.numpy(), ref[: r.n_available], rtol=1e-8)


def test_result_roundtrip_and_dict(tmp_path):
    r = pod(_low_rank(), 3)
    path = r.save(tmp_path / "pod.safetensors")
    back = Result.load(path)
    assert isinstance(back, PODResult)
    assert torch.equal(back.eigenvalues, r.eigenvalues) and torch.equal(back.modes, r.modes)
    assert back.mean is None and back.H_star == r.H_star and back.T_spec == r.T_spec
    d = r.to_dict()
    assert d["rank"] == 3 and len(d["eigenvalues"]) == r.n_available
    import json

    json.dumps(d)


def test_plot_spectrum():
    fig = pod(_low_rank(N=30, dim=40, rank=10, decay=0.7, noise=1e-3)).plot_spectrum()
    assert fig.axes


# ----------------------------------------------------------------------------- randomized accuracy
def _with_spectrum(N, dim, lam, seed):
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(N, lam.numel(), generator=g, dtype=f64))[0]
    V = torch.linalg.qr(torch.randn(dim, lam.numel(), generator=g, dtype=f64))[0]
    return (U * (lam * N).sqrt()) @ V.T


def _spectrum(kind: str, n: int) -> torch.Tensor:
    k = torch.arange(1, n + 1, dtype=f64)
    if kind == "flat":  # λ10/λ1 = 0.83 over the top 20, then a 1/k tail
        return torch.where(k <= 20, k**-0.081, 20**-0.081 * (k / 20) ** -1.0)
    if kind == "flat_all":  # λ10/λ1 = 0.83 and no decay to speak of anywhere
        return k**-0.081
    return k**-2.0  # steep: λ10/λ1 = 0.01


@settings(max_examples=6, deadline=None)
@given(kind=st.sampled_from(["flat", "flat_all", "steep"]), seed=st.integers(0, 1000),
       sketch_seed=st.integers(0, 3), k=st.sampled_from([5, 10]))
def test_randomized_top_k_meets_the_accuracy_target(kind, seed, sketch_seed, k):
    N, dim = 120, 180
    X = _with_spectrum(N, dim, _spectrum(kind, N), seed)
    exact = pod(X, method="snapshots")
    r = pod(X, k, method="randomized", seed=sketch_seed)  # default tol = 1e-3
    rel = ((r.eigenvalues - exact.eigenvalues[:k]).abs() / exact.eigenvalues[:k]).max()
    assert float(rel) <= 1e-3
    assert 0.0 <= r.eigen_rel_error <= 1e-3
    assert exact.eigen_rel_error == 0.0
    torch.testing.assert_close(r.total_energy, exact.total_energy)


def test_randomized_fixed_iterations_underestimate_flat_spectra():
    # the former defaults (10 oversamples, 4 power iterations, no target) miss a flat top by
    # percents; the accuracy target fixes it, and leaves steep spectra as they were
    N, dim = 300, 400
    X = _with_spectrum(N, dim, _spectrum("flat", N), 1)
    ex = torch.linalg.svdvals(X)[:10] ** 2 / N
    fixed = pod(X, 10, method="randomized", tol=None)
    adaptive = pod(X, 10, method="randomized")
    assert float(((ex - fixed.eigenvalues) / ex).max()) > 5e-3
    assert float(((ex - adaptive.eigenvalues).abs() / ex).max()) <= 1e-3
    assert math.isnan(fixed.eigen_rel_error)
    Xs = _with_spectrum(N, dim, _spectrum("steep", N), 1)
    a, b = pod(Xs, 10, method="randomized", tol=None), pod(Xs, 10, method="randomized")
    assert torch.equal(a.eigenvalues, b.eigenvalues)  # converged within the 4 iterations


def test_randomized_warns_when_the_budget_is_too_small():
    X = _with_spectrum(200, 300, _spectrum("flat_all", 200), 2)
    with pytest.warns(UserWarning, match="tol=0.001"):
        r = pod(X, 10, method="randomized", n_power_iter=0, max_power_iter=3)
    assert r.eigen_rel_error > 1e-3 or math.isinf(r.eigen_rel_error)
    with pytest.raises(ValueError, match="tol"):
        pod(X, 10, method="randomized", tol=0.0)


def test_randomized_result_round_trip_keeps_the_error_estimate(tmp_path):
    X = _with_spectrum(120, 150, _spectrum("steep", 120), 3)
    r = pod(X, 6, method="randomized")
    back = Result.load(r.save(tmp_path / "rp"))
    assert back.eigen_rel_error == r.eigen_rel_error
