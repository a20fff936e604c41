"""Seconds per optimizer step of run configs, measured on this machine (compute plan).

    python scripts/time_configs.py configs/a.json configs/b.json ... [--steps 20] [--threads 1]

Builds each config's model, data and trainer exactly as ``tl-spectral train`` does (no
out_dir, so nothing is written), times ``--steps`` optimizer steps after 2 warm-up steps and
one validation pass over 16 windows, and prints one JSON line per config:
``{"config", "n_params", "sec_per_step", "sec_per_eval_window", "steps_total",
"eval_windows_total", "est_hours"}`` where ``est_hours`` extrapolates the whole run
(steps plus every evaluation over all validation windows) at the measured speed.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer
from tl_spectral.models.train import _load_data


def time_config(path: str, steps: int, threads: int) -> dict:
    doc = json.load(open(path))
    torch.set_num_threads(threads)
    tok, train_ids, val_ids = _load_data(doc.get("data", {}))
    mdoc = dict(doc["model"])
    if mdoc.get("vocab_size") in (None, "auto"):
        mdoc["vocab_size"] = tok.vocab_size
    model = GPT(GPTConfig.from_dict(mdoc))
    full = TrainConfig.from_dict(doc["train"])
    cfg = TrainConfig.from_dict({**doc["train"], "out_dir": None, "progress": False,
                                 "eval_every": 10**9, "steps": full.steps})
    tr = Trainer(model, train_ids, val_ids, cfg, bos_id=getattr(tok, "bos_id", None))
    tr.fit(stop_at=2)
    t0 = time.perf_counter()
    tr.fit(stop_at=2 + steps)
    per_step = (time.perf_counter() - t0) / steps
    w = tr.val_windows(limit=16)
    t0 = time.perf_counter()
    tr.evaluate(w)
    per_window = (time.perf_counter() - t0) / len(w)
    n_val = len(tr.val_windows(limit=None))
    n_evals = full.steps // full.eval_every + 2  # periodic + final + the full final pass
    secs = full.steps * per_step + n_evals * n_val * per_window
    return {"config": path, "n_params": sum(p.numel() for p in model.parameters()),
            "threads": threads, "timed_steps": steps, "sec_per_step": round(per_step, 3),
            "sec_per_eval_window": round(per_window, 4), "steps_total": full.steps,
            "eval_windows_total": n_evals * n_val, "est_hours": round(secs / 3600, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for path in args.configs:
        print(json.dumps(time_config(path, args.steps, args.threads)), flush=True)


if __name__ == "__main__":
    main()
