"""The real-decoder study on Gemma 3 (docs/real_decoder.md, Gemma-3-270M): the attention
recomputation of :mod:`tl_spectral_studies.real_decoder_ops` exact against the Hugging Face
Gemma3ForCausalLM's own attention (patterns, per-head outputs, logits) on a tiny random model
with QK-norm, one key/value head, a sliding window shorter than the windows and two rotary
θ; the transposed kernel against the explicit kernel of each layer's own rotary embedding;
the --quick study end to end on the tiny model (local/global numbers, verdicts); the claims
registry reading a Gemma record."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_hf import char_tokenizer  # noqa: E402
from test_gemma3_tiny import DH, TYPES, WINDOW, boot, save_gemma3  # noqa: E402

from tl_spectral_studies import real_decoder as rd  # noqa: E402
from tl_spectral_studies import real_decoder_ops as ops  # noqa: E402

VOCAB = 80  # the char tokenizer's 64 ids and <bos> (64) fit


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(bridge, tokenizer with <bos>, HF Gemma3ForCausalLM eager) of one tiny folder."""
    from transformers import AutoModelForCausalLM

    folder = save_gemma3(tmp_path_factory.mktemp("gemma3_rd"), vocab=VOCAB, tokenizer=False)
    tok = char_tokenizer(64)
    tok.add_special_tokens({"bos_token": "<bos>"})
    tok.save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    return boot(folder), tok, hf


def _tokens(n=2, T=21, seed=0):
    return torch.randint(1, 64, (n, T), generator=torch.Generator().manual_seed(seed))


def _hf_attention(hf, toks):
    """HF's own attention weights per layer and the per-head outputs (o_proj's input)."""
    z = {}
    hooks = [blk.self_attn.o_proj.register_forward_pre_hook(
        lambda mod, args, li=li: z.__setitem__(li, args[0].detach()))
        for li, blk in enumerate(hf.model.layers)]
    try:
        with torch.no_grad():
            out = hf(toks, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return out.attentions, z, out.logits


def test_gemma_patterns_and_head_outputs_are_hf_s(gemma):
    """Mode "none": every layer's pattern and every head's output are the HF module's (local
    layers masked beyond the window, T = 21 > W = 8), and the logits too."""
    _, _, hf = gemma
    toks = _tokens()
    att, z, logits = _hf_attention(hf, toks)
    cap: dict = {}
    L = len(hf.model.layers)
    with ops.patched(hf, {li: "none" for li in range(L)}, capture=cap), torch.no_grad():
        got = hf(toks).logits
    T = toks.shape[1]
    for li in range(L):
        p, v = cap[li]
        torch.testing.assert_close(p, att[li], rtol=0, atol=1e-6)
        heads = (p @ v).transpose(1, 2).reshape(toks.shape[0], T, -1)
        torch.testing.assert_close(heads, z[li], rtol=0, atol=1e-6)
        if TYPES[li] == "sliding_attention":
            i = torch.arange(T)
            beyond = i[None, :] <= i[:, None] - WINDOW
            assert beyond.any() and p[..., beyond].abs().max() == 0
    torch.testing.assert_close(got, logits, rtol=0, atol=1e-5)


def _layer_inputs(hf, toks, layer):
    blk = hf.model.layers[layer]
    with torch.no_grad():
        hs = hf(toks, output_hidden_states=True).hidden_states[layer]
        x = blk.input_layernorm(hs)
        pos = torch.arange(toks.shape[1])[None]
        pe = hf.model.rotary_emb(x, pos, blk.self_attn.layer_type)
    return x, pe


@pytest.mark.parametrize("layer", [0, 1])  # a local (θ 10⁴) and a global (θ 10⁶) layer
def test_gemma_transposed_scores_are_the_transposed_rotary_kernel(gemma, layer):
    """x_i M(j − i)ᵀ x_jᵀ from the reflection trick equals the explicit kernel between the
    QK-normed heads, built with the layer's own rotary embedding: query x_j at position P,
    key x_i at P + (j − i)."""
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    _, _, hf = gemma
    toks = _tokens(1, 12)
    x, pe = _layer_inputs(hf, toks, layer)
    attn = hf.model.layers[layer].self_attn
    with torch.no_grad():
        q, k, _ = ops._qkv(attn, x)
        g = q.shape[1] // k.shape[1]
        assert g == 4 and q.shape[-1] == DH
        t = ops.transposed_scores(q, k, *pe, g)
        for i, j in [(5, 2), (7, 7), (11, 0), (3, 9)]:
            P = 30
            c, s = hf.model.rotary_emb(x, torch.tensor([[P, P + (j - i)]]), attn.layer_type)
            qj, ki = q[:, :, j:j + 1], k[:, :, i:i + 1]
            qr, _ = apply_rotary_pos_emb(qj, qj, c[:, :1], s[:, :1])
            _, kr = apply_rotary_pos_emb(ki, ki, c[:, 1:], s[:, 1:])
            brute = (qr * kr.repeat_interleave(g, 1)).sum(-1)[..., 0]
            torch.testing.assert_close(t[:, :, i, j], brute, rtol=1e-4, atol=1e-5)


def test_gemma_routing_filtering_and_linear_respect_the_window(gemma):
    """The two parts sum to the score; the routing part vanishes on the diagonal; every mode
    gives nothing beyond a local layer's window, rows summing to 1."""
    _, _, hf = gemma
    toks = _tokens(1, 20)
    x, pe = _layer_inputs(hf, toks, 0)
    attn = hf.model.layers[0].self_attn
    with torch.no_grad():
        q, k, _ = ops._qkv(attn, x)
        s = ops._rope(q, *pe) @ ops._expand(ops._rope(k, *pe), 4).transpose(-1, -2)
        t = ops.transposed_scores(q, k, *pe, 4)
        pats = {m: ops.attention_pattern(attn, x, pe, m)[0] for m in
                ("routing", "filtering", "linear")}
    r = 0.5 * (s - t)
    torch.testing.assert_close(r + 0.5 * (s + t), s)
    assert r.diagonal(dim1=-2, dim2=-1).abs().max() < 1e-5 * s.abs().max()
    ok = ops._allowed(attn, 20)
    assert not ok[19, 19 - WINDOW] and ok[19, 19 - WINDOW + 1]
    for m, p in pats.items():
        assert p[..., ~ok].abs().max() == 0, m
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p.sum(-1)), msg=m)
    want = (r * attn.scaling).masked_fill(~ok, float("-inf")).softmax(-1)
    torch.testing.assert_close(pats["routing"], want, rtol=1e-5, atol=1e-6)


def test_gemma_window_nll_and_sink_decompositions(gemma):
    from _study_checks import check_window_nll

    _, _, hf = gemma
    toks = _tokens(3, 16)
    check_window_nll(ops, hf, toks)
    sd = ops.sink_decompositions(hf, toks, batch_size=2)
    att, _, _ = _hf_attention(hf, toks)
    for li in range(len(hf.model.layers)):  # α_i0 over queries i ≥ 1 and heads: HF's own
        torch.testing.assert_close(sd["attn0"][:, li], att[li][:, :, 1:, 0].double().mean((1, 2)),
                                   rtol=0, atol=1e-6)
    assert sd["head_attn0"].shape == (3, len(hf.model.layers), 4)


def test_gemma_removal_from_a_layer_on_equals_the_full_pass(gemma):
    """Gemma's layers read their sliding-window or global mask and rotary table by their
    index in the stack: skipping the prefix must leave each layer its own."""
    from _study_checks import check_suffix_nll

    check_suffix_nll(ops, gemma[2], _tokens(3, 16))


def test_load_hf_names_the_models():
    with pytest.raises(ValueError, match="use one of"):
        ops.load_hf("gpt2")
    with pytest.raises(TypeError, match="Gemma3ForCausalLM"):
        ops.hf_of(torch.nn.Linear(2, 2))


def _data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    words = "the cat sat on a mat and then it ran far away. " * 400
    (d / "wiki_excerpt.txt").write_text(words, encoding="utf-8")
    (d / "austen.txt").write_text(words.upper(), encoding="utf-8")
    return d


def test_gemma_quick_study_on_the_tiny_model(gemma, tmp_path):
    """The quick run of routing, scales, sinks and interventions for Gemma writes OUT/gemma3-270m
    with the <bos> start token, local and global layers apart, and verdicts of the Gemma
    column; SmolLM2's folder stays untouched."""
    bridge, tok, hf = gemma
    out = tmp_path / "rd"
    rd.run_study(out, _data(tmp_path), steps=("routing", "scales", "sinks", "interventions"),
                 quick=True, model="gemma3-270m", loaded=(bridge, tok, hf), pod_docs=6)
    g = out / "gemma3-270m"
    assert sorted(p.name for p in out.iterdir()) == ["gemma3-270m"]
    r = json.loads((g / "routing.json").read_text())
    assert r["model"] == "gemma3-270m" and r["n_heads_total"] == 16
    assert set(r["by_type"]) == {"local", "global"}
    assert r["by_type"]["global"]["layers"] == [1] and r["by_type"]["local"]["n_heads"] == 12
    assert [row["type"] for row in r["per_layer"]] == ["local", "global", "local", "local"]
    sc = json.loads((g / "scales.json").read_text())
    assert sc["layer_types"] == ["local", "global"]  # QUICK: layers 0 and 1
    assert sc["table"][0]["uniform_heads"] == 4  # the model's own heads per layer
    s = json.loads((g / "sinks.json").read_text())
    st = s["settings"]["wiki_start"]
    assert set(st["first_tokens"]) == {"<bos>"}
    for v in s["settings"].values():
        assert v["probe_vs_brute_max_abs_diff_C0"] < 1e-3
        assert v["probe_vs_brute_max_abs_diff_attn0"] < 1e-3
    V = json.loads((g / "verdicts.json").read_text())
    assert {v["model"] for v in V} == {"gemma-3-270m"}
    ids = {v["id"] for v in V}
    assert {"B.budget.routing_fraction_delta0", "B.rank", "A.bands", "C.zero_ppl",
            "B.inversion"} <= ids
    tab = rd.markdown(g, "gemma3-270m")
    assert "| local |" in tab and "| global |" in tab and "0 (local)" in tab


def test_registry_reads_a_gemma_record(gemma, tmp_path):
    """A Gemma results folder fills the Gemma-3 column: the registry's record has the
    number of routing.json and the provenance of its run; the pooled sink numbers of a
    split run on fewer than 64 windows say they are provisional."""
    import dataclasses

    from tl_spectral_studies.claims import catalog, registry

    g = tmp_path / "g"
    g.mkdir()
    iv = {"estimate": 0.3, "low": 0.25, "high": 0.35}
    (g / "routing.json").write_text(json.dumps({
        "model": "gemma3-270m", "seed": 0, "n_heads_total": 72, "capacity": 512,
        "routing_fraction_delta0": iv, "routing_fraction_causal": iv,
        "eff_rank_R_delta0": {"estimate": 100.0, "low": 90.0, "high": 110.0},
        "depth_effect_rank_R": iv,
        "gaussian": {"routing_fraction_delta0": 0.5, "routing_fraction_causal": 0.5,
                     "eff_rank_R_delta0": 300.0},
        "provenance": {"commit": "abc", "seeds": [0]}}))
    m = dataclasses.replace(registry.MODELS["gemma-3-270m"], results=str(g),
                             evidence=None)  # the study folder alone, not the panel
    recs = {r.claim: r for r in catalog.records(registry.ROOT, {m.key: m})}
    b = recs["B.budget.routing_fraction_delta0"]
    assert b.model == "gemma-3-270m" and b.label == "reproduced" and b.n == 72
    assert b.interval == (0.25, 0.35) and b.provenance["commit"] == "abc"
    assert recs["B.rank"].label == "reproduced"  # 100 < 300 and < 0.5 × 512
    assert recs["C.sink"].label == "not measured"
    # the provisional note of a split 8-window sink run (select 4, test 4)
    from tl_spectral_studies.claims.seed003 import selection_note

    class R:
        def json(self, name):
            return {"n_docs": 8, "settings": {"wiki_start": {"selection": {
                "rule": "interval", "split": True, "select_windows": [0, 1, 2, 3],
                "test_windows": [4, 5, 6, 7]}}}}

    assert selection_note(R()).startswith("provisional: 8 windows (sink layers selected on 4")
