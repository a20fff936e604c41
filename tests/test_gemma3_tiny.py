"""Gemma 3's new pieces, exact on tiny random Gemma3 models (issue 37 item 3, issue 42 item 6):
multi-query attention (one value head read by four query heads), QK-norm with (1 + w)
gains, sliding-window layers beside full ones with their own rotary θ, and a 262k-token
vocabulary whose logits no probe pass should form. Every check is against a brute force
from the Hugging Face modules run by hand."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_hf import char_tokenizer  # noqa: E402

from tl_spectral.model_view import ModelView, layer_rotary_metadata, layer_windows  # noqa: E402

WINDOW = 8
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
LOCAL, GLOBAL = 0, 1
H, DH, D = 4, 32, 64


def gemma3_config(*, vocab: int = 64, hidden: int = D, n_layers: int = 4, window: int = WINDOW,
                  types=None, d_mlp: int = 128):
    import transformers as tr

    return tr.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=d_mlp,
        num_hidden_layers=n_layers, num_attention_heads=H, num_key_value_heads=1, head_dim=DH,
        sliding_window=window, layer_types=list(types or TYPES)[:n_layers],
        max_position_embeddings=256, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=DH, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def save_gemma3(folder, *, seed: int = 0, tokenizer: bool = True, **kw):
    """A random Gemma3ForCausalLM with realistic norms: every RMSNorm weight w (applied as
    1 + w) drawn around 0 with std 0.3, projections with std 0.2."""
    import transformers as tr

    cfg = gemma3_config(**kw)
    torch.manual_seed(seed)
    model = tr.Gemma3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.3)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    if tokenizer:
        char_tokenizer(min(cfg.vocab_size, 64)).save_pretrained(folder)
    return folder


def boot(folder):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(
        str(folder), device="cpu", dtype=torch.float32,
        hf_config_overrides={"attn_implementation": "eager"})


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(bridge, HF Gemma3ForCausalLM of the same folder, eval mode)."""
    from transformers import AutoModelForCausalLM

    folder = save_gemma3(tmp_path_factory.mktemp("gemma3"))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    return boot(folder), hf


def _tokens(n: int = 3, T: int = 21, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 64, (n, T), generator=g)


def _hf_parts(hf, layer: int, hidden: torch.Tensor):
    """From the HF modules of ``layer`` run by hand on its residual input ``hidden [b, T, m]``:
    the attention input x, q and k per head before the norm ([b, H|1, T, d]), after the
    (1 + w) norm and RoPE, v ([b, 1, T, d]), and the scores s = scaling · q̂ k̂ᵀ (no mask)."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    blk = hf.model.layers[layer]
    a = blk.self_attn
    with torch.no_grad():
        x = blk.input_layernorm(hidden)
        b, T, _ = x.shape
        q = a.q_proj(x).view(b, T, -1, DH).transpose(1, 2)
        k = a.k_proj(x).view(b, T, -1, DH).transpose(1, 2)
        v = a.v_proj(x).view(b, T, -1, DH).transpose(1, 2)
        pos = torch.arange(T)[None]
        cos, sin = hf.model.rotary_emb(x, pos, a.layer_type)
        qr, kr = apply_rotary_pos_emb(a.q_norm(q), a.k_norm(k), cos, sin)
        scores = (qr @ kr.transpose(-1, -2)) * a.scaling
    return {"x": x, "q": q, "k": k, "v": v, "qr": qr, "kr": kr, "scores": scores}


# --------------------------------------------------------------------------- the model
def test_bridge_equals_hf_and_windows_from_the_config(gemma):
    bridge, hf = gemma
    v = ModelView(bridge)
    assert (v.n_heads, v.n_kv_heads, v.d_head, v.d_model) == (H, 1, DH, D)
    assert layer_windows(bridge) == [WINDOW, None, WINDOW, WINDOW]
    toks = _tokens()
    with torch.no_grad():
        ref = hf(toks).logits
        got = bridge(toks)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_patterns_are_zero_beyond_the_window_in_local_layers(gemma):
    bridge, hf = gemma
    toks = _tokens(T=3 * WINDOW)
    T = toks.shape[1]
    with torch.no_grad():
        out = hf(toks, output_attentions=True)
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    for layer, w in enumerate(layer_windows(bridge)):
        p = out.attentions[layer]
        if w is None:
            assert float(p[..., lag >= WINDOW].min()) > 0  # global: every causal key
        else:
            assert float(p[..., lag >= w].abs().max()) == 0.0
            assert float(p[..., (lag >= 0) & (lag < w)].min()) > 0
