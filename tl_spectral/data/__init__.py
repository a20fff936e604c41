"""Corpora, tokenizers and ensembles of document windows.

The Tiny Shakespeare stand-in is bundled (see ``SOURCES.md`` beside this file); the
Austen and Wikipedia files of the project's shared data are loaded from a path.
"""

from tl_spectral.data.corpora import (
    bundled_text_path,
    check_corpus,
    load_austen,
    load_corpus,
    load_text,
    load_wikipedia,
    tiny_shakespeare,
    train_val_split,
)
from tl_spectral.data.tokenizers import BPETokenizer, CharTokenizer, EncodeReport
from tl_spectral.data.windows import DocumentWindows, document_windows

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "DocumentWindows",
    "EncodeReport",
    "bundled_text_path",
    "check_corpus",
    "load_corpus",
    "document_windows",
    "load_austen",
    "load_text",
    "load_wikipedia",
    "tiny_shakespeare",
    "train_val_split",
]
