"""Sections of the HTML report. Each section module registers its section
(``@register_section``, :mod:`tl_spectral.viz.context`); this module imports every section
module once: every ``viz/*_section.py``, found by file name (no list to keep), then the
plugins' (:func:`tl_spectral.discovery.load_plugins`, at the end of this module), and builds
the report.

The report runs every section's probes in ONE ``run_probes`` pass, then lets each section
render its results (figures, tables, circuitsvis views, findings for the summary at the top)
and save what a reload needs under ``results/`` (raw per-query maps only with
``options.save_raw``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tl_spectral.discovery import import_submodules, load_plugins
from tl_spectral.probes import AttentionStatsProbe, Probe
from tl_spectral.viz.context import (  # noqa: F401 - shared by the sections, re-exported
    SECTIONS,
    SHOWN_POSITIONS,
    VIEW_DOCS,
    VIEW_HEADS_FOR_3_DOCS,
    ModelPass,
    ReportContext,
    ReportSection,
    register_section,
    view_documents,
)
from tl_spectral.viz.report import Report

#: the built-in section modules, found by file name (each registered its section on import)
SECTION_MODULES = [m.__name__ for m in import_submodules("tl_spectral.viz", suffix="_section")]


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


def uniform_entropy_bound(ctx: ReportContext) -> float:
    """Mean over the report's real queries of the entropy of UNIFORM attention over the keys
    each query may see (log(i + 1) for a causal query at position i, log n for a query of a
    bidirectional window of n real tokens): the value every head of an untrained model sits
    at."""
    import math

    tot, n = 0.0, 0
    for d in range(int(ctx.tokens.shape[0])):
        L = ctx.doc_length(d)
        if ctx.view.causal:
            tot += math.lgamma(L + 1)  # Σ_{i<L} log(i + 1) = log L!
        else:
            tot += L * math.log(max(L, 1))
        n += L
    return tot / max(n, 1)


#: a head counts as uniform when its mean entropy is within this share of the uniform bound
UNIFORM_SHARE = 0.98
#: the model "looks untrained" when at least this share of its heads is uniform
UNTRAINED_HEAD_SHARE = 0.9
#: a head with at least this mean mass on position 0 is named as a position-0 (sink) head
#: (the contributions section's sink threshold)
SINK_HEAD_MASS = 0.2



def featured_layers(res: Any) -> dict[int, str]:
    """{layer index: note} of the layers that matter: the layer of the most focused head and
    the sink layers (a head with ≥ 50% of its attention on position 0; at most 3, the
    strongest)."""
    ent = res.entropy.float()
    ftm = res.first_token_mass.float()
    out: dict[int, str] = {}
    out[int(ent.min(1).values.argmin())] = "most focused head"
    strong = ftm.max(1).values
    for i in strong.argsort(descending=True).tolist()[:3]:
        if float(strong[i]) >= 0.5:
            out[i] = (out[i] + ", " if i in out else "") + "sink layer"
    return out


def _uniform_check(report: Report, ctx: ReportContext, ent: Any) -> tuple[Any, float]:
    """The heads at the uniform-entropy bound: a one-row table, and the verdict on training
    (a finding) when the sanity section's perplexity check did not run. Returns (the
    near-uniform mask, its share)."""
    bound = uniform_entropy_bound(ctx)
    near = ent >= UNIFORM_SHARE * bound
    share = float(near.float().mean())
    ctx.sanity["uniform_head_share"] = share
    checked_ppl = "ppl" in ctx.sanity  # the sanity section's perplexity check ran
    report.table([{"uniform_entropy_bound": bound, "heads": near.numel(),
                   "heads_near_uniform": int(near.sum()), "entropy_min": float(ent.min()),
                   "entropy_max": float(ent.max())}],
                 "uniform-attention check", name="uniform_attention_check")
    if bound > 0 and share >= UNTRAINED_HEAD_SHARE and not checked_ppl:
        report.finding(
            f"This model looks untrained: {int(near.sum())} of {near.numel()} heads attend "
            f"almost uniformly (mean entropy within {100 * (1 - UNIFORM_SHARE):.0f}% of "
            f"the uniform bound {bound:.3f} nats, the entropy of spreading attention evenly "
            f"over the visible keys; the heads run {float(ent.min()):.3f}–"
            f"{float(ent.max()):.3f}). The numbers below describe a random network, not "
            "learned structure.", first="top")
    elif not checked_ppl:
        report.finding(
            f"Sanity: {int(near.sum())} of {near.numel()} heads attend almost uniformly "
            f"(entropy ≥ {100 * UNIFORM_SHARE:.0f}% of the uniform bound {bound:.3f} "
            f"nats, the entropy of even attention); {near.numel() - int(near.sum())} are "
            "more focused.", first=True)
    else:
        report.text(
            f"{int(near.sum())} of {near.numel()} heads attend almost uniformly (mean "
            f"entropy ≥ {100 * UNIFORM_SHARE:.0f}% of the uniform bound {bound:.3f} nats, "
            "the entropy of even attention over the visible keys); the perplexity check "
            "(sanity section) is the verdict on training.")
    return near, share


def _head_roles(report: Report, ctx: ReportContext, res: Any, ent: Any, ftm: Any) -> None:
    """The most focused head and the strongest position-0 head (when it puts at least
    ``SINK_HEAD_MASS`` of its attention there), as roles (named once, in the report's
    heads finding)."""
    li, h = divmod(int(ent.argmin()), ent.shape[1])
    lj, hj = divmod(int(ftm.argmax()), ftm.shape[1])
    ctx.add_head_role(res.layers[li], h, f"the most focused head (entropy "
                                         f"{float(ent[li, h]):.3f} nats)")
    if float(ftm[lj, hj]) >= SINK_HEAD_MASS:  # else no head parks on position 0
        ctx.add_head_role(res.layers[lj], hj, f"the strongest position-0 head "
                                              f"({100 * float(ftm[lj, hj]):.0f}% of its "
                                              "attention on position 0)")
    ctx.sanity["heads_anchor"] = report.anchor


@register_section
class AttentionStatsSection(ReportSection):
    """Report section: entropy, distance and position-0 mass of every head, patterns."""
    key = "attention_stats"
    title = "Attention statistics"
    order = 10

    def probes(self, ctx: ReportContext) -> list[Probe]:
        # the report shows SHOWN_POSITIONS; --save-raw keeps every position's mean pattern
        return [AttentionStatsProbe(pattern_positions=None if ctx.save_raw else 256)]

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        return [ModelPass("view_patterns", "attention statistics: patterns of the documents "
                          "the views show", view_patterns)]

    def derive(self, results: dict[str, Any], ctx: ReportContext) -> dict[str, Any]:
        """The statistics with the mean patterns cut to the positions the report shows
        (whole with ``save_raw``), and the views' patterns packed as the page shows them."""
        res = results["attention_stats"]
        # results/ keeps the mean pattern's first SHOWN_POSITIONS positions (half of that on
        # models with more than VIEW_HEADS_FOR_3_DOCS heads: the folder's size), and the
        # mosaic draws what results/ keeps (at 270 heads a head's panel is a few pixels wide)
        n = SHOWN_POSITIONS if res.mean_pattern.shape[0] * res.mean_pattern.shape[1] <= \
            VIEW_HEADS_FOR_3_DOCS else SHOWN_POSITIONS // 2
        if not ctx.save_raw and res.mean_pattern.shape[-1] > n:
            res = dataclasses.replace(res, mean_pattern=res.mean_pattern[..., :n, :n].clone())
        return {"attention_stats_shown": res,
                "attention_views": packed_view_patterns(results["view_patterns"], ctx)}

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        import math

        from tl_spectral.viz.multiples import (
            data_range,
            heads_by_layer_figure,
            mean_patterns_mosaic,
        )

        ctx.status("attention statistics: figures")
        res = results["attention_stats_shown"]
        res.save(ctx.results_dir / "attention_stats.safetensors")
        mosaic = res.mean_pattern[..., :SHOWN_POSITIONS, :SHOWN_POSITIONS]
        report.section(self.title)
        report.text(
            "Per layer and head, over every real query of the corpus: the entropy of the "
            "attention distribution (nats), the mean distance Σ_j α_ij |i − j| (tokens), and the "
            "mass on position 0 (the first token; a sink indicator).")
        ent = res.entropy.float()
        near, share = _uniform_check(report, ctx, ent)
        ftm = res.first_token_mass.float()
        _head_roles(report, ctx, res, ent, ftm)
        T = int(ctx.tokens.shape[1])
        dist = res.distance.float().numpy()
        dlo, dhi = data_range(dist, noise=1.0)
        marks = (near.numpy() if share < UNTRAINED_HEAD_SHARE else None)
        report.figure(heads_by_layer_figure([
            {"values": ent.numpy(), "title": f"entropy (nats), scale [0, log T = {math.log(T):.2f}]",
             "vmin": 0.0, "vmax": math.log(T), "cbar": "nats", "marks": marks,
             "mark_label": f"≥ {100 * UNIFORM_SHARE:.0f}% of the uniform bound"},
            {"values": dist, "title": f"mean distance (tokens), data range {dlo:.3g}–{dhi:.3g}",
             "vmin": dlo, "vmax": dhi, "cmap": "magma", "cbar": "tokens"},
            {"values": ftm.numpy(), "title": "mass on position 0, scale [0, 1]",
             "vmin": 0.0, "vmax": 1.0, "cmap": "cividis", "cbar": "share"},
        ], res.layers), "Look for low-entropy (dark) heads, which attend to few keys, and "
            "bright heads in the right panel, which park their attention on position 0 (sinks).")
        report.subsection("Mean patterns, every layer")
        n_pos = int(mosaic.shape[-1])
        report.figure(
            mean_patterns_mosaic(mosaic, res.layers, causal=getattr(res, "causal", True),
                                 max_pos=n_pos),
            f"Mean attention pattern of every head (rows: layers, columns: heads; first {n_pos} "
            "positions, log colour scale): look for a bright first column (a sink), a bright "
            "diagonal (current token) or sub-diagonal (previous token).")
        report.subsection("Per-head table")
        rows = res.to_rows()
        report.table(rows, "per-head statistics (shown: per layer the head with the most "
                           "position-0 mass and the most focused head)", name="attention_heads",
                     show=_informative_head_rows(rows))
        report.subsection("Interactive view")
        self._views(report, res, ctx, results)

    def _views(self, report: Report, res: Any, ctx: ReportContext,
               results: dict[str, Any]) -> None:
        """Every layer's patterns on the first tokens of a few documents, lazily rendered
        circuitsvis views behind a document and a layer selector (layers 0 → L−1; the layers
        that matter marked and the most focused one shown first)."""
        docs = view_documents(ctx)
        packed = results["attention_views"]
        n = int(packed["n"])
        toks = ctx.tokens[: len(docs), :n]  # docs are the first windows (a slice: lazy token files)
        layers = list(range(ctx.view.n_layers))
        strings = [ctx.token_strings(toks[i]) for i in range(len(docs))]
        items = []
        for i, d in enumerate(docs):
            for layer in layers:
                items.append(((str(d), str(layer)), "AttentionPatterns",
                              {"tokens": strings[i], "attention": packed["maps"][i][layer]}))
        feat = featured_layers(res)
        first = next(iter(feat))
        notes = {(1, str(layers[i])): note for i, note in feat.items()}
        for i, kind in enumerate(report.layer_kinds or []):
            if kind == "global" and i < len(layers):
                key = (1, str(layers[i]))
                notes[key] = (notes[key] + ", " if key in notes else "") + "global attention"
        report.view_set(
            items, ["document", "layer"], "patterns",
            f"Attention patterns on the first {n} tokens of {len(docs)} documents (pick a "
            "document and a layer, then hover a token and pick a head): look for heads that "
            "look back one token, copy from an earlier occurrence, or park on position 0.",
            default=(str(docs[0]), str(layers[first])), packed=["attention"],
            standalone=[(str(docs[0]), str(layers[i])) for i in feat],
            option_notes=notes,
            summary=f"Open the interactive attention patterns ({len(docs)} documents × "
                    f"{len(layers)} layers; rendered when opened)")


def packed_view_patterns(cap: dict[int, Any], ctx: ReportContext) -> dict[str, Any]:
    """The views' patterns ``{layer: [doc, head, q, k]}`` as the page holds them: per
    document and layer, :func:`~tl_spectral.viz.report.pack_maps` on [0, 1] (lower triangle
    of a causal model); ``n``: the positions shown."""
    from tl_spectral.viz.report import pack_maps

    layers = list(range(ctx.view.n_layers))
    return {"n": int(cap[0].shape[-1]),
            "maps": [[pack_maps(cap[layer][i], 0.0, 1.0, tri=ctx.view.causal) for layer in layers]
                     for i in range(len(view_documents(ctx)))]}


def view_patterns(ctx: ReportContext) -> dict[int, Any]:
    """The views' pass: every layer's patterns ``[doc, head, q, k]`` on the first tokens
    (at most ``SHOWN_POSITIONS``) of the documents the views show."""
    import torch

    docs = view_documents(ctx)
    n = min([SHOWN_POSITIONS] + [ctx.doc_length(d) for d in docs])
    toks = ctx.tokens[: len(docs), :n]  # docs are the first windows (a slice: lazy token files)
    cap: dict[int, Any] = {}

    def hook_for(layer: int):
        def hook(t, hook=None):
            cap[layer] = t.detach().cpu()
            return t
        return hook

    with torch.no_grad():
        ctx.view.run(toks, fwd_hooks=[(ctx.view.hook_pattern(layer), hook_for(layer))
                                      for layer in range(ctx.view.n_layers)], return_type=None)
    return cap


def head_roles_finding(report: Report, ctx: ReportContext) -> None:
    """ONE finding naming every head a section found doing something, each once with all its
    roles ("L18H8: the most focused head (…); the strongest position-0 head (…)"), placed
    after the sanity findings."""
    if not ctx.head_roles:
        return
    items = sorted(ctx.head_roles.items())
    text = "; ".join(f"L{lay}H{h}: " + ", ".join(roles) for (lay, h), roles in items)
    report.finding(f"Heads that stand out — {text}.", anchor=ctx.sanity.get("heads_anchor"),
                   first=True)


def section_keys() -> tuple[str, ...]:
    """The keys of every registered section, in report order (``--sections``)."""
    return tuple(s.key for s in SECTIONS)


#: what the report's texts cite as [key] (the SPEC is the project's specification,
#: shared/SPEC.md; its parts follow the three papers)
REFERENCES = (
    ("A", "Scale-selective POD of attention fields, arXiv 2606.06573; SPEC part A; "
          "docs/scale_pod.md."),
    ("B", "Routing and filtering structure of attention; S–D attention, arXiv 2605.18826; "
          "SPEC part B (B.1 geometry, B.5 linearization, B.6 cascade allocation); "
          "docs/routing_filtering.md, docs/surgery.md."),
    ("C", "Contribution weights and sink geometry, arXiv 2606.07604; SPEC part C; "
          "docs/contributions.md."),
    ("Gu", "Gu et al., When Attention Sink Emerges in Language Models: An Empirical View, "
           "arXiv 2410.10781 (the key score of a sink)."),
    ("K", "Kobayashi et al., Attention is Not Only a Weight: Analyzing Transformers with "
          "Vector Norms, EMNLP 2020, arXiv 2004.10102 (value-weighted attention)."),
    ("TL", "TransformerLens, transformer_lens.head_detector (previous-token, duplicate-token "
           "and induction head scores)."),
    ("O", "Olsson et al., In-context Learning and Induction Heads, arXiv 2209.11895."),
)


def model_summary(ctx: ReportContext) -> str:
    """One line describing the report's model (layers, heads, widths, causal or not)."""
    v = ctx.view
    kind = "causal" if v.causal else "bidirectional (encoder)"
    return (f"{ctx.name}: {v.n_layers} layers × {v.n_heads} heads, d_model {v.d_model}, "
            f"d_head {v.d_head}, {kind}")


def _zoo_description(name: str) -> Optional[str]:
    """``zoo.describe(name)`` for a zoo model (what it is, how trained, whether quantized)."""
    from tl_spectral.models import zoo

    if name not in zoo.available():
        return None
    return zoo.describe(name).split(": ", 1)[1]


@dataclass
class ReportPlan:
    """What a report runs on the model, declared by its sections before anything runs: the
    probes of the ONE probe pass and the other model passes (:class:`ModelPass`, once per
    key, in section order)."""

    sections: list
    probes: list
    passes: list


def plan_report(ctx: ReportContext, sections: Optional[list[ReportSection]] = None
                ) -> ReportPlan:
    """The plan of a report: every section's probes and model passes (nothing runs)."""
    secs = sections if sections is not None else [f() for f in SECTIONS]
    probes: list[Probe] = [p for s in secs for p in s.probes(ctx)]
    passes: dict[str, ModelPass] = {}
    for s in secs:
        for mp in getattr(s, "passes", lambda c: [])(ctx):
            passes.setdefault(mp.key, mp)
    return ReportPlan(secs, probes, list(passes.values()))


def run_probe_pass(ctx: ReportContext, plan: ReportPlan, batch_size: int = 16,
                   progress: bool = True) -> dict[str, Any]:
    """The plan's probe pass over the context's windows (timed as ``probe pass``)."""
    from tl_spectral.probes import run_probes

    if not plan.probes:
        return {}
    n_docs, T = int(ctx.tokens.shape[0]), int(ctx.tokens.shape[1])
    ctx.status(f"probes: one pass over {n_docs} windows of {T} tokens")
    t = time.perf_counter()
    results = run_probes(ctx.view, ctx.tokens, plan.probes, batch_size=batch_size,
                         progress=progress, attention_mask=ctx.mask)
    ctx.timings["probe pass"] = time.perf_counter() - t
    return results


def run_model_passes(ctx: ReportContext, plan: ReportPlan, results: dict[str, Any]) -> None:
    """The plan's other model passes, in order, each timed as ``pass <key>``; their results
    join ``results``. After this, nothing of the report touches the model."""
    ctx.probe_results = results
    for mp in plan.passes:
        ctx.status(mp.title)
        t = time.perf_counter()
        results[mp.key] = mp.run(ctx)
        ctx.timings[f"pass {mp.key}"] = time.perf_counter() - t
    ctx.baseline_cache.clear()  # the random twin, if one was built: freed before rendering
    ctx.probe_results = {}


def build_report(
    ctx: ReportContext,
    sections: Optional[list[ReportSection]] = None,
    batch_size: int = 16,
    progress: bool = True,
    title: Optional[str] = None,
    results: Optional[dict[str, Any]] = None,
) -> Path:
    """Plan the report, run its probe pass and model passes, render every section from the
    results, write index.html.

    results: the probes' results when they were already computed (e.g. reduced across the
    processes of ``torchrun`` by ``tl-spectral analyze``); then no probe pass runs here."""
    if ctx.options.progress is None:
        ctx.options = dataclasses.replace(ctx.options, progress=progress)
    plan = plan_report(ctx, sections)
    secs = plan.sections
    results = dict(results) if results is not None else run_probe_pass(
        ctx, plan, batch_size=batch_size, progress=progress)
    run_model_passes(ctx, plan, results)
    run_derive(ctx, plan, results)
    return render_report(ctx, secs, results, title=title)


def run_derive(ctx: ReportContext, plan: ReportPlan, results: dict[str, Any]) -> None:
    """Every section's ``derive`` (small results computed from big ones, no model), in
    order, each timed as ``derive <key>``; their results join ``results``. Then every plain
    value is put in the form a re-render reads back (:func:`~tl_spectral.viz.report_state.
    as_saved`), so that the page is the same either way."""
    from tl_spectral.viz.report_state import as_saved

    for s in plan.sections:
        derive = getattr(s, "derive", None)
        if derive is None:
            continue
        t = time.perf_counter()
        results.update(derive(results, ctx))
        ctx.timings[f"derive {s.key}"] = time.perf_counter() - t
    for key in list(results):
        results[key] = as_saved(results[key])


def render_report(ctx: ReportContext, secs: list, results: dict[str, Any],
                  title: Optional[str] = None) -> Path:
    """Render every section from ``results`` (probe, pass and derived results) and write
    the page, then the report's state (``results/report_state.json``: every result the
    renders read, the windows, the model's description; what :func:`rerender` reads)."""
    from tl_spectral.viz.report_state import ReadLog, save_state

    results = ReadLog(results)
    timings: dict[str, float] = ctx.timings
    n_docs, T = int(ctx.tokens.shape[0]), int(ctx.tokens.shape[1])
    seed = ctx.options.meta.get("seed")
    run = f"{n_docs} windows × {T} tokens" + (f", seed {seed}" if seed is not None else "")
    about = _zoo_description(ctx.name)
    report = Report(
        title or f"tl_spectral report — {ctx.name}",
        figure_format=ctx.options.figure_format,
        meta={
            "model": model_summary(ctx),
            **({"about": about} if about else {}),
            "documents": f"{n_docs} windows of {T} tokens"
                         + (f" ({ctx.options.windows})" if ctx.options.windows else ""),
            **ctx.options.meta,
        },
    )
    for s in secs:  # a section's own column definitions (the library's win)
        for term, meaning in getattr(s, "glossary", {}).items():
            report.glossary.setdefault(term, meaning)
    report.figure_suffix = f" [{ctx.name}; {run}]"
    report.references = list(REFERENCES)
    from tl_spectral.viz.layer_plots import kinds_note, layer_kinds

    report.layer_kinds = layer_kinds(ctx.view)
    if report.layer_kinds:
        report.meta["layers"] = kinds_note(ctx.view)
    for s in secs:
        ctx.status(f"section: {s.title}")
        t = time.perf_counter()
        s.render(report, results, ctx)
        timings[f"section {s.key}"] = time.perf_counter() - t
    head_roles_finding(report, ctx)
    report.note(f"Generated by tl-spectral analyze for {ctx.name} on {run}. Every figure, "
                "table and view is about this model only; stored study results come from "
                "tl-spectral study NAME and the docs.")
    report.note("results/ holds what a reload needs (Result.load): per-layer statistics, "
                "spectra and summaries; "
                + ("raw per-query maps are included (--save-raw)." if ctx.save_raw else
                   f"per-position maps are cut to the first {SHOWN_POSITIONS} positions and "
                   "POD modes left out; pass --save-raw to keep them whole."))
    ctx.status("writing index.html")
    t = time.perf_counter()
    index = report.write(ctx.out_dir)
    timings["write"] = time.perf_counter() - t
    t = time.perf_counter()
    save_state(ctx, secs, results, title)
    timings["save state"] = time.perf_counter() - t
    # the phases' times beside the report's summary (benchmarks/report_stages.py reads them)
    rj = ctx.out_dir / "report.json"
    doc = json.loads(rj.read_text(encoding="utf-8"))
    doc["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    rj.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    ctx.status(f"done: {index.name} written")  # (the CLI prints its final path after the swap)
    return index


def rerender(folder: str | Path, out: Optional[str | Path] = None, *,
             progress: bool = False) -> Path:
    """Render the report in ``folder`` again from its saved state (``results/``), without
    its model: the same page as the run wrote (timings aside, in report.json only).

    out: the folder to write (new or empty, or an earlier report, replaced whole); None:
    ``folder`` itself, replaced whole. The page is written into a fresh sibling folder that
    is swapped in at the end. Returns the new ``index.html``. Raises ``ValueError`` for a
    folder without a saved state or a section that is not registered (a plugin missing)."""
    import shutil

    from tl_spectral.outdirs import (
        REPORT_MARKER,
        path_identity,
        swap_in,
        tmp_out_dir,
    )
    from tl_spectral.viz.report_state import read_manifest

    src = Path(folder)
    if not src.is_dir():
        raise ValueError(f"{src} is not a folder; pass a report folder written by "
                         "tl-spectral analyze")
    target = src if out is None else Path(out)
    manifest = read_manifest(src)
    expected = path_identity(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_out_dir(target)
    try:
        ctx, secs, results = _restored(manifest, src, tmp, progress)
        (tmp / "results").mkdir()
        render_report(ctx, secs, results, title=manifest.get("title"))
        if (src / REPORT_MARKER).is_file():
            shutil.copyfile(src / REPORT_MARKER, tmp / REPORT_MARKER)
        swap_in(tmp, target, expected)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target / "index.html"


def _restored(manifest: dict, src: Path, out: Path, progress: bool
              ) -> tuple[ReportContext, list, dict[str, Any]]:
    """The context (the model's description in place of the model, the recorded token
    strings in place of the tokenizer), the sections and the results of a saved state."""
    from tl_spectral.viz.context import ModelDescription, ReportOptions, TokenRecord
    from tl_spectral.viz.report_state import load_results, load_windows

    by_key = {s.key: s for s in SECTIONS}
    missing = [k for k in manifest["sections"] if k not in by_key]
    if missing:
        raise ValueError(f"the report has sections {missing} that are not registered here "
                         "(a plugin that is not installed?); install it, then re-render")
    tokens, mask = load_windows(manifest, src / "results")
    options = dataclasses.replace(ReportOptions.of(manifest["options"]), progress=progress)
    ctx = ReportContext(view=ModelDescription(**manifest["model"]), tokens=tokens,
                        tokenizer=TokenRecord({tuple(k): v for k, v in manifest["token_strings"]}),
                        out_dir=out, results_dir=out / "results", options=options, mask=mask,
                        model_name=manifest.get("model_name"))
    results = load_results(manifest, src / "results")
    return ctx, [by_key[k]() for k in manifest["sections"]], results


load_plugins()  # last: a plugin's section module may import this one
