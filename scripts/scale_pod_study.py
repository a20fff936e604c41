"""Issue 5 results: scale-selective POD of a model's attention fields over N windows.

    python scripts/scale_pod_study.py --model char-shakespeare --n-docs 150 --length 256
    python scripts/scale_pod_study.py --model char-shakespeare --n-docs 1000 --length 256
    python scripts/scale_pod_study.py --model minilm --n-docs 150 --length 256 \
        --corpus ../shared/data/wiki_excerpt.txt

Windows come from the validation part (last 10%) of the corpus when it holds enough of them,
else from the whole text. Writes docs/results/scale_pod_<model>_N<n>.json and figures under
docs/figures/scale_pod_<model>_N<n>_*.png; prints the per-layer table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="char-shakespeare")
    ap.add_argument("--corpus", default="shakespeare")
    ap.add_argument("--n-docs", type=int, default=150)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--max-lag", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()

    import torch

    from tl_spectral.cli import load_corpus, load_model
    from tl_spectral.data import document_windows, train_val_split
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    model, tok = load_model(args.model)
    view = ModelView(model)
    text = load_corpus(args.corpus)
    _, val = train_val_split(text)
    try:
        windows = document_windows(val, tok, args.n_docs, args.length, seed=args.seed)
        source = "validation split"
    except ValueError:
        windows = document_windows(text, tok, args.n_docs, args.length, seed=args.seed)
        source = "whole corpus"
    t0 = time.perf_counter()
    fields = run_probes(view, windows, [AttentionFieldProbe(max_lag=args.max_lag)],
                        batch_size=args.batch_size)["attention_fields"]
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    pod = fields.scale_pod(n_heads=view.n_heads)
    t_an = time.perf_counter() - t0
    tag = f"scale_pod_{args.model}_N{args.n_docs}"
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    summary = {
        "model": args.model, "view": repr(view), "corpus": args.corpus, "windows_from": source,
        "n_docs": args.n_docs, "length": args.length, "max_lag": args.max_lag,
        "forward_s": round(t_fwd, 2), "analysis_s": round(t_an, 2),
        "table": pod.table(), **pod.to_dict(include_curves=True),
    }
    (out / "results" / f"{tag}.json").write_text(json.dumps(summary, indent=1, default=float))
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
    import matplotlib.pyplot as plt

    for name, fig in figs.items():
        fig.savefig(out / "figures" / f"{tag}_{name}.png", dpi=90, bbox_inches="tight")
        plt.close(fig)
    print(f"{view}; {args.n_docs} windows of {args.length} ({source}); forward {t_fwd:.1f} s, "
          f"analysis {t_an:.1f} s")
    for row in pod.table():
        print(row)
    print(json.dumps({"allocation": pod.allocation}, default=float))
    del torch


if __name__ == "__main__":
    main()
