"""Ensembles of document windows: N windows of exactly T tokens (the POD snapshots)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from tl_spectral.checks import check_int


@dataclass
class DocumentWindows:
    """An ensemble of ``n_docs`` windows of exactly ``length`` tokens.

    tokens: ``[n_docs, length]`` int64; starts: ``[n_docs]`` offsets in the token stream (of
    the first stream token: after the start token when ``bos_id`` is set).
    bos_id: the start token in front of every window (None: windows are pure stream).
    encode_report: what a :class:`~tl_spectral.data.CharTokenizer` normalised, dropped or
    replaced in the text (an ``EncodeReport``; None for other tokenizers).
    """

    tokens: torch.Tensor
    starts: torch.Tensor
    seed: int
    encode_report: Optional[Any] = None
    bos_id: Optional[int] = None

    @property
    def n_docs(self) -> int:
        """N, the number of windows."""
        return int(self.tokens.shape[0])

    @property
    def length(self) -> int:
        """T, the tokens of each window."""
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return self.n_docs


def encode(tokenizer, text: str, unknown: Optional[str] = None) -> list[int]:
    """Token ids of ``text``: our tokenizers' ``encode``, or a Hugging Face tokenizer's
    without special tokens (windows are cut from one running stream). ``unknown``: the
    policy for characters outside a CharTokenizer's alphabet ("error" | "drop" |
    "replace"; None = the tokenizer's default)."""
    from tl_spectral.data.tokenizers import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.encode(text) if unknown is None else tokenizer.encode(text, unknown=unknown)
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


def document_windows(
    text: str, tokenizer, n_docs: int, length: int, seed: int = 0, *, overlap: bool = False,
    unknown: Optional[str] = None, bos_id: Optional[int] = None, stride: Optional[int] = None,
) -> DocumentWindows:
    """Draw ``n_docs`` windows of exactly ``length`` tokens from ``text``.

    Steps: 1. tokenize the whole text; 2. without ``overlap`` cut the stream into
    ``floor(len/length)`` disjoint windows and draw ``n_docs`` of them without replacement
    (seeded); with ``overlap`` draw start offsets uniformly; with ``stride`` (1 <= stride <=
    length) the candidate windows start at every multiple of ``stride`` (consecutive ones
    overlap by ``length - stride`` tokens when stride < length) and ``n_docs`` distinct ones
    are drawn without replacement (``stride=length`` is the disjoint cut). Raises when the
    text is too short for the request, naming how many windows it holds.

    ``unknown``: policy for characters outside a CharTokenizer's alphabet (see
    ``CharTokenizer.encode``); what was changed is in ``DocumentWindows.encode_report``.

    ``bos_id``: for a model trained with a start token (``CharTokenizer(bos=True)``, its
    ``bos_id``): every window is ``[bos_id]`` followed by ``length - 1`` stream tokens, the
    framing the trainer used (``length`` counts the start token; the stream is cut into
    pieces of ``length - 1``).
    """
    if not isinstance(text, str):
        raise TypeError(f"document_windows takes the text (a str) first, got "
                        f"{type(text).__name__}; e.g. document_windows(text, tokenizer, n_docs, "
                        "length)")
    if not callable(getattr(tokenizer, "encode", None)):
        model = hasattr(tokenizer, "cfg") and hasattr(tokenizer, "tokenizer")
        raise TypeError(
            f"document_windows takes a tokenizer (with encode()), got {type(tokenizer).__name__}"
            + ("; pass the model's tokenizer: document_windows(text, model.tokenizer, n_docs, "
               "length)" if model else "; pass e.g. CharTokenizer() or a Hugging Face tokenizer")
        )
    if n_docs < 1:
        raise ValueError(f"n_docs must be >= 1, got {n_docs}")
    if length < 2:
        raise ValueError(f"length must be >= 2 tokens, got {length}")
    if bos_id is not None and (not isinstance(bos_id, int) or bos_id < 0):
        raise ValueError(f"bos_id must be a token id (int >= 0) or None, got {bos_id!r}")
    if stride is not None:
        if overlap:
            raise ValueError("pass either overlap=True (random offsets) or stride (offsets at "
                             "multiples of stride), not both")
        check_int("stride", stride, minimum=1, maximum=length,
                  what=f"an int in [1, length={length}]")
    full_length = length
    if bos_id is not None:
        length -= 1
        if stride is not None:
            stride = min(stride, length)
    ids = torch.tensor(encode(tokenizer, text, unknown), dtype=torch.long)
    report = getattr(tokenizer, "last_report", None)
    g = torch.Generator().manual_seed(seed)
    if not overlap:
        # windows start at multiples of the stride; the disjoint cut is stride = length
        step = length if stride is None else stride
        n_avail = (ids.numel() - length) // step + 1 if ids.numel() >= length else 0
        if n_avail < n_docs:
            what = (f"disjoint windows of {length} tokens" if stride is None else
                    f"windows of {length} tokens at stride {stride}")
            fix = ("a longer text, shorter windows or overlap=True" if stride is None else
                   "a smaller stride, a longer text or fewer windows")
            raise ValueError(f"the text holds {n_avail} {what}, {n_docs} were asked for; "
                             f"use {fix}")
        pick = torch.randperm(n_avail, generator=g)[:n_docs].sort().values
        starts = pick * step
    else:
        if ids.numel() < length:
            raise ValueError(f"the text has {ids.numel()} tokens, fewer than length={length}")
        starts = torch.randint(0, ids.numel() - length + 1, (n_docs,), generator=g)
    tokens = torch.stack([ids[s : s + length] for s in starts.tolist()])
    if bos_id is not None:
        tokens = torch.cat([torch.full((tokens.shape[0], 1), bos_id, dtype=tokens.dtype),
                            tokens], 1)
    assert tokens.shape[1] == full_length
    return DocumentWindows(tokens=tokens, starts=starts, seed=seed, encode_report=report,
                           bos_id=bos_id)
