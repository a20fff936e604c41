"""Registries by convention instead of hand-kept import lists.

Two ways the library finds code it does not list:

- **its own modules, by file name**: :func:`submodules` / :func:`import_submodules` list the
  modules of a package whose name ends with a suffix (``tl_spectral.viz.plots`` imports every
  ``viz/*_plots.py``, ``tl_spectral.viz.sections`` every ``viz/*_section.py``;
  ``tl_spectral.probes`` finds its probe modules the same way);
- **other packages, by entry point**: :func:`load_plugins` imports every module of the
  ``tl_spectral.plugins`` entry-point group (:data:`PLUGIN_GROUP`) once. A plugin's import
  registers what it adds, with the decorators the library's own modules use: its report
  sections (``@register_section``, :mod:`tl_spectral.viz.context`), its figures
  (``@register_plot``, :mod:`tl_spectral.viz.figures`) and its result kinds
  (``@register_result``, :mod:`tl_spectral.results`). The report, ``tl-spectral analyze
  --sections`` and the API tables (:mod:`tl_spectral.api_doc`) then see them.

A plugin package declares itself in its ``pyproject.toml``::

    [project.entry-points."tl_spectral.plugins"]
    head_norm = "my_package.tl_plugin"   # a module whose import registers everything

Standard library only (the ground floor: every floor may import it).
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from types import ModuleType
from typing import Optional

__all__ = ["PLUGIN_GROUP", "import_submodules", "load_plugins", "submodules"]

#: the entry-point group of tl_spectral's plugins (probes, figures, report sections)
PLUGIN_GROUP = "tl_spectral.plugins"


def submodules(package: str, suffix: str = "") -> list[str]:
    """The full names of the modules (not subpackages) of ``package`` whose name ends with
    ``suffix``, sorted; found by file, nothing imported but the package itself."""
    pkg = importlib.import_module(package)
    return sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)
                  if not m.ispkg and m.name.endswith(suffix) and not m.name.startswith("_"))


def import_submodules(package: str, suffix: str = "") -> list[ModuleType]:
    """Import every module of :func:`submodules` (each registers what it defines)."""
    return [importlib.import_module(name) for name in submodules(package, suffix)]


#: entry-point name -> imported plugin module; None until :func:`load_plugins` first runs
_PLUGINS: Optional[dict[str, ModuleType]] = None


def load_plugins() -> dict[str, ModuleType]:
    """Import every plugin of the ``tl_spectral.plugins`` entry-point group once; returns
    ``{entry-point name: module}``. A plugin that fails to import is left out with a
    ``RuntimeWarning`` naming it (the library's own sections and figures still work)."""
    global _PLUGINS
    if _PLUGINS is not None:
        return _PLUGINS
    from importlib.metadata import entry_points

    _PLUGINS = {}  # filled in place: a plugin that imports the report while loading sees it
    seen: set[str] = set()
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        if ep.name in seen:  # the same distribution on sys.path twice
            continue
        seen.add(ep.name)
        try:
            ep.load()
            _PLUGINS[ep.name] = importlib.import_module(ep.module)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the library
            warnings.warn(f"tl_spectral plugin {ep.name!r} ({ep.value}) failed to import "
                          f"({type(exc).__name__}: {exc}); its probes, figures and sections "
                          "are left out", RuntimeWarning, stacklevel=2)
    return _PLUGINS


def _forget_plugins() -> None:
    """Look the entry points up again on the next :func:`load_plugins` (tests)."""
    global _PLUGINS
    _PLUGINS = None
