"""Figures of sink statistics (``SinkStats``): sink rates and the optimal sink rate ρ*.
Imports nothing of the library, so ``SinkStats.plot_*`` call these without an import cycle."""

from __future__ import annotations

from typing import Any

import torch

from tl_spectral.viz.figures import layer_key, layer_style, register_plot
from tl_spectral.viz.layer_plots import set_layer_axis


def plot_sink_rates(sinks: Any):
    """Heat maps (layer × head) of the sink rate and the Gu key score, each colour scale
    spanning its own data range (with a colour bar); sink heads marked with a dot."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    pos = int(getattr(sinks, "sink_index", 0))
    for ax, (m, title, unit) in zip(axes, (
            (sinks.sink_rate, f"sink rate  mean_i α_i{pos}", "share of attention"),
            (sinks.key_score, f"Gu key score of position {pos}", "key score"))):
        a = m.float().numpy()
        lo, hi = float(a.min()), float(a.max())
        im = ax.imshow(a, aspect="auto", cmap="magma", vmin=lo, vmax=hi if hi > lo else lo + 1e-9)
        ys, xs = torch.nonzero(sinks.sink_head, as_tuple=True)
        ax.scatter(xs.numpy(), ys.numpy(), s=12, c="cyan", marker="o",
                   label=f"key score > {sinks.threshold}")
        ax.set_xticks(range(a.shape[1]))
        ax.set_xlabel("head")
        set_layer_axis(ax, sinks.layers, axis="y")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.85, label=unit)
    axes[1].legend(fontsize=8, loc="upper right")
    return fig


def plot_rho_star(sinks: Any):
    """Left: histogram of ρ* per layer (all heads). Right: 2-D histogram of ρ* against the
    observed α_i0 (all layers, log count, with a colour bar) and the diagonal ρ* = α_i0."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    edges = sinks.rho_edges.numpy()
    centers = 0.5 * (edges[1:] + edges[:-1])
    for li, layer in enumerate(sinks.layers):
        h = sinks.rho_hist[li].sum(0)
        axes[0].plot(centers, (h / h.sum().clamp_min(1)).numpy(), label=f"layer {layer}",
                     **layer_style(li, sinks.layers))
    axes[0].axvspan(0, 1, color="grey", alpha=0.1)
    axes[0].set_xlabel("ρ* (end bins collect values outside the range)")
    axes[0].set_ylabel("share of queries")
    axes[0].set_title("optimal sink rate ρ* per query", fontsize=9)
    layer_key(axes[0], sinks.layers)
    h2 = sinks.rho_alpha_hist.sum(0)
    a_e = sinks.alpha_edges.numpy()
    im = axes[1].imshow(torch.log10(1 + h2).numpy(), origin="lower", aspect="auto",
                        cmap="Blues", extent=(a_e[0], a_e[-1], edges[0], edges[-1]))
    cb = fig.colorbar(im, ax=axes[1], shrink=0.85)
    cb.set_label("log10(1 + queries)", fontsize=8)
    axes[1].plot([0, 1], [0, 1], color="red", lw=0.8, label="ρ* = α_i0")
    axes[1].set_xlabel("observed α_i0")
    axes[1].set_ylabel("ρ*")
    axes[1].set_title("ρ* vs observed sink rate", fontsize=9)
    axes[1].legend(fontsize=8)
    return fig


# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)
register_plot("sink_stats", "plot_rates")(plot_sink_rates)
register_plot("sink_stats", "plot_rho_star")(plot_rho_star)


@register_plot("sink_stats", "plot_anti_alignment")
def sink_stats_plot_anti_alignment(res):
    """Distribution of cos(ṽ_0, s_i) per layer (all heads), and its mean per head."""
    import matplotlib.pyplot as plt

    # constrained layout: laid out at draw time, after a report marks its layer ticks
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3.6, 0.16 * len(res.layers) + 1.4)),
                             gridspec_kw={"width_ratios": [3, 2]}, constrained_layout=True)
    edges = res.anti_edges.numpy()
    centers = 0.5 * (edges[1:] + edges[:-1])
    for li, layer in enumerate(res.layers):
        h = res.anti_hist[li].sum(0)
        axes[0].plot(centers, (h / h.sum().clamp_min(1)).numpy(), label=f"L{layer}",
                     **layer_style(li, res.layers))
    axes[0].axvline(0, color="black", lw=0.6)
    axes[0].set_xlabel("cos(ṽ_0, s_i)")
    axes[0].set_ylabel("share of queries")
    axes[0].set_title("anti-alignment of the sink value and the semantic vector", fontsize=9)
    layer_key(axes[0], res.layers)
    im = axes[1].imshow(res.anti_mean.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1)
    axes[1].set_xlabel("head")
    set_layer_axis(axes[1], res.layers, axis="y")
    axes[1].set_title("mean cos(ṽ_0, s_i)", fontsize=9)
    fig.colorbar(im, ax=axes[1], shrink=0.85, label="mean cosine")
    return fig


@register_plot("sink_intervention", "plot")
def sink_intervention_figure(res, ax=None):
    """Bars of the effect of zeroing the sink's value, per layer and for all layers."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2)) if ax is None else (ax.figure, ax)
    ax.bar(range(len(res.settings)), res.delta.float().numpy(), color="tab:purple")
    ax.set_xticks(range(len(res.settings)), res.settings, rotation=30, ha="right",
                  fontsize=8)
    ax.set_xlabel("sink value zeroed in")
    ax.set_ylabel("ΔPPL" if res.metric == "delta_ppl" else "1 − cos(e', e)")
    ax.set_title(f"{res.model_name or 'model'}: zero the sink's value "
                 f"(clean {res.clean:.4g})", fontsize=9)
    fig.tight_layout()
    return fig


@register_plot("sink_geometry", "plot_norm_curve")
def plot_norm_curve(
    res, batch: int = 0, head: int = 0, queries: list[int] | None = None, n_rho: int = 101
):
    """Output norm vs imposed sink rate for a few queries of one head, with the
    observed rate (dot) and ``ρ*`` (cross) marked. Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    rho = torch.linspace(0.0, 1.0, n_rho, dtype=res.rho_star.dtype)
    curve = res.norm_curve(rho)[batch, head]
    ok = res.curve_valid[batch, head]
    if queries is None:
        idx = ok.nonzero().flatten().tolist()
        queries = idx[:: max(1, len(idx) // 6)][:6]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i in queries:
        if not bool(ok[i]):
            continue
        (line,) = ax.plot(rho.numpy(), curve[i].float().numpy(), label=f"query {i}")
        if bool(res.rho_star_valid[batch, head, i]):
            rs = float(res.rho_star[batch, head, i])
            if 0.0 <= rs <= 1.0:
                ax.plot(
                    [rs], [float(res.min_norm[batch, head, i])], "x", color=line.get_color()
                )
    ax.set_xlabel("imposed sink rate ρ")
    ax.set_ylabel("‖ρ ṽ_0 + (1 − ρ) s̄_i‖")
    ax.set_title(f"batch {batch}, head {head} (× = ρ*)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@register_plot("sink_geometry", "plot_rates")
def sink_geometry_plot_rates(res):
    """Per-head sink rate and Gu key score of the first token (batch mean), with the
    sink-head threshold. Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    h = res.sink_rate.shape[1]
    x = torch.arange(h).numpy()
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * h + 2), 3.5))
    ax.bar(x - 0.2, res.sink_rate.mean(0).float().numpy(), width=0.4, label="sink rate")
    ks = res.key_score[..., res.sink_index].mean(0).float().numpy()
    ax.bar(x + 0.2, ks, width=0.4, label="key score (Gu)")
    ax.axhline(res.threshold, color="black", ls="--", lw=0.8, label="threshold")
    ax.set_xlabel("head")
    ax.set_ylabel("rate / score (batch mean)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig
