"""The panel of the evidence runner (issue 39): cells, job configurations and resumable,
atomic job files, shared by :mod:`tl_spectral_studies.evidence` (which runs the jobs) and
:mod:`tl_spectral_studies.evidence_summary` (which reads them)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = "evidence"
STEPS = ("sinks", "zero_sink", "faithfulness", "pod", "probe_sinks", "interventions",
         "inversion_layers")
CORPORA = {"wiki": "wiki_excerpt.txt", "austen": "austen.txt"}
DRAWS = (0, 1, 2)
FIRST_TOKENS = {
    "smollm2-135m": ("none", "<|im_start|>", "<|endoftext|>"),
    "gemma3-270m": ("none", "<bos>"),
}
DEFAULTS = {"windows": 64, "length": 256, "faith_docs": 32, "faith_length": 32,
            "pod_docs": 150, "batch_size": 4}
"""Sample sizes of the full plan (issue 39): 64 windows × 256 tokens for sinks and the
interventions, 32 documents for faithfulness, N = 150 for the scale POD (its T per model:
:data:`POD_LENGTH`)."""
POD_LENGTH = {"smollm2-135m": 128, "gemma3-270m": 256}
"""T of the ``pod`` step: the pod-depth study's (``tl_spectral_studies.pod_depth.MODELS``)."""
VERSION = 1
"""Bumped when a step's computation changes (part of every job's configuration)."""
LAYER_DRAWS = (0,)
"""The window draws of the ``inversion_layers`` step (seed 002's inversion one layer at a
time: two passes per layer, 60 per SmolLM2 cell): its panel crosses the first token only, on
the Wikipedia excerpt, draw 0."""


@dataclass(frozen=True)
class Cell:
    """One panel cell: first token, corpus, window draw."""

    first: str
    corpus: str
    draw: int

    @property
    def key(self) -> str:
        """A file-name-safe key, e.g. ``first=im_start.corpus=wiki.draw=0``."""
        f = "".join(ch for ch in self.first if ch.isalnum() or ch == "_") or "none"
        return f"first={f}.corpus={self.corpus}.draw={self.draw}"

    def factors(self) -> dict[str, Any]:
        return {"first token": self.first, "corpus": self.corpus, "draw": self.draw}


def start_id(tok: Any, first: str) -> int | None:
    """The token id of ``first`` (None for ``"none"``); a clear error when the tokenizer does
    not know it as one token."""
    if first == "none":
        return None
    ids = tok.convert_tokens_to_ids([first])
    if not ids or ids[0] is None or tok.convert_ids_to_tokens(ids)[0] != first:
        raise ValueError(f"the tokenizer has no single token {first!r}")
    return int(ids[0])


def panel(model: str, step: str = "sinks", draws: Sequence[int] = DRAWS) -> list[Cell]:
    """The cells of ``model``'s panel for ``step`` (:func:`applies`: faithfulness on the
    Wikipedia excerpt only, ``inversion_layers`` there and in draw 0 only)."""
    if model not in FIRST_TOKENS:
        raise ValueError(f"no panel for model {model!r}; use one of {sorted(FIRST_TOKENS)}")
    cells = [Cell(f, c, d) for f in FIRST_TOKENS[model] for c in CORPORA for d in draws]
    return [c for c in cells if applies(step, c)]


def applies(step: str, cell: Cell) -> bool:
    """Whether ``step`` runs in ``cell``: the faithfulness claims are about one corpus in the
    paper (the Wikipedia excerpt); the one-layer-at-a-time inversion costs two passes per
    layer, so its panel is the first token alone (Wikipedia, :data:`LAYER_DRAWS`)."""
    if step == "faithfulness":
        return cell.corpus == "wiki"
    if step == "inversion_layers":
        return cell.corpus == "wiki" and cell.draw in LAYER_DRAWS
    return True


def job_config(model: str, step: str, cell: Cell, cfg: dict) -> dict:
    """What a job's result depends on; a stored file is reused only when this matches."""
    sizes = ({"n": cfg["faith_docs"], "length": cfg["faith_length"]} if step == "faithfulness"
             else {"n": cfg["pod_docs"], "length": cfg.get("pod_length")
                   or POD_LENGTH.get(model, cfg["length"])} if step == "pod"
             else {"n": cfg["windows"], "length": cfg["length"]})
    return {"version": VERSION, "model": model, "step": step, **cell.factors(), **sizes}


def config_hash(conf: dict) -> str:
    return hashlib.sha256(json.dumps(conf, sort_keys=True).encode()).hexdigest()[:16]


def job_path(out: Path, model: str, step: str, cell: Cell) -> Path:
    return Path(out) / model / step / f"{cell.key}.json"


def is_done(path: Path, conf: dict) -> bool:
    """The job's file exists, is complete JSON and was made with configuration ``conf``."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("config_hash") == config_hash(conf)


def write_atomic(path: Path, obj: dict) -> None:
    """Write JSON to ``path`` through a temporary file renamed into place (a killed run
    leaves either the old file or the new one, never half of one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
