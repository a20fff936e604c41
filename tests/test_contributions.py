"""Contribution weights against a brute force that materializes every ṽ_j in d_model."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from tl_spectral.analysis.contributions import MEASURES, ContributionMaps, contribution_weights
from tl_spectral.results import Result

matplotlib.use("Agg")


# ----------------------------------------------------------------------------- helpers
def random_layer(
    batch=2,
    heads=4,
    kv_heads=2,
    T=9,
    d_head=5,
    d_model=12,
    causal=True,
    lengths=None,
    seed=0,
    dtype=torch.float64,
):
    """Random softmax pattern (causal or not, right padding by ``lengths``), hook_v, W_O.

    Padded keys get α = 0 (rows renormalized over real keys); padded query rows are NaN to
    check that they are ignored. Returns pattern, v, W_O, query_mask (or None)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, heads, T, T, generator=g, dtype=dtype) * 2.0
    allowed = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None].expand(batch, heads, T, T).clone()
    qmask = None
    if lengths is not None:
        keep = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # [b, T]
        allowed &= keep[:, None, None, :]
        qmask = keep
    pattern = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    if qmask is not None:
        pattern = pattern.masked_fill(~qmask[:, None, :, None], math.nan)
    v = torch.randn(batch, T, kv_heads, d_head, generator=g, dtype=dtype)
    W_O = torch.randn(heads, d_head, d_model, generator=g, dtype=dtype) / math.sqrt(d_head)
    return pattern, v, W_O, qmask


def brute_force(pattern, v, W_O, mode, query_mask=None):
    """Explicit d_model vectors: ṽ [b, h, k, m], o^h [b, h, q, m] and the per-pair products."""
    p = pattern.double().clone()
    if query_mask is not None:
        p = p.masked_fill(~query_mask[:, None, :, None], 0.0)
    H = p.shape[1]
    vh = v.double().repeat_interleave(H // v.shape[2], dim=2)  # [b, k, h, d]
    vt = torch.einsum("bkhd,hdm->bhkm", vh, W_O.double())  # ṽ_j^h
    pairs = p[..., None] * vt[:, :, None, :, :]  # [b, h, q, k, m]  α_ij ṽ_j (explicit)
    oh = pairs.sum(3)  # [b, h, q, m]
    o = oh.sum(1)  # [b, q, m]
    ref = oh if mode == "intra" else o[:, None].expand_as(oh)
    dots = (pairs * ref[:, :, :, None, :]).sum(-1)  # ⟨o, α ṽ⟩
    onorm = ref.norm(dim=-1)  # [b, h, q]
    vnorm = vt.norm(dim=-1)  # [b, h, k]
    c = dots / onorm[..., None] ** 2
    cos = torch.nn.functional.cosine_similarity(
        ref[:, :, :, None, :].expand_as(pairs), vt[:, :, None].expand_as(pairs), dim=-1
    )
    return {
        "contribution": c,
        "attention": p,
        "value_weighted": p * vnorm[:, :, None, :],
        "output_normalized": p * vnorm[:, :, None, :] / onorm[..., None],
        "relative_norm": vnorm[:, :, None, :] / onorm[..., None],
        "cosine": cos,
        "value_norm": vnorm,
        "output_norm": onorm if mode == "intra" else onorm[:, :1],
    }


def assert_matches(res: ContributionMaps, ref: dict, valid_qk, atol=1e-10):
    for name, want in ref.items():
        got = getattr(res, name)
        if got.ndim == 4:
            m = valid_qk.expand_as(got)
            torch.testing.assert_close(got[m], want[m], atol=atol, rtol=1e-8, msg=name)
        elif name == "output_norm":
            m = valid_qk[..., 0].expand_as(got)
            torch.testing.assert_close(got[m], want[m], atol=atol, rtol=1e-8, msg=name)
        else:
            torch.testing.assert_close(got, want, atol=atol, rtol=1e-8, msg=name)


# ----------------------------------------------------------------------------- brute force
@pytest.mark.parametrize("mode", ["intra", "inter"])
@pytest.mark.parametrize(
    "cfg",
    [
        {"heads": 4, "kv_heads": 4, "causal": True},
        {"heads": 4, "kv_heads": 2, "causal": True},  # grouped-query
        {"heads": 6, "kv_heads": 1, "causal": False, "T": 11},  # multi-query, bidirectional
        {"heads": 4, "kv_heads": 2, "causal": True, "lengths": [9, 5]},  # padding
        {"heads": 2, "kv_heads": 2, "causal": False, "T": 32, "d_model": 8, "lengths": [20, 32]},
    ],
)
def test_matches_brute_force(mode, cfg):
    pattern, v, W_O, qm = random_layer(**cfg, seed=len(str(cfg)))
    res = contribution_weights(pattern, v, W_O, mode, query_mask=qm)
    ref = brute_force(pattern, v, W_O, mode, qm)
    real = torch.ones(pattern.shape[0], pattern.shape[2], dtype=torch.bool) if qm is None else qm
    valid_qk = real[:, None, :, None]
    assert res.valid.shape == (
        (2, pattern.shape[1], pattern.shape[2]) if mode == "intra" else (2, 1, pattern.shape[2])
    )
    assert torch.equal(res.valid, real[:, None, :].expand_as(res.valid))
    assert_matches(res, ref, valid_qk)
    torch.testing.assert_close(
        res.token, ref["contribution"].sum(1).masked_fill(~real[..., None], 0)
    )
    for t in (res.contribution, res.cosine, res.relative_norm, res.output_normalized):
        assert torch.isfinite(t).all()
        assert (t[~valid_qk.expand_as(t)] == 0).all()


def test_factorization_identity_and_negative_values():
    pattern, v, W_O, _ = random_layer(T=16, seed=3)
    for mode in ("intra", "inter"):
        r = contribution_weights(pattern, v, W_O, mode)
        torch.testing.assert_close(r.contribution, r.attention * r.relative_norm * r.cosine)
        assert (r.contribution < 0).any(), "random values must interfere destructively somewhere"
        assert (r.cosine.abs() <= 1 + 1e-12).all()


def test_float32_input_close_to_float64():
    pattern, v, W_O, qm = random_layer(T=24, lengths=[24, 17], seed=5)
    for mode in ("intra", "inter"):
        r64 = contribution_weights(pattern, v, W_O, mode, query_mask=qm)
        r32 = contribution_weights(pattern.float(), v.float(), W_O.float(), mode, query_mask=qm)
        assert r32.contribution.dtype == torch.float32
        torch.testing.assert_close(
            r32.contribution.double(), r64.contribution, atol=1e-4, rtol=1e-3
        )


# ----------------------------------------------------------------------------- identities
@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    T=st.integers(1, 20),
    d_head=st.integers(1, 6),
    d_model=st.integers(1, 16),
    causal=st.booleans(),
    pad=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_sum_identities(batch, kv_heads, group, T, d_head, d_model, causal, pad, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (batch,), generator=g).tolist() if pad else None
    pattern, v, W_O, qm = random_layer(
        batch, kv_heads * group, kv_heads, T, d_head, d_model, causal, lengths, seed
    )
    intra = contribution_weights(pattern, v, W_O, "intra", query_mask=qm)
    inter = contribution_weights(pattern, v, W_O, "inter", query_mask=qm)
    for r in (intra, inter):
        for name in MEASURES + ("relative_norm", "cosine", "token"):
            assert torch.isfinite(getattr(r, name)).all(), name
    ones = torch.ones_like(intra.valid, dtype=torch.float64)
    torch.testing.assert_close(
        intra.contribution.sum(-1)[intra.valid], ones[intra.valid], atol=1e-8, rtol=0
    )
    row = inter.token.sum(-1)  # [b, q]
    v1 = inter.valid[:, 0]
    torch.testing.assert_close(row[v1], torch.ones_like(row[v1]), atol=1e-8, rtol=0)
    assert (row[~v1] == 0).all()
    if qm is not None:
        assert not intra.valid[~qm[:, None, :].expand_as(intra.valid)].any()


# ----------------------------------------------------------------------------- masking
def test_zero_W_O_is_masked_not_nan():
    pattern, v, W_O, _ = random_layer(seed=1)
    for mode in ("intra", "inter"):
        r = contribution_weights(pattern, v, torch.zeros_like(W_O), mode)
        assert not r.valid.any()
        assert "zero-norm output" in r.masked_reason
        for name in ("contribution", "cosine", "relative_norm", "output_normalized", "token"):
            t = getattr(r, name)
            assert torch.isfinite(t).all() and (t == 0).all(), name


def test_cancelling_head_output_masked_in_intra_only():
    # head 0: two keys with opposite values at equal attention -> o^0 = 0 exactly
    T, d = 2, 3
    pattern = torch.tensor(
        [[[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.3, 0.7]]]], dtype=torch.float64
    )
    v = torch.zeros(1, T, 2, d, dtype=torch.float64)
    v[0, 0, 0] = torch.tensor([1.0, 2.0, -1.0])
    v[0, 1, 0] = -v[0, 0, 0]
    v[0, :, 1] = torch.randn(T, d, dtype=torch.float64)
    W_O = torch.randn(2, d, 4, dtype=torch.float64)
    intra = contribution_weights(pattern, v, W_O, "intra")
    assert intra.valid.tolist() == [[[True, False], [True, True]]]
    assert (intra.contribution[0, 0, 1] == 0).all() and torch.isfinite(intra.contribution).all()
    assert "1 with a zero-norm output" in intra.masked_reason
    inter = contribution_weights(pattern, v, W_O, "inter")
    assert inter.valid.all() and inter.masked_reason == ""
    # head 0's pair contributions cancel exactly in the layer projection
    torch.testing.assert_close(
        inter.contribution[0, 0, 1].sum(), torch.tensor(0.0, dtype=torch.float64)
    )
    assert inter.contribution[0, 0, 1, 0] == -inter.contribution[0, 0, 1, 1] != 0


def test_padded_queries_ignore_nan_rows():
    pattern, v, W_O, qm = random_layer(lengths=[9, 4], seed=2)
    assert torch.isnan(pattern).any()
    r = contribution_weights(pattern, v, W_O, "inter", query_mask=qm)
    assert "padded queries" in r.masked_reason
    assert (r.attention[1, :, 4:] == 0).all()
    assert torch.isfinite(r.contribution).all()


# ----------------------------------------------------------------------------- cost
class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_never_forms_pair_by_d_model_tensor(mode):
    b, H, T, d, m = 1, 2, 16, 4, 64
    pattern, v, W_O, _ = random_layer(b, H, H, T, d, m, seed=4)
    with _LargestTensor() as spy:
        contribution_weights(pattern, v, W_O, mode)
    # the largest legitimate tensors are [b, H, T, T] (512) and W_O / o (512, 1024)
    assert spy.largest <= max(b * H * T * T, b * T * m, H * d * m)
    assert spy.largest < T * T * m


# ----------------------------------------------------------------------------- errors / io
def test_bad_inputs_raise_clear_errors():
    pattern, v, W_O, _ = random_layer()
    with pytest.raises(ValueError, match="mode"):
        contribution_weights(pattern, v, W_O, "both")
    with pytest.raises(ValueError, match="hook_v"):
        contribution_weights(pattern, v.permute(0, 2, 1, 3), W_O)
    with pytest.raises(ValueError, match="divide"):
        contribution_weights(pattern, torch.randn(2, 9, 3, 5, dtype=torch.float64), W_O)
    with pytest.raises(ValueError, match="W_O"):
        contribution_weights(pattern, v, W_O.transpose(1, 2))
    with pytest.raises(ValueError, match=r"\[batch, head, query, key\]"):
        contribution_weights(pattern[:, 0], v, W_O)
    bad = pattern.clone()
    bad[0, 0, 3, 0] = math.nan
    with pytest.raises(ValueError, match="query_mask"):
        contribution_weights(bad, v, W_O)
    with pytest.raises(ValueError, match="query_mask"):
        contribution_weights(pattern, v, W_O, query_mask=torch.ones(2, 9))


def test_save_load_token_level_and_plots(tmp_path):
    pattern, v, W_O, qm = random_layer(lengths=[9, 6], seed=7)
    r = contribution_weights(pattern, v, W_O, "inter", query_mask=qm)
    back = Result.load(r.save(tmp_path / "c.safetensors"))
    assert isinstance(back, ContributionMaps) and back.mode == "inter"
    assert back.masked_reason == r.masked_reason
    torch.testing.assert_close(back.contribution, r.contribution)
    assert r.token_level().shape == (2, 1, 9, 9)
    torch.testing.assert_close(r.token_level()[:, 0], r.token)
    assert set(r.measures()) == set(MEASURES)
    with pytest.raises(ValueError, match="unknown measure"):
        r.measure("rollout")
    import matplotlib.pyplot as plt

    for fig in (r.plot_maps(), r.plot_maps(head=1), r.plot_factorization(query=5)):
        assert isinstance(fig, plt.Figure)
        plt.close(fig)
