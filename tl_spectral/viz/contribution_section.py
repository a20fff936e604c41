"""Report section: contribution statistics, sinks, a signed circuitsvis view and, on request,
faithfulness curves (the figures are in ``contribution_plots.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tl_spectral.probes import ContributionProbe, Probe, SinkProbe
from tl_spectral.viz.context import register_section
from tl_spectral.viz.contribution_plots import (
    plot_faithfulness_areas,
    plot_spearman,
    slim_contribution_stats,
)
from tl_spectral.viz.sink_plots import plot_rho_star, plot_sink_rates
from tl_spectral.viz.views import contribution_view

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


@register_section
class ContributionSection:
    """Report section: contribution statistics, sinks, a signed circuitsvis view, and (with
    ``ctx.options.faithfulness_docs > 0``) faithfulness curves on that many documents."""

    key = "contributions"
    title = "Contribution weights and attention sinks"
    order = 40

    def probes(self, ctx: "ReportContext") -> list[Probe]:
        return [ContributionProbe(keep_docs=[0]), SinkProbe()]

    def render(self, report: "Report", results: dict[str, Any], ctx: "ReportContext") -> None:
        ctx.status("contributions and sinks: tables and figures")
        stats = results["contributions"]
        sinks = results["sinks"]
        view_layer = stats.layers[-1]
        n_view = min(64, ctx.doc_length(0))
        (stats if ctx.save_raw or not stats.kept_maps else
         slim_contribution_stats(stats, view_layer, n_view)).save(
            ctx.results_dir / "contribution_stats.safetensors")
        sinks.save(ctx.results_dir / "sink_stats.safetensors")
        report.section(self.title)
        report.text(
            "Contribution weights c_ij = ⟨o_i, α_ij ṽ_j⟩ / ‖o_i‖² (inter-head; token level "
            "C_ij = Σ_h c_ij^h, rows sum to 1) measure how much of each output a source "
            "actually supplies, and can be negative. Compared with raw attention α, "
            "value-weighted α‖ṽ‖ and output-normalized α‖ṽ‖/‖o‖.")
        rows = stats.summary_rows()
        sink_rows = sinks.summary_rows()
        pos = int(getattr(sinks, "sink_index", 0))
        tok0 = ""
        if ctx.tokens is not None and ctx.tokenizer is not None:
            tok0 = f" ({ctx.token_strings(ctx.tokens[0, pos:pos + 1])[0]!r} in document 0)"
        if rows:
            best = max(range(len(rows)), key=lambda i: rows[i]["attn_on_first_token"])
            r = rows[best]
            is_sink = r["attn_on_first_token"] >= 0.2
            report.finding(
                f"Position {pos}{tok0} {'is a sink' if is_sink else 'is not a strong sink'}: "
                f"in layer {r['layer']} it draws {100 * r['attn_on_first_token']:.0f}% of the "
                f"attention but supplies {100 * r['C_on_first_token']:.0f}% of the output "
                f"(token-level contribution); over layers the attention share runs "
                f"{100 * min(x['attn_on_first_token'] for x in rows):.0f}–"
                f"{100 * max(x['attn_on_first_token'] for x in rows):.0f}%.")
            neg = max(rows, key=lambda x: x["neg_mass_share"])
            report.finding(
                f"Negative contributions: up to {100 * neg['neg_mass_share']:.0f}% of the "
                f"contribution mass is negative (layer {neg['layer']}).")
        report.subsection("Contributions")
        report.table(rows, "per layer: negative shares, position-0 contribution vs attention, "
                           "Spearman with c", name="contributions_layers")
        report.figure(stats.plot_source(), "mean contribution and attention by source position")
        report.figure(stats.plot_lag(), "mean contribution and attention by lag")
        report.figure(stats.plot_negative(), "share of negative contribution (layer × head)")
        report.figure(plot_spearman(stats), "rank correlation of each attention-only measure "
                                            "with the contribution")
        report.subsection("Attention sinks")
        report.table(sink_rows, "sink statistics per layer", name="sinks_layers")
        report.figure(plot_sink_rates(sinks), "sink rate and Gu key score (layer × head), colour "
                                              "scales spanning the data")
        report.figure(plot_rho_star(sinks), "optimal sink rate ρ* and observed α_i0")
        report.figure(sinks.plot_anti_alignment(), "anti-alignment cos(ṽ_0, s_i)")
        if stats.kept_maps:
            report.subsection("Interactive view")
            ctx.status("contributions: interactive view")
            maps = stats.maps(view_layer, 0)
            n = int(stats.kept_mask[0].sum())
            toks = ctx.token_strings(stats.kept_tokens[0, :n])
            view = contribution_view(maps, toks, causal=stats.causal, max_tokens=64,
                                     clip_quantile=0.99)
            report.circuitsvis(view, f"contributions-layer-{view_layer}",
                               f"contribution weights of layer {view_layer}, document 0 (red = "
                               "positive, blue = negative; symmetric limits at the 99th "
                               "percentile of |c|; last panel = Σ heads)")
        n_f = int(ctx.options.faithfulness_docs)
        report.subsection("Faithfulness")
        if n_f > 0:
            from tl_spectral.probes.faithfulness import faithfulness

            ctx.status(f"faithfulness curves on {n_f} documents")
            res = faithfulness(ctx.view, ctx.tokens[:n_f])
            res.save(ctx.results_dir / "faithfulness.safetensors")
            report.figure(res.plot_curves(), "faithfulness curves")
            report.figure(plot_faithfulness_areas(res), "faithfulness areas per measure")
            report.table(res.table(0), "faithfulness areas, all layers",
                         name="faithfulness_all_layers")
            report.table(res.table(1), f"faithfulness areas, layer {res.layer}",
                         name="faithfulness_layer")
        else:
            report.text("Faithfulness curves: not computed (pass --faithfulness-docs N to "
                        "tl-spectral analyze to compute them on N documents).")
