"""Report section: routing/filtering weight geometry of every head (SPEC B.1, B.3).

Weights only (no probe): ``tl_spectral.geometry.model.model_qk_geometry`` of the report's model
with its pre-attention normalization folded (LayerNorm or RMSNorm, named from the model); per-layer table, spectral budget, routing-rank cascade, eigenvalues
in the complex plane, and the per-head table saved as CSV + safetensors under ``results/``.
Models whose heads cannot be read get a paragraph saying which and why instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tl_spectral.viz.context import ModelPass, register_section

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

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        if ctx.view.positional == "rotary":
            return [ModelPass("rotary_qk_geometry", "routing/filtering: offset-resolved "
                              "rotary geometry of every head", self.rotary_geometry)]
        return [ModelPass("qk_geometry", "routing/filtering: QK geometry of every head",
                          self.geometry)]

    def geometry(self, ctx: ReportContext) -> Any:
        """The weights pass of a model with standard positions: ``model_qk_geometry``, or
        why its heads cannot be read (a str)."""
        from tl_spectral.geometry.model import UnreadableHeadsError, model_qk_geometry

        try:
            return model_qk_geometry(ctx.view, fold_ln=self.fold_ln,
                                     allow_rotary=self.allow_rotary)
        except UnreadableHeadsError as e:
            return str(e)

    def rotary_geometry(self, ctx: ReportContext) -> Any:
        """The weights pass of a rotary model: ``model_rotary_geometry`` over the report's
        window length (the report shows energies and routing fractions, which the stored
        trigonometric forms give exactly at any offset; the singular values at Δ = 0 only
        with ``--save-raw``, which keeps the whole result), or why it cannot run (a str)."""
        from tl_spectral.geometry.model import UnreadableHeadsError, model_rotary_geometry

        try:
            return model_rotary_geometry(
                ctx.view, fold_ln=self.fold_ln, n_ctx=int(ctx.tokens.shape[1]), offsets=[0],
                distribution="causal" if ctx.view.causal else "uniform",
                average_ranks=False, spectra=ctx.save_raw)
        except UnreadableHeadsError as e:
            return str(e)

    def derive(self, results: dict[str, Any], ctx: ReportContext) -> dict[str, Any]:
        """Rotary models: what the section shows of the offset-resolved geometry (the
        head-mean routing fraction at the shown offsets, the per-layer headline, the per-head
        maps and table): a flat dict of tensors and plain values, or the pass's reason."""
        if ctx.view.positional != "rotary":
            return {}
        geo = results["rotary_qk_geometry"]
        if isinstance(geo, str):
            return {"rotary_geometry_shown": geo}
        lags = _lag_grid(int(ctx.tokens.shape[1]))
        rf = geo.energies([-x for x in lags])["routing_fraction"]  # [layer, head, n]
        return {"rotary_geometry_shown": {
            "lags": lags, "mrf": rf.mean(1).contiguous(), "headline": geo.headline(),
            "mean_rf": geo.mean_routing_fraction.contiguous(),
            "rf0": geo._at_zero().contiguous(), "distribution": geo.distribution,
            "n_layers": int(geo.n_layers), "head_table": geo.head_table()}}

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        from tl_spectral.geometry.model import geometry_layer_table

        report.section(self.title)
        fold = self.fold_ln
        if ctx.view.positional == "rotary":
            if ctx.save_raw and not isinstance(results["rotary_qk_geometry"], str):
                results["rotary_qk_geometry"].save(
                    ctx.results_dir / "rotary_qk_geometry.safetensors")
            self._rotary(report, ctx, fold, results["rotary_geometry_shown"])
            return
        geo = results["qk_geometry"]
        if isinstance(geo, str):
            report.text(f"The QK geometry of this model could not be computed: {geo}")
            return
        geo.save(ctx.results_dir / "qk_geometry.safetensors")
        geo.to_csv(ctx.results_dir / "qk_geometry_heads.csv")
        n = geo.n_layers * geo.n_heads
        unstable = int(geo.unstable.sum())
        report.text(
            "For every head, the interaction kernel M = W_Q W_Kᵀ in the residual space "
            f"({norm_folded(ctx.view) if fold else 'weights as they are'}) "
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

    def _rotary(self, report: Report, ctx: ReportContext, fold: bool, geo: Any) -> None:
        """Rotary models: the kernel depends on the offset Δ = j − i, M(Δ) = W_Q R(Δ) W_Kᵀ
        (tl_spectral.geometry.rotary): routing fraction against the offset per layer, and its
        average over the causal offset distribution of the report's windows."""
        T = int(ctx.tokens.shape[1])
        if isinstance(geo, str):
            report.text(f"The rotary QK geometry of this model could not be computed: {geo}")
            return
        lags = geo["lags"]
        _write_head_csv(geo["head_table"], ctx.results_dir / "rotary_qk_geometry_heads.csv")
        hl = geo["headline"]
        mrf = geo["mrf"]
        n_layers = int(geo["n_layers"])
        rows = [{"layer": i, "routing_fraction_at_0": hl["routing_fraction_at_0"][i],
                 "mean_routing_fraction": hl["mean_routing_fraction"][i],
                 "min_over_offsets": float(mrf[i].min()),
                 "max_over_offsets": float(mrf[i].max())} for i in range(n_layers)]
        dist = geo["distribution"]
        report.text(
            "This model has rotary positions, so its query–key kernel depends on the offset "
            "Δ = j − i between key and query: M(Δ) = W_Q R(Δ) W_Kᵀ with R(Δ) the rotation of "
            "each rotary frequency pair (docs/routing_filtering.md, SPEC B.1 with RoPE [B]). The "
            "routing fraction ‖R_skew(Δ)‖²/‖M(Δ)‖² (0.5 = no preference) is computed exactly "
            f"at every offset, and averaged over the {dist} offset distribution of the "
            f"report's {T}-token windows (the share of routing in the kernel's energy over "
            "the pairs attention actually sees). Offsets follow one convention throughout: "
            "Δ = j − i ≤ 0 for a key j behind the query i (figures plot the distance back, "
            "−Δ = i − j). Weights: " + (norm_folded(ctx.view) if fold
                                         else "as they are") + ".")
        mr = geo["mean_rf"]
        lm = mr.mean(1)
        lo_l, hi_l = int(lm.argmin()), int(lm.argmax())
        report.finding(
            f"Routing fraction of the rotary kernels averaged over the {dist} offsets of "
            f"{T}-token windows, head means per layer: {float(lm[lo_l]):.3f} (layer {lo_l}) "
            f"to {float(lm[hi_l]):.3f} (layer {hi_l}); 0.5 = no preference.")
        report.table(rows, "per layer (means over heads): routing fraction at Δ = 0, averaged "
                           f"over the {dist} offsets, and its range over offsets",
                     name="rotary_geometry_layers")
        report.figure(_routing_vs_offset(lags, mrf.double().numpy()),
                      "Head-mean routing fraction of every layer against the distance back "
                      "−Δ = i − j (colour scale set by the data, centred on 0.5 = no "
                      "preference, white): look for rows that change colour from left to right "
                      "(layers whose routing share changes with distance).")
        _head_maps(report, mr.numpy(), geo["rf0"].numpy(), dist, n_layers)


def norm_folded(view: Any) -> str:
    """What folding the pre-attention normalization means for ``view``'s model, named from
    the model (ModelView.normalization; a :class:`~tl_spectral.viz.context.ModelDescription`
    says the same): LayerNorm (gain, bias, centring), RMSNorm (gain
    only; Gemma's 1 + w), or nothing to fold."""
    kind = str(getattr(view, "normalization", "") or "").upper()
    cfg = getattr(getattr(view, "model", None), "cfg", None)
    if not getattr(view, "pre_ln", True) or not kind or kind in ("NONE", "LNPRE"):
        return "no pre-attention normalization to fold (weights as they are)"
    if "RMS" in kind:
        offset = getattr(view, "rmsnorm_uses_offset", None)  # a ModelDescription says
        offset = bool(getattr(cfg, "rmsnorm_uses_offset", False) if offset is None else offset)
        return ("RMSNorm gain folded" + (" (Gemma's 1 + w)" if offset else "")
                + "; RMSNorm neither centres nor adds a bias, so the kernel acts on x / rms(x)")
    return "LayerNorm folded (gain and bias, weights centred over d_model)"


def _diverging_range(*arrays: Any, centre: float = 0.5) -> tuple[float, float]:
    """A colour range symmetric about ``centre`` that just holds the data (at least ±1e-3)."""
    import numpy as np

    half = max([1e-3] + [float(np.nanmax(np.abs(np.asarray(a) - centre))) for a in arrays])
    return centre - half, centre + half


def _head_maps(report: Report, mean_rf: Any, rf0: Any, dist: str, n_layers: int) -> None:
    """Per-head routing fraction averaged over the offsets, beside either the map at Δ = 0
    (when the two differ visibly) or the difference Δ = 0 minus average (when they would
    look alike); each colour scale set by its data, 0.5 (or 0) white."""
    import numpy as np

    from tl_spectral.viz.multiples import heads_by_layer_figure

    lo, hi = _diverging_range(mean_rf, rf0)
    diff = np.asarray(rf0) - np.asarray(mean_rf)
    alike = float(np.abs(diff).max()) < 0.25 * max(hi - lo, 1e-9)
    first = {"values": mean_rf, "title": f"averaged over {dist} offsets\n"
                                         f"scale {lo:.3f}–{hi:.3f}", "vmin": lo, "vmax": hi,
             "cmap": "RdBu_r", "cbar": "‖R‖²/‖M‖² (white 0.5)"}
    if alike:
        d = max(float(np.abs(diff).max()), 1e-6)
        second = {"values": diff, "title": f"at Δ = 0 minus averaged\nscale ±{d:.2g}",
                  "vmin": -d, "vmax": d, "cmap": "PuOr_r", "cbar": "difference (white 0)"}
        cap = ("Per head, the routing fraction ‖R‖²/‖M‖²: red heads route (antisymmetric "
               "kernels move information between positions), blue heads filter (symmetric "
               "kernels match like with like); the map at Δ = 0 would look the same, so the "
               "right map shows how it differs (Δ = 0 minus the average).")
    else:
        second = {"values": rf0, "title": f"at Δ = 0\nscale {lo:.3f}–{hi:.3f}",
                  "vmin": lo, "vmax": hi, "cmap": "RdBu_r", "cbar": "‖R‖²/‖M‖² (white 0.5)"}
        cap = ("Per head, the routing fraction ‖R‖²/‖M‖²: red heads route (antisymmetric "
               "kernels move information between positions), blue heads filter (symmetric "
               "kernels match like with like); left averaged over the offsets, right at "
               "Δ = 0.")
    report.figure(heads_by_layer_figure([first, second], list(range(n_layers)), ncols=2), cap)


def _lag_grid(T: int) -> list[int]:
    """Lags 0 … T − 1: every lag up to 8, then about 24 log-spaced ones."""
    import numpy as np

    grid = set(range(min(T, 9)))
    if T > 9:
        grid |= {int(round(x)) for x in np.geomspace(9, T - 1, 24)}
    return sorted(grid)


def _write_head_csv(cols: dict, path: Any) -> None:
    """The per-head distribution averages (columns: ``geo.head_table()``) as CSV."""
    import csv

    keys = list(cols)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for row in zip(*(cols[k] for k in keys)):
            w.writerow(row)


def _routing_vs_offset(lags: list, rf: Any):
    """Layers × distance-back heat map of the head-mean routing fraction ``rf [layer, lag]``
    (lag −Δ = i − j on a log axis drawn at 1 + (i − j)); colour scale symmetric about 0.5
    (no preference, white) and just holding the data, 0.5 marked on the colour bar."""
    import numpy as np

    from tl_spectral.viz.multiples import layer_log_mesh

    x = np.asarray(lags, dtype=float) + 1
    edges = np.concatenate([[x[0] / 1.25], np.sqrt(x[1:] * x[:-1]), [x[-1] * 1.25]])
    lo, hi = _diverging_range(rf)
    fig = layer_log_mesh(edges, rf, [str(i) for i in range(rf.shape[0])], cmap="RdBu_r",
                         xlabel="distance back −Δ = i − j (tokens; log axis at 1 + (i − j))",
                         title="head-mean routing fraction ‖R_skew(Δ)‖²/‖M(Δ)‖² against "
                               "the offset",
                         cbar_label=f"routing fraction (scale {lo:.3f}–{hi:.3f}; white 0.5)",
                         vmin=lo, vmax=hi)
    cbar = fig.axes[-1]
    cbar.axhline(0.5, color="k", lw=1.0)
    return fig
