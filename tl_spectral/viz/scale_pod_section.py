"""Report section: scale-selective POD of attention fields (SPEC part A) and, on request
(``options["fields"]``, ``tl-spectral analyze --fields``), of other per-pair fields of the
same pass (contribution weights, value-weighted attention: one sub-report each, titled by
the field)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tl_spectral.probes import AttentionFieldProbe, Probe
from tl_spectral.probes.pair_fields import check_field_kind

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


def _layers_text(items: list[tuple[int, float]]) -> str:
    return ", ".join(f"{lay} ({100 * v:.0f}%)" for lay, v in items)


def slim_scale_pod(pod: Any) -> Any:
    """A copy of a ScalePODResult without the POD modes (the bulk of the file): spectra,
    scalograms, energies, coefficients and summaries stay, so tables, spectra and findings
    can be rebuilt from the saved file."""
    layers = []
    for lay in pod.layers:  # scalograms in float32: half the file, far below plot precision
        layers.append(dataclasses.replace(
            lay, full_modes=lay.full_modes[:0].clone(),
            band_modes={k: v[:0].clone() for k, v in lay.band_modes.items()},
            scalogram=lay.scalogram.float()))
    return dataclasses.replace(pod, layers=layers)


#: what each field is, for the section text (definitions: tl_spectral.probes.pair_fields)
FIELD_TEXT = {
    "attention": ("attention", "Head-mean attention fields α_ij"),
    "contribution": ("contribution", "Token-level contribution fields C_ij = Σ_h c_ij^h "
                     "(inter-head contribution weights, rows sum to 1; negative where a source "
                     "interferes destructively)"),
    "contribution_intra": ("intra-head contribution", "Head-mean intra-head contribution fields "
                           "⟨o_i^h, α_ij ṽ_j⟩ / ‖o_i^h‖² (rows sum to 1)"),
    "value_weighted": ("value-weighted", "Head-mean value-weighted fields α_ij ‖ṽ_j‖ / Σ_k α_ik "
                       "‖ṽ_k‖ (rows sum to 1)"),
    "value_weighted_raw": ("raw value-weighted", "Head-mean value-weighted fields α_ij ‖ṽ_j‖ "
                           "(not normalised)"),
}


def report_fields(ctx: ReportContext) -> list[str]:
    """The fields the section analyses: ``options["fields"]`` (default attention only)."""
    return [check_field_kind(f) for f in ctx.options.get("fields") or ["attention"]]


def _probe_name(field: str) -> str:
    return "attention_fields" if field == "attention" else f"{field}_fields"


class ScalePODSection:
    key = "scale_pod"
    title = "Scale-selective POD of attention fields"

    def probes(self, ctx: ReportContext) -> list[Probe]:
        rank = ctx.options.get("stream_rank")
        if rank:  # constant-memory statistics (two passes; H* above the cap reads "> K")
            return [AttentionFieldProbe(max_lag=ctx.options.get("max_lag"), field=f,
                                        name=_probe_name(f), streaming=True, rank=int(rank))
                    for f in report_fields(ctx)]
        return [AttentionFieldProbe(max_lag=ctx.options.get("max_lag"), field=f,
                                    name=_probe_name(f)) for f in report_fields(ctx)]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        for f in report_fields(ctx):
            self._render_field(report, results[_probe_name(f)], ctx, f)

    def _render_field(self, report: Report, fields: Any, ctx: ReportContext, field: str) -> None:
        what, text = FIELD_TEXT[field]
        plain = field == "attention"
        report.section(self.title if plain else f"Scale-selective POD of {what} fields")
        if fields.n_docs < 2:
            report.text("Scale-selective POD needs at least 2 documents; pass --n-docs 2 or more.")
            return
        sfx = "" if plain else f"_{field}"
        ctx.status(f"scale POD ({what}): wavelets and POD of {ctx.view.n_layers} layers")
        # the cross-coherence is most of the POD's cost (a cross-spectrum per scale and
        # layer) and the report does not show it: skipped (the API computes it on request)
        kw = {} if getattr(fields, "streaming", False) or ctx.options.get("stream_rank") \
            else {"coherence_queries": None}
        pod = fields.scale_pod(n_heads=ctx.view.n_heads, **kw)
        (pod if ctx.save_raw else slim_scale_pod(pod)).save(
            ctx.results_dir / f"scale_pod{sfx}.safetensors")
        report.text(
            f"{text} of {fields.n_docs} windows of "
            f"{getattr(fields, 'length', 0) or fields.doc_mask.shape[1]} "
            "tokens in lag coordinates, minus the ensemble mean (Reynolds split). A complex Morlet "
            "CWT along the lag gives the scalogram E(a, τ) and the scale energy E(a); Gaussian lag "
            "windows at the dominant scales select bands; POD per band gives eigen-spectra, the "
            "spectral concentration index T_spec = 1/β and the effective rank H*(0.1). The head "
            "allocation distributes the model's heads in proportion to H* of each layer (SPEC "
            "part A [A]).")
        fine = [(lay.layer, lay.band_energy["fine"]) for lay in pod.layers
                if lay.band_energy["fine"] >= 0.5]
        coarse = [(lay.layer, lay.band_energy["coarse"]) for lay in pod.layers
                  if lay.band_energy["coarse"] >= 0.5]
        parts = []
        if fine:
            parts.append(f"fine-scaled (a ≤ 7 tokens; energy share): layers {_layers_text(fine)}")
        if coarse:
            parts.append(f"coarse-scaled (a ≥ 20): layers {_layers_text(coarse)}")
        if not parts:
            parts.append("no layer has half its scale energy in one band")
        hs = [(row["layer"], row["H_star_str"]) for row in pod.allocation]
        report.finding(("Scales: " if plain else f"Scales of the {what} fields: ")
                       + "; ".join(parts) + ". Effective rank H* per layer: "
                       + ", ".join(f"{lay}: {h}" for lay, h in hs) + ".")
        report.subsection("Per-layer summary and head allocation")
        report.table(pod.table(), "per-layer summary", name=f"scale_pod_layers{sfx}")
        report.table(pod.allocation, "head allocation (recommended vs uniform)",
                     name=f"head_allocation{sfx}")
        ctx.status(f"scale POD ({what}): figures")
        from tl_spectral.viz.multiples import (
            coherence_map,
            modes_mosaic,
            scale_energy_map,
            scalograms_mosaic,
            spectra_overlay,
        )

        rising = [lay.layer for lay in pod.layers
                  if float(lay.scale_energy[-1]) >= 0.999 * float(lay.scale_energy.max())]
        if rising:
            report.finding(
                f"Scale energy still rises at the largest analysed scale in layer(s) "
                f"{', '.join(map(str, rising))}: structure coarser than these windows is cut "
                "off; analyse longer windows (--length) to resolve it.")
        report.figure(scale_energy_map(pod),
                      "Each row is one layer's scale energy E(a): look for where each row is "
                      "brightest (its dominant scales, dots) and whether deep layers move to "
                      "coarser scales.")
        report.figure(pod.plot_tspec_hstar(),
                      "T_spec and H* across layers: look for layers with a high H* (many modes "
                      "needed: rich structure) and how the head allocation follows it.")
        report.subsection("Scalograms, every layer")
        ctx.status(f"scale POD figures ({field}): scalograms")
        report.figure(scalograms_mosaic(pod),
                      "Scalograms of every layer stacked: look for the lags at which each "
                      "layer's energy sits (bright) and at which scales.")
        report.subsection("POD spectra and modes, every layer")
        ctx.status(f"scale POD figures ({field}): spectra and modes")
        report.figure(spectra_overlay(pod),
                      "POD eigen-spectra of every layer: a steep, short spectrum means few "
                      "modes carry the field; a flat one, many (H* dotted).")
        fig = modes_mosaic(pod)
        if fig is not None:
            report.figure(fig, "First POD mode per band of every layer: look for the lag "
                                "structure each band captures (red positive, blue negative).")
        fig = coherence_map(pod)
        if fig is not None:  # streamed statistics bring their coherence along
            report.figure(fig, "Mean coherence between different queries at each scale: look "
                               "for scales where queries move together (bright): structure "
                               "shared across positions rather than local to one query.")


def _scalogram_pair(layer: Any):
    import matplotlib.pyplot as plt

    from tl_spectral.viz.scale_pod_plots import plot_scale_energy, plot_scalogram

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    plot_scalogram(layer, ax=axes[0])
    plot_scale_energy(layer, ax=axes[1])
    fig.tight_layout()
    return fig
