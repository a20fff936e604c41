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


# --------------------------------------------------------------------- QK-norm and RoPE
def test_rotary_metadata_is_read_per_layer_type(gemma):
    bridge, hf = gemma
    metas = layer_rotary_metadata(bridge)
    want = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
    for layer, m in enumerate(metas):
        theta = want[TYPES[layer]]
        ref = 1.0 / theta ** (torch.arange(0, DH, 2, dtype=torch.float64) / DH)
        torch.testing.assert_close(m["inv_freq"], ref, rtol=1e-6, atol=0)
        assert m["source"].endswith(f"{TYPES[layer]}_inv_freq")
    with pytest.raises(ValueError, match="layer_rotary_metadata"):  # never one silent θ
        ModelView(bridge).rotary_metadata()


def test_qk_norm_gains_are_one_plus_w(gemma):
    from tl_spectral.geometry.model import qk_norm_gains

    bridge, hf = gemma
    gq, gk = qk_norm_gains(ModelView(bridge))
    for layer in range(4):
        a = hf.model.layers[layer].self_attn
        torch.testing.assert_close(gq[layer], 1.0 + a.q_norm.weight.double(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(gk[layer], 1.0 + a.k_norm.weight.double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_folded_bilinear_form_reproduces_the_scores(gemma, layer):
    """s_ij = scaling / (r_q(i) r_k(j)) · n(h_i) W_Q' R(j − i) W_K'ᵀ n(h_j)ᵀ with the
    ln1 and QK-norm gains folded into W_Q', W_K' (the geometry's weights) and R the
    layer's own rotary kernel; r = sqrt(mean(q²) + eps) of the un-normalized head vector."""
    from tl_spectral.geometry.model import _fold_qk_norm
    from tl_spectral.geometry.rotary import RotarySpec, rotary_matrix

    bridge, hf = gemma
    v = ModelView(bridge)
    toks = _tokens(n=2, T=13)
    with torch.no_grad():
        h = hf(toks, output_hidden_states=True).hidden_states[layer]
    parts = _hf_parts(hf, layer, h)
    st = _fold_qk_norm(v, v.stacked_weights(fold_ln=True))
    WQ, WK = st["W_Q"][layer].double(), st["W_K"][layer].double()  # [H, m, d]
    n = v.ln1_affine(layer).normalize(h.double())  # [b, T, m]
    m = layer_rotary_metadata(bridge)[layer]
    spec = RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
    T = toks.shape[1]
    delta = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # j − i
    R = rotary_matrix(spec, DH, delta)  # [T, T, d, d]
    qf = torch.einsum("btm,hmd->bhtd", n, WQ)
    kf = torch.einsum("btm,hmd->bhtd", n, WK)
    B = torch.einsum("bhid,ijde,bhje->bhij", qf, R, kf)
    eps = hf.model.layers[layer].self_attn.q_norm.eps
    r_q = (parts["q"].double().pow(2).mean(-1) + eps).sqrt()  # [b, H, T]
    r_k = (parts["k"].double().pow(2).mean(-1) + eps).sqrt()  # [b, 1, T]
    scaling = hf.model.layers[layer].self_attn.scaling
    assert scaling == pytest.approx(hf.config.query_pre_attn_scalar ** -0.5)
    factor = scaling / (r_q[..., :, None] * r_k[..., None, :])
    torch.testing.assert_close(factor * B, parts["scores"].double(), rtol=1e-4, atol=1e-5)
    # and the bridge's own pre-softmax scores on the allowed pairs (its mask sets the rest)
    _, cache = bridge.run_with_cache(toks, names_filter=f"blocks.{layer}.attn.hook_attn_scores")
    got = cache[f"blocks.{layer}.attn.hook_attn_scores"].double()
    w = layer_windows(bridge)[layer]
    lag = -delta
    ok = (lag >= 0) & (lag < (w or T))
    torch.testing.assert_close(got[..., ok], parts["scores"].double()[..., ok], rtol=1e-4,
                               atol=1e-5)


def _hf_kernels(hf, layer: int, deltas, base: int = 40):
    """M_h(Δ) [len(deltas), H, d_model, d_model] from the HF modules: q and k projections of
    the (1 + w)-folded identity, scaled by the q/k norm gains (1 + w) and rotated by the
    model's own rotary embedding for the layer's type at positions base (query) and
    base + Δ (key) — everything of the score but the per-token factor 1 / (r_q r_k)."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    blk = hf.model.layers[layer]
    a = blk.self_attn
    E = torch.diag(1.0 + blk.input_layernorm.weight.detach().float())
    with torch.no_grad():
        q = a.q_proj(E).view(-1, H, DH).transpose(0, 1) * (1.0 + a.q_norm.weight)
        k = a.k_proj(E).view(-1, 1, DH).transpose(0, 1) * (1.0 + a.k_norm.weight)
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


def test_rotary_geometry_uses_each_layers_theta(gemma):
    """Offset-resolved geometry of a local (θ 10⁴) and a global (θ 10⁶) layer against the
    kernels built with the model's own rotary embedding (as tests/test_smollm2.py)."""
    from tl_spectral.geometry.model import model_rotary_geometry

    bridge, hf = gemma
    deltas = [0, -1, -5, -7, -37, -200]
    g = model_rotary_geometry(bridge, offsets=deltas, average_ranks=False, n_ctx=64)
    for layer in (LOCAL, GLOBAL):
        M = _hf_kernels(hf, layer, deltas)
        R = 0.5 * (M - M.transpose(-1, -2))
        F = 0.5 * (M + M.transpose(-1, -2))
        nr, nf = R.square().sum((-2, -1)), F.square().sum((-2, -1))
        torch.testing.assert_close(g.routing_fraction[layer].double(), (nr / (nr + nf)).T,
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g.norm_M_sq[layer].double(), (nr + nf).T, rtol=1e-4, atol=0)
    theta_local, theta_global = g.pair_theta[LOCAL, 1], g.pair_theta[GLOBAL, 1]
    assert float(theta_local) == pytest.approx(1e4 ** (-2 / DH))
    assert float(theta_global) == pytest.approx(1e6 ** (-2 / DH))


def test_rotary_geometry_layers_select_theta_and_window_with_the_row(gemma):
    """``layers=`` keeps each chosen layer's own θ and window (the selection and the
    per-layer specs merged): the rows equal the full result's rows."""
    from tl_spectral.geometry.model import model_rotary_geometry

    bridge, _ = gemma
    deltas = [0, -1, -5, -37]
    full = model_rotary_geometry(bridge, offsets=deltas, average_ranks=False, n_ctx=64)
    for keep in ([GLOBAL], [LOCAL, GLOBAL], [GLOBAL, LOCAL]):
        part = model_rotary_geometry(bridge, offsets=deltas, average_ranks=False, n_ctx=64,
                                     layers=keep)
        for row, layer in enumerate(keep):
            torch.testing.assert_close(part.routing_fraction[row], full.routing_fraction[layer])
            torch.testing.assert_close(part.pair_theta[row], full.pair_theta[layer])
            assert part.windows[row] == full.windows[layer]


# ----------------------------------------------------- contributions and sinks (multi-query)
def _hf_layer(hf, toks, layer):
    """(pattern [b, H, T, T], values repeated to the query heads [b, T, H, d], W_O [H, d, m])
    of ``layer`` from the HF modules: one value head read by the four query heads."""
    with torch.no_grad():
        out = hf(toks, output_attentions=True, output_hidden_states=True)
        parts = _hf_parts(hf, layer, out.hidden_states[layer])
    v = parts["v"]  # [b, 1, T, d]: the single key-value head
    assert v.shape[1] == 1
    val = v.transpose(1, 2).repeat_interleave(H, dim=2).double()  # [b, T, H, d]
    W_O = hf.model.layers[layer].self_attn.o_proj.weight.detach().T.reshape(H, DH, -1).double()
    return out.attentions[layer].double(), val, W_O


def _brute_c(pattern, v, W_O):
    """c_ij^h = ⟨o_i, α_ij ṽ_j^h⟩ / ‖o_i‖² with the [b, q, k, H, d_model] terms formed."""
    vt = torch.einsum("bkhd,hdm->bkhm", v, W_O)
    terms = pattern.permute(0, 2, 3, 1)[..., None] * vt[:, None]
    o = terms.sum(dim=(2, 3))
    return torch.einsum("bqm,bqkhm->bhqk", o, terms) / (o * o).sum(-1)[:, None, :, None]


def _allowed(T: int, w):
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    return (lag >= 0) & (lag < (w if w is not None else T))


def _ordinal(x):
    """Ordinal ranks (ties by position) along the last axis."""
    order = torch.sort(x, dim=-1, stable=True).indices
    r = torch.empty_like(order)
    r.scatter_(-1, order, torch.arange(x.shape[-1]).expand_as(order).contiguous())
    return r.double()


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_contributions_match_brute_force_inside_the_window(gemma, layer):
    from tl_spectral.probes import ContributionProbe, run_probes
    from tl_spectral.probes.contributions import rank_query_positions

    bridge, hf = gemma
    toks = _tokens(n=3, T=3 * WINDOW - 3)
    b, T = toks.shape
    res = run_probes(bridge, toks, ContributionProbe(layers=[layer], keep_docs=[0, 2],
                                                     rank_stride=1, rank_queries=6,
                                                     negative_rtol=0.0),
                     batch_size=3, progress=False)["contributions"]
    pat, val, W_O = _hf_layer(hf, toks, layer)
    c = _brute_c(pat, val, W_O)  # [b, H, T, T]
    kept = res.kept_maps[f"{layer}.contribution"].double()
    torch.testing.assert_close(kept, c[[0, 2]], rtol=1e-4, atol=1e-6)
    w = layer_windows(bridge)[layer]
    ok = _allowed(T, w)
    assert float(c[..., ~ok].abs().max()) == 0.0  # nothing outside the window
    C = c.sum(1)  # token level [b, T, T]
    n_src = ok.sum(0).double() * b  # queries per key, in the window
    torch.testing.assert_close(res.source_count[0].double(), n_src)
    torch.testing.assert_close(res.source_mean[0, -1].double(), C.sum((0, 1)) / n_src,
                               rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(res.source_attention[0].double(),
                               pat.sum((0, 2)) / n_src, rtol=1e-4, atol=1e-6)
    lag = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    n_lag = torch.stack([(ok & (lag == x)).sum() for x in range(T)]).double() * b
    torch.testing.assert_close(res.lag_count[0].double(), n_lag)
    want_lag = torch.stack([C[:, ok & (lag == x)].sum() for x in range(T)]) / n_lag.clamp_min(1)
    torch.testing.assert_close(res.lag_mean[0, -1].double(), want_lag, rtol=1e-4, atol=1e-6)
    n_pairs = ok.sum() * b
    neg = torch.stack([(c[:, h][:, ok] < 0).sum() for h in range(H)] + [(C[:, ok] < 0).sum()])
    torch.testing.assert_close(res.negative_fraction[0].double(), neg.double() / n_pairs,
                               rtol=1e-6, atol=1e-7)
    # token-level Spearman of attention vs contribution over each sampled query's window
    qidx, _ = rank_query_positions([T] * b, 6)
    rhos = []
    for d in range(b):
        for i in qidx[d].tolist():
            keys = ok[i].nonzero().flatten()
            ra, rc = _ordinal(pat[d, :, i, keys].sum(0)), _ordinal(C[d, i, keys])
            n = keys.numel()
            rhos.append(1 - 6 * ((ra - rc) ** 2).sum() / (n * (n * n - 1)))
    mi, ci = res.measures.index("attention"), res.measures.index("contribution")
    assert float(res.rank_corr[0, -1, mi, ci]) == pytest.approx(float(torch.stack(rhos).mean()),
                                                                abs=1e-5)


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_contribution_counts_with_padding_respect_the_window(gemma, layer):
    from tl_spectral.probes import ContributionProbe, run_probes

    bridge, hf = gemma
    toks = _tokens(n=2, T=20)
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[1, 13:] = False
    res = run_probes(bridge, toks, ContributionProbe(layers=[layer], rank_queries=0),
                     attention_mask=mask, batch_size=2, progress=False)["contributions"]
    ok = _allowed(20, layer_windows(bridge)[layer])
    short = torch.nn.functional.pad(ok[:13, :13].sum(0), (0, 7))  # the padded document
    n = (ok.sum(0) + short).double()
    torch.testing.assert_close(res.source_count[0].double(), n)


def _brute_rho(pat, val, W_O, sink: int = 0):
    """ρ*_i = ⟨s̄, s̄ − ṽ_0⟩ / ‖s̄ − ṽ_0‖² in d_model space, s̄ = Σ_{j≠0} α_ij ṽ_j / m_i."""
    vt = torch.einsum("bkhd,hdm->bhkm", val, W_O)  # [b, H, k, m]
    p = pat.clone()
    p[..., sink] = 0
    m = p.sum(-1)  # [b, H, q]
    sbar = (p @ vt) / m.clamp_min(1e-300)[..., None]
    d = sbar - vt[:, :, sink][:, :, None]
    return (sbar * d).sum(-1) / (d * d).sum(-1), m


@pytest.mark.parametrize("layer", [LOCAL, GLOBAL])
def test_sinks_match_brute_force_inside_the_window(gemma, layer):
    from tl_spectral.probes import SinkProbe, run_probes

    bridge, hf = gemma
    toks = _tokens(n=3, T=3 * WINDOW - 3)
    b, T = toks.shape
    res = run_probes(bridge, toks, SinkProbe(layers=[layer]), batch_size=3,
                     progress=False)["sinks"]
    pat, val, W_O = _hf_layer(hf, toks, layer)
    w = layer_windows(bridge)[layer]
    torch.testing.assert_close(res.sink_rate[0].double(), pat[..., 0].mean((0, 2)), rtol=1e-4,
                               atol=1e-6)
    n0 = min(T, w or T)  # the queries whose window holds key 0
    torch.testing.assert_close(res.key_score[0].double(), pat[..., 0].sum(-1).mean(0) / n0,
                               rtol=1e-4, atol=1e-6)
    rho, m = _brute_rho(pat, val, W_O)
    sees = torch.arange(T) < (w or T)
    valid = sees[None, None, :] & (m > 0)
    want = (rho.clamp(0, 1) * valid).sum((0, 2)) / valid.sum((0, 2))
    torch.testing.assert_close(res.rho_mean[0].double(), want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ fields and lag counts
@pytest.mark.parametrize("padded", [False, True])
def test_field_means_and_counts_use_the_window(gemma, padded):
    from tl_spectral.analysis.lags import lag_fields
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    bridge, hf = gemma
    toks = _tokens(n=3, T=2 * WINDOW + 4)
    b, T = toks.shape
    mask = torch.ones_like(toks, dtype=torch.bool)
    if padded:
        mask[2, T - 5:] = False
    probe = AttentionFieldProbe(layers=[LOCAL, GLOBAL])
    res = run_probes(bridge, toks, probe, attention_mask=mask, batch_size=3,
                     progress=False)["attention_fields"]
    with torch.no_grad():
        att = hf(toks, output_attentions=True).attentions
    pm = mask[:, None, :, None] & mask[:, None, None, :]
    for layer in (LOCAL, GLOBAL):
        w = layer_windows(bridge)[layer]
        A = (att[layer] * pm).mean(1).double()  # head mean, padded pairs 0
        F, lags = lag_fields(A, causal=True, window=w)
        torch.testing.assert_close(res.fields[str(layer)].double(), F, rtol=1e-5, atol=1e-7)
        i = torch.arange(T)[:, None]
        key = i - lags[None, :]
        ok = (key >= 0) & (lags[None, :] < (w or T))
        real = mask[:, :, None] & mask[:, key.clamp(0, T - 1)] & ok[None]
        cnt = real.sum(0).double()
        torch.testing.assert_close(probe.pair_counts(layer).double(), cnt)
        want = torch.where(cnt > 0, (F * real).sum(0) / cnt.clamp_min(1), 0.0)
        torch.testing.assert_close(res.mean[str(layer)].double(), want, rtol=1e-5, atol=1e-7)
        if w is not None:  # the model's own field is 0 beyond the window: nothing was cut
            F_all, _ = lag_fields(A, causal=True)
            torch.testing.assert_close(F_all, F)


def test_lag_fields_window_cuts_other_maps():
    from tl_spectral.analysis.lags import lag_fields

    A = torch.rand(2, 9, 9)
    F, lags = lag_fields(A, window=3)
    F0, _ = lag_fields(A)
    assert torch.equal(F[..., :3], F0[..., :3]) and float(F[..., 3:].abs().max()) == 0.0
    with pytest.raises(ValueError, match="window"):
        lag_fields(A, window=0)


# -------------------------------------------------------------------------- memory (logits)
@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory):
    """A 2-layer Gemma3 with a 200,000-token vocabulary and d_model 64: its logits at
    batch 2 × 24 tokens are 38 MB of float32, the rest of the model 51 MB of embedding."""
    folder = save_gemma3(tmp_path_factory.mktemp("gemma3_vocab"), vocab=200_000, n_layers=2,
                         types=["sliding_attention", "full_attention"])
    return boot(folder)


def _count_calls(module):
    calls = []
    handle = module.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    return calls, handle


@pytest.mark.parametrize("layers", [[0], [0, 1]])
def test_a_probe_pass_never_forms_the_logits(big_vocab, layers):
    """A probe pass stops after the last layer it reads: the unembedding (lm_head) never
    runs, so no [batch, T, 200,000] float32 logits exist; layers after the last one read
    never run either."""
    from tl_spectral.probes import (
        AttentionFieldProbe,
        AttentionStatsProbe,
        ContributionProbe,
        SinkProbe,
        run_probes,
    )

    bridge = big_vocab
    hf = bridge.original_model
    lm_calls, h1 = _count_calls(hf.lm_head)
    layer_calls, h2 = _count_calls(hf.model.layers[1].mlp)
    toks = torch.randint(1, 200_000, (2, 24), generator=torch.Generator().manual_seed(0))
    try:
        res = run_probes(bridge, toks, [AttentionStatsProbe(layers=layers),
                                        ContributionProbe(layers=layers),
                                        SinkProbe(layers=layers),
                                        AttentionFieldProbe(layers=layers)],
                         batch_size=2, progress=False)
        assert lm_calls == [] and layer_calls == []
        assert set(res) == {"attention_stats", "contributions", "sinks", "attention_fields"}
        # asked for, the logits are formed (the hook sees the [b, T, vocab] tensor)
        run_probes(bridge, toks, AttentionStatsProbe(layers=layers), batch_size=2, progress=False,
                   on_logits=lambda start, lg: None)
        assert lm_calls == [(2, 24, 200_000)]
    finally:
        h1.remove()
        h2.remove()


def test_hooked_runs_without_logits_stop_after_the_last_hooked_block(big_vocab):
    """ModelView.run(return_type=None) with block hooks only (layer_maps, the faithfulness
    captures) never runs the unembedding; a hook past the blocks keeps the whole pass."""
    from tl_spectral.probes.contributions import layer_maps

    bridge = big_vocab
    hf = bridge.original_model
    lm_calls, h1 = _count_calls(hf.lm_head)
    toks = torch.randint(1, 200_000, (2, 16), generator=torch.Generator().manual_seed(1))
    mlp1, h2 = _count_calls(hf.model.layers[1].mlp)
    try:
        maps = layer_maps(bridge, toks, layers=[0])  # stops after block 0
        assert set(maps) == {0} and lm_calls == [] and mlp1 == []
        maps = layer_maps(bridge, toks, layers=[0, 1])
        assert set(maps) == {0, 1} and lm_calls == [] and len(mlp1) == 1
        seen = []
        ModelView(bridge).run(toks, fwd_hooks=[("blocks.0.attn.hook_pattern",
                                                lambda t, hook: seen.append(1)),
                                               ("ln_final.hook_normalized",
                                                lambda t, hook: seen.append(2))],
                              return_type=None)
        assert seen == [1, 2] and lm_calls == [(2, 16, 200_000)]
    finally:
        h1.remove()
        h2.remove()


def test_half_precision_underflow_check_ignores_keys_outside_the_window(tmp_path):
    """bfloat16: the exact zeros beyond a local layer's window are the mask, not softmax
    underflow, so no UnderflowWarning (it counts zeros among the pairs the layer can see)."""
    import warnings

    from transformer_lens.model_bridge import TransformerBridge

    from tl_spectral.probes import AttentionStatsProbe, run_probes
    from tl_spectral.probes.runner import UnderflowWarning

    folder = save_gemma3(tmp_path / "m", n_layers=2, types=TYPES[:2])
    bridge = TransformerBridge.boot_transformers(
        str(folder), device="cpu", dtype=torch.bfloat16,
        hf_config_overrides={"attn_implementation": "eager"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnderflowWarning)
        res = run_probes(bridge, _tokens(n=2, T=4 * WINDOW), AttentionStatsProbe(), batch_size=2,
                         progress=False)
    assert res["attention_stats"].entropy.shape == (2, H)


def test_rotary_averages_of_a_local_layer_stay_inside_its_window(gemma, tmp_path):
    """The causal offset average of a sliding-window layer runs over |Δ| < W only
    (P(Δ) ∝ n_ctx − |Δ| there, renormalised); a global layer's over the whole window."""
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.results import Result

    bridge, hf = gemma
    n_ctx = 24
    g = model_rotary_geometry(bridge, offsets=[0, -1], n_ctx=n_ctx, rank_offsets=None)
    assert g.windows == [WINDOW, None, WINDOW, WINDOW]
    for layer, w in ((LOCAL, WINDOW), (GLOBAL, n_ctx)):
        deltas = list(range(0, -w, -1))
        M = _hf_kernels(hf, layer, deltas)
        R = 0.5 * (M - M.transpose(-1, -2))
        e_r, e_m = R.square().sum((-2, -1)), M.square().sum((-2, -1))  # [Δ, H]
        p = torch.tensor([n_ctx - abs(d) for d in deltas], dtype=torch.float64)
        p = p / p.sum()
        torch.testing.assert_close(g.mean_norm_M_sq[layer].double(), p @ e_m, rtol=1e-4, atol=0)
        torch.testing.assert_close(g.mean_routing_fraction[layer].double(),
                                   (p @ e_r) / (p @ e_m), rtol=1e-4, atol=1e-7)
    back = Result.load(g.save(tmp_path / "geo"))
    assert back.windows == g.windows


def test_q_and_k_captures_are_before_the_norm_and_the_rotation(gemma):
    """hook_q / hook_k (the runner's ``q``/``k`` captures) hold x W_Q and x W_K as the
    projections give them: before QK-norm and RoPE (the un-normalized head vectors whose
    RMS is the per-token factor of the score); the bridge's hook_q_normed and hook_rot_q
    hold the normalized and the rotated ones. The single key head stays single in the hook."""
    bridge, hf = gemma
    toks = _tokens(n=1, T=10)
    names = {n: f"blocks.{LOCAL}.attn.{n}" for n in
             ("hook_q", "hook_k", "hook_q_normed", "hook_rot_q", "hook_rot_k")}
    _, cache = bridge.run_with_cache(toks, names_filter=lambda n: n in names.values())
    with torch.no_grad():
        h = hf(toks, output_hidden_states=True).hidden_states[LOCAL]
    p = _hf_parts(hf, LOCAL, h)
    a = hf.model.layers[LOCAL].self_attn
    with torch.no_grad():
        qn = a.q_norm(p["q"])

    def heads_first(x):
        return x.transpose(1, 2) if x.shape[1] == toks.shape[1] else x

    for name, ref in (("hook_q", p["q"]), ("hook_k", p["k"]), ("hook_q_normed", qn),
                      ("hook_rot_q", p["qr"]), ("hook_rot_k", p["kr"])):
        got = heads_first(cache[names[name]])
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- layer_windows elsewhere
def _stub(cls_name: str, hf_config=None, **cfg):
    """A stand-in TransformerLens model: ModelView reads only its class name and cfg (and a
    bridge's original_model.config)."""
    from types import SimpleNamespace

    base = dict(n_layers=2, n_heads=4, d_model=64, d_head=16, n_ctx=32, d_vocab=10,
                normalization_type="LN", positional_embedding_type="standard")
    model = type(cls_name, (), {})()
    model.cfg = SimpleNamespace(**(base | cfg))
    if hf_config is not None:
        model.original_model = SimpleNamespace(config=hf_config)
    return model


def test_layer_windows_of_other_configs():
    import transformers as tr

    ht = _stub("HookedTransformer", attn_types=["global", "local"], window_size=256)
    assert layer_windows(ht) == [None, 256]  # GPT-Neo style (TL 3.9)
    assert layer_windows(_stub("HookedTransformer")) == [None, None]
    mistral = tr.MistralConfig(num_hidden_layers=2, sliding_window=4096)
    assert layer_windows(_stub("TransformerBridge", mistral)) == [4096, 4096]
    mistral_full = tr.MistralConfig(num_hidden_layers=2, sliding_window=None)
    assert layer_windows(_stub("TransformerBridge", mistral_full)) == [None, None]
    qwen = tr.Qwen2Config(num_hidden_layers=2, use_sliding_window=False)
    assert layer_windows(_stub("TransformerBridge", qwen)) == [None, None]
    g3 = gemma3_config(n_layers=2, types=["sliding_attention", "full_attention"])
    assert layer_windows(_stub("TransformerBridge", g3)) == [WINDOW, None]
    odd = gemma3_config(n_layers=2, types=["chunked_attention", "full_attention"])
    with pytest.raises(ValueError, match="chunked_attention"):
        layer_windows(_stub("TransformerBridge", odd))
    enc = _stub("HookedEncoder", attn_types=["local", "local"], window_size=4)
    assert layer_windows(enc) == [None, None]  # bidirectional: no causal window


def test_key_scores_with_a_window_against_brute_force():
    """n_j = #{real i : j ≤ i < j + W} (padding included), hypothesis-free grid."""
    from tl_spectral.analysis.sinks import key_scores, sink_heads

    g = torch.Generator().manual_seed(3)
    b, h, T = 2, 3, 11
    p = torch.rand(b, h, T, T, generator=g).tril()
    mask = torch.ones(b, T, dtype=torch.bool)
    mask[1, 7:] = False
    for w in (1, 4, T, None):
        got = key_scores(p, True, mask, window=w)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        ok = (i >= j) & (i - j < (w or T))
        pm = p * mask[:, None, :, None]
        n = (ok[None] & mask[:, :, None]).sum(1).double()  # [b, k]
        want = torch.where(n[:, None] > 0, pm.sum(2) / n[:, None].clamp_min(1), 0.0)
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-7)
        assert torch.equal(sink_heads(p, True, 0.3, mask, window=w), got[..., 0] > 0.3)


def test_offset_zero_qk_geometry_folds_the_qk_norm(gemma):
    """model_qk_geometry(allow_rotary=True): the routing fraction of W_Q D_q D_k W_Kᵀ equals
    the HF kernel's at Δ = 0; without the QK-norm gains (fold_ln=False leaves every gain
    out) it is another number."""
    from tl_spectral.geometry.model import model_qk_geometry

    bridge, hf = gemma
    g = model_qk_geometry(bridge, allow_rotary=True)
    raw = model_qk_geometry(bridge, allow_rotary=True, fold_ln=False)
    for layer in (LOCAL, GLOBAL):
        M = _hf_kernels(hf, layer, [0])[0]  # [H, m, m]
        R = 0.5 * (M - M.transpose(-1, -2))
        want = R.square().sum((-2, -1)) / M.square().sum((-2, -1))
        torch.testing.assert_close(g.routing_fraction[layer].double(), want, rtol=1e-4, atol=1e-6)
        assert float((raw.routing_fraction[layer].double() - want).abs().max()) > 1e-3


def test_next_token_nll_equals_log_softmax_and_passes_keep_their_logits_in_budget(
        big_vocab, monkeypatch):
    """ΔPPL interventions on a large vocabulary: the NLL equals −log_softmax at the target
    (no full log_softmax copy), and no pass forms more than LOGIT_BUDGET bytes of logits; the
    curves are the same as with one pass for everything."""
    import tl_spectral.probes.damage as iv
    from tl_spectral.probes.faithfulness import faithfulness

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g)
    toks = torch.randint(0, 50, (3, 7), generator=g)
    ref = -torch.log_softmax(logits[:, :-1], -1).gather(-1, toks[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(iv.next_token_nll(logits, toks), ref)

    bridge = big_vocab[0] if isinstance(big_vocab, tuple) else big_vocab
    V = int(bridge.cfg.d_vocab)
    toks = torch.randint(1, V, (4, 12), generator=g)
    kw = dict(measures=["attention"], fractions=[0.0, 0.5], layer=0, progress=False)
    free = faithfulness(bridge, toks, **kw)
    seen: list[int] = []
    run = iv.DamageMetric.run

    def spy(self, tokens, mask, hooks, *, attn_mask):
        seen.append(int(tokens.shape[0]) * int(tokens.shape[1]) * V * 4)
        return run(self, tokens, mask, hooks, attn_mask=attn_mask)

    monkeypatch.setattr(iv, "LOGIT_BUDGET", 2 * 12 * V * 4)  # two rows a pass
    monkeypatch.setattr(iv.DamageMetric, "run", spy)
    capped = faithfulness(bridge, toks, **kw)
    assert seen and max(seen) <= 2 * 12 * V * 4
    for a, b in zip(free.to_rows(), capped.to_rows()):
        for k, v in a.items():
            if isinstance(v, float):
                assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
