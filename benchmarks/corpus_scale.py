"""A real decoder over a corpus: ``tl-spectral analyze --tokens`` against N (issue 42 item 4).

Corpus: the Wikipedia excerpt and Austen (``wiki_excerpt.txt``, ``austen.txt`` of the shared
data folder: ``--data-dir``, default ``$TL_SPECTRAL_DATA`` or ``../shared/data`` beside the
checkout; or ``--corpus FILE`` once per file), tokenized once for ``--model`` by
``tl-spectral tokenize`` into one token file (two documents; a window never straddles them).
Then, for every N of ``--ns`` (default 128, 256, 512, 1,024 windows of ``--length`` 256
tokens, disjoint, seed 0; ``--overlap`` windows only when the token file is too short, and the
output says so), two fresh processes, one after the other, ``--threads`` torch threads each:

- **analyze**: ``tl-spectral analyze --tokens FILE --stream-rank K --n-docs N`` (every
  section unless ``--sections``; a decoder whose zoo convention is a start token, such as
  SmolLM2, gets ``--no-bos``: token-file windows carry none). Its probe pass is timed in wall
  and CPU seconds (``timings_s["probe pass"]`` of ``report.json`` is the wall time; the
  process's CPU seconds are read around the same call) and the peak resident memory of the
  whole process (``VmHWM`` at its end; ``probe_peak_rss_mib``: at the end of the probe pass);
- **forward**: the plain forward over the same token-file windows, same batch size
  (``model(batch, return_type=None)`` under ``no_grad``, the model loaded as analyze loads
  it), wall and CPU seconds and ``VmHWM``.

Per N: ``ratio`` = probe pass / plain forward (wall; ``cpu_ratio`` from CPU seconds),
tokens/s of each, peak memory of each process. Fits over N: ``mem_growth`` = peak memory of
the analyze process at the largest N / at the smallest (target <= 1.1), ``time_exponent`` =
least-squares slope of log(probe-pass wall time) on log N (target <= 1.05), ``max_ratio`` =
the largest ratio (target <= 1.3; ``max_ratio_per_pass`` divides by the streamed POD's
model passes); ``mem_growth_from_rank`` and ``time_exponent_from_rank``: the same from the
first N at or above ``--stream-rank`` K (below K the POD is exact at rank N and its buffers
hold N rows, so memory grows with N up to K by design). Then (``--torchrun``, the default) the same analyze at
``--torchrun-n`` (default the largest N) under ``torchrun --nproc_per_node 2`` (gloo on CPU;
each rank ``--threads`` // 2 torch threads, at least 1: the one process's cores, shared): its
wall time, each rank's probe pass and peak memory, and whether its ``results/*.
safetensors`` equal the one-process report's at that N (every tensor within
``--rtol`` of its largest value, integer tensors and non-float metadata exactly).

Resumable: every configuration's record is appended to ``OUT/records.jsonl`` as it finishes
and the token file is kept in ``OUT``; a rerun with the same ``--out`` (and the same
settings) skips what is recorded. ``--out`` defaults to a temporary folder, removed at the
end (then nothing resumes). Reports go to ``OUT/reports/`` (only their ``results/`` and
``report.json`` are kept), each process's stderr (the stage table) to ``OUT/logs/``.

Usage (the full run: roughly 2 h on a quiet 2-core machine, an estimate from the committed
SmolLM2 timings — N = 1,024 alone about an hour, the torchrun run about 25 min)::

    python benchmarks/corpus_scale.py --model smollm2-135m --out /tmp/corpus_scale \\
        --save docs/results/benchmarks/corpus_scale_smollm2.json

A smoke test: ``--model char-shakespeare --ns 4,8 --length 64 --stream-rank 8``.
Last line: one JSON object (also written to ``--save FILE``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from argparse import BooleanOptionalAction
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _bench import proc_status_kib  # noqa: E402

CORPORA = ("wiki_excerpt.txt", "austen.txt")
MARK = "CORPUS_SCALE_RECORD "
TARGETS = {"mem_growth": 1.1, "time_exponent": 1.05, "max_ratio": 1.3}


# ------------------------------------------------------------------------ child processes
def _cpu_s() -> float:
    return time.process_time()  # every thread of this process, user + system


def child_analyze(argv: list[str], threads: int) -> None:
    """``tl-spectral analyze argv`` in this process, its probe pass timed from the inside;
    prints one marked JSON line (under torchrun: one per rank)."""
    import torch

    import tl_spectral.cli as cli
    import tl_spectral.viz.sections as sections

    torch.set_num_threads(threads)

    probe: dict = {}
    inner = sections.run_probe_pass

    def timed(*a, **k):
        t0, c0 = time.perf_counter(), _cpu_s()
        out = inner(*a, **k)
        probe.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - c0,
                     peak_rss_mib=proc_status_kib("VmHWM") / 1024)
        return out

    sections.run_probe_pass = timed  # analyze (and each torchrun rank) looks it up here
    from tl_spectral.probes.fields import AttentionFieldProbe

    again: dict[int, int] = {}
    next_pass = AttentionFieldProbe.next_pass

    def counted(self) -> bool:  # the streamed scale POD asks for a second model pass
        more = next_pass(self)
        again[id(self)] = again.get(id(self), 0) + bool(more)
        probe["passes"] = 1 + max(again.values())
        return more

    AttentionFieldProbe.next_pass = counted
    t0, c0 = time.perf_counter(), _cpu_s()
    rc = cli.main(["analyze", *argv])
    print(MARK + json.dumps({
        "rc": rc, "rank": int(os.environ.get("RANK", "0")), "probe": probe,
        "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0,
        "peak_rss_mib": proc_status_kib("VmHWM") / 1024}), flush=True)


def child_forward(model_name: str, tokens: str, n: int, length: int, batch: int,
                  overlap: bool, threads: int) -> None:
    """The plain forward over the token file's windows (analyze's windows: same draw, seed
    0), batch by batch; prints one marked JSON line."""
    import torch

    torch.set_num_threads(threads)
    from tl_spectral.data.tokenfile import TokenFile
    from tl_spectral.models.loading import load_named_model

    t_load = time.perf_counter()
    model, _ = load_named_model(model_name)
    model.eval()
    load_s = time.perf_counter() - t_load
    windows = TokenFile(tokens).windows(n, length, seed=0, overlap=overlap)
    t0, c0 = time.perf_counter(), _cpu_s()
    with torch.no_grad():
        for lo in range(0, n, batch):
            model(windows.batch(lo, lo + batch), return_type=None)
    print(MARK + json.dumps({
        "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "load_s": load_s,
        "peak_rss_mib": proc_status_kib("VmHWM") / 1024}), flush=True)


# ------------------------------------------------------------------------------ the runs
def _env(threads: int) -> dict:
    """The children's environment: this checkout first on the path, ``threads`` OpenMP/MKL
    threads, offline hubs, and the command line's own default of passive OpenMP waits (set
    before torch loads)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "MPLBACKEND": "Agg", "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}


def _run(cmd: list[str], threads: int, log: Path, what: str, *, marked: bool = True
         ) -> list[dict]:
    """Run ``cmd``, its stderr to ``log``; the marked records of its stdout (``marked``:
    at least one expected)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as err:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=_env(threads))
    recs = [json.loads(line[len(MARK):]) for line in p.stdout.splitlines()
            if line.startswith(MARK)]
    if p.returncode or (marked and not recs) or any(r.get("rc", 0) for r in recs):
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{what} failed (status {p.returncode}); {log}:\n{tail}")
    return recs


def _analyze_argv(a: argparse.Namespace, n: int, tokens: Path, report: Path) -> list[str]:
    """analyze's arguments; ``report`` (this benchmark's folder) emptied first: a pruned or
    half-written one from an earlier run is no longer a report analyze would replace."""
    shutil.rmtree(report, ignore_errors=True)
    argv = ["--model", a.model, "--tokens", str(tokens), "--n-docs", str(n), "--length",
            str(a.length), "--stream-rank", str(a.stream_rank), "--batch-size",
            str(a.batch_size), "--sections", a.sections, "--out", str(report)]
    return argv + (["--overlap"] if a.overlap else []) + (["--no-bos"] if a.no_bos else [])


def _prune(report: Path) -> dict:
    """Keep a report's ``results/`` and ``report.json``; return its ``timings_s``."""
    timings = json.loads((report / "report.json").read_text())["timings_s"]
    for p in report.iterdir():
        if p.name not in ("results", "report.json"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return timings


def run_single(a: argparse.Namespace, n: int, tokens: Path) -> dict:
    """One N: analyze in a fresh process, then the plain forward in another."""
    report = a.out / "reports" / f"single_N{n}"
    me = [sys.executable, str(Path(__file__).resolve())]
    an = _run([*me, "--child-analyze", str(a.threads), "--",
               *_analyze_argv(a, n, tokens, report)], a.threads,
              a.out / "logs" / f"analyze_N{n}.log", f"analyze at N = {n}")[0]
    fw = _run([*me, "--child-forward", a.model, str(tokens), str(n), str(a.length),
               str(a.batch_size), str(int(a.overlap)), str(a.threads)], a.threads,
              a.out / "logs" / f"forward_N{n}.log", f"the plain forward at N = {n}")[0]
    timings = _prune(report)
    pw = timings["probe pass"]
    tok = n * a.length
    return {
        "kind": "single", "n": n, "tokens": tok,
        "probe_wall_s": pw, "probe_cpu_s": an["probe"]["cpu_s"],
        "forward_wall_s": fw["wall_s"], "forward_cpu_s": fw["cpu_s"],
        "ratio": pw / fw["wall_s"], "cpu_ratio": an["probe"]["cpu_s"] / fw["cpu_s"],
        "passes": an["probe"].get("passes", 1),
        "ratio_per_pass": pw / fw["wall_s"] / an["probe"].get("passes", 1),
        "tokens_per_s": tok / pw, "forward_tokens_per_s": tok / fw["wall_s"],
        "peak_rss_mib": an["peak_rss_mib"], "probe_peak_rss_mib": an["probe"]["peak_rss_mib"],
        "forward_peak_rss_mib": fw["peak_rss_mib"],
        "analyze_wall_s": an["wall_s"], "analyze_cpu_s": an["cpu_s"],
        "forward_load_s": fw["load_s"], "timings_s": timings,
        "load_average": round(os.getloadavg()[0], 2),
    }


def run_torchrun(a: argparse.Namespace, n: int, tokens: Path) -> dict:
    """analyze at N under ``torchrun --nproc_per_node 2``; its results against one process's."""
    report = a.out / "reports" / f"torchrun_N{n}"
    per_rank = max(1, a.threads // 2)  # the same cores as the one process, split by rank
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(Path(__file__).resolve()), "--child-analyze", str(per_rank), "--",
           *_analyze_argv(a, n, tokens, report)]
    t0 = time.perf_counter()
    ranks = sorted(_run(cmd, per_rank, a.out / "logs" / f"torchrun_N{n}.log",
                        f"torchrun analyze at N = {n}"), key=lambda r: r["rank"])
    wall = time.perf_counter() - t0
    timings = _prune(report)
    cmp = compare_results(a.out / "reports" / f"single_N{n}" / "results", report / "results",
                          a.rtol)
    return {
        "kind": "torchrun", "n": n, "processes": len(ranks), "threads_per_rank": per_rank,
        "wall_s": wall,
        "probe_wall_s": max(r["probe"]["wall_s"] for r in ranks),  # the last rank's end
        "rank0_timings_probe_pass_s": timings["probe pass"],
        "rank_probe_wall_s": [r["probe"]["wall_s"] for r in ranks],
        "rank_probe_cpu_s": [r["probe"]["cpu_s"] for r in ranks],
        "rank_peak_rss_mib": [r["peak_rss_mib"] for r in ranks],
        "rank_probe_peak_rss_mib": [r["probe"]["peak_rss_mib"] for r in ranks],
        "timings_s": timings, **cmp, "load_average": round(os.getloadavg()[0], 2),
    }


# ------------------------------------------------------------------------- the comparison
def _meta_diffs(x, y, rtol: float, path: str = "") -> list[str]:
    """Where two metadata trees differ: floats beyond ``rtol`` (relative), anything else
    not equal."""
    if isinstance(x, dict) and isinstance(y, dict):
        if set(x) != set(y):
            return [f"{path}: keys {sorted(set(x) ^ set(y))}"]
        return [d for k in x for d in _meta_diffs(x[k], y[k], rtol, f"{path}.{k}")]
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return [f"{path}: length {len(x)} vs {len(y)}"]
        return [d for i, (p, q) in enumerate(zip(x, y))
                for d in _meta_diffs(p, q, rtol, f"{path}[{i}]")]
    if isinstance(x, float) or isinstance(y, float):
        ok = isinstance(x, (int, float)) and isinstance(y, (int, float)) and (
            x == y or abs(x - y) <= rtol * max(abs(x), abs(y)))
        return [] if ok else [f"{path}: {x} vs {y}"]
    return [] if x == y else [f"{path}: {x!r} vs {y!r}"]


def _file_diff(fa: Path, fb: Path, rtol: float) -> tuple[float, list[str]]:
    """(largest float deviation / the tensor's largest value, other differences)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(fa), "pt") as ha, safe_open(str(fb), "pt") as hb:
        if set(ha.keys()) != set(hb.keys()):
            return math.inf, [f"tensors {sorted(set(ha.keys()) ^ set(hb.keys()))}"]
        worst, other = 0.0, []
        for k in ha.keys():
            x, y = ha.get_tensor(k), hb.get_tensor(k)
            if x.shape != y.shape:
                other.append(f"{k}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
            elif x.is_floating_point():
                x, y = x.double(), y.double()
                both_nan = torch.isnan(x) & torch.isnan(y)
                d = torch.where(both_nan, 0.0, (x - y).abs()).nan_to_num(math.inf)
                scale = x.nan_to_num(0.0).abs().max().item() if x.numel() else 0.0
                err = d.max().item() / scale if x.numel() and scale > 0 else (
                    d.max().item() if x.numel() else 0.0)
                worst = max(worst, err)
            elif not torch.equal(x, y):
                other.append(f"{k}: not equal")
        ma, mb = ha.metadata() or {}, hb.metadata() or {}
    meta = [d for k in sorted(set(ma) | set(mb))
            for d in _meta_diffs(json.loads(ma.get(k, "null")), json.loads(mb.get(k, "null")),
                                 rtol, k)]
    return worst, other + meta


def compare_results(one: Path, two: Path, rtol: float) -> dict:
    """Every ``*.safetensors`` of the two results folders, tensor by tensor."""
    names = sorted({p.name for p in one.glob("*.safetensors")}
                   | {p.name for p in two.glob("*.safetensors")})
    per, notes = {}, []
    for name in names:
        if not (one / name).is_file() or not (two / name).is_file():
            per[name], _ = math.inf, notes.append(f"{name}: in one report only")
            continue
        err, diffs = _file_diff(one / name, two / name, rtol)
        per[name] = err
        notes += [f"{name} {d}" for d in diffs[:5]]
    worst = max(per.values(), default=0.0)
    return {"equal": bool(names) and worst <= rtol and not notes, "max_rel_dev": worst,
            "rel_dev": per, "differences": notes[:20], "files": len(names)}


# -------------------------------------------------------------------------- parent helpers
def find_corpora(a: argparse.Namespace) -> list[Path]:
    if a.corpus:
        files = [Path(c) for c in a.corpus]
    else:
        dirs = ([Path(a.data_dir)] if a.data_dir else
                [Path(d) for d in (os.environ.get("TL_SPECTRAL_DATA"),) if d]
                + [ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data"])
        folder = next((d for d in dirs if all((d / c).is_file() for c in CORPORA)), None)
        if folder is None:
            raise SystemExit(f"no folder holds {' and '.join(CORPORA)} (looked in "
                             f"{', '.join(map(str, dirs))}); pass --data-dir DIR or --corpus "
                             "FILE once per file")
        files = [folder / c for c in CORPORA]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"--corpus: no such file {', '.join(missing)}; pass text files")
    return files


def token_file(a: argparse.Namespace, corpora: list[Path]) -> tuple[Path, dict]:
    """The corpora tokenized for the model (``OUT/corpus.tok``, kept for a rerun)."""
    from tl_spectral.data.tokenfile import TokenFile

    path = a.out / "corpus.tok"
    info_path = a.out / "corpus.json"
    want = {"model": a.model, "corpora": [str(c.resolve()) for c in corpora]}
    if path.is_file() and info_path.is_file():
        info = json.loads(info_path.read_text())
        if {k: info.get(k) for k in want} == want:
            return path, info
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "tl_spectral", "tokenize", *map(str, corpora), "--model",
          a.model, "-o", str(path), "--overwrite"], a.threads, a.out / "logs" / "tokenize.log",
         "tl-spectral tokenize", marked=False)
    tf = TokenFile(path)
    info = {**want, "tokenize_s": time.perf_counter() - t0, "n_tokens": int(tf.n_tokens),
            "doc_tokens": [int(len(tf.document(d))) for d in range(tf.n_docs)]}
    info_path.write_text(json.dumps(info) + "\n")
    return path, info


def needs_overlap(tokens: Path, n: int, length: int) -> bool:
    from tl_spectral.data.tokenfile import TokenFile

    try:
        TokenFile(tokens).windows(n, length, seed=0)
    except ValueError:
        return True
    return False


def wants_no_bos(model: str) -> bool:
    """Token-file windows carry no start token: pass ``--no-bos`` unless the model's
    convention is fixed by its training (the character models), where analyze refuses it."""
    from tl_spectral.models.loading import model_info

    return not model_info(model).bos_fixed


def settings(a: argparse.Namespace) -> dict:
    """What a record must share with this run to be reused."""
    return {"model": a.model, "length": a.length, "stream_rank": a.stream_rank,
            "batch_size": a.batch_size, "threads": a.threads, "sections": a.sections,
            "overlap": a.overlap, "no_bos": a.no_bos}


def load_records(path: Path, want: dict) -> dict:
    recs = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("settings") == want:
                    recs[(r["kind"], r["n"])] = r
    return recs


def slope(ns: list[int], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log N (None with one N)."""
    xs, ls = [math.log(n) for n in ns], [math.log(y) for y in ys]
    xm, ym = sum(xs) / len(xs), sum(ls) / len(ls)
    sxx = sum((x - xm) ** 2 for x in xs)
    return sum((x - xm) * (y - ym) for x, y in zip(xs, ls)) / sxx if sxx > 0 else None


# --------------------------------------------------------------------------------- output
def _line(r: dict) -> str:
    if r["kind"] == "torchrun":
        return (f"torchrun N = {r['n']}: {r['processes']} processes, wall {r['wall_s']:.1f} s, "
                f"probe pass {r['probe_wall_s']:.1f} s, peak "
                f"{'/'.join(f'{m:.0f}' for m in r['rank_peak_rss_mib'])} MiB, results "
                f"{'equal' if r['equal'] else 'DIFFER'} (max dev {r['max_rel_dev']:.2e})")
    return (f"N = {r['n']:5d}: probe pass {r['probe_wall_s']:8.1f} s (CPU "
            f"{r['probe_cpu_s']:.1f}), forward {r['forward_wall_s']:8.1f} s (CPU "
            f"{r['forward_cpu_s']:.1f}), ratio {r['ratio']:.3f} (CPU {r['cpu_ratio']:.3f}; "
            f"{r['passes']} model passes), "
            f"{r['tokens_per_s']:.0f} tok/s, peak {r['peak_rss_mib']:.0f} MiB (forward "
            f"{r['forward_peak_rss_mib']:.0f}), analyze {r['analyze_wall_s']:.1f} s")


def _r(v):
    """Floats to 5 significant digits, in lists and dicts too."""
    if isinstance(v, float):
        return float(f"{v:.5g}")
    if isinstance(v, list):
        return [_r(x) for x in v]
    if isinstance(v, dict):
        return {k: _r(x) for k, x in v.items()}
    return v


def summary(a: argparse.Namespace, ns: list[int], recs: dict, corpus: dict) -> dict:
    rows = [recs[("single", n)] for n in ns]

    def col(k: str) -> list:
        return [_r(r[k]) for r in rows]

    first, last = rows[0], rows[-1]
    fits = {
        "mem_growth": last["peak_rss_mib"] / first["peak_rss_mib"],
        "probe_mem_growth": last["probe_peak_rss_mib"] / first["probe_peak_rss_mib"],
        "forward_mem_growth": last["forward_peak_rss_mib"] / first["forward_peak_rss_mib"],
        "time_exponent": slope(ns, [r["probe_wall_s"] for r in rows]),
        "cpu_time_exponent": slope(ns, [r["probe_cpu_s"] for r in rows]),
        "forward_time_exponent": slope(ns, [r["forward_wall_s"] for r in rows]),
        "max_ratio": max(r["ratio"] for r in rows),
        "max_cpu_ratio": max(r["cpu_ratio"] for r in rows),
        "max_ratio_per_pass": max(r["ratio_per_pass"] for r in rows),
    }
    # from the first N at or above the rank cap K on, every streamed POD's buffers hold their
    # full K rows: growth there is what N itself costs (below K the POD is exact, rank N)
    at_k = [r for n, r in zip(ns, rows) if n >= a.stream_rank]
    fits["mem_growth_from_rank"] = (at_k[-1]["peak_rss_mib"] / at_k[0]["peak_rss_mib"]
                                    if len(at_k) > 1 else None)
    fits["time_exponent_from_rank"] = slope([n for n in ns if n >= a.stream_rank],
                                            [r["probe_wall_s"] for r in at_k]) \
        if len(at_k) > 1 else None
    met = {f"{k}<={v}": (fits[k] is not None and fits[k] <= v) for k, v in TARGETS.items()}
    tr = recs.get(("torchrun", a.torchrun_n)) if a.torchrun else None
    return {
        "benchmark": "corpus_scale", "model": a.model,
        "corpora": [Path(c).name for c in corpus["corpora"]], "corpus_tokens": corpus["n_tokens"],
        "doc_tokens": corpus["doc_tokens"], "tokenize_s": _r(corpus["tokenize_s"]),
        "T": a.length, "stream_rank": a.stream_rank, "batch_size": a.batch_size,
        "threads": a.threads, "sections": a.sections, "no_bos": a.no_bos,
        "windows": "overlapping (the token file is too short for disjoint windows)"
        if a.overlap else "disjoint", "n_docs": ns,
        "probe_wall_s": col("probe_wall_s"), "probe_cpu_s": col("probe_cpu_s"),
        "forward_wall_s": col("forward_wall_s"), "forward_cpu_s": col("forward_cpu_s"),
        "ratio": col("ratio"), "cpu_ratio": col("cpu_ratio"), "passes": col("passes"),
        "ratio_per_pass": col("ratio_per_pass"),
        "tokens_per_s": col("tokens_per_s"), "forward_tokens_per_s":
        col("forward_tokens_per_s"), "peak_rss_mib": col("peak_rss_mib"),
        "probe_peak_rss_mib": col("probe_peak_rss_mib"),
        "forward_peak_rss_mib": col("forward_peak_rss_mib"),
        "analyze_wall_s": col("analyze_wall_s"),
        **_r(fits),
        "targets_met": met,
        "torchrun": None if tr is None else _r({
            **{k: v for k, v in tr.items() if k not in ("kind", "settings", "timings_s")},
            "tokens_per_s": tr["n"] * a.length / tr["probe_wall_s"],
            "probe_speedup": recs[("single", tr["n"])]["probe_wall_s"] / tr["probe_wall_s"]}),
        "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
        "load_average": [r["load_average"] for r in rows],
    }


# ----------------------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ns", default="128,256,512,1024", help="comma-separated window counts")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--stream-rank", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--sections", default="all", help="analyze --sections")
    ap.add_argument("--torchrun", action=BooleanOptionalAction, default=True,
                    help="also run analyze under torchrun --nproc_per_node 2 at --torchrun-n")
    ap.add_argument("--torchrun-n", type=int, default=None, help="default: the largest N")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="torchrun vs one process: largest deviation / largest value")
    ap.add_argument("--data-dir", default=None, help="folder of wiki_excerpt.txt, austen.txt")
    ap.add_argument("--corpus", action="append", default=None,
                    help="a text file to tokenize (repeat; instead of --data-dir)")
    ap.add_argument("--out", default=None, help="work folder, kept and resumable "
                    "(default: a temporary folder, removed)")
    ap.add_argument("--save", default=None, help="also write the JSON line to this file")
    a = ap.parse_args(argv)
    try:
        a.ns = sorted({int(x) for x in a.ns.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--ns {a.ns!r}: pass comma-separated integers, e.g. 128,256,512,1024")
    if not a.ns or min(a.ns) < 1:
        ap.error("--ns: pass positive window counts")
    a.torchrun_n = a.torchrun_n or a.ns[-1]
    if a.torchrun and a.torchrun_n not in a.ns:
        ap.error(f"--torchrun-n {a.torchrun_n}: pass one of --ns ({a.ns})")
    return a


def run_all(a: argparse.Namespace) -> dict:
    corpora = find_corpora(a)
    tokens, corpus = token_file(a, corpora)
    print(f"token file: {corpus['n_tokens']:,} tokens ({', '.join(c.name for c in corpora)}; "
          f"tokenized in {corpus['tokenize_s']:.1f} s)", flush=True)
    a.overlap = needs_overlap(tokens, a.ns[-1], a.length)
    if a.overlap:
        print(f"NOTE: {corpus['n_tokens']:,} tokens hold fewer than {a.ns[-1]} disjoint windows "
              f"of {a.length}: windows drawn with --overlap (they may overlap)", flush=True)
    a.no_bos = wants_no_bos(a.model)
    ckpt = a.out / "records.jsonl"
    recs = load_records(ckpt, settings(a))
    todo = [("single", n) for n in a.ns] + ([("torchrun", a.torchrun_n)] if a.torchrun else [])
    for kind, n in todo:
        if (kind, n) in recs:
            print(f"(recorded) {_line(recs[(kind, n)])}", flush=True)
            continue
        rec = (run_single if kind == "single" else run_torchrun)(a, n, tokens)
        rec["settings"] = settings(a)
        with open(ckpt, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        recs[(kind, n)] = rec
        print(_line(rec), flush=True)
    return summary(a, a.ns, recs, corpus)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child-analyze":
        child_analyze(sys.argv[sys.argv.index("--") + 1:], int(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-forward":
        m, tok, n, length, batch, overlap, threads = sys.argv[2:9]
        child_forward(m, tok, int(n), int(length), int(batch), bool(int(overlap)), int(threads))
        return
    a = parse()
    temp = a.out is None
    a.out = Path(tempfile.mkdtemp(prefix="corpus_scale-") if temp else a.out).resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        out = run_all(a)
    finally:
        if temp:
            shutil.rmtree(a.out, ignore_errors=True)
    line = json.dumps(out)
    if a.save:
        Path(a.save).write_text(line + "\n", encoding="utf-8")
    print(line)


if __name__ == "__main__":
    main()
