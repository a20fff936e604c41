"""Views of contribution weights, faithfulness and sinks; the report section.

Signed maps in circuitsvis. ``contribution_view`` shows a contribution map with
``circuitsvis.attention.attention_heads`` (one small heat map per head, plus the token level
``C = Σ_h c`` as the last "head"): positive values in red, negative values (destructive
interference) in blue, white at 0, with symmetric limits ``±lim`` so equal magnitudes get
equal colour depth. ``lim`` is the largest |value| over the shown maps, or with
``clip_quantile < 1`` that quantile of |value| (a sink column can otherwise wash out the
rest; values beyond are shown at full depth). Raw attention and the other non-negative
baselines are shown the same way (they are simply never blue).

The study of docs/contributions.md is ``tl-spectral study contributions`` (the
``tl_spectral_studies`` package).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from tl_spectral.analysis.contributions import ContributionMaps
from tl_spectral.probes import ContributionProbe, Probe, SinkProbe

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report

# ----------------------------------------------------------------------------- views
def contribution_view(
    maps: ContributionMaps,
    tokens: Sequence[str],
    batch: int = 0,
    measure: str = "contribution",
    *,
    causal: bool = True,
    clip_quantile: float = 1.0,
    max_tokens: Optional[int] = None,
):
    """circuitsvis ``attention_heads`` view of one document's signed map.

    maps: ``ContributionMaps``; tokens: the document's token strings; measure: one of
    ``MEASURES``; the heads are followed by the token level (sum over heads). Red =
    positive, blue = negative, symmetric limits (see module doc). Returns a circuitsvis
    ``RenderedHTML``.
    """
    import circuitsvis as cv

    if not 0 < clip_quantile <= 1:
        raise ValueError(f"clip_quantile must be in (0, 1], got {clip_quantile}")
    per_head = maps.measure(measure)[batch]  # [H, q, k]
    token = maps.token_level(measure)[batch]  # [1, q, k]
    m = torch.cat([per_head, token]).detach().float().cpu()
    n = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
    m = m[:, :n, :n]
    a = m.abs().flatten()
    lim = float(a.max()) if clip_quantile == 1 else float(torch.quantile(a, clip_quantile))
    lim = lim or 1.0
    names = [f"{measure} H{h}" for h in range(per_head.shape[0])] + [f"{measure} Σ heads"]
    return cv.attention.attention_heads(
        attention=m.clamp(-lim, lim), tokens=list(tokens[:n]), attention_head_names=names,
        max_value=lim, min_value=-lim, positive_color="red", negative_color="blue",
        mask_upper_tri=causal,
    )


def plot_faithfulness_areas(res: Any):
    """Bars of the comprehensiveness and sufficiency areas per measure and setting."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    M, S = len(res.measures), len(res.settings)
    w = 0.8 / S
    for ax, (title, areas) in zip(axes, (("comprehensiveness area (higher = better)",
                                          res.comprehensiveness_area),
                                         ("sufficiency area (lower = better)",
                                          res.sufficiency_area))):
        for si, sname in enumerate(res.settings):
            ax.bar(torch.arange(M).numpy() + si * w, areas[si].numpy(), width=w, label=sname)
        ax.set_xticks(torch.arange(M).numpy() + 0.4 - w / 2, res.measures, rotation=35,
                      ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- report
class ContributionSection:
    """Report section: contribution statistics, sinks, a signed circuitsvis view, and (with
    ``ctx.options["faithfulness_docs"] > 0``) faithfulness curves on that many documents."""

    key = "contributions"
    title = "Contribution weights and attention sinks"

    def probes(self, ctx: "ReportContext") -> list[Probe]:
        return [ContributionProbe(keep_docs=[0]), SinkProbe()]

    def render(self, report: "Report", results: dict[str, Any], ctx: "ReportContext") -> None:
        stats = results["contributions"]
        sinks = results["sinks"]
        stats.save(ctx.results_dir / "contribution_stats.safetensors")
        sinks.save(ctx.results_dir / "sink_stats.safetensors")
        report.section(self.title)
        report.text(
            "Contribution weights c_ij = ⟨o_i, α_ij ṽ_j⟩ / ‖o_i‖² (inter-head; token level "
            "C_ij = Σ_h c_ij^h, rows sum to 1) measure how much of each output a source "
            "actually supplies, and can be negative. Compared with raw attention α, "
            "value-weighted α‖ṽ‖ and output-normalized α‖ṽ‖/‖o‖."
        )
        report.table(stats.summary_rows(), "per layer: negative shares, first-token "
                                           "contribution vs attention, Spearman with c")
        report.figure(stats.plot_source(), "mean contribution and attention by source position")
        report.figure(stats.plot_lag(), "mean contribution and attention by lag")
        report.figure(stats.plot_negative(), "share of negative contribution (layer × head)")
        report.figure(stats.plot_rank_corr(), "rank correlation between the measures")
        report.table(sinks.summary_rows(), "sink statistics per layer")
        report.figure(sinks.plot_rates(), "sink rate and Gu key score (layer × head)")
        report.figure(sinks.plot_rho_star(), "optimal sink rate ρ* and observed α_i0")
        report.figure(sinks.plot_anti_alignment(), "anti-alignment cos(ṽ_0, s_i)")
        if stats.kept_maps:
            layer = stats.layers[-1]
            maps = stats.maps(layer, 0)
            n = int(stats.kept_mask[0].sum())
            toks = ctx.token_strings(stats.kept_tokens[0, :n])
            view = contribution_view(maps, toks, causal=stats.causal, max_tokens=64,
                                     clip_quantile=0.99)
            report.circuitsvis(view, f"contributions-layer-{layer}",
                               f"contribution weights of layer {layer}, document 0 (red = "
                               "positive, blue = negative; symmetric limits at the 99th "
                               "percentile of |c|; last panel = Σ heads)")
        n_f = int(ctx.options.get("faithfulness_docs", 0))
        if n_f > 0:
            from tl_spectral.probes.faithfulness import faithfulness

            res = faithfulness(ctx.view, ctx.tokens[:n_f])
            res.save(ctx.results_dir / "faithfulness.safetensors")
            report.figure(res.plot_curves(), "faithfulness curves")
            report.table(res.table(0), "faithfulness areas, all layers")
            report.table(res.table(1), f"faithfulness areas, layer {res.layer}")
        else:
            report.text("Faithfulness curves: not computed (pass --faithfulness-docs N to "
                        "tl-spectral analyze to compute them on N documents).")
