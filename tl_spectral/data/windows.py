"""Ensembles of document windows: N windows of exactly T tokens (the POD snapshots)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DocumentWindows:
    """An ensemble of ``n_docs`` windows of exactly ``length`` tokens.

    tokens: ``[n_docs, length]`` int64; starts: ``[n_docs]`` offsets in the token stream.
    """

    tokens: torch.Tensor
    starts: torch.Tensor
    seed: int

    @property
    def n_docs(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return self.n_docs


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text``: our tokenizers' ``encode``, or a Hugging Face tokenizer's
    without special tokens (windows are cut from one running stream)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


def document_windows(
    text: str, tokenizer, n_docs: int, length: int, seed: int = 0, *, overlap: bool = False
) -> DocumentWindows:
    """Draw ``n_docs`` windows of exactly ``length`` tokens from ``text``.

    Steps: 1. tokenize the whole text; 2. without ``overlap`` cut the stream into
    ``floor(len/length)`` disjoint windows and draw ``n_docs`` of them without replacement
    (seeded); with ``overlap`` draw start offsets uniformly. Raises when the text is too
    short for the request, naming how many windows it holds.
    """
    if n_docs < 1:
        raise ValueError(f"n_docs must be >= 1, got {n_docs}")
    if length < 2:
        raise ValueError(f"length must be >= 2 tokens, got {length}")
    ids = torch.tensor(encode(tokenizer, text), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    n_avail = ids.numel() // length
    if not overlap:
        if n_avail < n_docs:
            raise ValueError(
                f"the text holds {n_avail} disjoint windows of {length} tokens, "
                f"{n_docs} were asked for; use a longer text, shorter windows or overlap=True"
            )
        pick = torch.randperm(n_avail, generator=g)[:n_docs].sort().values
        starts = pick * length
    else:
        if ids.numel() < length:
            raise ValueError(f"the text has {ids.numel()} tokens, fewer than length={length}")
        starts = torch.randint(0, ids.numel() - length + 1, (n_docs,), generator=g)
    tokens = torch.stack([ids[s : s + length] for s in starts.tolist()])
    return DocumentWindows(tokens=tokens, starts=starts, seed=seed)
