"""Figures of the project's models: routing ablations, rank truncation, linearization
(collapse curves), cascade allocation and its trained comparison. Matplotlib only: takes the
results, imports nothing of the library's maths."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tl_spectral.viz.figures import register_plot

# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)


@register_plot("routing_ablation", "plot")
def routing_ablation_figure(res, ax: Any = None):
    """ΔPPL of each ablation (all layers, log scale), and per layer. Returns a Figure."""
    import matplotlib.pyplot as plt

    kinds = sorted({r["ablation"] for r in res.rows})
    per = {k: sorted((r for r in res.rows if r["ablation"] == k and r["layers"] != "all"),
                     key=lambda r: r["layers"]) for k in kinds}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4)) if ax is None else (ax.figure, [ax])
    a0 = axes[0]
    allrows = [next(r for r in res.rows if r["ablation"] == k and r["layers"] == "all")
               for k in kinds if any(r["layers"] == "all" and r["ablation"] == k
                                     for r in res.rows)]
    a0.bar(range(len(allrows)), [max(r["delta_ppl"], 1e-3) for r in allrows],
           color="tab:purple")
    a0.set_yscale("log")
    a0.set_xticks(range(len(allrows)))
    a0.set_xticklabels([r["ablation"].replace("_", "\n") for r in allrows], fontsize=8)
    a0.set_xlabel("ablation (all layers)")
    a0.set_ylabel("ΔPPL (all layers)")
    a0.set_title(f"{res.model_name}: baseline PPL {res.baseline_ppl:.3g}", fontsize=9)
    if len(axes) > 1:
        a1 = axes[1]
        for k in kinds:
            if per[k]:
                a1.plot([r["layers"] for r in per[k]],
                        [max(r["delta_ppl"], 1e-3) for r in per[k]], "o-", label=k)
        a1.set_yscale("log")
        a1.set_xlabel("ablated layer")
        a1.set_ylabel("ΔPPL (one layer)")
        if a1.get_legend_handles_labels()[0]:
            a1.legend(fontsize=8)
    fig.tight_layout()
    return fig


@register_plot("rank_truncation", "plot")
def rank_truncation_figure(res, ax: Any = None):
    """Relative ΔPPL against r (log-log) for routing and filtering. Returns a Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.6, 3.4)) if ax is None else (ax.figure, ax)
    for part in ("routing", "filtering"):  # interventions.ablations.TRUNCATION_PARTS
        rs, ys = res.curve(part)
        if rs:
            ax.plot(rs, [max(y, 1e-4) for y in ys], "o-", label=part)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rank r kept")
    ax.set_ylabel("ΔPPL / PPL")
    ax.set_title(f"{res.model_name}: rank truncation", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@register_plot("cascade_allocation", "plot")
def cascade_allocation_figure(res, ax: Any = None):
    """Routing rank and allocated d_head per layer (bars: uniform vs allocated)."""
    import matplotlib.pyplot as plt

    fig, ax = (plt.subplots(figsize=(8, 3.4)) if ax is None else (ax.figure, ax))
    x = torch.arange(len(res.rank)).numpy()
    ax.bar(x - 0.2, res.d_head_uniform, 0.4, color="lightgray", label="uniform d_head")
    ax.bar(x + 0.2, res.d_head, 0.4, color="tab:blue", label="allocated d_head")
    what = {"S": "of S", "R": "of R"}.get(res.source, "")
    ax.plot(x, res.rank, "ko-", label=f"routing rank {what} ({res.measure})".replace("  ", " "))
    ax.set_xlabel("layer")
    ax.set_ylabel("dimension")
    ax.set_title(f"{res.model_name}: {100 * res.saving:.0f}% fewer attention parameters",
                 fontsize=9)
    # beside the axes: over the bars it would hide the layers' dimensions
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


@register_plot("allocation_study", "plot")
def allocation_study_figure(res, ax: Any = None):
    """PPL vs attention parameters, one point per model. Returns a Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, ax = (plt.subplots(figsize=(5.5, 3.8)) if ax is None else (ax.figure, ax))
    for i, r in enumerate(res.rows):
        ax.scatter(r["attention_params"], r["ppl"], s=50, color=f"C{i}", zorder=3)
        ax.annotate(f"{r['name']}\n[{' '.join(str(d) for d in r['d_head'])}]",
                    (r["attention_params"], r["ppl"]), fontsize=8,
                    textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("attention parameters (thousands)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / 1000:g}"))
    ax.xaxis.set_major_locator(MaxNLocator(5))  # readable ticks, never run together
    ax.set_ylabel("validation PPL")
    ax.set_title("cascade allocation vs uniform (same recipe)", fontsize=10)
    ax.margins(x=0.25, y=0.2)
    fig.tight_layout()
    return fig


@register_plot("linearization_curve", "collapse")
def plot_collapse(curves: Sequence[Any], ax: Any = None,
                  thresholds: Sequence[float] = (0.014, 0.05),
                  fine_tuned: Sequence[Any] = ()):
    """The collapse curve: relative ΔPPL (%, symlog) vs number of leading layers linearized,
    one colour per model, zero-shot solid and fine-tuned dashed; the paper's 1.4% and 5%
    marks as horizontal lines. ``fine_tuned``: further curves of which only the fine-tuned
    line is drawn (in the colour of the zero-shot curve with the same model name).
    Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    fig, ax = (plt.subplots(figsize=(6.4, 4.0)) if ax is None else (ax.figure, ax))
    colors: dict[str, str] = {}

    def color(name: str) -> str:
        return colors.setdefault(name, f"C{len(colors)}")

    def ft_line(c: Any) -> None:
        steps = (c.fine_tune or {}).get("steps", "?")
        ax.plot(c.ks, [100 * r for r in c.rel_delta("fine_tuned")], "s--",
                color=color(c.model_name), label=f"{c.model_name} fine-tuned ({steps} steps)")
        if c.ppl_control is not None:
            ax.plot(c.ks, [100 * r for r in c.rel_delta("control")], "x:",
                    color=color(c.model_name), label=f"{c.model_name} control (same fine-tune, "
                    "no swap)")

    for c in curves:
        ax.plot(c.ks, [100 * r for r in c.rel_delta()], "o-", color=color(c.model_name),
                label=f"{c.model_name} zero-shot")
        if c.ppl_fine_tuned is not None:
            ft_line(c)
    for c in fine_tuned:
        if c.ppl_fine_tuned is not None:
            ft_line(c)
    for t in thresholds:
        ax.axhline(100 * t, color="gray", lw=0.8, ls=":")
        ax.text(0, 100 * t, f" {100 * t:g}%", va="bottom", fontsize=8, color="gray")
    ax.set_yscale("symlog", linthresh=1.0)
    ticks = [t for t in (-1, 0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
             if t >= ax.get_ylim()[0] and t <= ax.get_ylim()[1]]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.set_xlabel("k (leading layers linearized)")
    ax.set_ylabel("ΔPPL / PPL (%)")
    ax.set_title("linearization of the first k layers (ELU+1)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@register_plot("linearization_curve", "plot")
def linearization_curve_figure(res, ax: Any = None):
    """Relative ΔPPL (%) vs k of one curve (zero-shot solid, fine-tuned dashed)."""
    return plot_collapse([res], ax=ax)
