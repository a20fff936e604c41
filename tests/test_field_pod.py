"""The field-POD study's bootstrap statistics (tl_spectral_studies.field_pod): exact against
the scale POD of the resampled ensemble itself, and its tables / verdict rules."""

from __future__ import annotations

import math

import pytest
import torch

from tl_spectral.analysis.scale_pod import ScalePODOptions, scale_pod_layer
from tl_spectral_studies.field_pod import STATS, LayerBootstrap, differs, table_markdown, verdict

CENTER = ScalePODOptions(center=True)


def _fields(N=10, T=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    # lag profiles with structure at a few scales plus noise, causal layout
    tau = torch.arange(T, dtype=torch.float64)
    base = torch.cos(2 * math.pi * tau / 5)[None, None] * torch.randn(N, T, 1, generator=g,
                                                                    dtype=torch.float64)
    F = (base + 0.3 * torch.randn(N, T, T, generator=g, dtype=torch.float64)).float()
    i = torch.arange(T)[:, None]
    F = F * (tau[None, :] <= i).float()  # zero where tau > i
    return F - F.mean(0)


def _direct(F: torch.Tensor) -> torch.Tensor:
    lay = scale_pod_layer(F, coherence_queries=None, options=CENTER)
    peak = float(lay.scales[int(lay.scale_energy.argmax())])
    b = lay.band_energy
    return torch.tensor([peak, b["fine"], b["medium"], b["coarse"], lay.T_spec, lay.H_star],
                        dtype=torch.float64), lay


def test_full_ensemble_statistics_equal_scale_pod_layer():
    F = _fields()
    bs = LayerBootstrap(F, torch.arange(F.shape[-1]))
    want, lay = _direct(F)
    got = bs.stats(torch.arange(F.shape[0]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # the scale energy itself, up to float32 round-off
    torch.testing.assert_close(bs.scale_energy(torch.arange(F.shape[0])), lay.scale_energy,
                               rtol=1e-4, atol=1e-9 * float(lay.scale_energy.max()))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resample_statistics_equal_scale_pod_of_the_resample(seed):
    """Repeated documents and recentring about the resample's mean: E'(a) and the POD of
    centred_gram_resample equal scale_pod_layer run on the resampled fields themselves."""
    F = _fields(seed=seed)
    idx = torch.randint(0, F.shape[0], (F.shape[0],), generator=torch.Generator().manual_seed(seed))
    bs = LayerBootstrap(F, torch.arange(F.shape[-1]))
    want, lay = _direct(F[idx])
    torch.testing.assert_close(bs.stats(idx), want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(bs.scale_energy(idx), lay.scale_energy, rtol=1e-4,
                               atol=1e-9 * float(lay.scale_energy.max()))
    # and the check can fail: another resample gives another scale energy
    other = torch.roll(idx, 1) % F.shape[0] if len(set(idx.tolist())) > 1 else idx
    if not torch.equal(torch.bincount(other, minlength=10), torch.bincount(idx, minlength=10)):
        assert not torch.allclose(bs.scale_energy(other), lay.scale_energy, rtol=1e-4)


def _summary(diff_low: float, diff_high: float) -> dict:
    cell = {"estimate": 0.5, "low": 0.4, "high": 0.6}
    row = {"layer": 0, "dominant_scales": [4.0, 12.0], **{k: dict(cell) for k in STATS}}
    d = {"layer": 0, **{k: {"estimate": 0.0, "low": -0.1, "high": 0.1} for k in STATS}}
    d["E_fine"] = {"estimate": (diff_low + diff_high) / 2, "low": diff_low, "high": diff_high}
    return {"fields": ["attention", "contribution"],
            "per_field": {"attention": [row], "contribution": [row]},
            "differences": {"contribution": [d]}}


def test_verdict_names_only_intervals_that_exclude_zero():
    s = _summary(0.05, 0.15)
    assert differs(s["differences"]["contribution"][0]["E_fine"])
    v = verdict(s)
    assert v.startswith("contribution vs attention: differs in fine share (layers 0: +0.100")
    assert "**+0.100 [+0.050, +0.150]**" in table_markdown(s)
    s = _summary(-0.05, 0.15)
    assert verdict(s).startswith("contribution vs attention: not distinguishable at this size.")
    # a summary without the jackknife (written before it): no T_spec / H* call
    assert "T_spec and H*: no call" in verdict(s)
    s["jackknife"] = {"n_groups": 19}
    assert "no call" not in verdict(s) and "uncorrected for the 1 layers and 6" in verdict(s)
    assert "**" not in table_markdown(s)
    # an interval off 0 on the other side of the estimate (a biased resample statistic)
    s = _summary(0.05, 0.15)
    s["differences"]["contribution"][0]["E_fine"]["estimate"] = -0.02
    assert verdict(s).startswith("contribution vs attention: not distinguishable at this size.")


def test_subset_statistics_equal_scale_pod_of_the_subset():
    """A jackknife replicate (fewer, all-distinct documents): E'(a), T_spec and H* equal the
    scale POD run on those documents alone (n = len(idx), not N, in every mean)."""
    F = _fields(N=12, seed=4)
    keep = torch.tensor([0, 2, 3, 5, 6, 7, 9, 11])
    bs = LayerBootstrap(F, torch.arange(F.shape[-1]))
    want, lay = _direct(F[keep])
    torch.testing.assert_close(bs.stats(keep), want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(bs.scale_energy(keep), lay.scale_energy, rtol=1e-4,
                               atol=1e-9 * float(lay.scale_energy.max()))


def test_jackknife_intervals_hold_their_estimates():
    """T_spec and H* take the delete-a-group jackknife's interval (estimate ± t·se, so the
    estimate lies inside); the other statistics keep the bootstrap's."""
    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral_studies.field_pod import JACKKNIFE_KEYS, combine_intervals
    from tl_spectral_studies.scale_pod import group_jackknife

    F = _fields(N=16, seed=5)
    bs = LayerBootstrap(F, torch.arange(F.shape[-1]))
    iv = bootstrap(bs.stats, 16, n_resamples=30, seed=0)
    jk = group_jackknife(bs.stats, 16, n_groups=8, seed=0)
    est, low, high = combine_intervals(iv.estimate, iv.low, iv.high, jk)
    for k in STATS:
        i = STATS.index(k)
        if k in JACKKNIFE_KEYS:
            assert low[i] <= est[i] <= high[i]
            assert float(low[i]) == float(jk["low"][i]) and float(high[i]) == float(jk["high"][i])
        else:
            assert float(low[i]) == float(iv.low[i]) and float(high[i]) == float(iv.high[i])
