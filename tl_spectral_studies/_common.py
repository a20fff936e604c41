"""What every study shares: its output folder, explicit data folders, generated doc blocks."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tl_spectral.usage import UsageError

#: The marker file that identifies a folder written by ``tl-spectral study NAME``.
MARKER = ".tl_spectral_study.json"


class StudyUsageError(UsageError):
    """A study was called with arguments it cannot use (shown as one line by the CLI)."""


def add_run_arguments(ap: argparse.ArgumentParser, *, default_out: str) -> None:
    """The arguments every study's run takes: ``--out``, ``--fig-dir``, ``--quick``,
    ``--overwrite``."""
    ap.add_argument("--out", default=default_out,
                    help=f"output folder for results and figures (default {default_out})")
    ap.add_argument("--fig-dir", default=None,
                    help="folder for the figures (default OUT/figures)")
    ap.add_argument("--quick", action="store_true",
                    help="a small run of every step (minutes on a CPU), for checking the set-up")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier output of this study in --out (a folder that is "
                         "not this study's output is never touched)")


def positive_int(text: str) -> int:
    """``type=`` for a count option (``--windows``, ``--threads``): an integer ≥ 1, checked
    while the arguments are parsed, before anything is read or written."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count; pass an integer ≥ 1")
    return value


@contextmanager
def fresh_out(out: str | Path, name: str, *, overwrite: bool = False) -> Iterator[Path]:
    """A study's output folder written whole, replacing an earlier one only at the end (as
    ``analyze --out`` does, :mod:`tl_spectral.outdirs`): everything is checked first, the
    run writes into a temporary sibling (marked as ``name``'s output), and on success that
    sibling is swapped in atomically; on any failure it is removed and ``out`` is left as it
    was. Refused up front: the current folder or one above it, a file, a non-empty folder
    that is not ``name``'s output, and ``name``'s earlier output without ``overwrite``."""
    from tl_spectral.outdirs import out_path, path_identity, swap_in, tmp_out_dir

    target = out_path(str(out))  # refuses . and the folders above it
    if target.exists() and not target.is_dir():
        raise StudyUsageError(f"--out {out} is a file; pass a folder")
    if target.is_dir() and any(target.iterdir()):
        marker = target / MARKER
        if not (marker.is_file() and _marker_name(marker) == name):
            raise StudyUsageError(
                f"--out {out} is a non-empty folder that is not an output of "
                f"'tl-spectral study {name}'; pass an empty or new folder")
        if not overwrite:
            raise StudyUsageError(
                f"--out {out} holds an earlier output of this study; pass --overwrite to "
                "replace it or choose another folder")
    expected = path_identity(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_out_dir(target)
    try:
        (tmp / MARKER).write_text(json.dumps({"study": name}) + "\n")
        yield tmp
        swap_in(tmp, target, expected, marker=MARKER)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful swap


def prepare_out(out: str | Path, name: str, *, overwrite: bool = False,
                update: bool = True) -> Path:
    """Create (or reuse) a study's output folder and mark it as ``name``'s.

    An empty or missing folder is used as is. A folder already marked as this study's is
    updated in place (studies run in parts merge into it) unless ``update`` is False, when
    it is replaced only with ``overwrite``. Any other non-empty folder is refused, with or
    without ``overwrite``: nothing of the user's is deleted. A path that is a file is
    refused."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StudyUsageError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()):
        marker = out / MARKER
        ours = marker.is_file() and _marker_name(marker) == name
        if not ours:
            raise StudyUsageError(
                f"--out {out} is a non-empty folder that is not an output of "
                f"'tl-spectral study {name}'; pass an empty or new folder")
        if not update:
            if not overwrite:
                raise StudyUsageError(
                    f"--out {out} holds an earlier output of this study; pass --overwrite to "
                    "replace it or choose another folder")
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps({"study": name}) + "\n")
    return out


def _marker_name(marker: Path) -> str | None:
    try:
        return json.loads(marker.read_text()).get("study")
    except (OSError, ValueError, AttributeError):
        return None


def require_data_dir(path: str | Path | None, what: str) -> Path:
    """An explicit data folder that exists; a clear error naming ``what`` it must hold."""
    if not path:
        raise StudyUsageError(f"this step needs {what}: pass --data-dir DIR "
                              "(the project's shared data folder)")
    p = Path(path)
    if not p.is_dir():
        raise StudyUsageError(f"--data-dir {p} is not a folder; it must hold {what}")
    return p


GENERATED_OPEN = "<!-- generated: {key} -->"
GENERATED_CLOSE = "<!-- /generated -->"
_GEN_RE = re.compile(r"<!-- generated: (?P<key>[^ ]+) -->\n(?P<body>.*?)\n?<!-- /generated -->",
                     re.S)


def generated_blocks(text: str) -> dict[str, str]:
    """The generated blocks of a doc: ``<!-- generated: KEY -->`` … ``<!-- /generated -->``
    → ``{KEY: text between the markers}`` (without the newlines next to the markers)."""
    out: dict[str, str] = {}
    for m in _GEN_RE.finditer(text):
        if m["key"] in out:
            raise ValueError(f"generated block {m['key']!r} appears twice")
        out[m["key"]] = m["body"].strip("\n")
    return out


def fill_generated(text: str, blocks: dict[str, str], *, prefix: str = "") -> str:
    """``text`` with the body of every generated block whose key starts with ``prefix``
    replaced by ``blocks[key]``. A block key of that prefix missing from ``blocks`` raises (a
    stale table must not stay in a doc)."""

    def sub(m: re.Match) -> str:
        key = m["key"]
        if not key.startswith(prefix):
            return m.group(0)
        if key not in blocks:
            raise ValueError(f"the doc has a generated block {key!r} that the results do not "
                             "produce; remove it or regenerate the results")
        return f"{GENERATED_OPEN.format(key=key)}\n{blocks[key]}\n{GENERATED_CLOSE}"

    return _GEN_RE.sub(sub, text)


def fmt_interval(iv: dict | None, fmt: str = "{:.3g}") -> str:
    """``"0.63 [0.60, 0.66]"`` from an interval dict (``estimate``, ``low``, ``high``)."""
    if not iv:
        return "—"
    return (f"{fmt.format(iv['estimate'])} [{fmt.format(iv['low'])}, "
            f"{fmt.format(iv['high'])}]")


def add_caption(fig: Any, caption: str) -> None:
    """A caption under a study figure (the run it comes from: model, windows, seed)."""
    fig.text(0.01, -0.02, caption, fontsize=7, ha="left", va="top", color="0.3",
             transform=fig.transFigure)


def save_figures(figs: dict[str, Any], fig_dir: Path, prefix: str, dpi: int = 100,
                 caption: str | None = None) -> dict:
    """Save matplotlib figures as ``fig_dir/{prefix}_{key}.png`` (each with ``caption``
    under it when given), close them; key -> file name."""
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, fig in figs.items():
        if caption:
            add_caption(fig, caption)
        p = fig_dir / f"{prefix}_{key}.png"
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        plt.close(fig)
        paths[key] = p.name
    return paths


def validation_windows(text: str, tok: Any, n_docs: int, length: int, seed: int, *,
                       stride: int | None = None, validation_only: bool = False
                       ) -> tuple[Any, str]:
    """``(windows, source)``: ``n_docs`` windows of ``length`` tokens from the validation
    split of ``text``, or from the whole text when the split is too short (unless
    ``validation_only``: then the shortfall is an error naming the stride to pass); a model
    trained with a start token gets it in front of every window either way. ``stride``: the
    windows start at multiples of it inside the split (overlapping when stride < length)."""
    from tl_spectral.data import document_windows, train_val_split

    bos = getattr(tok, "bos_id", None)
    _, val = train_val_split(text)
    where = "validation split" + (f", stride {stride}" if stride is not None else "")
    try:
        return document_windows(val, tok, n_docs, length, seed=seed, bos_id=bos,
                                stride=stride), where
    except ValueError as e:
        if validation_only:
            raise ValueError(f"validation windows only: {e}; pass a stride below the window "
                             f"length (e.g. stride={max(1, length // 4)})") from None
        return document_windows(text, tok, n_docs, length, seed=seed, bos_id=bos), \
            "whole corpus"


def git_commit() -> str:
    """The checkout's commit (``git rev-parse HEAD``), "unknown" outside a git checkout: what
    a study's provenance records."""
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or "unknown"
