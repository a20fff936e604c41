"""The report stages of ``tl-spectral analyze`` against its probe pass, at real depth.

Model: a random-weight Llama-style Hugging Face model shaped like SmolLM2-135M (30 layers,
9 query / 3 key-value heads, d_model 576, d_mlp 1,536, RoPE; a 64-token character vocabulary
— the vocabulary does not change the attention work), saved to a temporary folder; or
``--model PATH_OR_ZOO_NAME`` (e.g. the zoo's ``smollm2-135m``). Corpus: the bundled
Tiny Shakespeare, 16 windows of 256 tokens (``--n-docs``, ``--length``), every section.

Phases (seconds, from the report's ``report.json`` ``timings_s``, all from the same run):
``probe pass`` (the baseline: the one ``run_probes`` pass of every section's probes), the
other model passes (``pass <key>``: the perplexity check with its random-weight twin, the
views' patterns, induction on repeated tokens, the weight geometry, the zero-shot
linearization curve), each section's derive step (the scale POD itself, its jackknife) and
render (figures, views, tables), the page write and the saved state. ``ratio`` = (all of them
but the probe pass) / probe pass; ``passes_s`` / ``passes_ratio``: the model passes alone;
``render_s`` / ``render_ratio``: the rest (derive, sections, write, save state;
:func:`tl_spectral.stages.stage_sums`). Issue 42's target: ≤ 0.5. ``report_mb``: the whole
report folder. Knobs: --threads (torch CPU threads, default 1), --keep (keep the report
folder). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a zoo name or HF folder (default: a "
                    "random SmolLM2-shaped model in a temporary folder)")
    ap.add_argument("--n-docs", type=int, default=16)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from _tiny_hf import save_smol_shape

    from tl_spectral.cli import main as cli
    from tl_spectral.stages import stage_sums

    tmp = Path(tempfile.mkdtemp(prefix="report_stages-"))
    try:
        model = args.model
        if model is None:
            model = str(save_smol_shape(tmp / "smol30"))
        out = tmp / "report"
        t0 = time.perf_counter()
        rc = cli(["analyze", "--model", model, "--n-docs", str(args.n_docs), "--length",
                  str(args.length), "--out", str(out), "--no-progress"])
        wall = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"analyze failed with status {rc}")
        t = json.loads((out / "report.json").read_text())["timings_s"]
        base = t["probe pass"]
        stages = {k: v for k, v in t.items() if k != "probe pass"}
        sums = stage_sums(t)
        total = sums["stages"]
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
        page = (out / "index.html").stat().st_size / 1e6
        for k, v in t.items():
            print(f"{k:32s} {v:8.2f} s")
        for k, label in (("passes", "model passes"), ("render", "rendering"),
                         ("stages", "report stages (sum)")):
            print(f"{label:32s} {sums[k]:8.2f} s  = {sums[k] / base:.2f} × the probe pass")
        print(f"report folder {size:.1f} MB (index.html {page:.1f} MB); analyze wall {wall:.1f} s")
        if args.keep:
            print("kept:", out)
        print(json.dumps({"bench": "report_stages", "model": args.model or "smollm2-shape-random",
                          "n_docs": args.n_docs, "length": args.length,
                          "probe_pass_s": round(base, 2), "stages_s": round(total, 2),
                          "ratio": round(total / base, 3),
                          "passes_s": round(sums["passes"], 2),
                          "passes_ratio": round(sums["passes"] / base, 3),
                          "render_s": round(sums["render"], 2),
                          "render_ratio": round(sums["render"] / base, 3),
                          "phases_s": {k: round(v, 2) for k, v in stages.items()},
                          "report_mb": round(size, 2), "index_mb": round(page, 2),
                          "analyze_wall_s": round(wall, 1), "threads": args.threads}))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
