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


# ------------------------------------------------ characters outside the alphabet
def test_char_normalises_unicode_punctuation_to_ascii():
    tok = CharTokenizer(list("abist '\"-. "[:-1]) + ["f", "n", "e"])
    ids, rep = tok.encode_with_report("it’s “fine” — é…")
    assert tok.decode(ids) == "it's \"fine\" - e..."
    assert rep.normalized == {"’": 1, "“": 1, "”": 1, "—": 1, "é": 1, "…": 1}
    assert rep.n_normalized == 6 and not rep.dropped and "normalised 6" in rep.note()
    # a character in the alphabet is never normalised
    tok2 = CharTokenizer(list("ab—"))
    assert tok2.decode(tok2.encode("a—b")) == "a—b" and tok2.last_report.note() == ""
    with pytest.raises(ValueError, match="not in this tokenizer"):  # normalize=False: raw
        tok.encode("it’s", normalize=False)


def test_char_unknown_policies_count_what_changed():
    tok = CharTokenizer(list("ab ?"))
    text = "a*b £ab*"
    with pytest.raises(ValueError, match=r"\['\*', '£'\].*unknown='drop'"):
        tok.encode(text)
    ids, rep = tok.encode_with_report(text, unknown="drop")
    assert tok.decode(ids) == "ab ab" and rep.dropped == {"*": 2, "£": 1}
    assert rep.n_dropped == 3 and rep.note().startswith("dropped 3 characters")
    assert tok.decode(tok.encode(text, unknown="replace")) == "a?b ?ab?"
    assert tok.last_report.n_replaced == 3
    assert tok.decode(tok.encode(text, unknown="replace", replacement=" ")) == "a b  ab "
    with pytest.raises(ValueError, match="replacement"):
        tok.encode(text, unknown="replace", replacement="z")
    with pytest.raises(ValueError, match="unknown must be"):
        tok.encode(text, unknown="ignore")


def test_windows_pass_the_policy_and_keep_the_report():
    tok = CharTokenizer(list("ab"))
    w = document_windows("ab*" * 20, tok, n_docs=2, length=8, unknown="drop")
    assert w.encode_report.dropped == {"*": 20}
    assert "dropped 20" in w.encode_report.note()


@pytest.mark.skipif(not SHARED.exists(), reason="shared data not present")
def test_shakespeare_alphabet_reads_austen_and_wikipedia():
    """The default char model's alphabet on the project's other corpora: normalise, then
    drop, with the count (the CLI's policy)."""
    tok = CharTokenizer.from_text(tiny_shakespeare())
    for path in ("austen.txt", "wiki_excerpt.txt"):
        text = (SHARED / path).read_text(encoding="utf-8")[:200_000]
        ids, rep = tok.encode_with_report(text, unknown="drop")
        assert len(ids) == len(text) - rep.n_dropped + sum(
            (len(tok._ascii_form(c)) - 1) * n for c, n in rep.normalized.items())
        assert max(ids) < tok.vocab_size


def test_char_and_bpe_convert_to_hugging_face():
    tok = CharTokenizer.from_text(tiny_shakespeare())
    hf = tok.to_hf()
    s = "ROMEO:\nWhat, it’s thou — here…"
    assert hf(s)["input_ids"] == tok.encode(s)
    assert hf.decode(tok.encode("To be,\nor not")) == "To be,\nor not"
    assert hf.eos_token_id == tok.vocab_size and hf.pad_token_id == 0
    if SHARED.exists():
        bpe = BPETokenizer(SHARED / "gpt2.tiktoken")
        hb = bpe.to_hf()
        text = "Hello world — it’s 1,024 tokens!\n\n  ok"
        assert hb(text)["input_ids"] == bpe.encode(text)
        assert hb.eos_token_id == bpe.eot_token == 50256
