"""ContributionProbe cost: (a) overhead over a plain forward pass, (b) speed-up over the
naive d_model computation, (c) peak memory.

(a) ``overhead_ratio`` = time(``run_probes(model, tokens, [ContributionProbe()])``, all
    layers, default options) / time(plain forward passes that return every layer's
    attention pattern through ``hook_pattern``), same batches, same run. Model: a random
    ``TransformerBridge.boot_native`` with the char-shakespeare shape (6 layers, 8 heads,
    d_model 128, context 256), batches of 16 × 256 tokens. Both sides run ``repeats``
    times (default 5), interleaved, single-threaded (the 2-core machine is shared; multi-threaded
    elementwise kernels stall on each other); the ratio is of the best times (the least
    disturbed run of each side). Target <= 1.5.
(b) ``speedup_vs_naive`` / ``max_abs_diff``: ``bench_naive`` from
    ``benchmarks/contributions_naive.py`` (T = 256; the d_head-space maps against the
    computation through explicit per-head, per-source d_model vectors; the smallest
    speed-up and the largest |Δc| over its configurations). Targets >= 10 and <= 1e-5.
(c) ``peak_mem_mb`` / ``naive_peak_mem_mb``: extra peak resident memory of one call of each
    side of (b), in fresh subprocesses (``VmHWM`` reset before the call). Also reported:
    ``probe_peak_mem_mb`` / ``plain_peak_mem_mb``, the same for one batch of (a).

Run: ``python benchmarks/contributions.py`` (a few minutes on 2 shared cores). The last line
of output is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from _bench import interleaved_times, peak_rss_growth_mib

HERE = Path(__file__).resolve().parent
BATCH, T, N_BATCHES = 16, 256, 3


def _load_naive():
    spec = importlib.util.spec_from_file_location("contributions_naive", HERE / "contributions_naive.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def build(n_batches: int = N_BATCHES):
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = TransformerBridgeConfig(d_model=128, d_head=16, n_layers=6, n_ctx=T, n_heads=8,
                                  d_vocab=65, act_fn="gelu", normalization_type="LN", seed=0)
    model = TransformerBridge.boot_native(cfg)
    tokens = torch.randint(0, 65, (n_batches * BATCH, T), generator=torch.Generator().manual_seed(1))
    return model, tokens


def plain(model, tokens) -> list:
    """Forward passes that return every layer's pattern (what a pattern probe starts from)."""
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layers)]
    out = []
    with torch.no_grad():
        for s in range(0, tokens.shape[0], BATCH):
            pats: list = []

            def hook(t, hook=None):
                pats.append(t.detach())
                return t

            with model.hooks(fwd_hooks=[(n, hook) for n in names]):
                model(tokens[s : s + BATCH], return_type=None)
            out = pats  # keep the last batch's patterns alive, as a caller would
    return out


def probe(model, tokens):
    from tl_spectral.probes import ContributionProbe, run_probes

    return run_probes(model, tokens, [ContributionProbe()], batch_size=BATCH, progress=False)


def _mem_child(side: str) -> None:
    torch.set_num_threads(1)
    model, tokens = build(1)
    fn = plain if side == "plain" else probe
    fn(model, tokens[:2, :16])  # load kernels and allocator paths
    print(peak_rss_growth_mib(lambda: fn(model, tokens)))


def _peak(side: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--mem", side], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return float(out.stdout.strip().splitlines()[-1])


def bench_overhead(repeats: int = 3, threads: int = 1) -> dict:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, tokens = build()
        plain(model, tokens[:BATCH])
        probe(model, tokens[:BATCH])
        t = interleaved_times({"plain": lambda: plain(model, tokens),
                               "probe": lambda: probe(model, tokens)}, repeats)
        t_plain, t_probe = t["plain"], t["probe"]
    finally:
        torch.set_num_threads(old)
    return {"overhead_ratio": min(t_probe) / min(t_plain), "plain_s": min(t_plain),
            "probe_s": min(t_probe), "plain_all_s": t_plain, "probe_all_s": t_probe}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mem", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    if args.mem:
        _mem_child(args.mem)
        return
    ov = bench_overhead(args.repeats)
    print(f"(a) {N_BATCHES} batches of {BATCH}x{T}: plain forward (patterns) {ov['plain_s']:.3f} s, "
          f"run_probes(ContributionProbe) {ov['probe_s']:.3f} s -> overhead {ov['overhead_ratio']:.3f}"
          f"  (all: plain {['%.2f' % t for t in ov['plain_all_s']]}, "
          f"probe {['%.2f' % t for t in ov['probe_all_s']]})")
    naive = _load_naive().bench_naive(T=256, measure_memory=not args.no_memory)
    for r in naive["configs"]:
        print(f"(b) d_model={r['d_model']:4d} {r['mode']}: fast {r['fast_s'] * 1e3:8.2f} ms  naive "
              f"{r['naive_s'] * 1e3:9.2f} ms  speedup {r['speedup']:7.1f}x  max|Δc| "
              f"{r['max_abs_diff']:.2e}"
              + (f"  peak {r['peak_mem_mb']:.1f} vs {r['naive_peak_mem_mb']:.1f} MiB"
                 if "peak_mem_mb" in r else ""))
    out = {
        "overhead_ratio": round(ov["overhead_ratio"], 3),
        "speedup_vs_naive": round(naive["speedup_vs_naive"], 1),
        "max_abs_diff": naive["max_abs_diff"],
        "peak_mem_mb": None if naive["peak_mem_mb"] is None else round(naive["peak_mem_mb"], 1),
        "naive_peak_mem_mb": None if naive["naive_peak_mem_mb"] is None
        else round(naive["naive_peak_mem_mb"], 1),
    }
    if not args.no_memory:
        out["probe_peak_mem_mb"] = round(_peak("probe"), 1)
        out["plain_peak_mem_mb"] = round(_peak("plain"), 1)
        print(f"(c) one batch of (a): extra peak RSS plain {out['plain_peak_mem_mb']} MiB, "
              f"probe {out['probe_peak_mem_mb']} MiB")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
