"""Removal masks (exact counts, ranking, ties, broadcasting) and curve areas."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.faithfulness import (
    allowed_mask,
    curve_area,
    fraction_grid,
    removal_counts,
    removal_mask,
    remove_pairs,
)


def brute_mask(scores, allowed, fraction, which):
    """Python sort per row: key (−score, j) for top, (score, j) for bottom."""
    b, h, q, k = scores.shape
    out = torch.zeros(b, h, q, k, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(q):
                js = [j for j in range(k) if allowed[bi, hi, i, j]]
                n_rm = math.floor(fraction * len(js) + 0.5 + 1e-9)
                sign = -1.0 if which == "top" else 1.0
                js.sort(key=lambda j: (sign * float(scores[bi, hi, i, j]), j))
                for j in js[:n_rm]:
                    out[bi, hi, i, j] = True
    return out


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    T=st.integers(1, 12),
    fraction=st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1.0]),
    which=st.sampled_from(["top", "bottom"]),
    causal=st.booleans(),
    ties=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_matches_brute_force_and_counts(b, h, T, fraction, which, causal, ties, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, h, T, T, generator=g)
    if ties:
        scores = scores.round()  # many equal scores
    key_mask = torch.rand(b, T, generator=g) > 0.2
    allowed = allowed_mask(T, causal=causal, key_mask=key_mask)
    mask = removal_mask(scores, fraction, which, allowed)
    assert mask.shape == (b, h, T, T) and mask.dtype == torch.bool
    assert torch.equal(mask, brute_mask(scores, allowed.expand(b, h, T, T), fraction, which))
    # exact counts, only allowed pairs
    assert not (mask & ~allowed).any()
    n_allowed = allowed.expand(b, h, T, T).sum(-1)
    want = torch.floor(n_allowed.double() * fraction + 0.5 + 1e-9).long()
    assert torch.equal(mask.sum(-1), want)
    assert torch.equal(removal_counts(allowed.expand(b, h, T, T), fraction), want)
    # removed scores dominate kept ones
    big = torch.where(mask, scores, math.inf).amin(-1)
    kept = allowed.expand_as(mask) & ~mask
    small = torch.where(kept, scores, -math.inf).amax(-1)
    both = mask.any(-1) & kept.any(-1)
    if which == "top":
        assert (big[both] >= small[both]).all()
    else:
        big = torch.where(mask, scores, -math.inf).amax(-1)
        small = torch.where(kept, scores, math.inf).amin(-1)
        assert (big[both] <= small[both]).all()


def test_fraction_zero_removes_nothing_and_one_removes_all():
    scores = torch.randn(2, 3, 8, 8)
    allowed = allowed_mask(8)
    for which in ("top", "bottom"):
        assert not removal_mask(scores, 0.0, which, allowed).any()
        full = removal_mask(scores, 1.0, which, allowed)
        assert torch.equal(full, allowed.expand_as(full))


def test_rounding_half_up_with_guard():
    row = lambda n: torch.ones(n, dtype=torch.bool)
    assert int(removal_counts(row(5), 0.7)) == 4  # 0.7·5 = 3.4999999999999996 -> 3.5 -> 4
    assert int(removal_counts(row(1), 0.5)) == 1
    assert int(removal_counts(row(2), 0.25)) == 1
    assert int(removal_counts(row(3), 0.1)) == 0
    assert int(removal_counts(row(10), 0.3)) == 3
    assert int(removal_counts(row(0), 0.9)) == 0


def test_ties_broken_by_earlier_key():
    scores = torch.zeros(1, 1, 1, 6)
    top = removal_mask(scores, 0.5, "top")
    bottom = removal_mask(scores, 0.5, "bottom")
    assert top[0, 0, 0].tolist() == [True, True, True, False, False, False]
    assert torch.equal(top, bottom)
    s = torch.tensor([[[[1.0, 3.0, 3.0, 0.0, 3.0]]]])
    assert removal_mask(s, 0.4, "top")[0, 0, 0].tolist() == [False, True, True, False, False]


def test_token_level_broadcasts_over_heads():
    token = torch.randn(2, 1, 7, 7)
    allowed = allowed_mask(7, query_mask=torch.tensor([[True] * 7, [True] * 5 + [False] * 2]))
    m = removal_mask(token, 0.5, "top", allowed, n_heads=4)
    assert m.shape == (2, 4, 7, 7)
    assert all(torch.equal(m[:, h], m[:, 0]) for h in range(4))
    assert not m[1, :, 5:].any()
    # per-head allowed with token-level scores broadcasts to the allowed heads
    per_head = allowed.expand(2, 3, 7, 7)
    assert removal_mask(token, 0.5, "top", per_head).shape == (2, 3, 7, 7)


def test_allowed_mask_and_remove_pairs():
    a = allowed_mask(4, causal=True, key_mask=torch.tensor([[False, True, True, True]]))
    assert a.shape == (1, 1, 4, 4)
    assert a[0, 0].int().tolist() == [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]
    assert allowed_mask(2, 3, causal=True)[0, 0].int().tolist() == [[1, 1, 0], [1, 1, 1]]
    assert allowed_mask(3, causal=False).all()
    p = torch.full((1, 1, 2, 2), 0.5)
    m = torch.tensor([[[[True, False], [False, False]]]])
    out = remove_pairs(p, m)
    assert out.tolist() == [[[[0.0, 0.5], [0.5, 0.5]]]]  # not renormalized


def test_removal_mask_errors():
    s = torch.randn(1, 1, 3, 3)
    with pytest.raises(ValueError, match="which"):
        removal_mask(s, 0.1, "middle")
    with pytest.raises(ValueError, match="fraction"):
        removal_mask(s, 1.5)
    with pytest.raises(ValueError, match="head axis"):
        removal_mask(s[0, 0], 0.1)
    with pytest.raises(ValueError, match="bool"):
        removal_mask(s, 0.1, allowed=torch.ones(1, 1, 3, 3))
    bad = s.clone()
    bad[0, 0, 2, 1] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        removal_mask(bad, 0.1)
    # NaN on a disallowed pair is fine
    bad2 = s.clone()
    bad2[0, 0, 0, 2] = math.nan
    removal_mask(bad2, 0.5, allowed=allowed_mask(3))


def test_curve_area():
    f = fraction_grid()
    assert f == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    # constant curve: normalized area = the constant, raw area = constant × span
    torch.testing.assert_close(curve_area(f, [2.0] * 10), torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close(
        curve_area(f, [2.0] * 10, normalize=False), torch.tensor(1.8, dtype=torch.float64)
    )
    # linear curve: trapezoid is exact
    y = torch.tensor([[3 * x for x in f], [1 - x for x in f]], dtype=torch.float64)
    area = curve_area(torch.tensor(f), y)
    torch.testing.assert_close(area, torch.tensor([1.35, 0.55], dtype=torch.float64))
    # against a hand-written trapezoid on an uneven grid
    fx, vy = [0.0, 0.1, 0.5], [1.0, 4.0, 2.0]
    manual = (0.1 * (1 + 4) / 2 + 0.4 * (4 + 2) / 2) / 0.5
    assert abs(float(curve_area(fx, vy)) - manual) < 1e-12
    with pytest.raises(ValueError, match="increasing"):
        curve_area([0.0, 0.2, 0.1], [1, 2, 3])
    with pytest.raises(ValueError, match="one per fraction"):
        curve_area([0.0, 0.1], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="NaN"):
        curve_area([0.0, 0.1], [1.0, math.nan])
