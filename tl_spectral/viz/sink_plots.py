"""Figures of sink statistics (``SinkStats``): sink rates and the optimal sink rate ρ*.
Imports nothing of the library, so ``SinkStats.plot_*`` call these without an import cycle."""

from __future__ import annotations

from typing import Any

import torch


def plot_sink_rates(sinks: Any):
    """Heat maps (layer × head) of the sink rate and the Gu key score, each colour scale
    spanning its own data range (with a colour bar); sink heads marked with a dot."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    pos = int(getattr(sinks, "sink_index", 0))
    for ax, (m, title) in zip(axes, ((sinks.sink_rate, f"sink rate  mean_i α_i{pos}"),
                                     (sinks.key_score, f"Gu key score of position {pos}"))):
        a = m.float().numpy()
        lo, hi = float(a.min()), float(a.max())
        im = ax.imshow(a, aspect="auto", cmap="magma", vmin=lo, vmax=hi if hi > lo else lo + 1e-9)
        ys, xs = torch.nonzero(sinks.sink_head, as_tuple=True)
        ax.scatter(xs.numpy(), ys.numpy(), s=12, c="cyan", marker="o",
                   label=f"key score > {sinks.threshold}")
        ax.set_xticks(range(a.shape[1]))
        ax.set_yticks(range(len(sinks.layers)), [str(x) for x in sinks.layers])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.85)
    axes[1].legend(fontsize=7, loc="upper right")
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
        axes[0].plot(centers, (h / h.sum().clamp_min(1)).numpy(), label=f"layer {layer}")
    axes[0].axvspan(0, 1, color="grey", alpha=0.1)
    axes[0].set_xlabel("ρ* (end bins collect values outside the range)")
    axes[0].set_ylabel("share of queries")
    axes[0].set_title("optimal sink rate ρ* per query", fontsize=9)
    axes[0].legend(fontsize=7)
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
    axes[1].legend(fontsize=7)
    return fig
