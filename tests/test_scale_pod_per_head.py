"""analysis.scale_pod per head: the batched per-head path against the head-mean path
(H = 1 invariant, brute force per head), the quantities linear in the per-head second
moments, the head-diversity summary, inactive heads, results and the probe entry point."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.scale_pod import (
    ScalePODHeadsLayer,
    ScalePODHeadsResult,
    ScalePODOptions,
    head_diversity,
    lag_fields,
    scale_pod,
    scale_pod_heads,
    scale_pod_heads_layer,
    scale_pod_layer,
)
from tl_spectral.results import Result

CENTER = ScalePODOptions(center=True)

f64 = torch.float64
_POD_KEYS = ("dim", "n_available", "H_star", "H_star_saturated", "H_star_str", "tspec_n_fit")
_POD_FLOATS = ("total_energy", "beta", "T_spec", "tspec_r2")


def _patterns(N, H, T, seed=0, causal=True, dtype=f64):
    """Softmax attention patterns ``[N, H, T, T]``, heads of different sharpness."""
    g = torch.Generator().manual_seed(seed)
    temp = torch.linspace(0.5, 3.0, H, dtype=dtype)[None, :, None, None]
    logits = torch.randn(N, H, T, T, generator=g, dtype=dtype) * temp
    if causal:
        logits = logits + torch.triu(torch.full((T, T), -torch.inf, dtype=dtype), 1)
    return torch.softmax(logits, -1)


def _head_fields(N=10, H=3, T=24, seed=0, causal=True, max_lag=None):
    F, lags = lag_fields(_patterns(N, H, T, seed, causal), causal=causal, max_lag=max_lag)
    return F, lags  # [N, H, T, n_lags]


def _assert_pod_summary(got: dict, ref: dict, rtol: float):
    for k in _POD_KEYS:
        assert got[k] == ref[k], (k, got[k], ref[k])
    for k in _POD_FLOATS:
        assert got[k] == pytest.approx(ref[k], rel=rtol, abs=1e-12), k


def _assert_head_equals_layer(r: ScalePODHeadsLayer, h: int, ref, rtol: float = 1e-9):
    """Head ``h`` of a per-head result equals the head-mean path ``ref`` (a ScalePODLayer)."""
    assert r.active[h]
    assert r.dominant_scales[h] == pytest.approx(ref.dominant_scales, rel=1e-12)
    E = ref.scale_energy
    assert torch.allclose(r.scale_energy[h], E, rtol=rtol, atol=1e-13 * float(E.max()))
    at = ref.scalogram
    assert torch.allclose(r.scalogram[h], at, rtol=rtol, atol=1e-12 * float(at.max()))
    for b, k in enumerate(r.band_names()):
        assert float(r.band_energy[h, b]) == pytest.approx(ref.band_energy[k], rel=rtol, abs=1e-12)
    n = ref.full["n_available"]
    assert torch.allclose(r.eigenvalues(h), ref.full_eigenvalues, rtol=rtol, atol=1e-13)
    assert torch.all(r.full_eigenvalues[h, n:] == 0)
    _assert_pod_summary(r.full[h], ref.full, rtol)
    assert int(r.H_star[h]) == ref.H_star and float(r.T_spec[h]) == pytest.approx(ref.T_spec, rel=rtol)
    assert len(r.bands[h]) == ref.n_bands
    for b, band in enumerate(ref.bands):
        got = r.bands[h][b]
        for k in ("band", "scale", "sigma", "lag_min", "lag_max", "n_lags"):
            assert got[k] == band[k], k
        _assert_pod_summary(got, band, rtol)
        assert torch.allclose(r.eigenvalues(h, b), ref.band_eigenvalues[str(b)], rtol=rtol, atol=1e-13)
        assert int(r.band_H_star[h, b]) == band["H_star"]
        assert float(r.band_scales[h, b]) == band["scale"]
    assert torch.all(r.band_H_star[h, ref.n_bands :] == -1)
    assert torch.all(torch.isnan(r.band_scales[h, ref.n_bands :]))


# ----------------------------------------------------------------------------- (1) H = 1
@pytest.mark.parametrize("causal", [True, False])
def test_head_mean_through_per_head_path_is_todays_result(causal):
    """The mean of the per-head fields, fed as one head, gives scale_pod_layer's results."""
    F4, lags = _head_fields(N=12, H=4, T=24, seed=1, causal=causal)
    Fbar = F4.mean(1)  # the head-mean field [N, T, n_lags]
    ref = scale_pod_layer(Fbar, lags, coherence_queries=None, options=CENTER)
    r = scale_pod_heads_layer(Fbar[:, None], lags, options=CENTER)
    assert r.n_heads == 1 and r.causal == causal
    _assert_head_equals_layer(r, 0, ref, rtol=1e-9)
    # float32 fields: the same to float32 round-off of the Grams
    ref32 = scale_pod_layer(Fbar.float(), lags, coherence_queries=None, options=CENTER)
    r32 = scale_pod_heads_layer(Fbar.float()[:, None], lags, options=CENTER)
    assert r32.dominant_scales[0] == ref32.dominant_scales
    assert int(r32.H_star[0]) == ref32.H_star
    assert torch.allclose(r32.eigenvalues(0), ref32.full_eigenvalues, rtol=1e-5, atol=1e-9)
    assert float(r32.T_spec[0]) == pytest.approx(ref32.T_spec, rel=1e-5)


def test_model_level_h1_matches_scale_pod():
    fields, ids = [], [3, 5]
    for layer in range(2):
        F4, lags = _head_fields(N=10, H=2, T=20, seed=10 + layer, max_lag=14)
        fields.append(F4.mean(1))
    ref = scale_pod(fields, lags, n_heads=2, layer_ids=ids, coherence_queries=None, options=CENTER)
    res = scale_pod_heads([f[:, None] for f in fields], lags, layer_ids=ids, options=CENTER)
    assert isinstance(res, ScalePODHeadsResult) and res.n_layers == 2
    for a, b in zip(res.layers, ref.layers):
        assert a.layer == b.layer
        _assert_head_equals_layer(a, 0, b)


# ----------------------------------------------------------------------------- (2) brute force
@pytest.mark.parametrize(
    "causal,lag_window,head_chunk", [(True, "signed", None), (True, "signed", 2), (False, "absolute", 1)]
)
def test_each_head_equals_head_mean_path_on_its_field(causal, lag_window, head_chunk):
    N, H, T = 10, 3, 24
    F4, lags = _head_fields(N, H, T, seed=2, causal=causal)
    opts = ScalePODOptions(center=True, lag_window=lag_window)
    r = scale_pod_heads_layer(F4, lags, head_chunk=head_chunk, options=opts)
    assert r.scalogram.shape == (H, 48, lags.numel())
    assert r.full_eigenvalues.shape == (H, N) and r.band_eigenvalues.shape == (H, 3, N)
    for h in range(H):  # brute force: today's path on that head's field alone
        ref = scale_pod_layer(F4[:, h], lags, coherence_queries=None, options=opts)
        _assert_head_equals_layer(r, h, ref)
        assert float(r.peak_scale[h]) == float(r.scales[ref.scale_energy.argmax()])


def test_fluctuations_passed_without_centering():
    F4, lags = _head_fields(8, 2, 16, seed=3)
    u = F4 - F4.mean(0)
    r = scale_pod_heads_layer(u, lags)
    assert r.centered == [True, True]
    for h in range(2):
        _assert_head_equals_layer(r, h, scale_pod_layer(u[:, h], lags, coherence_queries=None))
    raw = scale_pod_heads_layer(F4 + 1.0, lags)  # not mean-free: up to N modes
    assert raw.centered == [False, False]
    ref = scale_pod_layer(F4[:, 1] + 1.0, lags, coherence_queries=None)
    _assert_head_equals_layer(raw, 1, ref)


# ----------------------------------------------------------------------------- (3) linearity
def test_what_is_linear_in_the_per_head_moments():
    """E_h(a, tau) and the POD total energy are means over (document, query) of quadratic
    quantities, i.e. linear in each head's second moments: their mean over heads equals the
    values of the ensemble that pools the heads as extra documents (exact). Of the head-mean
    field they are not the mean (E is quadratic in the field): Jensen gives
    E_mean(a, tau) <= mean_h E_h(a, tau), with equality when the heads coincide."""
    N, H, T = 10, 3, 20
    F4, lags = _head_fields(N, H, T, seed=4)
    u = F4 - F4.mean(0)  # per-head fluctuations (then also the pooled ones are mean-free per head)
    r = scale_pod_heads_layer(u, lags)
    pooled = scale_pod_layer(u.transpose(0, 1).reshape(H * N, T, -1), lags, coherence_queries=None)
    assert torch.allclose(r.scalogram.mean(0), pooled.scalogram, rtol=1e-10, atol=1e-15)
    assert torch.allclose(r.scale_energy.mean(0), pooled.scale_energy, rtol=1e-10)
    totals = [r.full[h]["total_energy"] for h in range(H)]
    assert sum(totals) / H == pytest.approx(pooled.full["total_energy"], rel=1e-10)
    # the head-mean field: E(mean) <= mean E (pointwise), strictly less in total here
    mean_field = scale_pod_layer(u.mean(1), lags, coherence_queries=None)
    tol = 1e-12 * float(r.scalogram.max())
    assert torch.all(mean_field.scalogram <= r.scalogram.mean(0) + tol)
    assert mean_field.full["total_energy"] < sum(totals) / H
    # identical heads: every per-head quantity is the head-mean field's
    same = u[:, :1].expand(N, H, T, u.shape[-1]).contiguous()
    rs = scale_pod_heads_layer(same, lags)
    ref = scale_pod_layer(u[:, 0], lags, coherence_queries=None)
    for h in range(H):
        _assert_head_equals_layer(rs, h, ref)
    assert rs.diversity["n_scale_classes"] == 1 and rs.diversity["band_entropy_bits"] == 0.0
    assert rs.diversity["mean_pairwise_tv"] == pytest.approx(0.0, abs=1e-12)
    # opposite heads cancel in the mean field, each keeps its own energy
    pm = torch.stack([u[:, 0], -u[:, 0]], 1)
    rp = scale_pod_heads_layer(pm, lags)
    assert torch.allclose(rp.scale_energy[0], rp.scale_energy[1])
    assert float(pm.mean(1).abs().max()) == 0.0


# ----------------------------------------------------------------------------- (4) hypothesis
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    N=st.integers(3, 6),
    H=st.integers(1, 3),
    T=st.integers(6, 12),
    causal=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_random_shapes_match_brute_force(N, H, T, causal, seed):
    F4, lags = _head_fields(N, H, T, seed=seed, causal=causal)
    r = scale_pod_heads_layer(F4, lags, head_chunk=2, options=CENTER)
    d = r.diversity
    assert d["n_heads"] == H and d["n_active"] == sum(r.active)
    for h in range(H):
        if not r.active[h]:
            continue
        ref = scale_pod_layer(F4[:, h], lags, coherence_queries=None, options=CENTER)
        assert r.dominant_scales[h] == pytest.approx(ref.dominant_scales, rel=1e-12)
        assert int(r.H_star[h]) == ref.H_star
        assert torch.allclose(r.eigenvalues(h), ref.full_eigenvalues, rtol=1e-8, atol=1e-13)
        assert [b["H_star"] for b in r.bands[h]] == [b["H_star"] for b in ref.bands]
        assert float(r.band_energy[h].sum()) == pytest.approx(1.0)
    assert 0.0 <= d["band_entropy_bits"] <= math.log2(3) + 1e-12
    assert 1 <= d["n_scale_classes"] <= d["n_active"]
    assert 0.0 <= d["mean_pairwise_tv"] <= 1.0 + 1e-12
    assert sum(d["band_counts"].values()) == d["n_active"]


# ----------------------------------------------------------------------------- diversity
def test_head_diversity_definitions():
    scales = torch.tensor([2.0, 4.0, 8.0, 16.0, 32.0], dtype=f64)
    E = torch.tensor(
        [
            [1.0, 0, 0, 0, 0],  # fine, peak 2
            [0.0, 1, 0, 0, 0],  # fine, peak 4 (ratio 2 >= 1.5: a new class)
            [0.0, 1, 0, 0, 0],  # same as head 1
            [0.0, 0, 0, 0, 1],  # coarse, peak 32
            [0.0, 0, 0, 0, 0],  # inactive
        ],
        dtype=f64,
    )
    band = torch.tensor(
        [[1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0], [0, 0, 1.0], [math.nan] * 3], dtype=f64
    )
    peak = torch.tensor([2.0, 4.0, 4.0, 32.0, math.nan], dtype=f64)
    hs = torch.tensor([3, 5, 5, 9, 0])
    d = head_diversity(E, scales, band, peak, peak, hs, [True, True, True, True, False])
    assert d["n_active"] == 4
    assert d["scale_classes"] == [0, 1, 1, 2, None] and d["n_scale_classes"] == 3
    assert d["band_assignment"] == ["fine", "fine", "fine", "coarse", None]
    assert d["band_counts"] == {"fine": 3, "medium": 0, "coarse": 1}
    p = [0.75, 0.25]
    assert d["band_entropy_bits"] == pytest.approx(-sum(x * math.log2(x) for x in p))
    assert d["band_entropy_norm"] == pytest.approx(d["band_entropy_bits"] / math.log2(3))
    assert d["peak_scale_ratio"] == 16.0
    logs = torch.log2(torch.tensor([2.0, 4.0, 4.0, 32.0]))
    assert d["log2_peak_scale_std"] == pytest.approx(float(logs.std(unbiased=False)))
    assert d["mean_pairwise_tv"] == pytest.approx(5 / 6)  # 5 of 6 pairs disjoint
    assert d["band_share_mean"]["fine"] == pytest.approx(0.75)
    assert (d["H_star_min"], d["H_star_max"], d["H_star_mean"]) == (3, 9, 5.5)
    json.dumps(d)


def test_inactive_head_is_reported_not_fatal():
    """A head whose field never fluctuates (e.g. always on the first token) is inactive;
    the other heads get exactly their own results."""
    F4, lags = _head_fields(8, 3, 16, seed=5)
    F4[:, 1] = F4[0, 1]  # head 1 identical in every document: zero fluctuation
    r = scale_pod_heads_layer(F4, lags, options=CENTER)
    assert r.active == [True, False, True]
    assert r.dominant_scales[1] == [] and r.full[1] is None and r.bands[1] == []
    assert int(r.H_star[1]) == 0 and math.isnan(float(r.T_spec[1]))
    assert math.isnan(float(r.peak_scale[1])) and torch.all(r.full_eigenvalues[1] == 0)
    assert r.diversity["n_active"] == 2 and r.diversity["band_assignment"][1] is None
    for h in (0, 2):
        _assert_head_equals_layer(
            r, h, scale_pod_layer(F4[:, h], lags, coherence_queries=None, options=CENTER)
        )
    assert r.to_rows()[1]["active"] is False
    with pytest.raises(ValueError, match="zero fluctuation energy in every head"):
        scale_pod_heads_layer(F4[:, 1:2], lags, options=CENTER)


def test_errors():
    F4, lags = _head_fields(4, 2, 8)
    with pytest.raises(ValueError, match=r"\[N documents, H heads"):
        scale_pod_heads_layer(F4[:, 0], lags)
    with pytest.raises(ValueError, match="at least N=2"):
        scale_pod_heads_layer(F4[:1], lags)
    with pytest.raises(ValueError, match="unequal shape across layers"):
        scale_pod_heads([F4, F4[:, :1]], lags)
    with pytest.raises(ValueError, match="lag_window"):
        scale_pod_heads_layer(F4, lags, options=ScalePODOptions(lag_window="x"))
    bad = F4.clone()
    bad[1, 1, 2, 3] = math.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        scale_pod_heads_layer(bad, lags, head_chunk=1)
    r = scale_pod_heads_layer(list(F4), lags, options=CENTER)  # a sequence of [H, T, n_lags]
    with pytest.raises(ValueError, match="head must lie"):
        r.eigenvalues(2)


# ----------------------------------------------------------------------------- (5) results
def test_save_load_roundtrip(tmp_path):
    fields = [_head_fields(8, 3, 16, seed=20 + i)[0] for i in range(2)]
    lags = torch.arange(16)
    fields[1][:, 2] = fields[1][0, 2]  # an inactive head: NaNs and None survive the trip
    res = scale_pod_heads(fields, lags, layer_ids=[1, 4], options=CENTER)
    d = res.to_dict(include_curves=True)
    json.dumps(d)
    assert [row["layer"] for row in res.diversity_table()] == [1, 4]
    assert len(res.to_rows()) == 6
    back = Result.load(res.save(tmp_path / "heads.safetensors"))
    assert isinstance(back, ScalePODHeadsResult) and back.n_layers == 2
    for a, b in zip(res.layers, back.layers):
        assert isinstance(b, ScalePODHeadsLayer)
        for name in ("scalogram", "scale_energy", "band_energy", "peak_scale", "band_scales",
                     "full_eigenvalues", "band_eigenvalues", "H_star", "T_spec", "band_H_star"):
            assert torch.equal(torch.nan_to_num(getattr(a, name)),
                               torch.nan_to_num(getattr(b, name))), name
        assert a.full == b.full and a.bands == b.bands and a.active == b.active
        assert a.dominant_scales == b.dominant_scales and a.layer == b.layer
        assert json.dumps(a.diversity) == json.dumps(b.diversity)
    one = Result.load(res.layers[0].save(tmp_path / "layer.safetensors"))
    assert isinstance(one, ScalePODHeadsLayer)
    assert torch.equal(one.full_eigenvalues, res.layers[0].full_eigenvalues)


# ----------------------------------------------------------------------------- probe
def test_attention_fields_per_head_scale_pod(native_ln):
    from tl_spectral.probes import run_probes
    from tl_spectral.probes.fields import AttentionFieldProbe

    toks = torch.randint(0, 50, (6, 24), generator=torch.Generator().manual_seed(3))
    out = run_probes(
        native_ln,
        toks,
        [AttentionFieldProbe(layers=[0, 2], per_head=True, name="ph"),
         AttentionFieldProbe(layers=[0, 2], name="hm")],
        batch_size=3,
        progress=False,
    )
    ph, hm = out["ph"], out["hm"]
    res = ph.scale_pod(n_heads=4)
    assert isinstance(res, ScalePODHeadsResult)
    assert [layer.layer for layer in res.layers] == [0, 2]
    assert all(layer.n_heads == 4 for layer in res.layers)
    # the head mean of the per-head fluctuations is the head-mean fluctuation field
    u = ph.fluctuations(2)
    torch.testing.assert_close(u.mean(1), hm.fluctuations(2), atol=1e-6, rtol=1e-5)
    one = scale_pod_heads_layer(u.mean(1, keepdim=True), ph.lags)
    ref = hm.scale_pod(n_heads=4, coherence_queries=None).layers[1]
    assert one.dominant_scales[0] == pytest.approx(ref.dominant_scales)
    assert int(one.H_star[0]) == ref.H_star


def test_scale_pod_options_is_the_one_way_to_pass_the_settings():
    """ScalePODOptions carries the settings of scale_pod_layer, scale_pod_heads_layer,
    scale_pod and scale_pod_heads: validated once, frozen. The old keywords still work for
    one release with a DeprecationWarning naming the replacement, give the same numbers,
    and are refused next to options=; an unknown keyword is a TypeError."""
    import dataclasses

    g = torch.Generator().manual_seed(3)
    F = torch.randn(6, 2, 16, 16, generator=g, dtype=torch.float64)
    opts = ScalePODOptions(epsilon=0.2, max_dominant=2, center=True)
    a = scale_pod_heads_layer(F, options=opts)
    with pytest.warns(DeprecationWarning, match=r"options=ScalePODOptions\(center=\.\.\."):
        b = scale_pod_heads_layer(F, epsilon=0.2, max_dominant=2, center=True)
    assert torch.equal(a.scale_energy, b.scale_energy) and torch.equal(a.H_star, b.H_star)
    la = scale_pod_layer(F[:, 0], options=opts, n_modes=2, coherence_queries=None)
    with pytest.deprecated_call(match="scale_pod_layer"):
        lb = scale_pod_layer(F[:, 0], epsilon=0.2, max_dominant=2, center=True, n_modes=2,
                             coherence_queries=None)
    assert la.full == lb.full and torch.equal(la.full_modes, lb.full_modes)
    for fn, arg in ((scale_pod, [F[:, 0]]), (scale_pod_heads, [F])):
        kw = {"n_heads": 2} if fn is scale_pod else {}
        with pytest.deprecated_call(match=fn.__name__):
            old = fn(arg, epsilon=0.2, **kw)
        new = fn(arg, options=ScalePODOptions(epsilon=0.2), **kw)
        assert old.layers[0].config == new.layers[0].config
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.epsilon = 0.3  # type: ignore[misc]
    with pytest.raises(ValueError, match="not both"):
        scale_pod_layer(F[:, 0], options=opts, epsilon=0.3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'epsilonn'"):
        scale_pod_layer(F[:, 0], epsilonn=0.3)
    with pytest.raises(ValueError, match="must be a ScalePODOptions"):
        scale_pod_heads_layer(F, options={"epsilon": 0.2})
    for bad, match in (({"epsilon": 1.0}, "epsilon"), ({"lag_window": "both"}, "lag_window"),
                       ({"max_dominant": 0}, "max_dominant"), ({"lag_chunk": 0}, "lag_chunk"),
                       ({"min_ratio": float("nan")}, "min_ratio")):
        with pytest.raises(ValueError, match=match):
            ScalePODOptions(**bad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_engine_head_mean_is_the_case_of_one_head(dtype):
    """The invariants the single engine (scale_pod_engine) relies on: the head-mean layer is
    the engine on one head, so scale_pod_layer(F) and scale_pod_heads_layer(F[:, None])
    agree bit for bit on the scalogram and dominant scales (same arithmetic), and to
    rounding on the eigenvalues (the same Grams; eigh there, eigvalsh here); and a Gram is
    formed only for band slots a head of the chunk uses."""
    from tl_spectral.analysis.scale_pod_engine import head_chunk, prepare

    g = torch.Generator().manual_seed(11)
    F = torch.randn(9, 20, 20, generator=g, dtype=torch.float64).cumsum(-1).to(dtype)
    opts = ScalePODOptions(center=True, max_dominant=6)
    lay = scale_pod_layer(F, options=opts, coherence_queries=None)
    hd = scale_pod_heads_layer(F[:, None], options=opts, scalogram_method="matmul")
    assert torch.equal(lay.scalogram, hd.scalogram[0])
    assert lay.dominant_scales == hd.dominant_scales[0]

    def close(x, y):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12 * float(x.abs().max()))

    n = lay.full["n_available"]
    close(lay.full_eigenvalues[:n], hd.full_eigenvalues[0, :n])
    for b, row in enumerate(lay.bands):
        close(lay.band_eigenvalues[str(b)], hd.eigenvalues(0, b))
        exact = ("band", "scale", "lag_min", "lag_max", "n_lags", "dim", "H_star", "n_available")
        assert {k: row[k] for k in exact} == {k: hd.bands[0][b][k] for k in exact}
    c = head_chunk(prepare(F[:, None], None, opts), 0, 1)
    assert c.grams.shape[1] == 1 + len(lay.bands) < 1 + opts.max_dominant
