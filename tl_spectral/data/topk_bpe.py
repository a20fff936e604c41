"""GPT-2 BPE truncated to the K most frequent tokens of a training stream (the subword
models of the routing study)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["TopKBPE"]


class TopKBPE:
    """GPT-2 BPE with the vocabulary truncated to the ``top_k - 1`` most frequent tokens of a
    training stream; every other GPT-2 id maps to one ``<unk>`` id (``top_k - 1``).

    keep: [top_k - 1] GPT-2 ids, most frequent first (new id = position in ``keep``).
    """

    def __init__(self, ranks_path: str | Path, keep: Sequence[int]):
        from tl_spectral.data import BPETokenizer

        self.bpe = BPETokenizer(ranks_path)
        self.keep = [int(i) for i in keep]
        if len(set(self.keep)) != len(self.keep):
            raise ValueError("TopKBPE: keep holds duplicate ids")
        self.vocab_size = len(self.keep) + 1
        self.unk_id = len(self.keep)
        lut = torch.full((self.bpe.vocab_size,), self.unk_id, dtype=torch.long)
        lut[torch.tensor(self.keep, dtype=torch.long)] = torch.arange(len(self.keep))
        self._lut = lut

    @classmethod
    def fit(cls, ranks_path: str | Path, train_ids: torch.Tensor, top_k: int) -> TopKBPE:
        """train_ids: [n] GPT-2 ids; keeps the ``top_k - 1`` most frequent (ties: lower id)."""
        if top_k < 2:
            raise ValueError(f"top_k must be >= 2 (one slot is <unk>), got {top_k}")
        counts = torch.bincount(train_ids.long(), minlength=1)
        order = sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))
        keep = [i for i in order if counts[i] > 0][: top_k - 1]
        return cls(ranks_path, keep)

    def map_ids(self, gpt2_ids: torch.Tensor) -> torch.Tensor:
        """gpt2_ids: [n] -> [n] ids in [0, vocab_size)."""
        return self._lut[gpt2_ids.long()]

    def encode(self, text: str) -> list[int]:
        return self.map_ids(torch.tensor(self.bpe.encode(text), dtype=torch.long)).tolist()

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join("<unk>" if i == self.unk_id else self.bpe.decode([self.keep[i]])
                       for i in ids)

    def to_json(self) -> str:
        return json.dumps({"type": "gpt2-bpe-topk", "ranks": "gpt2.tiktoken",
                           "top_k": self.vocab_size, "keep": self.keep})

    def __repr__(self) -> str:
        return f"TopKBPE(vocab_size={self.vocab_size})"
