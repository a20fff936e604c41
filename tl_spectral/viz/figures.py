"""The registry of the plotting leaf: (result kind, figure name) -> the function that draws
it, called as ``f(result, *args, **kwargs)``. Each ``viz/*_plots.py`` module fills it with
:func:`register_plot`; :mod:`tl_spectral.viz.plots` imports every such module, and
``Result._draw`` (:func:`tl_spectral.results.plotter`) imports that on the first figure."""

from __future__ import annotations

from typing import Any, Callable

#: (result kind, figure name) -> drawing function
FIGURES: dict[tuple[str, str], Callable[..., Any]] = {}


def register_plot(kind: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the function draws the figure ``name`` (a method name of the result class,
    such as ``"plot"``, ``"plot_lag"`` or ``"view"``) of results of ``kind``."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        FIGURES[(kind, name)] = fn
        return fn

    return deco


#: more layers than this: per-layer lines are coloured by layer with a colour bar instead of
#: a legend (a 30-entry legend covers the data or collapses the figure)
MAX_LEGEND_LAYERS = 8


def layer_style(i: int, layers: Any) -> dict:
    """Line style of the ``i``-th of ``layers``: the colour cycle (empty dict) for a few
    layers, a viridis colour by depth beyond :data:`MAX_LEGEND_LAYERS`."""
    n = len(layers)
    if n <= MAX_LEGEND_LAYERS:
        return {}
    import matplotlib.pyplot as plt

    return {"color": plt.get_cmap("viridis")(i / max(1, n - 1)), "lw": 1.0}


def layer_key(ax: Any, layers: Any, **legend_kw: Any) -> None:
    """The key of per-layer lines drawn with :func:`layer_style`: a legend for a few layers,
    else a colour bar labelled "layer"."""
    layers = [int(x) for x in layers]
    if len(layers) <= MAX_LEGEND_LAYERS:
        ax.legend(fontsize=8, **legend_kw)
        return
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    sm = ScalarMappable(norm=Normalize(min(layers), max(layers)), cmap=plt.get_cmap("viridis"))
    ax.figure.colorbar(sm, ax=ax, shrink=0.85, label="layer")
