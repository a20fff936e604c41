"""Tokenizers: a character tokenizer and a GPT-2 BPE tokenizer from a local ranks file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch


class CharTokenizer:
    """Character-level tokenizer over a fixed alphabet.

    ``CharTokenizer.from_text(text)`` builds the sorted alphabet of ``text``. Unknown
    characters raise ``ValueError`` naming them (nothing is silently dropped).
    """

    def __init__(self, alphabet: Sequence[str]):
        chars = list(alphabet)
        if len(set(chars)) != len(chars):
            raise ValueError("alphabet has repeated characters")
        if any(len(c) != 1 for c in chars):
            raise ValueError("every alphabet entry must be one character")
        self.alphabet: list[str] = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("cannot build a character tokenizer from an empty text")
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            unknown = sorted({c for c in text if c not in self.stoi})
            raise ValueError(
                f"characters {unknown!r} are not in this tokenizer's alphabet of "
                f"{self.vocab_size}; pass text drawn from the training alphabet"
            ) from None

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.alphabet[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"type": "char", "alphabet": "".join(self.alphabet)})

    @classmethod
    def from_json(cls, s: str) -> "CharTokenizer":
        d = json.loads(s)
        if d.get("type") != "char":
            raise ValueError(f"not a character tokenizer description: type={d.get('type')!r}")
        return cls(list(d["alphabet"]))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class BPETokenizer:
    """GPT-2 byte-pair encoding from a local ``gpt2.tiktoken`` ranks file (no network)."""

    _PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, ranks_path: str | Path):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        p = Path(ranks_path)
        if not p.is_file():
            raise FileNotFoundError(
                f"no BPE ranks file at {p}; pass the path of gpt2.tiktoken (../shared/data)"
            )
        self.ranks_path = str(p)
        ranks = load_tiktoken_bpe(str(p))
        self._enc = tiktoken.Encoding(
            name="gpt2_local",
            pat_str=self._PAT,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": len(ranks)},
        )
        self.vocab_size = self._enc.n_vocab
        self.eot_token = len(ranks)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._enc.decode(list(ids))

    def to_json(self) -> str:
        return json.dumps({"type": "gpt2-bpe", "ranks": "gpt2.tiktoken"})

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"
