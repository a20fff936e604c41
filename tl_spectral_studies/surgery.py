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
from pathlib import Path
from typing import Any

import torch

from tl_spectral.usage import ArgumentParser

NAME = "surgery"
# Set by main() from --root / --work / --fig-dir / --publish (the subcommands read them).
ROOT = Path(".")
OUT = ROOT / "runs" / "surgery"
FIG = OUT / "figures"
PUB: Path | None = None
N_WINDOWS = 32

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


def _rel(d: Path) -> str:
    """``d`` relative to ROOT when it lies under it (as recorded in the result files)."""
    try:
        return str(Path(d).resolve().relative_to(ROOT.resolve()))
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


def _latest(run: str) -> tuple[Path, int, bool]:
    from tl_spectral.geometry.cascade import latest_model_dir

    return latest_model_dir(ROOT / run)


def cmd_allocate(a) -> None:
    from tl_spectral.models.gpt import load_model
    from tl_spectral.models.surgery import cascade_allocation

    d, step, fin = _latest(a.model)
    m = load_model(d)
    alloc = cascade_allocation(m, a.budget, multiple=a.multiple, source=a.source,
                               name=f"{Path(a.model).name}@{step}")
    OUT.mkdir(parents=True, exist_ok=True)
    alloc.save(OUT / f"allocation{_tag(a)}.safetensors", overwrite=True)
    (OUT / f"allocation{_tag(a)}.json").write_text(json.dumps(
        {"model_dir": _rel(d), "step": step, "finished": fin,
         "rank": alloc.rank, "d_head": alloc.d_head, "saving": alloc.saving}, indent=2) + "\n")
    print(json.dumps({"d_head": alloc.d_head, "saving": alloc.saving, "rank": alloc.rank}))


def _matched_d_head(alloc) -> int:
    """The uniform d_head (a multiple of the allocation's ``multiple``) whose attention
    parameter count is closest to the cascade allocation's: the equal-budget control."""
    from tl_spectral.models.gpt import GPTConfig
    from tl_spectral.models.surgery import attention_param_count

    base = GPTConfig.from_dict(alloc.model_config)
    cands = range(alloc.multiple, max(alloc.d_head_uniform) + 1, alloc.multiple)
    return min(cands, key=lambda d: abs(attention_param_count(base, [d] * base.n_layers)
                                        - alloc.params_allocated))


def cmd_train_alloc(a) -> None:
    from tl_spectral.models.surgery import CascadeAllocation, allocated_config, train_model
    from tl_spectral.models.train import TrainConfig

    torch.set_num_threads(1)
    alloc = CascadeAllocation.load(OUT / f"allocation{_tag(a)}.safetensors")
    info = json.loads((OUT / f"allocation{_tag(a)}.json").read_text())
    train_ids, val_ids, meta = _char_data(ROOT / info["model_dir"])
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
    out = OUT / f"alloc{_tag(a)}-{a.which}{f'-s{a.seed}' if a.seed else ''}"
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
    from tl_spectral_studies.routing import validation_windows

    return validation_windows(model_dir, "char", n_windows=N_WINDOWS)


def cmd_curves(a) -> None:
    from tl_spectral.models.gpt import load_model
    from tl_spectral.models.surgery import FineTune, linearization_curve

    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    names = a.models.split(",") if a.models else list(MODELS)
    ft_names = set(a.ft_models.split(",")) if a.ft_models else set()
    for name in names:
        if a.step:
            d, step, fin = ROOT / MODELS[name] / "checkpoints" / f"step_{a.step:07d}", a.step, False
        else:
            d, step, fin = _latest(MODELS[name])
        m = load_model(d)
        train_ids, _, _ = _char_data(d)
        W = _windows(d)
        ft = FineTune(steps=a.ft_steps, batch_size=a.ft_batch) if name in ft_names else None
        ks = [int(k) for k in a.ks.split(",")] if a.ks else None
        c = linearization_curve(m, W, ks=ks, train_tokens=train_ids, fine_tune=ft,
                                control=a.control and ft is not None, name=name, progress=True)
        c.note = f"{_rel(d)} (step {step}{', final' if fin else ''})"
        suffix = (f"@{step}" if a.step else "") + ("_ft" if ft is not None else "")
        c.model_name = f"{name}{'@' + str(step) if a.step else ''}"
        c.save(OUT / f"curve_{name}{suffix}.safetensors", overwrite=True)


def cmd_cascade(a) -> None:
    """Routing rank per layer over training (every checkpoint) of --model: the figure
    docs/figures/surgery_cascade_<name>.png and runs/surgery/cascade_<name>.safetensors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tl_spectral.geometry.cascade import cascade_over_training

    torch.set_num_threads(1)
    name = Path(a.model).name
    res = cascade_over_training(ROOT / a.model, name=name)
    res.save(OUT / f"cascade_{name}.safetensors", overwrite=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    res.plot(ax=axes[0])
    res.plot(ax=axes[1], which="R")
    axes[0].set_title(f"{name}: entropy rank of S (d_head × d_head)", fontsize=9)
    axes[1].set_title(f"{name}: rank of the effective routing W_P S W_Pᵀ", fontsize=9)
    fig.tight_layout()
    FIG.mkdir(parents=True, exist_ok=True)
    steps = res.steps.tolist()
    _caption(fig, f"{name}: every checkpoint of the training run {_rel(ROOT / a.model)} "
             f"(steps {steps[0]}–{steps[-1]}, {len(steps)} checkpoints), weights only; training "
             "seed: see the run's config.json (tl-spectral study surgery cascade)")
    fig.savefig(FIG / f"surgery_cascade_{name}.png", dpi=120, bbox_inches="tight")
    last = res.rank().double().mean(-1)[-1].tolist()
    frac = (res.routing_fraction_S if res.routing_fraction_S is not None
            else res.routing_fraction_R).double().mean(-1)[-1].tolist()
    print(json.dumps({"steps": res.steps.tolist()[-1], "rank_last": last,
                      "rank_R_last": res.rank_R.double().mean(-1)[-1].tolist(),
                      "routing_fraction_last": frac}))


def cmd_evaluate(a) -> None:
    from tl_spectral.geometry.cascade import latest_model_dir
    from tl_spectral.models.gpt import load_model
    from tl_spectral.models.surgery import AllocationStudy, attention_param_count, perplexity

    torch.set_num_threads(1)
    info = json.loads((OUT / f"allocation{_tag(a)}.json").read_text())
    W = _windows(ROOT / info["model_dir"])
    rows = []
    recipe = RECIPE
    runs = [("uniform", OUT / f"alloc{_tag(a)}-uniform")]
    runs += [("uniform", p) for p in sorted(OUT.glob(f"alloc{_tag(a)}-uniform-s*"))
             if p.is_dir()]
    for which in ("cascade", "matched"):
        runs += [(which, p) for p in sorted(OUT.glob(f"alloc{_tag(a)}-{which}*"))
                 if p.is_dir() and not p.name.endswith("-check")]
    for which, run in runs:
        seed = run.name.rsplit("-s", 1)[1] if "-s" in run.name.split(which)[-1] else ""
        if not seed and (run / "recipe.json").exists():
            recipe = json.loads((run / "recipe.json").read_text())
        d, step, fin = latest_model_dir(run)
        m = load_model(d)
        r = perplexity(m, W)
        name = f"uniform-{m.cfg.d_heads[0]}" if which == "matched" else which
        name += f" (seed {seed})" if seed else ""
        rows.append({"name": name, "d_head": m.cfg.d_heads,
                     "attention_params": attention_param_count(m.cfg),
                     "total_params": m.num_params(), "ppl": r["ppl"], "loss": r["loss"],
                     "steps": step})
    st = AllocationStudy(rows=rows, recipe=recipe, n_windows=int(W.shape[0]),
                         seq_len=int(W.shape[1] - 1),
                         note=f"allocation from {info['model_dir']} (step {info['step']})")
    st.save(OUT / f"allocation_study{_tag(a)}.safetensors", overwrite=True)
    print(json.dumps(st.to_rows(), indent=1))


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])

    def f(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(f(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def cmd_figures(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    figures_from_results(OUT, FIG)
    (OUT / "summary.md").write_text(markdown(OUT))
    print((OUT / "summary.md").read_text())
    if PUB is None:
        return
    # publish the (small) result files with the repository (docs/results/surgery)
    import shutil

    PUB.mkdir(parents=True, exist_ok=True)
    for p in [*OUT.glob("curve_*.safetensors"), *OUT.glob("allocation*.safetensors"),
              *OUT.glob("allocation*.json"), OUT / "summary.md"]:
        shutil.copy2(p, PUB / p.name)


def _caption(fig: Any, text: str) -> None:
    import textwrap

    from tl_spectral_studies._common import add_caption

    add_caption(fig, textwrap.fill(text, int(fig.get_figwidth() * 17)))


def _save(fig: Any, path: Path, caption: str, written: list[Path]) -> None:
    import matplotlib.pyplot as plt

    _caption(fig, caption)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    written.append(path)


def _tidy_symlog(ax: Any) -> None:
    """Readable ticks on the symlog collapse axis: no minor ticks, the lower limit just under
    the lowest curve, one labelled tick per decade (and −1, 0, 1)."""
    import numpy as np

    ys = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines()
          if len(ln.get_ydata()) > 1]
    if not ys:
        return
    lo, hi = min(float(np.nanmin(y)) for y in ys), max(float(np.nanmax(y)) for y in ys)
    ax.minorticks_off()
    ax.set_ylim(min(lo, 0.0) - 0.5, hi * 1.6 if hi > 1 else 2.0)
    ticks = [t for t in (-100, -10, -1, 0, 1, 10, 100, 1000, 10000)
             if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.grid(axis="y", alpha=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _curve_caption(cs: list[Any]) -> str:
    """Which runs a collapse figure shows: model (checkpoint, steps), windows × length,
    fine-tuning steps and seed, as recorded in the curve files."""
    runs = "; ".join(dict.fromkeys(f"{c.model_name}: {c.note or 'checkpoint not recorded'}"
                                   for c in cs))
    win = sorted({f"{c.n_windows} × {c.seq_len}" for c in cs})
    ft = sorted({f"{c.fine_tune['steps']} steps, seed {c.fine_tune.get('seed', 'not recorded')}"
                 for c in cs if c.fine_tune})
    return (f"{runs}. PPL on {', '.join(win)} validation windows (tokens); "
            + (f"fine-tuned: {', '.join(ft)}; " if ft else "zero-shot only; ")
            + "training seed: not recorded in the results; shipped char runs only "
            "(tl-spectral study surgery curves / figures)")


def _study_caption(st: Any, source: str) -> str:
    steps = sorted({r.get("steps") for r in st.rows if r.get("steps") is not None})
    return (f"{st.note or source}; every model trained {', '.join(map(str, steps)) or '?'} "
            f"steps (recipe seed {st.recipe.get('seed', 'not recorded')}; rows marked "
            f"'seed 1' use seed 1), PPL on {st.n_windows} validation windows × {st.seq_len} "
            "(tl-spectral study surgery evaluate / figures)")


def figures_from_results(results_dir: str | Path, fig_dir: str | Path) -> list[Path]:
    """Redraw every surgery figure that the result files in ``results_dir`` (e.g. the
    committed docs/results/surgery) hold the data for, into ``fig_dir/surgery_*.png``, each
    with a caption naming the run (model, steps, windows × length, seed): the collapse
    curves per checkpoint group (``surgery_collapse_{final,stepN}.png``), every allocation
    (``surgery_allocation{tag}.png``), allocation study (``surgery_params_vs_ppl{tag}.png``)
    and the combined ``surgery_params_vs_ppl_all.png``. The cascade over training
    (``surgery_cascade_*.png``) needs every training checkpoint and is not redrawn here
    (``cascade`` subcommand). Returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral.models.surgery import (
        AllocationStudy,
        CascadeAllocation,
        LinearizationCurve,
        plot_collapse,
    )

    src, fig_dir = Path(results_dir), Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    curves = {p.stem[len("curve_"):]: LinearizationCurve.load(p)
              for p in sorted(src.glob("curve_*.safetensors"))}
    groups: dict[str, dict[str, list]] = {}  # "final" or "step400" -> zero-shot / fine-tuned
    for n, c in curves.items():
        base = n[:-3] if n.endswith("_ft") else n
        g = "step" + base.split("@")[1] if "@" in base else "final"
        groups.setdefault(g, {"zs": [], "ft": []})["ft" if n.endswith("_ft") else "zs"].append(c)
    for g, cs in groups.items():
        fig = plot_collapse(cs["zs"], fine_tuned=cs["ft"])
        fig.axes[0].set_title(f"linearization of the first k layers ({g})", fontsize=10)
        _tidy_symlog(fig.axes[0])
        _save(fig, fig_dir / f"surgery_collapse_{g}.png", _curve_caption(cs["zs"] + cs["ft"]),
              written)
    for p in sorted(src.glob("allocation*.safetensors")):
        tag = p.stem.split("allocation_study" if "study" in p.stem else "allocation")[1]
        if "study" in p.stem:
            st = AllocationStudy.load(p)
            _save(st.plot(), fig_dir / f"surgery_params_vs_ppl{tag}.png",
                  _study_caption(st, p.name), written)
        else:
            al = CascadeAllocation.load(p)
            info = p.with_suffix(".json")
            step = (json.loads(info.read_text()).get("step", "not recorded")
                    if info.is_file() else "not recorded")
            _save(al.plot(), fig_dir / f"surgery_allocation{tag}.png",
                  f"allocation from {al.model_name} (step {step}; training seed not recorded "
                  f"in the results), {al.measure} rank of the routing matrix from the weights "
                  f"only, budget {al.budget:g} of the uniform attention parameters "
                  "(tl-spectral study surgery allocate)", written)
    p = _combined_params_figure(src, fig_dir)
    if p is not None:
        written.append(p)
    return written


def _combined_params_figure(src: Path, fig_dir: Path) -> Path | None:
    """Attention parameters vs PPL of the 2,600-step allocation studies, one panel per family
    (docs/figures/surgery_params_vs_ppl_all.png): ★ cascade, ■ equal-budget uniform,
    ● full uniform; open markers for seed 1."""
    import matplotlib.pyplot as plt

    from tl_spectral.models.surgery import AllocationStudy

    studies = {p.stem[len("allocation_study_"):]: AllocationStudy.load(p)
               for p in sorted(src.glob("allocation_study_*.safetensors"))}
    if not studies:
        return None
    fams = {"softmax": [t for t in studies if not t.startswith("sd")],
            "S–D": [t for t in studies if t.startswith("sd")]}
    fams = {k: v for k, v in fams.items() if v}
    fig, axes = plt.subplots(1, len(fams), figsize=(5.2 * len(fams), 4.0), squeeze=False)
    marks = {"uniform-": "s", "uniform": "o", "cascade": "*"}
    for ax, (fam, tags) in zip(axes[0], fams.items()):
        for i, tag in enumerate(tags):
            st = studies[tag]
            src_name = "rank of S" if tag == "sdS" else ("effective routing rank" if tag == "sd"
                                                         else "rank of R")
            for r in st.to_rows():
                m = next(v for k, v in marks.items() if r["name"].startswith(k))
                seed1 = "seed" in r["name"]
                ax.scatter(r["attn_params_%"], r["ppl"], marker=m, s=110 if m == "*" else 50,
                           facecolors="none" if seed1 else f"C{i}", edgecolors=f"C{i}",
                           zorder=3)
                if not seed1 and r["name"] != "uniform":  # ■ labels above, ★ below
                    ax.annotate(r["d_head"], (r["attn_params_%"], r["ppl"]), fontsize=6.5,
                                textcoords="offset points",
                                xytext=(7, 3) if m == "s" else (7, -9))
            ax.plot([], [], "*", color=f"C{i}", label=f"cascade from the {src_name}")
        wins = sorted({f"{studies[t].n_windows} windows × {studies[t].seq_len}" for t in tags})
        ax.set_xlabel("attention parameters (% of uniform d_head 16)")
        ax.set_ylabel(f"validation PPL ({', '.join(wins)})")
        ax.set_title(f"{fam}: ★ cascade, ■ uniform at equal budget, ● uniform 16; "
                     "open = seed 1", fontsize=8)
        ax.legend(fontsize=7)
        ax.margins(x=0.15, y=0.2)
    fig.tight_layout()
    steps = sorted({r.get("steps") for st in studies.values() for r in st.rows
                    if r.get("steps") is not None})
    notes = "; ".join(f"{t}: {st.note}" for t, st in studies.items())
    path = fig_dir / "surgery_params_vs_ppl_all.png"
    _save(fig, path, f"allocation studies {', '.join(studies)} ({notes}); every model trained "
          f"{', '.join(map(str, steps))} steps, seed 0 (filled) and seed 1 (open) as recorded "
          "in the rows (tl-spectral study surgery evaluate --tag TAG / figures)", [])
    return path


def main(argv: Sequence[str], prog: str = "tl-spectral study surgery") -> int:
    global ROOT, OUT, FIG, PUB
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
    p.add_argument("--seed", type=int, default=0,
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
    sub.add_parser("evaluate").add_argument("--tag", default="")
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
    ROOT = Path(a.root)
    OUT = Path(a.work) if a.work else ROOT / "runs" / "surgery"
    FIG = Path(a.fig_dir) if a.fig_dir else OUT / "figures"
    PUB = Path(a.publish) if getattr(a, "publish", None) else None
    {"allocate": cmd_allocate, "train-alloc": cmd_train_alloc, "curves": cmd_curves,
     "cascade": cmd_cascade,
     "evaluate": cmd_evaluate, "figures": cmd_figures}[a.cmd](a)
    return 0
