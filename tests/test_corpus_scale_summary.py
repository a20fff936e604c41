"""benchmarks/corpus_scale.py's summary: the fits over N from its records (no runs)."""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("corpus_scale",
                                                  ROOT / "benchmarks" / "corpus_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(n, wall, mem):
    return {"kind": "single", "n": n, "probe_wall_s": wall, "probe_cpu_s": wall,
            "forward_wall_s": wall / 2, "forward_cpu_s": wall / 2, "ratio": 2.0,
            "cpu_ratio": 2.0, "passes": 2, "ratio_per_pass": 1.0, "tokens_per_s": n / wall,
            "forward_tokens_per_s": 2 * n / wall, "peak_rss_mib": mem,
            "probe_peak_rss_mib": mem, "forward_peak_rss_mib": 100.0,
            "analyze_wall_s": wall, "load_average": 1.0}


def test_fits_over_n_and_from_the_rank_cap():
    cs = _module()
    ns = [128, 256, 512, 1024]
    walls = [10.0 * n ** 1.2 for n in ns]
    mems = [100.0, 150.0, 200.0, 210.0]
    recs = {("single", n): _rec(n, w, m) for n, w, m in zip(ns, walls, mems)}
    a = argparse.Namespace(model="m", length=256, stream_rank=512, batch_size=16, threads=1,
                           sections="all", no_bos=True, overlap=False, torchrun=False,
                           torchrun_n=None)
    out = cs.summary(a, ns, recs, {"corpora": ["x.txt"], "n_tokens": 1, "doc_tokens": [1],
                                   "tokenize_s": 0.0})
    assert math.isclose(out["time_exponent"], 1.2, rel_tol=1e-9)
    assert math.isclose(out["mem_growth"], 2.1)
    assert math.isclose(out["mem_growth_from_rank"], 210.0 / 200.0)
    assert math.isclose(out["time_exponent_from_rank"], 1.2, rel_tol=1e-9)
    assert out["max_ratio_per_pass"] == 1.0
    assert out["targets_met"] == {"mem_growth<=1.1": False, "time_exponent<=1.05": False,
                                  "max_ratio<=1.3": False}
    a.stream_rank = 2048  # no N at or above the cap: nothing to fit there
    out = cs.summary(a, ns, recs, {"corpora": [], "n_tokens": 1, "doc_tokens": [1],
                                   "tokenize_s": 0.0})
    assert out["mem_growth_from_rank"] is None and out["time_exponent_from_rank"] is None
