"""Token files: token ids of a corpus in a memory-mapped array, read window by window.

Layout (little-endian, no pickle)::

    b"TLSPTOK1"                      8 bytes, magic
    header length h                  8 bytes, uint64
    header                           h bytes, UTF-8 JSON
    padding to a multiple of 8
    ids                              n_tokens x uint16 | uint32 (header "dtype")
    padding to a multiple of 8
    offsets                          (n_docs + 1) x int64: document d is ids[offsets[d]:offsets[d+1]]

The header holds ``format``, ``version``, ``dtype``, ``n_tokens``, ``n_docs``,
``ids_offset`` and ``offsets_offset`` (byte positions), ``model`` (the tokenizer's model) and
``vocab_size``. :meth:`TokenFile.windows` draws the same windows as
:func:`tl_spectral.data.windows.document_windows` for the same seed (one document: the same
token stream; several: windows never straddle two documents) and returns them lazily:
:class:`TokenWindows` reads ``[batch, length]`` ids from the memory map on demand.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from tl_spectral.checks import check_int

__all__ = ["TokenFile", "TokenWindows", "write_token_file"]

MAGIC = b"TLSPTOK1"
FORMAT = "tl_spectral.tokens"
VERSION = 1


def _align(n: int) -> int:
    return (n + 7) // 8 * 8


def write_token_file(
    path: str | os.PathLike,
    documents: Iterable[Sequence[int] | np.ndarray | Tensor],
    *,
    model: str = "",
    vocab_size: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``documents`` (each a sequence of token ids) to a token file at ``path``.

    The ids stream to a temporary file next to ``path`` (one document in memory at a time)
    and the finished file replaces ``path`` — which must not exist unless ``overwrite``.
    dtype: uint16 when every id (and ``vocab_size``) fits, else uint32. Returns the path.
    """
    # Long on purpose: a linear recipe (checks, stale leftovers, streamed write in
    # two header rounds, atomic rename); each step is a few lines that need the ones before.
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a file; pass a file path for the token file")
    if vocab_size is not None:
        check_int("vocab_size", vocab_size, minimum=1, maximum=MAX_ID + 1, numpy=True,
                  what="an int in [1, 2**32]", hint="the tokenizer's vocabulary size")
    path.parent.mkdir(parents=True, exist_ok=True)
    # a killed writer's temporary files (pid in the name, process gone) go first
    from tl_spectral._leftovers import remove_dead_leftovers

    remove_dead_leftovers(path.parent, _leftover_patterns(path))
    offsets = [0]
    max_id = -1
    tmp_name = None
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.ids-{os.getpid()}-",
                                     delete=False) as raw:
        raw_name = raw.name
        try:
            for doc in documents:
                a = _doc_ids(doc, len(offsets) - 1)
                if a.size and int(a.min()) < 0:
                    raise ValueError(f"document {len(offsets) - 1} holds a negative token id {int(a.min())}")
                if a.size:
                    top = int(a.max())
                    if top > MAX_ID or (vocab_size is not None and top >= int(vocab_size)):
                        lim = MAX_ID + 1 if vocab_size is None else int(vocab_size)
                        raise ValueError(f"document {len(offsets) - 1} holds token id {top}, "
                                         f"not below {'vocab_size=' if vocab_size else ''}{lim}"
                                         "; pass ids of the model's vocabulary")
                    max_id = max(max_id, top)
                raw.write(a.astype("<u4").tobytes())
                offsets.append(offsets[-1] + int(a.size))
        except BaseException:
            raw.close()
            os.unlink(raw_name)
            raise
    try:
        n = offsets[-1]
        if n == 0:
            raise ValueError("the documents hold no tokens; nothing to write")
        top = max(max_id, (vocab_size or 0) - 1)
        dtype = "uint16" if top < 1 << 16 else "uint32"
        header = {"format": FORMAT, "version": VERSION, "dtype": dtype, "n_tokens": n,
                  "n_docs": len(offsets) - 1, "model": str(model),
                  "vocab_size": int(vocab_size) if vocab_size is not None else int(max_id + 1)}
        # two rounds: the byte positions are part of the header
        ids_off = off_off = 0
        for _ in range(3):
            header["ids_offset"], header["offsets_offset"] = ids_off, off_off
            hb = json.dumps(header, sort_keys=True).encode("utf-8")
            ids_off = _align(16 + len(hb))
            off_off = _align(ids_off + n * np.dtype(dtype).itemsize)
        header["ids_offset"], header["offsets_offset"] = ids_off, off_off
        hb = json.dumps(header, sort_keys=True).encode("utf-8")
        assert _align(16 + len(hb)) == ids_off
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-",
                                         delete=False) as out:
            tmp_name = out.name
            out.write(MAGIC + np.uint64(len(hb)).astype("<u8").tobytes() + hb)
            out.write(b"\0" * (ids_off - 16 - len(hb)))
            src = np.memmap(raw_name, dtype="<u4", mode="r", shape=(n,))
            step = 1 << 22
            for a in range(0, n, step):
                out.write(np.asarray(src[a:a + step]).astype("<" + np.dtype(dtype).str[1:]).tobytes())
            del src
            out.write(b"\0" * (off_off - ids_off - n * np.dtype(dtype).itemsize))
            out.write(np.asarray(offsets, dtype="<i8").tobytes())
        from tl_spectral.files import current_umask as _umask

        os.chmod(tmp_name, 0o666 & ~_umask())  # mkstemp makes 0600; a token file is the user's
        os.replace(tmp_name, path)
    finally:  # both temporary files, whatever failed (disk full included)
        for name in (raw_name, tmp_name):
            if name is not None and os.path.exists(name):
                os.unlink(name)
    return path


#: The largest id a token file holds (uint32).
MAX_ID = 2**32 - 1


def _leftover_patterns(path: Path) -> list[str]:
    """The names of :func:`write_token_file`'s temporary files for ``path``."""
    import re

    n = re.escape(path.name)
    return [rf"\.{n}\.(?:ids|tmp)-(?P<pid>\d+)-[A-Za-z0-9_]+"]


def _doc_ids(doc, d: int) -> np.ndarray:
    """One document's ids as int64 (ids past int64 and non-integers refused, not wrapped)."""
    if isinstance(doc, Tensor):
        doc = doc.detach().cpu()
        if doc.is_floating_point() or doc.is_complex() or doc.dtype == torch.bool:
            raise ValueError(f"document {d} holds {doc.dtype} values; pass integer token ids")
        return doc.numpy().astype(np.int64).ravel()
    a = np.asarray(doc)
    if a.dtype == object:
        try:
            a = np.asarray([int(x) for x in a.ravel()], dtype=object)
        except (TypeError, ValueError):
            raise ValueError(f"document {d} holds values that are not token ids") from None
        if a.size and (max(a) > MAX_ID or min(a) < 0):
            bad = max(a) if max(a) > MAX_ID else min(a)
            raise ValueError(f"document {d} holds token id {bad}, outside [0, 2**32)")
        return a.astype(np.int64)
    if a.size and a.dtype.kind not in "iu":
        raise ValueError(f"document {d} holds {a.dtype} values; pass integer token ids")
    if a.dtype == np.uint64 and a.size and int(a.max()) > MAX_ID:
        raise ValueError(f"document {d} holds token id {int(a.max())}, outside [0, 2**32)")
    return a.astype(np.int64).ravel()


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _r(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_header(header: Any, path: Path, header_end: int, size: int) -> None:
    """Every field :class:`TokenFile` reads, its type and range (``ValueError`` naming the
    first that is wrong: the file is damaged or crafted)."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a tl_spectral token file header")
    v = header.get("version")
    if type(v) is not int or v != VERSION:
        raise ValueError(f"{path}: token file version {_r(v)} is not "
                         f"supported (this tl_spectral reads version {VERSION})")
    if header.get("dtype") not in ("uint16", "uint32"):
        raise ValueError(f"{path}: unknown id dtype {_r(header.get('dtype'))}")
    for key, lo in (("n_tokens", 1), ("n_docs", 1), ("ids_offset", header_end),
                    ("offsets_offset", header_end)):
        x = header.get(key)
        if type(x) is not int or not lo <= x <= size:
            raise ValueError(f"{path}: corrupt token file header ({key} = "
                             f"{_r(x)}, need an int in [{lo}, {size}])")
    if not isinstance(header.get("model", ""), str):
        raise ValueError(f"{path}: corrupt token file header (model is not a string)")
    vs = header.get("vocab_size", 0)
    if type(vs) is not int or not 0 <= vs <= MAX_ID + 1:
        raise ValueError(f"{path}: corrupt token file header (vocab_size = "
                         f"{_r(vs)})")


class TokenFile:
    """A token file opened read-only; the ids stay on disk (``numpy.memmap``).

    n_tokens, n_docs, model, vocab_size: from the header. ``document(d)`` -> ids of document
    ``d`` (a memory-mapped view); ``windows(...)`` -> :class:`TokenWindows`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no token file at {self.path}; write one with "
                                    "`tl-spectral tokenize TEXT --model M -o FILE`")
        size = self.path.stat().st_size
        with open(self.path, "rb") as fh:
            head = fh.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise ValueError(f"{self.path} is not a tl_spectral token file (no {MAGIC!r} "
                                 "magic); write one with `tl-spectral tokenize`")
            h = int(np.frombuffer(head[8:16], dtype="<u8")[0])
            if h > min(size, 1 << 24):
                raise ValueError(f"{self.path}: corrupt token file (header length {h})")
            try:
                header = json.loads(fh.read(h).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
                raise ValueError(f"{self.path}: corrupt token file header "
                                 f"({_short(e)})") from None
        _check_header(header, self.path, 16 + h, size)
        self.header = header
        self.n_tokens = int(header["n_tokens"])
        self.n_docs = int(header["n_docs"])
        dt = np.dtype("<" + np.dtype(header["dtype"]).str[1:])
        end_ids = int(header["ids_offset"]) + self.n_tokens * dt.itemsize
        end_off = int(header["offsets_offset"]) + (self.n_docs + 1) * 8
        if end_ids > size or end_off > size or int(header["offsets_offset"]) < end_ids:
            raise ValueError(f"{self.path}: truncated token file ({size} bytes, the header "
                             f"describes {end_off})")
        self.ids = np.memmap(self.path, dtype=dt, mode="r", offset=int(header["ids_offset"]),
                             shape=(self.n_tokens,))
        self.offsets = np.array(np.memmap(self.path, dtype="<i8", mode="r",
                                          offset=int(header["offsets_offset"]),
                                          shape=(self.n_docs + 1,)))
        if self.offsets[0] != 0 or self.offsets[-1] != self.n_tokens or np.any(np.diff(self.offsets) < 0):
            raise ValueError(f"{self.path}: corrupt document offsets")

    @property
    def model(self) -> str:
        """The model (tokenizer) name the file records, ``""`` if none."""
        return str(self.header.get("model", ""))

    @property
    def vocab_size(self) -> int:
        """The vocabulary size the file records, 0 if none."""
        return int(self.header.get("vocab_size", 0))

    def __len__(self) -> int:
        return self.n_tokens

    def document(self, d: int) -> np.ndarray:
        """The token ids of document ``d`` (a view of the memory map); IndexError out of range."""
        if not 0 <= d < self.n_docs:
            raise IndexError(f"document {d} out of range [0, {self.n_docs})")
        return self.ids[self.offsets[d]: self.offsets[d + 1]]

    def windows(self, n_docs: int, length: int, seed: int = 0, *, overlap: bool = False) -> TokenWindows:
        """``n_docs`` windows of ``length`` tokens, drawn as
        :func:`~tl_spectral.data.windows.document_windows` draws them (same seed, same
        windows for a one-document file). Without ``overlap``: each document is cut into
        ``floor(len / length)`` disjoint windows and ``n_docs`` of all of them are drawn
        without replacement; with ``overlap``: start offsets uniformly among those whose
        window fits in its document. Only the start offsets are held in memory."""
        if n_docs < 1:
            raise ValueError(f"n_docs must be >= 1, got {n_docs}")
        if length < 2:
            raise ValueError(f"length must be >= 2 tokens, got {length}")
        lens = np.diff(self.offsets)
        g = torch.Generator().manual_seed(seed)
        if not overlap:
            per = torch.as_tensor(lens // length, dtype=torch.int64)
            n_avail = int(per.sum())
            if n_avail < n_docs:
                raise ValueError(
                    f"the token file holds {n_avail} disjoint windows of {length} tokens, "
                    f"{n_docs} were asked for; use a longer corpus, shorter windows or overlap=True"
                )
            pick = torch.randperm(n_avail, generator=g)[:n_docs].sort().values
            cum = torch.cumsum(per, 0)
            doc = torch.searchsorted(cum, pick, right=True)
            first = cum - per  # index of each document's first window
            starts = torch.as_tensor(self.offsets[:-1], dtype=torch.int64)[doc] + (pick - first[doc]) * length
        else:
            fits = torch.as_tensor(np.maximum(lens - length + 1, 0), dtype=torch.int64)
            total = int(fits.sum())
            if total < 1:
                raise ValueError(f"the token file has no document of at least length={length} tokens")
            r = torch.randint(0, total, (n_docs,), generator=g)
            cum = torch.cumsum(fits, 0)
            doc = torch.searchsorted(cum, r, right=True)
            starts = torch.as_tensor(self.offsets[:-1], dtype=torch.int64)[doc] + r - (cum - fits)[doc]
        return TokenWindows(self, starts, int(length), int(seed))


class TokenWindows:
    """Windows of a :class:`TokenFile`, read lazily: ``batch(lo, hi)`` (or ``[lo:hi]``)
    returns the ``[hi - lo, length]`` int64 ids of windows ``lo .. hi - 1``; only the start
    offsets ``starts [n_docs]`` live in memory. ``run_probes`` and ``tl-spectral analyze``
    read it batch by batch."""

    def __init__(self, file: TokenFile, starts: Tensor, length: int, seed: int):
        self.file = file
        self.starts = starts
        self.length = int(length)
        self.seed = int(seed)
        self.encode_report: Optional[Any] = None

    @property
    def n_docs(self) -> int:
        return int(self.starts.numel())

    def __len__(self) -> int:
        return self.n_docs

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.n_docs, self.length))

    def batch(self, lo: int, hi: int) -> Tensor:
        lo, hi = max(0, int(lo)), min(self.n_docs, int(hi))
        st = self.starts[lo:hi].numpy()
        idx = st[:, None] + np.arange(self.length)[None, :]
        return torch.from_numpy(np.asarray(self.file.ids[idx], dtype=np.int64))

    def __getitem__(self, key) -> Tensor:
        rest = ()
        if isinstance(key, tuple):
            key, rest = key[0], key[1:]
        if isinstance(key, int):
            k = key + self.n_docs if key < 0 else key
            if not 0 <= k < self.n_docs:
                raise IndexError(f"window {key} out of range for {self.n_docs} windows")
            out = self.batch(k, k + 1)[0]
        elif isinstance(key, slice):
            lo, hi, step = key.indices(self.n_docs)
            out = self.batch(lo, hi) if step == 1 else torch.stack([self[i] for i in range(lo, hi, step)])
            rest = (slice(None), *rest) if rest else rest
        else:
            raise TypeError("index token windows with an int or a slice (first axis)")
        return out[rest] if rest else out

    @property
    def tokens(self) -> Tensor:
        """All windows ``[n_docs, length]`` at once (in memory: for small ensembles only)."""
        return self.batch(0, self.n_docs)
