"""Report section: contribution statistics, sinks, a signed circuitsvis view and, on request,
faithfulness curves (the figures are in ``contribution_plots.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tl_spectral.probes import ContributionProbe, Probe, SinkProbe
from tl_spectral.viz.context import ModelPass, register_section
from tl_spectral.viz.contribution_plots import (
    plot_faithfulness_areas,
    plot_spearman,
    slim_contribution_stats,
)
from tl_spectral.viz.sink_plots import plot_rho_star

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


def faithfulness_pass(ctx: "ReportContext") -> Any:
    """The faithfulness pass: curves on the first ``faithfulness_docs`` windows."""
    from tl_spectral.probes.faithfulness import faithfulness

    n_f = int(ctx.options.faithfulness_docs)
    toks = ctx.tokens[:n_f]  # every token real unless the context says otherwise:
    mask = (ctx.mask[:n_f] if ctx.mask is not None  # never inferred from a pad id
            else torch.ones(tuple(toks.shape), dtype=torch.bool))
    return faithfulness(ctx.view, toks, attention_mask=mask)


@register_section
class ContributionSection:
    """Report section: contribution statistics, sinks, a signed circuitsvis view, and (with
    ``ctx.options.faithfulness_docs > 0``) faithfulness curves on that many documents."""

    key = "contributions"
    title = "Contribution weights and attention sinks"
    order = 40

    def probes(self, ctx: "ReportContext") -> list[Probe]:
        from tl_spectral.viz.context import SHOWN_POSITIONS, view_documents

        return [ContributionProbe(keep_docs=view_documents(ctx),
                                  keep_positions=None if ctx.save_raw else SHOWN_POSITIONS),
                SinkProbe()]

    def passes(self, ctx: "ReportContext") -> list[ModelPass]:
        n_f = int(ctx.options.faithfulness_docs)
        if n_f <= 0:
            return []
        return [ModelPass("faithfulness", f"faithfulness curves on {n_f} documents",
                          faithfulness_pass)]

    def derive(self, results: dict[str, Any], ctx: "ReportContext") -> dict[str, Any]:
        """The statistics kept in ``results/`` (the kept maps cut to the first document's
        view layer unless ``save_raw``) and the views' signed maps packed as the page shows
        them (None without kept maps)."""
        stats = results["contributions"]
        rows0 = stats.to_rows()
        # the layer shown first (and kept in results/): the one drawing most attention to
        # position 0 (the sink layer), else the last
        view_layer = (max(rows0, key=lambda r: r["attn_on_first_token"])["layer"] if rows0
                      else stats.layers[-1])
        n_view = min(64, ctx.doc_length(0))
        kept = (stats if ctx.save_raw or not stats.kept_maps else
                slim_contribution_stats(stats, view_layer, n_view))
        return {"contributions_kept": kept,
                "contribution_views": packed_contribution_views(stats, view_layer)
                if stats.kept_maps else None}

    def render(self, report: "Report", results: dict[str, Any], ctx: "ReportContext") -> None:
        ctx.status("contributions and sinks: tables and figures")
        stats = results["contributions_kept"]
        sinks = results["sinks"]
        stats.save(ctx.results_dir / "contribution_stats.safetensors")
        sinks.save(ctx.results_dir / "sink_stats.safetensors")
        report.section(self.title)
        report.text(
            "Contribution weights c_ij = ⟨o_i, α_ij ṽ_j⟩ / ‖o_i‖² (inter-head; token level "
            "C_ij = Σ_h c_ij^h, rows sum to 1) measure how much of each output a source "
            "actually supplies, and can be negative (SPEC C.1 [C]). Compared with raw attention "
            "α, value-weighted α‖ṽ‖ [K] and output-normalized α‖ṽ‖/‖o‖ (SPEC C.2 [C]).")
        rows = stats.to_rows()
        sink_rows = sinks.to_rows()
        pos = int(getattr(sinks, "sink_index", 0))
        tok0 = ""
        if ctx.tokens is not None and ctx.tokenizer is not None:
            tok0 = f" ({ctx.token_strings(ctx.tokens[0, pos:pos + 1])[0]!r} in document 0)"
        if rows:
            best = max(range(len(rows)), key=lambda i: rows[i]["attn_on_first_token"])
            r = rows[best]
            is_sink = r["attn_on_first_token"] >= 0.2
            n_docs, T = int(ctx.tokens.shape[0]), int(ctx.tokens.shape[1])
            report.finding(
                f"Position {pos}{tok0} {'is a sink' if is_sink else 'is not a strong sink'}: "
                f"in layer {r['layer']} it draws {100 * r['attn_on_first_token']:.0f}% of the "
                f"attention but supplies {100 * r['C_on_first_token']:.0f}% of the output "
                f"(token-level contribution); over layers the attention share runs "
                f"{100 * min(x['attn_on_first_token'] for x in rows):.0f}–"
                f"{100 * max(x['attn_on_first_token'] for x in rows):.0f}% (n = {n_docs} "
                f"windows of {T} tokens, one framing: position {pos} is each window's own "
                f"token {pos}; a sink's share can change with what that token is, which this "
                "report does not vary).")
            neg = max(rows, key=lambda x: x["neg_mass_share"])
            share = 100 * neg["neg_mass_share"]
            report.finding(
                f"Negative contributions: up to {share:.2g}% of the contribution mass is "
                f"negative (layer {neg['layer']})"
                + (": negligible." if share < 1 else "."))
        report.subsection("Contributions")
        vw, on = "spearman_value_weighted_vs_c", "spearman_output_normalized_vs_c"
        skip: tuple = ()
        gap = max((abs(r[vw] - r[on]) for r in rows), default=1.0) \
            if rows and vw in rows[0] and on in rows[0] else 1.0
        if gap < 1e-4:  # equal by construction, up to float rounding of near-ties
            skip = ("output_normalized",)
            rows = [{k: v for k, v in r.items() if k != on} for r in rows]
            report.text(
                "The output-normalized measure α‖ṽ‖/‖o‖ divides each query's value-weighted row "
                "α‖ṽ‖ by one number ‖o_i‖, so within a row both rank the sources identically "
                "and their token-level Spearman correlations with c are equal by construction "
                f"(here to {gap:.1g}, float rounding of near-ties): shown once, as the "
                "value-weighted column.")
        report.table(rows, "per layer: negative shares, position-0 contribution vs attention, "
                           "Spearman with c", name="contributions_layers")
        report.figure(stats.plot_source(), "Mean contribution and attention by source position: look for positions "
                      "(position 0 above all) that draw far more attention than they supply.")
        report.figure(stats.plot_lag(), "Mean contribution and attention by lag: look for the lags where the two "
                      "curves part (attention there misstates what the source supplies).")
        report.figure(stats.plot_negative(), "Share of negative contribution per head: look for heads whose sources "
                      "often cancel each other (bright).")
        report.figure(plot_spearman(stats, skip), "Rank correlation of each attention-only measure "
                                            "with the contribution: look for layers where it "
                                            "drops (attention there misstates what sources "
                                            "supply).")
        report.subsection("Attention sinks")
        report.table(sink_rows, "sink statistics per layer", name="sinks_layers")
        self._sink_rates(report, sinks, results.get("attention_stats_shown"))
        report.figure(plot_rho_star(sinks), "Optimal sink rate ρ* against the observed α_i0: points below the "
                      "diagonal are queries that put more attention on the sink than would "
                      "be optimal.")
        report.figure(sinks.plot_anti_alignment(), "Anti-alignment cos(ṽ_0, s_i) of the sink's value with the rest of the "
                      "output: look for values near −1 (the sink cancels the other sources).")
        views = results["contribution_views"]
        if views:
            report.subsection("Interactive view")
            ctx.status("contributions: interactive views")
            self._views(report, views, ctx)
        self._faithfulness(report, results, ctx)

    @staticmethod
    def _faithfulness(report: "Report", results: dict[str, Any], ctx: "ReportContext") -> None:
        """The faithfulness curves of the pass (``--faithfulness-docs``), or how to get them."""
        report.subsection("Faithfulness")
        if int(ctx.options.faithfulness_docs) <= 0:
            report.text("Faithfulness curves: not computed (pass --faithfulness-docs N to "
                        "tl-spectral analyze to compute them on N documents).")
            return
        res = results["faithfulness"]
        res.save(ctx.results_dir / "faithfulness.safetensors")
        report.figure(res.plot_curves(), "Faithfulness curves: the better measure changes the "
                      "output more when its top sources are removed and less when only they "
                      "are kept.")
        report.figure(plot_faithfulness_areas(res), "Faithfulness areas per measure: look for "
                      "the measure with the highest comprehensiveness and the lowest "
                      "sufficiency area.")
        report.table(res.to_rows(0), "faithfulness areas, all layers",
                     name="faithfulness_all_layers")
        report.table(res.to_rows(1), f"faithfulness areas, layer {res.layer}",
                     name="faithfulness_layer")

    def _sink_rates(self, report: "Report", sinks: Any, att: Any) -> None:
        """The sink rate, the Gu key score and the first-token mass, shown ONCE when they
        coincide (equal-length windows), else side by side."""
        import numpy as np

        from tl_spectral.viz.multiples import heads_by_layer_figure

        rate = sinks.sink_rate.float().numpy()
        key = sinks.key_score.float().numpy()
        diff = float(np.abs(rate - key).max()) if rate.size else 0.0
        same_att = att is not None and att.first_token_mass.shape == sinks.sink_rate.shape and \
            float((att.first_token_mass.float() - sinks.sink_rate.float()).abs().max()) < 1e-5
        marks = sinks.sink_head.numpy()
        pos = int(getattr(sinks, "sink_index", 0))
        if diff < 1e-5:
            report.text(
                f"Here the sink rate mean_i α_i{pos}, the Gu key score [Gu] of position {pos} and "
                + ("the attention statistics' position-0 mass " if same_att else "")
                + f"are one number (largest difference {diff:.1g}): on windows of equal length "
                "every document weighs the same, so the mean over documents of the per-document "
                "mean (the key score) equals the mean over all queries (the sink rate). It is "
                "shown once; they differ only on windows of different lengths.")
            panels = [{"values": rate, "title": f"sink rate = Gu key score of position {pos}, "
                                                "scale [0, 1]",
                       "vmin": 0.0, "vmax": 1.0, "cmap": "magma", "cbar": "share",
                       "marks": marks, "mark_label": f"sink head (key score > {sinks.threshold})"}]
        else:
            panels = [{"values": rate, "title": f"sink rate mean_i α_i{pos}, scale [0, 1]",
                       "vmin": 0.0, "vmax": 1.0, "cmap": "magma", "cbar": "share"},
                      {"values": key, "title": f"Gu key score of position {pos}, scale [0, 1]",
                       "vmin": 0.0, "vmax": 1.0, "cmap": "magma", "cbar": "share",
                       "marks": marks, "mark_label": f"sink head (key score > {sinks.threshold})"}]
        report.figure(heads_by_layer_figure(panels, sinks.layers, ncols=2),
                      "Look for bright heads: they put most of their attention on position "
                      f"{pos} (sinks); dots mark the heads above the sink threshold.")

    def _views(self, report: "Report", views: dict, ctx: "ReportContext") -> None:
        """Signed contribution maps of every layer for the kept documents, lazily rendered
        behind a document and a layer selector (layers 0 → L−1, the sink layer first)."""
        items, strings = [], {}
        for it in views["items"]:
            ids = tuple(it["token_ids"])
            if ids not in strings:
                strings[ids] = ctx.token_strings(list(ids))
            H = int(it["heads"])
            names = [f"H{h}" for h in range(H)] + ["Σ heads"]
            lim = it["lim"]
            items.append(((it["doc"], it["layer"]), "AttentionHeads", {
                "attention": it["attention"],
                "tokens": strings[ids], "attentionHeadNames": names,
                "maxValue": lim, "minValue": -lim, "negativeColor": "blue",
                "positiveColor": "red", "maskUpperTri": bool(views["causal"])}))
        docs, first, n = views["docs"], views["first"], views["n"]
        report.view_set(
            items, ["document", "layer"], "contributions",
            f"Contribution weights c_ij of every layer on the first {n} tokens (red = positive, "
            "blue = negative, symmetric limits at the 99th percentile of |c| of each view; last "
            "panel = Σ heads): look for sources that draw attention but supply little (pale "
            "where the pattern is bright) and for blue, destructive sources.",
            default=(str(docs[0]), str(first)), packed=["attention"],
            standalone=[(str(docs[0]), str(first))],
            option_notes={(1, str(first)): "most attention on position 0"},
            summary=f"Open the interactive contribution maps ({len(docs)} documents × "
                    f"{views['n_layers']} layers; rendered when opened)")


def packed_contribution_views(stats: Any, first: int) -> dict[str, Any]:
    """The contribution views' data: per kept document (its first 64 real tokens) and
    layer, each head's signed map and the heads' sum packed on ±(99th percentile of |c|)
    (:func:`~tl_spectral.viz.report.pack_maps`), with the token ids; ``first``: the layer
    shown first."""
    from tl_spectral.viz.report import pack_maps

    items = []
    n_docs = int(stats.kept_mask.shape[0])
    docs = [int(d) for d in stats.kept_docs.tolist()] if stats.kept_docs is not None \
        else list(range(n_docs))
    n = 0
    for di in range(n_docs):
        n = int(stats.kept_mask[di].sum())
        n = min(n, 64)
        ids = [int(t) for t in stats.kept_tokens[di, :n].tolist()]
        for layer in stats.layers:
            maps = stats.maps(layer, di)
            per_head = maps.measure("contribution")[0]
            m = torch.cat([per_head, maps.token_level("contribution")[0]]).float()[:, :n, :n]
            lim = float(torch.quantile(m.abs().flatten(), 0.99)) or 1.0
            items.append({"doc": str(docs[di]), "layer": str(layer), "token_ids": ids,
                          "heads": int(per_head.shape[0]), "lim": lim,
                          "attention": pack_maps(m, -lim, lim, tri=stats.causal)})
    return {"docs": docs, "first": first, "n": n, "n_layers": len(stats.layers),
            "causal": bool(stats.causal), "items": items}
