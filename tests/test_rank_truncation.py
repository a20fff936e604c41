"""Rank truncation of the routing / filtering parts (issue 17 item 7) against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.interventions.ablations import (
    TruncatedKernelAttention,
    ablate,
    rank_truncation_curve,
    svd_truncate,
    truncate_rank,
)
from tl_spectral.models import GPT, GPTConfig


def _model(attention="softmax", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=13, n_layers=2, n_heads=2, d_model=16, d_head=4, n_ctx=12, d_mlp=32,
               attention=attention)
    if attention == "sd":
        cfg["attention_options"] = {"filtering": "diag", "routing": "skew"}
    cfg.update(kw)
    m = GPT(GPTConfig(**cfg)).eval()
    with torch.no_grad():  # non-trivial biases and δ so that every term matters
        for n, p in m.named_parameters():
            if n.endswith("bias") or n.endswith("delta"):
                p.normal_(0, 0.3)
    return m


def _tokens(n=3, T=12):
    return torch.randint(0, 13, (n, T), generator=torch.Generator().manual_seed(1))


def _dense_trunc(m: np.ndarray, r: int) -> np.ndarray:
    u, s, vt = np.linalg.svd(m)
    return (u[:, :r] * s[:r]) @ vt[:r]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 7), r=st.integers(0, 8), seed=st.integers(0, 10**6),
       kind=st.sampled_from(["any", "sym", "skew"]))
def test_svd_truncate_equals_dense_svd_truncation(n, r, seed, kind):
    g = np.random.default_rng(seed)
    m = g.standard_normal((n, n))
    if kind == "sym":
        m = m + m.T
    elif kind == "skew":
        m = m - m.T
        r = r - r % 2  # pairs of equal singular values: truncate whole planes
    got = svd_truncate(torch.tensor(m), r).numpy()
    np.testing.assert_allclose(got, _dense_trunc(m, min(r, n)), atol=1e-9)
    assert np.linalg.matrix_rank(got, tol=1e-8) <= r


@pytest.mark.parametrize("part", ["filtering", "routing"])
@pytest.mark.parametrize("r", [0, 2, 4])
def test_softmax_kernels_equal_brute_force(part, r):
    m = _model()
    att = m.blocks[1].attn
    w = {k: v.detach().double().numpy() for k, v in att.weights().items()}
    t = TruncatedKernelAttention(att, part, r)
    for h in range(2):
        M = w["W_Q"][h] @ w["W_K"][h].T
        F, R = 0.5 * (M + M.T), 0.5 * (M - M.T)
        want = _dense_trunc(F, r) + R if part == "filtering" else F + _dense_trunc(R, r)
        np.testing.assert_allclose(t.kernels[h].double().numpy(), want, atol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "sd"])
@pytest.mark.parametrize("part", ["filtering", "routing"])
def test_full_rank_is_the_identity(attention, part):
    m = _model(attention)
    x = _tokens()
    full = 8 if attention == "softmax" else 4  # 2·d_head, d_head
    with torch.no_grad():
        ref = m(x)
        got = truncate_rank(m, part, full)(x)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        # and r = 0 is the whole removal of SPEC B.4
        kind = {("softmax", "filtering"): "symmetric_removal",
                ("softmax", "routing"): "skew_removal",
                ("sd", "filtering"): "filtering_removal",
                ("sd", "routing"): "routing_removal"}[attention, part]
        torch.testing.assert_close(truncate_rank(m, part, 0)(x), ablate(m, kind)(x),
                                   atol=1e-4, rtol=1e-4)
    assert torch.equal(m(x), ref)  # the input model is unchanged


def test_sd_truncation_acts_on_s_and_d():
    m = _model("sd")
    a = m.blocks[0].attn
    S, D = a.S().detach(), torch.diagonal(a.D().detach(), dim1=-2, dim2=-1)
    t = truncate_rank(m, "routing", 2).blocks[0].attn
    for h in range(2):
        np.testing.assert_allclose(t.S()[h].detach().double().numpy(),
                                   _dense_trunc(S[h].double().numpy(), 2), atol=1e-5)
    torch.testing.assert_close(t.D(), a.D())
    f = truncate_rank(m, "filtering", 1).blocks[0].attn
    dd = torch.diagonal(f.D().detach(), dim1=-2, dim2=-1)
    for h in range(2):
        keep = int(D[h].argmax())
        assert dd[h, keep] == pytest.approx(float(D[h, keep]), rel=1e-5)
        assert float(dd[h].sum() - dd[h, keep]) == 0.0
    torch.testing.assert_close(f.S(), a.S())


def test_bad_input():
    m = _model()
    with pytest.raises(ValueError, match="even r"):
        truncate_rank(m, "routing", 3)
    with pytest.raises(ValueError, match="part must be"):
        truncate_rank(m, "symmetric", 2)
    with pytest.raises(ValueError, match="layers"):
        truncate_rank(m, "filtering", 2, layers=[5])
    with pytest.raises(ValueError, match="rank r"):
        truncate_rank(m, "filtering", -1)
    with pytest.raises(TypeError):
        truncate_rank(object(), "filtering", 2)


def test_rank_truncation_curve_rows():
    m = _model()
    w = torch.randint(0, 13, (4, 13), generator=torch.Generator().manual_seed(2))
    res = rank_truncation_curve(m, w, name="tiny")
    assert res.full_rank == 8
    rs, ys = res.curve("routing")
    assert rs == [2, 4, 8] and abs(ys[-1]) < 1e-4
    rs, ys = res.curve("filtering")
    assert rs == [1, 2, 4, 8] and abs(ys[-1]) < 1e-4
    assert {r["part"] for r in res.to_rows()} == {"routing", "filtering"}
