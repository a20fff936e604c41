"""Shared measurement helpers of the benchmark scripts (run as ``python benchmarks/X.py``)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def proc_status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_rss_growth_mib(fn: Callable[[], object]) -> float:
    """MiB of peak resident-memory growth during one call of ``fn`` (run it in a fresh
    process, after a warm-up call).

    ``getrusage().ru_maxrss`` survives ``execve``, so a child would inherit its parent's
    peak; the per-address-space high-water mark ``VmHWM`` starts fresh, and writing 5 to
    ``/proc/self/clear_refs`` resets it to the current RSS just before the call.
    """
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass  # then VmHWM also covers the (small) run before the call
    before = proc_status_kib("VmRSS")
    out = fn()
    peak = proc_status_kib("VmHWM")
    del out
    return max(0.0, (peak - before) / 1024)


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int, *,
                      warm_each: bool = False) -> dict[str, list[float]]:
    """Wall-clock seconds of ``repeats`` calls of every function, the functions interleaved
    so that all see the same machine load. ``warm_each``: precede every timed call by an
    untimed call of the same function (so none pays for the cache and allocator state the
    previous one left)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            if warm_each:
                f()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return times


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark ``VmHWM`` of this process to its current resident
    set (write 5 to ``/proc/self/clear_refs``), after a ``gc.collect()``. False when the
    kernel refused (then ``VmHWM`` also covers what ran before)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True
