"""Progress bars that suit where the code runs.

``progress_bar`` is ``tqdm.auto.tqdm`` (a widget bar in Jupyter) when ``ipywidgets`` is
installed, and the plain text ``tqdm`` otherwise. ``tqdm.auto`` alone would, in a Jupyter
kernel without ``ipywidgets``, fall back to text *and* emit a ``TqdmWarning`` ("IProgress not
found") into the notebook; checking for ``ipywidgets`` first avoids the warning while keeping
the widget bar for those who have it.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Optional


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


#: ``progress=None`` shows a bar only once the work has taken this long (seconds)
AUTO_DELAY_S = 2.0


def interactive() -> bool:
    """True on a terminal (stderr is a TTY) or in a Jupyter kernel: where a bar is seen."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stderr
        pass
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def progress_bar(iterable: Any = None, *, enabled: Optional[bool] = True, **kwargs: Any):
    """A tqdm bar (see the module doc); the other arguments are tqdm's.

    enabled: the ``progress`` argument of every public function, one convention: True shows
    the bar, False never does, None (the default of every public function) shows it on a
    terminal or in a notebook (:func:`interactive`) and only once the work has taken
    :data:`AUTO_DELAY_S` seconds, so short calls and logs stay quiet.
    """
    if enabled is None:
        if interactive():
            kwargs.setdefault("delay", AUTO_DELAY_S)
        else:
            kwargs["disable"] = True
    elif not enabled:
        kwargs["disable"] = True
    return tqdm_class()(iterable, **kwargs)


def quiet_tqdm_auto() -> None:
    """In a Jupyter kernel without ipywidgets, import ``tqdm.auto`` once with its
    ``TqdmWarning`` ("IProgress not found") silenced. TransformerLens imports ``tqdm.auto`` at
    import time, so without this every notebook that loads a model shows the warning; after
    it, ``tqdm.auto`` is the text bar it would have fallen back to anyway. Called by
    ``import tl_spectral``; does nothing outside a kernel, with ipywidgets, or when
    ``tqdm.auto`` was already imported."""
    import warnings

    if ("ipykernel" not in sys.modules or "tqdm.autonotebook" in sys.modules
            or _has_ipywidgets()):
        return
    from tqdm.std import TqdmWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=TqdmWarning)
        import tqdm.auto  # noqa: F401
