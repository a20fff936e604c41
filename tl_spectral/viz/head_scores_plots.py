"""Figures of the :class:`~tl_spectral.probes.head_scores.HeadScoresResult` kind (the plotting
leaf: matplotlib only, registered for ``Result._draw``)."""

from __future__ import annotations

from typing import Any

from tl_spectral.viz.figures import register_plot
from tl_spectral.viz.multiples import heads_by_layer_figure


@register_plot("head_scores", "plot")
def head_scores_plot(res: Any, names: list[str]):
    """Heads-by-layer maps of each score in ``names``, every colour scale on [0, 1]."""
    return heads_by_layer_figure(
        [{"values": res.score(n).float().numpy(), "title": f"{n} score, scale [0, 1]",
          "vmin": 0.0, "vmax": 1.0, "cmap": "viridis", "cbar": "score"} for n in names],
        res.layers, ncols=3)
