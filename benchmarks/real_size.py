"""All four probes in one pass on a GPT-2-small-shaped model vs the plain forward pass.

Model: random TransformerBridge (boot_native), 12 layers, 12 heads, d_model 768, d_head 64,
LayerNorm, d_vocab 50,257, n_ctx 1,024; T = 1,024, batch 2 (one batch).
Probes: AttentionStatsProbe, ContributionProbe, SinkProbe, AttentionFieldProbe, in one
run_probes pass, on the model's device (CUDA when available).

overhead_ratio = time(run_probes) / time(plain forward), same run, interleaved; target <= 2.0.
peak_mem_ratio = peak memory of run_probes / of the plain forward: CUDA max allocated on a
GPU; on the CPU, in a fresh subprocess each: the model built, the kernel's high-water mark
VmHWM reset, one warm-up of the plain forward only, the measured call, then VmHWM (the peak
resident set of the whole process from the model's load on; issue 42: before, the warm-up was
a call of the measured side itself and the base resident set was read after it, so what that
call left counted as base); target <= 1.5. time_exponent: least-squares slope of log(probe time) on log T over T = 256, 512,
1,024, probe time = time(run_probes) − time(plain forward) (expected ≈ 2: every probe is
O(T²) per head); time_exponent_total: the same for time(run_probes).
Knobs: BENCH_REPEATS / --repeats (default 3), BENCH_DEVICE (default cuda if available),
BENCH_THREADS / --threads (torch CPU threads; default 1 on the CPU: on a shared 2-core machine
multi-threaded kernels stall on each other and every small op waits for the busy core, which
swamps both sides — the probes' many ops far more than the forward's few large ones; 0 = torch's
default), --probes (comma list of stats, contributions, sinks, fields: time a subset, e.g. one
probe alone).
Last line: one JSON object.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys

from _bench import interleaved_times, proc_status_kib, reset_peak_rss

BATCH = 2
T_MAX = 1024
TS = (256, 512, 1024)
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
PROBES = os.environ.get("BENCH_PROBES", "stats,contributions,sinks,fields")


def device() -> str:
    import torch

    return os.environ.get("BENCH_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")


def build():
    import torch
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    cfg = TransformerBridgeConfig(d_model=768, d_head=64, n_layers=12, n_ctx=T_MAX, n_heads=12,
                                  d_vocab=50257, act_fn="gelu_new", normalization_type="LN",
                                  seed=0, device=device())
    model = TransformerBridge.boot_native(cfg).to(device()).eval()
    tokens = torch.randint(0, 50257, (BATCH, T_MAX), generator=torch.Generator().manual_seed(1))
    return model, tokens


def sync() -> None:
    import torch

    if torch.cuda.is_available() and device().startswith("cuda"):
        torch.cuda.synchronize()


def plain(model, tokens):
    import torch

    with torch.no_grad():
        model(tokens.to(device()), return_type=None)
    sync()


def probes(model, tokens):
    from tl_spectral.probes import (
        AttentionFieldProbe,
        AttentionStatsProbe,
        ContributionProbe,
        SinkProbe,
        run_probes,
    )

    make = {"stats": AttentionStatsProbe, "contributions": ContributionProbe, "sinks": SinkProbe,
            "fields": AttentionFieldProbe}
    res = run_probes(model, tokens, [make[k.strip()]() for k in PROBES.split(",")],
                     batch_size=BATCH, progress=False)
    sync()
    return res


def set_threads() -> None:
    import torch

    if THREADS > 0 and not device().startswith("cuda"):
        torch.set_num_threads(THREADS)


def mem_child(mode: str) -> None:
    set_threads()
    model, tokens = build()
    fn = plain if mode == "plain" else probes
    reset_peak_rss()  # the loader's own high-water mark left out
    plain(model, tokens)  # warm-up: the plain forward only (issue 42), on both sides
    fn(model, tokens)
    print(json.dumps({"max_kb": proc_status_kib("VmHWM")}))


def cuda_peak(model, tokens, fn) -> int:
    import torch

    fn(model, tokens)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    fn(model, tokens)
    return torch.cuda.max_memory_allocated()


def slope(xs, ys) -> float:
    lx = [math.log(x) for x in xs]
    ly = [math.log(max(y, 1e-9)) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    global REPEATS, THREADS, PROBES
    if len(sys.argv) > 2 and sys.argv[1] == "--mem":
        mem_child(sys.argv[2])
        return
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--probes", default=PROBES)
    args = ap.parse_args()
    REPEATS, THREADS, PROBES = args.repeats, args.threads, args.probes
    os.environ.update(BENCH_THREADS=str(THREADS), BENCH_PROBES=PROBES)  # for the children
    set_threads()
    model, tokens = build()
    dev = device()
    per_t = {}
    for T in TS:
        tok = tokens[:, :T]
        plain(model, tok)
        probes(model, tok)
        t = interleaved_times({"plain": lambda: plain(model, tok),
                               "probes": lambda: probes(model, tok)}, REPEATS)
        per_t[T] = (statistics.median(t["plain"]), statistics.median(t["probes"]))
        print(f"T={T}: plain {per_t[T][0]:.3f} s, probes ({PROBES}) {per_t[T][1]:.3f} s", flush=True)
    if dev.startswith("cuda"):
        mp = cuda_peak(model, tokens, plain)
        mq = cuda_peak(model, tokens, probes)
        mem_ratio, mem_note = mq / mp, {"plain_peak_mib": round(mp / 2**20, 1),
                                        "probes_peak_mib": round(mq / 2**20, 1)}
    else:
        del model
        mem = {}
        for mode in ("plain", "probes"):
            out = subprocess.run([sys.executable, __file__, "--mem", mode], capture_output=True,
                                 text=True, check=True).stdout.strip().splitlines()[-1]
            mem[mode] = json.loads(out)["max_kb"]
        mem_ratio = mem["probes"] / mem["plain"]
        mem_note = {"plain_max_rss_mib": round(mem["plain"] / 1024, 1),
                    "probes_max_rss_mib": round(mem["probes"] / 1024, 1)}
    tp, tq = per_t[T_MAX]
    extra = [per_t[T][1] - per_t[T][0] for T in TS]
    print(json.dumps({
        "device": dev, "model": "gpt2-small-shaped random (12L, 12H, d_model 768)",
        "batch": BATCH, "T": T_MAX,
        "overhead_ratio": round(tq / tp, 3),
        "peak_mem_ratio": round(mem_ratio, 3),
        "time_exponent": round(slope(TS, extra), 3),
        "time_exponent_total": round(slope(TS, [per_t[T][1] for T in TS]), 3),
        "plain_s": round(tp, 3), "probes_s": round(tq, 3),
        "repeats": REPEATS, "threads": THREADS, "probes": PROBES, **mem_note,
    }))


if __name__ == "__main__":
    main()
