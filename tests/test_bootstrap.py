"""Bootstrap intervals: brute-force checks of the resampling, the percentile intervals and
the double-centred Gram of a resample."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.bootstrap import (
    Interval,
    bootstrap,
    centred_gram_resample,
    mean_interval,
    resample_indices,
)


def test_resample_indices_seeded_and_in_range():
    a = resample_indices(7, 50, seed=3)
    b = resample_indices(7, 50, seed=3)
    assert torch.equal(a, b) and a.shape == (50, 7)
    assert int(a.min()) >= 0 and int(a.max()) <= 6
    assert not torch.equal(a, resample_indices(7, 50, seed=4))


def test_mean_interval_matches_brute_force_quantiles():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, generator=g, dtype=torch.float64) + 2.0
    iv = mean_interval(x, n_resamples=400, seed=1)
    idx = resample_indices(40, 400, seed=1)
    reps = sorted(float(x[i].mean()) for i in idx)
    lo = torch.quantile(torch.tensor(reps), 0.025).item()
    hi = torch.quantile(torch.tensor(reps), 0.975).item()
    assert iv.estimate == pytest.approx(float(x.mean()))
    assert iv.low == pytest.approx(lo) and iv.high == pytest.approx(hi)
    assert iv.low < iv.estimate < iv.high
    assert iv.excludes(0.0) and not iv.excludes(iv.estimate)
    # the interval of a mean of N(2, 1) over 40 docs has half-width about 1.96/sqrt(40)
    assert (iv.high - iv.low) / 2 == pytest.approx(1.96 / 40 ** 0.5, rel=0.35)


def test_tensor_statistic_gives_elementwise_intervals():
    x = torch.randn(30, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ivs = bootstrap(lambda i: x[i].mean(0), 30, n_resamples=200, seed=0)
    assert ivs.estimate.shape == (3,)
    one = ivs[1]
    assert isinstance(one, Interval)
    solo = bootstrap(lambda i: x[i, 1].mean(), 30, n_resamples=200, seed=0)
    assert one.low == pytest.approx(solo.low) and one.high == pytest.approx(solo.high)


def test_shape_change_and_bad_arguments_raise():
    with pytest.raises(ValueError, match="fixed shape"):
        bootstrap(lambda i: torch.zeros(int(i.unique().numel())), 5, n_resamples=20)
    with pytest.raises(ValueError, match="at least 2 documents"):
        resample_indices(1, 10)
    with pytest.raises(ValueError, match="level"):
        mean_interval(torch.ones(4), level=95)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), d=st.integers(1, 6), seed=st.integers(0, 1000))
def test_centred_gram_resample_equals_recentred_fields(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    F = torch.randn(n, d, generator=g, dtype=torch.float64)
    u = F - F.mean(0)  # fluctuations about the full ensemble's mean
    G = u @ u.T
    idx = torch.randint(0, n, (n,), generator=g)
    Fi = F[idx]
    ui = Fi - Fi.mean(0)  # about the resample's own mean
    torch.testing.assert_close(centred_gram_resample(G, idx), ui @ ui.T)
    # any fixed reference works: the raw Gram gives the same answer
    torch.testing.assert_close(centred_gram_resample(F @ F.T, idx), ui @ ui.T)


def test_t_quantile_is_scipy_stats_t_ppf():
    """t_quantile (scipy.special.stdtrit, no scipy.stats import) returns exactly what
    scipy.stats.t.ppf returns."""
    from scipy.stats import t as student_t

    from tl_spectral.analysis.bootstrap import t_quantile

    for df in (1, 2, 3, 7, 15, 30, 200):
        for p in (0.6, 0.9, 0.95, 0.975, 0.995):
            assert t_quantile(p, df) == float(student_t.ppf(p, df))
