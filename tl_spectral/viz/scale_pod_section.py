"""Report section: scale-selective POD of attention fields (SPEC part A) and, on request
(``options.fields``, ``tl-spectral analyze --fields``), of other per-pair fields of the
same pass (contribution weights, value-weighted attention: one sub-report each, titled by
the field)."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.probes import AttentionFieldProbe, Probe
from tl_spectral.probes.pair_fields import check_field_kind
from tl_spectral.viz.context import ModelPass, register_section

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report


def _layers_text(items: list[tuple[int, float]]) -> str:
    return ", ".join(f"{lay} ({100 * v:.0f}%)" for lay, v in items)


#: levels of the mode mosaic's saved panels (values in [-1, 1]; one more code for "no mode")
PANEL_LEVELS = 254


def quantized_panels(panels: Any) -> Any:
    """The mode mosaic's panels (``[-1, 1]``, NaN where a band has no mode) as uint8 codes:
    ``PANEL_LEVELS + 1`` levels (a colour map has 256 colours: what a figure shows), 255 for
    NaN; a quarter of float32's bytes in what a re-render keeps."""
    import numpy as np

    a = np.asarray(panels, dtype=np.float64)
    q = np.rint((np.clip(a, -1.0, 1.0) + 1.0) * (PANEL_LEVELS / 2.0))
    return _tensor(np.where(np.isnan(a), 255, q).astype(np.uint8))


def dequantized_panels(codes: Any) -> Any:
    """The panels :func:`quantized_panels` coded (float64, NaN for 255)."""
    import numpy as np

    c = np.asarray(codes)
    return np.where(c == 255, np.nan, c.astype(np.float64) * (2.0 / PANEL_LEVELS) - 1.0)


def _tensor(a: Any) -> Any:
    """A numpy array as a tensor (what a report's saved state holds)."""
    import torch

    return torch.from_numpy(a).contiguous()


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


#: a dominant scale's peak holds at least this share of the largest peak of E(a)
DOMINANT_PEAK_SHARE = 0.10

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
    """The fields the section analyses: ``options.fields`` (default attention only)."""
    return [check_field_kind(f) for f in ctx.options.fields or ["attention"]]


def _probe_name(field: str) -> str:
    return "attention_fields" if field == "attention" else f"{field}_fields"


@register_section
class ScalePODSection:
    """Report section: scale-selective POD of the attention fields (and ``--fields``)."""
    key = "scale_pod"
    title = "Scale-selective POD of attention fields"
    order = 20

    def probes(self, ctx: ReportContext) -> list[Probe]:
        rank = ctx.options.stream_rank
        if rank:  # constant-memory statistics (two passes; H* above the cap reads "> K")
            seed = int(ctx.options.meta.get("seed", 0) or 0)
            return [AttentionFieldProbe(field=f, name=_probe_name(f), streaming=True,
                                        rank=int(rank), jackknife_seed=seed)
                    for f in report_fields(ctx)]
        return [AttentionFieldProbe(field=f, name=_probe_name(f)) for f in report_fields(ctx)]

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        if ctx.options.baseline != "random":
            return []
        return [ModelPass(f"baseline_{f}", f"baseline: probe pass and scale POD of the {f} "
                          "fields of the re-initialised twin",
                          functools.partial(baseline_pod, field=f)) for f in report_fields(ctx)]

    def derive(self, results: dict[str, Any], ctx: ReportContext) -> dict[str, Any]:
        """Per field (suffix ``_<field>`` past attention): the scale POD of the probe's fields
        (``scale_pod``: its POD modes left out unless ``save_raw``; None below 2 documents),
        the first modes as the mosaic draws them (``scale_pod_modes``), the jackknife
        intervals (``scale_pod_intervals``), what the text says of the fields
        (``scale_pod_input``) and the ``--baseline random`` columns (``scale_pod_baseline``)."""
        out: dict[str, Any] = {}
        for f in report_fields(ctx):
            sfx = "" if f == "attention" else f"_{f}"
            fields = results[_probe_name(f)]
            streamed = bool(getattr(fields, "streaming", False) or ctx.options.stream_rank)
            out[f"scale_pod_input{sfx}"] = {
                "n_docs": int(fields.n_docs), "streamed": streamed,
                "length": int(getattr(fields, "length", 0) or fields.doc_mask.shape[1])}
            if fields.n_docs < 2:
                continue
            pod = self._pod(fields, ctx, f, streamed)
            from tl_spectral.viz.multiples import modes_panels

            modes = modes_panels(pod)
            out[f"scale_pod{sfx}"] = pod if ctx.save_raw else slim_scale_pod(pod)
            out[f"scale_pod_modes{sfx}"] = None if modes is None else {
                **modes, "panels": quantized_panels(modes["panels"])}
            out[f"scale_pod_intervals{sfx}"] = _intervals(fields, pod, ctx, FIELD_TEXT[f][0])
            base = results.get(f"baseline_{f}")
            out[f"scale_pod_baseline{sfx}"] = None if base is None else [
                {"H_star_random": b.full["H_star_str"], "T_spec_random": b.T_spec,
                 "E_fine_random": b.band_energy.get("fine", float("nan"))}
                for b in base.layers]
        return out

    @staticmethod
    def _pod(fields: Any, ctx: ReportContext, field: str, streamed: bool) -> Any:
        """The scale POD of one field's probe result (no coherence unless streamed)."""
        ctx.status(f"scale POD ({FIELD_TEXT[field][0]}): wavelets and POD of "
                   f"{ctx.view.n_layers} layers")
        # the cross-coherence is most of the POD's cost (a cross-spectrum per scale and
        # layer) and the report does not show it: skipped (the API computes it on request)
        # dominant scales: peaks of E(a) with at least DOMINANT_PEAK_SHARE of the largest
        # peak (the library's default 1% lets 5–7% bumps through)
        kw = {} if streamed else {"coherence_queries": None, "options": ScalePODOptions(
            min_peak_fraction=DOMINANT_PEAK_SHARE)}
        return fields.scale_pod(n_heads=ctx.view.n_heads, **kw)

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        advice: dict[str, list[dict]] = {}
        for f in report_fields(ctx):
            alloc = self._render_field(report, results, ctx, f)
            if alloc and all(r.get("advice") is not None for r in alloc):
                advice[f] = alloc
        if len(advice) > 1:
            self._reconcile(report, advice)

    @staticmethod
    def _reconcile(report: Report, advice: dict[str, list[dict]]) -> None:
        """One allocation per run: the fields' recommended heads side by side and, per layer,
        their range; the advice is the range (fields that differ by a head or two within
        their jackknife ranges do not disagree)."""
        report.subsection("One head allocation for the run")
        fields = list(advice)
        rows = []
        for i, r0 in enumerate(advice[fields[0]]):
            row: dict[str, Any] = {"layer": r0["layer"]}
            vals = [advice[f][i]["advice"] for f in fields]
            for f, v in zip(fields, vals):
                row[f"recommended_{f}"] = v
            row["heads_range"] = f"{min(vals)}–{max(vals)}" if min(vals) != max(vals) \
                else str(vals[0])
            rows.append(row)
        for f in fields:
            report.define(f"recommended_{f}", f"heads for the layer in proportion to H* of "
                                              f"the {f} fields")
        report.define("heads_range", "smallest–largest recommended heads over the fields")
        differ = [r["layer"] for r in rows if "–" in r["heads_range"]]
        report.text(
            "The fields analysed in this run recommend "
            + ("the same heads in every layer." if not differ else
               f"different heads in layer(s) {', '.join(map(str, differ))}; the run's advice is "
               "the range (compare with each field's jackknife range: differences of a head "
               "or two are within the uncertainty)."))
        report.table(rows, "recommended heads per layer by field, and the run's range",
                     name="head_allocation_by_field")

    def _render_field(self, report: Report, results: dict[str, Any], ctx: ReportContext,
                      field: str) -> list:
        # Long on purpose: the field's sub-report in page order (text, findings, tables,
        # intervals, figures), reading the derived results only.
        what, text = FIELD_TEXT[field]
        plain = field == "attention"
        sfx = "" if plain else f"_{field}"
        fields = results[f"scale_pod_input{sfx}"]
        report.section(self.title if plain else f"Scale-selective POD of {what} fields")
        if fields["n_docs"] < 2:
            report.text("Scale-selective POD needs at least 2 documents; pass --n-docs 2 or more.")
            return []
        streamed = fields["streamed"]
        pod = results[f"scale_pod{sfx}"]
        base = results[f"scale_pod_baseline{sfx}"]
        (pod if ctx.save_raw else slim_scale_pod(pod)).save(
            ctx.results_dir / f"scale_pod{sfx}.safetensors")
        report.text(
            f"{text} of {fields['n_docs']} windows of {fields['length']} "
            "tokens in lag coordinates, minus the ensemble mean (Reynolds split). A complex Morlet "
            "CWT along the lag gives the scalogram E(a, τ) and the scale energy E(a); Gaussian lag "
            "windows at the dominant scales (peaks of E(a) holding at least "
            f"{100 * DOMINANT_PEAK_SHARE:.0f}% of the largest peak's energy"
            + (", the library's 1% with --stream-rank" if streamed else "") + ") select bands; POD per band gives eigen-spectra, the "
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
        report.finding(("Scales: " if plain else f"Scales of the {what} fields: ")
                       + "; ".join(parts) + ".")
        _h_star_finding(report, pod, what)
        report.subsection("Per-layer summary and head allocation")
        table = pod.to_rows()
        if base is not None:
            for row, b in zip(table, base):
                row.update(b)
            report.text(
                "Reference (--baseline random): the same configuration with re-initialised "
                "weights (matrices N(0, 0.02²), gains 1, biases 0; seeded) on the same "
                "windows. Columns ending in _random are its numbers: a layer whose H*, T_spec "
                "or scale shares sit at the reference's says little about learned structure.")
        report.table(table, "per-layer summary", name=f"scale_pod_layers{sfx}")
        report.table(_allocation_rows(pod), "head allocation (recommended vs uniform; none "
                     "where H* is bounded by N)", name=f"head_allocation{sfx}")
        _uncertainty(report, results[f"scale_pod_intervals{sfx}"], pod, fields["n_docs"], what)
        ctx.status(f"scale POD ({what}): figures")
        from tl_spectral.viz.multiples import scale_energy_map

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
                      "needed: rich structure) and how the head allocation follows it. Hollow "
                      "grey points: H* bounded by the number of documents (at or above the "
                      "dashed bound), which says nothing about the layer and gives no advice; "
                      "each fit's R² is in the per-layer table (tspec_r2).")
        _mosaics(report, pod, results[f"scale_pod_modes{sfx}"], ctx, field)
        return pod.allocation


def _mosaics(report: Report, pod: Any, modes: Any, ctx: ReportContext, field: str) -> None:
    """The every-layer figures: scalograms, POD spectra, first modes (from their 8-bit
    codes), and the coherence map where the statistics bring one."""
    from tl_spectral.viz.multiples import (
        coherence_map,
        modes_figure,
        scalograms_mosaic,
        spectra_overlay,
    )

    report.subsection("Scalograms, every layer")
    ctx.status(f"scale POD figures ({field}): scalograms")
    report.figure(scalograms_mosaic(pod),
                  "Scalograms of every layer stacked: look for the lags at which each "
                  "layer's energy sits (bright) and at which scales.")
    report.subsection("POD spectra and modes, every layer")
    ctx.status(f"scale POD figures ({field}): spectra and modes")
    report.figure(spectra_overlay(pod),
                  "POD eigen-spectra of every layer: a steep, short spectrum means few "
                  "modes carry the field; a flat one, many (H* as a dot on each line).")
    fig = modes_figure(None if modes is None else {
        **modes, "panels": dequantized_panels(modes["panels"])})
    if fig is not None:
        report.figure(fig, "First POD mode per band of every layer: look for the lag "
                            "structure each band captures (red positive, blue negative).")
    fig = coherence_map(pod)
    if fig is not None:  # streamed statistics bring their coherence along
        report.figure(fig, "Mean coherence between different queries at each scale: look "
                           "for scales where queries move together (bright): structure "
                           "shared across positions rather than local to one query.")


def _allocation_rows(pod: Any) -> list[dict]:
    """The report's head-allocation table: H*, whether N bounds it, the share and the
    recommended heads ('—' when any layer is bounded: no advice from a lower bound)."""
    return [{"layer": r["layer"], "H_star": r["H_star_str"],
             "H_star_bounded": bool(r.get("bounded", False)), "share": r["share"],
             "quota": r["quota"],
             "recommended_heads": r["advice"] if r.get("advice") is not None else "—",
             "uniform_heads": r["uniform"]} for r in pod.allocation]


def _h_star_finding(report: Report, pod: Any, what: str) -> None:
    """ONE finding on H*: the resolved layers' values, and where the number of documents
    bounds it, which layers, the rule (docs/scale_pod.md) and the N that might resolve them."""
    from tl_spectral.analysis.scale_pod import docs_to_resolve, h_star_bound, layer_h_star_bounded

    lays = list(pod.layers)
    N = max(int(lay.n_documents) for lay in lays)
    eps = float(pod.config.get("epsilon", 0.1))
    bound = h_star_bound(N, eps)
    bad = [lay for lay in lays if layer_h_star_bounded(lay)]
    good = [lay for lay in lays if not layer_h_star_bounded(lay)]
    rule = (f"at N = {N} documents an H* of {bound} or more of the {N - 1} possible modes is "
            "what a spectrum no steeper than 1/k gives, whose H* grows with N without limit "
            "(docs/scale_pod.md)")
    if not bad:
        report.finding(
            f"Effective rank H* of the {what} fields, resolved in every layer ({rule}; every "
            "layer is below): " + ", ".join(f"{lay.layer}: {lay.H_star}" for lay in lays)
            + ". The heads ∝ H* are in the allocation table.")
        return
    n_try = docs_to_resolve(max(lay.H_star for lay in bad), eps)
    names = ", ".join(str(lay.layer) for lay in bad[:12]) + (", …" if len(bad) > 12 else "")
    report.finding(
        f"H* of the {what} fields is bounded by the number of documents in {len(bad)} of "
        f"{len(lays)} layers ({names}; H* {min(lay.H_star for lay in bad)}–"
        f"{max(lay.H_star for lay in bad)}): {rule}, so there it says nothing about the "
        f"layer and no heads are recommended from it (nor in any layer: the allocation "
        f"divides by the sum). N = {n_try} documents is the least that could resolve the "
        f"largest (--n-docs {n_try} or more; check that H* stops growing)"
        + (". Resolved: " + ", ".join(f"{lay.layer}: {lay.H_star}" for lay in good[:12])
           + (", …" if len(good) > 12 else "") if good else "") + ".")


def _scalogram_pair(layer: Any):
    import matplotlib.pyplot as plt

    from tl_spectral.viz.scale_pod_plots import plot_scale_energy, plot_scalogram

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    plot_scalogram(layer, ax=axes[0])
    plot_scale_energy(layer, ax=axes[1])
    fig.tight_layout()
    return fig


def _intervals(fields: Any, pod: Any, ctx: ReportContext, what: str) -> dict[str, Any]:
    """The jackknife over documents of H*, T_spec and the heads per layer (a plain dict:
    ``meta``, ``rows``, ``streamed``, ``rank``), or why there is none (``skip``: the text)."""
    from tl_spectral.viz.uncertainty import pod_jackknife, streamed_pod_jackknife

    N = int(fields.n_docs)
    streamed = bool(getattr(fields, "jackknife", None))
    if N < 4 or not (streamed or hasattr(fields, "fluctuations")):
        return {"skip": "Intervals over documents need at least 4 documents"
                + ("" if N < 4 else " and the streaming probe's per-group moments "
                   "(AttentionFieldProbe(streaming=True, jackknife_groups=8))") + "."}
    ctx.status(f"scale POD ({what}): jackknife over documents")
    if streamed:
        try:
            jk = streamed_pod_jackknife(fields, pod)
        except ValueError as exc:  # moments of some layers dropped (merged different bases)
            return {"skip": f"No intervals over documents: {exc}."}
    else:
        jk = pod_jackknife(fields, pod, seed=int(ctx.options.meta.get("seed", 0) or 0))
    return {"meta": jk["meta"], "rows": jk["rows"], "streamed": streamed,
            "rank": int(fields.rank) if streamed else None}


def _uncertainty(report: Report, jk: dict, pod: Any, N: int, what: str) -> None:
    """Jackknife intervals over documents of H*, T_spec and the heads per layer
    (:func:`_intervals`), and a finding when the number of documents bounds H*."""
    from tl_spectral.analysis.scale_pod import layer_h_star_bounded

    withheld = any(layer_h_star_bounded(lay) for lay in pod.layers)
    if "skip" in jk:
        report.text(jk["skip"])
        return
    streamed = jk["streamed"]
    meta = jk["meta"]
    report.text(
        f"Uncertainty: {100 * meta['level']:.0f}% delete-a-group jackknife intervals over the "
        f"{N} documents ({meta['n_groups']} groups, seeded; t quantile {meta['t_quantile']:.2f}) "
        "of each layer's H* and T_spec, and the smallest and largest recommended heads over "
        "the replicates"
        + (" (streamed: each replicate's spectrum from per-group second moments in the "
           f"first pass's {jk['rank']} POD directions, exact while the ensemble's rank "
           "is within the cap)" if streamed else "")
        + ". An interval of zero width for H* means every replicate gave the same "
        "value (H* bounded by N gives N' − 1 in every replicate: see the finding above)."
        + (" No recommended heads: H* is bounded by N in some layer (the H* finding)."
           if withheld else ""))
    rows = [{"layer": r["layer"], "H_star": r["H_star"],
             "H_star_interval": f"{r['H_star_low']:.3g}–{r['H_star_high']:.3g}",
             "T_spec": r["T_spec"],
             "T_spec_interval": f"{r['T_spec_low']:.3g}–{r['T_spec_high']:.3g}",
             "recommended": "—" if withheld else r["heads"],
             "recommended_range": "—" if withheld else (
                 f"{r['heads_min']}–{r['heads_max']}" if r["heads_min"] != r["heads_max"]
                 else str(r["heads"]))}
            for r in jk["rows"]]
    report.table(rows, "H*, T_spec and recommended heads with their jackknife intervals "
                       "over documents", name=f"scale_pod_intervals_{what.replace(' ', '_')}")


def baseline_pod(ctx: ReportContext, field: str) -> Any:
    """The baseline pass: the scale POD of ``field`` for the re-initialised twin of the
    model (``--baseline random``), the twin built once per report."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes import run_probes
    from tl_spectral.viz.baseline import random_copy

    cache = ctx.baseline_cache
    if "view" not in cache:
        ctx.status("baseline: the same configuration re-initialised")
        seed = int(ctx.options.meta.get("seed", 0) or 0)
        cache["view"] = ModelView(random_copy(ctx.view.model, seed=seed))
    res = run_probes(cache["view"], ctx.tokens,
                     [AttentionFieldProbe(field=field,
                                          name="baseline")],
                     progress=False, attention_mask=ctx.mask)["baseline"]
    return res.scale_pod(n_heads=ctx.view.n_heads, coherence_queries=None,
                         options=ScalePODOptions(min_peak_fraction=DOMINANT_PEAK_SHARE))
