"""First and later load of a GGUF zoo model (default gemma3-270m): wall time, CPU time,
peak memory, cache size; each load in a fresh process, the first one into an empty
temporary TL_SPECTRAL_CACHE (the user's cache is not touched).

    python benchmarks/gguf_load.py [--model gemma3-270m] [--later 2] [--out FILE.json]
    python benchmarks/gguf_load.py --later-only [--later 3]   # later loads from your cache

``--later-only``: no first load; the later loads read the user's existing cache
(``TL_SPECTRAL_CACHE`` or ``~/.cache/tl_spectral``, built by an earlier load).

Wall time depends on what else runs on the machine (the load average is recorded); CPU time
(user + system of the loading process) is what an idle core would need, near enough: the
load is single-threaded but for the tensor reads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys, time
t = time.perf_counter()
from tl_spectral.models import zoo
model, tok = zoo.load(sys.argv[1])
wall = time.perf_counter() - t
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print("RESULT " + json.dumps({"wall_s": round(wall, 1), "peak_rss_gib": round(hwm / 2**20, 2)}))
"""


def one_load(model: str, cache: Path) -> dict:
    env = {**os.environ, "TL_SPECTRAL_CACHE": str(cache), "PYTHONPATH": str(REPO),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-c", _CHILD, model], env=env, capture_output=True,
                       text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(p.stdout.split("RESULT ", 1)[1])
    res["cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)
    res["load_average_after"] = round(os.getloadavg()[0], 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--later", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--later-only", action="store_true")
    args = ap.parse_args()
    if args.later_only:
        from tl_spectral.models.gguf import cache_root

        later = [one_load(args.model, cache_root()) for _ in range(args.later)]
        out = {"model": args.model, "cores": os.cpu_count(), "later_loads": later,
               "date": time.strftime("%Y-%m-%d"), "note": "later loads from the existing "
               "cache; wall time on a shared machine; cpu_s is the loading process's "
               "user+system"}
        text = json.dumps(out, indent=1)
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n", encoding="utf-8")
        return
    with tempfile.TemporaryDirectory(prefix="gguf_load_") as d:
        cache = Path(d)
        first = one_load(args.model, cache)
        later = [one_load(args.model, cache) for _ in range(args.later)]
        size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    out = {"model": args.model, "cores": os.cpu_count(), "first_load": first,
           "later_loads": later, "cache_bytes": size,
           "date": time.strftime("%Y-%m-%d"),
           "note": "wall time on a shared machine; cpu_s is the loading process's user+system"}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
