"""Composable probes that run inside one TransformerLens forward pass.

A probe needs no registration to run (pass it to ``run_probes``). Probe classes end in
``Probe``; their results are :class:`~tl_spectral.results.Result` kinds. Adding a built-in probe
is one new module here and nothing else: every module of this package that defines a
``Probe`` subclass is a *probe module*, found by file (no import list), and its public names
(:func:`public_names`: its ``__all__``, or else the probe classes and result kinds it
defines) are exported here, in ``tl_spectral`` (``tl_spectral.__all__``) and in docs/api.md's
generated table (``python -m tl_spectral.api_doc``); see docs/probes.md.
"""

import importlib as _importlib
import os as _os
import re as _re
from types import ModuleType as _ModuleType

from tl_spectral._deprecation import module_getattr
from tl_spectral.discovery import submodules as _submodules
from tl_spectral.probes.base import LayerCapture, Probe, merge_tensor, reduce_state
from tl_spectral.probes.runner import (
    Corpus,
    ProbeRun,
    as_corpus,
    run_probes,
    run_probes_on_cache,
    run_probes_with_logits,
)
from tl_spectral.results import Result

#: what runs the probes (the runner's and the base class's names); the probe modules' names
#: join these at the end of this module
__all__ = ["Corpus", "LayerCapture", "Probe", "ProbeRun", "as_corpus", "merge_tensor",
           "reduce_state", "run_probes", "run_probes_on_cache", "run_probes_with_logits"]

#: a top-level class whose bases name a probe class: the modules worth importing to look at
#: (the helpers, e.g. faithfulness and interventions, are not imported by this package)
_DEFINES_PROBE = _re.compile(r"^class\s+\w+\s*\([^)]*Probe\b", _re.M)


def public_names(module: _ModuleType, *, imported: bool = False) -> list[str]:
    """The public names of a probe module (or of a plugin's module): its ``__all__`` when it
    declares one, else the ``Probe`` subclasses and ``Result`` kinds it defines (in its own
    file or, for a package, in its submodules), in the order they appear. ``imported``: also
    those it imports from elsewhere, but not tl_spectral's own (a plugin module that imports
    its probe from another module of its package)."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return list(declared)
    own = module.__name__
    out = []
    for name, obj in vars(module).items():
        if name.startswith("_") or not isinstance(obj, type) or obj in (Probe, Result):
            continue
        where = getattr(obj, "__module__", "")
        here = where == own or where.startswith(own + ".")
        if imported and not here:
            here = where.partition(".")[0] != __name__.partition(".")[0]
        if here and issubclass(obj, (Probe, Result)):
            out.append(name)
    return out


def _probe_module_names() -> list[str]:
    """The modules of this package that define a probe class, found by reading their source
    (a module without readable source is taken as a candidate and checked on import)."""
    out = []
    for name in _submodules(__name__):
        path = _os.path.join(__path__[0], name.rpartition(".")[2] + ".py")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = None
        if text is None or _DEFINES_PROBE.search(text):
            out.append(name)
    return out


def _probe_modules() -> dict[str, list[str]]:
    """{probe module: its public names}; a name exported twice, or one that would hide a
    module of this package, is refused."""
    found: dict[str, list[str]] = {}
    owner: dict[str, str] = {name: __name__ for name in __all__}
    modules = {m.rpartition(".")[2] for m in _submodules(__name__)}
    for mod_name in _probe_module_names():
        mod = _importlib.import_module(mod_name)
        if not any(isinstance(o, type) and issubclass(o, Probe) and o is not Probe
                   and o.__module__ == mod_name for o in vars(mod).values()):
            continue
        names = public_names(mod)
        for n in names:
            if n in owner or n in modules:
                raise ImportError(f"{mod_name} exports {n!r}, already "
                                  + (f"exported by {owner[n]}" if n in owner else
                                     f"the name of the module {__name__}.{n}")
                                  + "; rename it or leave it out of its __all__")
            owner[n] = mod_name
        found[mod_name] = names
    return found


#: every probe module of the package -> its public names (exported below and by tl_spectral)
PROBE_MODULES: dict[str, list[str]] = _probe_modules()

globals().update({n: getattr(_importlib.import_module(m), n)
                  for m, names in PROBE_MODULES.items() for n in names})

__all__ += [n for names in PROBE_MODULES.values() for n in names]
__all__.sort()

#: old names of the probe classes, deprecated (docs/api.md, "Deprecated spellings")
__getattr__ = module_getattr(__name__, {
    "AttentionStats": ("AttentionStatsProbe", "tl_spectral.probes.attention_stats"),
    "HeadScores": ("HeadScoresProbe", "tl_spectral.probes.head_scores"),
})
