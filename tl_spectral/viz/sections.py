"""Sections of the HTML report. Each section module registers its section
(``@register_section``, :mod:`tl_spectral.viz.context`); this module imports every section
module once (one line each, below) and builds the report.

The report runs every section's probes in ONE ``run_probes`` pass, then lets each section
render its results (figures, tables, circuitsvis views, findings for the summary at the top)
and save what a reload needs under ``results/`` (raw per-query maps only with
``options.save_raw``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from tl_spectral.probes import AttentionStats, Probe
from tl_spectral.viz.context import SECTIONS, ReportContext, ReportSection, register_section
from tl_spectral.viz.contribution_section import ContributionSection  # noqa: F401
from tl_spectral.viz.report import Report
from tl_spectral.viz.routing_section import RoutingFilteringSection  # noqa: F401
from tl_spectral.viz.scale_pod_section import ScalePODSection  # noqa: F401
from tl_spectral.viz.surgery_section import SurgerySection  # noqa: F401

#: positions kept of per-position maps (mean patterns, kept contribution maps) without
#: ``save_raw``: what the report's figures and views show
SHOWN_POSITIONS = 64


def _informative_head_rows(rows: list[dict]) -> list[int]:
    """Per layer: the head with the largest first-token mass and the most focused head
    (lowest entropy)."""
    by_layer: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_layer.setdefault(r["layer"], []).append(i)
    keep = []
    for idx in by_layer.values():
        keep.append(max(idx, key=lambda i: rows[i]["first_token_mass"]))
        keep.append(min(idx, key=lambda i: rows[i]["entropy"]))
    return sorted(set(keep))


@register_section
class AttentionStatsSection(ReportSection):
    """Report section: entropy, distance and position-0 mass of every head, patterns."""
    key = "attention_stats"
    title = "Attention statistics"
    order = 10

    def probes(self, ctx: ReportContext) -> list[Probe]:
        # the report shows SHOWN_POSITIONS; --save-raw keeps every position's mean pattern
        return [AttentionStats(pattern_positions=None if ctx.save_raw else 256)]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        import circuitsvis as cv
        import torch

        from tl_spectral.viz.attention_plots import plot_attention_stats, plot_mean_patterns

        ctx.status("attention statistics: figures")
        res = results["attention_stats"]
        saved = res
        if not ctx.save_raw and res.mean_pattern.shape[-1] > SHOWN_POSITIONS:
            n = SHOWN_POSITIONS
            saved = dataclasses.replace(res, mean_pattern=res.mean_pattern[..., :n, :n].clone())
        saved.save(ctx.results_dir / "attention_stats.safetensors")
        report.section(self.title)
        report.text(
            "Per layer and head, over every real query of the corpus: the entropy of the "
            "attention distribution (nats), the mean distance Σ_j α_ij |i − j| (tokens), and the "
            "mass on position 0 (the first token; a sink indicator).")
        ent = res.entropy.float()
        li, h = divmod(int(ent.argmin()), ent.shape[1])
        ftm = res.first_token_mass.float()
        lj, hj = divmod(int(ftm.argmax()), ftm.shape[1])
        report.finding(
            f"Most focused head: layer {res.layers[li]} head {h} (entropy {float(ent[li, h]):.2f} "
            f"nats); strongest position-0 head: layer {res.layers[lj]} head {hj} "
            f"({100 * float(ftm[lj, hj]):.0f}% of its attention on position 0).")
        report.figure(plot_attention_stats(res), "entropy, distance and position-0 mass per "
                                                 "layer and head")
        report.subsection("Mean patterns per layer")
        report.figure_set(
            ((str(lay), (ctx.status(f"attention figures: mean patterns, layer {i + 1}/"
                                    f"{len(res.layers)}"), plot_mean_patterns(res, i))[1])
             for i, lay in enumerate(res.layers)),
            "mean attention pattern of every head (query ↓, key →), first "
            f"{min(SHOWN_POSITIONS, res.mean_pattern.shape[-1])} positions, on a quantile "
            "colour scale (each colour covers the same share of entries)")
        report.subsection("Per-head table")
        rows = res.rows()
        report.table(rows, "per-head statistics (shown: per layer the head with the most "
                           "position-0 mass and the most focused head)", name="attention_heads",
                     show=_informative_head_rows(rows))
        # one document's patterns, every layer, as interactive circuitsvis views behind the
        # layer selector (the last layer shown first)
        report.subsection("Interactive view")
        n = min(SHOWN_POSITIONS, ctx.doc_length(0))
        doc = ctx.tokens[0, :n]
        cap: dict[int, Any] = {}
        layers = list(range(ctx.view.n_layers))

        def hook_for(layer: int):
            def hook(t, hook=None):
                cap[layer] = t[0].detach().cpu()
                return t
            return hook

        ctx.status("attention statistics: interactive views")
        with torch.no_grad():
            ctx.view.run(doc[None], fwd_hooks=[(ctx.view.hook_pattern(layer), hook_for(layer))
                                               for layer in layers], return_type=None)
        toks = ctx.token_strings(doc)
        report.circuitsvis_set(
            ((str(layer), cv.attention.attention_patterns(tokens=toks, attention=cap[layer]))
             for layer in reversed(layers)), "patterns-layer",
            f"attention patterns on the first {n} tokens of document 0 (pick a layer, then "
            "hover a token and pick a head)")


def section_keys() -> tuple[str, ...]:
    """The keys of every registered section, in report order (``--sections``)."""
    return tuple(s.key for s in SECTIONS)


def model_summary(ctx: ReportContext) -> str:
    """One line describing the report's model (layers, heads, widths, causal or not)."""
    v = ctx.view
    kind = "causal" if v.causal else "bidirectional (encoder)"
    return (f"{ctx.name}: {v.n_layers} layers × {v.n_heads} heads, d_model {v.d_model}, "
            f"d_head {v.d_head}, {kind}")


def build_report(
    ctx: ReportContext,
    sections: Optional[list[ReportSection]] = None,
    batch_size: int = 16,
    progress: bool = True,
    title: Optional[str] = None,
    results: Optional[dict[str, Any]] = None,
) -> Path:
    """Run all sections' probes in one pass, render every section, write index.html.

    results: the probes' results when they were already computed (e.g. reduced across the
    processes of ``torchrun`` by ``tl-spectral analyze``); then no probe runs here."""
    from tl_spectral.probes import run_probes

    if ctx.options.progress is None:
        ctx.options = dataclasses.replace(ctx.options, progress=progress)
    secs = sections if sections is not None else [f() for f in SECTIONS]
    probes: list[Probe] = []
    for s in secs:
        probes.extend(s.probes(ctx))
    n_docs, T = int(ctx.tokens.shape[0]), int(ctx.tokens.shape[1])
    if results is not None:
        pass
    elif not probes:
        results = {}
    else:
        ctx.status(f"probes: one pass over {n_docs} windows of {T} tokens")
        results = run_probes(ctx.view, ctx.tokens, probes, batch_size=batch_size,
                             progress=progress, attention_mask=ctx.mask)
    seed = ctx.options.meta.get("seed")
    run = f"{n_docs} windows × {T} tokens" + (f", seed {seed}" if seed is not None else "")
    report = Report(
        title or f"tl_spectral report — {ctx.name}",
        meta={
            "model": model_summary(ctx),
            "documents": f"{n_docs} windows of {T} tokens"
                         + (f" ({ctx.options.windows})" if ctx.options.windows else ""),
            **ctx.options.meta,
        },
    )
    report.figure_suffix = f" [{ctx.name}; {run}]"
    for s in secs:
        ctx.status(f"section: {s.title}")
        s.render(report, results, ctx)
    report.note(f"Generated by tl-spectral analyze for {ctx.name} on {run}. Every figure, "
                "table and view is about this model only; stored study results are "
                "`tl-spectral study NAME` and the docs.")
    report.note("results/ holds what a reload needs (Result.load): per-layer statistics, "
                "spectra and summaries; "
                + ("raw per-query maps are included (--save-raw)." if ctx.save_raw else
                   f"per-position maps are cut to the first {SHOWN_POSITIONS} positions and "
                   "POD modes left out; pass --save-raw to keep them whole."))
    ctx.status("writing index.html")
    index = report.write(ctx.out_dir)
    ctx.status(f"done: {index}")
    return index
