"""Report section: routing/filtering weight geometry of every head (SPEC B.1, B.3).

Weights only (no probe): ``tl_spectral.geometry.model.model_qk_geometry`` of the report's model
with LayerNorm folded; per-layer table, spectral budget, routing-rank cascade, eigenvalues
in the complex plane, and the per-head table saved as CSV + safetensors under ``results/``.
Models whose heads cannot be read get a paragraph saying which and why instead.
"""

from __future__ import annotations

from pathlib import Path
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
        if ctx.view.positional == "rotary":
            self._rotary(report, ctx, fold)
            return
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
            "head is unstable if M has an eigenvalue with positive real part (SPEC B.1 [B]). "
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
        report.figure(geo.plot_budget(),
                      "Spectral budget per layer (each dot a head): above 0.5 a head routes "
                      "(moves information between positions), below it filters.")
        report.figure(geo.plot_routing_rank(show_capacity=False),
                      "Routing rank per layer (mean ± std over heads): look for the cascade, "
                      "a rank that grows with depth.")
        report.figure(geo.plot_eigenvalues(),
                      "Eigenvalues of M per head (scaled by each head's largest modulus): "
                      "eigenvalues with a positive real part mark unstable heads.")

    def _rotary(self, report: Report, ctx: ReportContext, fold: bool) -> None:
        """Rotary models: the kernel depends on the offset Δ = j − i, M(Δ) = W_Q R(Δ) W_Kᵀ
        (tl_spectral.geometry.rotary): routing fraction against the offset per layer, and its
        average over the causal offset distribution of the report's windows."""
        from tl_spectral.geometry.model import UnreadableHeadsError, model_rotary_geometry
        from tl_spectral.viz.multiples import heads_by_layer_figure

        T = int(ctx.tokens.shape[1])
        ctx.status("routing/filtering: offset-resolved rotary geometry of every head")
        try:
            # spectra at Δ = 0 only: the report shows energies, which the stored
            # trigonometric forms give exactly at any offset (geo.energies)
            geo = model_rotary_geometry(ctx.view, fold_ln=fold, n_ctx=T, offsets=[0],
                                        distribution="causal" if ctx.view.causal else "uniform",
                                        average_ranks=False)
        except UnreadableHeadsError as e:
            report.text(f"The rotary QK geometry of this model could not be computed: {e}")
            return
        lags = _lag_grid(T)
        rf = geo.energies([-x for x in lags])["routing_fraction"]  # [layer, head, n]
        if ctx.save_raw:
            geo.save(ctx.results_dir / "rotary_qk_geometry.safetensors")
        _write_head_csv(geo, ctx.results_dir / "rotary_qk_geometry_heads.csv")
        hl = geo.headline()
        mrf = rf.mean(1)
        rows = [{"layer": i, "routing_fraction_at_0": hl["routing_fraction_at_0"][i],
                 "mean_routing_fraction": hl["mean_routing_fraction"][i],
                 "min_over_offsets": float(mrf[i].min()),
                 "max_over_offsets": float(mrf[i].max())} for i in range(geo.n_layers)]
        dist = geo.distribution
        report.text(
            "This model has rotary positions, so its query–key kernel depends on the offset "
            "Δ = j − i between key and query: M(Δ) = W_Q R(Δ) W_Kᵀ with R(Δ) the rotation of "
            "each rotary frequency pair (docs/routing_filtering.md, SPEC B.1 with RoPE [B]). The "
            "routing fraction ‖R_skew(Δ)‖²/‖M(Δ)‖² (0.5 = no preference) is computed exactly "
            f"at every offset, and averaged over the {dist} offset distribution of the "
            f"report's {T}-token windows (the share of routing in the kernel's energy over "
            "the pairs attention actually sees). "
            + ("LayerNorm folded." if ctx.view.pre_ln and fold else ""))
        mr = geo.mean_routing_fraction
        report.finding(
            f"Routing fraction of the rotary kernels averaged over the {dist} offsets of "
            f"{T}-token windows: {float(mr.mean()):.2f} over all heads (layers "
            f"{float(mr.mean(1).min()):.2f}–{float(mr.mean(1).max()):.2f}; 0.5 = no "
            "preference).")
        report.table(rows, "per layer (means over heads): routing fraction at Δ = 0, averaged "
                           f"over the {dist} offsets, and its range over offsets",
                     name="rotary_geometry_layers")
        report.figure(_routing_vs_offset(lags, mrf.double().numpy()),
                      "Head-mean routing fraction of every layer against the lag (white = 0.5, "
                      "no preference): look for layers whose routing share changes with "
                      "distance (rows that change colour from left to right).")
        report.figure(heads_by_layer_figure([
            {"values": mr.numpy(), "title": f"routing fraction averaged over {dist} offsets, "
                                            "scale [0, 1]", "vmin": 0.0, "vmax": 1.0,
             "cmap": "RdBu_r", "cbar": "‖R‖²/‖M‖²"},
            {"values": geo._at_zero().numpy(), "title": "routing fraction at Δ = 0, scale "
                                                        "[0, 1]", "vmin": 0.0, "vmax": 1.0,
             "cmap": "RdBu_r", "cbar": "‖R‖²/‖M‖²"},
        ], list(range(geo.n_layers)), ncols=2),
            "Per head: red heads route (antisymmetric kernels move information between "
            "positions), blue heads filter (symmetric kernels match like with like).")


def _lag_grid(T: int) -> list[int]:
    """Lags 0 … T − 1: every lag up to 8, then about 24 log-spaced ones."""
    import numpy as np

    grid = set(range(min(T, 9)))
    if T > 9:
        grid |= {int(round(x)) for x in np.geomspace(9, T - 1, 24)}
    return sorted(grid)


def _write_head_csv(geo: Any, path: Any) -> None:
    """The per-head distribution averages (``geo.head_table()``) as CSV."""
    import csv

    cols = geo.head_table()
    keys = list(cols)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for row in zip(*(cols[k] for k in keys)):
            w.writerow(row)


def _routing_vs_offset(lags: list, rf: Any):
    """Layers × lag heat map of the head-mean routing fraction ``rf [layer, lag]`` (lag on a
    log axis, full range [0, 1])."""
    import numpy as np

    from tl_spectral.viz.multiples import layer_log_mesh

    x = np.asarray(lags, dtype=float) + 1
    edges = np.concatenate([[x[0] / 1.25], np.sqrt(x[1:] * x[:-1]), [x[-1] * 1.25]])
    return layer_log_mesh(edges, rf, [str(i) for i in range(rf.shape[0])], cmap="RdBu_r",
                          xlabel="lag i − j + 1 (tokens, log)",
                          title="head-mean routing fraction ‖R_skew(Δ)‖²/‖M(Δ)‖² against the lag",
                          cbar_label="routing fraction (full range [0, 1])")
