"""Report section: routing/filtering weight geometry of every head (SPEC B.1, B.3).

Weights only (no probe): ``tl_spectral.geometry.model.model_qk_geometry`` of the report's model
with LayerNorm folded; per-layer table, spectral budget, routing-rank cascade, eigenvalues
in the complex plane, and the per-head table saved as CSV + safetensors under ``results/``.
Models whose heads cannot be read get a paragraph saying which and why instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tl_spectral.viz.context import register_section

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


@register_section
class RoutingFilteringSection:
    """A report section (the ``ReportSection`` protocol: key, title, probes, render)."""

    key = "routing_filtering"
    title = "Routing and filtering (QK weight geometry)"
    order = 30
    #: LayerNorm folded into the weights; rotary models refused (their kernel depends on
    #: the offset: ``model_rotary_geometry``)
    fold_ln = True
    allow_rotary = False

    def probes(self, ctx: ReportContext) -> list:
        return []  # weights only

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        from tl_spectral.geometry.model import (
            UnreadableHeadsError,
            geometry_layer_table,
            model_qk_geometry,
        )

        report.section(self.title)
        ctx.status("routing/filtering: QK geometry of every head")
        fold = self.fold_ln
        try:
            geo = model_qk_geometry(ctx.view, fold_ln=fold, allow_rotary=self.allow_rotary)
        except UnreadableHeadsError as e:
            report.text(f"The QK geometry of this model could not be computed: {e}")
            return
        geo.save(ctx.results_dir / "qk_geometry.safetensors")
        geo.to_csv(ctx.results_dir / "qk_geometry_heads.csv")
        n = geo.n_layers * geo.n_heads
        unstable = int(geo.unstable.sum())
        report.text(
            "For every head, the interaction kernel M = W_Q W_Kᵀ in the residual space "
            f"({'LayerNorm folded' if ctx.view.pre_ln and fold else 'weights as they are'}) "
            "splits into filtering F = (M + Mᵀ)/2 and routing R = (M − Mᵀ)/2. The budget is "
            "‖R‖²/‖M‖² (0.5 for a kernel with no preference); the routing rank is the entropy "
            "effective rank of R (one rotation plane = 2; capacity min(2·d_head, d_model)); a "
            "head is unstable if M has an eigenvalue with positive real part. "
            f"Unstable heads: {unstable} of {n}. Mean routing fraction: "
            f"{float(geo.routing_fraction.mean()):.3f}; mean routing rank "
            f"{float(geo.eff_rank_R.mean()):.2f} of capacity "
            f"{int(geo.routing_capacity.max())}."
        )
        rows = geometry_layer_table(geo)
        report.finding(
            "Routing fraction ‖R‖²/‖M‖² per layer (0.5 = no preference): "
            + ", ".join(f"{r['layer']}: {r['routing_fraction']:.2f}" for r in rows)
            + f"; {unstable} of {n} heads unstable.")
        report.table(rows, "per layer (means over heads)", name="qk_geometry_layers")
        report.figure(geo.plot_budget(), "spectral budget per layer (each dot a head)")
        report.figure(geo.plot_routing_rank(show_capacity=False),
                      "routing rank per layer (the cascade): mean ± std over heads")
        report.figure(geo.plot_eigenvalues(),
                      "eigenvalues of M per head (scaled by each head's largest modulus)")
