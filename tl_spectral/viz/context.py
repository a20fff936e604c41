"""What a report section sees (:class:`ReportContext`) and the section protocol
(:class:`ReportSection`). Every section module imports these from here; ``sections.py`` lists
the sections in report order."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from tl_spectral.model_view import ModelView

if TYPE_CHECKING:
    from tl_spectral.probes import Probe
    from tl_spectral.viz.report import Report


@dataclass
class ReportContext:
    """What a section may read: the model view, the corpus, the tokenizer and the paths.

    ``mask``: optional ``[n_docs, pos]`` bool mask of real tokens (right padding);
    ``model_name``: the name shown in titles (default: the view's name).
    Options read by the sections: ``save_raw`` (keep raw per-query maps in ``results/``),
    ``progress`` (one-line status messages on stderr), ``faithfulness_docs``, ``meta``."""

    view: ModelView
    tokens: Any  # [n_docs, pos] int64
    tokenizer: Any
    out_dir: Path
    results_dir: Path
    options: dict = field(default_factory=dict)
    mask: Any = None
    model_name: Optional[str] = None
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    @property
    def name(self) -> str:
        return self.model_name or self.view.name

    @property
    def save_raw(self) -> bool:
        return bool(self.options.get("save_raw", False))

    def doc_length(self, doc: int) -> int:
        """Number of real tokens of document ``doc``."""
        if self.mask is None:
            return int(self.tokens.shape[1])
        return int(self.mask[doc].sum())

    def status(self, message: str) -> None:
        """A one-line status on stderr (with the elapsed time) when progress is on."""
        if self.options.get("progress", False):
            print(f"[{time.perf_counter() - self._t0:6.1f} s] {message}", file=sys.stderr,
                  flush=True)

    def token_strings(self, ids) -> list[str]:
        """One display string per token, decoded the tokenizer's way (:func:`token_strings`)."""
        return token_strings(self.tokenizer, ids)


class ReportSection:
    """A section: the probes it needs (run together with every other section's) and a render."""

    key: str = "section"
    title: str = "Section"

    def probes(self, ctx: ReportContext) -> list[Probe]:
        return []

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        raise NotImplementedError


#: shown for a token that only carries part of a character's bytes (the character appears
#: on the token that completes it)
PARTIAL = "·"


def _decode(tok: Any, ids: list[int]) -> str:
    try:
        return tok.decode(ids, clean_up_tokenization_spaces=False)
    except TypeError:
        return tok.decode(ids)


def token_strings(tok: Any, ids: Any) -> list[str]:
    """Display strings of a token sequence, decoded the tokenizer's way: token k shows what
    decoding ``ids[:k + 1]`` adds to the text of ``ids[:k]``, so word pieces join (BERT's
    ``##`` pieces, no spaces inside a word), byte-level BPE spaces show as spaces, and a
    character split over several byte tokens appears whole on the token that completes it
    (the tokens before it show ``·``). Falls back to decoding each token alone where the
    running text is not a prefix of the next (a tokenizer whose decode rewrites earlier
    text). Newlines show as ``\\n``."""
    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    out: list[str] = []
    done = ""
    for k, i in enumerate(ids):
        try:
            text = _decode(tok, ids[:k + 1])
            stable = text.rstrip("\ufffd") if k + 1 < len(ids) else text
            if stable.startswith(done):
                piece = stable[len(done):]
                done = stable
                if not piece:
                    piece = PARTIAL
            else:
                piece = _decode(tok, [i])
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: show the id
            piece = str(i)
        out.append(piece.replace("\n", "\\n"))
    return out
