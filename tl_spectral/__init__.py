"""tl_spectral: spectral and geometric analyses of attention as TransformerLens probes.

``import tl_spectral as tls`` gives the public surface (``tls.__all__``, one line each in
docs/api.md): the probes and ``run_probes``, the analyses a user calls directly, the model
zoo and the views. Names load on first use (PEP 562), so ``import tl_spectral`` stays cheap
and the command line starts fast. The probes' names are not listed here: every probe
module's public names (``tl_spectral.probes.PROBE_MODULES``) join ``_LISTED`` in ``_PUBLIC``
and ``__all__`` on the first look at them (which imports the probes). One convention per
thing (docs/api.md, "Conventions"): the token argument is ``tokens``, tables are
``to_rows()`` / ``to_frame()``, ``progress=None``, probe classes end in ``Probe``; the old
spellings (``_DEPRECATED`` below and docs/api.md, "Deprecated spellings") warn for one
release.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it, for everything but the probe modules (whose names
#: are derived: ``tl_spectral.probes.PROBE_MODULES``); ``_PUBLIC`` is this and those
_LISTED: dict[str, str] = {
    # running probes inside the user's forward pass
    "run_probes": "tl_spectral.probes.runner",
    "run_probes_on_cache": "tl_spectral.probes.runner",
    "run_probes_with_logits": "tl_spectral.probes.runner",
    "Probe": "tl_spectral.probes.base",
    "LayerCapture": "tl_spectral.probes.base",
    "ModelView": "tl_spectral.model_view",
    "load_model": "tl_spectral.models.loading",
    # data
    "document_windows": "tl_spectral.data.windows",
    "DocumentWindows": "tl_spectral.data.windows",
    "CharTokenizer": "tl_spectral.data.tokenizers",
    "tiny_shakespeare": "tl_spectral.data.corpora",
    "TokenFile": "tl_spectral.data.tokenfile",
    "write_token_file": "tl_spectral.data.tokenfile",
    # analyses called directly
    "contribution_weights": "tl_spectral.analysis.contributions",
    "layer_maps": "tl_spectral.probes.contributions",
    "faithfulness": "tl_spectral.probes.faithfulness",
    "sink_geometry": "tl_spectral.analysis.sinks",
    "zero_sink_value": "tl_spectral.probes.sinks",
    "scale_pod": "tl_spectral.analysis.scale_pod",
    "scale_pod_heads": "tl_spectral.analysis.scale_pod",
    "ScalePODOptions": "tl_spectral.analysis.scale_pod_options",
    "pod": "tl_spectral.analysis.pod",
    "qk_geometry": "tl_spectral.geometry.qk",
    "sd_geometry": "tl_spectral.geometry.qk",
    "model_qk_geometry": "tl_spectral.geometry.model",
    "model_sd_geometry": "tl_spectral.geometry.model",
    "rotary_qk_geometry": "tl_spectral.geometry.rotary",
    "RotarySpec": "tl_spectral.geometry.rotary",
    "model_rotary_geometry": "tl_spectral.geometry.model",
    "cascade_over_training": "tl_spectral.geometry.cascade",
    # the project's models and surgery
    "GPT": "tl_spectral.models.gpt",
    "GPTConfig": "tl_spectral.models.gpt",
    "to_transformer_lens": "tl_spectral.models.convert",
    "ablate": "tl_spectral.interventions.ablations",
    "ablation_table": "tl_spectral.interventions.ablations",
    "truncate_rank": "tl_spectral.interventions.ablations",
    "rank_truncation_curve": "tl_spectral.interventions.ablations",
    "linearize": "tl_spectral.interventions.surgery",
    "linearization_curve": "tl_spectral.interventions.surgery",
    "tl_linearization_curve": "tl_spectral.interventions.surgery",
    "cascade_allocation": "tl_spectral.interventions.surgery",
    # results and views
    "Result": "tl_spectral.results",
    "register_result": "tl_spectral.results",
    "contribution_view": "tl_spectral.viz.views",
    # the result kinds of the analyses (what they return; all derive from Result)
    "FaithfulnessResult": "tl_spectral.probes.faithfulness",
    "ContributionMaps": "tl_spectral.analysis.contributions",
    "SinkGeometry": "tl_spectral.analysis.sinks",
    "ScalePODResult": "tl_spectral.analysis.scale_pod",
    "ScalePODHeadsResult": "tl_spectral.analysis.scale_pod_heads",
    "PODResult": "tl_spectral.analysis.pod",
    "QKGeometry": "tl_spectral.geometry.qk",
    "SDGeometry": "tl_spectral.geometry.qk",
    "RotaryQKGeometry": "tl_spectral.geometry.rotary",
    "CascadeResult": "tl_spectral.geometry.cascade",
    "AblationResult": "tl_spectral.interventions.ablations",
    "RankTruncationCurve": "tl_spectral.interventions.ablations",
    "LinearizationCurve": "tl_spectral.interventions.surgery",
    "CascadeAllocation": "tl_spectral.interventions.surgery",
    "token_strings": "tl_spectral.viz.context",
}
#: old public names, deprecated for one release: old name -> (new name, module); each use
#: warns (docs/api.md, "Deprecated spellings")
_DEPRECATED: dict[str, tuple[str, str]] = {
    "AttentionStats": ("AttentionStatsProbe", "tl_spectral.probes.attention_stats"),
    "HeadScores": ("HeadScoresProbe", "tl_spectral.probes.head_scores"),
    "ProbeRun": ("ProbeRun", "tl_spectral.probes.runner"),
}
#: public submodules
_MODULES = {"zoo": "tl_spectral.models.zoo"}

# in a Jupyter kernel without ipywidgets: no "IProgress not found" TqdmWarning when
# TransformerLens imports tqdm.auto (see tl_spectral.progress)
importlib.import_module("tl_spectral.progress").quiet_tqdm_auto()


def _derive() -> None:
    """``_PUBLIC`` (name -> module) and ``__all__``: the listed names and every probe
    module's public names. Run on the first look at either, or at a name not listed: it
    imports ``tl_spectral.probes`` (torch), which ``import tl_spectral`` never does."""
    from tl_spectral.probes import PROBE_MODULES

    public = dict(_LISTED)
    for module, names in PROBE_MODULES.items():
        for name in names:
            if public.setdefault(name, module) != module:
                raise ImportError(f"tl_spectral.{name} is defined by both {public[name]} and "
                                  f"{module}; rename one")
    globals()["_PUBLIC"] = public
    globals()["__all__"] = sorted([*public, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:  # not cached: every use warns
        new, where = _DEPRECATED[name]
        from tl_spectral._deprecation import warn_deprecated

        warn_deprecated(f"tl_spectral.{name}", f"tl_spectral.{new}" if new != name else
                        "run_probes_with_logits, which returns (logits, results)")
        return getattr(importlib.import_module(where), new)
    if name in ("__all__", "_PUBLIC"):
        _derive()
        return globals()[name]
    if name in _MODULES:
        mod = importlib.import_module(_MODULES[name])
    elif name in _LISTED:
        mod = getattr(importlib.import_module(_LISTED[name]), name)
    elif not name.startswith("_") and name in _public():
        mod = getattr(importlib.import_module(_public()[name]), name)
    else:
        raise AttributeError(f"module 'tl_spectral' has no attribute {name!r}; the public "
                             "names are in tl_spectral.__all__ (docs/api.md)")
    globals()[name] = mod
    return mod


def _public() -> dict[str, str]:
    if "_PUBLIC" not in globals():
        _derive()
    return globals()["_PUBLIC"]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(globals().get("__all__") or __getattr__("__all__")))
