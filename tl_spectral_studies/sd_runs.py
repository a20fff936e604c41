"""The S–D training-runs comparison (issue 17, items 5 and 6): several S–D training runs of
the project's trainer side by side — their identity (config, seed, normalization, A's
initial scale, no-decay patterns), the routing cascade over their checkpoints, the
statistics of their filtering diagonals D, and the SPEC B.4 ablations with paired bootstrap
intervals over validation windows.

    tl-spectral study routing sd-runs --run-dir A --run-dir B [--label a --label b]
        --results DIR [--windows 64] [--overwrite]

:func:`sd_runs_study` writes ``DIR/summary.json``; :func:`sd_runs_markdown` renders its tables;
the verdicts (:func:`layer0_minimum_verdict`, :func:`filtering_collapse_verdict`,
:func:`seed_spread`) are pure functions of that JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tl_spectral_studies._common import StudyUsageError

__all__ = ["d_statistics", "filtering_collapse_verdict", "layer0_minimum_verdict",
           "paired_delta_ppl", "sd_runs_markdown", "sd_runs_study", "seed_spread"]

#: the ablations of the study, all S–D layers at once (names of interventions.ablations.ABLATIONS_SD)
SD_RUN_ABLATIONS = ("filtering_collapse", "routing_removal", "filtering_removal")
#: a filtering collapse whose ΔPPL interval lies within ± this share of the base PPL is "free"
FREE_REL = 0.01
INTERVALS = ("95% t-interval over the heads of a layer (ranks, D statistics); 95% percentile "
             "bootstrap over validation windows, 1,000 resamples, seed 0, paired (the same "
             "resampled windows for the base and the ablated model), for ΔPPL")
"""The intervals of a summary written now (the committed summary records its own: percentile
bootstrap over heads, written before the t-interval)."""


# ------------------------------------------------------------------ per-window losses
def paired_delta_ppl(base: torch.Tensor, ablated: torch.Tensor, *, n_resamples: int = 1000,
                     seed: int = 0) -> dict[str, Any]:
    """ΔPPL = exp(mean ablated loss) − exp(mean base loss) over windows, and the relative
    ΔPPL (ΔPPL / base PPL), each with a paired percentile bootstrap interval over windows
    (one resample of window indices is used for both models). ``base``, ``ablated``: per-window
    mean losses ``[n]`` on the same windows
    (:func:`tl_spectral.interventions.surgery.window_losses`)."""
    from tl_spectral.analysis.bootstrap import bootstrap

    base, ablated = base.double(), ablated.double()
    if base.shape != ablated.shape or base.dim() != 1:
        raise ValueError(f"base and ablated must be per-window losses of one shape [n], got "
                         f"{tuple(base.shape)} and {tuple(ablated.shape)}")

    def stat(i: torch.Tensor) -> torch.Tensor:
        b, a = base[i].mean().exp(), ablated[i].mean().exp()
        return torch.stack([a - b, (a - b) / b])

    iv = bootstrap(stat, base.numel(), n_resamples=n_resamples, seed=seed)
    return {"base_loss": float(base.mean()), "base_ppl": math.exp(float(base.mean())),
            "loss": float(ablated.mean()), "ppl": math.exp(float(ablated.mean())),
            "delta_ppl": {"estimate": float(iv.estimate[0]), "low": float(iv.low[0]),
                          "high": float(iv.high[0])},
            "rel_delta_ppl": {"estimate": float(iv.estimate[1]), "low": float(iv.low[1]),
                              "high": float(iv.high[1])}}


# ------------------------------------------------------------------ D statistics
def d_statistics(model: torch.nn.Module) -> list[dict[str, Any] | None]:
    """Per layer, the statistics of the filtering diagonals ``diag(D) = softplus(δ)`` over
    the heads of an S–D layer (None for a layer without filtering):

    - ``mean``: mean of diag(D) per head, head mean with its interval over heads;
    - ``cv``: within-head coefficient of variation std/mean over the d_head entries
      (population std, ddof 0), head mean with its interval;
    - ``rel_change``: mean over a head's entries of |D − D₀| / D₀, D₀ = softplus(δ_init)
      the initial value (0.693 for δ_init = 0), head mean with its interval;
    - ``d_init``: D₀. Intervals: :func:`tl_spectral_studies._runs.head_interval`."""
    from tl_spectral_studies._runs import head_interval as _head_interval

    out: list[dict[str, Any] | None] = []
    for i, block in enumerate(model.blocks):
        att = block.attn
        if model.cfg.layer_attention(i) != "sd" or getattr(att, "filtering", "none") == "none":
            out.append(None)
            continue
        with torch.no_grad():
            d = F.softplus(att.delta.double()).expand(att.n_heads, att.d_head)  # [head, d_head]
            d0 = float(F.softplus(torch.tensor(float(att.delta_init), dtype=torch.float64)))
            mean = d.mean(-1)
            cv = d.std(-1, correction=0) / mean
            rel = ((d - d0).abs() / d0).mean(-1)
        out.append({"mean": _head_interval(mean), "cv": _head_interval(cv),
                    "rel_change": _head_interval(rel), "d_init": d0,
                    "filtering": att.filtering})
    return out


# ------------------------------------------------------------------ identity
def _config_name(run_dir: Path, meta: dict[str, Any]) -> str:
    """The run config's ``name`` when the checkpoint records one, else the folder name
    without a trailing ``-s<seed>`` (the suffix of the seed runs' ``--out-dir``)."""
    if isinstance(meta.get("name"), str):
        return meta["name"]
    name = run_dir.resolve().name
    seed = meta.get("train", {}).get("seed")
    m = re.fullmatch(r"(.+)-s(?:eed)?(\d+)", name)
    return m.group(1) if m and seed is not None and int(m.group(2)) == int(seed) else name


def _recipe_id(meta: dict[str, Any]) -> str:
    """Hash of the model config, the data section and the TrainConfig without seed, out_dir
    and the bookkeeping fields: equal for runs that differ only in the seed."""
    skip = {"seed", "out_dir", "resume", "overwrite", "device", "num_threads", "progress",
            "log_every", "eval_every", "eval_windows", "eval_batch_size", "checkpoint_every",
            "keep_checkpoints"}
    train = {k: v for k, v in meta.get("train", {}).items() if k not in skip}
    train.setdefault("no_decay", [])
    doc = {"model": meta.get("model", {}), "data": meta.get("data", {}), "train": train}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _identity(run_dir: Path, mdir: Path, step: int, finished: bool, model) -> dict[str, Any]:
    meta = json.loads((mdir / "config.json").read_text())
    train = meta.get("train", {})
    sd = [b.attn for i, b in enumerate(model.blocks) if model.cfg.layer_attention(i) == "sd"]
    ident: dict[str, Any] = {
        "run_dir": str(run_dir), "model_dir": str(mdir), "config_name": _config_name(run_dir, meta),
        "recipe_id": _recipe_id(meta), "seed": train.get("seed"),
        "normalization": model.cfg.normalization,
        "a_init_std": sd[0].a_init_std if sd else None,
        "a_init_std_set": (meta.get("model", {}).get("attention_options") or {}).get("a_init_std"),
        "no_decay": list(train.get("no_decay", [])), "weight_decay": train.get("weight_decay"),
        "steps": step, "final": finished,
    }
    metrics = meta.get("metrics", {})
    if finished and "val_loss" in metrics:
        ident["val_loss"] = float(metrics["val_loss"])
        ident["val_ppl"] = float(metrics.get("val_ppl", math.exp(metrics["val_loss"])))
        ident["val_loss_from"] = "final/config.json metrics (all validation windows)"
    else:
        evals = []
        state = mdir / "trainer_state.json"
        if state.is_file():
            evals = [e for e in json.loads(state.read_text()).get("history", {}).get("evals", [])
                     if "val_loss" in e]
        if evals:
            ident["val_loss"] = float(evals[-1]["val_loss"])
            ident["val_ppl"] = math.exp(ident["val_loss"])
            ident["val_loss_from"] = (f"the last evaluation of the trainer (step "
                                      f"{int(evals[-1]['step'])}, its eval_windows); no final/")
        else:
            ident["val_loss"] = ident["val_ppl"] = None
            ident["val_loss_from"] = "no final/ and no evaluation in the latest checkpoint"
    return ident


# ------------------------------------------------------------------ the study
def _window_kind(mdir: Path) -> str:
    """"char" (Tiny Shakespeare, the run's character table) or "bpe" (the study's top-K BPE
    corpora): the window kinds of :func:`tl_spectral_studies._runs.run_validation_windows`."""
    meta = json.loads((mdir / "config.json").read_text())
    data, tok = meta.get("data", {}), meta.get("tokenizer") or {}
    if tok.get("type") == "gpt2-bpe-topk":
        return "bpe"
    if tok.get("type") != "char":
        raise StudyUsageError(f"{mdir}: tokenizer {tok.get('type')!r}; the sd-runs windows "
                              "need a char run on Tiny Shakespeare or a top-K BPE study run")
    if data.get("corpus", "tiny_shakespeare") != "tiny_shakespeare":
        raise StudyUsageError(f"{mdir}: corpus {data.get('corpus')!r}; the char windows are "
                              "Tiny Shakespeare's validation split; compare Tiny Shakespeare runs")
    if data.get("bos") or tok.get("bos"):
        raise StudyUsageError(f"{mdir}: a run trained with a start token (data.bos); the "
                              "sd-runs windows have none; compare runs without data.bos")
    return "char"


def sd_runs_study(run_dirs: Sequence[str | Path], results_dir: str | Path, *,
                  labels: Sequence[str] | None = None, n_windows: int = 64,
                  overwrite: bool = False, data_dir: str | Path | None = None,
                  batch_size: int = 16) -> dict[str, Any]:
    """Compare S–D training runs (``run_dirs``, each a folder of the project's trainer with
    ``checkpoints/step_*`` and ``final/``; the latest checkpoint when a run has no final/,
    ``"final": false`` then). Per run (keyed by ``labels``, default the folder names):

    - ``identity``: config name, recipe id (equal for runs that differ only in the seed),
      seed, normalization, a_init_std, no_decay, steps, val_loss / val_ppl;
    - ``cascade``: head-mean effective rank of R (W_P S W_Pᵀ) and of S per layer at every
      checkpoint, and at the last one per layer the head mean with its interval over heads;
    - ``filtering``: :func:`d_statistics` of the model;
    - ``ablations``: per ablation of :data:`SD_RUN_ABLATIONS` (all S–D layers at once)
      :func:`paired_delta_ppl` on ``n_windows`` evenly spaced validation windows of the run
      (:func:`tl_spectral_studies._runs.run_validation_windows`).

    Writes ``results_dir/summary.json`` (refused when it exists, unless ``overwrite``);
    ``data_dir``: the BPE corpora folder, for BPE runs. Returns the summary."""
    from tl_spectral.geometry.cascade import cascade_over_training, latest_model_dir
    from tl_spectral.interventions.ablations import ablate
    from tl_spectral.interventions.surgery import window_losses
    from tl_spectral.models import load_checkpoint
    from tl_spectral_studies._runs import head_interval as _head_interval
    from tl_spectral_studies._runs import run_validation_windows

    results_dir = Path(results_dir)
    out = results_dir / "summary.json"
    if out.exists() and not overwrite:
        raise StudyUsageError(f"{out} exists; pass --overwrite to replace it")
    run_dirs = [Path(r) for r in run_dirs]
    if not run_dirs:
        raise StudyUsageError("no run given; pass one --run-dir per training run")
    if labels is None or len(labels) == 0:
        labels = [r.resolve().name for r in run_dirs]
    if len(labels) != len(run_dirs):
        raise StudyUsageError(f"{len(labels)} labels for {len(run_dirs)} runs; pass one "
                              "--label per --run-dir, or none")
    if len(set(labels)) != len(labels):
        raise StudyUsageError(f"run labels must differ, got {list(labels)}; pass --label")
    if n_windows < 2:
        raise StudyUsageError(f"the paired bootstrap needs at least 2 windows, got {n_windows}")
    runs: dict[str, Any] = {}
    for label, run_dir in zip(labels, run_dirs):
        try:
            mdir, step, finished = latest_model_dir(run_dir)
        except FileNotFoundError as e:
            raise StudyUsageError(f"{e}; pass the folder of a training run") from None
        model = load_checkpoint(mdir).eval()
        if not any(model.cfg.layer_attention(i) == "sd" for i in range(model.cfg.n_layers)):
            raise StudyUsageError(f"{run_dir} has no S–D attention layer; pass S–D runs only")
        c = cascade_over_training(run_dir, name=label)
        L = int(c.rank_R.shape[1])
        cascade = {
            "steps": c.steps.tolist(), "val_loss": c.val_loss.tolist(),
            "rank_R_mean": c.rank_R.double().mean(-1).tolist(),
            "rank_S_mean": c.rank_S.double().mean(-1).tolist(),
            "final": {"step": int(c.steps[-1]),
                      "R": [_head_interval(c.rank_R[-1, i]) for i in range(L)],
                      "S": [_head_interval(c.rank_S[-1, i]) for i in range(L)]},
        }
        win = run_validation_windows(mdir, _window_kind(mdir), n_windows=n_windows,
                                 data_dir=data_dir)
        base = window_losses(model, win, batch_size=batch_size)
        abl = {kind: paired_delta_ppl(base, window_losses(ablate(model, kind), win,
                                                          batch_size=batch_size))
               for kind in SD_RUN_ABLATIONS}
        runs[label] = {
            "identity": _identity(run_dir, mdir, step, finished, model),
            "cascade": cascade, "filtering": d_statistics(model),
            "ablations": {"n_windows": int(win.shape[0]), "seq_len": int(win.shape[1] - 1),
                          "layers": "all S–D layers at once", **abl},
        }
    s = {"runs": runs, "n_windows": n_windows, "intervals": INTERVALS,
         "command": "tl-spectral study routing sd-runs "
                    + " ".join(f"--run-dir {r.resolve().name}" for r in run_dirs)
                    + " --results DIR" + (f" --windows {n_windows}" if n_windows != 64 else "")}
    results_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return s


# ------------------------------------------------------------------ verdicts
def layer0_minimum_verdict(run: dict[str, Any]) -> str:
    """From a run's last-checkpoint R-rank head means per layer: a description, not a test —
    the summary holds head means with percentile intervals over 8 heads, which under-cover
    (:func:`~tl_spectral_studies.verdicts.layer0_minimum_descriptive`; with per-head values
    the test is :func:`~tl_spectral_studies.verdicts.layer0_minimum`)."""
    from tl_spectral_studies.verdicts import layer0_minimum_descriptive

    rows = run["cascade"]["final"]["R"]
    if len(rows) < 2:
        raise ValueError(f"a layer-0 verdict needs at least 2 layers, got {len(rows)}")
    return layer0_minimum_descriptive([r["estimate"] for r in rows])


def filtering_collapse_verdict(run: dict[str, Any]) -> str:
    """"free" when the filtering collapse's ΔPPL interval contains 0 or lies within ±1% of
    the base PPL, else "costs X% [lo, hi]" (relative ΔPPL in percent with its interval)."""
    a = run["ablations"]["filtering_collapse"]
    d, rel = a["delta_ppl"], a["rel_delta_ppl"]
    if d["low"] <= 0.0 <= d["high"] or (-FREE_REL <= rel["low"] and rel["high"] <= FREE_REL):
        return "free"
    return (f"costs {100 * rel['estimate']:.2f}% [{100 * rel['low']:.2f}, "
            f"{100 * rel['high']:.2f}]")


def seed_spread(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """For every config name shared by several runs: layer 0's head-mean R rank at the last
    checkpoint, its mean and min–max over the runs (the seeds), their steps, and whether the
    runs differ in the seed only (equal recipe ids)."""
    groups: dict[str, list[str]] = {}
    for label, run in summary["runs"].items():
        groups.setdefault(run["identity"]["config_name"], []).append(label)
    out = []
    for name, labels in groups.items():
        if len(labels) < 2:
            continue
        runs = [summary["runs"][lb] for lb in labels]
        r0 = [r["cascade"]["final"]["R"][0]["estimate"] for r in runs]
        out.append({"config_name": name, "labels": labels,
                    "seeds": [r["identity"]["seed"] for r in runs],
                    "steps": [r["identity"].get("steps") for r in runs],
                    "seed_only": len({r["identity"]["recipe_id"] for r in runs}) == 1,
                    "layer0_R_mean": sum(r0) / len(r0), "layer0_R_min": min(r0),
                    "layer0_R_max": max(r0)})
    return out


def _seed_line(g: dict[str, Any]) -> str:
    what = "" if g["seed_only"] else " (the runs differ in more than the seed)"
    if len(set(g.get("steps") or [None])) > 1:
        what += f" (at different steps: {', '.join(str(x) for x in g['steps'])})"
    return (f"{g['config_name']}, seeds {', '.join(str(s) for s in g['seeds'])}{what}: layer 0 "
            f"R rank {g['layer0_R_mean']:.2f} (min–max {g['layer0_R_min']:.2f}–"
            f"{g['layer0_R_max']:.2f})")


# ------------------------------------------------------------------ markdown
def sd_runs_markdown(results_dir: str | Path) -> str:
    """The tables of the S–D training-runs comparison from ``results_dir/summary.json``:
    (a) per run: validation loss, layer-0 verdict, filtering-collapse ΔPPL; (b) R and S rank
    per layer and run; (c) D statistics per layer and run; (d) the seed spread."""
    from tl_spectral_studies._common import fmt_interval

    s = json.loads((Path(results_dir) / "summary.json").read_text())
    runs = s["runs"]

    L = ["| run | config | seed | norm | a_init_std | no_decay | steps | val loss | "
         "layer 0 (descriptive) | filtering collapse ΔPPL | verdict | routing removal ΔPPL | "
         "filtering removal ΔPPL |", "|---|" + "---|" * 12]
    for label, r in runs.items():
        i, a = r["identity"], r["ablations"]
        vl = "—" if i["val_loss"] is None else f"{i['val_loss']:.3f}"
        if not i["final"]:
            vl += f" (step {i['steps']}, no final/)"
        L.append(f"| {label} | {i['config_name']} | {i['seed']} | {i['normalization']} | "
                 f"{i['a_init_std']:.3g} | {', '.join(i['no_decay']) or '—'} | {i['steps']} | "
                 f"{vl} | {layer0_minimum_verdict(r)} | "
                 f"{fmt_interval(a['filtering_collapse']['delta_ppl'])} | "
                 f"{filtering_collapse_verdict(r)} | "
                 f"{fmt_interval(a['routing_removal']['delta_ppl'])} | "
                 f"{fmt_interval(a['filtering_removal']['delta_ppl'])} |")
    L.append("")
    labels = list(runs)
    n_layers = max(len(r["cascade"]["final"]["R"]) for r in runs.values())
    L.append("| layer | " + " | ".join(f"R rank, {lb} | S rank, {lb}" for lb in labels) + " |")
    L.append("|---|" + "---|---|" * len(labels))
    for li in range(n_layers):
        cells = []
        for r in runs.values():
            f = r["cascade"]["final"]
            cells += [fmt_interval(f["R"][li], "{:.2f}") if li < len(f["R"]) else "—",
                      fmt_interval(f["S"][li], "{:.2f}") if li < len(f["S"]) else "—"]
        L.append(f"| {li} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("| layer | " + " | ".join(f"D mean, {lb} | CV of D, {lb} | \\|D − D₀\\|/D₀, {lb}"
                                      for lb in labels) + " |")
    L.append("|---|" + "---|---|---|" * len(labels))
    for li in range(n_layers):
        cells = []
        for r in runs.values():
            d = r["filtering"][li] if li < len(r["filtering"]) else None
            cells += (["—"] * 3 if d is None else
                      [fmt_interval(d["mean"]), fmt_interval(d["cv"]), fmt_interval(d["rel_change"])])
        L.append(f"| {li} | " + " | ".join(cells) + " |")
    spread = seed_spread(s)
    if spread:
        L.append("")
        L.append("| config | runs | seeds | layer 0 R rank, mean over seeds | min–max |")
        L.append("|---|---|---|---|---|")
        for g in spread:
            note = "" if g["seed_only"] else " (differ in more than the seed)"
            L.append(f"| {g['config_name']}{note} | {', '.join(g['labels'])} | "
                     f"{', '.join(str(x) for x in g['seeds'])} | {g['layer0_R_mean']:.2f} | "
                     f"{g['layer0_R_min']:.2f}–{g['layer0_R_max']:.2f} |")
        L.append("")
        L.append("Seed spread: " + "; ".join(_seed_line(g) for g in spread) + ".")
    L.append("")
    nw = {r["ablations"]["n_windows"] for r in runs.values()}
    sl = {r["ablations"]["seq_len"] for r in runs.values()}
    L.append(f"ΔPPL: all S–D layers ablated at once, on {'/'.join(map(str, sorted(nw)))} evenly "
             f"spaced validation windows of {'/'.join(map(str, sorted(sl)))} (+1) tokens; "
             f"filtering collapse \"free\" when its interval contains 0 or lies within "
             f"±{100 * FREE_REL:.0f}% of the base PPL. Ranks at the last checkpoint; "
             "D₀ = softplus(δ_init) = 0.693 for δ_init = 0.")
    L.append(f"Intervals: {s['intervals']}."
             + (" A percentile bootstrap over the 8 heads of a layer under-covers, so the "
                "layer-0 column only describes the head means (no test)."
                if "bootstrap, 1,000 resamples, seed 0: over the heads" in s["intervals"]
                else ""))
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------ figure
def sd_runs_figure(results_dir: str | Path, path: str | Path) -> Path:
    """Effective routing rank over training, per run: layer 0 (solid) and the lowest of the
    other layers (dashed), head means, from ``summary.json`` alone (so the committed results
    redraw it). Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tl_spectral_studies._common import add_caption

    s = json.loads((Path(results_dir) / "summary.json").read_text())
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, (label, run) in enumerate(s["runs"].items()):
        c = run["cascade"]
        color = f"C{i}"
        ax.plot(c["steps"], [r[0] for r in c["rank_R_mean"]], "-", color=color,
                label=f"{label}: layer 0")
        ax.plot(c["steps"], [min(r[1:]) for r in c["rank_R_mean"]], "--", color=color,
                lw=0.9, label=f"{label}: min of layers 1–5")
    ax.set_xlabel("training step")
    ax.set_ylabel("effective routing rank (head mean)")
    ax.legend(fontsize=6, ncol=2)
    ax.set_title("S–D runs: routing rank of W_P S W_Pᵀ over training", fontsize=9)
    add_caption(fig, "every checkpoint of each run; " + s["command"])
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
