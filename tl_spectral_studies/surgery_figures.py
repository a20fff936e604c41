"""The figures of docs/surgery.md, redrawn from the committed result files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
            + "training seed: not recorded in the results; curves from the committed files "
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
    from tl_spectral.interventions.surgery import (
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
    ● full uniform; open markers for seeds other than 0."""
    import matplotlib.pyplot as plt

    from tl_spectral.interventions.surgery import AllocationStudy

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
                     "open = seeds 1, 2", fontsize=8)
        ax.legend(fontsize=7)
        ax.margins(x=0.15, y=0.2)
    fig.tight_layout()
    steps = sorted({r.get("steps") for st in studies.values() for r in st.rows
                    if r.get("steps") is not None})
    notes = "; ".join(f"{t}: {st.note}" for t, st in studies.items())
    path = fig_dir / "surgery_params_vs_ppl_all.png"
    _save(fig, path, f"allocation studies {', '.join(studies)} ({notes}); every model trained "
          f"{', '.join(map(str, steps))} steps, seed 0 (filled) and seeds 1, 2 (open) as recorded "
          "in the rows (tl-spectral study surgery evaluate --tag TAG / figures)", [])
    return path


