"""Plots of the routing/filtering weight geometry (``tl_spectral.geometry.qk``).

Every function takes a :class:`~tl_spectral.geometry.qk.QKGeometry` (or, where noted, an
:class:`~tl_spectral.geometry.qk.SDGeometry`) and returns a matplotlib ``Figure``.
``matplotlib.pyplot`` is imported inside each function (Agg-safe; nothing is shown).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tl_spectral.viz.figures import layer_key, register_plot
from tl_spectral.viz.layer_plots import set_layer_axis

__all__ = ["plot_budget", "plot_eigenvalues", "plot_routing_rank"]


def _new_axes(ax: Any, figsize: tuple[float, float]):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    else:
        fig = ax.figure
    return fig, ax


def plot_budget(geometry: Any, *, ax: Any = None, jitter: float = 0.12, seed: int = 0):
    """Spectral budget per layer: routing fraction ``‖R‖²/‖M‖²`` of every head.

    A box per layer (over heads) with each head as a jittered dot; 0.5 is marked (the
    value for a kernel with no preference, e.g. random Gaussian factors).

    ``geometry``: a ``QKGeometry`` (``routing_fraction`` ``[layer, head]``) or an
    ``SDGeometry`` (its ``‖S‖²/‖S−D‖²``).
    ``ax``: an existing Axes to draw into (optional).
    ``jitter``: horizontal jitter of the dots, in layer units.
    ``seed``: seed of the jitter.
    """
    frac = geometry.routing_fraction.detach().cpu().double().numpy()  # [layer, head]
    n_layers, n_heads = frac.shape
    fig, ax = _new_axes(ax, (max(4.0, 0.45 * n_layers + 2), 3.5))
    x = np.arange(n_layers)
    ax.boxplot(
        [frac[i] for i in range(n_layers)],
        positions=x,
        widths=0.6,
        showfliers=False,
        medianprops={"color": "k"},
    )
    rng = np.random.default_rng(seed)
    xs = x[:, None] + rng.uniform(-jitter, jitter, size=(n_layers, n_heads))
    ax.scatter(xs.ravel(), frac.ravel(), s=10, alpha=0.6, color="tab:red", zorder=3, label="heads")
    ax.axhline(0.5, color="0.6", ls=":", lw=1)
    set_layer_axis(ax, geometry.layer_names)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("routing fraction ‖R‖²/‖M‖²")
    ax.set_title("Spectral budget (filtering = 1 − routing)")
    fig.tight_layout()
    return fig


def plot_routing_rank(
    geometry: Any,
    *,
    measure: str = "entropy",
    planes: bool = False,
    show_capacity: bool = False,
    show_heads: bool = True,
    ax: Any = None,
    label: str | None = None,
):
    """The spectral cascade: routing effective rank vs layer, mean ± std over heads.

    ``geometry``: ``QKGeometry`` (rank of R) or ``SDGeometry`` (rank of S).
    ``measure``: ``"entropy"`` (Roy & Vetterli effective rank) or ``"participation"``
    (participation ratio).
    ``planes``: plot rotation planes (rank / 2) instead of the rank.
    ``show_capacity``: draw the routing capacity (``min(2 d_head, d_model)``, or ``d_head``
    for S–D) per layer as a dashed line.
    ``show_heads``: draw every head as a faint dot.
    ``ax``: an existing Axes (e.g. to overlay several models; pass ``label``).
    ``label``: legend label of the mean curve.
    """
    if measure not in ("entropy", "participation"):
        raise ValueError(f"measure={measure!r}; pass 'entropy' or 'participation'")
    is_sd = hasattr(geometry, "eff_rank_S")
    if measure == "entropy":
        rank = geometry.eff_rank_S if is_sd else geometry.eff_rank_R
    else:
        rank = geometry.pr_S if is_sd else geometry.pr_R
    rank = rank.detach().cpu().double().numpy()
    if planes:
        rank = rank / 2
    n_layers, n_heads = rank.shape
    fig, ax = _new_axes(ax, (max(4.0, 0.4 * n_layers + 2), 3.5))
    x = np.arange(n_layers)
    mean, std = rank.mean(1), rank.std(1)
    if show_heads:
        ax.scatter(np.repeat(x, n_heads), rank.ravel(), s=6, alpha=0.3, color="0.4")
    ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=label or "mean ± std over heads")
    if show_capacity:
        if is_sd:
            cap = np.asarray(geometry.d_head, dtype=float)
        else:
            cap = geometry.routing_capacity.detach().cpu().double().numpy()
        ax.plot(x, cap / 2 if planes else cap, ls="--", color="tab:gray", label="capacity")
    set_layer_axis(ax, geometry.layer_names)
    ax.set_ylim(bottom=0)
    what = "S" if is_sd else "R"
    kind = "entropy eff. rank" if measure == "entropy" else "participation ratio"
    ax.set_ylabel(f"rotation planes of {what}" if planes else f"{kind} of {what}")
    ax.set_title("Routing rank per layer (spectral cascade)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_eigenvalues(
    geometry: Any,
    *,
    normalize: bool = True,
    ax: Any = None,
    cmap: str = "viridis",
):
    """Eigenvalues in the complex plane, coloured by layer.

    ``QKGeometry``: the nonzero eigenvalues of each head's ``M = W_Q W_Kᵀ``;
    ``SDGeometry``: the eigenvalues of ``S − D``. Points right of the dashed line
    (``Re λ > 0``) are the unstable directions.

    ``geometry``: ``QKGeometry`` or ``SDGeometry``.
    ``normalize``: divide each head's eigenvalues by its largest modulus (scales differ a
    lot across layers); set False for raw values.
    ``ax``: an existing Axes.
    ``cmap``: matplotlib colormap for the layers.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    re = geometry.eig_real.detach().cpu().double().numpy()
    im = geometry.eig_imag.detach().cpu().double().numpy()
    if hasattr(geometry, "eig_nonzero"):
        keep = geometry.eig_nonzero.detach().cpu().numpy()
    else:
        keep = geometry.valid.detach().cpu().numpy()
    if normalize:
        mag = np.hypot(re, im).max(-1, keepdims=True)
        mag = np.where(mag > 0, mag, 1.0)
        re, im = re / mag, im / mag
    n_layers = re.shape[0]
    fig, ax = _new_axes(ax, (5.0, 4.5))
    colours = plt.get_cmap(cmap)
    norm = Normalize(vmin=0, vmax=max(n_layers - 1, 1))
    for layer in range(n_layers):
        k = keep[layer]
        ax.scatter(
            re[layer][k], im[layer][k], s=8, alpha=0.6, color=colours(norm(layer)), linewidths=0
        )
    ax.axvline(0, color="k", ls="--", lw=0.8)
    ax.axhline(0, color="0.7", lw=0.5)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=colours)
    sm.set_array([])
    cbar = fig.colorbar(sm, ax=ax)
    cbar.set_label("layer")
    ax.set_xlabel("Re λ" + (" / max|λ|" if normalize else ""))
    ax.set_ylabel("Im λ" + (" / max|λ|" if normalize else ""))
    is_sd = hasattr(geometry, "eff_rank_S")
    ax.set_title("Eigenvalues of S − D" if is_sd else "Nonzero eigenvalues of W_Q W_Kᵀ")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)
register_plot("qk_geometry", "plot_budget")(plot_budget)
register_plot("qk_geometry", "plot_routing_rank")(plot_routing_rank)
register_plot("qk_geometry", "plot_eigenvalues")(plot_eigenvalues)
register_plot("sd_geometry", "plot_budget")(plot_budget)
register_plot("sd_geometry", "plot_routing_rank")(plot_routing_rank)
register_plot("sd_geometry", "plot_eigenvalues")(plot_eigenvalues)


@register_plot("routing_cascade", "plot")
def routing_cascade_figure(res, ax: Any = None, which: str = "auto"):
    """Mean routing rank per layer vs training step (one line per layer). ``which``:
    "auto" (S for S–D models, else R), "S" or "R". Returns a Figure."""
    import matplotlib.pyplot as plt

    if which not in ("auto", "S", "R"):
        raise ValueError(f"which must be 'auto', 'S' or 'R', got {which!r}")
    if which == "S" and res.rank_S is None:
        raise ValueError(f"{res.run_name} has no S–D layer: plot which='R'")
    use_s = res.rank_S is not None and which != "R"
    fig, ax = plt.subplots(figsize=(5, 3.4)) if ax is None else (ax.figure, ax)
    r = (res.rank_S if use_s else res.rank_R).double().mean(-1).numpy()
    cmap = plt.get_cmap("viridis")
    L = r.shape[1]
    for l in range(L):
        ax.plot(res.steps.numpy(), r[:, l], "o-", ms=2.5, color=cmap(l / max(1, L - 1)),
                label=f"L{l}")
    ax.set_xlabel("training step")
    ax.set_ylabel("routing rank of " + ("S" if use_s else "R (W_Q W_Kᵀ)"))
    ax.set_title(res.run_name, fontsize=9)
    layer_key(ax, range(L), ncol=2)
    fig.tight_layout()
    return fig


@register_plot("rotary_qk_geometry", "plot_routing_vs_offset")
def rotary_qk_geometry_plot_routing_vs_offset(res, *, ax: Any = None, lag: bool = True):
    """Head-mean routing fraction against the lag ``i − j = −Δ`` (log axis when ``lag``),
    one line per layer. Returns the Figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.0, 3.6))
    else:
        fig = ax.figure
    x = (-res.offsets).to(torch.float64) if lag else res.offsets.to(torch.float64)
    order = torch.argsort(x)
    for i, name in enumerate(res.layer_names):
        y = res.routing_fraction[i].mean(0)
        ax.plot((x[order] + (1 if lag else 0)).numpy(), y[order].numpy(), marker="o",
                ms=3, label=name)
    if lag:
        ax.set_xscale("log")
        ax.set_xlabel("lag i − j + 1 (log)")
    else:
        ax.set_xlabel("offset Δ = j − i")
    ax.set_ylabel("routing fraction ‖R‖²/‖M‖²")
    ax.axhline(0.5, color="0.6", lw=0.8, ls="--")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig
