"""Report section: spectral surgery (SPEC B.5) of the report's own model.

On a causal model (standard or rotary positions): the zero-shot linearization curve — PPL of the
report's documents with the first k layers' patterns replaced by the ELU+1 linear pattern
``α_ij ∝ φ(q_i)·φ(k_j)`` (:func:`~tl_spectral.interventions.surgery.tl_linearization_curve`,
pattern hooks; no probe needed); the model's perplexity check is the sanity section's. The
stored study of other models (collapse curves, cascade
allocations) is ``tl-spectral study surgery`` and docs/surgery.md, not part of this report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tl_spectral.viz.context import ModelPass, register_section

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


@register_section
class SurgerySection:
    """A report section (the ``ReportSection`` protocol: key, title, probes, render)."""

    key = "surgery"
    title = "Spectral surgery (zero-shot linearization)"
    order = 50

    def probes(self, ctx: ReportContext) -> list:
        return []

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        if not ctx.view.causal:
            return []
        return [ModelPass("surgery_tl_curve", "surgery: zero-shot linearization curve",
                          self.curve)]

    def curve(self, ctx: ReportContext) -> Any:
        """The pass: the zero-shot linearization curve on the windows of the perplexity check
        (its k = 0 is the sanity pass's perplexity when that ran), stopped on deep models
        once it has collapsed (``COLLAPSED``); a ``LinearizationCurve``, or the reason it
        cannot run (a str)."""
        from tl_spectral.interventions.surgery import tl_linearization_curve
        from tl_spectral.viz.sanity_section import perplexity_windows

        n = perplexity_windows(ctx)
        deep = ctx.view.n_layers > EVERY_K_UP_TO
        try:
            return tl_linearization_curve(
                ctx.view, ctx.tokens[:n], name=ctx.view.name, ks=curve_ks(ctx.view.n_layers),
                base_ppl=ctx.baseline_cache.get(("model_ppl", n)),
                stop_at=COLLAPSED if deep else None)
        except ValueError as e:
            return str(e)

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        report.section(self.title)
        if not ctx.view.causal:
            report.text("Does not apply: this model is bidirectional (an encoder), not a causal "
                        "language model, so there is no next-token perplexity to linearize "
                        "against.")
            return
        rotary = ctx.view.positional == "rotary"
        report.text(
            "Causal ELU+1 linear attention (φ = elu + 1) on a layer's own q, k, v is attention "
            "with pattern α_ij ∝ φ(q_i)·φ(k_j), O(T) to compute. Linearizing the first k layers "
            "and measuring the perplexity change gives the collapse curve of SPEC B.5 (paper [B]: "
            "7 leading layers of a 125M S–D model within 5%, standard attention collapsing "
            "from layer 3)."
            + (" This model has rotary positions: q and k are taken after the rotation (and "
               "after its QK-norm, where it has one), the vectors whose dot product forms the "
               "score, so the linear pattern keeps the rotary phases; a sliding window is not "
               "applied to it." if rotary else ""))
        report.text(
            "The cascade allocation of SPEC B.6 (head dimensions set from each layer's "
            "routing rank, paper [B]: 47–65% fewer attention parameters at +3.9% to +8.4% "
            "PPL) is not run here: it rebuilds the model with new head widths and retrains "
            "it, which only the project's own GPT models allow (tl-spectral study surgery, "
            "docs/surgery.md); a loaded model cannot be rebuilt that way.")
        curve = results["surgery_tl_curve"]
        if isinstance(curve, str):
            report.text("The linearization curve cannot run on this model: its queries and keys "
                        f"are not reachable by pattern hooks ({curve}).")
            return
        curve.save(ctx.results_dir / "surgery_tl_curve.safetensors")
        report.text(
            f"This model, zero-shot, on {curve.n_windows} of the report's windows "
            f"({curve.seq_len} predicted tokens each): PPL {curve.base_ppl:.4g} with "
            f"softmax everywhere; {_layers(curve.max_k_within(0.05))} stay within 5%"
            + ("." if ctx.view.n_layers <= EVERY_K_UP_TO else
               f" (k on a grid of values, one forward pass each, stopped once two in a row "
               f"are at or above +{100 * COLLAPSED:.0f}%: the table lists the "
               f"{len(curve.ks)} that ran; the count is the largest grid value within 5%)."))
        report.finding(
            f"Linearization: {_layers(curve.max_k_within(0.05))} can be replaced by "
            f"linear attention within 5% perplexity (base PPL {curve.base_ppl:.4g}, "
            "zero-shot).")
        report.table(curve.to_rows(), "PPL with the first k layers linearized (zero-shot)",
                     name="linearization_curve")
        report.figure(curve.plot(), "Relative perplexity change with the first k layers "
                      "linearized: look for the k where the curve leaves the 5% band (the "
                      "layers that need softmax).")


#: up to this many layers the curve linearizes every k; deeper models a grid of about 10 k,
#: stopped once two k in a row are at or above ``COLLAPSED`` relative ΔPPL (+100%: the
#: perplexity doubled; a larger k does not come back within 5%)
EVERY_K_UP_TO = 12
COLLAPSED = 1.0


def curve_ks(n_layers: int) -> list[int]:
    """The k of the curve: every k up to ``EVERY_K_UP_TO`` layers; deeper, 0–4 and 5
    log-spaced values from 6 to every layer (one forward pass per k and window: 10 passes
    at 30 layers instead of 31)."""
    import numpy as np

    L = int(n_layers)
    if L <= EVERY_K_UP_TO:
        return list(range(L + 1))
    return sorted({*range(5), *(int(round(x)) for x in np.geomspace(6, L, 5)), L})


def _layers(k: int) -> str:
    return f"{k} leading layer" + ("" if k == 1 else "s")
