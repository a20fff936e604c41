"""Corpora, tokenizers and document windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.data import (
    BPETokenizer,
    CharTokenizer,
    document_windows,
    load_austen,
    load_wikipedia,
    tiny_shakespeare,
    train_val_split,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_bundled_corpus():
    text = tiny_shakespeare()
    assert len(text) == 1_033_444
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 78
    train, val = train_val_split(text)
    assert len(val) == len(text) - int(len(text) * 0.9)
    assert train + val == text


@settings(max_examples=25, deadline=None)
@given(s=st.text(alphabet="abc xyz\n", min_size=1, max_size=50))
def test_char_roundtrip(s):
    tok = CharTokenizer(list("abc xyz\n"))
    assert tok.decode(tok.encode(s)) == s
    assert CharTokenizer.from_json(tok.to_json()).alphabet == tok.alphabet


def test_char_unknown_raises():
    with pytest.raises(ValueError, match="not in this tokenizer"):
        CharTokenizer(list("ab")).encode("abc")


def test_windows_exact_and_seeded():
    text = tiny_shakespeare()[:200_000]
    tok = CharTokenizer.from_text(tiny_shakespeare())
    w = document_windows(text, tok, n_docs=50, length=256, seed=3)
    assert w.tokens.shape == (50, 256)
    assert torch.equal(w.tokens, document_windows(text, tok, 50, 256, seed=3).tokens)
    assert not torch.equal(w.tokens, document_windows(text, tok, 50, 256, seed=4).tokens)
    # windows are disjoint slices of the stream
    starts = w.starts.tolist()
    assert len(set(starts)) == 50 and all(s % 256 == 0 for s in starts)
    ids = torch.tensor(tok.encode(text))
    assert torch.equal(w.tokens[5], ids[starts[5]: starts[5] + 256])


def test_windows_errors():
    tok = CharTokenizer(list("ab"))
    with pytest.raises(ValueError, match="disjoint windows"):
        document_windows("ab" * 10, tok, n_docs=5, length=8)
    with pytest.raises(ValueError, match="n_docs"):
        document_windows("ab" * 10, tok, n_docs=0, length=8)


@pytest.mark.skipif(not SHARED.exists(), reason="shared data not present")
def test_shared_loaders_and_bpe():
    a = load_austen(SHARED / "austen.txt")
    w = load_wikipedia(SHARED / "wiki_excerpt.txt")
    assert "Pride" in a[:200].title() and "= Anarchism =" in w[:50]
    bpe = BPETokenizer(SHARED / "gpt2.tiktoken")
    assert bpe.encode("Hello world") == [15496, 995]
    assert bpe.decode(bpe.encode(a[:500])) == a[:500]
    with pytest.raises(FileNotFoundError, match="austen"):
        load_austen("/nonexistent/austen.txt")
