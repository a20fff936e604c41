"""Offset-resolved QK geometry of rotary heads (geometry.rotary) against dense brute force:
``M(Δ) = W_Q R(Δ) W_Kᵀ`` formed as a d_model×d_model matrix per head and offset, its
symmetric / skew parts, their energies and singular values; averages over offset
distributions; Δ = 0 equal to qk_geometry; and R(Δ) against what Hugging Face models
(GPT-NeoX with partial rotary, Llama and Qwen2 with grouped-query heads) and the tl_spectral
GPT family actually compute, read from their own hooks."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_hf import boot, save_tiny  # noqa: E402

from tl_spectral.geometry.model import (  # noqa: E402
    UnreadableHeadsError,
    model_qk_geometry,
    model_rotary_geometry,
)
from tl_spectral.geometry.qk import qk_geometry  # noqa: E402
from tl_spectral.geometry.rotary import (  # noqa: E402
    PAIRINGS,
    RotarySpec,
    default_offsets,
    offset_distribution,
    rank_offset_sample,
    rotary_matrix,
    rotary_qk_geometry,
)
from tl_spectral.model_view import ModelView  # noqa: E402


def _dense(WQ, WK, spec, offsets):
    """Brute force: [layer, head, n, d_model, d_model] kernels and their sym / skew parts."""
    d = WQ.shape[-1]
    WK = WK.repeat_interleave(WQ.shape[1] // WK.shape[1], dim=1)
    R = rotary_matrix(spec, d, torch.as_tensor(offsets))
    M = torch.einsum("lhmd,nde,lhke->lhnmk", WQ.double(), R, WK.double())
    return M, 0.5 * (M + M.mT), 0.5 * (M - M.mT)


def _weights(seed, L=2, H=4, KV=2, dm=16, d=6):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(L, H, dm, d, generator=g, dtype=torch.float64),
            torch.randn(L, KV, dm, d, generator=g, dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), pairing=st.sampled_from(PAIRINGS),
       rd=st.sampled_from([2, 4, 6]), kv=st.sampled_from([1, 2, 4]),
       scaling=st.sampled_from([1.0, 0.7]),
       offsets=st.lists(st.integers(-300, 300), min_size=1, max_size=5))
def test_energies_and_spectra_equal_dense_brute_force(seed, pairing, rd, kv, scaling, offsets):
    WQ, WK = _weights(seed, KV=kv)
    spec = RotarySpec.from_base(rd, 50.0, pairing, attention_scaling=scaling)
    g = rotary_qk_geometry(WQ, WK, spec, offsets=offsets, n_ctx=12)
    M, F, R = _dense(WQ, WK, spec, offsets)
    nm, nf, nr = (x.square().sum((-2, -1)) for x in (M, F, R))
    tol = dict(rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(g.norm_M_sq, nm, **tol)
    torch.testing.assert_close(g.norm_F_sq, nf, **tol)
    torch.testing.assert_close(g.norm_R_sq, nr, **tol)
    torch.testing.assert_close(g.routing_fraction, nr / nm, **tol)
    k = g.sv_R.shape[-1]
    torch.testing.assert_close(g.sv_R, torch.linalg.svdvals(R)[..., :k], **tol)
    torch.testing.assert_close(g.sv_F, torch.linalg.svdvals(F)[..., :k], **tol)
    # nothing beyond the k = 2 d_head core: the dense spectra vanish there
    assert torch.linalg.svdvals(R)[..., k:].abs().max() < 1e-9
    # the trigonometric form reproduces the per-offset energies at the same offsets
    e = g.energies(offsets)
    torch.testing.assert_close(e["norm_R_sq"], nr, **tol)
    torch.testing.assert_close(e["norm_F_sq"], nf, **tol)


def test_without_spectra_every_other_field_is_the_same():
    """``spectra=False`` (the report without --save-raw) skips the singular values at the
    offsets: they and their ranks are NaN, every other field is bit for bit the full
    result's (the same cores, norms, forms and averages)."""
    import dataclasses
    import math

    WQ, WK = _weights(7, KV=2)
    spec = RotarySpec.from_base(4, 50.0, "adjacent")
    full = rotary_qk_geometry(WQ, WK, spec, offsets=[0, -3], n_ctx=12)
    cut = rotary_qk_geometry(WQ, WK, spec, offsets=[0, -3], n_ctx=12, spectra=False)
    skipped = {"sv_R", "sv_F", "eff_rank_R", "pr_R", "eff_rank_F", "pr_F"}
    for f in dataclasses.fields(full):
        a, b = getattr(full, f.name), getattr(cut, f.name)
        if f.name in skipped:
            assert a.shape == b.shape and bool(torch.isnan(b).all()), f.name
        elif isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
        elif isinstance(a, float) and math.isnan(a):
            assert math.isnan(b), f.name
        else:
            assert a == b, f.name


@pytest.mark.parametrize("dist", ["causal", "uniform", {0: 1.0, -3: 2.0, 5: 0.5}])
def test_distribution_averages_equal_brute_force(dist):
    WQ, WK = _weights(1)
    spec = RotarySpec.from_base(4, 30.0, "half")
    g = rotary_qk_geometry(WQ, WK, spec, offsets=[0, -1], distribution=dist, n_ctx=9)
    off, w = offset_distribution(dist, 9)
    M, F, R = _dense(WQ, WK, spec, off)
    nr, nf = R.square().sum((-2, -1)), F.square().sum((-2, -1))
    torch.testing.assert_close(g.mean_norm_R_sq, (nr * w).sum(-1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g.mean_norm_F_sq, (nf * w).sum(-1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g.mean_routing_fraction,
                               (nr * w).sum(-1) / ((nr + nf) * w).sum(-1), rtol=1e-10, atol=0)
    torch.testing.assert_close(g.mean_fraction_of_offsets, (nr / (nr + nf) * w).sum(-1),
                               rtol=1e-10, atol=0)
    from tl_spectral.geometry.qk import entropy_effective_rank

    rank = entropy_effective_rank(torch.linalg.svdvals(R))
    torch.testing.assert_close(g.mean_eff_rank_R, (rank * w).sum(-1), rtol=1e-8, atol=1e-8)


def test_rank_offset_sample_is_an_equal_mass_quantile_sample():
    off, w = offset_distribution("causal", 50)
    o, ww = rank_offset_sample(off, w, 7)
    assert o.numel() <= 7 and abs(float(ww.sum()) - 1.0) < 1e-12
    # each sampled offset is the one whose stratum holds the quantile (s + 1/2) / n
    srt = torch.argsort(off)
    cum = torch.cumsum(w[srt], 0)
    for s in range(7):
        q = (s + 0.5) / 7
        j = int((cum >= q - 1e-15).nonzero()[0])
        assert int(off[srt][j]) in o.tolist()
    # a mass point heavier than a stratum is drawn once with the strata it covers
    o2, w2 = rank_offset_sample(torch.tensor([0, -1, -2, -3, -4]),
                                torch.tensor([0.8, 0.05, 0.05, 0.05, 0.05], dtype=torch.float64), 4)
    assert dict(zip(o2.tolist(), w2.tolist())) == {-2: 0.25, 0: 0.75}
    o3, w3 = rank_offset_sample(off, w, 50)  # the whole support: unchanged
    assert torch.equal(o3, off) and torch.equal(w3, w)


@pytest.mark.parametrize("rank_offsets", [None, "auto", 5, 100])
def test_averaged_ranks_over_the_chosen_offsets_equal_brute_force(rank_offsets):
    WQ, WK = _weights(3)
    spec = RotarySpec.from_base(4, 30.0, "half")
    g = rotary_qk_geometry(WQ, WK, spec, offsets=[0], n_ctx=40, rank_offsets=rank_offsets,
                           progress=False)
    off, w = offset_distribution("causal", 40)
    exact = rank_offsets in (None, "auto", 100)  # auto: 16 heads of k = 12, cheap: exact
    assert g.mean_eff_rank_exact is exact
    if exact:
        assert torch.equal(g.rank_offsets, off) and torch.equal(g.rank_weights, w)
    else:
        ro, rw = rank_offset_sample(off, w, rank_offsets)
        assert torch.equal(g.rank_offsets, ro) and torch.equal(g.rank_weights, rw)
        off, w = ro, rw
    from tl_spectral.geometry.qk import entropy_effective_rank

    _, F, R = _dense(WQ, WK, spec, off)
    for got, part in ((g.mean_eff_rank_R, R), (g.mean_eff_rank_F, F)):
        want = (entropy_effective_rank(torch.linalg.svdvals(part)) * w).sum(-1)
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8)


def test_auto_rank_offsets_sample_within_the_budget_on_large_models():
    from tl_spectral.geometry import rotary

    off, w = offset_distribution("causal", 2048)
    # 12 x 12 heads of d_head 64 (k = 128): the exact mean is 144 x 2048 core spectra
    o, ww, exact = rotary._rank_plan("auto", off, w, rotary._core_units(144, 128))
    assert not exact and o.numel() == rotary.MIN_RANK_OFFSETS and abs(float(ww.sum()) - 1) < 1e-12
    o, ww, exact = rotary._rank_plan(None, off, w, rotary._core_units(144, 128))
    assert exact and o.numel() == 2048
    # a small model (6 x 8 heads of d_head 16, 256 positions) stays exact
    off, w = offset_distribution("causal", 256)
    assert rotary._rank_plan("auto", off, w, rotary._core_units(48, 32))[2]
    for bad in ("all", 0, -3, 2.5, True):
        with pytest.raises(ValueError, match="rank_offsets must be"):
            rotary._rank_plan(bad, off, w, 1.0)


def test_causal_distribution_counts_every_causal_pair_once():
    off, w = offset_distribution("causal", 5)
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    d = (j - i)[j <= i]
    counts = torch.stack([(d == o).sum() for o in off]).double()
    torch.testing.assert_close(w, counts / counts.sum())
    assert default_offsets(10).tolist() == [0, -1, -2, -4, -8, -9]


def test_offset_zero_equals_qk_geometry_exactly():
    WQ, WK = _weights(3, KV=2)
    for pairing in PAIRINGS:
        g = rotary_qk_geometry(WQ, WK, RotarySpec.from_base(4, 100.0, pairing),
                               offsets=[0, -5], n_ctx=8)
        q = qk_geometry(WQ, WK)
        for f in ("norm_R_sq", "norm_F_sq", "routing_fraction", "eff_rank_R", "pr_R",
                  "eff_rank_F", "pr_F"):
            assert torch.equal(getattr(g, f)[..., 0], getattr(q, f)), f
        assert torch.equal(g.sv_R[..., 0, :], q.sv_R)


@settings(max_examples=20, deadline=None)
@given(a=st.integers(-500, 500), b=st.integers(-500, 500), pairing=st.sampled_from(PAIRINGS),
       rd=st.sampled_from([2, 4, 8]), d=st.sampled_from([8, 9]))
def test_rotary_matrix_is_a_rotation_group_in_the_offset(a, b, pairing, rd, d):
    spec = RotarySpec.from_base(rd, 10000.0, pairing)
    Ra, Rb, Rab = (rotary_matrix(spec, d, x) for x in (a, b, a + b))
    torch.testing.assert_close(Ra @ Rb, Rab, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(Ra @ Ra.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(rotary_matrix(spec, d, 0), torch.eye(d, dtype=torch.float64))
    # coordinates past rotary_dim pass unchanged
    assert torch.equal(Ra[rd:, rd:], torch.eye(d - rd, dtype=torch.float64))


def test_bad_input_is_refused_clearly():
    WQ, WK = _weights(0)
    spec = RotarySpec.from_base(4)
    with pytest.raises(ValueError, match="needs n_ctx"):
        rotary_qk_geometry(WQ, WK, spec)
    with pytest.raises(ValueError, match="exceeds d_head"):
        rotary_qk_geometry(WQ, WK, RotarySpec.from_base(8), n_ctx=4)
    with pytest.raises(ValueError, match="integers"):
        rotary_qk_geometry(WQ, WK, spec, offsets=[0.5], n_ctx=4)
    with pytest.raises(ValueError, match="pairing"):
        RotarySpec.from_base(4, pairing="interleaved")
    with pytest.raises(ValueError, match="even"):
        RotarySpec.from_base(3)
    with pytest.raises(TypeError, match="RotarySpec"):
        rotary_qk_geometry(WQ, WK, {"rotary_dim": 4}, n_ctx=4)
    with pytest.raises(ValueError, match="weights"):
        offset_distribution(([0, -1], [1.0, -1.0]))


# ----------------------------------------------------------- Hugging Face rotary models
FAMS = {"gpt_neox": dict(d_model=64, n_heads=4), "llama": dict(d_model=32, n_heads=4),
        "qwen2": dict(d_model=32, n_heads=4)}


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    cache: dict = {}

    def get(family):
        if family not in cache:
            folder = tmp_path_factory.mktemp("rot_" + family)
            save_tiny(family, folder, seed=7, **FAMS[family])
            cache[family] = boot(folder)
        return cache[family]

    return get


@pytest.mark.parametrize("family", list(FAMS))
def test_rotary_metadata_is_read_from_the_model(bridges, family):
    b = bridges(family)
    view = ModelView(b)
    meta = view.rotary_metadata()
    d_head = view.d_head
    want_rd = d_head // 4 if family == "gpt_neox" else d_head  # rotary_pct = 0.25
    assert meta["rotary_dim"] == want_rd and meta["pairing"] == "half"
    torch.testing.assert_close(meta["inv_freq"],
                               RotarySpec.from_base(want_rd, 10000.0).inv_freq)


@pytest.mark.parametrize("family", list(FAMS))
def test_scores_from_the_model_hooks_equal_the_offset_kernel(bridges, family):
    """hook_attn_scores of the model equal (x W_Q + b_Q) R(j − i) (x W_K + b_K)ᵀ / sqrt(d)
    with x the attention input and R the kernel built from the model's rotary metadata."""
    b = bridges(family)
    view = ModelView(b)
    meta = view.rotary_metadata()
    spec = RotarySpec(meta["inv_freq"], meta["pairing"], meta["attention_scaling"])
    toks = torch.randint(1, 60, (2, 11), generator=torch.Generator().manual_seed(0))
    layer = 1
    names = {"x": view.hook_attn_in(layer), "s": f"blocks.{layer}.attn.hook_attn_scores"}
    _, cache = b.run_with_cache(toks, names_filter=lambda n: n in names.values())
    x = cache[names["x"]].double()
    s = cache[names["s"]].double()  # [batch, head, q, k]
    w = view.weights(layer)
    q = torch.einsum("bpm,hmd->bhpd", x, w.W_Q.double()) + w.b_Q.double()[None, :, None]
    k = torch.einsum("bpm,hmd->bhpd", x, w.W_K.double()) + w.b_K.double()[None, :, None]
    n = toks.shape[1]
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    R = rotary_matrix(spec, view.d_head, j - i)  # [q, k, d, d]
    want = torch.einsum("bhid,ijde,bhje->bhij", q, R, k) / view.d_head ** 0.5
    causal = j <= i
    torch.testing.assert_close(s[..., causal], want[..., causal], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", list(FAMS))
def test_model_rotary_geometry_equals_brute_force_on_folded_weights(bridges, family):
    b = bridges(family)
    view = ModelView(b)
    g = model_rotary_geometry(b, offsets=[0, -1, -7], average_ranks=False)
    st_ = view.stacked_weights(fold_ln=True)
    meta = view.rotary_metadata()
    spec = RotarySpec(meta["inv_freq"], meta["pairing"], meta["attention_scaling"])
    _, F, R = _dense(st_["W_Q"], st_["W_K"], spec, [0, -1, -7])
    nr, nf = R.square().sum((-2, -1)), F.square().sum((-2, -1))
    torch.testing.assert_close(g.routing_fraction, nr / (nr + nf), rtol=1e-6, atol=1e-9)
    assert g.n_kv_heads == view.n_heads  # ModelView repeats grouped key heads
    assert g.rotary_dim == meta["rotary_dim"]
    # the rotary metadata is not trivial: the fraction moves with the offset
    assert (g.routing_fraction[..., 0] - g.routing_fraction[..., 2]).abs().max() > 1e-4


@pytest.mark.parametrize("family", list(FAMS))
def test_model_qk_geometry_points_rotary_models_to_the_offset_resolved_call(bridges, family):
    with pytest.raises(UnreadableHeadsError, match="model_rotary_geometry"):
        model_qk_geometry(bridges(family))


def test_model_rotary_geometry_refuses_models_without_rotary_positions():
    from conftest import make_native

    with pytest.raises(UnreadableHeadsError, match="model_qk_geometry"):
        model_rotary_geometry(make_native(n_layers=1, n_heads=2, d_model=16, d_head=8))
