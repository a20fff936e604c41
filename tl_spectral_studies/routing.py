"""The routing/filtering study of docs/routing_filtering.md (SPEC part B).

For MiniLM (if installed), the project's shipped char models and every training run found under
``runs_dir``: QK geometry, S–D geometry, the cascade over training, the SPEC B.4 ablations with
ΔPPL on validation windows. Also the subword (GPT-2 BPE, top-K vocabulary) training of the
study's BPE models.

    tl-spectral study routing --out DIR [--quick] [--runs-dir runs] [--data-dir ../shared/data]
    tl-spectral study routing train-bpe --config configs/bpe-sd-noln.json --data-dir ../shared/data
    tl-spectral study routing tables DIR/summary.json
    tl-spectral study routing rotary --model-dir CKPT --results DIR [--figure PNG]
    tl-spectral study routing sd-runs --run-dir A --run-dir B --results DIR  (sd_runs.py)

Results go to ``DIR`` (one ``.safetensors`` per result and ``summary.json``), figures to
``DIR/figures`` (or ``--fig-dir``); :func:`markdown` renders the doc tables from ``summary.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral.geometry.cascade import (
    CascadeResult,
    cascade_over_training,
    latest_model_dir,
)
from tl_spectral.geometry.model import (
    geometry_layer_table,
    model_qk_geometry,
    model_sd_geometry,
    random_baseline,
)
from tl_spectral.geometry.qk import QKGeometry, SDGeometry
from tl_spectral.models.ablations import (
    ABLATIONS_SD,
    ABLATIONS_SOFTMAX,
    AblationResult,
    ablation_table,
)
from tl_spectral.results import Result
from tl_spectral.usage import ArgumentParser
from tl_spectral_studies._common import (
    StudyUsageError,
    add_caption,
    add_run_arguments,
    fmt_interval,
    fresh_out,
    positive_int,
    prepare_out,
)
from tl_spectral_studies._runs import HEADS_INTERVALS, load_bpe_data, run_validation_windows
from tl_spectral_studies._runs import head_interval as _head_interval

NAME = "routing"


def run_bpe_from_config(doc: dict[str, Any], *, overrides: dict[str, Any] | None = None):
    """Train a GPT on the BPE data of ``doc["data"]`` (see :func:`load_bpe_data`) with the
    project's Trainer (checkpoints + exact resume in ``train.out_dir``); at the end write
    ``out_dir/final`` (model, tokenizer with its kept ids, metrics on every validation
    window). Returns (trainer, history)."""
    from tl_spectral.models.train import TrainConfig, run_from_config

    out_dir = TrainConfig.from_dict({**doc["train"], **(overrides or {})}).out_dir
    tok, train_ids, val_ids = load_bpe_data(doc.get("data", {}), cache_dir=out_dir)
    unk = float((val_ids == tok.unk_id).float().mean())
    return run_from_config(doc, overrides=overrides, data=(tok, train_ids, val_ids),
                           extra_metrics={"val_unk_fraction": unk})


# ---------------------------------------------------------------------------- study
#: The models of the routing study (docs/routing_filtering.md) and their data kind.
STUDY_RUNS = {
    "char-shakespeare": "char", "char-shakespeare-noln": "char",
    "sd-char-shakespeare": "char", "sd-char-shakespeare-noln": "char",
    "bpe-softmax-noln": "bpe", "bpe-sd-noln": "bpe",
}


def minimal_rank_share(rank: torch.Tensor, threshold: float = 3.0) -> float:
    """Share of layers whose mean routing rank (``rank`` ``[layer, head]``) is at most
    ``threshold`` (*choice*: 3 = one rotation plane plus slack; the paper's "minimal
    spectral rank" is rank 2)."""
    return float((rank.double().mean(-1) <= threshold).double().mean())


def _geometry_summary(geo: QKGeometry) -> dict[str, Any]:
    return {"n_heads_total": int(geo.n_layers * geo.n_heads),
            "unstable_heads": int(geo.unstable.sum()),
            "routing_fraction_mean": float(geo.routing_fraction.mean()),
            "rank_R_mean": float(geo.eff_rank_R.mean()), "pr_R_mean": float(geo.pr_R.mean()),
            "capacity": int(geo.routing_capacity.max()),
            "positive_eig_share_mean": float(geo.positive_share.mean()),
            "layers": geometry_layer_table(geo),
            "layers_pr": [r["rank_R"] for r in geometry_layer_table(geo, measure="participation")]}


def run_study(out_dir: str | Path, *, runs_dir: str | Path | None = None,
              fig_dir: str | Path | None = None, n_windows: int = 64,
              names: Sequence[str] | None = None, minilm: bool = True,
              per_layer: bool = True, merge: bool = True, data_dir: str | Path | None = None,
              quick: bool = False) -> dict[str, Any]:
    """The routing study of docs/routing_filtering.md: for MiniLM (if installed) and every
    study model — QK geometry, S–D geometry, the cascade over training, the SPEC B.4 ablations
    with ΔPPL on ``n_windows`` evenly spaced validation windows.

    A model is read from its training run ``runs_dir/NAME`` when one exists (then the cascade
    over its checkpoints is computed too), else from the zoo for the shipped char models
    (no cascade: the zoo keeps the final weights only); BPE models need their runs and
    ``data_dir`` (the folder of austen.txt, wiki_excerpt.txt, gpt2.tiktoken). ``quick``: the
    shipped char models only, 8 windows, no per-layer ablations.

    Results go to ``out_dir`` (one ``.safetensors`` per result and ``summary.json``; with
    ``merge`` an existing summary is updated, so the study can run in parts), figures (of
    everything in ``out_dir``) to ``fig_dir/routing_*.png`` (default ``out_dir/figures``).
    Returns the summary."""
    from tl_spectral.models import load_model, zoo

    if quick:
        names = [n for n in (names or STUDY_RUNS) if STUDY_RUNS.get(n) == "char"]
        n_windows, per_layer = min(n_windows, 8), False
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"n_windows": n_windows, "models": {}, "baselines": {}}
    if merge and (out / "summary.json").is_file():  # update the entries computed now
        summary = json.loads((out / "summary.json").read_text())
        summary["n_windows"] = n_windows
    geos: dict[str, QKGeometry] = {}
    sds: dict[str, SDGeometry] = {}
    cascades: dict[str, CascadeResult] = {}
    abls: dict[str, AblationResult] = {}
    if minilm:
        try:
            enc, _ = zoo.load("minilm")
        except Exception as e:  # noqa: BLE001 - report why and go on
            summary["minilm_error"] = f"{type(e).__name__}: {e}"
        else:
            g = model_qk_geometry(enc)
            g.save(out / "minilm_qk.safetensors", overwrite=True)
            g.to_csv(out / "minilm_heads.csv")
            geos["minilm"] = g
            summary["models"]["minilm"] = {"qk": _geometry_summary(g)}
    for shape in ((384, 12, 32), (128, 8, 16), (128, 4, 32)):
        summary["baselines"]["gaussian_{}_{}_{}".format(*shape)] = _geometry_summary(
            random_baseline(*shape, n_layers=2))
    for name in names or list(STUDY_RUNS):
        run = Path(runs_dir) / name if runs_dir is not None else None
        try:
            if run is None:
                raise FileNotFoundError(f"no runs_dir given for {name}")
            mdir, step, finished = latest_model_dir(run)
        except FileNotFoundError as e:
            if name not in zoo.SHIPPED:
                summary["models"][name] = {"error": f"{e}; retrain it (docs/routing_filtering.md)"}
                continue
            run, mdir = None, zoo.checkpoint_dir(name)
            step = int(json.loads((mdir / "config.json").read_text())
                       .get("metrics", {}).get("steps", -1))
            finished = True
        model = load_model(mdir).eval()
        entry: dict[str, Any] = {"model_dir": f"zoo:{name}" if run is None else str(mdir),
                                 "step": step, "finished": finished,
                                 "config": model.cfg.to_dict(),
                                 "n_params": model.num_params()}
        meta = json.loads((mdir / "config.json").read_text())
        if "metrics" in meta:
            entry["val_metrics_all_windows"] = meta["metrics"]
        g = model_qk_geometry(model)
        g.save(out / f"{name}_qk.safetensors", overwrite=True)
        g.to_csv(out / f"{name}_heads.csv")
        geos[name] = g
        entry["qk"] = _geometry_summary(g)
        if any(model.cfg.layer_attention(i) == "sd" for i in range(model.cfg.n_layers)):
            sg = model_sd_geometry(model)
            sg.save(out / f"{name}_sd.safetensors", overwrite=True)
            sg.to_csv(out / f"{name}_sd_heads.csv")
            sds[name] = sg
            entry["sd"] = {"layers": geometry_layer_table(sg),
                           "layers_pr": [r["rank_S"] for r in
                                         geometry_layer_table(sg, measure="participation")],
                           "all_stable": sg.all_stable,
                           "minimal_rank_layer_share": minimal_rank_share(sg.eff_rank_S)}
        if run is not None:
            c = cascade_over_training(run, name=name)
            c.save(out / f"{name}_cascade.safetensors", overwrite=True)
            cascades[name] = c
            entry["cascade_steps"] = c.steps.tolist()
            entry["cascade_rank_mean"] = c.rank().double().mean(-1).tolist()
            entry["cascade_rank_R_mean"] = c.rank_R.double().mean(-1).tolist()
            entry["cascade_val_loss"] = c.val_loss.tolist()
        win = run_validation_windows(mdir, STUDY_RUNS.get(name, "char"), n_windows=n_windows,
                                 data_dir=data_dir)
        a = ablation_table(model, win, name=name, per_layer=per_layer)
        a.save(out / f"{name}_ablation.safetensors", overwrite=True)
        abls[name] = a
        entry["ablation"] = {"baseline_ppl": a.baseline_ppl, "baseline_loss": a.baseline_loss,
                             "rows": a.rows, "n_windows": a.n_windows, "seq_len": a.seq_len}
        summary["models"][name] = entry
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    order = ["minilm", *STUDY_RUNS]
    summary["models"] = dict(sorted(summary["models"].items(), key=lambda kv: (
        order.index(kv[0]) if kv[0] in order else len(order))))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    figures_from_dir(out, fig_dir if fig_dir is not None else out / "figures")
    return summary


def figures_from_dir(out_dir: str | Path, fig_dir: str | Path) -> list[Path]:
    """Rebuild the study figures from the results saved in ``out_dir`` by :func:`run_study`
    (models in the order of ``summary.json``)."""
    out = Path(out_dir)
    summary = json.loads((out / "summary.json").read_text())
    geos, sds, cascades, abls = {}, {}, {}, {}
    for name, e in summary["models"].items():
        if "error" in e:
            continue
        for suffix, store in (("qk", geos), ("sd", sds), ("cascade", cascades),
                              ("ablation", abls)):
            p = out / f"{name}_{suffix}.safetensors"
            if p.is_file():
                store[name] = Result.load(p)
    return study_figures(geos, sds, cascades, abls, fig_dir, caption=figure_caption(summary))


def figure_caption(summary: dict[str, Any]) -> str:
    """The caption of the routing figures: every model with its training steps, the
    ablation windows × length and the seed as recorded in ``summary`` ("not recorded"
    where the results do not say); models without results (unshipped runs) are named as
    left out."""
    parts, windows, left_out = [], set(), []
    for name, e in summary["models"].items():
        if "error" in e:
            left_out.append(name)
            continue
        step = e.get("step")
        parts.append(name if name == "minilm" else
                     f"{name} ({step if step is not None else 'steps not recorded'} steps)")
        a = e.get("ablation")
        if a:
            windows.add(f"{a.get('n_windows', '?')} × {a.get('seq_len', '?')}")
    seeds = {e.get("config", {}).get("seed") for e in summary["models"].values()
             if "error" not in e}
    seed = ("not recorded" if seeds <= {None} else ", ".join(str(x) for x in sorted(
        x for x in seeds if x is not None)))
    cap = (f"models: {', '.join(parts)}; ablations on "
           f"{', '.join(sorted(windows)) or 'no'} validation windows (tokens), weights only "
           f"otherwise; training seed: {seed}")
    if left_out:
        cap += f"; shipped models only ({', '.join(left_out)}: no committed results)"
    return cap + "; tl-spectral study routing"


def study_figures(geos: dict[str, QKGeometry], sds: dict[str, SDGeometry],
                  cascades: dict[str, CascadeResult], abls: dict[str, AblationResult],
                  fig_dir: str | Path, caption: str = "tl-spectral study routing"
                  ) -> list[Path]:
    """Write the study's figures (``routing_*.png``) into ``fig_dir``, each with ``caption``
    (the run: models, windows); returns the paths."""
    import matplotlib.pyplot as plt

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name):
        import textwrap

        add_caption(fig, textwrap.fill(caption, int(fig.get_figwidth() * 17)))
        p = fig_dir / f"routing_{name}.png"
        fig.savefig(p, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)

    names = list(geos)
    if names:  # budget, rank of R, eigenvalues: one row per model
        fig, axes = plt.subplots(len(names), 3, figsize=(15, 3.3 * len(names)), squeeze=False)
        for i, n in enumerate(names):
            geos[n].plot_budget(ax=axes[i, 0])
            geos[n].plot_routing_rank(ax=axes[i, 1], show_capacity=True)
            geos[n].plot_eigenvalues(ax=axes[i, 2])
            for a in axes[i]:
                a.set_title(f"{n}: {a.get_title()}", fontsize=9)
        fig.tight_layout()
        save(fig, "qk_geometry")
    if sds:  # S–D: rank of S per layer and eigenvalues of S − D
        fig, axes = plt.subplots(len(sds), 2, figsize=(10, 3.3 * len(sds)), squeeze=False)
        for i, (n, sg) in enumerate(sds.items()):
            sg.plot_routing_rank(ax=axes[i, 0], show_capacity=True)
            sg.plot_eigenvalues(ax=axes[i, 1])
            for a in axes[i]:
                a.set_title(f"{n}: {a.get_title()}", fontsize=9)
        fig.tight_layout()
        save(fig, "sd_geometry")
    if cascades:  # the cascade by depth (final) and over training
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for j, (n, c) in enumerate(cascades.items()):
            col = f"C{j}"
            r = c.rank_R[-1].double().mean(-1).numpy()
            ax.plot(range(len(r)), r, "s--", color=col, label=f"{n} (R)")
            if c.rank_S is not None:
                r = c.rank_S[-1].double().mean(-1).numpy()
                ax.plot(range(len(r)), r, "o:", color=col, alpha=0.6, label=f"{n} (S)")
        ax.set_xlabel("layer")
        ax.set_ylabel("routing rank (entropy), mean over heads")
        ax.set_title("Routing rank by depth at the last checkpoint")
        ax.legend(fontsize=7)
        fig.tight_layout()
        save(fig, "cascade_depth")
        k = len(cascades)
        fig, axes = plt.subplots((k + 1) // 2, 2, figsize=(11, 3.3 * ((k + 1) // 2)),
                                 squeeze=False)
        for a, c in zip(axes.ravel(), cascades.values()):
            c.plot(ax=a)
        for a in axes.ravel()[k:]:
            a.axis("off")
        fig.tight_layout()
        save(fig, "cascade_training")
        fig, axes = plt.subplots((k + 1) // 2, 2, figsize=(11, 3.3 * ((k + 1) // 2)),
                                 squeeze=False)
        for a, c in zip(axes.ravel(), cascades.values()):
            c.plot(ax=a, which="R")
        for a in axes.ravel()[k:]:
            a.axis("off")
        fig.tight_layout()
        save(fig, "cascade_training_R")
    if abls:  # ΔPPL/PPL of each ablation on all layers; log only if some value is ≤ 0
        fig, ax = plt.subplots(figsize=(9, 4.2))
        kinds = list(ABLATIONS_SD) + list(ABLATIONS_SOFTMAX)
        width = 0.8 / max(1, len(abls))
        allv = []
        for j, (n, a) in enumerate(abls.items()):
            vals = []
            for kd in kinds:
                r = [x for x in a.rows if x["ablation"] == kd and x["layers"] == "all"]
                vals.append(r[0]["rel_delta"] if r else float("nan"))
            allv += [v for v in vals if v == v]
            bars = ax.bar([i + j * width for i in range(len(kinds))], vals, width, label=n)
            ax.bar_label(bars, labels=["" if v != v else f"{v:.2g}" for v in vals],
                         fontsize=6.5, padding=2, rotation=90)  # tiny values stay readable
        if allv and min(allv) <= 0:
            ax.set_yscale("symlog", linthresh=1e-3)
            ax.axhline(0, color="0.3", lw=0.6)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))])
        ax.set_xticklabels([kd.replace("_", "\n") for kd in kinds], fontsize=8)
        ax.set_xlabel("ablation (SPEC B.4), applied to every layer; blank: not applicable")
        ax.set_ylabel("ΔPPL / PPL (value above each bar)")
        ax.set_title("SPEC B.4 ablations: relative perplexity increase")
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        save(fig, "ablations")
    return paths


def _fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def study_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables of a study summary (``summary.json`` of :func:`run_study`): overview,
    routing rank per layer, ablations, the cascade over training, Gaussian baselines."""
    L: list[str] = []
    models = summary["models"]
    L.append("| model | attention | LN | params | step (finished) | val PPL | heads | unstable "
             "| routing fraction | rank R (entropy / PR) / capacity |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for n, e in models.items():
        if "error" in e:
            why = (f"needs retraining: `{RETRAIN[n]}`, then `{RUNS_COMMAND}`" if n in RETRAIN
                   else f"missing: {e['error']}")
            L.append(f"| {n} | — | — | — | {why} | | | | | |")
            continue
        q = e["qk"]
        cfg = e.get("config", {})
        att = cfg.get("attention", "softmax (BERT)")
        ln = {"ln": "yes", "none": "no"}.get(cfg.get("normalization"), "post-LN")
        ppl = e.get("val_metrics_all_windows", {}).get("val_ppl")
        if ppl is None and "ablation" in e:
            ppl = e["ablation"]["baseline_ppl"]
        stp = f"{e['step']} ({'yes' if e['finished'] else 'no'})" if "step" in e else "—"
        L.append(f"| {n} | {att} | {ln} | {e.get('n_params', '—')} | {stp} | "
                 f"{_fmt(ppl) if ppl else '—'} | {q['n_heads_total']} | {q['unstable_heads']} | "
                 f"{q['routing_fraction_mean']:.3f} | {q['rank_R_mean']:.1f} / "
                 f"{q['pr_R_mean']:.1f} / {q['capacity']} |")
    L.append("")
    n_layers = max((len(e["qk"]["layers"]) for e in models.values() if "qk" in e), default=0)
    L.append("| model | rank of | " + " | ".join(f"L{i}" for i in range(n_layers))
             + " | minimal-rank layers |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "qk" not in e:
            continue
        if "sd" in e:
            r = [x["rank_S"] for x in e["sd"]["layers"]]
            pr = e["sd"]["layers_pr"]
            share = f"{e['sd']['minimal_rank_layer_share']:.0%}"
            L.append(f"| {n} | S (entropy / PR) | " + " | ".join(
                f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + f" | {share} |")
        r = [x["rank_R"] for x in e["qk"]["layers"]]
        pr = e["qk"]["layers_pr"]
        L.append(f"| {n} | R (entropy / PR) | " + " | ".join(
            f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + " | |")
    L.append("")
    kinds = list(ABLATIONS_SD) + list(ABLATIONS_SOFTMAX)
    L.append("| model | PPL (windows) | " + " | ".join(k.replace("_", " ") for k in kinds) + " |")
    L.append("|---|---|" + "---|" * len(kinds))
    for n, e in models.items():
        if "ablation" not in e:
            continue
        a = e["ablation"]
        cells = []
        for k in kinds:
            r = [x for x in a["rows"] if x["ablation"] == k and x["layers"] == "all"]
            cells.append(f"{r[0]['delta_ppl']:+.3g} ({r[0]['rel_delta']:+.1%})" if r else "—")
        L.append(f"| {n} | {a['baseline_ppl']:.3g} ({a['n_windows']}×{a['seq_len']}) | "
                 + " | ".join(cells) + " |")
    L.append("")
    L.append("Per-layer ablations (ΔPPL when only that layer is ablated):")
    L.append("")
    L.append("| model | ablation | " + " | ".join(f"L{i}" for i in range(n_layers)) + " |")
    L.append("|---|---|" + "---|" * n_layers)
    for n, e in models.items():
        if "ablation" not in e:
            continue
        for k in kinds:
            rows = sorted((x for x in e["ablation"]["rows"] if x["ablation"] == k
                           and x["layers"] != "all"), key=lambda x: x["layers"])
            if rows:
                L.append(f"| {n} | {k.replace('_', ' ')} | "
                         + " | ".join(f"{x['delta_ppl']:+.3g}" for x in rows) + " |")
    L.append("")
    L.append("Routing rank per layer over training (entropy effective rank, mean over heads; "
             "S–D models: rank of S / rank of R = W_P S W_Pᵀ; softmax: rank of R; val loss in "
             "nats where the run evaluated):")
    L.append("")
    L.append("| model | step | " + " | ".join(f"L{i}" for i in range(n_layers)) + " | val loss |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "cascade_steps" not in e:
            continue
        steps = e["cascade_steps"]
        pick = sorted({0, len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4,
                           len(steps) - 1})
        is_sd = "sd" in e
        for i in pick:
            vl = e["cascade_val_loss"][i]
            if is_sd and "cascade_rank_R_mean" in e:
                cells = [f"{a:.1f} / {b:.1f}" for a, b in zip(e["cascade_rank_mean"][i],
                                                             e["cascade_rank_R_mean"][i])]
            else:
                cells = [f"{x:.1f}" for x in e["cascade_rank_mean"][i]]
            L.append(f"| {n} | {steps[i]} | " + " | ".join(cells) + " | "
                     + (f"{vl:.3f}" if vl > 0 else "") + " |")
    L.append("")
    L.append("| Gaussian W_Q, W_K (d_model, heads, d_head) | routing fraction | rank R (entropy "
             "/ PR) / capacity | unstable heads |")
    L.append("|---|---|---|---|")
    for n, b in summary.get("baselines", {}).items():
        L.append(f"| {n.split('_', 1)[1].replace('_', ', ')} | {b['routing_fraction_mean']:.3f} "
                 f"| {b['rank_R_mean']:.1f} / {b['pr_R_mean']:.1f} / {b['capacity']} | "
                 f"{b['unstable_heads']} of {b['n_heads_total']} |")
    return "\n".join(L) + "\n"


RETRAIN = {
    "bpe-softmax-noln": "tl-spectral study routing train-bpe --config configs/bpe-softmax-noln.json "
                        "--data-dir ../shared/data",
    "bpe-sd-noln": "tl-spectral study routing train-bpe --config configs/bpe-sd-noln.json "
                   "--data-dir ../shared/data",
    "sd-noln-long": "tl-spectral train --config configs/sd-char-shakespeare-noln-long.json",
}
"""Training commands of the models the doc mentions that are not shipped."""

STUDY_COMMAND = "tl-spectral study routing --windows 64 --out docs/results/routing"
RUNS_COMMAND = ("tl-spectral study routing --runs-dir runs --data-dir ../shared/data --windows 64 "
                "--out DIR")


def _heads(results_dir: Path, name: str, sd: bool = False) -> list[dict[str, Any]] | None:
    import csv

    p = results_dir / f"{name}{'_sd' if sd else ''}_heads.csv"
    if not p.is_file():
        return None
    with p.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _head_mean(rows: list[dict[str, Any]], col: str, layer: int | None = None) -> dict:
    """95% t-interval over heads of the mean of ``col`` (all layers, or ``layer``):
    :data:`~tl_spectral_studies.verdicts.HEADS_RULE`."""
    from tl_spectral_studies.verdicts import t_interval

    return t_interval([float(r[col]) for r in rows if layer is None or int(r["layer"]) == layer])


def _per_layer(rows: list[dict[str, Any]], col: str) -> list[list[float]]:
    """Per-head values of ``col``, one list per layer."""
    L = 1 + max(int(r["layer"]) for r in rows)
    return [[float(r[col]) for r in rows if int(r["layer"]) == i] for i in range(L)]


#: The standard-attention models of the claim table, in row order, with the Gaussian kernel
#: of the same shape (``summary.json`` "baselines"). A new model (e.g. a SmolLM2 column) is
#: one entry here plus its ``<name>_heads.csv`` / summary entry from ``run_study``: every
#: standard-heads claim then gets its row from the same rule.
STANDARD_MODELS = {"minilm": "gaussian_384_12_32", "char-shakespeare": "gaussian_128_8_16",
                   "char-shakespeare-noln": "gaussian_128_8_16"}
FAR_BELOW_CAPACITY = 0.5
"""Routing rank "far below capacity": the head mean is at most this share of min(2·d_head,
d_model) (*choice*; the paper gives no number)."""
LATE_RANK = 10.0
"""The paper's late-layer routing rank ("up to 10+ rotation planes")."""
MINIMAL_RANK = 3.0


def claim_rows(results_dir: str | Path) -> list[Any]:
    """Every row of the claim table of docs/routing_filtering.md (SPEC B, seed 002), each
    label computed from the committed numbers by a rule of
    :mod:`tl_spectral_studies.verdicts` (stated under the table)."""
    from tl_spectral_studies.verdicts import (
        DESCRIPTIVE,
        NOT_REPRODUCED,
        REPRODUCED,
        Row,
        layer0_minimum,
        removal_class,
        side,
    )

    d = Path(results_dir)
    s = json.loads((d / "summary.json").read_text())
    M, B = s["models"], s.get("baselines", {})
    rows: list[Row] = []
    std = [n for n in STANDARD_MODELS if n in M and _heads(d, n) is not None]
    for n in std:
        h = _heads(d, n)
        rf = _head_mean(h, "routing_fraction")
        g = B[STANDARD_MODELS[n]]
        rows.append(Row("filtering_dominates", "standard heads: filtering dominates the spectral "
                        "budget (routing fraction < 0.5)", f"{n} ({len(h)} heads)",
                        f"routing fraction {fmt_interval(rf)}; Gaussian kernel "
                        f"{g['routing_fraction_mean']:.3f}", side(rf, 0.5, below=True)))
    for n in std:
        h = _heads(d, n)
        rk = _head_mean(h, "eff_rank_R")
        cap = float(h[0]["routing_capacity"])
        g = B[STANDARD_MODELS[n]]["rank_R_mean"]
        below, far = rk["high"] < g, rk["high"] <= FAR_BELOW_CAPACITY * cap
        label = (REPRODUCED if below and far else
                 f"partly: below a random kernel's rank (interval excludes it), but not far "
                 f"below capacity (upper end {rk['high'] / cap:.0%} of it)" if below else
                 NOT_REPRODUCED + ": not below a random kernel's rank")
        rows.append(Row("routing_rank", "standard heads: routing at low rank, far below the "
                        "capacity min(2·d_head, d_model)", n,
                        f"rank of R {fmt_interval(rk)} of {cap:.0f} "
                        f"({100 * rk['estimate'] / cap:.0f}% of capacity); Gaussian kernel "
                        f"{g:.1f}", label))
    if std:
        unst = [M[n]["qk"]["unstable_heads"] == M[n]["qk"]["n_heads_total"] for n in std]
        g_all = all(B[STANDARD_MODELS[n]]["unstable_heads"] == B[STANDARD_MODELS[n]]
                    ["n_heads_total"] for n in std)
        cnt = ", ".join(f"{n}: {M[n]['qk']['unstable_heads']} of {M[n]['qk']['n_heads_total']}"
                        for n in std)
        rows.append(Row("unstable", "every standard head is dynamically unstable (some Re λ > 0)",
                        ", ".join(std), f"{cnt}; Gaussian kernels: "
                        + ("all" if g_all else "not all"),
                        (REPRODUCED if all(unst) else NOT_REPRODUCED + " in "
                         + ", ".join(n for n, u in zip(std, unst) if not u))
                        + " (a count over all heads: no interval applies)"
                        + ("; uninformative: every untrained Gaussian head is unstable too"
                           if g_all else "")))
        pairs = [(a, b) for a, b in (("char-shakespeare", "char-shakespeare-noln"),) if
                 a in std and b in std]
        if pairs:
            a, b = pairs[0]
            rows.append(Row("ln_contains", "standard heads rely on LayerNorm to contain their "
                            "instability (seed 002)", f"{a} vs {b}",
                            f"unstable heads with LayerNorm {M[a]['qk']['unstable_heads']} of "
                            f"{M[a]['qk']['n_heads_total']}, without "
                            f"{M[b]['qk']['unstable_heads']} of {M[b]['qk']['n_heads_total']}",
                            "not tested, because the summary does not say what measurement "
                            "shows LayerNorm containing the instability; the eigenvalues of "
                            "W_Q W_Kᵀ do not see LayerNorm, and the LN and no-LN models "
                            "differ in training too"))
    sdn = [n for n in M if n.startswith("sd-") and "qk" in M[n]]
    if sdn:
        st = [M[n]["qk"]["unstable_heads"] == 0 for n in sdn]
        rows.append(Row("sd_stable", "Re λ(S − D) ≤ 0 for any S, D", ", ".join(sdn),
                        ", ".join(f"{n}: {M[n]['qk']['n_heads_total'] - M[n]['qk']['unstable_heads']}"
                                  f" of {M[n]['qk']['n_heads_total']} stable" for n in sdn),
                        (REPRODUCED if all(st) else NOT_REPRODUCED)
                        + " (a theorem, tested on every head; no interval applies)"))
    runs_sd = (json.loads((d / "sd_runs" / "summary.json").read_text())
               if (d / "sd_runs" / "summary.json").is_file() else None)
    n = "sd-char-shakespeare-noln"
    h = _heads(d, n)
    if h is not None:
        per = _per_layer(h, "eff_rank_R")
        L = len(per)
        ivs = [_head_mean(h, "eff_rank_R", i) for i in range(L)]
        means = [iv["estimate"] for iv in ivs]
        hs = _heads(d, n, sd=True)
        s0 = _head_mean(hs, "eff_rank_S", 0) if hs else None
        mini = layer0_minimum(per)
        rows.append(Row("cascade", "unnormalized S–D: routing rank 2 (one rotation plane) at "
                        "layer 0, rising with depth to 10+ in the late layers",
                        f"{n} (1,000 steps, default initial A)",
                        "effective routing W_P S W_Pᵀ: "
                        + ", ".join(f"layer {i} {fmt_interval(iv)}" for i, iv in enumerate(ivs))
                        + (f"; rank of S at layer 0 {fmt_interval(s0)} of 16" if s0 else ""),
                        _cascade_label(ivs[0]["high"] <= MINIMAL_RANK, mini, means)))
    rows += _sd_runs_verdict_rows(runs_sd)
    for kind, claim in (("filtering_collapse", "filtering collapse (D → mean scalar per head) "
                         "is nearly free (paper: +0.3 PPL)"),
                        ("routing_removal", "routing removal (S = 0) is catastrophic in S–D "
                         "(paper: catastrophic)")):
        vals, cls = [], []
        for m in sdn:
            a = M[m].get("ablation")
            r = [x for x in (a or {}).get("rows", []) if x["ablation"] == kind
                 and x["layers"] == "all"]
            if r:
                vals.append(f"{m}: {r[0]['delta_ppl']:+.3g} ({r[0]['rel_delta']:+.1%})")
                cls.append((m, r[0]["rel_delta"]))
        if not vals:
            continue
        if kind == "filtering_collapse":
            from tl_spectral_studies.sd_runs import FREE_REL

            free = [abs(x) <= FREE_REL for _, x in cls]
            label = (f"{DESCRIPTIVE} (no interval: the ablation files hold the PPL of the 64 "
                     f"windows together): within ±{FREE_REL:.0%} of the base PPL in "
                     f"{sum(free)} of {len(free)} models")
        else:
            c = [(m, removal_class(x)) for m, x in cls]
            k = sum(x == "catastrophic" for _, x in c)
            label = (f"{DESCRIPTIVE} (no interval): "
                     + (REPRODUCED if k == len(c) else f"reproduced in {k} of {len(c)} models"
                        if k else NOT_REPRODUCED) + " — "
                     + ", ".join(f"{x} in {m}" for m, x in c))
        rows.append(Row(kind, claim, f"{', '.join(sdn)}; 64 validation windows × 256",
                        f"ΔPPL {'; '.join(vals)}", label))
    rows += _inversion_rows(d, M)
    shares = {m: M[m]["sd"]["minimal_rank_layer_share"] for m in sdn if "sd" in M[m]}
    sizes = {round(M[m]["n_params"] / 1e5) / 10 for m in shares if M[m].get("n_params")}
    rows.append(Row("scale", "share of minimal-rank layers grows with scale (33% at 18 M, 92% "
                    "at 355 M parameters)", "S–D char models ("
                    + ", ".join(f"{x:.1f} M" for x in sorted(sizes))
                    + ")", "by the rank of S: " + ", ".join(f"{m}: {v:.0%}"
                                                           for m, v in shares.items()),
                    "not tested, because a trend with scale needs models of two or more sizes; "
                    f"these have {len(sizes)}" if len(sizes) < 2 else
                    "not comparable: below the paper's smallest scale"))
    return rows


def _cascade_label(rank2: bool, minimum: str, means: Sequence[float]) -> str:
    """The cascade claim (layer 0 at rank ≤ 3, the minimum, late layers at 10+) from the
    per-layer head means and the layer-0 minimum test."""
    from tl_spectral_studies.verdicts import REPRODUCED, monotone_rise

    late = max(means[len(means) // 2:])
    parts = [("layer 0 at ≤ 3" if rank2 else "layer 0 above 3"), minimum,
             (f"late layers reach {late:.1f} (paper 10+)" if late >= LATE_RANK else
              f"late layers stay below 10 (highest {late:.1f}; paper 10+)"),
             "the rise is monotone" if monotone_rise(means) else "the rise is not monotone"]
    ok = rank2 and minimum == "layer 0 is the minimum" and late >= LATE_RANK
    return (REPRODUCED + ": " if ok else "partly: " if rank2 else "**not reproduced**: ") \
        + "; ".join(parts)


def _inversion_rows(d: Path, M: dict[str, Any]) -> list[Any]:
    """The inversion (standard attention: removing/truncating filtering prohibitive,
    routing cheap) by whole-part removal (ablation files) and by rank truncation
    (``docs/results/surgery/rank_truncation.json``, paired intervals over windows)."""
    from tl_spectral_studies.verdicts import DESCRIPTIVE, NOT_REPRODUCED, REPRODUCED, Row
    from tl_spectral_studies.verdicts import removal_class as rc

    out: list[Row] = []
    claim = ("the inversion: in standard attention removing filtering is prohibitive, removing "
             "routing cheap")
    vals, ok = [], []
    for m in ("char-shakespeare", "char-shakespeare-noln"):
        a = M.get(m, {}).get("ablation")
        if not a:
            continue
        r = {x["ablation"]: x for x in a["rows"] if x["layers"] == "all"}
        f, g = r["symmetric_removal"]["rel_delta"], r["skew_removal"]["rel_delta"]
        vals.append(f"{m}: symmetric (filtering) {f:+.0%} ({rc(f)}) vs skew (routing) "
                    f"{g:+.0%} ({rc(g)})")
        ok.append(rc(f) == "catastrophic" and rc(g) == "cheap")
    if vals:
        out.append(Row("inversion", claim + " — whole-part removal",
                       "char-shakespeare, char-shakespeare-noln; 64 windows", "; ".join(vals),
                       f"{DESCRIPTIVE} (no interval): "
                       + (REPRODUCED if all(ok) else NOT_REPRODUCED if not any(ok) else
                          f"reproduced in {sum(ok)} of {len(ok)}")
                       + " (routing removal is not cheap)" * (not all(ok))))
    p = d.parent / "surgery" / "rank_truncation.json"
    if p.is_file():
        for m in json.loads(p.read_text())["models"]:
            if m["attention"] != "softmax":
                out.append(Row("inversion", "S–D side of the inversion: truncating routing is "
                               "prohibitive, truncating filtering free — rank truncation",
                               f"{m['model']}; {m['n_windows']} windows",
                               "filtering − routing, relative ΔPPL in points: "
                               + "; ".join(f"r = {x['r']}: "
                                           f"{100 * x['filtering_minus_routing']:+.1f} "
                                           f"[{100 * x['low']:+.1f}, {100 * x['high']:+.1f}]"
                                           for x in m["paired"] if x["r"] < m["full_rank"]),
                               sd_truncation_label(m)))
                continue
            out.append(Row("inversion", claim + " — rank truncation (keep the top r singular "
                           "directions of one part)", f"{m['model']}; {m['n_windows']} windows",
                           "filtering − routing, relative ΔPPL in points: "
                           + "; ".join(f"r = {x['r']}: {100 * x['filtering_minus_routing']:+.1f} "
                                       f"[{100 * x['low']:+.1f}, {100 * x['high']:+.1f}]"
                                       for x in m["paired"] if x["r"] < m["full_rank"]),
                           truncation_label([x for x in m["paired"]
                                             if x["r"] < m["full_rank"]])))
    return out


def truncation_label(paired: Sequence[dict[str, float]], *, sd: bool = False) -> str:
    """Rank-truncation inversion: at which r truncating filtering costs more than truncating
    routing (paired interval of filtering − routing above 0), less (below 0), or neither.
    Standard attention: the claim is "filtering costs more"; S–D (``sd``): "routing costs
    more"."""
    from tl_spectral_studies.verdicts import NOT_REPRODUCED, REPRODUCED

    if sd:
        paired = [{**x, "low": -x["high"], "high": -x["low"]} for x in paired]
    more = [x["r"] for x in paired if x["low"] > 0]
    less = [x["r"] for x in paired if x["high"] < 0]
    tie = [x["r"] for x in paired if x["low"] <= 0 <= x["high"]]
    rs = ", ".join
    head = (REPRODUCED if more and not less and not tie else
            NOT_REPRODUCED if not more else "reproduced at low rank")
    a, b = ("routing", "filtering") if sd else ("filtering", "routing")
    parts = [f"{a} costs more at r = {rs(str(r) for r in more)}"] if more else []
    if tie:
        parts.append(f"no difference at r = {rs(str(r) for r in tie)}")
    if less:
        parts.append(f"reversed ({b} costs more) at r = {rs(str(r) for r in less)}")
    return head + ": " + "; ".join(parts)


def sd_truncation_label(m: dict[str, Any]) -> str:
    """S–D side of the inversion (routing truncation prohibitive, filtering truncation free)
    from one model of ``rank_truncation.json``: the order by :func:`truncation_label` and
    whether truncating D to its lowest rank stays within ±1% of the PPL (the sd-runs "free")."""
    from tl_spectral_studies.sd_runs import FREE_REL

    order = truncation_label([x for x in m["paired"] if x["r"] < m["full_rank"]], sd=True)
    f = min((r for r in m["rows"] if r["part"] == "filtering"), key=lambda r: r["r"])
    free = f["rel_delta_high"] <= FREE_REL
    cost = (f"truncating filtering to r = {f['r']} costs {100 * f['rel_delta_ppl']:+.1f}% "
            f"[{100 * f['rel_delta_low']:.1f}, {100 * f['rel_delta_high']:.1f}]")
    if free:
        return order + f"; {cost}: free"
    return "partly: " + order + f"; not free: {cost}"


def rank_truncation_markdown(path: str | Path) -> str:
    """The rank-truncation table of docs/routing_filtering.md from
    ``docs/results/surgery/rank_truncation.json``: relative ΔPPL (%) with its interval per
    part and r, and the paired difference filtering − routing (points; bold when its interval
    excludes 0)."""
    s = json.loads(Path(path).read_text())
    rs = sorted({r["r"] for m in s["models"] for r in m["rows"] if r["r"] < m["full_rank"]})
    out = ["| model (baseline PPL) | part | " + " | ".join(f"r = {r}" for r in rs) + " |",
           "|---|---|" + "---|" * len(rs)]
    for m in s["models"]:
        by = {(r["part"], r["r"]): r for r in m["rows"]}
        sd = m["attention"] == "sd"
        for k, part in enumerate(("routing", "filtering")):
            cells = []
            for r in rs:
                x = by.get((part, r))
                cells.append("0 (full)" if r >= m["full_rank"] else "—" if x is None else
                             f"{100 * x['rel_delta_ppl']:+.1f}% [{100 * x['rel_delta_low']:.1f}, "
                             f"{100 * x['rel_delta_high']:.1f}]")
            name = f"{m['model']} ({m['baseline_ppl']:.3f})" if k == 0 else ""
            out.append(f"| {name} | {part}{' (S)' if sd and k == 0 else ' (D)' if sd else ''} | "
                       + " | ".join(cells) + " |")
        pd = {x["r"]: x for x in m["paired"]}
        cells = []
        for r in rs:
            x = pd.get(r)
            if x is None or r >= m["full_rank"]:
                cells.append("")
                continue
            c = (f"{100 * x['filtering_minus_routing']:+.1f} [{100 * x['low']:+.1f}, "
                 f"{100 * x['high']:+.1f}]")
            cells.append(f"**{c}**" if x["low"] > 0 or x["high"] < 0 else c)
        out.append("| | **filtering − routing** | " + " | ".join(cells) + " |")
    out += ["", f"{s['models'][0]['windows']}; {s['models'][0]['interval']}; differences in "
                f"percentage points, paired over the same resamples. Full rank (both parts "
                f"whole) gives the baseline exactly and is left out. `{s['command']}`."]
    return "\n".join(out)


HEADS_NOTE = ("Intervals over heads: 95% t-interval of the head mean (mean ± t(0.975, n − 1) · "
              "sd / √n; the weight geometry involves no documents); layer-0 minimum: one-sided "
              "Welch t-tests of layer 0 against every other layer, Holm-corrected at 5%. "
              "Removal classes: catastrophic = ΔPPL ≥ +100% (the PPL at least doubles), cheap = "
              "below +10%, costly in between. Rows from models that are not shipped (BPE pair) "
              "are not in this table; the S–D training runs' rows come from the committed "
              "docs/results/routing/sd_runs/summary.json (head means with percentile intervals "
              "over 8 heads, which under-cover, so their layer calls are descriptive; ΔPPL "
              "paired over 64 validation windows).")


_INVERSION = ("the inversion: in standard attention removing filtering is prohibitive, "
              "removing routing cheap — ")
SMOL_IDS: dict[str, tuple[str, ...] | None] = {
    # claim row of the verdict table -> the SmolLM2 verdict ids (docs/results/real_decoder/
    # verdicts.json) that answer it; None: SmolLM2 (standard attention, no S–D model, one
    # size) has no measurement for it
    "standard heads: filtering dominates the spectral budget (routing fraction < 0.5)":
        ("B.budget.routing_fraction_delta0", "B.budget.routing_fraction_causal"),
    "standard heads: routing at low rank, far below the capacity min(2·d_head, d_model)":
        ("B.rank",),
    "every standard head is dynamically unstable (some Re λ > 0)": None,
    "standard heads rely on LayerNorm to contain their instability (seed 002)": None,
    "Re λ(S − D) ≤ 0 for any S, D": None,
    # the study's cascade record: routing rank against depth in SmolLM2's standard heads
    "unnormalized S–D: routing rank 2 (one rotation plane) at layer 0, rising with depth to "
    "10+ in the late layers": ("B.depth",),
    "filtering collapse (D → mean scalar per head) is nearly free (paper: +0.3 PPL)": None,
    "routing removal (S = 0) is catastrophic in S–D (paper: catastrophic)": None,
    _INVERSION + "whole-part removal": ("B.inversion", "B.inversion.layer"),
    _INVERSION + "rank truncation (keep the top r singular directions of one part)": None,
    "S–D side of the inversion: truncating routing is prohibitive, truncating filtering free "
    "— rank truncation": None,
    "share of minimal-rank layers grows with scale (33% at 18 M, 92% at 355 M parameters)":
        None,
}


def verdict_markdown(results_dir: str | Path, *,
                     smol_verdicts: str | Path | None = None) -> str:
    """The claim table of docs/routing_filtering.md from :func:`claim_rows`, with the
    SmolLM2 column from ``smol_verdicts`` (default: the real-decoder study's verdicts.json
    beside ``results_dir``) through :data:`SMOL_IDS`."""
    from tl_spectral_studies import smol_column
    from tl_spectral_studies.verdicts import table

    smol = smol_column.load(smol_verdicts or smol_column.verdicts_path(results_dir))
    return smol_column.add_column(
        table(claim_rows(results_dir),
              ["paper's claim (SPEC B; seed 002; GPT-2 / BERT / Pythia heads, S–D models "
               "7 M–355 M)", "ours: model", "ours: number [95% CI]", "verdict"])
        + "\n\n" + HEADS_NOTE,
        smol_column.ids_from(SMOL_IDS, "docs/routing_filtering.md"), smol)


def _sd_runs_verdict_rows(s: dict[str, Any] | None) -> list[Any]:
    """Claim rows from the S–D training-runs comparison (issue 17 items 5–6): the cascade of
    the small-initial-A runs (every seed, and without weight decay on A and δ) with the seed
    spread — descriptive, the summary holds head means and percentile intervals over 8 heads
    — and filtering collapse (per-run rule of
    :func:`~tl_spectral_studies.sd_runs.filtering_collapse_verdict`) beside how far D moved;
    routing removal by :func:`~tl_spectral_studies.verdicts.removal_class` on the lower end of
    each paired interval."""
    if not s:
        return []
    from tl_spectral_studies.sd_runs import (
        FREE_REL,
        filtering_collapse_verdict,
        seed_spread,
    )
    from tl_spectral_studies.verdicts import (
        DESCRIPTIVE,
        Row,
        count_label,
        layer0_minimum_descriptive,
        monotone_rise,
        removal_class,
    )

    runs = s["runs"]
    noln = {k: r for k, r in runs.items() if r["identity"]["normalization"] == "none"}
    out = []
    if noln:
        cells, rank2, lowest, late, mono = [], [], [], [], []
        for label, r in noln.items():
            i = r["identity"]
            R = r["cascade"]["final"]["R"]
            means = [x["estimate"] for x in R]
            lo = layer0_minimum_descriptive(means)
            cells.append(f"{label} (seed {i['seed']}"
                         + (", no decay on A, δ" if i.get("no_decay") else "")
                         + f"): layer 0 {fmt_interval(R[0])}, highest late layer "
                         f"{max(means[len(means) // 2:]):.2f}")
            rank2.append(R[0]["estimate"] <= MINIMAL_RANK)
            lowest.append(lo.startswith("layer 0 has"))
            late.append(max(means[len(means) // 2:]) >= LATE_RANK)
            mono.append(monotone_rise(means))
        k = len(rank2)
        out.append(Row("cascade", "unnormalized S–D: routing rank 2 (one rotation plane) at "
                       "layer 0, rising with depth to 10+ in the late layers",
                       "small-initial-A S–D runs, 2,600 steps (not shipped; "
                       "docs/results/routing/sd_runs)",
                       "effective routing rank: " + "; ".join(cells)
                       + "".join(f"; seed spread of layer 0, {g['config_name']} (seeds "
                                 f"{', '.join(str(x) for x in g['seeds'])}): "
                                 f"{g['layer0_R_min']:.2f}–{g['layer0_R_max']:.2f}"
                                 for g in seed_spread(s) if g["seed_only"]),
                       f"partly ({DESCRIPTIVE}: head means over 8 heads, no test): layer 0 "
                       f"at ≤ 3 in {sum(rank2)} of {k} runs and the lowest layer in "
                       f"{sum(lowest)} of {k}; late layers reach 10+ in {sum(late)} of {k}; "
                       f"monotone rise in {sum(mono)} of {k}"
                       if any(rank2) and not all(late) else
                       f"{DESCRIPTIVE}: layer 0 at ≤ 3 in {sum(rank2)} of {k} runs, the "
                       f"lowest in {sum(lowest)} of {k}, late layers at 10+ in {sum(late)} "
                       f"of {k}"))
    cells, moved, free = [], [], []
    for label, r in runs.items():
        a = r["ablations"]["filtering_collapse"]
        cv = max(x["cv"]["estimate"] for x in r["filtering"] if x)
        moved.append(cv)
        v = filtering_collapse_verdict(r)
        free.append(v == "free")
        cells.append(f"{label}: {fmt_interval(a['delta_ppl'], '{:+.3g}')} ({v}; largest "
                     f"within-head CV of diag(D) {cv:.3f})")
    out.append(Row("filtering_collapse", "filtering collapse (D → mean scalar per head) is "
                   "nearly free (paper: +0.3 PPL)", "S–D training runs, with and without "
                   "weight decay on A and δ (not shipped)",
                   "ΔPPL [95% CI, paired over 64 windows]: " + "; ".join(cells),
                   count_label(free, "run") + f" (rule: free when the relative ΔPPL interval "
                   f"contains 0 or lies within ±{FREE_REL:.0%} of the base PPL; the paper's "
                   "+0.3 PPL is absolute at a base PPL the summary does not give); D stays "
                   f"near a scalar in every run (within-head CV ≤ {max(moved):.2f}), so the "
                   "collapse removes little"))
    cells, cat = [], []
    for label, r in runs.items():
        rel = r["ablations"]["routing_removal"]["rel_delta_ppl"]
        cat.append(removal_class(rel["low"]) == "catastrophic")
        cells.append(f"{label}: {100 * rel['estimate']:+.0f}% [{100 * rel['low']:+.0f}, "
                     f"{100 * rel['high']:+.0f}]")
    out.append(Row("routing_removal", "routing removal (S = 0) is catastrophic in S–D (paper: "
                   "catastrophic)", "S–D training runs (as above)",
                   "relative ΔPPL [95% CI, paired over 64 windows]: " + "; ".join(cells),
                   count_label(cat, "run") + " (rule: catastrophic when the interval's lower "
                   "end is ≥ +100%)"))
    return out


PAPER_COLLAPSE_PPL = 0.3
"""The paper's cost of filtering collapse (SPEC B.4: +0.3 PPL): "nearly free" is judged
against it (the per-run "free" of the sd-runs table is the stricter ±1% of the PPL)."""


def tables(results_dir: str | Path, *, smol_verdicts: str | Path | None = None
           ) -> dict[str, str]:
    """Every generated block of docs/routing_filtering.md, by key, from the committed
    ``summary.json`` and per-head CSVs. The cascade over training needs the training runs
    (not shipped): its block says how to retrain. The sections' verdict lines
    (``routing/verdict_line/<key>``) come from the claim table's own rows; the claim table's
    SmolLM2 column from ``smol_verdicts`` (see :func:`verdict_markdown`)."""
    from tl_spectral_studies.verdicts import verdict_line

    d = Path(results_dir)
    long = sd_noln_long_markdown(d.parent / "surgery")
    parts = [c for c in study_markdown(json.loads((d / "summary.json").read_text())).strip()
             .split("\n\n") if c.startswith("|")]  # the tables, without their headings
    keys = ["overview", "ranks", "ablations", "ablations_layers", "cascade_training",
            "baselines"]
    rows = claim_rows(d)
    out = {"routing/verdict": verdict_markdown(d, smol_verdicts=smol_verdicts)}
    for key in ("inversion", "cascade", "filtering_collapse"):
        if any(r.key == key for r in rows):
            out[f"routing/verdict_line/{key}"] = verdict_line(rows, key)
    rt = d.parent / "surgery" / "rank_truncation.json"
    if rt.is_file():
        out["routing/rank_truncation"] = rank_truncation_markdown(rt)
    if (d / "rotary_sd" / "summary.json").is_file():
        out["routing/rotary_sd"] = rotary_cascade_markdown(d / "rotary_sd").strip()
    for k, p in zip(keys, parts):
        out[f"routing/{k}"] = p
    if out["routing/cascade_training"].count("\n") < 2:  # a header without rows
        out["routing/cascade_training"] = (
            "The cascade over training reads every checkpoint of the training runs, which are "
            "not shipped (the zoo holds final weights only). Needs retraining: "
            + "; ".join(f"`{c}`" for c in (
                "tl-spectral train --config configs/char-shakespeare.json",
                "tl-spectral train --config configs/char-shakespeare-noln.json",
                "tl-spectral train --config configs/sd-char-shakespeare.json",
                "tl-spectral train --config configs/sd-char-shakespeare-noln.json",
                RETRAIN["bpe-softmax-noln"], RETRAIN["bpe-sd-noln"]))
            + f", then `{RUNS_COMMAND}`.")
    if long:
        out["routing/sd_noln_long"] = long
    if (d / "sd_runs" / "summary.json").is_file():
        from tl_spectral_studies.sd_runs import sd_runs_markdown

        out["routing/sd_runs"] = sd_runs_markdown(d / "sd_runs").strip()
    return out


def sd_noln_long_markdown(surgery_dir: Path) -> str:
    """Rank of S and effective routing rank per layer of ``sd-noln-long`` at its final step,
    from the allocation files of the surgery study (``allocation_sdS.json``: rank of S,
    ``allocation_sd.json``: effective ``W_P S W_Pᵀ``; means over the 8 heads)."""
    pS, pR = surgery_dir / "allocation_sdS.json", surgery_dir / "allocation_sd.json"
    if not (pS.is_file() and pR.is_file()):
        return ""
    S, R = json.loads(pS.read_text()), json.loads(pR.read_text())
    L = len(S["rank"])
    return "\n".join([
        "| step | rank of | " + " | ".join(f"L{i}" for i in range(L)) + " |",
        "|---|---|" + "---|" * L,
        f"| {S['step']} | S | " + " | ".join(f"{x:.1f}" for x in S["rank"]) + " |",
        f"| {R['step']} | effective routing W_P S W_Pᵀ | "
        + " | ".join(f"{x:.1f}" for x in R["rank"]) + " |",
        "",
        "The earlier checkpoints (steps 300, 500, 1,000) and the per-head ranks were read from "
        "the training run, which is not shipped. Needs retraining: "
        f"`{RETRAIN['sd-noln-long']}`, then `tl-spectral study surgery cascade --model "
        "runs/sd-char-shakespeare-noln-long`."])


def markdown(results_dir: str | Path) -> str:
    """The doc tables of docs/routing_filtering.md from ``results_dir`` (:func:`tables`, each
    under its key)."""
    return "\n\n".join(f"<!-- {k} -->\n{v}" for k, v in tables(results_dir).items()) + "\n"


# ------------------------------------------------------------------- rotary models
ROTARY_LAGS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 255)


def rotary_study(model_dir: str | Path, results_dir: str | Path, *,
                 fig_path: str | Path | None = None, reference: str | None = "char-shakespeare",
                 overwrite: bool = False) -> dict[str, Any]:
    """Offset-resolved routing/filtering of a rotary GPT checkpoint (docs/routing_filtering.md,
    "Rotary positions").

    Reads ``model_dir`` (a ``save_model`` folder or a trainer checkpoint ``step_*``), computes
    :func:`~tl_spectral.geometry.model.model_rotary_geometry` (LayerNorm folded) at the lags
    :data:`ROTARY_LAGS` (offset Δ = −lag) and over the causal offset distribution of its
    context, and the dense head-mean curve ρ(Δ) for every lag ``0..n_ctx−1`` (trigonometric
    form). ``reference``: a zoo model with learned positions whose offset-free routing
    fraction is listed beside it. Writes ``results_dir/summary.json`` and
    ``results_dir/rotary_qk.safetensors``; the figure to ``fig_path`` when given. Existing
    outputs are refused (``FileExistsError``) unless ``overwrite``. Returns the summary.
    """
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.models.gpt import load_model

    model_dir, out = Path(model_dir), Path(results_dir)
    targets = [out / "summary.json", out / "rotary_qk.safetensors"]
    if fig_path is not None:
        targets.append(Path(fig_path))
    there = [str(t) for t in targets if t.exists()]
    if there and not overwrite:
        raise FileExistsError(f"{', '.join(there)} exist(s); pass overwrite=True (--overwrite) "
                              "to replace them, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_dir).eval()
    doc = json.loads((model_dir / "config.json").read_text())
    n_ctx = model.cfg.n_ctx
    lags = [lag for lag in ROTARY_LAGS if lag < n_ctx]
    geo = model_rotary_geometry(model, offsets=[-lag for lag in lags])
    geo.save(out / "rotary_qk", overwrite=overwrite)
    dense = geo.energies([-lag for lag in range(n_ctx)])["routing_fraction"]  # [L, H, n_ctx]
    layers = {}
    for i, name in enumerate(geo.layer_names):
        rf = geo.routing_fraction[i]  # [H, n]
        layers[name] = {
            "routing_fraction_mean": rf.mean(0).tolist(),
            "routing_fraction_min": rf.min(0).values.tolist(),
            "routing_fraction_max": rf.max(0).values.tolist(),
            "eff_rank_R_mean": geo.eff_rank_R[i].mean(0).tolist(),
            "mean_routing_fraction": float(geo.mean_routing_fraction[i].mean()),
            "mean_routing_fraction_min": float(geo.mean_routing_fraction[i].min()),
            "mean_routing_fraction_max": float(geo.mean_routing_fraction[i].max()),
            "mean_eff_rank_R": float(geo.mean_eff_rank_R[i].mean()),
            "dense_curve_mean": dense[i].mean(0).tolist(),
        }
    summary: dict[str, Any] = {
        "model_dir": model_dir.name, "step": doc.get("step"),
        "name": Path(str((doc.get("train") or {}).get("out_dir") or model_dir.name)).name,
        "config": {k: doc["model"][k] for k in ("n_layers", "n_heads", "d_model", "d_head",
                                                "n_ctx", "attention", "positional",
                                                "rotary_dim", "rotary_base")},
        "pairing": geo.pairing, "distribution": geo.distribution, "lags": lags,
        "layers": layers,
    }
    # the no-structure reference: i.i.d. Gaussian W_Q, W_K of the same shapes, same rotation
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    gen = torch.Generator().manual_seed(0)
    shape = (len(geo.layer_names), geo.n_heads, geo.d_model, geo.d_head[0])
    base = rotary_qk_geometry(torch.randn(shape, generator=gen, dtype=torch.float64),
                              torch.randn(shape, generator=gen, dtype=torch.float64),
                              RotarySpec(geo.inv_freq, geo.pairing, geo.attention_scaling),
                              offsets=[-lag for lag in lags], n_ctx=n_ctx, average_ranks=False)
    rf = base.routing_fraction.flatten(0, 1)  # [layers·heads, n]
    summary["baseline"] = {
        "what": f"i.i.d. Gaussian W_Q, W_K {list(shape)}, seed 0",
        "routing_fraction_mean": rf.mean(0).tolist(),
        "routing_fraction_min": rf.min(0).values.tolist(),
        "routing_fraction_max": rf.max(0).values.tolist(),
        "mean_routing_fraction": float(base.mean_routing_fraction.mean()),
        "mean_routing_fraction_min": float(base.mean_routing_fraction.min()),
        "mean_routing_fraction_max": float(base.mean_routing_fraction.max()),
    }
    if isinstance(doc.get("metrics"), dict):  # a final / shipped checkpoint
        summary["metrics"] = {k: doc["metrics"][k] for k in ("val_loss", "val_ppl", "steps")
                              if k in doc["metrics"]}
    state = model_dir / "trainer_state.json"
    if state.is_file():  # a trainer checkpoint: its validation history
        evals = json.loads(state.read_text()).get("history", {}).get("evals", [])
        summary["evals"] = [{"step": int(e["step"]), "val_loss": float(e["val_loss"])}
                            for e in evals if "val_loss" in e]
    if reference:
        from tl_spectral.models import zoo

        ref, _ = zoo.load_native(reference)
        rg = model_qk_geometry(ref)
        summary["reference"] = {"name": reference, "routing_fraction": [
            float(rg.routing_fraction[i].mean()) for i in range(rg.n_layers)]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if fig_path is not None:
        fig = rotary_figure(summary)
        Path(fig_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(fig_path, dpi=100, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
    return summary


def rotary_figure(summary: dict[str, Any]):
    """Head-mean routing fraction against the lag, one line per layer (dense curve), with
    the spread over heads at the reported lags. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    lags = summary["lags"]
    for name, row in summary["layers"].items():
        curve = row["dense_curve_mean"]
        (line,) = ax.plot([x + 1 for x in range(len(curve))], curve, lw=1.2, label=name)
        ax.fill_between([x + 1 for x in lags], row["routing_fraction_min"],
                        row["routing_fraction_max"], color=line.get_color(), alpha=0.08)
    ax.set_xscale("log")
    ax.set_xlabel("lag i − j + 1 (log)")
    ax.set_ylabel("routing fraction ‖R(Δ)‖² / ‖M(Δ)‖²")
    ax.axhline(0.5, color="0.6", lw=0.8, ls="--")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(f"{summary['name']} (step {summary['step']}): routing vs offset, "
                 "head mean (band: min–max over heads)", fontsize=8)
    add_caption(fig, "M(Δ) = W_Q R(Δ) W_Kᵀ, LayerNorm folded; Δ = j − i = −lag; "
                "tl_spectral_studies.routing.rotary_study")
    fig.tight_layout()
    return fig


def rotary_markdown(results_dir: str | Path) -> str:
    """The tables of the rotary section of docs/routing_filtering.md from
    ``results_dir/summary.json``."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    show = [lag for lag in (0, 1, 2, 4, 8, 16, 32, 64, 128, 255) if lag in s["lags"]]
    idx = [s["lags"].index(lag) for lag in show]
    L = ["| layer | " + " | ".join(f"lag {lag}" for lag in show)
         + " | causal mean (min–max over heads) | rank R, causal mean |",
         "|---|" + "---|" * len(show) + "---|---|"]
    for name, row in s["layers"].items():
        cells = [f"{row['routing_fraction_mean'][i]:.3f}" for i in idx]
        L.append(f"| {name} | " + " | ".join(cells)
                 + f" | {row['mean_routing_fraction']:.3f} ({row['mean_routing_fraction_min']:.3f}"
                 f"–{row['mean_routing_fraction_max']:.3f}) | {row['mean_eff_rank_R']:.1f} |")
    if "baseline" in s:
        b = s["baseline"]
        cells = [f"{b['routing_fraction_mean'][i]:.3f}" for i in idx]
        L.append("| Gaussian (all heads) | " + " | ".join(cells)
                 + f" | {b['mean_routing_fraction']:.3f} ({b['mean_routing_fraction_min']:.3f}"
                 f"–{b['mean_routing_fraction_max']:.3f}) | |")
    if s.get("evals"):
        L.append("")
        L.append("| step | " + " | ".join(str(e["step"]) for e in s["evals"]) + " |")
        L.append("|---|" + "---|" * len(s["evals"]))
        L.append(f"| {s['name']} val loss | "
                 + " | ".join(f"{e['val_loss']:.3f}" for e in s["evals"]) + " |")
    if s.get("metrics", {}).get("val_loss") is not None:
        m = s["metrics"]
        L.append("")
        L.append(f"{s['name']}: validation loss {m['val_loss']:.3f} nats/char (PPL "
                 f"{m.get('val_ppl', float('nan')):.3f}) after {m.get('steps', s['step'])} steps.")
    if "reference" in s:
        ref = s["reference"]
        L.append("")
        L.append(f"| layer | {s['name']} (rotary, step {s['step']}), lag 0 | {ref['name']} "
                 "(learned positions) |")
        L.append("|---|---|---|")
        for i, (name, row) in enumerate(s["layers"].items()):
            L.append(f"| {name} | {row['routing_fraction_mean'][0]:.3f} | "
                     f"{ref['routing_fraction'][i]:.3f} |")
    return "\n".join(L) + "\n"


def rotary_cascade_study(run_dir: str | Path, results_dir: str | Path, *,
                         reference: str = "sd-char-shakespeare-noln",
                         overwrite: bool = False) -> dict[str, Any]:
    """Does the S–D cascade survive rotary positions? The routing rank per layer over every
    checkpoint of a rotary S–D run (R at offset 0, S before the rotation) beside the shipped
    learned-position S–D model of the same recipe (``reference``), with intervals over heads
    (1,000 bootstrap resamples of the heads, seed 0). Writes ``results_dir/summary.json``."""
    from tl_spectral.geometry.cascade import cascade_over_training
    from tl_spectral.geometry.model import model_qk_geometry, model_sd_geometry
    from tl_spectral.models import zoo

    results_dir = Path(results_dir)
    out = results_dir / "summary.json"
    if out.exists() and not overwrite:
        raise StudyUsageError(f"{out} exists; pass --overwrite to replace it")
    c = cascade_over_training(run_dir)
    ref = zoo.load_native(reference)[0]
    ref_R = model_qk_geometry(ref, biases=False).eff_rank_R
    ref_S = model_sd_geometry(ref).eff_rank_S
    L = int(c.rank_R.shape[1])
    s: dict[str, Any] = {
        "name": c.run_name, "reference": reference, "steps": c.steps.tolist(),
        "val_loss": c.val_loss.tolist(),
        "rank_R_mean": c.rank_R.double().mean(-1).tolist(),
        "rank_S_mean": c.rank_S.double().mean(-1).tolist() if c.rank_S is not None else None,
        "final": {
            "rotary_R": [_head_interval(c.rank_R[-1, i]) for i in range(L)],
            "rotary_S": [_head_interval(c.rank_S[-1, i]) for i in range(L)]
            if c.rank_S is not None else None,
            "learned_R": [_head_interval(ref_R[i]) for i in range(L)],
            "learned_S": [_head_interval(ref_S[i]) for i in range(L)],
        },
        "reference_val_loss": zoo.checkpoint_info(reference)["metrics"]["val_loss"],
        "intervals": HEADS_INTERVALS,
        "command": f"tl-spectral study routing rotary-cascade --run-dir {Path(run_dir).name} "
                   f"--results DIR",
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return s


def rotary_cascade_verdict(s: dict[str, Any]) -> str:
    """One sentence from the head means: is layer 0 the minimum of the effective routing rank,
    with rotary and with learned positions? Descriptive: the summary holds percentile
    intervals over 8 heads, which under-cover, and no per-head values to test."""
    from tl_spectral_studies.verdicts import layer0_minimum_descriptive

    return "; ".join(f"{label}: " + layer0_minimum_descriptive(
        [r["estimate"] for r in s["final"][key]])
        for key, label in (("rotary_R", "rotary"), ("learned_R", "learned positions"))) + "."


def rotary_cascade_markdown(results_dir: str | Path) -> str:
    """The rotary S–D cascade table of docs/routing_filtering.md from ``summary.json``."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    f = s["final"]
    L = [f"| layer | R rank, {s['name']} (rotary) | R rank, {s['reference']} (learned) | "
         "S rank, rotary | S rank, learned |", "|---|---|---|---|---|"]
    for i in range(len(f["rotary_R"])):
        L.append(f"| {i} | {fmt_interval(f['rotary_R'][i], '{:.2f}')} | {fmt_interval(f['learned_R'][i], '{:.2f}')} | "
                 f"{fmt_interval(f['rotary_S'][i], '{:.2f}') if f['rotary_S'] else '—'} | "
                 f"{fmt_interval(f['learned_S'][i], '{:.2f}')} |")
    L.append("")
    L.append("| step | " + " | ".join(str(x) for x in s["steps"]) + " |")
    L.append("|---|" + "---|" * len(s["steps"]))
    L.append("| layer 0, R rank (rotary) | "
             + " | ".join(f"{r[0]:.2f}" for r in s["rank_R_mean"]) + " |")
    L.append("| min over layers 1–5 | "
             + " | ".join(f"{min(r[1:]):.2f}" for r in s["rank_R_mean"]) + " |")
    L.append("")
    vl = [v for v in s["val_loss"] if v >= 0]
    if vl and s.get("reference_val_loss") is not None:
        L.append(f"Validation loss after {s['steps'][-1]} steps: {vl[-1]:.3f} nats/char "
                 f"(rotary) vs {s['reference_val_loss']:.3f} ({s['reference']}, learned "
                 "positions), all validation windows.")
        L.append("")
    L.append(f"Verdict: {rotary_cascade_verdict(s)} Intervals: {s['intervals']}.")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str], prog: str = "tl-spectral study routing") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    add_run_arguments(ap, default_out="tl_spectral_study_routing")
    ap.add_argument("--runs-dir", default=None,
                    help="folder of the study's training runs (e.g. runs); without it the "
                         "shipped char models are read from the zoo (no cascade)")
    ap.add_argument("--data-dir", default=None,
                    help="folder of austen.txt, wiki_excerpt.txt, gpt2.tiktoken (BPE models)")
    ap.add_argument("--windows", type=positive_int, default=64)
    ap.add_argument("--models", nargs="*", help=f"subset of {list(STUDY_RUNS)}")
    ap.add_argument("--no-minilm", action="store_true")
    ap.add_argument("--no-per-layer", action="store_true")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--fresh", action="store_true",
                    help="do not merge into summary.json: write --out whole (an earlier "
                         "output is replaced at the end, with --overwrite)")
    tb = sub.add_parser("train-bpe", help="train a GPT on Austen + Wikipedia (top-K GPT-2 BPE)")
    tb.add_argument("--config", required=True)
    tb.add_argument("--data-dir", default=None, help="overrides the config's data.data_dir")
    tb.add_argument("--steps", type=int)
    tb.add_argument("--out-dir")
    tb.add_argument("--no-progress", action="store_true")
    tt = sub.add_parser("tables", help="markdown tables of a study summary.json")
    tt.add_argument("summary")
    tc = sub.add_parser("rotary-cascade", help="routing rank over training of a rotary S–D "
                        "run beside the shipped learned-position S–D model")
    tc.add_argument("--run-dir", required=True, help="the rotary S–D training run folder")
    tc.add_argument("--results", required=True, help="folder for summary.json")
    tc.add_argument("--overwrite", action="store_true", help="replace an existing summary.json")
    ts = sub.add_parser("sd-runs", help="compare S–D training runs: cascade, D statistics, "
                        "ablations with paired intervals (tl_spectral_studies.sd_runs)")
    ts.add_argument("--run-dir", action="append", required=True,
                    help="an S–D training run folder (repeat for each run)")
    ts.add_argument("--label", action="append", default=None,
                    help="a label per --run-dir, in order (default: the folder names)")
    ts.add_argument("--results", required=True, help="folder for summary.json")
    ts.add_argument("--windows", type=positive_int, default=64,
                    help="evenly spaced validation windows for the ablations (default 64)")
    ts.add_argument("--data-dir", default=None, help="BPE corpora folder (BPE runs only)")
    ts.add_argument("--overwrite", action="store_true", help="replace an existing summary.json")
    tr = sub.add_parser("rotary", help="offset-resolved routing of a rotary GPT checkpoint")
    tr.add_argument("--model-dir", required=True, help="save_model folder or step_* checkpoint")
    tr.add_argument("--results", required=True, help="folder for summary.json and the result")
    tr.add_argument("--figure", default=None, help="PNG path of the routing-vs-lag figure")
    tr.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = ap.parse_args(list(argv))
    if args.cmd == "rotary-cascade":
        rotary_cascade_study(args.run_dir, args.results, overwrite=args.overwrite)
        print(rotary_cascade_markdown(args.results))
        return 0
    if args.cmd == "sd-runs":
        from tl_spectral_studies.sd_runs import sd_runs_markdown, sd_runs_study

        sd_runs_study(args.run_dir, args.results, labels=args.label, n_windows=args.windows,
                      overwrite=args.overwrite, data_dir=args.data_dir)
        print(sd_runs_markdown(args.results))
        return 0
    if args.cmd == "rotary":
        rotary_study(args.model_dir, args.results, fig_path=args.figure,
                     overwrite=args.overwrite)
        print(rotary_markdown(args.results))
        return 0
    if args.cmd == "tables":
        print(study_markdown(json.loads(Path(args.summary).read_text())))
        return 0
    if args.cmd == "train-bpe":
        doc = json.loads(Path(args.config).read_text())
        if args.data_dir:
            doc.setdefault("data", {})["data_dir"] = args.data_dir
        ov: dict[str, Any] = {}
        if args.steps:
            ov["steps"] = args.steps
        if args.out_dir:
            ov["out_dir"] = args.out_dir
        if args.no_progress:
            ov["progress"] = False
        trainer, history = run_bpe_from_config(doc, overrides=ov)
        print(json.dumps({"step": trainer.step, "val_loss": history.final_val_loss,
                          "out_dir": str(trainer.out_dir) if trainer.out_dir else None}))
        return 0
    _check_study_args(args)
    torch.set_num_threads(args.threads)
    if args.fresh:  # written whole into a temporary sibling, swapped in at the end
        with fresh_out(args.out, NAME, overwrite=args.overwrite) as tmp:
            summary = _run_study_args(args, tmp)
        out = Path(args.out)
    else:
        out = prepare_out(args.out, NAME, overwrite=args.overwrite)
        summary = _run_study_args(args, out)
    print(json.dumps({k: v.get("ablation", {}).get("baseline_ppl") if isinstance(v, dict)
                      else None for k, v in summary["models"].items()}))
    print(out.resolve())
    return 0


def _check_study_args(args: Any) -> None:
    """The study run's arguments, checked before any folder is touched."""
    unknown = sorted(set(args.models or []) - set(STUDY_RUNS))
    if unknown:
        raise StudyUsageError(f"--models {' '.join(unknown)}: unknown; use some of "
                              f"{', '.join(STUDY_RUNS)}")
    if args.runs_dir is not None and not Path(args.runs_dir).is_dir():
        raise StudyUsageError(f"--runs-dir {args.runs_dir} is not a folder; pass the folder "
                              "of the study's training runs")


def _run_study_args(args: Any, out: Path) -> dict:
    summary = run_study(out, runs_dir=args.runs_dir, fig_dir=args.fig_dir,
                        n_windows=args.windows, names=args.models,
                        minilm=not args.no_minilm, per_layer=not args.no_per_layer,
                        merge=not args.fresh, data_dir=args.data_dir, quick=args.quick)
    (out / "tables.md").write_text(study_markdown(summary))
    return summary
