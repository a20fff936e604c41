"""What the probe pass's heap trims cost in time and save in memory (issue 42 items 2 and 3).

``run_probes`` hands the C heap's free pages back to the system (glibc ``malloc_trim(0)``,
``tl_spectral/probes/heap.py``) during the pass, once per 128 MiB of attention patterns, so
that the four probes' process stays within 1.3× the forward-only process in peak memory.
Pages handed back are faulted in again when the next large buffers are written. This
benchmark measures that trade on SmolLM2-135M (the zoo's, T = ``--length`` 1,024, batch 1,
one torch thread, the four probes of ``benchmarks/real_model.py``), every mode in a fresh
process of its own:

- ``trim``: the library as it is;
- ``no_trim``: ``run_probes`` never trims (``heap.note_freed`` and ``release_free_heap``
  replaced by no-ops in that process);
- ``no_trim_mmap``: no trims, and glibc told to keep large blocks in its heap
  (``mallopt(M_MMAP_THRESHOLD, 1 GiB)``, ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` before
  torch is imported): freed buffers are reused without new page faults;
- ``trim_mmap``: the same ``mallopt`` settings with the library's trims as they are.

Per mode, after one warm-up of each side: ``--repeats`` (3) interleaved calls of the plain
forward (``model(tokens, return_type=None)``) and of the probe pass, each with its wall time,
its minor page faults and its system CPU time (``getrusage``); ``ratio`` = median probe pass /
median forward; ``peak_rss_mib``: the process's ``VmHWM``, reset once the model is loaded
(so it covers both sides' calls and their warm-ups). ``mem_peak_rss_mib``: in a fresh
process of its own per mode, as ``real_model.py`` reads memory — the model loaded,
``VmHWM`` reset, one warm-up of the plain forward, then the probe pass (``forward``: a
process doing the same with the plain forward as the measured call, under the mode's
allocator settings); ``mem_ratio`` = the mode's / the default allocator's forward-only
process.
Usage: ``python benchmarks/heap_trim.py [--length 1024] [--repeats 3] [--modes trim,no_trim,
no_trim_mmap]``. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("trim", "no_trim", "no_trim_mmap", "trim_mmap")


def child(args: argparse.Namespace) -> None:
    if args.mode.endswith("_mmap"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import real_model
    from _bench import proc_status_kib, reset_peak_rss

    import tl_spectral.probes.runner as runner
    from tl_spectral.probes import run_probes

    if args.mode.startswith("no_trim"):
        runner.note_freed = lambda counter, nbytes: None
        runner.release_free_heap = lambda: False
    model, _ = real_model.load_model("smollm2-135m", None)
    tokens = torch.randint(0, int(model.cfg.d_vocab), (1, args.length),
                           generator=torch.Generator().manual_seed(1))

    def plain() -> None:
        with torch.no_grad():
            model(tokens, return_type=None)

    def probes() -> None:
        run_probes(model, tokens, real_model.make_probes("all"), batch_size=1, progress=False)

    def measure(fn) -> tuple[float, int, float]:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return dt, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime

    if args.memory:
        reset_peak_rss()
        plain()
        plain() if args.memory == "forward" else probes()
        print(json.dumps({"mode": args.mode, "side": args.memory,
                          "peak_rss_mib": round(proc_status_kib("VmHWM") / 1024, 1)}))
        return
    reset_peak_rss()
    plain()
    probes()
    rows: dict[str, list[tuple[float, int, float]]] = {"plain": [], "probes": []}
    for _ in range(args.repeats):
        rows["plain"].append(measure(plain))
        rows["probes"].append(measure(probes))
    med = statistics.median
    out = {"mode": args.mode, "peak_rss_mib": round(proc_status_kib("VmHWM") / 1024, 1)}
    for side, r in rows.items():
        out[f"{side}_s"] = round(med(x[0] for x in r), 3)
        out[f"{side}_faults"] = int(med(x[1] for x in r))
        out[f"{side}_sys_s"] = round(med(x[2] for x in r), 3)
    out["ratio"] = round(out["probes_s"] / out["plain_s"], 3)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--memory", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown modes {bad}; pass some of {','.join(MODES)}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    sys.path.insert(0, str(HERE))
    from real_model import _run_child

    def run(m: str, *extra: str) -> dict:
        return _run_child([sys.executable, __file__, "--child", "--mode", m, "--length",
                           str(args.length), "--repeats", str(args.repeats), *extra],
                          env, f"mode {m}")

    base = run("trim", "--memory", "forward")["peak_rss_mib"]
    print(f"forward-only process (default allocator): peak {base:.0f} MiB", file=sys.stderr)
    res = {}
    for m in modes:
        res[m] = r = run(m)
        r["mem_peak_rss_mib"] = run(m, "--memory", "probes")["peak_rss_mib"]
        r["mem_forward_peak_rss_mib"] = run(m, "--memory", "forward")["peak_rss_mib"]
        r["mem_ratio"] = round(r["mem_peak_rss_mib"] / base, 3)
        print(f"{m:>13}: forward {r['plain_s']:.2f} s ({r['plain_faults']} faults), probes "
              f"{r['probes_s']:.2f} s ({r['probes_faults']} faults, {r['probes_sys_s']:.2f} s "
              f"system) -> ratio {r['ratio']:.3f}; peak {r['mem_peak_rss_mib']:.0f} MiB = "
              f"{r['mem_ratio']:.3f} x the forward-only process (forward alone under this "
              f"mode {r['mem_forward_peak_rss_mib']:.0f} MiB)",
              file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "heap_trim", "model": "zoo smollm2-135m", "T": args.length,
                      "batch": 1, "threads": 1, "repeats": args.repeats,
                      "forward_peak_rss_mib": base, "modes": res}))


if __name__ == "__main__":
    main()
