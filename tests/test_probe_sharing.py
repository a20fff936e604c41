"""Work shared between probes (tl_spectral/probes/shared.py, issue 32): every shared quantity
against a brute-force formula, and every probe run beside the others equal to the probe run
alone (the memo changes who forms a quantity, never its value)."""

from __future__ import annotations

import pytest
import torch

from tl_spectral.probes import (
    AttentionFieldProbe,
    AttentionStatsProbe,
    ContributionProbe,
    SinkProbe,
    run_probes,
    shared,
)
from tl_spectral.probes.base import LayerCapture


def _capture(b=2, H=4, T=9, d=5, causal=True, lengths=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, H, T, T, generator=g, dtype=dtype) * 2
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    mask = torch.ones(b, T, dtype=torch.bool)
    if lengths is not None:
        for i, n in enumerate(lengths):
            mask[i, n:] = False
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = scores.softmax(-1)
    v = torch.randn(b, T, H, d, generator=g, dtype=dtype)
    W = torch.randn(H, d, 7, generator=g, dtype=dtype)
    cap = LayerCapture(layer=0, mask=mask, tokens=torch.zeros(b, T, dtype=torch.long),
                       doc_index=torch.arange(b), pattern=p, v=v)
    return cap, W


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sink", [0, 3])
@pytest.mark.parametrize("lengths", [None, [9, 6]])
def test_value_products_and_head_outputs_equal_brute_force(causal, sink, lengths):
    cap, W = _capture(causal=causal, lengths=lengths)
    p = cap.pattern.clone()
    qm = cap.mask
    p = p.masked_fill(~qm[:, None, :, None], 0.0)  # padded query rows never count
    vh = cap.v.permute(0, 2, 1, 3)
    vt = torch.einsum("bhkd,hdm->bhkm", vh, W)  # ṽ_j = v_j W_O^h, formed densely
    vnorm = vt.norm(dim=-1)
    keep = torch.ones(p.shape[-1], dtype=p.dtype)
    keep[sink] = 0.0
    pw = p * keep  # the sink column left out
    vp = shared.value_products(cap, W, causal, sink)
    tol = dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vp.vnorm, vnorm, **tol)
    torch.testing.assert_close(vp.w, pw @ vh, **tol)
    torch.testing.assert_close(vp.w_bound, (pw * vnorm[:, :, None, :]).sum(-1), **tol)
    torch.testing.assert_close(vp.mass, pw.sum(-1), **tol)
    torch.testing.assert_close(vp.z, p @ vh, **tol)
    torch.testing.assert_close(vp.bound, (p * vnorm[:, :, None, :]).sum(-1), **tol)
    o = torch.einsum("bhqk,bhkm->bqm", p, vt)
    s = torch.einsum("bhqk,bhkm->bqm", pw, vt)
    torch.testing.assert_close(shared.head_outputs(cap, W, causal, sink, "o"), o, **tol)
    torch.testing.assert_close(shared.head_outputs(cap, W, causal, sink, "s"), s, **tol)
    # memoised: asked again, the same tensors come back (formed once per capture)
    assert shared.value_products(cap, W, causal, sink).z is vp.z


@pytest.mark.parametrize("causal", [True, False])
def test_pattern_sums_equal_brute_force(causal):
    cap, _ = _capture(b=3, T=8, causal=causal, lengths=[8, 5, 7] if causal else None, seed=2)
    p = cap.pattern.masked_fill(~cap.mask[:, None, :, None], 0.0)
    ps = p.sum(0)
    torch.testing.assert_close(shared.pattern_sum(cap), ps, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(shared.pattern_source_sums(cap), ps.sum(1), rtol=1e-12, atol=1e-14)
    pos, neg = shared.pattern_lag_sums(cap, causal)
    T = ps.shape[-1]
    for lag in range(T):
        torch.testing.assert_close(pos[:, lag], torch.diagonal(ps, -lag, dim1=-2, dim2=-1).sum(-1))
        want = torch.diagonal(ps, lag, dim1=-2, dim2=-1).sum(-1) if lag else torch.zeros(ps.shape[0],
                                                                                          dtype=ps.dtype)
        torch.testing.assert_close(neg[:, lag], want)


def test_one_document_pattern_sum_is_the_capture_itself():
    cap, _ = _capture(b=1, lengths=None)
    assert shared.pattern_sum(cap).data_ptr() == cap.pattern.data_ptr()  # no copy


@pytest.mark.parametrize("causal", [True, False])
def test_full_window_counts_equal_the_count_matrix(causal):
    from tl_spectral.probes.contributions import _full_window_counts, _lag_sums

    T, b = 7, 3
    allow = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allow = allow.tril()
    m = allow.double() * b
    src, (pos, neg), pairs = _full_window_counts(T, b, causal, "cpu")
    want_pos, want_neg = _lag_sums(m, causal)
    assert torch.equal(src, m.sum(0)) and torch.equal(pairs, m.sum().reshape(1))
    assert torch.equal(pos, want_pos) and torch.equal(neg, want_neg)


def test_plogp_equals_xlogy():
    from tl_spectral.probes.attention_stats import _plogp_sum

    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 5, 11, generator=g).softmax(-1)
    p[0, 0, :4] = 0.0  # exact zeros: 0 log 0 = 0
    p[1, 1, 2] = 1e-40  # subnormal
    torch.testing.assert_close(_plogp_sum(p), torch.special.xlogy(p, p).sum(-1), rtol=1e-6,
                               atol=1e-30)


def _four():
    return [AttentionStatsProbe(), ContributionProbe(rank_queries=4, rank_stride=1), SinkProbe(),
            AttentionFieldProbe(field="contribution")]


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, equal_nan=True)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _equal(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("kind", ["ln", "gqa"])
def test_probes_together_equal_probes_alone(kind, native_ln, native_gqa):
    """The memo only changes who forms a shared quantity: every probe's result beside the
    others equals its result alone (full windows and ragged documents)."""
    import dataclasses

    model = native_ln if kind == "ln" else native_gqa
    g = torch.Generator().manual_seed(3)
    for data in (torch.randint(0, 50, (3, 20), generator=g),
                 [torch.randint(0, 50, (n,), generator=g) for n in (20, 13, 17)]):
        together = run_probes(model, data, _four(), batch_size=2, progress=False)
        for probe in _four():
            alone = run_probes(model, data, [probe], batch_size=2, progress=False)[probe.name]
            res = together[probe.name]
            for f in dataclasses.fields(res):
                _equal(getattr(res, f.name), getattr(alone, f.name))


@pytest.mark.parametrize("shape,max_lag", [((2, 3, 7, 7), None), ((2, 7, 7), 0), ((1, 7, 7), 4),
                                           ((7, 7), 6), ((2, 2, 1, 1), None)])
def test_skewed_causal_lag_fields_equal_the_gather(shape, max_lag):
    from tl_spectral.analysis.scale_pod import lag_fields
    from tl_spectral.probes.fields import _lag_fields

    A = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for causal in (True, False):
        F1, l1 = lag_fields(A, causal=causal, max_lag=max_lag)
        F2, l2 = _lag_fields(A, causal=causal, max_lag=max_lag)
        assert torch.equal(F1, F2) and torch.equal(l1, l2)
    with pytest.raises(ValueError, match="max_lag"):
        _lag_fields(A, causal=True, max_lag=shape[-1])


@pytest.mark.parametrize("T, rows", [(9, 2), (64, 5), (130, 64), (257, 16)])
@pytest.mark.parametrize("lengths", [None, "ragged"])
def test_block_sums_equal_the_whole_pattern_sums(T, rows, lengths):
    """BlockSums (gathered block by block in the entropy's or the value products' loop) and
    add_block_lag_sums equal the sums by key and by lag of the whole pattern, brute force;
    a block tiling that is not the probes' own still covers every query once."""
    lens = None if lengths is None else [T, max(2, T // 2)]
    cap, _ = _capture(T=T, lengths=lens, seed=T)
    p = cap.pattern.masked_fill(~cap.mask[:, None, :, None], 0.0)  # padded query rows 0
    i = torch.arange(T)[:, None]
    lag = i - torch.arange(T)[None, :]
    want_src = p.sum((0, 2))
    want_lag = torch.stack([(p * (lag == ell)).sum((0, 2, 3)) for ell in range(T)], -1)
    sums = shared.BlockSums(cap, causal=True)
    assert sums.active
    edges = sorted({0, T, *range(rows, T, rows)})
    for a, e in zip(edges[:-1], edges[1:]):
        sums.add(a, e)
    sums.finish()
    torch.testing.assert_close(shared.pattern_source_sums(cap), want_src, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(shared.pattern_doc_source_sums(cap), p.sum(-2), rtol=1e-12,
                               atol=1e-12)
    pos, neg = shared.pattern_lag_sums(cap, True)
    torch.testing.assert_close(pos, want_lag, rtol=1e-12, atol=1e-12)
    assert not neg.any()
    # a map of one document, block by block, against lag_sums of the whole map
    m = p[0].contiguous()
    got = torch.zeros(m.shape[0], T, dtype=m.dtype)
    for a, e in zip(edges[:-1], edges[1:]):
        shared.add_block_lag_sums(m, a, e, got)
    torch.testing.assert_close(got, shared.lag_sums(m, causal=True)[0], rtol=1e-12, atol=1e-12)


def test_block_sums_stand_aside_when_not_applicable():
    """Bidirectional patterns, sums already memoised or a strided pattern: BlockSums does
    nothing and the memoised functions form the sums the usual way."""
    cap, _ = _capture(causal=False)
    assert not shared.BlockSums(cap, causal=False).active
    cap, _ = _capture()
    first = shared.pattern_source_sums(cap)
    s = shared.BlockSums(cap, causal=True)
    assert not s.active
    s.add(0, 3)
    s.finish()
    assert shared.pattern_source_sums(cap) is first
    cap, _ = _capture()
    cap.pattern = cap.pattern.transpose(0, 1).contiguous().transpose(0, 1)  # not standard strides
    assert not shared.BlockSums(cap, causal=True).active
