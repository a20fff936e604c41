"""The zoo: shipped checkpoints and MiniLM load offline and compute what they should."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from tl_spectral.data import tiny_shakespeare, train_val_split
from tl_spectral.models import zoo
from tl_spectral.models.convert import max_logit_diff


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_available_and_unknown_name():
    assert zoo.available() == ["char-shakespeare", "char-shakespeare-noln", "sd-char-shakespeare",
                               "sd-char-shakespeare-noln", "char-shakespeare-rotary",
                               "char-shakespeare-bos", "char-shakespeare-d256", "minilm",
                               "smollm2-135m", "gemma3-270m"]
    with pytest.raises(ValueError, match="known models"):
        zoo.load("gpt-17")
    with pytest.raises(ValueError, match="char-shakespeare"):
        zoo.load_native("nope")


def _val_windows(tok, n=4, length=257):
    """The first n windows of the validation split (as in training: 90/10)."""
    _, val = train_val_split(tiny_shakespeare(), 0.1)
    ids = torch.tensor(tok.encode(val[: n * (length - 1) + 1]))
    return torch.stack([ids[i * (length - 1): i * (length - 1) + length] for i in range(n)])


def test_load_path_on_a_small_checkpoint(tmp_path, monkeypatch, no_network):
    """The load / load_native path, on a tiny checkpoint standing in for a shipped one."""
    from tl_spectral.data import CharTokenizer
    from tl_spectral.models import GPT, GPTConfig, save_model

    tok = CharTokenizer.from_text("abcdefg ")
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layers=2, n_heads=2, d_model=8, n_ctx=16,
                      normalization="none"))
    save_model(m, tmp_path / "ck", extra={"tokenizer": json.loads(tok.to_json())})
    monkeypatch.setattr(zoo, "checkpoint_dir", lambda name: tmp_path / "ck")
    native, tok2 = zoo.load_native("char-shakespeare")
    assert tok2.alphabet == tok.alphabet
    tl_model, _ = zoo.load("char-shakespeare")
    ids = torch.tensor([tok.encode("abc defg")])
    assert max_logit_diff(native, tl_model, ids) <= 1e-4
    assert tl_model.cfg.normalization_type is None


def _require_shipped(name):
    try:
        zoo.checkpoint_dir(name)
    except FileNotFoundError as e:  # only while the reference runs are still training
        pytest.skip(str(e))


@pytest.mark.parametrize("name,norm", [("char-shakespeare", "ln"),
                                       ("char-shakespeare-noln", "none")])
def test_shipped_checkpoint(name, norm, no_network):
    _require_shipped(name)
    model, tok = zoo.load_native(name)
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.d_model, c.n_ctx, c.normalization) == (6, 8, 128, 256, norm)
    assert tok.vocab_size == c.vocab_size
    info = zoo.checkpoint_info(name)
    recorded = info["metrics"]["val_loss"]
    if name == "char-shakespeare":
        assert recorded <= 1.75
    # the shipped weights still give (about) the recorded validation loss on a fixed slice
    w = _val_windows(tok)
    with torch.no_grad():
        loss = model.loss(w).item()
    assert torch.isfinite(torch.tensor(loss))
    assert abs(loss - recorded) < 0.3
    # and the converted TransformerLens model gives the same logits
    tl_model, tok2 = zoo.load(name)
    assert tok2.alphabet == tok.alphabet
    assert max_logit_diff(model, tl_model, w[:2, :-1]) <= 1e-4
    _, cache = tl_model.run_with_cache(w[:1, :64])
    assert cache["blocks.5.attn.hook_pattern"].shape == (1, 8, 64, 64)


def test_minilm_matches_hugging_face(no_network):
    bridge, tok = zoo.load("minilm")
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(zoo.minilm_path())).eval()
    enc = tok(["To be, or not to be, that is the question.", "A short one."],
              return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = hf(**enc, output_hidden_states=True).hidden_states
        _, cache = bridge.run_with_cache(enc["input_ids"], attention_mask=enc["attention_mask"])
    keep = enc["attention_mask"].bool()
    assert len(ref) == 7
    assert (cache["blocks.0.hook_resid_pre"] - ref[0])[keep].abs().max() <= 1e-5
    for l in range(6):
        assert (cache[f"blocks.{l}.hook_resid_post"] - ref[l + 1])[keep].abs().max() <= 1e-5
    assert cache["blocks.0.attn.hook_pattern"].shape[:2] == (2, 12)


def test_char_model_has_transformer_lens_idioms(tmp_path, monkeypatch, no_network):
    """zoo.load's model carries a tokenizer: to_tokens, to_str_tokens and generate work
    (same ids as the CharTokenizer, no BOS), and load still returns the CharTokenizer."""
    from tl_spectral.data import CharTokenizer
    from tl_spectral.models import GPT, GPTConfig, save_model

    tok = CharTokenizer.from_text("abcdefg \n")
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layers=2, n_heads=2, d_model=16, n_ctx=32))
    save_model(m, tmp_path / "ck", extra={"tokenizer": json.loads(tok.to_json())})
    monkeypatch.setattr(zoo, "checkpoint_dir", lambda name: tmp_path / "ck")
    tl_model, tok2 = zoo.load("char-shakespeare")
    assert isinstance(tok2, CharTokenizer)
    text = "abc d\nefg"
    assert tl_model.to_tokens(text)[0].tolist() == tok.encode(text)
    assert tl_model.to_str_tokens(text) == list(text)
    torch.manual_seed(0)
    out = tl_model.generate("abc", max_new_tokens=6, verbose=False)
    assert isinstance(out, str) and out.startswith("abc") and len(out) == 9
    assert set(out) <= set(tok.alphabet)
    # and a BPE-tokenized model
    from pathlib import Path

    ranks = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2.tiktoken"
    if ranks.exists():
        from tl_spectral.data import BPETokenizer
        from tl_spectral.models.convert import to_transformer_lens

        bpe = BPETokenizer(ranks)
        mb = GPT(GPTConfig(vocab_size=bpe.vocab_size, n_layers=1, n_heads=2, d_model=16,
                           n_ctx=32))
        tlb = to_transformer_lens(mb)
        zoo.attach_tokenizer(tlb, bpe)
        assert tlb.to_tokens("Hello world")[0].tolist() == [15496, 995]
        assert tlb.to_str_tokens("Hello world") == ["Hello", " world"]
        assert isinstance(tlb.generate("Hello", max_new_tokens=3, verbose=False), str)


def test_shipped_start_token_model(no_network):
    """char-shakespeare-bos loads offline; its tokenizer keeps the start token, the
    TransformerLens model prepends it, and [BOS] windows give the recorded validation loss."""
    from tl_spectral.data import document_windows

    _require_shipped("char-shakespeare-bos")
    model, tok = zoo.load_native("char-shakespeare-bos")
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.d_model, c.n_ctx) == (6, 8, 128, 256)
    assert tok.bos_id == c.vocab_size - 1 == 78
    info = zoo.checkpoint_info("char-shakespeare-bos")
    assert info["tokenizer"]["bos"] is True and info["metrics"]["val_loss"] <= 1.75
    _, val = train_val_split(tiny_shakespeare(), 0.1)
    w = document_windows(val, tok, 4, 257, seed=0, bos_id=tok.bos_id).tokens
    with torch.no_grad():
        loss = model.loss(w).item()
    assert abs(loss - info["metrics"]["val_loss"]) < 0.3
    tl_model, _ = zoo.load("char-shakespeare-bos")
    assert tl_model.cfg.default_prepend_bos
    assert tl_model.to_tokens("To be")[0].tolist() == [tok.bos_id, *tok.encode("To be")]
    assert max_logit_diff(model, tl_model, w[:2, :-1]) <= 1e-4


def test_shipped_paper_width_model(no_network):
    """char-shakespeare-d256 (the scale-POD paper's configuration: 6 layers, 8 heads,
    d_model 256) loads offline, as the native GPT and as a TransformerLens model with equal
    logits, and gives its recorded validation loss on validation windows."""
    _require_shipped("char-shakespeare-d256")
    model, tok = zoo.load_native("char-shakespeare-d256")
    c = model.cfg
    assert (c.n_layers, c.n_heads, c.d_model, c.d_heads[0], c.n_ctx) == (6, 8, 256, 32, 256)
    info = zoo.checkpoint_info("char-shakespeare-d256")
    assert info["metrics"]["steps"] == 2600 and info["metrics"]["val_loss"] <= 1.6
    w = _val_windows(tok)
    with torch.no_grad():
        loss = model.loss(w).item()
    assert abs(loss - info["metrics"]["val_loss"]) < 0.3
    tl_model, _ = zoo.load("char-shakespeare-d256")
    assert max_logit_diff(model, tl_model, w[:2, :-1]) <= 1e-4
