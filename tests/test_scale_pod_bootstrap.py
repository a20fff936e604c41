"""Bootstrap of scale-POD statistics from document Grams (analysis.scale_pod): the Grams give
the same band shares, H* and T_spec as scale_pod_layer on the full ensemble, and on a
resample the same as running the analysis on the resampled (re-centred) fields."""

from __future__ import annotations

import math

import pytest
import torch

from tl_spectral.analysis.scale_pod import (
    band_energy_operators,
    pod_statistics,
    scale_pod_bootstrap,
    scale_pod_grams,
    scale_pod_layer,
)
from tl_spectral.analysis.wavelets import LagCWT, default_scales


def _fields(N=12, T=16, L=16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    F = torch.randn(N, T, L, generator=g, dtype=torch.float64)
    F = F * torch.linspace(2.0, 0.2, L, dtype=torch.float64)  # some structure over lags
    return F - F.mean(0)


def test_band_operator_energy_equals_scalogram():
    """⟨x, P_b x⟩ summed over bands and scales equals Σ_a E(a) of the CWT of x (brute force)."""
    L = 16
    x = torch.randn(5, L, dtype=torch.float64)
    s = default_scales(2 * L)
    P = band_energy_operators(L, s)
    W = LagCWT(L, s, dtype=torch.float64)(x)  # [5, S, L]
    E_a = (W.abs() ** 2).sum(0).sum(-1)  # [S]
    lhs = sum(float(torch.einsum("bi,ij,bj->", x, p, x)) for p in P.values())
    assert lhs == pytest.approx(float(E_a.sum()), rel=1e-10)


def test_full_ensemble_matches_scale_pod_layer():
    F = _fields()
    lay = scale_pod_layer(F, coherence_queries=None)
    d = pod_statistics(scale_pod_grams(F))
    for k, v in lay.band_energy.items():
        assert d[f"E_{k}"] == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert d["H_star"] == lay.H_star
    assert d["T_spec_99"] == pytest.approx(lay.T_spec, rel=1e-9)
    assert d["n_fit_99"] == lay.full["tspec_n_fit"]


def test_resample_matches_analysis_of_resampled_fields():
    """Repeated documents, re-centred about the resample's mean: the Gram route is exact."""
    F = _fields(seed=1)
    idx = torch.tensor([0, 0, 3, 5, 5, 5, 7, 8, 9, 11, 2, 2])
    Fr = F[idx] - F[idx].mean(0)
    lay = scale_pod_layer(Fr, coherence_queries=None)
    d = pod_statistics(scale_pod_grams(F), idx)
    for k, v in lay.band_energy.items():
        assert d[f"E_{k}"] == pytest.approx(v, rel=1e-9, abs=1e-12)
    assert d["H_star"] == lay.H_star
    assert d["T_spec_99"] == pytest.approx(lay.T_spec, rel=1e-8)


def test_fit_range_and_overshoot():
    """Fitting over fewer modes uses fewer points; the overshoot is exp(intercept) / λ_1."""
    F = _fields(N=20, seed=2)
    d = pod_statistics(scale_pod_grams(F))
    assert d["n_fit_90"] <= d["n_fit_95"] <= d["n_fit_99"]
    assert all(math.isfinite(d[f"fit_overshoot_{e}"]) and d[f"fit_overshoot_{e}"] > 0
               for e in (90, 95, 99))


def test_bootstrap_interval_contains_spread_and_is_seeded():
    F = _fields(N=10, T=8, L=8, seed=3)
    a = scale_pod_bootstrap(F, n_resamples=30, seed=4)
    b = scale_pod_bootstrap(F, n_resamples=30, seed=4)
    assert a == b
    for k in ("E_fine", "E_medium", "E_coarse"):
        assert a[k]["low"] <= a[k]["high"]
        assert 0.0 <= a[k]["low"] and a[k]["high"] <= 1.0
    assert a["E_fine"]["n_resamples"] == 30 and a["E_fine"]["seed"] == 4


def test_group_jackknife_of_a_mean_matches_its_formula():
    """Delete-a-group jackknife of the mean: estimate = mean; se from the group means."""
    from scipy.stats import t as student_t

    from tl_spectral_studies.scale_pod import group_jackknife

    x = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    jk = group_jackknife(lambda i: x[i].mean(), 40, n_groups=8, seed=1)
    groups = torch.randperm(40, generator=torch.Generator().manual_seed(1)).chunk(8)
    reps = torch.stack([x[torch.tensor([j for j in range(40) if j not in set(g.tolist())])]
                        .mean() for g in groups])
    se = torch.sqrt(7 / 8 * ((reps - reps.mean()) ** 2).sum())
    assert float(jk["estimate"]) == pytest.approx(float(x.mean()))
    assert float(jk["se"]) == pytest.approx(float(se))
    q = student_t.ppf(0.975, 7)
    assert float(jk["high"] - jk["estimate"]) == pytest.approx(q * float(se))
