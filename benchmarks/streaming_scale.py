"""Benchmark of the streamed scale POD (issue 19): memory and time against N.

The zoo model ``char-shakespeare`` (6 layers, 8 heads, d_model 128), Tiny Shakespeare
tokenized once into a token file, N disjoint windows of T = 256 tokens drawn lazily from it
(the same windows as ``document_windows`` for the seed), ``AttentionFieldProbe(streaming=
True, rank=K)`` through ``run_probes`` (both passes) and ``.scale_pod(n_heads=8)``. Every N
runs in a fresh subprocess, so its peak resident memory (``VmHWM``: model, code and all) is
its own. Baseline in the same run: today's in-memory path (every document's field kept,
``AttentionFields.scale_pod``) at N = ``--ref-docs`` (1,000), in its own subprocess.

Figures (the last line printed, one JSON object):

- ``mem_growth``: peak RSS at the largest N / at the smallest (target <= 1.2);
- ``time_exponent``: least-squares slope of log(wall time) on log(N) (target <= 1.15);
- ``eig_rel_err``: largest relative error of the top-32 band eigenvalues (every layer, every
  band), streamed vs in-memory at N = ``--ref-docs`` (target <= 1e-3); ``full_eig_rel_err``
  the same for the whole-field POD;
- ``hstar_equal``: for the whole field and every band of every layer, the streamed H*
  equals the in-memory H* where it is exact, and where it is reported as bounds (a range
  ``lo–hi``, ``≥ lo`` or ``> K``) the in-memory H* lies within them; ``hstar_exact``: how
  many of them were exact; ``scales_equal``: the dominant scales agree;
- per N: wall seconds, peak RSS (MiB); the in-memory reference's wall time and peak RSS.

Usage: ``python benchmarks/streaming_scale.py [--n-docs 500,1000,2000,4000] [--rank 512]
[--ref-docs 1000] [--records DIR [--resume]]``; ``--quick`` runs N = 40, 80 with T = 64 and
K = 16 (a smoke test). The figures in docs/scale_pod.md: ``--records
docs/results/streaming_scale/records`` (one JSON record per run; the summary line in
docs/results/streaming_scale/summary.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import proc_status_kib  # noqa: E402


def _summaries(pod, top: int = 32) -> dict:
    out = {}
    for layer in pod.layers:
        out[str(layer.layer)] = {
            "scales": layer.dominant_scales,
            "full_eig": layer.full_eigenvalues[:top].tolist(),
            "full_H": layer.full["H_star"],
            "full_H_str": layer.full["H_star_str"],
            "T_spec": layer.full["T_spec"],
            "bands": [
                {"eig": layer.band_eigenvalues[str(b)][:top].tolist(), "H": s["H_star"],
                 "H_str": s["H_star_str"], "T_spec": s["T_spec"]}
                for b, s in enumerate(layer.bands)
            ],
        }
    return out


def child(mode: str, n_docs: int, tokens: str, length: int, rank: int, batch: int) -> None:
    import torch

    from tl_spectral.data.tokenfile import TokenFile
    from tl_spectral.models import zoo
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, _ = zoo.load("char-shakespeare")
    windows = TokenFile(tokens).windows(n_docs, length, seed=0)
    t0 = time.perf_counter()
    if mode == "stream":
        probe = AttentionFieldProbe(streaming=True, rank=rank, fold_every=256)
        res = run_probes(model, windows, [probe], batch_size=batch, progress=False)
    else:  # today's in-memory path: every window's field kept
        res = run_probes(model, windows.tokens, [AttentionFieldProbe()], batch_size=batch,
                         progress=False)
    pod = res["attention_fields"].scale_pod(n_heads=8)
    wall = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "n_docs": n_docs, "wall_s": wall,
                      "peak_rss_mib": proc_status_kib("VmHWM") / 1024,
                      "layers": _summaries(pod)}))


def _run_child(mode: str, n: int, args, tokens: str) -> dict:
    """One child run; its whole record is kept in ``--records`` (and reused from there with
    ``--resume``), so an interrupted benchmark keeps what it measured."""
    rec_path = Path(args.records) / f"{mode}_{n}_T{args.length}_K{args.rank}.json" if args.records else None
    if rec_path is not None and args.resume and rec_path.is_file():
        rec = json.loads(rec_path.read_text())
    else:
        cmd = [sys.executable, __file__, "--child", mode, str(n), "--tokens", tokens,
               "--length", str(args.length), "--rank", str(args.rank), "--batch", str(args.batch)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        if rec_path is not None:
            rec_path.parent.mkdir(parents=True, exist_ok=True)
            rec_path.write_text(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "layers"}), flush=True)
    return rec


def compare(ref: dict, st: dict, rank: int) -> dict:
    eig_err = full_err = 0.0
    h_ok = scales_ok = True
    n_exact = n_all = 0
    for key, a in ref["layers"].items():
        b = st["layers"][key]
        scales_ok &= a["scales"] == b["scales"]

        def rel(x, y):
            n = min(len(x), len(y))
            return max((abs(p - q) / abs(p) for p, q in zip(x[:n], y[:n])), default=0.0)

        def h_same(ha, hb, hb_str):
            """The streamed H* string holds the in-memory H*: exact ("h"), a range
            ("lo–hi"), a lower bound ("≥ lo") or "> K"."""
            nonlocal n_exact, n_all
            n_all += 1
            if hb_str.startswith(">"):
                return ha > rank
            if hb_str.startswith("≥"):
                return ha >= int(hb_str[1:].strip())
            if "–" in hb_str:
                lo_s, hi_s = hb_str.split("–")
                return int(lo_s) <= ha <= int(hi_s)
            n_exact += 1
            return ha == hb

        full_err = max(full_err, rel(a["full_eig"], b["full_eig"]))
        h_ok &= h_same(a["full_H"], b["full_H"], b["full_H_str"])
        for ba, bb in zip(a["bands"], b["bands"]):
            eig_err = max(eig_err, rel(ba["eig"], bb["eig"]))
            h_ok &= h_same(ba["H"], bb["H"], bb["H_str"])
    return {"eig_rel_err": eig_err, "full_eig_rel_err": full_err, "hstar_equal": bool(h_ok),
            "hstar_exact": f"{n_exact}/{n_all}", "scales_equal": bool(scales_ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-docs", default="500,1000,2000,4000")
    ap.add_argument("--ref-docs", type=int, default=1000)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--rank", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--records", default=None,
                    help="folder for each run's full record (JSON), e.g. "
                         "docs/results/streaming_scale/records")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the records already in --records")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "N"))
    ap.add_argument("--tokens")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.tokens, args.length, args.rank, args.batch)
        return
    if args.quick:
        args.n_docs, args.ref_docs, args.length, args.rank = "40,80", 40, 64, 16
    ns = [int(x) for x in args.n_docs.split(",")]

    from tl_spectral.data import tiny_shakespeare
    from tl_spectral.data.tokenfile import write_token_file
    from tl_spectral.models import zoo

    with tempfile.TemporaryDirectory() as tmp:
        _, tok = zoo.load("char-shakespeare")
        tokens = str(write_token_file(Path(tmp) / "shakespeare.tok",
                                      [tok.encode(tiny_shakespeare(), unknown="drop")],
                                      model="char-shakespeare", vocab_size=tok.vocab_size))
        # the accuracy pair first, then the other N
        ref = _run_child("memory", args.ref_docs, args, tokens)
        runs = {args.ref_docs: _run_child("stream", args.ref_docs, args, tokens)}
        runs.update({n: _run_child("stream", n, args, tokens) for n in ns if n not in runs})
    xs = [math.log(n) for n in ns]
    ys = [math.log(runs[n]["wall_s"]) for n in ns]
    xm, ym = sum(xs) / len(xs), sum(ys) / len(ys)
    # the exponent needs two sizes at least; with one N there is no slope to report
    sxx = sum((x - xm) ** 2 for x in xs)
    slope = (sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else None
    out = {
        "benchmark": "streaming_scale",
        "model": "char-shakespeare",
        "T": args.length,
        "rank": args.rank,
        "n_docs": ns,
        "wall_s": [round(runs[n]["wall_s"], 1) for n in ns],
        "peak_rss_mib": [round(runs[n]["peak_rss_mib"], 1) for n in ns],
        "mem_growth": runs[ns[-1]]["peak_rss_mib"] / runs[ns[0]]["peak_rss_mib"],
        "time_exponent": slope,
        **compare(ref, runs[args.ref_docs], args.rank),
        "in_memory_ref": {"n_docs": args.ref_docs, "wall_s": round(ref["wall_s"], 1),
                          "peak_rss_mib": round(ref["peak_rss_mib"], 1)},
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
