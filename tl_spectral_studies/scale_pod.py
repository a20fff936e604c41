"""The scale-POD study of docs/scale_pod.md: scale-selective POD of a model's attention fields
over N windows (SPEC part A).

    tl-spectral study scale-pod --model char-shakespeare --n-docs 150 --length 256 --out docs/results
    tl-spectral study scale-pod --model char-shakespeare --n-docs 1000 --length 256 --out docs/results
    tl-spectral study scale-pod --model minilm --n-docs 150 --length 256 --out docs/results \
        --corpus ../shared/data/wiki_excerpt.txt
    tl-spectral study scale-pod --quick                      # 16 windows of 128, a minute
    tl-spectral study scale-pod --fields attention,contribution,contribution_intra,value_weighted \
        --out docs/results/field_pod ...   # the field comparison (tl_spectral_studies.field_pod)

Windows come from the validation part (last 10%) of the corpus when it holds enough of them,
else from the whole text. Writes ``OUT/scale_pod_<model>_N<n>.json`` and figures
``FIG/scale_pod_<model>_N<n>_*.png`` (``FIG`` = ``--fig-dir``, default ``OUT/figures``);
:func:`markdown` renders the per-layer table from the JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tl_spectral.usage import ArgumentParser
from tl_spectral.usage import seed as seed_arg
from tl_spectral_studies._common import (
    add_run_arguments,
    fmt_interval,
    prepare_out,
    save_figures,
    validation_windows,
)

NAME = "scale-pod"
BOOT_SEED = 0
FIT_ENERGIES = (0.90, 0.95, 0.99)
JACKKNIFE_GROUPS = 20
JACKKNIFE_KEYS = ("H_star", "T_spec_90", "T_spec_95", "T_spec_99")
"""Statistics whose interval is the delete-a-group jackknife's (they depend on N; bootstrap
resamples with repeated documents bias them), not the bootstrap percentile one."""


def bootstrap_layers(fluctuations: Sequence[Any], *, n_resamples: int = 1000,
                     seed: int = BOOT_SEED) -> dict[str, Any]:
    """Bootstrap over documents of every layer's band shares, H* and T_spec (fitted over the
    modes holding 90 / 95 / 99% of the energy), and of the depth contrasts
    ``last − first`` of H* and T_spec (99% fit), the same resample for every layer.

    fluctuations: per layer ``[N, T, n_lags]``. One pass over each layer's fields builds its
    Grams (:func:`~tl_spectral.analysis.scale_pod.scale_pod_grams`); each resample then costs
    one ``eigvalsh`` of ``[N, N]`` per layer."""
    import torch

    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral.analysis.scale_pod import pod_statistics, scale_pod_grams

    grams = [scale_pod_grams(F) for F in fluctuations]
    keys = list(pod_statistics(grams[0], fit_energies=FIT_ENERGIES))
    N = int(grams[0]["field"].shape[0])

    def stat(idx):
        per = [pod_statistics(g, idx, fit_energies=FIT_ENERGIES) for g in grams]
        v = [[d[k] for k in keys] for d in per]
        contrast = [per[-1]["T_spec_99"] - per[0]["T_spec_99"],
                    per[-1]["H_star"] - per[0]["H_star"]]
        return torch.tensor([x for row in v for x in row] + contrast, dtype=torch.float64)

    iv = bootstrap(stat, N, n_resamples=n_resamples, seed=seed)
    K = len(keys)
    layers = [{k: iv[li * K + ki].to_dict() for ki, k in enumerate(keys)}
              for li in range(len(grams))]
    jk = group_jackknife(stat, N, n_groups=JACKKNIFE_GROUPS, seed=seed)
    jlayers = [{k: {n: float(v[li * K + ki]) for n, v in jk.items() if n != "meta"}
                for ki, k in enumerate(keys)} for li in range(len(grams))]
    last = {k: {n: float(v[len(grams) * K + i]) for n, v in jk.items() if n != "meta"}
            for i, k in enumerate(("T_spec_99", "H_star"))}
    return {"n_resamples": int(n_resamples), "seed": int(seed), "level": iv.level,
            "fit_energies": list(FIT_ENERGIES), "layers": layers,
            "last_minus_first": {"T_spec_99": iv[len(grams) * K].to_dict(),
                                 "H_star": iv[len(grams) * K + 1].to_dict()},
            "jackknife": {**jk["meta"], "layers": jlayers, "last_minus_first": last}}


def group_jackknife(statistic, n_docs: int, *, n_groups: int = 20, seed: int = 0,
                    level: float = 0.95) -> dict[str, Any]:
    """Delete-a-group jackknife of ``statistic(idx) -> Tensor`` over documents: the
    documents split at random (seeded) into ``n_groups`` groups, the statistic recomputed
    without each group; standard error ``sqrt((G − 1)/G · Σ_g (θ_g − θ̄)²)`` and the interval
    ``θ̂ ± t_{G−1} · se`` (``torch.chunk`` of a seeded permutation into ``n_groups`` parts:
    fewer groups when ``n_docs`` is not a multiple, e.g. 19 of at most 8 for 150 documents;
    the count is recorded). For statistics that depend on the ensemble size (H*, T_spec), whose
    bootstrap resamples (about 63% distinct documents) are biased: each jackknife replicate
    keeps (1 − 1/G) of the documents, all distinct. Returns ``{"estimate", "low", "high",
    "se"}`` tensors and ``"meta"``."""
    # the library's jackknife (the report's intervals) — one implementation for both
    from tl_spectral.analysis.bootstrap import group_jackknife as _library_jackknife

    out = _library_jackknife(statistic, n_docs, n_groups=n_groups, seed=seed, level=level)
    out.pop("replicates", None)
    return out


def run_study(out_dir: str | Path, *, model: str = "char-shakespeare",
              corpus: str = "shakespeare", n_docs: int = 150, length: int = 256,
              max_lag: int | None = None, batch_size: int = 16, seed: int = 0,
              fig_dir: str | Path | None = None, n_resamples: int = 1000,
              command: str = "", stride: int | None = None,
              validation_only: bool = False) -> dict[str, Any]:
    """Run the attention-field probe and scale POD; write the JSON summary and figures.
    Returns the summary (also in ``out_dir/scale_pod_<model>_N<n_docs>.json``).

    ``n_resamples`` > 0 adds bootstrap intervals over documents (seed 0) of every layer's band
    energy shares, H* and T_spec fitted over the modes holding 90 / 95 / 99% of the energy
    (:func:`~tl_spectral.analysis.scale_pod.scale_pod_bootstrap`); ``command`` is recorded as
    the run's provenance. ``stride`` / ``validation_only``: windows at multiples of ``stride``
    inside the validation split, and no fallback to the whole text
    (:func:`~tl_spectral_studies._common.validation_windows`); the output name then ends in
    ``_val`` (and ``_s<stride>``) so it never replaces a run on other windows."""
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral.data import load_corpus
    from tl_spectral.model_view import ModelView
    from tl_spectral.models.loading import load_named_model as load_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    net, tok = load_model(model)
    view = ModelView(net)
    text = load_corpus(corpus)
    windows, source = validation_windows(text, tok, n_docs, length, seed, stride=stride,
                                         validation_only=validation_only)
    t0 = time.perf_counter()
    fields = run_probes(view, windows, [AttentionFieldProbe(max_lag=max_lag)],
                        batch_size=batch_size)["attention_fields"]
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    pod = fields.scale_pod(n_heads=view.n_heads)
    t_an = time.perf_counter() - t0
    boot = None
    if n_resamples > 0:
        t0 = time.perf_counter()
        boot = bootstrap_layers([fields.fluctuations(layer) for layer in fields.layers],
                                n_resamples=n_resamples)
        boot["seconds"] = round(time.perf_counter() - t0, 2)
    stem = Path(model).name if Path(model).name != "final" else Path(model).parent.name
    tag = f"scale_pod_{stem}_N{n_docs}" + run_suffix({"stride": stride,
                                                    "validation_only": validation_only})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "model": model, "view": repr(view), "corpus": corpus, "windows_from": source,
        "stride": stride, "validation_only": validation_only,
        "n_docs": n_docs, "length": length, "max_lag": max_lag, "seed": seed,
        "forward_s": round(t_fwd, 2), "analysis_s": round(t_an, 2),
        "table": pod.to_rows(), **pod.to_dict(include_curves=True),
        "command": command, "bootstrap": boot,
    }
    (out / f"{tag}.json").write_text(json.dumps(summary, indent=1, default=float))
    figs = {
        "energies": pod.plot_scale_energies(),
        "tspec_hstar": pod.plot_tspec_hstar(),
        "scalogram_first": pod.layers[0].plot_scalogram(),
        "scalogram_last": pod.layers[-1].plot_scalogram(),
        "spectra_first": pod.layers[0].plot_spectra(),
        "spectra_last": pod.layers[-1].plot_spectra(),
        "modes_first": pod.layers[0].plot_band_modes(),
        "modes_last": pod.layers[-1].plot_band_modes(),
        "profiles_last": pod.layers[-1].plot_mode_profiles(),
    }
    if pod.layers[0].coherence is not None:
        figs["coherence_first"] = pod.layers[0].plot_coherence()
    save_figures(figs, Path(fig_dir) if fig_dir else out / "figures", tag, dpi=90,
                 caption=f"{model}: {n_docs} windows × {length} tokens ({source} of {corpus}), "
                         f"seed {seed}; tl-spectral study scale-pod")
    return summary


_DOC_HEADER = ("| layer (paper numbering) | dominant scales a* | E fine (a ≤ 7) | E medium | "
               "E coarse (a ≥ 20) | T_spec = 1/β (R²) | H*(0.1) | heads: recommended / uniform |\n"
               "|---|---|---|---|---|---|---|---|")


def table_markdown(summary: dict[str, Any]) -> str:
    """The per-layer table of one run (the format of docs/scale_pod.md)."""
    rows = [_DOC_HEADER]
    for r in summary["table"]:
        scales = ", ".join(f"{a:.1f}" for a in r["dominant_scales"])
        rows.append(f"| {r['layer']} ({r['layer'] + 1}) | {scales} | {r['E_fine']:.2f} | "
                    f"{r['E_medium']:.2f} | {r['E_coarse']:.2f} | {r['T_spec']:.2f} "
                    f"({r['tspec_r2']:.2f}) | {r['H_star']} | {r['recommended_heads']} / "
                    f"{r['uniform_heads']} |")
    return "\n".join(rows)


COMMANDS = {
    ("char-shakespeare-d256", 150): "tl-spectral study scale-pod --model char-shakespeare-d256 "
                                    "--n-docs 150 --length 256 --out docs/results/scale_pod "
                                    "--fig-dir docs/figures",
    ("char-shakespeare-d256_val_s64", 1000): "tl-spectral study scale-pod --model "
                                             "char-shakespeare-d256 --n-docs 1000 --length 256 "
                                             "--stride 64 --validation-only --n-resamples 200 "
                                             "--out docs/results/scale_pod --fig-dir docs/figures",
    ("char-shakespeare_val_s64", 1000): "tl-spectral study scale-pod --model char-shakespeare "
                                        "--n-docs 1000 --length 256 --stride 64 "
                                        "--validation-only --n-resamples 200 "
                                        "--out docs/results/scale_pod --fig-dir docs/figures",
    ("char-shakespeare", 150): "tl-spectral study scale-pod --model char-shakespeare --n-docs 150 "
                               "--length 256 --out docs/results/scale_pod --fig-dir docs/figures",
    ("char-shakespeare", 1000): "tl-spectral study scale-pod --model char-shakespeare --n-docs 1000 "
                                "--length 256 --n-resamples 200 --out docs/results/scale_pod "
                                "--fig-dir docs/figures",
    ("minilm", 150): "tl-spectral study scale-pod --model minilm --n-docs 150 --length 256 "
                     "--corpus ../shared/data/wiki_excerpt.txt --out docs/results/scale_pod "
                     "--fig-dir docs/figures",
}
"""The command behind each committed run (its provenance)."""

PAPER_MODEL = "paper: char GPT, 6 layers, 8 heads, d_model 256, N = 150"


def run_suffix(summary: dict[str, Any]) -> str:
    """``"_val"`` for validation-only windows, ``"_s<stride>"`` for strided windows: the
    suffix of a run's file name and of its key in :func:`_runs` (empty for the runs made
    before these options, so their keys and doc blocks are unchanged)."""
    return ("_val" if summary.get("validation_only") else "") + \
        (f"_s{summary['stride']}" if summary.get("stride") else "")


def _runs(results_dir: str | Path) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for p in Path(results_dir).glob("scale_pod_*.json"):
        s = json.loads(p.read_text())
        out[(s["model"] + run_suffix(s), int(s["n_docs"]))] = s
    return dict(sorted(out.items()))


def _boot(s: dict[str, Any], layer: int, key: str) -> dict[str, Any] | None:
    """The interval of ``key`` in ``layer``: jackknife for :data:`JACKKNIFE_KEYS` (when the
    run has it), bootstrap percentile otherwise."""
    b = s.get("bootstrap")
    if not b:
        return None
    if key in JACKKNIFE_KEYS and "jackknife" in b:
        return b["jackknife"]["layers"][layer][key]
    return b["layers"][layer].get(key)


def _contrast(s: dict[str, Any], key: str) -> dict[str, Any] | None:
    """Interval of last − first layer for ``key`` (jackknife when present)."""
    b = s.get("bootstrap")
    if not b:
        return None
    if "jackknife" in b:
        return b["jackknife"]["last_minus_first"][key]
    return b["last_minus_first"][key]


def interval_markdown(s: dict[str, Any]) -> str:
    """Per layer: band shares, E fine − E coarse, H* and T_spec (99% fit) with their
    bootstrap intervals (a run without a bootstrap says how to rerun it)."""
    b = s.get("bootstrap")
    if not b:
        return (f"No intervals in this run; needs rerun: "
                f"`{COMMANDS.get((s['model'], int(s['n_docs'])), 'tl-spectral study scale-pod')}`")
    rows = ["| layer (paper) | E fine | E medium | E coarse | E fine − E coarse | H*(0.1) | "
            "T_spec (99% fit) |", "|---|---|---|---|---|---|---|"]
    for li, r in enumerate(s["table"]):
        cells = [fmt_interval(_boot(s, li, k), "{:.2f}") for k in
                 ("E_fine", "E_medium", "E_coarse", "E_fine_minus_coarse")]
        cells.append(fmt_interval(_boot(s, li, "H_star"), "{:.0f}"))
        cells.append(fmt_interval(_boot(s, li, "T_spec_99"), "{:.2f}"))
        rows.append(f"| {r['layer']} ({r['layer'] + 1}) | " + " | ".join(cells) + " |")
    rows.append("")
    jk = b.get("jackknife")
    rows.append(f"Band shares: 95% percentile bootstrap over the {s['n_docs']} documents, "
                f"{b['n_resamples']} resamples, seed {b['seed']}. "
                + (f"H* and T_spec: 95% delete-a-group jackknife ({jk['n_groups']} random "
                   f"groups, seed {jk['seed']}, θ̂ ± t·se), because a bootstrap resample holds "
                   "about 63% distinct documents and H* and T_spec depend on the number of "
                   "documents. H* is a count: where every replicate gives the same H*, the "
                   "jackknife interval has zero width (no variation at the resolution of one "
                   "mode), which is not certainty." if jk else
                   "H* and T_spec: bootstrap percentile, biased low (a resample holds about "
                   "63% distinct documents); rerun for the jackknife."))
    return "\n".join(rows)


def tspec_fits(eigenvalues: Sequence[float]) -> dict[int, dict[str, float]]:
    """T_spec of a spectrum fitted over the modes holding 90 / 95 / 99% of the energy:
    ``{90: {"T_spec", "n_fit", "r2", "overshoot"}, ...}``, ``overshoot`` = fitted λ_1 /
    measured λ_1 (how far the power law misses the first mode)."""
    import math

    import torch

    from tl_spectral.analysis.pod import spectral_concentration

    lam = torch.tensor(eigenvalues, dtype=torch.float64)
    out = {}
    for e in FIT_ENERGIES:
        f = spectral_concentration(lam, energy=e)
        out[round(100 * e)] = {"T_spec": f["T_spec"], "n_fit": f["n_fit"], "r2": f["r2"],
                               "overshoot": math.exp(f["intercept"]) / float(lam[0])}
    return out


def tspec_markdown(runs: dict[tuple[str, int], dict[str, Any]]) -> str:
    """T_spec of every layer of every run, fitted over the modes holding 90 / 95 / 99% of the
    energy (modes fitted in brackets; 99% is the library's default), with the 99% fit's R²
    and its overshoot of λ_1; from the eigenvalues stored in each run's JSON."""
    rows = ["| run | layer (paper) | T_spec, 90% fit (modes) | T_spec, 95% fit (modes) | "
            "T_spec, 99% fit (modes) | R², 99% fit | fitted λ_1 / measured λ_1, 99% fit |",
            "|---|---|---|---|---|---|---|"]
    for (model, n), s in runs.items():
        for lay in s["layers"]:
            f = tspec_fits(lay["full_eigenvalues"])
            cells = [f"{f[e]['T_spec']:.2f} ({f[e]['n_fit']})" for e in (90, 95, 99)]
            rows.append(f"| {model}, N = {n} | {lay['layer']} ({lay['layer'] + 1}) | "
                        + " | ".join(cells) + f" | {f[99]['r2']:.2f} | "
                        f"{f[99]['overshoot']:.3g} |")
    return "\n".join(rows)


def _sign_verdict(iv: dict[str, Any] | None, positive: bool = True) -> str:
    from tl_spectral_studies.verdicts import side

    return "—" if iv is None else side(iv, 0.0, below=not positive)


VERDICT_RUNS: tuple[tuple[tuple[str, int], str], ...] = (
    (("char-shakespeare-d256", 150), "d_model 256 (the paper's width), N = 150"),
    (("char-shakespeare-d256_val_s64", 1000), "d_model 256, N = 1,000"),
    (("char-shakespeare", 150), "d_model 128, N = 150"),
    (("char-shakespeare_val_s64", 1000), "d_model 128, N = 1,000"),
)
"""The runs of the claim table (its columns): the paper's configuration (6 layers, 8 heads,
d_model 256) and our d_model-128 model, each on N = 150 disjoint validation windows and on
N = 1,000 validation windows at stride 64 (overlapping: the validation text holds 403
disjoint windows of 256 characters)."""


def _claim_cells(s: dict[str, Any], n: int) -> list[str]:
    """The six claim cells (number [95% CI]: verdict) of one run, in the row order of
    :func:`verdict_markdown`."""
    L = len(s["table"])
    boot = bool(s.get("bootstrap"))
    cells = []
    for layers, positive in (((0, 1), True), ((L - 2, L - 1), False)):
        for li in layers:
            r = s["table"][li]
            iv = _boot(s, li, "E_fine_minus_coarse") if boot else None
            num = fmt_interval(iv, "{:.2f}") if iv else f"{r['E_fine'] - r['E_coarse']:.2f}"
            cells.append(f"{num}: " + (_sign_verdict(iv, positive) if iv else
                                       "not distinguishable (no interval in this run)"))
    hs = [r["H_star"] for r in s["table"]]
    sat = [h for h in hs if str(h).startswith("≥")]
    dh = _contrast(s, "H_star") if boot else None
    cells.append(f"{', '.join(str(h) for h in hs)} (at most {n - 1})"
                 + (f"; layer {L} − layer 1 = {fmt_interval(dh, '{:.0f}')}" if dh else "")
                 + ": " + ("**not reproduced**: no layer saturates"
                           + (", the last layer is the least compressible"
                              if dh and dh["low"] > 0 else "") if not sat else "see the values"))
    f0, fL = (tspec_fits(s["layers"][i]["full_eigenvalues"]) for i in (0, L - 1))
    d = _contrast(s, "T_spec_99") if boot else None
    cells.append(f"{f0[99]['T_spec']:.2f} → {fL[99]['T_spec']:.2f} (99% fit), "
                 f"{f0[90]['T_spec']:.2f} → {fL[90]['T_spec']:.2f} (90% fit)"
                 + (f"; layer {L} − layer 1 = {fmt_interval(d, '{:.2f}')}" if d else "")
                 + ": " + ((_sign_verdict(d, positive=False)
                            + (", T_spec rises with depth" if d["low"] > 0 else ""))
                           if d else "not distinguishable (no interval in this run)"))
    return cells


def _claim_rows(L: int) -> list[str]:
    return [
        "layers 1–2 put their energy at fine scales a ≤ 7 (SPEC A; seed 000): E fine − E "
        "coarse, layer 1",
        "… layer 2",
        f"layers {L - 1}–{L} at coarse scales a ≥ 20 (SPEC A; seed 000): E fine − E coarse, "
        f"layer {L - 1}",
        f"… layer {L}",
        "H*(0.1) > 150 (saturated) for layers 1–2 vs ≈ 91 for layers 3–6 at N = 150 (SPEC A; "
        "seed 000): H* by layer",
        "T_spec = 1/β high early (slow decay), low late (SPEC A.7; the summary's \"T_spec ≈ "
        "1.0\" for early layers contradicts 1/β): T_spec layer 1 → layer 6",
    ]


NOT_TESTED = (
    ("interpretable POD modes (seed 000): oscillations at lags 2–10 in layer 2, peaks at lags "
     "10–35 in layer 4, multiple peaks at 10–40 in layer 6",
     "not tested, because the summary gives no criterion for an oscillating or peaked mode; "
     "the modes are drawn for reading by eye (figures scale_pod_*_modes_*.png)"),
    ("the energy-gated variant of the scale POD (seed 000)",
     "not implemented: the summary does not define it"),
)
"""Headline claims of seed 000 with no test here, each with the reason (one cell per run)."""


def overlapping(s: dict[str, Any]) -> bool:
    """The run's windows overlap (a stride below the window length): its intervals resample
    dependent windows as if independent, so it carries no verdict."""
    stride = s.get("stride")
    return stride is not None and int(stride) < int(s.get("length", 0))


def descriptive_cell(cell: str) -> str:
    """``"number: verdict"`` → ``"number: descriptive (…)"`` for a run on overlapping windows."""
    num = cell.split(": ", 1)[0]
    return f"{num}: descriptive (overlapping windows: the interval is too narrow, no verdict)"


SMOL_IDS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    # (text in the claim row, the SmolLM2 verdict ids of docs/results/real_decoder/
    # verdicts.json that answer it; None: no SmolLM2 measurement); the first match wins.
    # The band record holds both ends (SmolLM2 layer 0 fine, layer 29 coarse).
    ("put their energy at fine scales a ≤ 7", ("A.bands",)),
    ("at coarse scales a ≥ 20", ("A.bands",)),
    ("… layer ", ("A.bands",)),  # the second layer of either band claim
    ("H*(0.1) > 150 (saturated)", ("A.hstar",)),
    ("T_spec = 1/β high early", ("A.tspec",)),
    ("interpretable POD modes", None),
    ("the energy-gated variant of the scale POD", None),
)


def _smol_ids(cells: Sequence[str]) -> tuple[str, ...] | None:
    for text, ids in SMOL_IDS:
        if text in cells[0]:
            return ids
    raise KeyError(f"docs/scale_pod.md: claim row {cells[0]!r} has no SmolLM2 mapping; add "
                   "it to scale_pod.SMOL_IDS (None when SmolLM2 has no measurement for it)")


def verdict_markdown(runs: dict[tuple[str, int], dict[str, Any]],
                     results_dir: str | Path | None = None,
                     smol_verdicts: str | Path | None = None) -> str:
    """The claim table of docs/scale_pod.md: the paper's headline results (SPEC A, seed 000),
    one row per claim, one column per run of :data:`VERDICT_RUNS` (the paper's width beside
    ours, validation windows only), each cell the number with its 95% interval and the
    verdict; a run not yet made says how to make it. With ``results_dir``, every
    real-decoder model of the claims registry adds a column through :data:`SMOL_IDS`
    (SmolLM2 from ``smol_verdicts`` when given)."""
    from tl_spectral_studies import smol_column

    present = [(key, label) for key, label in VERDICT_RUNS if key in runs]
    missing = [(key, label) for key, label in VERDICT_RUNS if key not in runs]
    L = len(runs[present[0][0]]["table"]) if present else 6
    rows = ["| paper's claim (source): what is compared | "
            + " | ".join(label for _, label in present) + " |",
            "|---|" + "---|" * len(present)]
    cols = [_claim_cells(runs[key], key[1]) for key, _ in present]
    cols = [[descriptive_cell(c) for c in col] if overlapping(runs[key]) else col
            for col, (key, _) in zip(cols, present)]
    for i, claim in enumerate(_claim_rows(L)):
        rows.append(f"| {claim} | " + " | ".join(c[i] for c in cols) + " |")
    for claim, why in NOT_TESTED:
        rows.append(f"| {claim} | " + " | ".join(why for _ in present) + " |")
    rows.append("")
    rows.append("Models: 6 layers, 8 heads, context 256, trained 2,600 steps on Tiny "
                "Shakespeare (d_model 256: `char-shakespeare-d256`, the paper's configuration — "
                + PAPER_MODEL + "; d_model 128: `char-shakespeare`). Windows: 256 characters from the "
                "validation text only (the last 10%, never trained on): N = 150 disjoint "
                "windows; N = 1,000 windows starting at multiples of 64 characters "
                "(overlapping; the validation text holds 403 disjoint windows).")
    for key, label in missing:
        rows.append("")
        rows.append(f"Not yet run: {label} — `{COMMANDS[key]}`.")
    b = [(key, runs[key]["bootstrap"]) for key, _ in present if runs[key].get("bootstrap")]
    if b:
        rows.append("")
        rows.append("Intervals: band shares, 95% percentile bootstrap over documents "
                    "(resamples: " + ", ".join(f"{key[0]} N = {key[1]}: {bb['n_resamples']}"
                                               for key, bb in b)
                    + f"; seed {b[0][1]['seed']}); H* and T_spec, 95% delete-a-group "
                    "jackknife over documents (groups: " + ", ".join(
                        f"{key[0]} N = {key[1]}: {bb['jackknife']['n_groups']}" for key, bb in b
                        if "jackknife" in bb)
                    + "), since both depend on the number of documents. The N = 1,000 "
                    "windows overlap (stride 64 < 256), so intervals that resample them as "
                    "independent documents are too narrow there: those columns are "
                    "descriptive, and the N = 150 columns (disjoint windows) carry the "
                    "verdicts. Each cell is its own 95% call (one per run and layer), with no "
                    "correction for the several layers and runs: they are read together only "
                    "where every interval is far from the threshold. The paper gives no "
                    "uncertainty.")
    if results_dir is None:
        return "\n".join(rows)
    md = smol_column.add_columns("\n".join(rows), _smol_ids, results_dir, smol_verdicts)
    smol = smol_column.records_for(results_dir, smol_verdicts)
    if smol is not None and "A.alloc" in smol:
        md += ("\n\nSmolLM2-135M head allocation (SPEC A.10; no claim row above): "
               + smol_column.record_text(smol["A.alloc"]) + ".")
    return md


def tables(results_dir: str | Path, *, smol_verdicts: str | Path | None = None
           ) -> dict[str, str]:
    """Every generated block of docs/scale_pod.md, by key, from the committed runs; the claim
    table's SmolLM2 column from ``smol_verdicts`` (default: the real-decoder study's
    verdicts.json beside ``results_dir``)."""

    runs = _runs(results_dir)
    out = {"scale_pod/verdict": verdict_markdown(runs, results_dir, smol_verdicts),
           "scale_pod/tspec": tspec_markdown(runs)}
    for (model, n), s in runs.items():
        out[f"scale_pod/{model}_N{n}/table"] = table_markdown(s)
        out[f"scale_pod/{model}_N{n}/intervals"] = interval_markdown(s)
    fp = Path(results_dir).parent / "field_pod"
    if any(fp.glob("field_pod_*.json")):
        from tl_spectral_studies import field_pod

        out["scale_pod/field_pod"] = field_pod.markdown(fp).strip()
    pd = Path(results_dir).parent / "real_decoder" / "pod_depth"
    if any(pd.glob("pod_depth_*.json")):
        from tl_spectral_studies import pod_depth_tables

        out["scale_pod/pod_depth"] = pod_depth_tables.markdown(pd).strip()
    ha = Path(results_dir).parent / "head_allocation"
    if (ha / "summary.json").is_file():
        from tl_spectral_studies import head_allocation

        out["scale_pod/head_allocation"] = head_allocation.markdown(ha).strip()
        out["scale_pod/verdict"] += ("\n\nThe head allocation the study recommends (SPEC A.10), "
                                     "trained against the uniform model at equal attention "
                                     "parameters (section \"Head allocation, trained\"): "
                                     + head_allocation.short_verdict(ha) + ".")
    return out


def markdown(results_dir: str | Path) -> str:
    """Every generated table of docs/scale_pod.md (:func:`tables`), each under its key: the
    claim table, the T_spec sensitivity table and, per run, the per-layer table and the
    intervals."""
    return "\n\n".join(f"<!-- {k} -->\n{v}" for k, v in tables(results_dir).items()) + "\n"


def main(argv: Sequence[str], prog: str = "tl-spectral study scale-pod") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="tl_spectral_study_scale_pod")
    ap.add_argument("--model", default="char-shakespeare")
    ap.add_argument("--corpus", default="shakespeare",
                    help="'shakespeare' (bundled) or the path of a UTF-8 text file")
    ap.add_argument("--n-docs", type=int, default=150)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--max-lag", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=seed_arg, default=0)
    ap.add_argument("--stride", type=int, default=None,
                    help="windows start at multiples of this inside the validation split "
                         "(overlapping when below --length); e.g. 64 gives 1,700 windows of "
                         "256 characters from Tiny Shakespeare's validation text")
    ap.add_argument("--validation-only", action="store_true",
                    help="never fall back to the whole text when the validation split holds "
                         "too few windows: fail and name the stride to pass")
    ap.add_argument("--fields", default=None,
                    help="compare the scale POD of these per-pair fields (comma-separated, "
                         "attention first, e.g. attention,contribution,value_weighted) with "
                         "bootstrap intervals over documents: the field-pod comparison of "
                         "docs/scale_pod.md (tl_spectral_studies.field_pod)")
    ap.add_argument("--n-resamples", type=int, default=1000,
                    help="bootstrap resamples over documents for the intervals (0: none)")
    ap.add_argument("--bootstrap-seed", type=int, default=0,
                    help="seed of the bootstrap resamples (with --fields)")
    args = ap.parse_args(list(argv))
    if args.fields is not None:
        from tl_spectral_studies.field_pod import main as field_main

        return field_main(argv, prog=prog)
    if args.quick:
        args.n_docs, args.length = min(args.n_docs, 16), min(args.length, 128)
        args.n_resamples = min(args.n_resamples, 50)
    out = prepare_out(args.out, NAME, overwrite=args.overwrite)
    s = run_study(out, model=args.model, corpus=args.corpus, n_docs=args.n_docs,
                  length=args.length, max_lag=args.max_lag, batch_size=args.batch_size,
                  seed=args.seed, fig_dir=args.fig_dir, n_resamples=args.n_resamples,
                  command=" ".join(["tl-spectral study scale-pod", *argv]),
                  stride=args.stride, validation_only=args.validation_only)
    print(f"{s['view']}; {s['n_docs']} windows of {s['length']} ({s['windows_from']}); "
          f"forward {s['forward_s']:.1f} s, analysis {s['analysis_s']:.1f} s")
    print(table_markdown(s))
    print(Path(out).resolve())
    return 0
