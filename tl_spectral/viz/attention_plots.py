"""Figures of the attention statistics for the report.

``plot_mean_patterns``: one layer's mean patterns (one panel per head) on a QUANTILE colour
scale shared by the panels, with a colour bar: mean patterns are dominated by a few large
entries (position 0, the diagonal), so a linear scale leaves almost every entry white.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tl_spectral.viz.figures import register_plot
from tl_spectral.viz.layer_plots import set_layer_axis


def quantile_norm(values: np.ndarray, n_levels: int = 12):
    """A ``BoundaryNorm`` whose boundaries are quantiles of ``values`` (equal areas of each
    colour), deduplicated; falls back to a linear norm for constant data."""
    from matplotlib.colors import BoundaryNorm, Normalize

    v = values[np.isfinite(values)]
    if v.size == 0 or float(v.max()) == float(v.min()):
        return Normalize(vmin=0, vmax=float(v.max()) if v.size else 1.0), None
    b = np.unique(np.quantile(v, np.linspace(0, 1, n_levels + 1)))
    if b.size < 3:
        return Normalize(vmin=float(v.min()), vmax=float(v.max())), None
    return BoundaryNorm(b, ncolors=256), b


def plot_mean_patterns(res: Any, layer_index: int, max_pos: int = 64, caption: str = ""):
    """Mean attention patterns of the layer at ``layer_index`` (position in ``res.layers``),
    first ``max_pos`` positions, one panel per head, quantile colour scale + colour bar."""
    import matplotlib.pyplot as plt

    mp = res.mean_pattern[layer_index].float().numpy()[:, :max_pos, :max_pos]  # [H, q, k]
    H = mp.shape[0]
    if not getattr(res, "causal", True):
        keep = np.ones(mp.shape[1:], dtype=bool)
    else:
        keep = np.tril(np.ones(mp.shape[1:], dtype=bool))
    norm, bounds = quantile_norm(mp[:, keep].ravel())
    cols = min(H, 4)
    rows = (H + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.35 * cols + 1.2, 2.35 * rows + 0.5),
                             squeeze=False, constrained_layout=True)
    im = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= H:
            ax.axis("off")
            continue
        m = np.where(keep, mp[h], np.nan)
        im = ax.imshow(m, cmap="viridis", norm=norm, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.tick_params(labelsize=8)
        if h % cols == 0:
            ax.set_ylabel("query i", fontsize=8)
        if h // cols == rows - 1:
            ax.set_xlabel("key j", fontsize=8)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.9)
    cb.set_label("mean α_ij (quantile colour scale)", fontsize=8)
    if bounds is not None:
        cb.set_ticks(bounds[:: max(1, len(bounds) // 6)])
        cb.ax.set_yticklabels([f"{b:.2g}" for b in bounds[:: max(1, len(bounds) // 6)]],
                              fontsize=8)
    lay = res.layers[layer_index]
    fig.suptitle(f"layer {lay}: mean attention pattern (first {mp.shape[1]} positions)"
                 + (f"\n{caption}" if caption else ""), fontsize=10)
    return fig


def plot_attention_stats(res: Any, caption: str = ""):
    """Heat maps (layer × head) of entropy, mean distance and first-token mass, each with
    a colour bar scaled to its data and integer head / layer ticks."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    panels = [(res.entropy, "mean attention entropy (nats)", "viridis"),
              (res.distance, "mean attention distance (tokens)", "magma"),
              (res.first_token_mass, "attention mass on position 0", "cividis")]
    for ax, (m, title, cmap) in zip(axes, panels):
        a = m.float().numpy()
        im = ax.imshow(a, aspect="auto", cmap=cmap)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(a.shape[1]))
        set_layer_axis(ax, res.layers, axis="y")
        fig.colorbar(im, ax=ax, shrink=0.85, label=title.split(" (")[-1].rstrip(")")
                     if "(" in title else "share of attention")
    if caption:
        fig.suptitle(caption, fontsize=9)
    return fig


# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)


@register_plot("attention_stats", "view")
def attention_stats_view(res, layer: int | None = None, max_pos: int = 64):
    """circuitsvis view of the mean pattern of ``layer`` (default: the last), one panel
    per head; positions are labelled by index."""
    import circuitsvis as cv

    li = len(res.layers) - 1 if layer is None else list(res.layers).index(layer)
    pat = res.mean_pattern[li, :, :max_pos, :max_pos].float()
    n = pat.shape[-1]
    from tl_spectral.viz.views import NotebookView

    # one copy of the circuitsvis JavaScript per notebook (NotebookView)
    return NotebookView(cv.attention.attention_heads(
        attention=pat, tokens=[str(i) for i in range(n)],
        attention_head_names=[f"L{res.layers[li]}H{h}" for h in range(pat.shape[0])]))


@register_plot("attention_stats", "plot")
def attention_stats_figure(res):
    """Heat maps (layer × head) of entropy, mean distance and first-token mass."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    panels = [
        (res.entropy, "mean attention entropy (nats)", "viridis", "entropy (nats)"),
        (res.distance, "mean attention distance (tokens)", "magma", "distance (tokens)"),
        (res.first_token_mass, "attention mass on first token", "cividis", "share of attention"),
    ]
    for ax, (m, title, cmap, unit) in zip(axes, panels):
        im = ax.imshow(m.numpy(), aspect="auto", cmap=cmap)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        set_layer_axis(ax, res.layers, axis="y")
        fig.colorbar(im, ax=ax, shrink=0.85, label=unit)
    fig.suptitle(f"AttentionStats — {res.model_name}", fontsize=11)
    return fig


@register_plot("attention_stats", "plot_patterns")
def attention_stats_plot_patterns(res, max_pos: int = 64):
    """Grid (layer × head) of mean attention patterns, first ``max_pos`` positions."""
    import matplotlib.pyplot as plt

    L, H = res.mean_pattern.shape[:2]
    fig, axes = plt.subplots(L, H, figsize=(1.3 * H + 0.4, 1.3 * L + 0.5), squeeze=False,
                             constrained_layout=True)
    for li in range(L):
        for h in range(H):
            ax = axes[li][h]
            ax.imshow(res.mean_pattern[li, h, :max_pos, :max_pos].numpy(), cmap="Blues")
            ax.set_xticks([])
            ax.set_yticks([])
            if li == 0:
                ax.set_title(f"H{h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"L{res.layers[li]}", fontsize=8)
    fig.suptitle("mean attention pattern (query ↓, key →)", fontsize=10)
    return fig
