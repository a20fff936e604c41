"""The architectures TransformerLens users analyse, as tiny random Hugging Face models
(GPT-2, GPT-NeoX with partial rotary, Llama and Qwen2 with grouped-query rotary attention,
Gemma-2, BERT) booted through ``TransformerBridge.boot_transformers``.

One parametrized test per check and family. Every reference is computed from the Hugging
Face modules themselves (their projections, norms and attention weights), never from
ModelView: the folded QK kernel from a least-squares fit of ``q_proj(norm(x))`` against the
unscaled normalized input, the contribution weights by brute force over
``[query, key, head, d_model]``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_hf import FAMILIES, ROTARY, boot, save_tiny  # noqa: E402

from tl_spectral.model_view import ModelView  # noqa: E402
from tl_spectral.probes import (  # noqa: E402
    AttentionFieldProbe,
    AttentionStatsProbe,
    ContributionProbe,
    SinkProbe,
    run_probes,
)

try:
    from tl_spectral.geometry.model import model_qk_geometry
except ImportError:  # the geometry move is in progress
    from tl_spectral.routing import model_qk_geometry
try:
    from tl_spectral.geometry.model import UnreadableHeadsError
except ImportError:
    from tl_spectral.routing import UnreadableHeadsError

N_DOCS, T = 3, 12


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """{family: (bridge, hf model, folder)}, built lazily."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            import transformers as tr

            folder = tmp_path_factory.mktemp(family)
            save_tiny(family, folder, seed=FAMILIES.index(family))
            bridge = boot(folder)
            cls = tr.BertModel if family == "bert" else tr.AutoModelForCausalLM
            hf = cls.from_pretrained(str(folder), attn_implementation="eager").eval()
            cache[family] = (bridge, hf, folder)
        return cache[family]

    return get


def _tokens(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 60, (N_DOCS, T), generator=g)


# ------------------------------------------------------------ HF-module references
def _hf_layers(family: str, hf):
    if family == "gpt2":
        return hf.transformer.h
    if family == "gpt_neox":
        return hf.gpt_neox.layers
    if family == "bert":
        return hf.encoder.layer
    return hf.model.layers


def _hf_attn_parts(family: str, hf, layer: int, H: int, dh: int):
    """(attention input from the layer's residual input, q(x), k(x), v(x) per head
    [n, H, dh] with kv heads repeated, W_O [H, dh, d_model]) from the HF modules."""
    blk = _hf_layers(family, hf)[layer]
    if family == "gpt2":
        ln, a = blk.ln_1, blk.attn
        d = a.c_attn.weight.shape[0]

        def qkv(x):
            return a.c_attn(x).split(d, -1)

        W_O = a.c_proj.weight.reshape(H, dh, -1)  # Conv1D: y = z @ weight
    elif family == "gpt_neox":
        ln, a = blk.input_layernorm, blk.attention

        def qkv(x):
            y = a.query_key_value(x).view(*x.shape[:-1], H, 3 * dh)
            return [t.reshape(*x.shape[:-1], H * dh) for t in y.split(dh, -1)]

        W_O = a.dense.weight.T.reshape(H, dh, -1)
    elif family == "bert":
        ln, a = torch.nn.Identity(), blk.attention.self

        def qkv(x):
            return a.query(x), a.key(x), a.value(x)

        W_O = blk.attention.output.dense.weight.T.reshape(H, dh, -1)
    else:
        ln, a = blk.input_layernorm, blk.self_attn

        def qkv(x):
            return a.q_proj(x), a.k_proj(x), a.v_proj(x)

        W_O = a.o_proj.weight.T.reshape(H, dh, -1)

    def heads(x):
        q, k, v = qkv(ln(x))
        out = []
        for t in (q, k, v):
            t = t.reshape(*t.shape[:-1], -1, dh)
            if t.shape[-2] != H:
                t = t.repeat_interleave(H // t.shape[-2], dim=-2)
            out.append(t)
        return out

    return heads, W_O


def _hf_run(family: str, hf, tokens: torch.Tensor):
    with torch.no_grad():
        out = hf(tokens, output_attentions=True, output_hidden_states=True)
    return out.hidden_states, out.attentions


def _reference_kernel(family: str, hf, view: ModelView, layer: int):
    """Folded offset-0 QK kernel M_h = A_Q A_Kᵀ per head, ``A`` fitted by least squares so
    that ``q_h = n(x) A_Q + c`` on random x (n: the unscaled normalized input). With
    LayerNorm n(x) ⟂ 1 and the minimum-norm fit is the centred kernel."""
    heads, _ = _hf_attn_parts(family, hf, layer, view.n_heads, view.d_head)
    g = torch.Generator().manual_seed(7)
    X = torch.randn(6 * view.d_model, view.d_model, generator=g, dtype=torch.float64) + 0.2
    with torch.no_grad():
        q, k, _ = [t.double() for t in heads(X.float())]
    if family == "bert":
        N = X.float().double()
    else:
        aff = view.ln1_affine(layer, check=False)
        assert aff is not None
        N = aff.normalize(X.float().double())
    D = torch.cat([N, torch.ones(N.shape[0], 1, dtype=N.dtype)], 1)
    pinv = torch.linalg.pinv(D, rtol=1e-9)
    A_q = torch.einsum("mn,nhd->hmd", pinv, q)[:, :-1]  # [H, d_model, dh]
    A_k = torch.einsum("mn,nhd->hmd", pinv, k)[:, :-1]
    return A_q @ A_k.transpose(-1, -2)  # [H, d_model, d_model]


def _brute_contributions(pattern, v, W_O):
    """c_ij^h = ⟨o_i, α_ij ṽ_j^h⟩ / ‖o_i‖², with the [q, k, H, d_model] tensor formed."""
    vt = torch.einsum("bkhd,hdm->bkhm", v, W_O)  # ṽ [b, k, H, m]
    terms = pattern.permute(0, 2, 3, 1)[..., None] * vt[:, None]  # [b, q, k, H, m]
    o = terms.sum(dim=(2, 3))  # [b, q, m]
    return torch.einsum("bqm,bqkhm->bhqk", o, terms) / (o * o).sum(-1)[:, None, :, None]


# ------------------------------------------------------------------------ tests
@pytest.mark.parametrize("family", FAMILIES)
def test_view_and_tl_idioms(family, family_models):
    bridge, hf, _ = family_models(family)
    v = ModelView(bridge)
    assert v.causal == (family != "bert")
    assert v.pre_ln == (family != "bert")
    assert v.n_kv_heads == (2 if family in ("llama", "qwen2", "gemma2") else 4)
    assert v.normalization == ("RMS" if family in ("llama", "qwen2", "gemma2") else "LN")
    v.check_patterns()
    toks = bridge.to_tokens("hello world", prepend_bos=False)
    assert toks.shape[-1] == len(bridge.to_str_tokens("hello world", prepend_bos=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_fold_ln_matches_hf_projections(family, family_models):
    """Folded W_Q/W_K/W_V applied to the unscaled normalized input give the HF module's
    q/k/v (LayerNorm: centred gain + bias; RMSNorm: gain only; Gemma: 1 + w)."""
    bridge, hf, _ = family_models(family)
    v = ModelView(bridge)
    for layer in range(v.n_layers):
        heads, _ = _hf_attn_parts(family, hf, layer, v.n_heads, v.d_head)
        X = torch.randn(40, v.d_model, generator=torch.Generator().manual_seed(layer)) + 0.2
        with torch.no_grad():
            ref = [t.double() for t in heads(X)]
        aff = v.ln1_affine(layer)
        N = X.double() if aff is None else aff.normalize(X.double())
        w = v.weights(layer, fold_ln=True)
        assert w.folded == (family != "bert")
        for (Wn, bn), r in zip((("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")), ref):
            got = torch.einsum("nm,hmd->nhd", N, getattr(w, Wn).double()) + getattr(w, bn).double()
            err = float((got - r).abs().max() / r.abs().max())
            assert err < 1e-5, (family, layer, Wn, err)


@pytest.mark.parametrize("family", FAMILIES)
def test_qk_kernel_matches_hf_reference(family, family_models):
    """The folded offset-0 kernel M = W_Q W_Kᵀ equals the one fitted from the HF modules;
    model_qk_geometry reads non-rotary models and refuses rotary ones unless allowed."""
    bridge, hf, _ = family_models(family)
    v = ModelView(bridge)
    st = v.stacked_weights(fold_ln=True)
    ref_frac = []
    for layer in range(v.n_layers):
        M = st["W_Q"][layer].double() @ st["W_K"][layer].double().transpose(-1, -2)
        M_ref = _reference_kernel(family, hf, v, layer)
        err = float((M - M_ref).norm() / M_ref.norm())
        assert err < 1e-5, (family, layer, err)
        R = 0.5 * (M_ref - M_ref.transpose(-1, -2))
        ref_frac.append((R * R).sum((-1, -2)) / (M_ref * M_ref).sum((-1, -2)))
    if family in ROTARY:
        with pytest.raises(UnreadableHeadsError, match="rotary"):
            model_qk_geometry(bridge)
        geo = model_qk_geometry(bridge, allow_rotary=True)
    else:
        geo = model_qk_geometry(bridge)
    torch.testing.assert_close(geo.routing_fraction.double(), torch.stack(ref_frac),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_probes_run_and_contributions_match_brute_force(family, family_models):
    bridge, hf, _ = family_models(family)
    v = ModelView(bridge)
    tokens = _tokens(FAMILIES.index(family))
    probes = [AttentionStatsProbe(), ContributionProbe(keep_docs=[0, 2], rank_queries=2),
              SinkProbe(), AttentionFieldProbe()]
    res = run_probes(bridge, tokens, probes, batch_size=2, progress=False)
    hidden, attns = _hf_run(family, hf, tokens)
    for layer in range(v.n_layers):
        pat = attns[layer].double()  # [b, H, q, k]
        stats = res["attention_stats"]
        torch.testing.assert_close(stats.first_token_mass[layer].double(),
                                   pat[..., 0].mean(dim=(0, 2)), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(res["sinks"].sink_rate[layer].double(),
                                   pat[..., 0].mean(dim=(0, 2)), rtol=1e-4, atol=1e-5)
        mean_field = res["attention_fields"].mean[str(layer)]
        assert torch.isfinite(mean_field).all()
        heads, W_O = _hf_attn_parts(family, hf, layer, v.n_heads, v.d_head)
        with torch.no_grad():
            _, _, val = heads(hidden[layer])
        ref = _brute_contributions(pat, val.double(), W_O.detach().double())
        got = res["contributions"].kept_maps[f"{layer}.contribution"].double()
        err = float((got - ref[[0, 2]]).abs().max() / ref.abs().max())
        assert err < 1e-4, (family, layer, err)
        # rows of the token-level map sum to 1 (SPEC C.1)
        torch.testing.assert_close(ref.sum(dim=(1, 3)), torch.ones(N_DOCS, T, dtype=ref.dtype),
                                   rtol=1e-6, atol=1e-6)
    for r in res.values():
        for name in ("entropy", "sink_rate", "source_mean"):
            t = getattr(r, name, None)
            if t is not None:
                assert torch.isfinite(t).all()


def test_fold_check_catches_a_misread_norm(family_models):
    """A Gemma norm read as plain RMSNorm (gain w instead of 1 + w) fails the module check."""
    from tl_spectral.model_view import NormAffine

    bridge, _, _ = family_models("gemma2")
    v = ModelView(bridge)
    good = v.ln1_affine(0)
    assert good is not None and good.kind == "RMS"
    mod = bridge.blocks[0].ln1.original_component
    wrong = NormAffine("RMS", mod.weight.detach().float(), torch.zeros(v.d_model), good.eps)
    with pytest.raises(ValueError, match="cannot fold"):
        v._check_norm(0, mod, wrong)
    with pytest.raises(ValueError, match="cannot fold"):  # LayerNorm read as RMSNorm
        lnv = ModelView(family_models("gpt2")[0])
        a = lnv.ln1_affine(0)
        lnv._check_norm(0, lnv.model.blocks[0].ln1.original_component,
                        NormAffine("RMS", a.gain, a.bias, a.eps))
