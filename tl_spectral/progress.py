"""Progress bars that suit where the code runs.

``progress_bar`` is ``tqdm.auto.tqdm`` (a widget bar in Jupyter) when ``ipywidgets`` is
installed, and the plain text ``tqdm`` otherwise. ``tqdm.auto`` alone would, in a Jupyter
kernel without ``ipywidgets``, fall back to text *and* emit a ``TqdmWarning`` ("IProgress not
found") into the notebook; checking for ``ipywidgets`` first avoids the warning while keeping
the widget bar for those who have it.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _has_ipywidgets() -> bool:
    try:
        return importlib.util.find_spec("ipywidgets") is not None
    except (ImportError, ValueError):
        return False


def tqdm_class() -> type:
    """The tqdm class to use: ``tqdm.auto.tqdm`` with ipywidgets, ``tqdm.std.tqdm`` without."""
    if _has_ipywidgets():
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def progress_bar(iterable: Any = None, **kwargs: Any):
    """A tqdm bar (see the module doc); the arguments are tqdm's."""
    return tqdm_class()(iterable, **kwargs)


def quiet_tqdm_auto() -> None:
    """In a Jupyter kernel without ipywidgets, import ``tqdm.auto`` once with its
    ``TqdmWarning`` ("IProgress not found") silenced. TransformerLens imports ``tqdm.auto`` at
    import time, so without this every notebook that loads a model shows the warning; after
    it, ``tqdm.auto`` is the text bar it would have fallen back to anyway. Called by
    ``import tl_spectral``; does nothing outside a kernel, with ipywidgets, or when
    ``tqdm.auto`` was already imported."""
    import sys
    import warnings

    if ("ipykernel" not in sys.modules or "tqdm.autonotebook" in sys.modules
            or _has_ipywidgets()):
        return
    from tqdm.std import TqdmWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=TqdmWarning)
        import tqdm.auto  # noqa: F401
