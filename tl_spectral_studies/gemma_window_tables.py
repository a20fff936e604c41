"""The doc blocks of Gemma-3's natural experiment (docs/real_decoder.md, last section), from
the committed results of :mod:`tl_spectral_studies.gemma_window`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _load(results_dir: Path, step: str) -> dict[str, Any] | None:
    p = Path(results_dir) / f"{step}.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def tables(results_dir: str | Path) -> dict[str, str]:
    """Every generated block of the section, by key (none when there are no results)."""
    return {}


def markdown(results_dir: str | Path) -> str:
    return "\n\n".join(tables(results_dir).values())
