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
