"""Sink rates and sink geometry against explicit d_model brute force."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.sinks import (
    SinkGeometry,
    key_scores,
    optimal_sink_rate,
    output_norm_curve,
    sink_geometry,
    sink_head_share,
    sink_heads,
    sink_rate,
)
from tl_spectral.results import Result

matplotlib.use("Agg")


def random_layer(
    batch=2,
    heads=4,
    kv_heads=2,
    T=10,
    d_head=5,
    d_model=12,
    causal=True,
    lengths=None,
    seed=0,
    sink_boost=2.0,
):
    """Random pattern with a boosted first key (a sink), right padding by ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, heads, T, T, generator=g, dtype=torch.float64)
    scores[..., 0] += sink_boost
    allowed = torch.ones(T, T, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None].expand(batch, heads, T, T).clone()
    qm = None
    if lengths is not None:
        qm = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        allowed &= qm[:, None, None, :]
    pattern = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    if qm is not None:
        pattern = pattern.masked_fill(~qm[:, None, :, None], 0.0)
    v = torch.randn(batch, T, kv_heads, d_head, generator=g, dtype=torch.float64)
    W_O = torch.randn(heads, d_head, d_model, generator=g, dtype=torch.float64)
    return pattern, v, W_O, qm


def explicit(pattern, v, W_O):
    """ṽ [b, h, k, m] materialized, sink vector, semantic vectors, outputs (d_model)."""
    H = pattern.shape[1]
    vh = v.repeat_interleave(H // v.shape[2], dim=2)
    vt = torch.einsum("bkhd,hdm->bhkm", vh, W_O)
    v0 = vt[:, :, 0]  # [b, h, m]
    a0 = pattern[..., 0]  # [b, h, q]
    s = torch.einsum("bhqk,bhkm->bhqm", pattern[..., 1:], vt[:, :, 1:])
    oh = s + a0[..., None] * v0[:, :, None]
    mass = pattern[..., 1:].sum(-1)
    sbar = s / mass[..., None]
    return vt, v0, a0, s, sbar, oh, mass


def cos(a, b):
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


# ----------------------------------------------------------------------------- rates
def test_sink_rate_and_key_scores_brute_force():
    pattern, _, _, qm = random_layer(lengths=[10, 6], seed=1)
    T = 10
    rate = sink_rate(pattern, qm)
    for b, n in enumerate([10, 6]):
        torch.testing.assert_close(rate[b], pattern[b, :, :n, 0].mean(-1))
    ks = key_scores(pattern, True, qm)
    bi = key_scores(pattern, False, qm)
    for b, n in enumerate([10, 6]):
        for j in range(T):
            want = (
                pattern[b, :, :n, j].sum(-1) / (n - j)
                if j < n
                else torch.zeros(4, dtype=torch.float64)
            )
            torch.testing.assert_close(ks[b, :, j], want)
            torch.testing.assert_close(bi[b, :, j], pattern[b, :, :n, j].sum(-1) / n)
    # no padding: Gu's formula sum_i a_ij / (T - j)
    p2, *_ = random_layer(seed=2)
    want = p2.sum(-2) / (T - torch.arange(T, dtype=torch.float64))
    torch.testing.assert_close(key_scores(p2), want)


def test_sink_heads_threshold_and_share():
    pattern, *_ = random_layer(seed=3)
    ks = key_scores(pattern)[..., 0]
    for thr in (0.0, 0.3, float(ks.median()), 1.0):
        heads = sink_heads(pattern, threshold=thr)
        assert torch.equal(heads, ks > thr)
        torch.testing.assert_close(
            sink_head_share(pattern, threshold=thr), (ks > thr).float().mean(-1)
        )
    assert sink_head_share(pattern, threshold=1.0).eq(0).all()


# ----------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("causal", [True, False])
def test_geometry_matches_brute_force(causal):
    pattern, v, W_O, _ = random_layer(causal=causal, seed=4)
    g = sink_geometry(pattern, v, W_O, causal=causal)
    _vt, v0, a0, s, sbar, oh, _mass = explicit(pattern, v, W_O)
    sl = slice(1, None) if causal else slice(None)  # causal query 0 sees only the sink
    torch.testing.assert_close(g.sink_value_norm, v0.norm(dim=-1))
    torch.testing.assert_close(
        g.anti_alignment[..., sl], cos(v0[:, :, None].expand_as(s), s)[..., sl]
    )
    torch.testing.assert_close(g.semantic_norm[..., sl], sbar.norm(dim=-1)[..., sl])
    torch.testing.assert_close(g.head_output_norm, oh.norm(dim=-1))
    d = sbar - v0[:, :, None]
    rho = ((sbar * d).sum(-1) / (d * d).sum(-1))[..., sl]
    torch.testing.assert_close(g.rho_star[..., sl], rho)
    # f(ρ*) from the explicit vectors
    fmin = (sbar - g.rho_star[..., None] * d).norm(dim=-1)[..., sl]
    torch.testing.assert_close(g.min_norm[..., sl], fmin)
    # head intervention: o^h -> o^h - α_i0 ṽ_0 = s^h
    o_new = oh - a0[..., None] * v0[:, :, None]
    torch.testing.assert_close(g.head_delta_norm, o_new.norm(dim=-1) - oh.norm(dim=-1))
    torch.testing.assert_close(
        g.head_delta_cos[..., sl], (cos(o_new, sbar) - cos(oh, sbar))[..., sl]
    )
    # layer intervention: o -> o - Σ_h α^h_i0 ṽ^h_0
    o = oh.sum(1)
    o_lay = o - (a0[..., None] * v0[:, :, None]).sum(1)
    s_dir = s.sum(1)
    torch.testing.assert_close(g.output_norm, o.norm(dim=-1))
    torch.testing.assert_close(g.delta_norm, o_lay.norm(dim=-1) - o.norm(dim=-1))
    torch.testing.assert_close(g.delta_cos[..., sl], (cos(o_lay, s_dir) - cos(o, s_dir))[..., sl])
    if causal:  # query 0: s = 0, so the cosine is undefined and masked
        assert not g.delta_cos_valid[:, 0].any() and (g.delta_cos[:, 0] == 0).all()
    if causal:
        assert not g.curve_valid[..., 0].any() and not g.rho_star_valid[..., 0].any()
        assert g.curve_valid[..., 1:].all() and "all attention on the sink" in g.masked_reason


def test_norm_curve_brute_force_and_rho_star_is_argmin():
    pattern, v, W_O, _ = random_layer(heads=2, kv_heads=1, T=12, seed=5)
    g = sink_geometry(pattern, v, W_O)
    _vt, v0, a0, _s, sbar, _oh, _mass = explicit(pattern, v, W_O)
    grid = torch.linspace(-3.0, 4.0, 14_001, dtype=torch.float64)
    # brute-force curve ‖ρ ṽ_0 + (1 − ρ) s̄‖ on a coarse grid, explicit vectors
    coarse = grid[::200]
    vec = (
        coarse[:, None, None, None, None] * v0[:, :, None]
        + (1 - coarse)[:, None, None, None, None] * sbar
    )
    brute = vec.norm(dim=-1).permute(1, 2, 3, 0)  # [b, h, q, R]
    curve = g.norm_curve(coarse)
    ok = g.curve_valid
    torch.testing.assert_close(curve[ok], brute[ok])
    assert (curve[~ok] == 0).all()
    # the curve at the observed rate is the head output norm
    at_obs = (a0[..., None] * v0[:, :, None] + (1 - a0)[..., None] * sbar).norm(dim=-1)
    torch.testing.assert_close(at_obs[ok], g.head_output_norm[ok])
    # ρ* is the argmin of the brute-force curve on a fine grid (step 5e-4)
    step = float(grid[1] - grid[0])
    for b, h, i in g.rho_star_valid.nonzero().tolist():
        rs = float(g.rho_star[b, h, i])
        if not -2.9 < rs < 3.9:
            continue
        f = (grid[:, None] * v0[b, h] + (1 - grid)[:, None] * sbar[b, h, i]).norm(dim=-1)
        assert abs(float(grid[f.argmin()]) - rs) <= step + 1e-9
        assert float(f.min()) >= float(g.min_norm[b, h, i]) - 1e-9
    assert g.rho_star_valid[..., 1:].all()
    # convexity on the grid
    second = curve[..., 2:] - 2 * curve[..., 1:-1] + curve[..., :-2]
    assert (second[ok] >= -1e-9).all()


def test_functional_wrappers_agree():
    pattern, v, W_O, _ = random_layer(seed=6)
    g = sink_geometry(pattern, v, W_O)
    curve, ok = output_norm_curve(pattern, v, W_O, [0.0, 0.5, 1.0])
    assert torch.equal(ok, g.curve_valid)
    torch.testing.assert_close(curve, g.norm_curve([0.0, 0.5, 1.0]))
    rs, rok = optimal_sink_rate(pattern, v, W_O)
    assert torch.equal(rs, g.rho_star) and torch.equal(rok, g.rho_star_valid)


# ----------------------------------------------------------------------------- masks
def test_degenerate_cases_masked_not_nan():
    T, d = 4, 3
    pattern = torch.zeros(1, 3, T, T, dtype=torch.float64)
    pattern[0, 0, :, 0] = 1.0  # head 0: all mass on the sink
    pattern[0, 1] = torch.full((T, T), 1.0 / T)  # head 1: uniform ...
    pattern[0, 2] = torch.full((T, T), 1.0 / T)
    v = torch.randn(1, T, 3, d, dtype=torch.float64)
    v[0, 1:, 1] = v[0, 0, 1]  # ... and every value equal: s̄ = ṽ_0, flat curve
    v[0, 0, 2] = 0.0  # head 2: zero sink value
    W_O = torch.randn(3, d, 5, dtype=torch.float64)
    g = sink_geometry(pattern, v, W_O, causal=False)
    for f in g.__dataclass_fields__:
        t = getattr(g, f)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            assert torch.isfinite(t).all(), f
    assert not g.curve_valid[0, 0].any() and not g.rho_star_valid[0, 0].any()
    assert (g.norm_curve([0.0, 0.5, 1.0])[0, 0] == 0).all()
    assert g.curve_valid[0, 1].all() and not g.rho_star_valid[0, 1].any()
    flat = g.norm_curve(torch.linspace(0, 1, 5, dtype=torch.float64))[0, 1]
    torch.testing.assert_close(flat, g.semantic_norm[0, 1, :, None].expand_as(flat))
    assert not g.anti_alignment_valid[0, 2].any() and g.rho_star_valid[0, 2].all()
    torch.testing.assert_close(g.rho_star[0, 2], torch.ones(T, dtype=torch.float64))
    assert "flat curve" in g.masked_reason and "all attention on the sink" in g.masked_reason

    gz = sink_geometry(pattern, v, torch.zeros_like(W_O), causal=False)
    assert not gz.anti_alignment_valid.any() and not gz.delta_cos_valid.any()
    assert torch.isfinite(gz.rho_star).all() and not gz.rho_star_valid.any()


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 3),
    T=st.integers(1, 16),
    d_head=st.integers(1, 5),
    d_model=st.integers(1, 10),
    causal=st.booleans(),
    pad=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_random_layers_never_nan(batch, kv_heads, group, T, d_head, d_model, causal, pad, seed):
    g0 = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (batch,), generator=g0).tolist() if pad else None
    pattern, v, W_O, qm = random_layer(
        batch, kv_heads * group, kv_heads, T, d_head, d_model, causal, lengths, seed
    )
    g = sink_geometry(pattern, v, W_O, causal=causal, query_mask=qm)
    for f in g.__dataclass_fields__:
        t = getattr(g, f)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            assert torch.isfinite(t).all(), f
    assert (g.anti_alignment.abs() <= 1 + 1e-9).all()
    if qm is not None:
        pad_q = ~qm[:, None, :].expand_as(g.curve_valid)
        assert not g.curve_valid[pad_q].any() and (g.head_output_norm[pad_q] == 0).all()
    # at the observed rate the curve equals the head output norm
    ok = g.curve_valid
    a0 = pattern[..., 0]
    f_obs = torch.sqrt((g.sbar_minus_sink_norm * (a0 - g.rho_star)) ** 2 + g.min_norm**2)
    sel = ok & g.rho_star_valid
    torch.testing.assert_close(f_obs[sel], g.head_output_norm[sel], atol=1e-8, rtol=1e-6)


# ----------------------------------------------------------------------------- io / errors
def test_save_load_summary_plots(tmp_path):
    pattern, v, W_O, qm = random_layer(lengths=[10, 7], seed=8)
    g = sink_geometry(pattern, v, W_O, query_mask=qm)
    back = Result.load(g.save(tmp_path / "s.safetensors"))
    assert isinstance(back, SinkGeometry) and back.causal and back.threshold == 0.3
    torch.testing.assert_close(back.rho_star, g.rho_star)
    summ = g.headline()
    assert set(summ) >= {"sink_rate", "anti_alignment", "rho_star_median", "delta_norm"}
    import matplotlib.pyplot as plt

    for fig in (g.plot_norm_curve(), g.plot_rates()):
        assert isinstance(fig, plt.Figure)
        plt.close(fig)


def test_errors():
    pattern, v, W_O, _ = random_layer()
    with pytest.raises(ValueError, match="sink_index"):
        sink_geometry(pattern, v, W_O, sink_index=10)
    with pytest.raises(ValueError, match="causal=False"):
        key_scores(pattern[:, :, :5], causal=True)
    with pytest.raises(ValueError, match="no real query"):
        sink_rate(pattern, torch.zeros(2, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="query_mask"):
        sink_rate(pattern, torch.ones(2, 10))
