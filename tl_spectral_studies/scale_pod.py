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
from tl_spectral_studies._common import add_run_arguments, prepare_out, save_figures

NAME = "scale-pod"


def run_study(out_dir: str | Path, *, model: str = "char-shakespeare",
              corpus: str = "shakespeare", n_docs: int = 150, length: int = 256,
              max_lag: int | None = None, batch_size: int = 16, seed: int = 0,
              fig_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the attention-field probe and scale POD; write the JSON summary and figures.
    Returns the summary (also in ``out_dir/scale_pod_<model>_N<n_docs>.json``)."""
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral.cli import load_corpus, load_model
    from tl_spectral.data import document_windows, train_val_split
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    net, tok = load_model(model)
    view = ModelView(net)
    text = load_corpus(corpus)
    _, val = train_val_split(text)
    try:
        windows = document_windows(val, tok, n_docs, length, seed=seed)
        source = "validation split"
    except ValueError:
        windows = document_windows(text, tok, n_docs, length, seed=seed)
        source = "whole corpus"
    t0 = time.perf_counter()
    fields = run_probes(view, windows, [AttentionFieldProbe(max_lag=max_lag)],
                        batch_size=batch_size)["attention_fields"]
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    pod = fields.scale_pod(n_heads=view.n_heads)
    t_an = time.perf_counter() - t0
    tag = f"scale_pod_{model}_N{n_docs}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "model": model, "view": repr(view), "corpus": corpus, "windows_from": source,
        "n_docs": n_docs, "length": length, "max_lag": max_lag, "seed": seed,
        "forward_s": round(t_fwd, 2), "analysis_s": round(t_an, 2),
        "table": pod.table(), **pod.to_dict(include_curves=True),
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


def markdown(results_dir: str | Path) -> str:
    """The per-layer table of every ``scale_pod_*.json`` under ``results_dir``, each under a
    heading naming the model, N and T."""
    parts = []
    for p in sorted(Path(results_dir).glob("scale_pod_*.json")):
        s = json.loads(p.read_text())
        parts.append(f"### {s['model']}, N = {s['n_docs']}, T = {s['length']} "
                     f"(windows from the {s.get('windows_from', '?')})\n\n" + table_markdown(s))
    return "\n\n".join(parts) + "\n"


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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fields", default=None,
                    help="compare the scale POD of these per-pair fields (comma-separated, "
                         "attention first, e.g. attention,contribution,value_weighted) with "
                         "bootstrap intervals over documents: the field-pod comparison of "
                         "docs/scale_pod.md (tl_spectral_studies.field_pod)")
    ap.add_argument("--n-resamples", type=int, default=1000,
                    help="bootstrap resamples of the field comparison (with --fields)")
    ap.add_argument("--bootstrap-seed", type=int, default=0,
                    help="seed of the bootstrap resamples (with --fields)")
    args = ap.parse_args(list(argv))
    if args.fields is not None:
        from tl_spectral_studies.field_pod import main as field_main

        return field_main(argv, prog=prog)
    if args.quick:
        args.n_docs, args.length = min(args.n_docs, 16), min(args.length, 128)
    out = prepare_out(args.out, NAME, overwrite=args.overwrite)
    s = run_study(out, model=args.model, corpus=args.corpus, n_docs=args.n_docs,
                  length=args.length, max_lag=args.max_lag, batch_size=args.batch_size,
                  seed=args.seed, fig_dir=args.fig_dir)
    print(f"{s['view']}; {s['n_docs']} windows of {s['length']} ({s['windows_from']}); "
          f"forward {s['forward_s']:.1f} s, analysis {s['analysis_s']:.1f} s")
    print(table_markdown(s))
    print(Path(out).resolve())
    return 0
