"""The spectral-surgery study of docs/surgery.md (SPEC B.5–B.6), exactly as run.

``tl-spectral study surgery [--quick] --out DIR``: the zero-shot collapse curve and the cascade
allocation of the shipped ``char-shakespeare-noln`` and ``sd-char-shakespeare-noln`` models, into
DIR (no training; ``--quick`` uses 8 windows).

The full study works on training runs under ``--root`` (``ROOT/runs/...``, see docs/surgery.md)
with these subcommands (CPU, one thread; results in ``--work`` (default ROOT/runs/surgery),
figures in ``--fig-dir`` (default WORK/figures), ``figures --publish DIR`` copies the small
result files to DIR, e.g. docs/results/surgery):

  allocate     cascade allocation of the measured model (routing rank -> d_head per layer),
               saved as runs/surgery/allocation.safetensors
  train-alloc  --which uniform|cascade: train the uniform or the reallocated model with the
               same short recipe (resumable: re-run the same command after a kill)
  curves       ΔPPL vs k leading layers linearized (zero-shot for every model; fine-tuned
               swapped layers for --ft-models), runs/surgery/curve_<name>.safetensors
  cascade      --model RUN: routing rank per layer over the run's checkpoints (figure)
  evaluate     PPL of the two allocation runs on the same windows -> allocation_study
  figures      docs/figures/surgery_*.png and runs/surgery/summary.md; copies the result
               files to docs/results/surgery (read by the report when runs/surgery is absent)

Recorded commands, exactly as run for docs/surgery.md (all with OMP_NUM_THREADS=1, the
long ones under nohup nice -n 10 ... &):

  tl-spectral study surgery allocate --model runs/char-shakespeare-noln --budget 0.5 --multiple 2
      (the run was at its step-2200 checkpoint; the final checkpoint gives the same d_head)
  tl-spectral study surgery train-alloc --which uniform --steps 400   # and --which cascade
      (both stopped at the step-150 checkpoint and resumed with --steps 300; see RECIPE)
  tl-spectral study surgery curves --models softmax-ln,softmax-noln
  tl-spectral study surgery curves --models softmax-noln --ft-models softmax-noln --ft-steps 100 --ks 2,4,6
  tl-spectral study surgery curves --step 300     # and --step 400, 500, 1000
  tl-spectral study surgery curves --step 500 --models sd-noln --ft-models sd-noln --ks 4,6 --ft-steps 100
  tl-spectral study surgery curves --step 500 --models softmax-noln --ft-models softmax-noln --ks 4,6 --ft-steps 100
  (the same two fine-tuned commands with --step 1000: the S–D runs' final checkpoint)
  tl-spectral study surgery evaluate
  tl-spectral study surgery figures
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tl_spectral.usage import ArgumentParser
from tl_spectral.usage import seed as seed_arg
from tl_spectral_studies.surgery_figures import _caption, figures_from_results  # noqa: F401
from tl_spectral_studies.surgery_tables import (  # noqa: F401  (re-exported)
    ALLOC_RETRAIN,
    RETRAIN,
    SEED_SPREAD_RULE,
    SEEDS_T_RULE,
    SHIPPED,
    SMOL_IDS,
    _alloc_verdict,
    _curves,
    _md_table,
    _study_rows,
    _uniform_spread,
    allocation_markdown,
    allocations_markdown,
    collapse_k,
    collapse_label,
    depth_label,
    finetune_markdown,
    first_k_beyond,
    graceful_label,
    linearization_markdown,
    markdown,
    paper_range_label,
    seed_difference,
    seed_markdown,
    tables,
    verdict_markdown,
)

NAME = "surgery"
N_WINDOWS = 32


@dataclass(frozen=True)
class Paths:
    """Where the subcommands read and write (from --root / --work / --fig-dir / --publish):
    built once by :func:`main` and passed to each command as ``a.paths`` — no module global
    is rebound at run time."""

    root: Path = Path(".")
    out: Path = Path("runs") / "surgery"
    fig: Path = Path("runs") / "surgery" / "figures"
    pub: Path | None = None

    @classmethod
    def from_args(cls, a: Any) -> Paths:
        root = Path(a.root)
        out = Path(a.work) if a.work else root / "runs" / "surgery"
        return cls(root, out, Path(a.fig_dir) if a.fig_dir else out / "figures",
                   Path(a.publish) if getattr(a, "publish", None) else None)

MODELS = {  # name -> run directory of the routing/filtering issue
    "softmax-ln": "runs/char-shakespeare",
    "softmax-noln": "runs/char-shakespeare-noln",
    "sd-ln": "runs/sd-char-shakespeare",
    "sd-noln": "runs/sd-char-shakespeare-noln",
    "sd-noln-long": "runs/sd-char-shakespeare-noln-long",  # small initial A, 2,600 steps
}

# Note: both allocation runs were launched with "steps": 400; at the step-150 checkpoint
# (lr still near its peak) both were stopped and resumed with --steps 300 (the machine was
# too loaded to finish 400 in time), so from step 150 on the cosine follows the 300-step
# schedule — identically for the two runs.
RECIPE = {"steps": 300, "batch_size": 16, "lr": 0.0015, "min_lr": 0.00015, "warmup_steps": 100,
          "weight_decay": 0.1, "betas": [0.9, 0.99], "grad_clip": 1.0, "eval_every": 400,
          "eval_windows": N_WINDOWS, "checkpoint_every": 50, "keep_checkpoints": 2,
          "resume": True, "seed": 0, "device": "cpu", "num_threads": 1, "progress": False,
          "log_every": 10}


def _rel(d: Path, root: Path) -> str:
    """``d`` relative to ``root`` when it lies under it (as recorded in the result files)."""
    try:
        return str(Path(d).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(d)


def _char_data(model_dir: Path):
    """(train ids, val ids) of Tiny Shakespeare with the run's own character table."""
    from tl_spectral.data import CharTokenizer, tiny_shakespeare, train_val_split
    from tl_spectral.models.gpt import read_checkpoint_config

    meta = read_checkpoint_config(model_dir)
    tok = CharTokenizer.from_json(json.dumps(meta["tokenizer"]))
    tr, va = train_val_split(tiny_shakespeare(), float(meta.get("data", {}).get("val_fraction", 0.1)))
    return torch.tensor(tok.encode(tr)), torch.tensor(tok.encode(va)), meta


def _latest(run: str, root: Path) -> tuple[Path, int, bool]:
    from tl_spectral.geometry.cascade import latest_model_dir

    return latest_model_dir(Path(root) / run)


def cmd_allocate(a) -> None:
    from tl_spectral.interventions.surgery import cascade_allocation
    from tl_spectral.models.gpt import load_checkpoint

    d, step, fin = _latest(a.model, a.paths.root)
    m = load_checkpoint(d)
    alloc = cascade_allocation(m, a.budget, multiple=a.multiple, source=a.source,
                               name=f"{Path(a.model).name}@{step}")
    a.paths.out.mkdir(parents=True, exist_ok=True)
    alloc.save(a.paths.out / f"allocation{_tag(a)}.safetensors", overwrite=True)
    (a.paths.out / f"allocation{_tag(a)}.json").write_text(json.dumps(
        {"model_dir": _rel(d, a.paths.root), "step": step, "finished": fin,
         "rank": alloc.rank, "d_head": alloc.d_head, "saving": alloc.saving}, indent=2) + "\n")
    print(json.dumps({"d_head": alloc.d_head, "saving": alloc.saving, "rank": alloc.rank}))


def _matched_d_head(alloc) -> int:
    """The uniform d_head (a multiple of the allocation's ``multiple``) whose attention
    parameter count is closest to the cascade allocation's: the equal-budget control."""
    from tl_spectral.interventions.surgery import attention_param_count
    from tl_spectral.models.gpt import GPTConfig

    base = GPTConfig.from_dict(alloc.model_config)
    cands = range(alloc.multiple, max(alloc.d_head_uniform) + 1, alloc.multiple)
    return min(cands, key=lambda d: abs(attention_param_count(base, [d] * base.n_layers)
                                        - alloc.params_allocated))


def cmd_train_alloc(a) -> None:
    from tl_spectral.interventions.surgery import CascadeAllocation, allocated_config, train_model
    from tl_spectral.models.train import TrainConfig

    torch.set_num_threads(1)
    alloc = CascadeAllocation.load(a.paths.out / f"allocation{_tag(a)}.safetensors")
    info = json.loads((a.paths.out / f"allocation{_tag(a)}.json").read_text())
    train_ids, val_ids, meta = _char_data(a.paths.root / info["model_dir"])
    from tl_spectral.models.gpt import GPTConfig

    base = GPTConfig.from_dict(alloc.model_config)
    if a.which == "cascade":
        cfg = alloc.config()
    elif a.which == "matched":
        cfg = allocated_config(base, [_matched_d_head(alloc)] * base.n_layers)
    else:
        cfg = base
    recipe = {**RECIPE, "steps": a.steps, "warmup_steps": a.warmup, "eval_every": a.eval_every,
              "seed": a.seed}
    out = a.paths.out / f"alloc{_tag(a)}-{a.which}{f'-s{a.seed}' if a.seed else ''}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
    tc = TrainConfig.from_dict({**recipe, "out_dir": str(out)})
    model, hist = train_model(cfg, train_ids, val_ids, tc, seed=a.seed,
                              extra_metadata={"tokenizer": meta["tokenizer"],
                                              "data": meta.get("data", {})})
    print(json.dumps({"which": a.which, "step": len(hist.train_loss),
                      "val": hist.evals[-1] if hist.evals else None}))


def _tag(a) -> str:
    return f"_{a.tag}" if getattr(a, "tag", "") else ""


def _windows(model_dir: Path) -> torch.Tensor:
    from tl_spectral_studies._runs import run_validation_windows

    return run_validation_windows(model_dir, "char", n_windows=N_WINDOWS)


def cmd_curves(a) -> None:
    from tl_spectral.interventions.surgery import FineTune, linearization_curve
    from tl_spectral.models.gpt import load_checkpoint

    torch.set_num_threads(1)
    a.paths.out.mkdir(parents=True, exist_ok=True)
    names = a.models.split(",") if a.models else list(MODELS)
    ft_names = set(a.ft_models.split(",")) if a.ft_models else set()
    for name in names:
        if a.step:
            d = a.paths.root / MODELS[name] / "checkpoints" / f"step_{a.step:07d}"
            step, fin = a.step, False
        else:
            d, step, fin = _latest(MODELS[name], a.paths.root)
        m = load_checkpoint(d)
        train_ids, _, _ = _char_data(d)
        W = _windows(d)
        ft = FineTune(steps=a.ft_steps, batch_size=a.ft_batch) if name in ft_names else None
        ks = [int(k) for k in a.ks.split(",")] if a.ks else None
        c = linearization_curve(m, W, ks=ks, train_tokens=train_ids, fine_tune=ft,
                                control=a.control and ft is not None, name=name, progress=True)
        c.note = f"{_rel(d, a.paths.root)} (step {step}{', final' if fin else ''})"
        suffix = (f"@{step}" if a.step else "") + ("_ft" if ft is not None else "")
        c.model_name = f"{name}{'@' + str(step) if a.step else ''}"
        c.save(a.paths.out / f"curve_{name}{suffix}.safetensors", overwrite=True)


def cmd_cascade(a) -> None:
    """Routing rank per layer over training (every checkpoint) of --model: the figure
    docs/figures/surgery_cascade_<name>.png and runs/surgery/cascade_<name>.safetensors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tl_spectral.geometry.cascade import cascade_over_training

    torch.set_num_threads(1)
    name = Path(a.model).name
    res = cascade_over_training(a.paths.root / a.model, name=name)
    res.save(a.paths.out / f"cascade_{name}.safetensors", overwrite=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    res.plot(ax=axes[0])
    res.plot(ax=axes[1], which="R")
    axes[0].set_title(f"{name}: entropy rank of S (d_head × d_head)", fontsize=9)
    axes[1].set_title(f"{name}: rank of the effective routing W_P S W_Pᵀ", fontsize=9)
    fig.tight_layout()
    a.paths.fig.mkdir(parents=True, exist_ok=True)
    steps = res.steps.tolist()
    run = _rel(a.paths.root / a.model, a.paths.root)
    _caption(fig, f"{name}: every checkpoint of the training run {run} "
             f"(steps {steps[0]}–{steps[-1]}, {len(steps)} checkpoints), weights only; training "
             "seed: see the run's config.json (tl-spectral study surgery cascade)")
    fig.savefig(a.paths.fig / f"surgery_cascade_{name}.png", dpi=120, bbox_inches="tight")
    last = res.rank().double().mean(-1)[-1].tolist()
    frac = (res.routing_fraction_S if res.routing_fraction_S is not None
            else res.routing_fraction_R).double().mean(-1)[-1].tolist()
    print(json.dumps({"steps": res.steps.tolist()[-1], "rank_last": last,
                      "rank_R_last": res.rank_R.double().mean(-1)[-1].tolist(),
                      "routing_fraction_last": frac}))


def cmd_evaluate(a) -> None:
    from tl_spectral.geometry.cascade import latest_model_dir
    from tl_spectral.interventions.surgery import AllocationStudy, attention_param_count, perplexity
    from tl_spectral.models.gpt import load_checkpoint

    torch.set_num_threads(1)
    info = json.loads((a.paths.out / f"allocation{_tag(a)}.json").read_text())
    W = _windows(a.paths.root / info["model_dir"])
    rows = []
    recipe = RECIPE
    runs = [("uniform", p) for p in [a.paths.out / f"alloc{_tag(a)}-uniform"]
            + sorted(a.paths.out.glob(f"alloc{_tag(a)}-uniform-s*")) if p.is_dir()]
    recipes = []
    for which in ("cascade", "matched"):
        runs += [(which, p) for p in sorted(a.paths.out.glob(f"alloc{_tag(a)}-{which}*"))
                 if p.is_dir() and not p.name.endswith("-check")]
    for which, run in runs:
        seed = run.name.rsplit("-s", 1)[1] if "-s" in run.name.split(which)[-1] else ""
        if (run / "recipe.json").exists():
            recipes.append(json.loads((run / "recipe.json").read_text()))
            if not seed:
                recipe = recipes[-1]
        d, step, fin = latest_model_dir(run)
        want = recipes[-1]["steps"] if (run / "recipe.json").exists() else step
        if getattr(a, "keep", None) and not fin and step < want:
            raise SystemExit(f"--keep: {run.name} is not finished (latest checkpoint: step "
                             f"{step}); finish its training (train-alloc resumes it) first")
        m = load_checkpoint(d)
        r = perplexity(m, W)
        name = f"uniform-{m.cfg.d_heads[0]}" if which == "matched" else which
        name += f" (seed {seed})" if seed else ""
        rows.append({"name": name, "d_head": m.cfg.d_heads,
                     "attention_params": attention_param_count(m.cfg),
                     "total_params": m.num_params(), "ppl": r["ppl"], "loss": r["loss"],
                     "steps": step})
    if getattr(a, "keep", None):
        rows, recipe = _merge_rows(AllocationStudy.load(a.keep), rows, recipes, W)
    st = AllocationStudy(rows=rows, recipe=recipe, n_windows=int(W.shape[0]),
                         seq_len=int(W.shape[1] - 1),
                         note=f"allocation from {info['model_dir']} (step {info['step']})")
    st.save(a.paths.out / f"allocation_study{_tag(a)}.safetensors", overwrite=True)
    print(json.dumps(st.to_rows(), indent=1))


def _merge_rows(kept: Any, rows: list[dict[str, Any]], recipes: list[dict[str, Any]],
                W: torch.Tensor) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of a committed study (``kept``) followed by the newly evaluated ``rows`` that it
    does not hold (same name: the committed row stays). The runs behind the committed rows
    may be gone; merging is refused unless the windows and the recipe (seed aside) match."""
    if (kept.n_windows, kept.seq_len) != (int(W.shape[0]), int(W.shape[1] - 1)):
        raise SystemExit(f"--keep: the committed study scored {kept.n_windows} windows × "
                         f"{kept.seq_len}, these runs {W.shape[0]} × {W.shape[1] - 1}; "
                         "evaluate without --keep")

    def bare(r):
        return {k: v for k, v in r.items() if k != "seed"}

    for r in recipes:
        if bare(r) != bare(kept.recipe):
            diff = sorted(k for k in set(r) | set(kept.recipe)
                          if k != "seed" and r.get(k) != kept.recipe.get(k))
            raise SystemExit(f"--keep: these runs differ from the committed study's recipe in "
                             f"{', '.join(diff)}; evaluate without --keep")
    names = {r["name"] for r in kept.rows}
    return list(kept.rows) + [r for r in rows if r["name"] not in names], kept.recipe


def cmd_figures(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    figures_from_results(a.paths.out, a.paths.fig)
    (a.paths.out / "summary.md").write_text(markdown(a.paths.out))
    print((a.paths.out / "summary.md").read_text())
    if a.paths.pub is None:
        return
    # publish the (small) result files with the repository (docs/results/surgery)
    import shutil

    a.paths.pub.mkdir(parents=True, exist_ok=True)
    out = a.paths.out
    for p in [*out.glob("curve_*.safetensors"), *out.glob("allocation*.safetensors"),
              *out.glob("allocation*.json"), out / "summary.md"]:
        shutil.copy2(p, a.paths.pub / p.name)



def run_study(out_dir: str | Path, *, quick: bool = False, budget: float = 0.5,
              fig_dir: str | Path | None = None) -> dict:
    """The surgery study on the shipped models, without training: for ``char-shakespeare-noln``
    (softmax) and ``sd-char-shakespeare-noln`` (S–D) the zero-shot linearization curve on
    validation windows (``N_WINDOWS``, 8 with ``quick``) and the cascade allocation at
    ``budget``. Writes ``curve_<model>.safetensors``, ``allocation_<model>.safetensors``,
    ``summary.md`` and figures; returns a JSON-able summary."""
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral.interventions.surgery import (
        cascade_allocation,
        linearization_curve,
        plot_collapse,
    )
    from tl_spectral.models import zoo
    from tl_spectral_studies._common import save_figures
    from tl_spectral_studies._runs import run_validation_windows

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_win = 8 if quick else N_WINDOWS
    summary: dict = {"n_windows": n_win, "budget": budget, "models": {}}
    curves, figs = [], {}
    for name in ("char-shakespeare-noln", "sd-char-shakespeare-noln"):
        model, _ = zoo.load_native(name)
        d = zoo.checkpoint_dir(name)
        win = run_validation_windows(d, "char", n_windows=n_win)
        c = linearization_curve(model.eval(), win, name=name)
        c.note = f"zoo:{name}, {n_win} validation windows, zero-shot"
        c.save(out / f"curve_{name}.safetensors", overwrite=True)
        curves.append(c)
        entry = {"base_ppl": c.base_ppl, "within_5pct": c.max_k_within(0.05)}
        # S–D: the effective routing rank W_P S W_Pᵀ (the rank of S allows no 50% saving)
        try:
            al = cascade_allocation(model, budget, multiple=2, name=name,
                                    source="R" if name.startswith("sd-") else "auto")
        except ValueError as e:  # the budget cannot be met by this model's ranks
            entry["allocation_error"] = str(e)
        else:
            al.save(out / f"allocation_{name}.safetensors", overwrite=True)
            figs[f"allocation_{name}"] = al.plot()
            entry.update(d_head=al.d_head, saving=al.saving)
        summary["models"][name] = entry
    figs["collapse"] = plot_collapse(curves)
    save_figures(figs, Path(fig_dir) if fig_dir else out / "figures", "surgery", dpi=110,
                 caption=f"shipped char models, {n_win} validation windows × 256, zero-shot, "
                         f"budget {budget}; tl-spectral study surgery")
    own = linearization_markdown({c.model_name: c for c in curves}, [c.model_name for c in curves],
                                 header="model (shipped, zero-shot)", retrain=False)
    (out / "summary.md").write_text("<!-- this run's curves -->\n" + own + "\n\n"
                                    + markdown(out))
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary


def main(argv: Sequence[str], prog: str = "tl-spectral study surgery") -> int:
    from tl_spectral_studies._common import add_run_arguments, prepare_out

    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="tl_spectral_study_surgery")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--root", default=".", help="folder holding the training runs (runs/...)")
    ap.add_argument("--work", default=None, help="results of the subcommands "
                    "(default ROOT/runs/surgery)")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("allocate")
    p.add_argument("--model", default="runs/char-shakespeare-noln")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--source", default="auto", choices=("auto", "S", "R"),
                   help="routing matrix whose rank is measured (R: effective, for S–D)")
    p.add_argument("--multiple", type=int, default=2)
    p.add_argument("--tag", default="", help="name of this allocation (files allocation_<tag>.*)")
    p = sub.add_parser("train-alloc")
    p.add_argument("--which", choices=("uniform", "cascade", "matched"), required=True,
                   help="matched: uniform d_head with about the cascade's attention parameters")
    p.add_argument("--steps", type=int, default=RECIPE["steps"])
    p.add_argument("--warmup", type=int, default=RECIPE["warmup_steps"])
    p.add_argument("--eval-every", type=int, default=RECIPE["eval_every"])
    p.add_argument("--tag", default="", help="which allocation (see allocate --tag)")
    p.add_argument("--seed", type=seed_arg, default=0,
                   help="initialisation and data-order seed (runs with seed != 0 get -s<seed>)")
    p = sub.add_parser("curves")
    p.add_argument("--models", default="", help="comma list of " + ",".join(MODELS))
    p.add_argument("--ft-models", default="", help="models that also get fine-tuned curves")
    p.add_argument("--ft-steps", type=int, default=60)
    p.add_argument("--ft-batch", type=int, default=16)
    p.add_argument("--ks", default="", help="comma list of k (default 0..n_layers)")
    p.add_argument("--control", action="store_true",
                   help="with --ft-models: also fine-tune the same layers without linearizing")
    p.add_argument("--step", type=int, default=0,
                   help="use checkpoint step_N of every run (default: final / latest)")
    p = sub.add_parser("evaluate")
    p.add_argument("--tag", default="")
    p.add_argument("--keep", default=None,
                   help="a committed allocation_study*.safetensors whose rows are kept (runs "
                        "evaluated now add the seeds it lacks)")
    sub.add_parser("cascade").add_argument("--model", required=True, help="a run directory")
    sub.add_parser("figures").add_argument(
        "--publish", default=None, help="copy the result files there (docs/results/surgery)")
    a = ap.parse_args(list(argv))
    if a.cmd is None:
        out = prepare_out(a.out, NAME, overwrite=a.overwrite)
        print(json.dumps(run_study(out, quick=a.quick, budget=a.budget, fig_dir=a.fig_dir),
                         default=float))
        print(out.resolve())
        return 0
    a.paths = Paths.from_args(a)
    {"allocate": cmd_allocate, "train-alloc": cmd_train_alloc, "curves": cmd_curves,
     "cascade": cmd_cascade,
     "evaluate": cmd_evaluate, "figures": cmd_figures}[a.cmd](a)
    return 0

