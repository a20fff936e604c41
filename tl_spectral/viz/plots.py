"""The plotting leaf's door: importing it registers every figure and view of the library's
result kinds (``Result._draw`` / :func:`tl_spectral.results.plotter` import it on the first
figure asked for): every plotting module ``viz/*_plots.py``, found by file name (no list to
keep), and ``views.py``, then the plugins (:func:`tl_spectral.discovery.load_plugins`). Each
module registers its own figures with ``@register_plot(kind, name)``
(:mod:`tl_spectral.viz.figures`). Matplotlib / circuitsvis only: nothing here imports the
library's maths (``analysis``, ``geometry``, ``probes``, ``models``)."""

from tl_spectral.discovery import import_submodules, load_plugins
from tl_spectral.viz import views  # noqa: F401 - registers the circuitsvis views
from tl_spectral.viz.figures import FIGURES  # noqa: F401 - read by Result._draw

#: the plotting modules found by file name (each registered its figures on import)
PLOT_MODULES = [m.__name__ for m in import_submodules("tl_spectral.viz", suffix="_plots")]
load_plugins()  # a plugin's figures (its import registers them)
