"""Sections of the HTML report. Each analysis adds one ReportSection to ``SECTIONS``.

The report runs every section's probes in ONE ``run_probes`` pass, then lets each section
render its results (figures, tables, circuitsvis views) and save them under ``results/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from tl_spectral.probes import AttentionStats, Probe
from tl_spectral.viz.context import ReportContext, ReportSection
from tl_spectral.viz.contribution_plots import ContributionSection
from tl_spectral.viz.report import Report
from tl_spectral.viz.routing_section import RoutingFilteringSection
from tl_spectral.viz.scale_pod_section import ScalePODSection
from tl_spectral.viz.surgery_section import SurgerySection


class AttentionStatsSection(ReportSection):
    key = "attention_stats"
    title = "Attention statistics"

    def probes(self, ctx: ReportContext) -> list[Probe]:
        return [AttentionStats()]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        import circuitsvis as cv

        res = results["attention_stats"]
        res.save(ctx.results_dir / "attention_stats.safetensors")
        report.section(self.title)
        report.text(
            "Per layer and head, over every real query of the corpus: the entropy of the "
            "attention distribution (nats), the mean distance Σ_j α_ij |i − j| (tokens), and the "
            "mass on the first token (a sink indicator)."
        )
        report.figure(res.plot(), "entropy, distance and first-token mass per layer and head")
        report.figure(res.plot_patterns(), "mean attention patterns (first 64 positions)")
        report.table(res.rows(), "per-head statistics")
        # one document's patterns, last layer, as an interactive circuitsvis view
        n = min(64, ctx.tokens.shape[1])
        doc = ctx.tokens[0, :n]
        cap: dict[str, Any] = {}
        layer = ctx.view.n_layers - 1

        def hook(t, hook=None):
            cap["p"] = t[0].detach().cpu()
            return t

        import torch

        with torch.no_grad():
            ctx.view.run(doc[None], fwd_hooks=[(ctx.view.hook_pattern(layer), hook)], return_type=None)
        view = cv.attention.attention_patterns(tokens=ctx.token_strings(doc), attention=cap["p"])
        report.circuitsvis(view, f"patterns-layer-{layer}",
                           f"attention patterns of layer {layer} on the first {n} tokens of document 0")


SECTIONS: list[Callable[[], ReportSection]] = [
    AttentionStatsSection,
    ScalePODSection,
    RoutingFilteringSection,
    ContributionSection,
    SurgerySection,
]
"""Section factories, in report order. Later analyses append theirs."""


def build_report(
    ctx: ReportContext,
    sections: Optional[list[ReportSection]] = None,
    batch_size: int = 16,
    progress: bool = True,
    title: Optional[str] = None,
) -> Path:
    """Run all sections' probes in one pass, render every section, write index.html."""
    from tl_spectral.probes import run_probes

    secs = sections if sections is not None else [f() for f in SECTIONS]
    probes: list[Probe] = []
    for s in secs:
        probes.extend(s.probes(ctx))
    results: dict[str, Any] = {}
    if probes:
        results = run_probes(ctx.view, ctx.tokens, probes, batch_size=batch_size, progress=progress)
    report = Report(
        title or f"tl_spectral report — {ctx.view.name}",
        meta={
            "model": repr(ctx.view),
            "documents": f"{ctx.tokens.shape[0]} windows of {ctx.tokens.shape[1]} tokens",
            **ctx.options.get("meta", {}),
        },
    )
    for s in secs:
        s.render(report, results, ctx)
    return report.write(ctx.out_dir)
