"""GPT family and attention kinds: shapes, exact invariants, brute-force references."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.models import GPT, GPTConfig, load_checkpoint, make_attention, save_model
from tl_spectral.models.attention import ATTENTION_KINDS, SDAttention


def _cfg(**kw):
    base = {"vocab_size": 13, "n_layers": 2, "n_heads": 2, "d_model": 16, "n_ctx": 24, "d_mlp": 32}
    base.update(kw)
    return GPTConfig(**base)


def _brute_attention(x, W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O):
    """Loop-over-heads reference: x [b,p,dm], W_Q [h,dm,d] ... -> out [b,p,dm], pattern."""
    _b, p, _ = x.shape
    out = torch.zeros_like(x) + b_O
    pats = []
    for h in range(W_Q.shape[0]):
        q = x @ W_Q[h] + b_Q[h]
        k = x @ W_K[h] + b_K[h]
        v = x @ W_V[h] + b_V[h]
        s = q @ k.transpose(-1, -2) / math.sqrt(W_Q.shape[-1])
        s = s + torch.triu(torch.full((p, p), float("-inf")), diagonal=1)
        a = s.softmax(-1)
        pats.append(a)
        out = out + (a @ v) @ W_O[h]
    return out, torch.stack(pats, 1)


def test_registry_and_unknown_kind():
    assert {"softmax", "sd", "linear"} <= set(ATTENTION_KINDS)
    with pytest.raises(ValueError, match="known kinds"):
        make_attention("nope", 8, 2, 4, 8)
    with pytest.raises(ValueError, match="unknown attention kind"):
        _cfg(attention="nope")


@pytest.mark.parametrize("kind", ["softmax", "sd"])
def test_attention_matches_brute_force(kind):
    torch.manual_seed(0)
    att = make_attention(kind, 16, 3, 5, 12)
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(2, 9, 16)
    w = att.weights()
    ref, ref_pat = _brute_attention(x, **w)
    out_fast = att(x)  # training mode: scaled_dot_product_attention
    out, pat = att(x, return_pattern=True)
    out_eval = att.eval()(x)  # eval mode: explicit path
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_eval, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pat, ref_pat, atol=1e-6, rtol=1e-5)
    assert pat.shape == (2, 3, 9, 9)
    torch.testing.assert_close(pat.sum(-1), torch.ones(2, 3, 9))


def test_sd_scores_follow_spec_definition():
    """score_ij = p_i (S − D) p_jᵀ / sqrt(d_head), computed literally per head."""
    torch.manual_seed(1)
    att = SDAttention(8, 2, 4, 16)
    with torch.no_grad():
        att.delta.normal_()
    x = torch.randn(1, 6, 8)
    _, pat = att(x, return_pattern=True)
    W_P = att.proj.weight.view(2, 4, 8)
    b_P = att.proj.bias.view(2, 4)
    for h in range(2):
        p = x[0] @ W_P[h].T + b_P[h]
        A = att.A[h]
        S = A.T - A
        D = torch.diag(F.softplus(att.delta[h]))
        s = p @ (S - D) @ p.T / 2.0
        s = s + torch.triu(torch.full((6, 6), float("-inf")), diagonal=1)
        torch.testing.assert_close(pat[0, h], s.softmax(-1), atol=1e-6, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 6), h=st.integers(1, 3), seed=st.integers(0, 10_000),
       filtering=st.sampled_from(["diag", "scalar", "none"]),
       routing=st.sampled_from(["skew", "none"]))
def test_sd_kernel_is_stable(d, h, seed, filtering, routing):
    """S is skew-symmetric, D positive diagonal, every eigenvalue of S − D has Re <= 0."""
    if filtering == "none" and routing == "none":
        with pytest.raises(ValueError):
            SDAttention(4, h, d, 8, filtering=filtering, routing=routing)
        return
    torch.manual_seed(seed)
    att = SDAttention(4, h, d, 8, filtering=filtering, routing=routing)
    if filtering != "none":
        with torch.no_grad():
            att.delta.normal_(0, 3)
    S, D = att.S().detach(), att.D().detach()
    assert S.shape == D.shape == (h, d, d)
    torch.testing.assert_close(S, -S.transpose(-1, -2))
    torch.testing.assert_close(D, torch.diag_embed(torch.diagonal(D, dim1=-2, dim2=-1)))
    assert (torch.diagonal(D, dim1=-2, dim2=-1) >= 0).all()
    if filtering == "scalar":
        dd = torch.diagonal(D, dim1=-2, dim2=-1)
        torch.testing.assert_close(dd, dd[:, :1].expand_as(dd))
    eig = torch.linalg.eigvals((S - D).double())
    assert (eig.real <= 1e-9).all()


def test_linear_attention_matches_definition():
    torch.manual_seed(2)
    att = make_attention("linear", 8, 2, 4, 16)
    x = torch.randn(1, 7, 8)
    out, pat = att(x, return_pattern=True)
    w = att.weights()
    ref = torch.zeros(7, 8) + w["b_O"]
    for h in range(2):
        q = F.elu(x[0] @ w["W_Q"][h] + w["b_Q"][h]) + 1
        k = F.elu(x[0] @ w["W_K"][h] + w["b_K"][h]) + 1
        v = x[0] @ w["W_V"][h] + w["b_V"][h]
        for i in range(7):
            wts = torch.stack([q[i] @ k[j] for j in range(i + 1)])
            a = wts / wts.sum()
            torch.testing.assert_close(pat[0, h, i, : i + 1], a, atol=1e-6, rtol=1e-5)
            assert (pat[0, h, i, i + 1:] == 0).all()
            ref[i] += (a @ v[: i + 1]) @ w["W_O"][h]
    torch.testing.assert_close(out[0], ref, atol=1e-5, rtol=1e-5)
    # same parameters as softmax attention: a softmax state dict loads unchanged
    soft = make_attention("softmax", 8, 2, 4, 16)
    att.load_state_dict(soft.state_dict())


@pytest.mark.parametrize("norm", ["ln", "none"])
@pytest.mark.parametrize("tied", [False, True])
def test_gpt_forward_shapes_causality_and_loss(norm, tied):
    torch.manual_seed(0)
    m = GPT(_cfg(normalization=norm, tied_embeddings=tied, d_head=[4, 8],
                 attention=["softmax", "sd"]))
    tok = torch.randint(0, 13, (3, 10))
    logits = m(tok)
    assert logits.shape == (3, 10, 13)
    tok2 = tok.clone()
    tok2[:, 6:] = (tok2[:, 6:] + 1) % 13
    torch.testing.assert_close(m(tok2)[:, :6], logits[:, :6])  # causal
    logits_p, pats = m(tok, return_patterns=True)
    torch.testing.assert_close(logits_p, logits, atol=1e-5, rtol=1e-5)
    assert [p.shape for p in pats] == [(3, 2, 10, 10)] * 2
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 13), tok[:, 1:].reshape(-1))
    torch.testing.assert_close(m.loss(tok), ref)
    if tied:
        assert m.unembed.weight.data_ptr() == m.tok_embed.weight.data_ptr()
    if norm == "none":
        assert not any(isinstance(x, torch.nn.LayerNorm) for x in m.modules())


@pytest.mark.parametrize("norm", ["ln", "none"])
def test_train_and_eval_mode_compute_the_same_function(norm):
    """Fused kernels in training mode, TransformerLens' arithmetic in eval mode."""
    torch.manual_seed(3)
    m = GPT(_cfg(normalization=norm, attention=["sd", "softmax"]))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        tok = torch.randint(0, 13, (2, 20))
        a = m.train()(tok)
        b = m.eval()(tok)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_gpt_rejects_bad_input():
    m = GPT(_cfg())
    with pytest.raises(ValueError, match="n_ctx"):
        m(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, pos"):
        m(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        m(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="one d_head per layer"):
        _cfg(d_head=[4, 4, 4])
    with pytest.raises(ValueError, match="normalization"):
        _cfg(normalization="rms")


def test_config_json_roundtrip():
    cfg = _cfg(d_head=[4, 8], attention=["sd", "softmax"],
               attention_options=[{"filtering": "scalar"}, {}])
    again = GPTConfig.from_json(cfg.to_json())
    assert again == cfg
    with pytest.raises(ValueError, match="unknown GPTConfig fields"):
        GPTConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="format"):
        GPTConfig.from_dict({**cfg.to_dict(), "format": "other/1"})


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_roundtrip(tmp_path, tied):
    torch.manual_seed(0)
    m = GPT(_cfg(tied_embeddings=tied, attention=["sd", "softmax"]))
    save_model(m, tmp_path / "ck", extra={"note": "x"})
    m2 = load_checkpoint(tmp_path / "ck")
    tok = torch.randint(0, 13, (2, 8))
    torch.testing.assert_close(m2(tok), m(tok))
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["note"] == "x"


def test_corrupted_and_foreign_checkpoints(tmp_path):
    from safetensors.torch import save_file

    m = GPT(_cfg())
    d = save_model(m, tmp_path / "ck")
    # 1. truncated / garbage weights file
    raw = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="corrupted"):
        load_checkpoint(d)
    (d / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="corrupted"):
        load_checkpoint(d)
    # 2. a foreign safetensors file (valid format, other tensors)
    save_file({"transformer.wte.weight": torch.zeros(3, 3)}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="foreign"):
        load_checkpoint(d)
    # 3. right names, wrong shapes (config of another model)
    save_model(GPT(_cfg(d_model=8)), tmp_path / "other")
    (d / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="mis-shaped"):
        load_checkpoint(d)
    # 4. broken config.json
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_checkpoint(d)
    (d / "config.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a tl_spectral checkpoint"):
        load_checkpoint(d)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nowhere")


# ------------------------------------------------------------ per-layer head counts
def test_per_layer_heads_build_run_and_count_like_uniform(tmp_path):
    """A head allocation (issue 17 item 2): every layer has its own head count; with the same
    total number of heads of the same d_head, the attention parameter count equals the
    uniform model's (what "equal parameter count" means for the allocation comparison)."""
    from tl_spectral.interventions.surgery import attention_param_count

    alloc = GPTConfig(vocab_size=11, n_layers=3, n_heads=[1, 2, 5], d_model=16, d_head=4,
                      n_ctx=8)
    uni = GPTConfig(vocab_size=11, n_layers=2, n_heads=4, d_model=16, d_head=4, n_ctx=8)
    assert alloc.heads_per_layer == [1, 2, 5] and uni.heads_per_layer == [4, 4]
    # parameters per layer are affine in the head count: (per-layer constant) + heads x (per head)
    per_head = attention_param_count(GPTConfig(vocab_size=11, n_layers=1, n_heads=2, d_model=16,
                                               d_head=4, n_ctx=8)) - \
        attention_param_count(GPTConfig(vocab_size=11, n_layers=1, n_heads=1, d_model=16,
                                        d_head=4, n_ctx=8))
    one = attention_param_count(GPTConfig(vocab_size=11, n_layers=1, n_heads=1, d_model=16,
                                          d_head=4, n_ctx=8))
    assert per_head > 0
    assert attention_param_count(alloc) == 3 * (one - per_head) + 8 * per_head
    assert attention_param_count(uni) == 2 * (one - per_head) + 8 * per_head
    # counted from the built modules, not only by the meta-device helper
    assert sum(p.numel() for b in GPT(alloc).blocks for p in b.attn.parameters()) == \
        attention_param_count(alloc)
    torch.manual_seed(0)
    model = GPT(alloc).eval()
    assert [blk.attn.n_heads for blk in model.blocks] == [1, 2, 5]
    tokens = torch.randint(0, 11, (2, 8))
    logits, pats = model(tokens, return_patterns=True)
    assert logits.shape == (2, 8, 11) and torch.isfinite(logits).all()
    assert [p.shape[1] for p in pats] == [1, 2, 5]
    # causal in every layer: changing the last token leaves earlier logits unchanged
    t2 = tokens.clone()
    t2[:, -1] = (t2[:, -1] + 1) % 11
    assert torch.allclose(model(t2)[:, :-1], logits[:, :-1], atol=1e-6)
    # JSON round trip and save / load keep the allocation
    assert GPTConfig.from_dict(json.loads(json.dumps(alloc.to_dict()))) == alloc
    save_model(model, tmp_path / "m")
    again = load_checkpoint(tmp_path / "m")
    assert again.cfg.heads_per_layer == [1, 2, 5]
    torch.testing.assert_close(again.eval()(tokens), logits)


def test_per_layer_heads_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="one head count per layer"):
        GPTConfig(vocab_size=5, n_layers=2, n_heads=[2, 2, 2], d_head=4)
    with pytest.raises(ValueError, match="pass d_head explicitly"):
        GPTConfig(vocab_size=5, n_layers=2, n_heads=[2, 4])
    with pytest.raises(ValueError, match="positive int"):
        GPTConfig(vocab_size=5, n_layers=2, n_heads=[2, 0], d_head=4)
    from tl_spectral.models.convert import to_transformer_lens

    model = GPT(GPTConfig(vocab_size=5, n_layers=2, n_heads=[1, 3], d_model=8, d_head=4,
                          n_ctx=4))
    with pytest.raises(NotImplementedError, match="one head count for every layer"):
        to_transformer_lens(model)
