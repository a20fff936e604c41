"""Streaming POD (analysis.streaming_pod): mergeable factor sets against the exact POD."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.pod import effective_rank, pod
from tl_spectral.analysis.streaming_pod import (
    FactorBuffer,
    StreamingFactors,
    fold,
    hstar_bounds,
    spectrum,
    streaming_pod_result,
)


def _snapshots(N: int, d: int, r: int, seed: int, mean_scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, r, generator=g, dtype=torch.float64))[0]
    amp = torch.tensor([0.7**k for k in range(r)], dtype=torch.float64)
    coef = torch.randn(N, r, generator=g, dtype=torch.float64) * amp
    mean = mean_scale * torch.randn(d, generator=g, dtype=torch.float64)
    return coef @ basis.T + mean


def _stream(X: torch.Tensor, cuts: list[int], rank: int) -> StreamingFactors:
    st_ = StreamingFactors.empty(X.shape[1], dtype=torch.float64)
    edges = [0, *sorted(set(cuts)), X.shape[0]]
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            st_ = st_.add(X[a:b]).fold(rank)
    return st_


@settings(max_examples=25, deadline=None)
@given(N=st.integers(3, 40), cuts=st.lists(st.integers(1, 39), max_size=6), seed=st.integers(0, 99))
def test_exact_when_rank_within_cap(N, cuts, seed):
    """Snapshots of rank <= the cap: eigenvalues, total energy, H* and modes equal the exact POD
    of the centred snapshots, for any split into batches."""
    X = _snapshots(N, 30, 6, seed)
    ref = pod(X, center=True, method="snapshots")
    res = streaming_pod_result(_stream(X, [c for c in cuts if c < N], rank=10), n_modes=3)
    n = min(ref.eigenvalues.numel(), res.eigenvalues.numel())
    assert res.eigenvalues.numel() == ref.eigenvalues.numel()
    torch.testing.assert_close(res.eigenvalues[:n], ref.eigenvalues[:n], rtol=1e-9, atol=1e-12)
    assert abs(res.total_energy - ref.total_energy) <= 1e-9 * ref.total_energy
    assert res.H_star == ref.H_star and res.H_star_saturated == ref.H_star_saturated
    assert res.spectrum_complete
    # modes up to the shared sign convention (largest entry positive)
    for k in range(min(3, n)):
        if k + 1 < n and ref.eigenvalues[k] - ref.eigenvalues[k + 1] < 1e-6 * ref.eigenvalues[0]:
            continue  # degenerate: the mode is not unique
        torch.testing.assert_close(res.modes[k], ref.modes[k], rtol=1e-6, atol=1e-8)


def test_merge_of_shards_equals_one_stream():
    """Two shards streamed apart and merged (concatenation + fold) equal one stream: the
    between-group rows restore the scatter of the shard means exactly."""
    X = _snapshots(60, 25, 8, 3)
    a = _stream(X[:23], [7, 15], rank=12)
    b = _stream(X[23:], [30], rank=12)
    merged = streaming_pod_result(a.merge(b).fold(12))
    whole = pod(X, center=True, method="snapshots")
    torch.testing.assert_close(merged.eigenvalues, whole.eigenvalues[: merged.eigenvalues.numel()],
                               rtol=1e-9, atol=1e-12)


def test_fold_matches_brute_force_scatter():
    """fold(): W'^T W' is the best rank-k approximation of the centred scatter of all rows."""
    X = _snapshots(20, 12, 12, 5)
    st_ = StreamingFactors.empty(12, dtype=torch.float64).add(X[:9]).add(X[9:])
    W, s, n, dropped = fold(st_.W, st_.sums, st_.ns, 4)
    Xc = X - X.mean(0)
    S = Xc.T @ Xc
    lam, V = torch.linalg.eigh(S)
    best = (V[:, -4:] * lam[-4:]) @ V[:, -4:].T
    torch.testing.assert_close(W.T @ W, best, rtol=1e-9, atol=1e-9)
    assert abs(float(dropped) - float(lam[:-4].sum())) < 1e-8 * float(lam.sum())
    assert float(n) == 20 and torch.allclose(s[0], X.sum(0))


def test_truncated_spectrum_bounds_hstar():
    """Beyond the cap: total energy stays exact, H* is reported as a lower bound (> K)."""
    X = _snapshots(80, 40, 40, 9)
    X = X + 0.3 * torch.randn(80, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = pod(X, center=True, method="snapshots", epsilon=0.01)
    res = streaming_pod_result(_stream(X, list(range(8, 80, 8)), rank=5), epsilon=0.01)
    assert abs(res.total_energy - ref.total_energy) <= 1e-9 * ref.total_energy
    assert ref.H_star > 5
    assert res.H_star == 5 and res.H_star_saturated and not res.spectrum_complete
    # the top eigenvalue of a truncated stream never exceeds the exact one
    assert float(res.eigenvalues[0]) <= float(ref.eigenvalues[0]) * (1 + 1e-12)
    H, reached = effective_rank(ref.eigenvalues, 0.5, total_energy=ref.total_energy)
    assert reached


def test_bad_rank():
    import pytest

    with pytest.raises(ValueError, match="rank must be"):
        fold(torch.zeros(0, 3), torch.zeros(1, 3, dtype=torch.float64), torch.ones(1, dtype=torch.float64), 0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 200), cap=st.integers(2, 12), eps=st.sampled_from([0.01, 0.1, 0.3]),
       noise=st.sampled_from([0.0, 0.05, 0.5]))
def test_hstar_bounds_contain_the_true_hstar(seed, cap, eps, noise):
    """Truncated streams: the bounds from the dropped energy always contain the exact H*
    (streamed eigenvalues never exceed the true ones; the true top-m energy is at most the
    streamed one plus the dropped energy)."""
    X = _snapshots(60, 30, 20, seed)
    X = X + noise * torch.randn(60, 30, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ref = pod(X, center=True, method="snapshots", epsilon=eps)
    st_ = _stream(X, list(range(5, 60, 7)), rank=cap)
    res = streaming_pod_result(st_, epsilon=eps)
    n = res.eigenvalues.numel()
    assert bool((res.eigenvalues <= ref.eigenvalues[:n] * (1 + 1e-9) + 1e-12).all())
    lo, hi = hstar_bounds(res.eigenvalues, res.total_energy, float(st_.dropped) / 60, eps)
    H = ref.H_star
    if hi is not None:
        assert H <= hi
    if lo is None:
        assert H > n
    else:
        assert H >= lo
    if res.spectrum_complete:
        assert lo == hi == H


# ------------------------------------------------------------------ in-place factor buffer
@settings(max_examples=20, deadline=None)
@given(N=st.integers(3, 40), cuts=st.lists(st.integers(1, 39), max_size=6),
       rank=st.integers(1, 12), seed=st.integers(0, 99))
def test_factor_buffer_folds_exactly_as_streaming_factors(N, cuts, rank, seed):
    """FactorBuffer (one buffer, folded in place) gives StreamingFactors.add(...).fold(...)'s
    state for any split into groups and any rank: the same rows in the same order go into the
    same Gram, so W, sums, counts, Σ‖x‖² and the dropped energy agree to rounding."""
    X = _snapshots(N, 30, 8, seed).float()
    ref = StreamingFactors.empty(30)
    fb = FactorBuffer(30, 4)  # too small on purpose: it grows when a fold needs the rows
    edges = [0, *sorted({c for c in cuts if c < N}), N]
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            ref = ref.add(X[a:b]).fold(rank)
            fb.append(X[a:b], torch.arange(30) if a % 2 else None)
            fb.fold(rank)
    torch.testing.assert_close(fb.W, ref.W, rtol=1e-5, atol=1e-5 * float(ref.W.abs().max()))
    torch.testing.assert_close(fb.W.T.double() @ fb.W.double(), ref.W.T.double() @ ref.W.double(),
                               rtol=1e-5, atol=1e-6 * float(ref.sumsq))
    torch.testing.assert_close(fb.sums, ref.sums)
    assert fb.ns.tolist() == ref.ns.tolist()
    torch.testing.assert_close(fb.sumsq, ref.sumsq, rtol=1e-12, atol=0.0)
    assert abs(float(fb.dropped) - float(ref.dropped)) <= 1e-5 * float(ref.sumsq)


def test_factor_buffer_fold_is_the_exact_eigendecomposition_when_rank_covers_n():
    """rank >= N: the folded factors hold the whole centred scatter — WᵀW equals Xcᵀ Xc and
    the spectrum its eigenvalues (float64 buffer: to 1e-10)."""
    X = _snapshots(25, 18, 18, 4)
    fb = FactorBuffer(18, 40, dtype=torch.float64)
    for a in range(0, 25, 7):
        fb.append(X[a:a + 7])
        fb.fold(30)
    Xc = X - X.mean(0)
    torch.testing.assert_close(fb.W.T @ fb.W, Xc.T @ Xc, rtol=1e-10, atol=1e-10)
    lam, _ = spectrum(fb.factors(), 3)
    exact = torch.linalg.eigvalsh(Xc.T @ Xc).flip(0) / 25
    torch.testing.assert_close(lam, exact[: lam.numel()], rtol=1e-9, atol=1e-12)
    assert float(fb.dropped) <= 1e-9 * float(exact.sum())


def test_factor_buffer_storage_does_not_grow_with_n():
    """The buffer is allocated once, for rank factors and the largest pending block: after
    one batch and after many its storage is the same tensor of the same shape, and its factor
    rows never exceed the rank."""
    g = torch.Generator().manual_seed(0)
    fb = FactorBuffer(50, 6 + 8 + 2)
    fb.append(torch.randn(4, 50, generator=g))
    first = (fb.buf.data_ptr(), tuple(fb.buf.shape))
    for _ in range(60):
        fb.append(torch.randn(4, 50, generator=g))
        if fb.p >= 8:
            fb.fold(6)
        assert (fb.buf.data_ptr(), tuple(fb.buf.shape)) == first and fb.r <= 6
    assert float(fb.ns.sum()) + fb.p == 244


def test_factor_buffer_adopts_a_merged_state():
    """A state built by concatenation (two shards, as reduce_state's all-gather makes) is
    adopted with its pending rows and folds to the one-stream POD."""
    X = _snapshots(50, 20, 8, 2).float()
    a = _stream(X[:20].double(), [9], rank=12)
    b = _stream(X[20:40].double(), [], rank=12)
    m = a.merge(b)
    m = StreamingFactors(m.W.float(), m.sums, m.ns, m.sumsq, m.dropped)
    fb = FactorBuffer.adopt(m, X[40:])
    fb.fold(12)
    whole = pod(X.double(), center=True, method="snapshots")
    lam, _ = spectrum(fb.factors(), 2)
    torch.testing.assert_close(lam, whole.eigenvalues[: lam.numel()], rtol=1e-4, atol=1e-8)
    store: dict = {}
    fb.publish(store, "x")
    assert fb.owns(store, "x") and store["x.W"].data_ptr() == fb.buf.data_ptr()
    store["x.W"] = store["x.W"].clone()  # replaced (a merge, a reduction): no longer its views
    assert not fb.owns(store, "x")
