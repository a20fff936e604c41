"""Routing/filtering weight geometry: factored spectra vs dense brute force, invariants."""

from __future__ import annotations

import csv
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from tl_spectral.geometry.qk import (
    QKGeometry,
    entropy_effective_rank,
    participation_ratio,
    qk_geometry,
    recover_sd_from_qk,
    sd_geometry,
)
from tl_spectral.results import Result

F64 = torch.float64
RTOL = 1e-5


def _rand(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _dense(wq, wk):
    """Dense brute force for one head: (M, R, F), all [d_model, d_model]."""
    m = wq @ wk.T
    return m, 0.5 * (m - m.T), 0.5 * (m + m.T)


def _assert_multiset_close(a: torch.Tensor, b: torch.Tensor, rtol=RTOL):
    """Complex multisets equal up to rtol·max|a| (optimal matching, not sorting)."""
    a = a.to(torch.complex128).numpy()
    b = b.to(torch.complex128).numpy()
    assert a.shape == b.shape, (a.shape, b.shape)
    cost = np.abs(a[:, None] - b[None, :])
    r, c = linear_sum_assignment(cost)
    scale = max(np.abs(a).max(), 1e-300)
    assert cost[r, c].max() <= rtol * scale, (cost[r, c].max(), scale)


def _assert_sv_close(factored: torch.Tensor, dense: torch.Tensor, rtol=RTOL):
    k = factored.shape[-1]
    scale = dense.abs().max().clamp_min(1e-300)
    assert (factored - dense[..., :k]).abs().max() <= rtol * scale
    # the rest of the dense spectrum is (numerically) zero: rank ≤ 2 d_head
    if dense.shape[-1] > k:
        assert dense[..., k:].abs().max() <= rtol * scale


# ----------------------------------------------------------------------------- dense
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_factored_spectra_equal_dense(dtype):
    L, H, n, d = 2, 3, 32, 8
    wq, wk = _rand(L, H, n, d, seed=1, dtype=dtype), _rand(L, H, n, d, seed=2, dtype=dtype)
    g = qk_geometry(wq, wk)
    assert g.sv_R.shape == (L, H, 2 * d) and g.eig_real.shape == (L, H, d)
    assert g.routing_capacity.tolist() == [16, 16]
    for layer in range(L):
        for head in range(H):
            m, r, f = _dense(wq[layer, head].to(F64), wk[layer, head].to(F64))
            _assert_sv_close(g.sv_R[layer, head], torch.linalg.svdvals(r))
            _assert_sv_close(g.sv_F[layer, head], torch.linalg.svdvals(f))
            eig = torch.linalg.eigvals(m)
            top = eig[torch.argsort(eig.abs(), descending=True)[:d]]
            _assert_multiset_close(top, g.eigenvalues[layer, head])
            nm = m.square().sum()
            assert torch.isclose(g.norm_M_sq[layer, head], nm, rtol=1e-10)
            assert torch.isclose(g.routing_fraction[layer, head], r.square().sum() / nm, rtol=1e-10)
            assert torch.isclose(
                g.filtering_fraction[layer, head], f.square().sum() / nm, rtol=1e-10
            )
            sv = torch.linalg.svdvals(r)
            p = sv / sv.sum()
            p = p[p > 0]
            assert torch.isclose(
                g.eff_rank_R[layer, head], torch.exp(-(p * p.log()).sum()), rtol=1e-6
            )
            assert torch.isclose(g.pr_R[layer, head], sv.sum() ** 2 / sv.square().sum(), rtol=1e-6)
            n_pos = int((top.real > 1e-8 * top.abs().max()).sum())
            assert g.positive_share[layer, head] == pytest.approx(n_pos / d)
            assert bool(g.unstable[layer, head]) == (n_pos > 0)
    assert torch.equal(g.rotation_planes, g.eff_rank_R / 2)


def test_head_wider_than_model_dense():
    """d_head > d_model: capacity d_model, eigenvalues those of the d_model×d_model kernel."""
    n, d = 6, 8
    wq, wk = _rand(1, 2, n, d, seed=3), _rand(1, 2, n, d, seed=4)
    g = qk_geometry(wq, wk)
    assert g.routing_capacity.tolist() == [n]
    assert g.sv_R.shape[-1] == n and g.eig_real.shape[-1] == n
    for head in range(2):
        m, r, f = _dense(wq[0, head], wk[0, head])
        _assert_sv_close(g.sv_R[0, head], torch.linalg.svdvals(r))
        _assert_sv_close(g.sv_F[0, head], torch.linalg.svdvals(f))
        _assert_multiset_close(torch.linalg.eigvals(m), g.eigenvalues[0, head])


def test_never_forms_d_model_square():
    """d_model = 60000: a dense kernel would need ~29 GB in float64."""
    wq, wk = _rand(1, 2, 60_000, 4, seed=5), _rand(1, 2, 60_000, 4, seed=6)
    g = qk_geometry(wq, wk)
    assert g.sv_R.shape == (1, 2, 8)
    total = g.routing_fraction + g.filtering_fraction
    assert torch.allclose(total, torch.ones_like(total))
    # ‖M‖² from the Grams agrees with ‖R‖² + ‖F‖² from the cores
    assert torch.allclose(g.norm_M_sq, g.norm_R_sq + g.norm_F_sq, rtol=1e-10)


# ----------------------------------------------------------------------------- invariants
@settings(max_examples=25, deadline=None)
@given(
    n_layers=st.integers(1, 2),
    n_heads=st.integers(1, 3),
    d_model=st.integers(1, 24),
    d_head=st.integers(1, 10),
    log_scale=st.floats(-3, 3),
    seed=st.integers(0, 2**16),
)
def test_budget_sums_to_one(n_layers, n_heads, d_model, d_head, log_scale, seed):
    s = 10.0**log_scale
    wq = s * _rand(n_layers, n_heads, d_model, d_head, seed=seed)
    wk = _rand(n_layers, n_heads, d_model, d_head, seed=seed + 1)
    g = qk_geometry(wq, wk)
    total = g.routing_fraction + g.filtering_fraction
    assert torch.allclose(total, torch.ones_like(total), atol=1e-12)
    assert (g.routing_fraction >= 0).all() and (g.filtering_fraction >= 0).all()
    assert torch.allclose(g.norm_M_sq, g.norm_R_sq + g.norm_F_sq, rtol=1e-8)
    cap = min(2 * d_head, d_model)
    assert g.routing_capacity.tolist() == [cap] * n_layers
    assert (g.eff_rank_R <= cap + 1e-9).all() and (g.pr_R <= cap + 1e-9).all()
    assert (g.eff_rank_R >= 0).all()
    for t in (g.sv_R, g.sv_F, g.eff_rank_R, g.eff_rank_F, g.pr_F, g.positive_share):
        assert torch.isfinite(t).all()
    # R is skew: its singular values come in equal pairs
    sv = g.sv_R
    scale = sv.amax(-1, keepdim=True).clamp_min(1e-300)
    assert ((sv[..., 0 : cap - 1 : 2] - sv[..., 1:cap:2]).abs() <= 1e-8 * scale).all()
    # participation ratio ≤ entropy rank (Rényi order 2 ≤ Shannon)
    assert (g.pr_R <= g.eff_rank_R * (1 + 1e-9) + 1e-12).all()


def test_symmetric_kernel_has_zero_routing():
    w = _rand(2, 3, 16, 4, seed=7)
    g = qk_geometry(w, w)
    assert g.routing_fraction.abs().max() < 1e-12
    assert torch.allclose(g.filtering_fraction, torch.ones_like(g.filtering_fraction))
    assert g.sv_R.abs().max() < 1e-10 * g.sv_F.abs().max()
    # M = W Wᵀ is PSD: all eigenvalues real and positive → unstable
    assert g.eig_imag.abs().max() < 1e-10 * g.eig_real.abs().max()
    assert torch.allclose(g.positive_share, torch.ones_like(g.positive_share))
    assert g.unstable.all()


def test_antisymmetric_kernel_is_pure_routing():
    """W_K = W_Q Jᵀ with J skew → M = −W_Q J W_Qᵀ... skew: pure routing, one plane."""
    j = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=F64)
    wq = _rand(1, 4, 16, 2, seed=8)
    wk = wq @ j.T  # M = W_Q J W_Qᵀ, skew since J is skew
    g = qk_geometry(wq, wk)
    assert torch.allclose(g.routing_fraction, torch.ones_like(g.routing_fraction))
    assert g.filtering_fraction.abs().max() < 1e-12
    assert torch.allclose(g.eff_rank_R, torch.full_like(g.eff_rank_R, 2.0))
    assert torch.allclose(g.rotation_planes, torch.ones_like(g.rotation_planes))
    assert torch.allclose(g.pr_R, torch.full_like(g.pr_R, 2.0))
    # purely imaginary eigenvalues: marginally stable, none with Re > 0
    assert g.eig_real.abs().max() < 1e-10 * g.eig_imag.abs().max()
    assert (g.positive_share == 0).all() and not g.unstable.any()


def test_two_rotation_planes():
    """Two orthogonal planes with equal frequency → entropy rank 4, two planes."""
    j = torch.zeros(4, 4, dtype=F64)
    j[0, 1], j[1, 0], j[2, 3], j[3, 2] = 1.0, -1.0, 1.0, -1.0
    q, _ = torch.linalg.qr(_rand(12, 4, seed=9))
    g = qk_geometry(q[None, None], (q @ j.T)[None, None])
    assert g.eff_rank_R.item() == pytest.approx(4.0)
    assert g.rotation_planes.item() == pytest.approx(2.0)


def test_zero_head_is_finite():
    wq = torch.zeros(1, 2, 8, 3, dtype=F64)
    wq[0, 1] = _rand(8, 3, seed=10)
    g = qk_geometry(wq, _rand(1, 2, 8, 3, seed=11))
    assert g.routing_fraction[0, 0] == 0 and g.filtering_fraction[0, 0] == 0
    assert g.eff_rank_R[0, 0] == 0 and g.pr_R[0, 0] == 0 and g.positive_share[0, 0] == 0
    assert not g.unstable[0, 0] and not g.eig_nonzero[0, 0].any()
    for v in g.to_dict().values():
        assert not any(isinstance(x, float) and math.isnan(x) for x in v)


def test_effective_rank_helpers():
    sv = torch.tensor([[3.0, 3.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert entropy_effective_rank(sv).tolist() == pytest.approx([2.0, 4.0, 0.0])
    assert participation_ratio(sv).tolist() == pytest.approx([2.0, 4.0, 0.0])


# ----------------------------------------------------------------------------- shapes
def test_grouped_query_repeats_kv_heads():
    L, H, H_kv, n, d = 2, 6, 2, 12, 3
    wq, wk = _rand(L, H, n, d, seed=12), _rand(L, H_kv, n, d, seed=13)
    g = qk_geometry(wq, wk)
    ref = qk_geometry(wq, wk.repeat_interleave(H // H_kv, dim=1))
    assert g.n_kv_heads == H_kv and g.n_heads == H
    assert torch.equal(g.sv_R, ref.sv_R) and torch.equal(g.eig_real, ref.eig_real)
    # HF/Llama ordering: query head 2 uses kv head 0, query head 3 uses kv head 1
    for h, kv in ((2, 0), (3, 1)):
        _, r, _ = _dense(wq[1, h], wk[1, kv])
        _assert_sv_close(g.sv_R[1, h], torch.linalg.svdvals(r))


def test_unequal_head_dims():
    wq = [_rand(2, 16, 2, seed=14), _rand(2, 16, 6, seed=15)]
    wk = [_rand(2, 16, 2, seed=16), _rand(2, 16, 6, seed=17)]
    g = qk_geometry(wq, wk, layer_names=["early", "late"])
    assert g.d_head == [2, 6] and g.routing_capacity.tolist() == [4, 12]
    assert g.sv_R.shape == (2, 2, 12) and g.eig_real.shape == (2, 2, 6)
    assert g.sv_valid[0].sum(-1).tolist() == [4, 4] and g.sv_valid[1].all()
    assert g.eig_valid[0].sum(-1).tolist() == [2, 2]
    assert (g.sv_R[0, :, 4:] == 0).all() and (g.eig_real[0, :, 2:] == 0).all()
    for layer in range(2):
        one = qk_geometry(wq[layer][None], wk[layer][None])
        k, e = one.sv_R.shape[-1], one.eig_real.shape[-1]
        assert torch.allclose(g.sv_R[layer, :, :k], one.sv_R[0])
        assert torch.allclose(g.eig_real[layer, :, :e], one.eig_real[0])
        assert torch.allclose(g.eff_rank_R[layer], one.eff_rank_R[0])
    assert g.headline()["layer_name"] == ["early", "late"]


@pytest.mark.parametrize(
    "wq_shape, wk_shape, match",
    [
        ((1, 2, 8, 4), (1, 2, 9, 4), r"d_model"),
        ((1, 2, 8, 4), (1, 2, 8, 3), r"different d_head"),
        ((1, 6, 8, 4), (1, 4, 8, 4), r"multiple of the key head count"),
        ((2, 8, 4), (2, 8, 4), r"\[layer, head, d_model, d_head\].*W_Q\[None\]"),
        ((2, 2, 8, 4), (1, 2, 8, 4), r"2 layers but W_K has 1"),
    ],
)
def test_shape_errors_name_shapes(wq_shape, wk_shape, match):
    with pytest.raises(ValueError, match=match) as exc:
        qk_geometry(torch.zeros(wq_shape), torch.zeros(wk_shape))
    assert "pass" in str(exc.value) or "must" in str(exc.value) or "need" in str(exc.value)


def test_other_input_errors():
    wq, wk = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"\(1, 2, 8, 4\).*\(1, 2, 8, 3\)"):
        qk_geometry(wq, torch.zeros(1, 2, 8, 3))
    with pytest.raises(ValueError, match="layer_names has 2 entries"):
        qk_geometry(wq, wk, layer_names=["a", "b"])
    bad = wq.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        qk_geometry(bad, wk)
    with pytest.raises(TypeError, match="torch.Tensor"):
        qk_geometry("W_Q", wk)
    with pytest.raises(ValueError, match=r"b_Q\[0\] has shape \(2, 3\)"):
        qk_geometry(wq, wk, b_Q=torch.zeros(1, 2, 3))


def test_biases_reported_separately():
    L, H, n, d, T = 1, 2, 10, 3, 7
    wq, wk = _rand(L, H, n, d, seed=18), _rand(L, H, n, d, seed=19)
    bq, bk = _rand(L, H, d, seed=20), _rand(L, H, d, seed=21)
    g0 = qk_geometry(wq, wk)
    g = qk_geometry(wq, wk, b_Q=bq, b_K=bk)
    assert g0.key_bias_norm is None and g0.query_bias_norm is None
    assert torch.equal(g.sv_R, g0.sv_R)  # the kernel ignores biases
    x = _rand(T, n, seed=22)
    for h in range(H):
        q, k = x @ wq[0, h] + bq[0, h], x @ wk[0, h] + bk[0, h]
        extra = q @ k.T - x @ wq[0, h] @ wk[0, h].T @ x.T - bq[0, h] @ bk[0, h]
        u_key = wk[0, h] @ bq[0, h]  # key-dependent direction
        u_query = wq[0, h] @ bk[0, h]  # query-dependent (row-constant) direction
        assert torch.allclose(extra, (x @ u_query)[:, None] + (x @ u_key)[None, :])
        assert g.key_bias_norm[0, h] == pytest.approx(u_key.norm().item())
        assert g.query_bias_norm[0, h] == pytest.approx(u_query.norm().item())
    only_k = qk_geometry(wq, wk, b_K=bk)
    assert (only_k.key_bias_norm == 0).all() and (only_k.query_bias_norm > 0).all()


# ----------------------------------------------------------------------------- outputs
def test_table_csv_summary_save_and_plots(tmp_path):
    L, H = 3, 2
    g = qk_geometry(_rand(L, H, 12, 3, seed=23), _rand(L, H, 12, 3, seed=24))
    table = g.to_dict()
    assert len(table["head"]) == L * H and table["layer"][:3] == [0, 0, 1]
    assert table["routing_fraction"][3] == pytest.approx(g.routing_fraction[1, 1].item())
    assert len(g.to_rows()) == L * H
    with open(g.to_csv(tmp_path / "g.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == L * H and float(rows[0]["eff_rank_R"]) == pytest.approx(
        g.eff_rank_R[0, 0].item()
    )
    s = g.headline()
    assert s["mean_routing_fraction"][2] == pytest.approx(g.routing_fraction[2].mean().item())
    loaded = Result.load(g.save(tmp_path / "g"))
    assert isinstance(loaded, QKGeometry) and torch.equal(loaded.eig_imag, g.eig_imag)
    assert loaded.d_head == g.d_head and loaded.key_bias_norm is None
    from matplotlib.figure import Figure

    for fig in (
        g.plot_budget(),
        g.plot_routing_rank(show_capacity=True),
        g.plot_routing_rank(measure="participation", planes=True),
        g.plot_eigenvalues(),
    ):
        assert isinstance(fig, Figure)
    with pytest.raises(ValueError, match="measure"):
        g.plot_routing_rank(measure="renyi")


# ----------------------------------------------------------------------------- S–D
def _sd_params(L, H, d, seed):
    a = _rand(L, H, d, d, seed=seed)
    s = a.mT - a
    dvec = torch.nn.functional.softplus(_rand(L, H, d, seed=seed + 1))
    return s, torch.diag_embed(dvec), dvec


def test_sd_geometry_stable_and_dense():
    s, dmat, dvec = _sd_params(2, 3, 6, seed=25)
    g = sd_geometry(s, dmat)
    assert g.all_stable and (g.max_real_eig < 0).all()  # D > 0 strictly: strictly stable
    g_vec = sd_geometry(s, dvec)
    assert torch.equal(g.sv_S, g_vec.sv_S) and torch.equal(g.eig_real, g_vec.eig_real)
    for layer in range(2):
        for head in range(3):
            _assert_sv_close(g.sv_S[layer, head], torch.linalg.svdvals(s[layer, head]))
            _assert_multiset_close(
                torch.linalg.eigvals(s[layer, head] - dmat[layer, head]), g.eigenvalues[layer, head]
            )
    ns, nd = s.square().sum((-2, -1)), dmat.square().sum((-2, -1))
    assert torch.allclose(g.routing_fraction, ns / (ns + nd))
    assert isinstance(g.plot_routing_rank(), matplotlib.figure.Figure)
    assert isinstance(g.plot_eigenvalues(), matplotlib.figure.Figure)
    assert isinstance(g.plot_budget(), matplotlib.figure.Figure)


def test_sd_one_plane_and_instability_detected():
    d = 5
    s = torch.zeros(1, 1, d, d, dtype=F64)
    s[0, 0, 0, 1], s[0, 0, 1, 0] = 2.0, -2.0
    g = sd_geometry(s, torch.ones(1, 1, d, dtype=F64))
    assert g.eff_rank_S.item() == pytest.approx(2.0) and g.rotation_planes.item() == 1.0
    bad = sd_geometry(s, -torch.ones(1, 1, d, dtype=F64))  # negative D: unstable
    assert not bad.all_stable and bad.max_real_eig.item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not skew-symmetric"):
        sd_geometry(s + torch.eye(d, dtype=F64), torch.ones(1, 1, d, dtype=F64))
    with pytest.raises(ValueError, match=r"S has shape \(1, 5, 5\) and D \(1, 4, 4\)"):
        sd_geometry(s, torch.ones(1, 1, 4, dtype=F64))


def test_recover_sd_round_trip():
    L, H, n, d = 2, 3, 20, 6
    s, dmat, _ = _sd_params(L, H, d, seed=26)
    wp = _rand(L, H, n, d, seed=27)
    s_rec, d_rec = recover_sd_from_qk(wp @ (s - dmat), wp)
    assert torch.allclose(s_rec, s, atol=1e-8) and torch.allclose(d_rec, dmat, atol=1e-8)
    # with a converter scale per layer and float32 weights
    scale = torch.tensor([2.0, 0.5])
    wq32 = (scale[:, None, None, None] * (wp @ (s - dmat))).float()
    s_rec, d_rec = recover_sd_from_qk(wq32, wp.float(), scale=scale, rtol=1e-4)
    assert torch.allclose(s_rec, s, atol=1e-4) and torch.allclose(d_rec, dmat, atol=1e-4)
    # recovered S–D feeds sd_geometry; the QK geometry of the converted heads agrees
    g = sd_geometry(*recover_sd_from_qk(wp @ (s - dmat), wp))
    assert g.all_stable


def test_recover_sd_zero_padded_and_errors():
    n, d, d_pad = 12, 3, 5
    s, dmat, _ = _sd_params(1, 2, d, seed=28)
    wp = _rand(1, 2, n, d, seed=29)
    pad = lambda w: torch.cat([w, torch.zeros(*w.shape[:-1], d_pad - d, dtype=F64)], -1)
    wq = pad(wp @ (s - dmat))
    s_rec, d_rec = recover_sd_from_qk(wq, pad(wp))
    assert torch.allclose(s_rec[..., :d, :d], s, atol=1e-8)
    assert torch.allclose(d_rec[..., :d, :d], dmat, atol=1e-8)
    assert s_rec[..., d:, :].abs().max() < 1e-10 and d_rec[..., :, d:].abs().max() < 1e-10
    with pytest.raises(ValueError, match="not W_K @"):
        recover_sd_from_qk(_rand(1, 2, n, d, seed=30), wp)
    with pytest.raises(ValueError, match="differ"):
        recover_sd_from_qk(_rand(1, 2, n, d, seed=30), _rand(1, 2, n, d + 1, seed=31))


def test_qk_and_sd_geometry_agree_for_orthonormal_projection():
    """W_P with orthonormal columns: M = W_P (S − D) W_Pᵀ keeps the spectra of S and D."""
    L, H, n, d = 1, 2, 14, 4
    s, dmat, _ = _sd_params(L, H, d, seed=32)
    wp, _ = torch.linalg.qr(_rand(L, H, n, d, seed=33))
    qk = qk_geometry(wp @ (s - dmat), wp)
    sd = sd_geometry(s, dmat)
    assert torch.allclose(qk.routing_fraction, sd.routing_fraction)
    assert torch.allclose(qk.sv_R[..., :d], sd.sv_S) and (qk.sv_R[..., d:].abs() < 1e-12).all()
    assert torch.allclose(qk.eff_rank_R, sd.eff_rank_S)
    for h in range(H):
        _assert_multiset_close(sd.eigenvalues[0, h], qk.eigenvalues[0, h])
    assert not qk.unstable.any()  # Re λ(S − D) < 0 survives the orthonormal change of basis


def test_recover_sd_from_model_attention_weights():
    """Round trip through the project's S–D attention module, if present."""
    attention = pytest.importorskip("tl_spectral.models.attention")
    cls = getattr(attention, "ATTENTION_KINDS", {}).get("sd")
    if cls is None:
        pytest.skip("no 'sd' attention kind")
    torch.manual_seed(0)
    attn = cls(32, 2, 8, 16)
    with torch.no_grad():
        attn.delta.normal_()  # make D non-trivial
    w = attn.weights()
    s_rec, d_rec = recover_sd_from_qk(w["W_Q"][None], w["W_K"][None])
    with torch.no_grad():
        s_true, d_true = attn.S().double(), attn.D().double()
    assert torch.allclose(s_rec[0], s_true, atol=1e-4)
    assert torch.allclose(d_rec[0], d_true, atol=1e-4)
    assert sd_geometry(s_rec, d_rec).all_stable


def test_factored_matrix_input_equals_factors():
    """qk_geometry(model.QK) — a TransformerLens FactoredMatrix — equals the factor path."""
    from transformer_lens import FactoredMatrix

    g = torch.Generator().manual_seed(3)
    WQ = torch.randn(2, 3, 12, 4, generator=g)
    WK = torch.randn(2, 3, 12, 4, generator=g)
    fm = FactoredMatrix(WQ, WK.transpose(-1, -2))
    a, b = qk_geometry(fm), qk_geometry(WQ, WK)
    assert torch.allclose(a.routing_fraction, b.routing_fraction, atol=1e-12)
    assert torch.allclose(a.eff_rank_R, b.eff_rank_R, atol=1e-12)
    one = qk_geometry(FactoredMatrix(WQ[1, 2], WK[1, 2].T))  # a single head
    assert torch.allclose(one.routing_fraction[0, 0], b.routing_fraction[1, 2], atol=1e-12)
    with pytest.raises(ValueError, match="FactoredMatrix"):
        qk_geometry(fm, WK)
    with pytest.raises(ValueError, match="needs W_K"):
        qk_geometry(WQ)
