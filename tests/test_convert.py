"""Converter: same logits and patterns in TransformerLens (LN / none, uniform / unequal
head dimensions, softmax / S–D attention, random weights)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.tl39  # also run against TL 3.9 (HookedTransformer)
import torch

from tl_spectral.models import GPT, GPTConfig, to_transformer_lens, to_transformer_lens_config
from tl_spectral.models.convert import max_logit_diff, tl_attention_weights


def _random_model(norm, d_head, attention="softmax", tied=False, seed=0):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=17, n_layers=3, n_heads=4, d_model=24, d_head=d_head,
                      n_ctx=32, d_mlp=40, normalization=norm, attention=attention,
                      tied_embeddings=tied, init_std=0.1))
    with torch.no_grad():  # perturb everything, LayerNorm gains and every bias included
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.eval()


CASES = [
    ("ln", 6, "softmax", False),
    ("none", 6, "softmax", False),
    ("ln", [2, 8, 5], "softmax", False),
    ("none", [2, 8, 5], "softmax", True),
    ("ln", [4, 8, 3], ["sd", "softmax", "sd"], False),
    ("none", 6, "sd", True),
]


@pytest.mark.parametrize("norm,d_head,attention,tied", CASES)
def test_logits_and_patterns_match(norm, d_head, attention, tied):
    m = _random_model(norm, d_head, attention, tied)
    tl = to_transformer_lens(m)
    tok = torch.randint(0, 17, (3, 32), generator=torch.Generator().manual_seed(1))
    assert max_logit_diff(m, tl, tok) <= 1e-4
    with torch.no_grad():
        _, pats = m(tok, return_patterns=True)
        _, cache = tl.run_with_cache(tok)
    for l, p in enumerate(pats):
        got = cache[f"blocks.{l}.attn.hook_pattern"]
        assert got.shape == p.shape == (3, 4, 32, 32)
        assert (got - p).abs().max() <= 1e-5


def test_config_fields():
    m = _random_model("none", [2, 8, 5])
    cfg = to_transformer_lens_config(m)
    assert cfg.normalization_type is None
    assert cfg.d_head == 8 and cfg.n_heads == 4 and cfg.n_layers == 3
    assert cfg.d_mlp == 40 and cfg.d_vocab == 17 and cfg.n_ctx == 32
    assert cfg.act_fn == "gelu"
    assert to_transformer_lens_config(_random_model("ln", 6)).normalization_type == "LN"


def test_sd_folding_formula():
    """SPEC B.7: W_Q = W_P (S − D), W_K = W_P, b_Q = b_P (S − D), b_K = b_P (no padding)."""
    m = _random_model("ln", 6, "sd")
    w = tl_attention_weights(m)[0]
    att = m.blocks[0].attn
    W_P = att.proj.weight.detach().view(4, 6, 24).transpose(-1, -2)
    b_P = att.proj.bias.detach().view(4, 6)
    K = (att.S() - att.D()).detach()
    torch.testing.assert_close(w["W_Q"], W_P @ K)
    torch.testing.assert_close(w["W_K"], W_P)
    torch.testing.assert_close(w["b_Q"], torch.einsum("hd,hde->he", b_P, K))
    torch.testing.assert_close(w["b_K"], b_P)


def test_padding_is_exact():
    """Padded coordinates are zero; the W_Q rescale keeps q·k/sqrt(d_max) = q·k/sqrt(d_l)."""
    m = _random_model("ln", [2, 8, 5])
    ws = tl_attention_weights(m)
    assert ws[0]["W_Q"].shape == (4, 24, 8)
    assert (ws[0]["W_K"][..., 2:] == 0).all() and (ws[0]["W_O"][:, 2:] == 0).all()
    orig = m.blocks[0].attn.weights()
    torch.testing.assert_close(ws[0]["W_Q"][..., :2], orig["W_Q"] * 2.0)  # sqrt(8/2)


def test_foreign_model_is_refused():
    with pytest.raises(TypeError, match="tl_spectral GPT"):
        to_transformer_lens(torch.nn.Linear(2, 2))


def test_shipped_models_convert_bit_exactly_in_eval_mode():
    """Eval mode performs TransformerLens' own operations: (near-)identical logits."""
    from tl_spectral.models import zoo

    for name in ("char-shakespeare", "char-shakespeare-noln"):
        try:
            model, tok = zoo.load_native(name)
        except FileNotFoundError as e:
            pytest.skip(str(e))
        tl = to_transformer_lens(model)
        ids = torch.tensor([tok.encode("ROMEO:\nWhat light through yonder window breaks?")])
        assert max_logit_diff(model, tl, ids) <= 1e-5  # measured: 0.0 on this machine
