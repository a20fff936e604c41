"""Tokenizers: a character tokenizer and a GPT-2 BPE tokenizer from a local ranks file.

Both convert to a Hugging Face fast tokenizer (``to_hf()``), so a TransformerLens model
carrying one supports ``to_tokens``, ``to_str_tokens`` and ``generate``.

Characters outside a :class:`CharTokenizer`'s alphabet follow an explicit policy: common
Unicode punctuation is first normalised to ASCII (curly quotes, dashes, ellipsis, non-breaking
and other spaces, accented letters to their base letter) when the ASCII form is in the
alphabet, then what is still unknown is an error (default), dropped, or replaced, and every
change is counted in an :class:`EncodeReport`.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

UNICODE_TO_ASCII: dict[str, str] = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "\u00b4": "'",
    "\u0060": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u00ab": '"', "\u00bb": '"', "\u2039": "'", "\u203a": "'",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
    "\u2212": "-", "\u00ad": "",
    "\u2026": "...", "\u2022": "*", "\u00b7": ".", "\u00d7": "x",
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u200a": " ", "\u202f": " ",
    "\u3000": " ", "\t": " ", "\r": "", "\u200b": "", "\ufeff": "",
    "\u00e6": "ae", "\u00c6": "AE", "\u0153": "oe", "\u0152": "OE", "\u00df": "ss",
}
"""Unicode characters and their ASCII stand-ins, tried (in this order) before NFKD
decomposition for characters outside a CharTokenizer's alphabet."""

UNKNOWN_POLICIES = ("error", "drop", "replace")


def _fmt_counts(c: Counter, limit: int = 8) -> str:
    items = c.most_common()
    parts = [f"{ch!r}×{n}" for ch, n in items[:limit]]
    if len(items) > limit:
        parts.append(f"… {len(items) - limit} more")
    return ", ".join(parts)


@dataclass
class EncodeReport:
    """What :meth:`CharTokenizer.encode` changed in a text.

    normalized: ``{original char: count}`` replaced by their ASCII form; dropped /
    replaced: ``{char: count}`` still outside the alphabet, dropped or replaced by
    ``replacement``.
    """

    normalized: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    replaced: Counter = field(default_factory=Counter)
    replacement: Optional[str] = None

    @property
    def n_normalized(self) -> int:
        return sum(self.normalized.values())

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())

    @property
    def n_replaced(self) -> int:
        return sum(self.replaced.values())

    @property
    def changed(self) -> bool:
        return bool(self.normalized or self.dropped or self.replaced)

    def note(self) -> str:
        """One line saying what was normalised, dropped and replaced ("" if nothing was)."""
        parts = []
        if self.normalized:
            parts.append(f"normalised {self.n_normalized} characters to ASCII "
                         f"({_fmt_counts(self.normalized)})")
        if self.dropped:
            parts.append(f"dropped {self.n_dropped} characters outside the alphabet "
                         f"({_fmt_counts(self.dropped)})")
        if self.replaced:
            parts.append(f"replaced {self.n_replaced} characters outside the alphabet by "
                         f"{self.replacement!r} ({_fmt_counts(self.replaced)})")
        return "; ".join(parts)


class CharTokenizer:
    """Character-level tokenizer over a fixed alphabet.

    ``CharTokenizer.from_text(text)`` builds the sorted alphabet of ``text``. By default
    characters outside the alphabet are first normalised to ASCII when that form is in the
    alphabet (``’`` → ``'``, ``—`` → ``-``, ``é`` → ``e``), and those still unknown raise
    ``ValueError`` naming them; ``encode(text, unknown="drop" | "replace")`` drops or
    replaces them instead, and :attr:`last_report` (an :class:`EncodeReport`) counts every
    change. Nothing is silently dropped.

    ``bos=True`` adds a start-of-sequence token with id :attr:`bos_id` = ``len(alphabet)``
    (so ``vocab_size = len(alphabet) + 1``); :meth:`encode` never emits it (text is one
    running stream), the trainer and the window builders put it in front of each window
    (``"data": {"bos": true}`` of a run config), :meth:`decode` renders it as
    :attr:`BOS_TEXT`, and :meth:`to_json` records it so a checkpoint's tokenizer keeps it.
    """

    BOS_TEXT = "<|bos|>"

    def __init__(self, alphabet: Sequence[str], *, bos: bool = False):
        chars = list(alphabet)
        if len(set(chars)) != len(chars):
            raise ValueError("alphabet has repeated characters")
        if any(len(c) != 1 for c in chars):
            raise ValueError("every alphabet entry must be one character")
        self.alphabet: list[str] = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.bos = bool(bos)
        #: id of the start token (``len(alphabet)``), None without ``bos``
        self.bos_id: Optional[int] = len(chars) if self.bos else None
        self.vocab_size = len(chars) + (1 if self.bos else 0)
        self.last_report: Optional[EncodeReport] = None

    @classmethod
    def from_text(cls, text: str, *, bos: bool = False) -> "CharTokenizer":
        """The tokenizer of every character of ``text`` (sorted); ``bos`` adds a BOS id after
        them."""
        if not text:
            raise ValueError("cannot build a character tokenizer from an empty text")
        return cls(sorted(set(text)), bos=bos)

    def _ascii_form(self, c: str) -> Optional[str]:
        """The ASCII stand-in of ``c`` if every character of it is in the alphabet."""
        cands = []
        if c in UNICODE_TO_ASCII:
            cands.append(UNICODE_TO_ASCII[c])
        base = "".join(ch for ch in unicodedata.normalize("NFKD", c)
                       if not unicodedata.combining(ch))
        if base != c:
            cands.append(base)
        for cand in cands:
            if all(ch in self.stoi for ch in cand):
                return cand
        return None

    def encode(self, text: str, unknown: str = "error", normalize: bool = True,
               replacement: Optional[str] = None) -> list[int]:
        """Token ids of ``text``.

        normalize: replace characters outside the alphabet by their ASCII form when it is in
            the alphabet (see :data:`UNICODE_TO_ASCII`; accents stripped by NFKD). Characters
            in the alphabet are never changed.
        unknown: what to do with characters still outside the alphabet: ``"error"`` (raise
            ``ValueError`` naming them), ``"drop"``, or ``"replace"`` by ``replacement``
            (default ``"?"`` if in the alphabet, else ``" "``).
        The counts of what changed are in :attr:`last_report` (see also
        :meth:`encode_with_report`).
        """
        return self.encode_with_report(text, unknown=unknown, normalize=normalize,
                                       replacement=replacement)[0]

    def encode_with_report(self, text: str, unknown: str = "error", normalize: bool = True,
                           replacement: Optional[str] = None) -> tuple[list[int], EncodeReport]:
        """``(ids, EncodeReport)``; arguments as :meth:`encode`."""
        if unknown not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES}, got {unknown!r}")
        stoi = self.stoi
        report = EncodeReport()
        try:  # fast path: every character known
            ids = [stoi[c] for c in text]
            self.last_report = report
            return ids, report
        except KeyError:
            pass
        missing = {c for c in set(text) if c not in stoi}
        mapping: dict[str, Optional[str]] = {}
        for c in missing:
            mapping[c] = self._ascii_form(c) if normalize else None
        still = sorted(c for c, m in mapping.items() if m is None)
        if still and unknown == "error":
            counts = Counter(c for c in text if c in set(still))
            raise ValueError(
                f"characters {still!r} are not in this tokenizer's alphabet of "
                f"{self.vocab_size} ({_fmt_counts(counts)}); pass text drawn from the "
                "training alphabet, or encode(text, unknown='drop' | 'replace')"
            )
        rep_ids: list[int] = []
        if unknown == "replace":
            rep = replacement
            if rep is None:
                rep = "?" if "?" in stoi else " "
            if rep not in stoi:
                raise ValueError(f"replacement {rep!r} is not in the alphabet")
            rep_ids = [stoi[rep]]
            report.replacement = rep
        out: list[int] = []
        for c in text:
            i = stoi.get(c)
            if i is not None:
                out.append(i)
                continue
            m = mapping[c]
            if m is not None:
                out.extend(stoi[ch] for ch in m)
                report.normalized[c] += 1
            elif unknown == "drop":
                report.dropped[c] += 1
            else:
                out.extend(rep_ids)
                report.replaced[c] += 1
        self.last_report = report
        return out, report

    def to_hf(self):
        """A Hugging Face ``PreTrainedTokenizerFast`` with the same ids (one per character).

        Unicode punctuation is normalised as in :meth:`encode` where the ASCII form is in
        the alphabet; other unknown characters raise. ``<|endoftext|>`` is added as BOS/EOS
        with id ``len(alphabet)``: without ``bos`` that lies outside the model's vocabulary
        (so ``generate`` runs to ``max_new_tokens``); with ``bos`` it is :attr:`bos_id`, the
        model's start token. The pad id is the alphabet's first character.
        """
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {c: i for i, c in enumerate(self.alphabet)}
        eot = "<|endoftext|>"
        vocab[eot] = len(vocab)
        tk = Tokenizer(models.WordLevel(vocab=vocab))
        reps = []
        for c in sorted(set(UNICODE_TO_ASCII)):
            if c in self.stoi or c == "":
                continue
            m = self._ascii_form(c)
            if m is not None:
                reps.append(normalizers.Replace(c, m))
        if reps:
            tk.normalizer = normalizers.Sequence(reps)
        tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tk.decoder = decoders.Fuse()
        hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=eot, eos_token=eot)
        hf.pad_token_id = 0  # a real character: padded batches still embed
        return hf

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of token ``ids`` (a list or a tensor); the BOS id decodes as ``BOS_TEXT``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        n = len(self.alphabet)
        return "".join(self.alphabet[i] if i != n or not self.bos else self.BOS_TEXT
                       for i in ids)

    def to_json(self) -> str:
        """The tokenizer as JSON (its alphabet and BOS flag), read back by :meth:`from_json`."""
        d: dict = {"type": "char", "alphabet": "".join(self.alphabet)}
        if self.bos:
            d["bos"] = True
        return json.dumps(d)

    @classmethod
    def from_json(cls, s: str) -> "CharTokenizer":
        """The tokenizer :meth:`to_json` described; ValueError for another tokenizer type."""
        d = json.loads(s)
        if d.get("type") != "char":
            raise ValueError(f"not a character tokenizer description: type={d.get('type')!r}")
        return cls(list(d["alphabet"]), bos=bool(d.get("bos", False)))

    def __repr__(self) -> str:
        extra = f", bos_id={self.bos_id}" if self.bos else ""
        return f"CharTokenizer(vocab_size={self.vocab_size}{extra})"


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

    def to_hf(self):
        """A Hugging Face ``PreTrainedTokenizerFast`` with the same ids (GPT-2 byte-level BPE
        from the local ranks file; ``<|endoftext|>`` = BOS = EOS = pad)."""
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import TikTokenConverter

        tk = TikTokenConverter(vocab_file=self.ranks_path, pattern=self._PAT).converted()
        eot = "<|endoftext|>"
        if tk.token_to_id(eot) is None:
            tk.add_special_tokens([eot])
        if tk.token_to_id(eot) != self.eot_token:
            raise RuntimeError(f"converted BPE puts {eot} at {tk.token_to_id(eot)}, "
                               f"expected {self.eot_token}")
        return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=eot, eos_token=eot,
                                       pad_token=eot)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._enc.decode(list(ids))

    def to_json(self) -> str:
        return json.dumps({"type": "gpt2-bpe", "ranks": "gpt2.tiktoken"})

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"
