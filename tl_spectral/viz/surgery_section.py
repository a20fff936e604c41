"""Report section: spectral surgery (SPEC B.5–B.6).

1. On the report's own model (causal, standard positions): the zero-shot linearization
   curve — PPL of the report's documents with the first k layers' patterns replaced by the
   ELU+1 linear pattern ``α_ij ∝ φ(q_i)·φ(k_j)`` (:func:`~tl_spectral.models.surgery.
   tl_linearization_curve`, pattern hooks; no probe needed).
2. The stored study (``ctx.options["surgery_dir"]``, default ``runs/surgery`` if present,
   else the published copy ``docs/results/surgery``, written by
   ``scripts/surgery_study.py``): the collapse curves of the S–D and softmax models,
   the cascade allocation and attention parameters vs PPL. Absent files are skipped with a
   sentence saying how to produce them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # sections.py imports this module: no runtime import back
    from tl_spectral.viz.report import Report
    from tl_spectral.viz.sections import ReportContext


def _default_study_dir() -> Path:
    """``runs/surgery`` when this checkout has run the study, else the copy published with
    the repository (``docs/results/surgery``, written by ``surgery_study.py figures``)."""
    local = Path("runs/surgery")
    if local.is_dir() and any(local.glob("*.safetensors")):
        return local
    return Path(__file__).resolve().parents[2] / "docs" / "results" / "surgery"


class SurgerySection:
    """A report section (the ``ReportSection`` protocol: key, title, probes, render)."""

    key = "surgery"
    title = "Spectral surgery (linearization and cascade allocation)"

    def probes(self, ctx: ReportContext) -> list:
        return []  # its own forward passes with pattern hooks

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        from tl_spectral.models.surgery import (
            AllocationStudy,
            CascadeAllocation,
            LinearizationCurve,
            plot_collapse,
            tl_linearization_curve,
        )

        report.section(self.title)
        report.text(
            "Causal ELU+1 linear attention (φ = elu + 1) on a layer's own q, k, v is attention "
            "with pattern α_ij ∝ φ(q_i)·φ(k_j), O(T) to compute. Linearizing the first k layers "
            "and measuring the perplexity change gives the collapse curve of SPEC B.5 (paper: "
            "7 leading layers of a 125M S–D model within 5%, standard attention collapsing "
            "from layer 3); head dimensions set from the measured routing rank give SPEC B.6's "
            "cascade allocation (paper: 47–65% fewer attention parameters at +3.9% to +8.4% PPL)."
        )
        n_docs = int(ctx.options.get("surgery_docs", 16))
        toks = ctx.tokens[:n_docs]
        try:
            curve = tl_linearization_curve(ctx.view, toks, name=ctx.view.name)
        except ValueError as e:
            report.text(f"Zero-shot linearization of this model skipped: {e}")
        else:
            curve.save(ctx.results_dir / "surgery_tl_curve.safetensors")
            report.text(
                f"This model, zero-shot, on {toks.shape[0]} of the report's windows "
                f"({toks.shape[1] - 1} predicted tokens each): PPL {curve.base_ppl:.4g} with "
                f"softmax everywhere; {curve.max_k_within(0.05)} leading layers stay within 5%.")
            report.table(curve.to_rows(), "PPL with the first k layers linearized (zero-shot)")
            report.figure(curve.plot(), "relative ΔPPL vs k for the report's model")

        d = Path(ctx.options.get("surgery_dir") or _default_study_dir())
        curves = {p.stem[len("curve_"):]: LinearizationCurve.load(p)
                  for p in sorted(d.glob("curve_*.safetensors"))} if d.is_dir() else {}
        if not curves and not any(d.glob("allocation_study*.safetensors")):
            report.text(f"No stored surgery study under {d}; run scripts/surgery_study.py "
                        "(see docs/surgery.md) or pass options['surgery_dir'].")
            return
        groups: dict[str, dict[str, list]] = {}  # "final" / "step N" -> zero-shot, fine-tuned
        for n, c in curves.items():
            base = n[:-3] if n.endswith("_ft") else n
            g = f"step {base.split('@')[1]}" if "@" in base else "final"
            groups.setdefault(g, {"zs": [], "ft": []})["ft" if n.endswith("_ft") else "zs"].append(c)
        for g, cs in groups.items():
            report.figure(plot_collapse(cs["zs"], fine_tuned=cs["ft"]),
                          f"stored study ({g} checkpoints): relative ΔPPL vs k, zero-shot "
                          "(solid), with the swapped layers fine-tuned (dashed) and, where measured, the "
                          "control: the same fine-tune without the swap (dotted)")
        for n, c in curves.items():
            report.table(c.to_rows(), f"{n}: base PPL {c.base_ppl:.4g} ({c.note})")
        for p in sorted(d.glob("allocation*.safetensors")):
            if p.stem.startswith("allocation_study"):
                st = AllocationStudy.load(p)
                report.figure(st.plot(), f"attention parameters vs PPL, same recipe "
                              f"({st.recipe.get('steps', '?')} steps)")
                report.table(st.to_rows(), f"allocation study: {st.note}")
            else:
                al = CascadeAllocation.load(p)
                report.figure(al.plot(), f"cascade allocation of {al.model_name}")
                report.table(al.to_rows(), f"routing rank and head dimension per layer "
                             f"({al.model_name})")
