"""Text corpora: the bundled Tiny Shakespeare stand-in and loaders for the shared files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tl_spectral.usage import UsageError


def bundled_text_path() -> Path:
    """Path of the bundled Tiny Shakespeare stand-in (1,033,444 ASCII characters)."""
    return Path(str(resources.files("tl_spectral.data").joinpath("tiny_shakespeare.txt")))


def tiny_shakespeare() -> str:
    """The bundled Tiny Shakespeare stand-in as one string (provenance: data/SOURCES.md)."""
    return bundled_text_path().read_text(encoding="utf-8")


def load_text(path: str | Path, *, min_chars: int = 1) -> str:
    """Read a UTF-8 text file, with a clear error when it is missing or too short."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(
            f"no text file at {p}; pass the path of a UTF-8 text file "
            "(e.g. austen.txt of the shared data folder)"
        )
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{p} is not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {e.start} "
            f"({e.reason}); convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    if len(text) < min_chars:
        raise ValueError(f"{p} holds {len(text)} characters; at least {min_chars} are needed")
    return text


def load_austen(path: str | Path) -> str:
    """The six Austen novels (``austen.txt`` of the shared data), normalised line endings."""
    return load_text(path, min_chars=1000).replace("\r\n", "\n")


def load_wikipedia(path: str | Path) -> str:
    """The Wikipedia excerpt (``wiki_excerpt.txt``): 96 articles, headings as ``= Title =``."""
    return load_text(path, min_chars=1000).replace("\r\n", "\n")


def train_val_split(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """Split a text into a leading train part and a trailing validation part (90/10 default)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    cut = int(len(text) * (1.0 - val_fraction))
    return text[:cut], text[cut:]


def check_corpus(corpus: str) -> None:
    """``--corpus``: 'shakespeare' or an existing, non-empty UTF-8 file (else UsageError
    naming the file and, for bad UTF-8, the byte offset)."""
    if corpus in ("shakespeare", "tiny-shakespeare"):
        return
    p = Path(corpus)
    if not p.exists():
        raise UsageError(f"--corpus {corpus}: no such file; pass 'shakespeare' (bundled) or "
                         "the path of a UTF-8 text file")
    if not p.is_file():
        raise UsageError(f"--corpus {corpus} is not a file; pass a UTF-8 text file")
    raw = p.read_bytes()
    if not raw.strip():
        raise UsageError(f"--corpus {corpus} is empty; pass a UTF-8 text file with text in it")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--corpus {corpus} is not UTF-8 text: byte 0x{raw[e.start]:02x} at "
                         f"byte offset {e.start} ({e.reason}); convert it to UTF-8 (e.g. iconv "
                         "-f latin1 -t utf-8)") from None


def load_corpus(corpus: str) -> str:
    """The text of ``--corpus`` ('shakespeare' = the bundled Tiny Shakespeare)."""
    check_corpus(corpus)
    if corpus in ("shakespeare", "tiny-shakespeare"):
        return tiny_shakespeare()
    return Path(corpus).read_text(encoding="utf-8")
