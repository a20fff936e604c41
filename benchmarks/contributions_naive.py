"""Contribution weights: d_head-space implementation vs the naive d_model computation.

The naive baseline is the straightforward implementation: materialize every projected
value ``ṽ_j^h = v_j^h W_O^h`` ([batch, head, key, d_model]) and every weighted pair
``α_ij ṽ_j^h`` ([batch, head, query, key, d_model]), sum the pairs into the outputs, and
take the inner product of each pair with its output in d_model. It returns the same maps
(contribution, relative norm, cosine, value-weighted and output-normalized baselines).

Figures (one T, several d_model, both modes):

* time: best of ``repeats`` timed calls after one warm-up, fast and naive in the same run,
  single-threaded by default (``threads=1``): on a shared 2-core machine multi-threaded
  kernels stall on each other's barriers, which adds noise of 10x or more to small
  elementwise ops; best-of for the same reason. Both sides get the same treatment;
  ``speedup_vs_naive`` is the *smallest* naive/fast ratio over the configurations;
* ``max_abs_diff``: the largest |c_fast − c_naive| over all configurations (float32,
  contribution maps);
* memory: each implementation runs once in a fresh subprocess (after a tiny warm-up call
  that loads the math libraries); its peak is the high-water mark of the resident set
  (``VmHWM``, reset just before the call) minus the resident set just before the call,
  i.e. the extra memory the call needed at its peak (``ru_maxrss`` from ``getrusage``
  would be wrong: Linux carries it over ``execve`` from the parent). ``peak_mem_mb`` / ``naive_peak_mem_mb`` are the largest over the
  configurations. The analytic size of each side's largest tensor is reported beside it.

Run: ``python benchmarks/contributions_naive.py`` (about a minute on 2 cores). The last
line of output is one JSON object. ``bench_naive(...)`` returns the same figures as a dict
for ``benchmarks/contributions.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
from _bench import peak_rss_growth_mib

from tl_spectral.analysis.contributions import contribution_weights


# ----------------------------------------------------------------------------- inputs
def make_layer(T=256, batch=1, n_heads=8, d_head=16, d_model=128, seed=0, dtype=torch.float32):
    """A causal softmax pattern with peaky rows, hook_v-layout values and W_O."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, n_heads, T, T, generator=g) * 3.0
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    pattern = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1).to(dtype)
    v = torch.randn(batch, T, n_heads, d_head, generator=g, dtype=dtype)
    W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=dtype) / math.sqrt(d_head)
    return pattern, v, W_O


# ----------------------------------------------------------------------------- naive
def naive_contributions(pattern, v, W_O, mode="inter"):
    """The straightforward d_model computation through explicit per-pair vectors.

    pattern: [batch, head, query, key]; v: [batch, key, kv_head, d_head];
    W_O: [head, d_head, d_model]. Returns a dict of [batch, head, query, key] maps.
    """
    H = pattern.shape[1]
    vh = v.repeat_interleave(H // v.shape[2], dim=2)
    vt = torch.einsum("bkhd,hdm->bhkm", vh, W_O)  # ṽ_j^h          [b, H, k, m]
    pairs = pattern[..., None] * vt[:, :, None]  # α_ij ṽ_j^h      [b, H, q, k, m]
    oh = pairs.sum(3)  # o_i^h                                     [b, H, q, m]
    ref = oh if mode == "intra" else oh.sum(1, keepdim=True)  # o  [b, H|1, q, m]
    onorm = ref.norm(dim=-1)  # [b, H|1, q]
    dots = (pairs * ref[:, :, :, None, :]).sum(-1)  # ⟨o, α ṽ⟩   [b, H, q, k]
    del pairs
    vnorm = vt.norm(dim=-1)  # [b, H, k]
    inv = torch.where(onorm > 0, 1.0 / onorm, 0.0)[..., None]
    vo = torch.einsum("bhkm,bgqm->bhqk", vt, ref.expand(-1, H, -1, -1))  # ⟨o, ṽ⟩
    denom = vnorm[:, :, None, :] * onorm[..., None]
    return {
        "contribution": dots * inv * inv,
        "relative_norm": vnorm[:, :, None, :] * inv,
        "cosine": torch.where(denom > 0, vo / denom, 0.0),
        "value_weighted": pattern * vnorm[:, :, None, :],
        "output_normalized": pattern * vnorm[:, :, None, :] * inv,
    }


def fast_contributions(pattern, v, W_O, mode="inter"):
    return contribution_weights(pattern, v, W_O, mode)


# ----------------------------------------------------------------------------- measuring
def _best_time(fn, args, repeats):
    fn(*args)  # warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def _child_peak(impl: str, mode: str, cfg: dict) -> float:
    """Run in a fresh process: extra peak RSS (MiB) of one call of ``impl``
    (:func:`_bench.peak_rss_growth_mib`)."""
    fn = naive_contributions if impl == "naive" else fast_contributions
    small = make_layer(**{**cfg, "T": 8})
    fn(*small, mode)  # load BLAS / allocator paths before measuring
    inputs = make_layer(**cfg)
    return peak_rss_growth_mib(lambda: fn(*inputs, mode))


def measure_peak_mb(impl: str, mode: str, cfg: dict) -> float:
    """Extra peak memory (MiB) of one call, measured in a fresh subprocess."""
    arg = json.dumps({"impl": impl, "mode": mode, "cfg": cfg})
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", arg],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return float(out.stdout.strip().splitlines()[-1])


def bench_naive(
    T: int = 256,
    batch: int = 1,
    n_heads: int = 8,
    d_head: int = 16,
    d_models: tuple[int, ...] = (128, 512),
    modes: tuple[str, ...] = ("inter", "intra"),
    repeats: int = 3,
    measure_memory: bool = True,
    seed: int = 0,
    threads: int | None = 1,
) -> dict:
    """Time and compare ``contribution_weights`` against the naive d_model computation.

    Returns ``{"speedup_vs_naive", "max_abs_diff", "peak_mem_mb", "naive_peak_mem_mb",
    "configs": [...]}`` (worst case over configurations; per-configuration figures in
    ``configs``). Memory is None when ``measure_memory`` is False. ``threads``: torch
    threads while timing (None = leave as is).
    """
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        configs = _run_configs(
            T, batch, n_heads, d_head, d_models, modes, repeats, measure_memory, seed
        )
    finally:
        torch.set_num_threads(old_threads)
    mem = (lambda k: max(r[k] for r in configs)) if measure_memory else (lambda k: None)
    return {
        "speedup_vs_naive": min(r["speedup"] for r in configs),
        "max_abs_diff": max(r["max_abs_diff"] for r in configs),
        "peak_mem_mb": mem("peak_mem_mb"),
        "naive_peak_mem_mb": mem("naive_peak_mem_mb"),
        "threads": threads,
        "configs": configs,
    }


def _run_configs(T, batch, n_heads, d_head, d_models, modes, repeats, measure_memory, seed):
    configs = []
    for d_model in d_models:
        cfg = {"T": T, "batch": batch, "n_heads": n_heads, "d_head": d_head}
        cfg.update(d_model=d_model, seed=seed)
        pattern, v, W_O = make_layer(**cfg)
        for mode in modes:
            fast = fast_contributions(pattern, v, W_O, mode)
            ref = naive_contributions(pattern, v, W_O, mode)
            diff = float((fast.contribution - ref["contribution"]).abs().max())
            others = {
                k: float((getattr(fast, k) - ref[k]).abs().max() / ref[k].abs().max())
                for k in ref
                if k != "contribution"
            }
            del ref
            t_fast = _best_time(fast_contributions, (pattern, v, W_O, mode), repeats)
            t_naive = _best_time(naive_contributions, (pattern, v, W_O, mode), repeats)
            row = {
                "d_model": d_model,
                "mode": mode,
                "fast_s": t_fast,
                "naive_s": t_naive,
                "speedup": t_naive / t_fast,
                "max_abs_diff": diff,
                "max_rel_diff_other_maps": max(others.values()),
                "largest_tensor_mb_fast": batch * n_heads * T * T * 4 / 2**20,
                "largest_tensor_mb_naive": batch * n_heads * T * T * d_model * 4 / 2**20,
            }
            if measure_memory:
                row["peak_mem_mb"] = measure_peak_mb("fast", mode, cfg)
                row["naive_peak_mem_mb"] = measure_peak_mb("naive", mode, cfg)
            configs.append(row)
    return configs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(_child_peak(spec["impl"], spec["mode"], spec["cfg"]))
        return
    res = bench_naive(
        T=args.T, batch=args.batch, repeats=args.repeats, measure_memory=not args.no_memory
    )
    for r in res["configs"]:
        mem = ""
        if "peak_mem_mb" in r:
            mem = f"  peak {r['peak_mem_mb']:.1f} MiB vs naive {r['naive_peak_mem_mb']:.1f} MiB"
        print(
            f"d_model={r['d_model']:4d} {r['mode']}: fast {r['fast_s'] * 1e3:8.2f} ms  "
            f"naive {r['naive_s'] * 1e3:9.2f} ms  speedup {r['speedup']:7.1f}x  "
            f"max|Δc| {r['max_abs_diff']:.2e}{mem}"
        )
    headline = {k: res[k] for k in ("speedup_vs_naive", "max_abs_diff")}
    headline["peak_mem_mb"] = res["peak_mem_mb"]
    headline["naive_peak_mem_mb"] = res["naive_peak_mem_mb"]
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
