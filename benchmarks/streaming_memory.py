"""Peak memory of the streamed scale POD against N (issue 42 item 4), before and after.

Model: a random-weight Llama shaped like SmolLM2-135M (9 query / 3 key-value heads, d_model
576, RoPE; the 64-token character vocabulary) with ``--layers`` layers (default 2: the
probe's memory is per layer), saved to a temporary folder. Corpus: N windows of T = 256
random token ids (the first N rows of one fixed draw, so every N shares its windows).
Every run is a fresh process: the model loaded, one plain forward of a batch as the warm-up
(its ``VmHWM`` is ``forward_mib``), then ``AttentionFieldProbe(streaming=True, rank=K,
fold_every=B)`` through ``run_probes`` (both passes) and ``.scale_pod(n_heads=9)``; its
``VmHWM`` at the end is ``peak_mib``. ``--code DIR[,DIR]`` runs the same children against
other checkouts of ``tl_spectral`` (e.g. the code before this change, from ``git archive``)
under the labels of ``--labels``.

Figures (the last line printed, one JSON object): per label, ``peak_mib`` and ``probe_mib``
(peak − forward) per N, ``growth`` = peak at the largest N / peak at the smallest (target
≤ 1.1), ``mib_per_layer`` = probe_mib / layers, wall seconds; ``eig_rel_diff``: the
largest relative difference of the top-8 whole-field and band eigenvalues between the
first two labels (the same numbers, to float32 rounding); with ``--fold-every-sweep``, the
last label at N = ``--sweep-n`` (512) for each ``fold_every`` (peak, wall time).

Usage: ``flock /work/heavy.lock env OMP_NUM_THREADS=1 python benchmarks/streaming_memory.py
--code /tmp/base,. --labels before,after --fold-every-sweep 64,256`` (the committed line:
docs/results/benchmarks/streaming_memory.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import proc_status_kib  # noqa: E402


def child(folder: str, n: int, length: int, rank: int, fold_every: int, batch: int) -> None:
    import torch

    from tl_spectral.models.loading import load_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    torch.set_num_threads(1)
    model, _ = load_model(folder)
    toks = torch.randint(1, 64, (1024, length), generator=torch.Generator().manual_seed(0))[:n]
    with torch.no_grad():
        model(toks[:batch])  # the warm-up: the plain forward only
    forward = proc_status_kib("VmHWM") / 1024
    t0 = time.perf_counter()
    probe = AttentionFieldProbe(streaming=True, rank=rank, fold_every=fold_every)
    res = run_probes(model, toks, [probe], batch_size=batch, progress=False)["attention_fields"]
    pod = res.scale_pod(n_heads=9)
    wall = time.perf_counter() - t0
    eig = {f"{la.layer}.full": la.full_eigenvalues[:8].tolist() for la in pod.layers}
    eig.update({f"{la.layer}.band{k}": v[:8].tolist() for la in pod.layers
                for k, v in la.band_eigenvalues.items()})
    print(json.dumps({"n_docs": n, "fold_every": fold_every, "wall_s": round(wall, 1),
                      "forward_mib": round(forward, 1),
                      "peak_mib": round(proc_status_kib("VmHWM") / 1024, 1),
                      "band_dims": {k: v["dim"] for k, v in res.pods.items()}, "eig": eig}))


def run_child(code: str, folder: str, n: int, args, fold_every: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(code).resolve()), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, __file__, "--child", folder, str(n), "--length", str(args.length),
           "--rank", str(args.rank), "--fold-every", str(fold_every), "--batch", str(args.batch)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in rec.items() if k not in ("eig", "band_dims")}), flush=True)
    return rec


def summary(runs: list[dict], layers: int) -> dict:
    peak = [r["peak_mib"] for r in runs]
    probe = [round(r["peak_mib"] - r["forward_mib"], 1) for r in runs]
    return {"peak_mib": peak, "forward_mib": [r["forward_mib"] for r in runs], "probe_mib": probe,
            "mib_per_layer": [round(p / layers, 1) for p in probe],
            "growth": round(peak[-1] / peak[0], 3), "wall_s": [r["wall_s"] for r in runs]}


def eig_diff(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for ra, rb in zip(a, b):
        for k, x in ra["eig"].items():
            for p, q in zip(x, rb["eig"].get(k, [])):
                worst = max(worst, abs(p - q) / abs(p))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-docs", default="128,256,512,1024")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--rank", type=int, default=512)
    ap.add_argument("--fold-every", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--code", default=".", help="checkouts of tl_spectral, comma-separated")
    ap.add_argument("--labels", default="after")
    ap.add_argument("--fold-every-sweep", default="", help="e.g. 64,256 (last label, --sweep-n)")
    ap.add_argument("--sweep-n", type=int, default=512)
    ap.add_argument("--child", nargs=2, metavar=("FOLDER", "N"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.length, args.rank, args.fold_every,
              args.batch)
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from _tiny_hf import save_smol_shape

    ns = [int(x) for x in args.n_docs.split(",")]
    codes, labels = args.code.split(","), args.labels.split(",")
    out: dict = {"benchmark": "streaming_memory", "model": f"smollm2-shape-random-{args.layers}L",
                 "T": args.length, "rank": args.rank, "fold_every": args.fold_every,
                 "batch": args.batch, "layers": args.layers, "n_docs": ns}
    runs: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(save_smol_shape(Path(tmp) / "smol", n_layers=args.layers))
        for code, label in zip(codes, labels):
            runs[label] = [run_child(code, folder, n, args, args.fold_every) for n in ns]
            out[label] = summary(runs[label], args.layers)
        if len(labels) > 1:
            out["eig_rel_diff"] = eig_diff(runs[labels[0]], runs[labels[1]])
        out["band_dims"] = runs[labels[-1]][-1]["band_dims"]
        if args.fold_every_sweep:
            sweep = {args.fold_every: runs[labels[-1]][ns.index(args.sweep_n)]}
            for fe in (int(x) for x in args.fold_every_sweep.split(",")):
                sweep[fe] = run_child(codes[-1], folder, args.sweep_n, args, fe)
            out["fold_every_sweep_n"] = args.sweep_n
            out["fold_every_sweep"] = {
                str(fe): {"peak_mib": r["peak_mib"], "wall_s": r["wall_s"],
                          "mib_per_layer": round((r["peak_mib"] - r["forward_mib"]) / args.layers, 1)}
                for fe, r in sorted(sweep.items())}
    out["threads"] = 1
    print(json.dumps(out))


if __name__ == "__main__":
    main()
