"""run_probes(AttentionStatsProbe) vs a plain forward pass over the same batches, same run.

Model: random TransformerBridge, 6 layers, 8 heads, d_model 128, T = 256, batch 16.
overhead_ratio = time(run_probes) / time(plain forwards); target <= 1.3.
peak_mem_ratio = peak RSS of run_probes / that of the plain forwards, each measured in a fresh
subprocess: the model built, VmHWM reset, one warm-up batch of the plain forward only, the
measured loop, then VmHWM (issue 42: the warm-up used to be a call of the measured side
itself; the growth over the resident set after the build is also printed).
Last line: one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from _bench import interleaved_times, proc_status_kib, reset_peak_rss

N_BATCHES = int(os.environ.get("BENCH_BATCHES", "4"))
BATCH, T = 16, 256


def build():
    import torch
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    cfg = TransformerBridgeConfig(d_model=128, d_head=16, n_layers=6, n_ctx=256, n_heads=8,
                                  d_vocab=78, act_fn="gelu", normalization_type="LN", seed=0)
    model = TransformerBridge.boot_native(cfg)
    tokens = torch.randint(0, 78, (N_BATCHES * BATCH, T), generator=torch.Generator().manual_seed(1))
    return model, tokens


def plain(model, tokens):
    import torch

    with torch.no_grad():
        for s in range(0, tokens.shape[0], BATCH):
            model(tokens[s : s + BATCH])


def probes(model, tokens):
    from tl_spectral.probes import AttentionStatsProbe, run_probes

    run_probes(model, tokens, [AttentionStatsProbe()], batch_size=BATCH, progress=False)


def mem_child(mode: str) -> None:
    model, tokens = build()
    fn = plain if mode == "plain" else probes
    before = proc_status_kib("VmRSS")
    reset_peak_rss()  # the build's own high-water mark left out
    plain(model, tokens[:BATCH])  # warm-up: the plain forward only (issue 42), on both sides
    fn(model, tokens)
    after = proc_status_kib("VmHWM")
    print(json.dumps({"delta_kb": max(after - before, 1), "max_kb": after}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--mem":
        mem_child(sys.argv[2])
        return
    model, tokens = build()
    plain(model, tokens[:BATCH])
    probes(model, tokens[:BATCH])
    t = interleaved_times({"plain": lambda: plain(model, tokens),
                           "probes": lambda: probes(model, tokens)}, 3)
    t_plain, t_probe = t["plain"], t["probes"]
    mp, mq = statistics.median(t_plain), statistics.median(t_probe)
    mem = {}
    for mode in ("plain", "probes"):
        out = subprocess.run([sys.executable, __file__, "--mem", mode], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        mem[mode] = json.loads(out)
    print(f"plain forward: {mp:.3f} s, run_probes(AttentionStatsProbe): {mq:.3f} s "
          f"({N_BATCHES} batches of {BATCH}x{T})")
    print(f"peak RSS growth: plain {mem['plain']['delta_kb']/1024:.1f} MiB, "
          f"probes {mem['probes']['delta_kb']/1024:.1f} MiB "
          f"(max RSS {mem['plain']['max_kb']/1024:.0f} vs {mem['probes']['max_kb']/1024:.0f} MiB)")
    print(json.dumps({
        "overhead_ratio": round(mq / mp, 3),
        "peak_mem_ratio": round(mem["probes"]["max_kb"] / mem["plain"]["max_kb"], 3),
        "probes_peak_growth_mib": round(mem["probes"]["delta_kb"] / 1024, 1),
        "plain_s": round(mp, 3), "probes_s": round(mq, 3),
    }))


if __name__ == "__main__":
    main()
