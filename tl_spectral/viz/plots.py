"""The plotting leaf's door: importing it registers every figure and view of the library's
result kinds (``Result._draw`` / :func:`tl_spectral.results.plotter` import it on the first
figure asked for). One line per plotting module; each module registers its own figures with
``@register_plot(kind, name)`` (:mod:`tl_spectral.viz.figures`). Matplotlib / circuitsvis
only: nothing here imports the library's maths (``analysis``, ``geometry``, ``probes``,
``models``)."""

from tl_spectral.viz import (  # noqa: F401 - each registers its figures
    attention_plots,
    contribution_plots,
    geometry_plots,
    head_scores_plots,
    model_plots,
    scale_pod_plots,
    sink_plots,
    views,
)
from tl_spectral.viz.figures import FIGURES  # noqa: E402,F401 - read by Result._draw
