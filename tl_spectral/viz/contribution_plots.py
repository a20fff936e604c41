"""Views of contribution weights, faithfulness and sinks (the report section is
``contribution_section.py``).

Signed maps in circuitsvis. ``contribution_view`` shows a contribution map with
``circuitsvis.attention.attention_heads`` (one small heat map per head, plus the token level
``C = Σ_h c`` as the last "head"): positive values in red, negative values (destructive
interference) in blue, white at 0, with symmetric limits ``±lim`` so equal magnitudes get
equal colour depth. ``lim`` is the largest |value| over the shown maps, or with
``clip_quantile < 1`` that quantile of |value| (a sink column can otherwise wash out the
rest; values beyond are shown at full depth). Raw attention and the other non-negative
baselines are shown the same way (they are simply never blue).

The study of docs/contributions.md is ``tl-spectral study contributions`` (the
``tl_spectral_studies`` package).
"""

from __future__ import annotations

from typing import Any

import torch

from tl_spectral.viz.sink_plots import plot_rho_star, plot_sink_rates  # noqa: F401
from tl_spectral.viz.views import contribution_view  # noqa: F401 - re-exported


# ----------------------------------------------------------------------------- views
def plot_faithfulness_areas(res: Any):
    """Bars of the comprehensiveness and sufficiency areas per measure and setting (linear
    axis when every value is positive, symlog only when signs mix)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    M, S = len(res.measures), len(res.settings)
    w = 0.8 / S
    for ax, (title, areas) in zip(axes, (("comprehensiveness area (higher = better)",
                                          res.comprehensiveness_area),
                                         ("sufficiency area (lower = better)",
                                          res.sufficiency_area))):
        for si, sname in enumerate(res.settings):
            ax.bar(torch.arange(M).numpy() + si * w, areas[si].numpy(), width=w, label=sname)
        ax.set_xticks(torch.arange(M).numpy() + 0.4 - w / 2, res.measures, rotation=25,
                      ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("area")
        if bool((areas < 0).any()):
            ax.set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_spearman(stats: Any):
    """Token-level Spearman correlation of each attention-only measure with the
    contribution c, layer × measure, annotated in a readable size."""
    import matplotlib.pyplot as plt

    ci = stats.measures.index("contribution")
    others = [m for m in stats.measures if m != "contribution"]
    short = {"attention": "α", "value_weighted": "α‖ṽ‖", "output_normalized": "α‖ṽ‖/‖o‖"}
    mat = torch.stack([stats.rank_corr[:, -1, stats.measures.index(m), ci] for m in others],
                      dim=1).float().numpy()  # [layer, measure]
    L = len(stats.layers)
    fig, ax = plt.subplots(figsize=(1.9 * len(others) + 2.5, 0.45 * L + 1.6),
                           constrained_layout=True)
    im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
    ax.set_xticks(range(len(others)), [f"{short.get(m, m)} vs c" for m in others], fontsize=9)
    ax.set_yticks(range(L), [str(x) for x in stats.layers], fontsize=9)
    ax.set_ylabel("layer")
    for a in range(L):
        for b in range(len(others)):
            ax.text(b, a, f"{mat[a, b]:.2f}", ha="center", va="center", fontsize=9,
                    color="white" if abs(mat[a, b]) > 0.6 else "black")
    fig.colorbar(im, ax=ax, shrink=0.9, label="Spearman ρ")
    ax.set_title("rank correlation with the contribution c (token level)", fontsize=10)
    return fig


def slim_contribution_stats(stats: Any, layer: int, n: int) -> Any:
    """A copy keeping only the kept maps of ``layer`` cut to the first ``n`` positions (what
    the report's view shows): the per-query maps of every layer are the bulk of the file."""
    import dataclasses

    kept = {k: (v[..., :n, :n].clone()) for k, v in stats.kept_maps.items()
            if k.split(".", 1)[0] == str(layer)}
    return dataclasses.replace(
        stats, kept_maps=kept,
        kept_tokens=None if stats.kept_tokens is None else stats.kept_tokens[:, :n].clone(),
        kept_mask=None if stats.kept_mask is None else stats.kept_mask[:, :n].clone())
