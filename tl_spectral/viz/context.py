"""What a report section sees (:class:`ReportContext`) and the section protocol
(:class:`ReportSection`). Every section module imports these from here; ``sections.py`` lists
the sections in report order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tl_spectral.model_view import ModelView

if TYPE_CHECKING:
    from tl_spectral.probes import Probe
    from tl_spectral.viz.report import Report


@dataclass
class ReportContext:
    """What a section may read: the model view, the corpus, the tokenizer and the paths."""

    view: ModelView
    tokens: Any  # [n_docs, pos] int64
    tokenizer: Any
    out_dir: Path
    results_dir: Path
    options: dict = field(default_factory=dict)

    def token_strings(self, ids) -> list[str]:
        tok = self.tokenizer
        out = []
        for i in ids.tolist():
            try:
                s = tok.decode([i])
            except Exception:
                s = str(i)
            out.append(s.replace("\n", "\\n"))
        return out


class ReportSection:
    """A section: the probes it needs (run together with every other section's) and a render."""

    key: str = "section"
    title: str = "Section"

    def probes(self, ctx: ReportContext) -> list[Probe]:
        return []

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        raise NotImplementedError


