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
from tl_spectral.interventions.ablations import (
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
    fresh_out,
    positive_int,
    prepare_out,
)
from tl_spectral_studies._runs import load_bpe_data, run_validation_windows
from tl_spectral_studies.routing_claims import _sd_runs_verdict_rows  # noqa: F401
from tl_spectral_studies.routing_rotary import (  # noqa: F401  (re-exported)
    ROTARY_LAGS,
    rotary_cascade_markdown,
    rotary_cascade_study,
    rotary_cascade_verdict,
    rotary_figure,
    rotary_markdown,
    rotary_study,
)
from tl_spectral_studies.routing_tables import (  # noqa: F401  (re-exported)
    FAR_BELOW_CAPACITY,
    HEADS_NOTE,
    LATE_RANK,
    MINIMAL_RANK,
    PAPER_COLLAPSE_PPL,
    RETRAIN,
    RUNS_COMMAND,
    SMOL_IDS,
    STANDARD_MODELS,
    STUDY_COMMAND,
    _head_mean,
    _heads,
    _per_layer,
    claim_rows,
    markdown,
    rank_truncation_markdown,
    sd_noln_long_markdown,
    sd_truncation_label,
    study_markdown,
    tables,
    truncation_label,
    verdict_markdown,
)

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
    Returns the summary.

    Longer than 80 lines on purpose: the study's steps in order over the models it loads once;
    each step is a few lines."""
    from tl_spectral.models import load_checkpoint, zoo

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
        model = load_checkpoint(mdir).eval()
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
    (the run: models, windows); returns the paths.

    Longer than 80 lines on purpose: one panel after another of the study's figures."""
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



# ------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str], prog: str = "tl-spectral study routing") -> int:
    """Longer than 80 lines on purpose: the argument parser of every subcommand, then the
    dispatch."""
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

