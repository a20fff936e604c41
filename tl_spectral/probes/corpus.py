"""Inputs of a probe pass: token tensors, ``DocumentWindows`` and lazy token files as one
:class:`Corpus`, padding masks (given or inferred) and the documents' shard of a process.

Split out of :mod:`tl_spectral.probes.runner`, which re-exports every name."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral.checks import check_int, is_int
from tl_spectral.model_view import ModelView


@dataclass
class Corpus:
    """Token batches with their padding mask. tokens, mask: [n_docs, pos]."""

    tokens: Tensor
    mask: Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def batch(self, lo: int, hi: int) -> tuple[Tensor, Tensor]:
        return self.tokens[lo:hi], self.mask[lo:hi]


class LazyCorpus:
    """Full windows read batch by batch from a source with ``batch(lo, hi) -> [b, length]``
    ids, ``len()`` and ``length`` (e.g. :class:`~tl_spectral.data.tokenfile.TokenWindows`);
    no window is read before its batch runs."""

    def __init__(self, source: Any):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    @property
    def length(self) -> int:
        return int(self.source.length)

    def batch(self, lo: int, hi: int) -> tuple[Tensor, Tensor]:
        tokens = torch.as_tensor(self.source.batch(lo, hi)).long()
        return tokens, torch.ones(tokens.shape, dtype=torch.bool)


def as_corpus(data: Any, attention_mask: Optional[Tensor] = None, pad_token: int = 0) -> Corpus:
    """Normalise ``data`` into a :class:`Corpus`.

    Accepts a ``DocumentWindows`` ensemble, a ``[n_docs, pos]`` int tensor (with an
    optional ``[n_docs, pos]`` attention mask, 1 = real token), or a sequence of 1-D token
    sequences of varying length (right-padded with ``pad_token``; the mask marks padding).
    """
    from tl_spectral.data.windows import DocumentWindows

    if isinstance(data, (Corpus, LazyCorpus)):
        return data
    data = numpy_ids_as_tensor(data)
    if callable(getattr(data, "batch", None)) and hasattr(data, "length"):  # lazy windows
        if attention_mask is not None:
            raise ValueError("lazy windows (a token file's windows) are full windows; drop "
                             "attention_mask")
        if len(data) == 0:
            raise ValueError("the corpus is empty; pass at least one window")
        return LazyCorpus(data)
    if isinstance(data, DocumentWindows):
        data = data.tokens
    if isinstance(data, str):
        raise TypeError(
            "run_probes got a string; tokenize it first, e.g. "
            "document_windows(text, tokenizer, n_docs, length)"
        )
    if isinstance(data, Tensor):
        if data.dim() == 1:
            data = data.unsqueeze(0)
        if data.dim() != 2:
            raise ValueError(f"tokens must be [n_docs, pos], got shape {tuple(data.shape)}")
        if data.dtype.is_floating_point or data.dtype == torch.bool or data.is_complex():
            raise TypeError(f"tokens must be integer ids, got a {data.dtype} tensor; pass the "
                            "token ids (e.g. model.to_tokens(texts)), and a padding mask as "
                            "attention_mask")
        if data.shape[0] == 0 or data.shape[1] == 0:
            raise ValueError(
                f"the corpus is empty (shape {tuple(data.shape)}); pass at least one document "
                "of at least one token"
            )
        if attention_mask is None:
            mask = torch.ones(data.shape, dtype=torch.bool)
        else:
            if attention_mask.shape != data.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} differs from tokens "
                    f"shape {tuple(data.shape)}"
                )
            mask = mask_bool(attention_mask)
            check_right_padded(mask)
        return Corpus(tokens=data.long(), mask=mask)
    if isinstance(data, Sequence):
        if any(isinstance(d, str) or (isinstance(d, Sequence) and len(d) and isinstance(d[0], str))
               for d in data):
            raise TypeError(
                "run_probes got strings; pass token ids: tokenize first, e.g. tokens = "
                "model.to_tokens(texts) (with attention_mask for padding) or a list of "
                "token-id lists"
            )
        docs = [document_ids(d, i) for i, d in enumerate(data)]
        if not docs:
            raise ValueError("the corpus is empty; pass at least one document")
        lengths = [int(d.numel()) for d in docs]
        if min(lengths) == 0:
            raise ValueError(f"document {lengths.index(0)} has no tokens")
        T = max(lengths)
        tokens = torch.full((len(docs), T), pad_token, dtype=torch.long)
        mask = torch.zeros((len(docs), T), dtype=torch.bool)
        for i, d in enumerate(docs):
            tokens[i, : d.numel()] = d
            mask[i, : d.numel()] = True
        return Corpus(tokens=tokens, mask=mask)
    raise TypeError(
        f"cannot read a corpus from {type(data).__name__}; pass DocumentWindows, a "
        "[n_docs, pos] token tensor, or a list of token lists"
    )


def check_count(name: str, value: Any) -> int:
    """``value`` as an int >= 1 (numpy integers too), else a one-line error naming ``name``."""
    if not is_int(value, numpy=True):
        raise TypeError(f"{name} must be an int >= 1, got {value!r} ({type(value).__name__}); "
                        f"pass e.g. {name}=8")
    return check_int(name, value, minimum=1, numpy=True, hint=f"e.g. {name}=8")


class PaddingInferredWarning(UserWarning):
    """Token rows padded with the tokenizer's pad id, passed without ``attention_mask``: the
    runner inferred the mask."""


def infer_padding(
    view: ModelView, tokens: Tensor, *, what: str = "run_probes", shift: bool = True
) -> tuple[Tensor, Optional[Tensor]]:
    """The padding of a ``[n_docs, pos]`` token tensor passed without ``attention_mask``,
    read from runs of the model tokenizer's pad id. Returns ``(tokens, mask)``; ``mask`` is
    None when nothing looks padded (the tokens are then all real).

    The pad id may be a real token too (GPT-2 pads with ``<|endoftext|>``, its BOS and EOS),
    so only runs at the ends of rows count, and only beyond the shortest such run of the
    batch (a right-padded batch has an unpadded row, its longest document):

    * right padding: each row's trailing run of pad ids after its last other token, less
      the shortest trailing run over the rows, is padding;
    * left padding: likewise for leading runs (a BOS equal to the pad id stays: it is in
      every row's leading run); such rows are shifted left into right padding (``shift``;
      else a ``ValueError``: an activation cache cannot be shifted);
    * a row made of pad ids only keeps its first token (a lone BOS).

    Nothing is inferred without a tokenizer pad id, when the pad id is an ordinary text token
    rather than a special one (the project's char models pad with ``"\n"``, a real character),
    for a single row, or when every row's runs are equal. When something is, one :class:`PaddingInferredWarning` says so; pass
    ``attention_mask`` (``torch.ones_like(tokens)`` keeps every token) to say it yourself.
    """
    tok = getattr(view.model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if not isinstance(pad, int) or tokens.dim() != 2 or tokens.shape[0] < 2:
        return tokens, None
    added = getattr(tok, "added_tokens_decoder", None) or {}
    if not getattr(added.get(pad), "special", False):
        return tokens, None  # the pad id is an ordinary text token (e.g. a char model's "\n")
    is_pad = tokens == pad
    if not bool(is_pad.any()):
        return tokens, None
    B, T = tokens.shape
    lead = is_pad.long().cumprod(1).sum(1)
    trail = is_pad.flip(1).long().cumprod(1).sum(1)
    some = lead < T  # rows with a token other than the pad id
    if not bool(some.any()):
        return tokens, None
    lead_x = torch.where(some, lead - lead[some].min(), 0)
    trail_x = torch.where(some, trail - trail[some].min(), 0)
    if not bool(lead_x.any() or trail_x.any()):
        return tokens, None
    length = torch.where(some, T - lead_x - trail_x, 1)
    n_left = int((lead_x > 0).sum())
    if n_left and not shift:
        raise ValueError(
            f"{what}: {n_left} of {B} rows start with more of the pad id {pad} than the others "
            "(left padding), which a cache cannot undo; run the model on right-padded tokens "
            "and pass attention_mask (1 = real token)"
        )
    out = tokens
    if n_left:
        out = torch.full_like(tokens, pad)
        for i in range(B):
            a, n = int(lead_x[i]), int(length[i])
            out[i, :n] = tokens[i, a : a + n]
    mask = torch.arange(T, device=tokens.device)[None, :] < length[:, None]
    n_pad = int((length < T).sum())
    warnings.warn(
        f"{what}: {n_pad} of {B} token rows end{' or start' if n_left else ''} with runs of "
        f"the tokenizer's pad id {pad} and no attention_mask was given: those runs are taken "
        f"as padding{f' ({n_left} left-padded rows shifted to right padding)' if n_left else ''}. "
        "Pass attention_mask (1 = real token; torch.ones_like(tokens) keeps every token) "
        "to say which tokens are real",
        PaddingInferredWarning, stacklevel=3,
    )
    return out, mask


def with_padding(view: ModelView, data: Any, attention_mask: Any, what: str) -> tuple[Any, Any]:
    """``(data, attention_mask)`` with numpy ids as a tensor and, for a token tensor passed
    without a mask, the mask :func:`infer_padding` reads from the tokenizer's pad id."""
    data = numpy_ids_as_tensor(data)
    if attention_mask is None and isinstance(data, Tensor) and data.dim() == 2 \
            and not data.dtype.is_floating_point and data.dtype != torch.bool:
        data, attention_mask = infer_padding(view, data, what=what)
    return data, attention_mask


def numpy_ids_as_tensor(data: Any) -> Any:
    """numpy integer arrays become tensors; everything else is returned as is."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return data
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "iu":
            raise TypeError(f"tokens must be integer ids, got a numpy array of {data.dtype}; "
                            "pass token ids (e.g. tokenizer(texts)['input_ids'])")
        return torch.from_numpy(data.astype(np.int64))
    return data


def mask_bool(attention_mask: Any) -> Tensor:
    """An attention mask as bool: its values must be 0 and 1 (bool, integer or float)."""
    if not isinstance(attention_mask, Tensor):
        import numpy as np

        attention_mask = torch.as_tensor(np.asarray(attention_mask))
    m = attention_mask
    if m.dtype != torch.bool:
        ok = (m == 0) | (m == 1)
        if not bool(ok.all()):
            bad = m[~ok].flatten()[0].item()
            raise ValueError(
                f"attention_mask must hold 0 (padding) and 1 (real token) only, got {bad!r}; "
                "pass e.g. tokenizer(texts, padding=True)['attention_mask']"
            )
    return m.bool()


def document_ids(d: Any, i: int) -> Tensor:
    """One document of a list corpus as a 1-D int64 tensor of ids."""
    t = numpy_ids_as_tensor(d)
    t = t if isinstance(t, Tensor) else torch.as_tensor(t)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"document {i}: token ids must be integers, got {t.dtype}; pass the "
                        "token ids of each document")
    return t.long().flatten()


def check_right_padded(mask: Tensor) -> None:
    """One-line ValueError unless every row of the bool ``mask`` is real tokens first, then
    padding, with at least one real token (a real token after a padding position means left
    padding or holes)."""
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ValueError(
            "attention_mask must be right-padded (real tokens first, then padding); "
            "left padding shifts positions and would mix lags"
        )
    if (~mask[:, 0]).any():
        raise ValueError("a document in the corpus has no real token (mask row all zeros)")


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """``[lo, hi)``: the contiguous documents of ``n`` that process ``rank`` of ``world``
    reads (equal shards, the last ones shorter or empty)."""
    per = (n + world - 1) // world
    return min(n, rank * per), min(n, (rank + 1) * per)
