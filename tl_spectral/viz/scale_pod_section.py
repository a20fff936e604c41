"""Report section: scale-selective POD of attention fields (SPEC part A)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tl_spectral.probes import AttentionFieldProbe, Probe

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


class ScalePODSection:
    key = "scale_pod"
    title = "Scale-selective POD of attention fields"

    def probes(self, ctx: ReportContext) -> list[Probe]:
        return [AttentionFieldProbe(max_lag=ctx.options.get("max_lag"))]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        fields = results["attention_fields"]
        report.section(self.title)
        if fields.n_docs < 2:
            report.text("Scale-selective POD needs at least 2 documents; pass --n-docs 2 or more.")
            return
        pod = fields.scale_pod(n_heads=ctx.view.n_heads)
        pod.save(ctx.results_dir / "scale_pod.safetensors")
        report.text(
            f"Head-mean attention fields of {fields.n_docs} windows of {fields.doc_mask.shape[1]} "
            "tokens in lag coordinates, minus the ensemble mean (Reynolds split). A complex Morlet "
            "CWT along the lag gives the scalogram E(a, τ) and the scale energy E(a); Gaussian lag "
            "windows at the dominant scales select bands; POD per band gives eigen-spectra, the "
            "spectral concentration index T_spec = 1/β and the effective rank H*(0.1). The head "
            "allocation distributes the model's heads in proportion to H* of each layer."
        )
        report.table(pod.table(), "per-layer summary")
        report.table(pod.allocation, "head allocation (recommended vs uniform)")
        report.figure(pod.plot_scale_energies(), "scale energy E(a) of every layer")
        report.figure(pod.plot_tspec_hstar(), "T_spec and H* across layers")
        for layer in pod.layers:
            report.figure(layer.plot_scalogram(), f"layer {layer.layer}: scalogram E(a, τ)")
            report.figure(layer.plot_scale_energy(),
                          f"layer {layer.layer}: E(a) with dominant scales")
        first, last = pod.layers[0], pod.layers[-1]
        for layer in (first, last):
            report.figure(layer.plot_spectra(), f"layer {layer.layer}: POD eigen-spectra (log-log)")
            report.figure(layer.plot_band_modes(), f"layer {layer.layer}: first modes per band")
            report.figure(layer.plot_mode_profiles(),
                          f"layer {layer.layer}: mean lag profiles of the modes")
            if layer.coherence is not None:
                report.figure(layer.plot_coherence(), f"layer {layer.layer}: cross-coherence γ_ij(a)")
