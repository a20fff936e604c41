"""S–D models in TransformerLens (SPEC B.7): identical logits for every variant, and the
QK geometry of the converted model recovers S and D."""

from __future__ import annotations

import math

import pytest
import torch

from tl_spectral.geometry.model import model_qk_geometry, model_sd_geometry
from tl_spectral.geometry.qk import qk_geometry, recover_sd_from_qk
from tl_spectral.model_view import ModelView
from tl_spectral.models import GPT, GPTConfig, to_transformer_lens
from tl_spectral.models.convert import max_logit_diff

VARIANTS = [(f, r) for f in ("diag", "scalar", "none") for r in ("skew", "none")
            if not (f == "none" and r == "none")]


def _sd_model(norm, filtering, routing, d_head=6, seed=0):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=17, n_layers=2, n_heads=3, d_model=24, d_head=d_head, n_ctx=16,
                      d_mlp=32, normalization=norm, attention="sd", init_std=0.1,
                      attention_options={"filtering": filtering, "routing": routing}))
    with torch.no_grad():  # perturb everything: biases, LN gains, δ, A
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m.eval()


def _tokens():
    return torch.randint(0, 17, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("norm", ["ln", "none"])
@pytest.mark.parametrize("filtering,routing", VARIANTS)
def test_every_variant_converts_with_identical_logits(norm, filtering, routing):
    m = _sd_model(norm, filtering, routing)
    tl = to_transformer_lens(m)
    assert tl.cfg.normalization_type == ("LN" if norm == "ln" else None)
    tok = _tokens()
    assert max_logit_diff(m, tl, tok) <= 1e-4
    with torch.no_grad():
        _, pats = m(tok, return_patterns=True)
        _, cache = tl.run_with_cache(tok)
    for layer, p in enumerate(pats):
        assert (cache[f"blocks.{layer}.attn.hook_pattern"] - p).abs().max() <= 1e-5


def test_mixed_variants_and_unequal_heads_convert():
    torch.manual_seed(3)
    opts = [{"filtering": "diag", "routing": "skew"}, {"filtering": "scalar", "routing": "none"},
            {"filtering": "none", "routing": "skew"}]
    m = GPT(GPTConfig(vocab_size=17, n_layers=3, n_heads=2, d_model=24, d_head=[2, 8, 5],
                      n_ctx=16, d_mlp=32, normalization="none", attention="sd",
                      attention_options=opts, init_std=0.1))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    assert max_logit_diff(m, to_transformer_lens(m), _tokens()) <= 1e-4


def _true_sd(m):
    with torch.no_grad():
        return ([blk.attn.S().double() for blk in m.blocks],
                [blk.attn.D().double() for blk in m.blocks])


@pytest.mark.parametrize("fold_ln", [False, True])
@pytest.mark.parametrize("filtering,routing", [("diag", "skew"), ("scalar", "skew"),
                                               ("none", "skew"), ("diag", "none")])
def test_recover_s_and_d_from_converted_model(fold_ln, filtering, routing):
    """From the TransformerLens weights: L = pinv(W_K) W_Q = S − D, also after LayerNorm
    folding (W_P → C·diag(g)·W_P multiplies both factors on the left)."""
    m = _sd_model("ln", filtering, routing)
    st = ModelView(to_transformer_lens(m)).stacked_weights(fold_ln=fold_ln)
    S, D = recover_sd_from_qk(st["W_Q"], st["W_K"])
    S_true, D_true = _true_sd(m)
    for layer in range(2):
        torch.testing.assert_close(S[layer], S_true[layer], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(D[layer], D_true[layer], atol=1e-4, rtol=1e-4)


def test_recover_with_zero_padded_heads():
    """Unequal d_head: the converter pads to d_max and scales W_Q by sqrt(d_max/d_l); the
    minimum-norm recovery returns S − D in the leading block and zeros elsewhere."""
    torch.manual_seed(4)
    m = GPT(GPTConfig(vocab_size=17, n_layers=2, n_heads=2, d_model=24, d_head=[3, 6],
                      n_ctx=16, d_mlp=32, normalization="none", attention="sd", init_std=0.1))
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.delta.normal_()
    st = ModelView(to_transformer_lens(m)).stacked_weights()
    S, D = recover_sd_from_qk(st["W_Q"], st["W_K"], scale=[math.sqrt(6 / 3), 1.0])
    S_true, D_true = _true_sd(m)
    torch.testing.assert_close(S[0, :, :3, :3], S_true[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(D[0, :, :3, :3], D_true[0], atol=1e-4, rtol=1e-4)
    assert S[0, :, 3:].abs().max() < 1e-6 and D[0, :, :, 3:].abs().max() < 1e-6
    torch.testing.assert_close(S[1], S_true[1], atol=1e-4, rtol=1e-4)


def test_qk_geometry_of_converted_model_splits_into_s_and_d():
    """Routing part of W_Q W_Kᵀ = W_P S W_Pᵀ, filtering part = −W_P D W_Pᵀ (dense check),
    and the geometry read through TransformerLens reports exactly their norms."""
    m = _sd_model("none", "diag", "skew")
    tl = to_transformer_lens(m)
    st = ModelView(tl).stacked_weights(fold_ln=False)
    S_true, D_true = _true_sd(m)
    geo = model_qk_geometry(tl, biases=False)
    for layer in range(2):
        wp = m.blocks[layer].attn.proj.weight.detach().double().view(3, 6, 24).mT
        for h in range(3):
            M = st["W_Q"][layer, h].double() @ st["W_K"][layer, h].double().T
            R_dense, F_dense = 0.5 * (M - M.T), 0.5 * (M + M.T)
            R_sd = wp[h] @ S_true[layer][h] @ wp[h].T
            F_sd = -wp[h] @ D_true[layer][h] @ wp[h].T
            torch.testing.assert_close(R_dense, R_sd, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(F_dense, F_sd, atol=1e-5, rtol=1e-4)
            assert abs(float(geo.norm_R_sq[layer, h]) - float(R_sd.square().sum())) \
                <= 1e-4 * float(R_sd.square().sum())
    # rank of R = W_P S W_Pᵀ equals the rank of S when W_P has full column rank
    sg = model_sd_geometry(m)
    n_nonzero_R = (geo.sv_R > 1e-6 * geo.sv_R[..., :1]).sum(-1)
    n_nonzero_S = (sg.sv_S > 1e-6 * sg.sv_S[..., :1]).sum(-1)
    assert torch.equal(n_nonzero_R, n_nonzero_S)


def test_converted_sd_heads_are_never_unstable():
    """For any W_P the converted kernel M = W_P (S − D) W_Pᵀ has symmetric part
    −W_P D W_Pᵀ <= 0, so its numerical range, hence every eigenvalue, lies in Re <= 0: the
    QK geometry finds no unstable S–D head (the paper's contrast to standard heads)."""
    for seed in range(3):
        m = _sd_model("ln", "diag", "skew", seed=seed)
        with torch.no_grad():
            for blk in m.blocks:
                blk.attn.delta.normal_(0, 2)
                blk.attn.A.normal_(0, 2)
        g = model_qk_geometry(m)
        assert not g.unstable.any() and (g.max_real_eig <= 1e-6 * g.norm_M_sq.sqrt()).all()
        ref = qk_geometry([blk.attn.weights()["W_Q"] for blk in m.blocks],
                          [blk.attn.weights()["W_K"] for blk in m.blocks])
        assert not ref.unstable.any()


@pytest.mark.parametrize("name,norm", [("sd-char-shakespeare", "ln"),
                                       ("sd-char-shakespeare-noln", "none")])
def test_shipped_sd_checkpoints(name, norm):
    """The shipped S–D char models: S–D attention, the recorded validation loss on a slice,
    identical logits in TransformerLens, and S, D recovered from the converted weights."""
    from tl_spectral.data import tiny_shakespeare, train_val_split
    from tl_spectral.models import zoo

    try:
        model, tok = zoo.load_native(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert model.cfg.attention == "sd" and model.cfg.normalization == norm
    _, val = train_val_split(tiny_shakespeare(), 0.1)
    ids = torch.tensor(tok.encode(val[: 2 * 256 + 1]))
    w = torch.stack([ids[:257], ids[256:513]])
    with torch.no_grad():
        loss = model.loss(w).item()
    assert abs(loss - zoo.checkpoint_info(name)["metrics"]["val_loss"]) < 0.3
    tl, _ = zoo.load(name)
    assert max_logit_diff(model, tl, w[:1, :128]) <= 1e-4
    st = ModelView(tl).stacked_weights()
    S, D = recover_sd_from_qk(st["W_Q"][:2], st["W_K"][:2])
    S_true, D_true = _true_sd(model)
    torch.testing.assert_close(S, torch.stack(S_true[:2]), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(D, torch.stack(D_true[:2]), atol=1e-3, rtol=1e-3)
