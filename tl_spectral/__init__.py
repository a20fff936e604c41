"""tl_spectral: spectral and geometric analyses of attention as TransformerLens probes.

``import tl_spectral as tls`` gives the public surface (``tls.__all__``, one line each in
docs/api.md): the probes and ``run_probes``, the analyses a user calls directly, the model
zoo and the views. Names load on first use (PEP 562), so ``import tl_spectral`` stays cheap
and the command line starts fast. One convention per thing (docs/api.md, "Conventions"): the
token argument is ``tokens``, tables are ``to_rows()`` / ``to_frame()``, ``progress=None``,
probe classes end in ``Probe``; the old spellings (``_DEPRECATED`` below and docs/api.md,
"Deprecated spellings") warn for one release.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_PUBLIC: dict[str, str] = {
    # running probes inside the user's forward pass
    "run_probes": "tl_spectral.probes.runner",
    "run_probes_on_cache": "tl_spectral.probes.runner",
    "run_probes_with_logits": "tl_spectral.probes.runner",
    "Probe": "tl_spectral.probes.base",
    "LayerCapture": "tl_spectral.probes.base",
    "AttentionStatsProbe": "tl_spectral.probes.attention_stats",
    "ContributionProbe": "tl_spectral.probes.contributions",
    "SinkProbe": "tl_spectral.probes.sinks",
    "AttentionFieldProbe": "tl_spectral.probes.fields",
    "HeadScoresProbe": "tl_spectral.probes.head_scores",
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
    # the result kinds (what the probes and analyses return; all derive from Result)
    "AttentionStatsResult": "tl_spectral.probes.attention_stats",
    "HeadScoresResult": "tl_spectral.probes.head_scores",
    "ContributionStats": "tl_spectral.probes.contributions",
    "SinkStats": "tl_spectral.probes.sinks",
    "AttentionFields": "tl_spectral.probes.fields",
    "StreamedAttentionFields": "tl_spectral.probes.fields",
    "FaithfulnessResult": "tl_spectral.probes.faithfulness",
    "SinkInterventionResult": "tl_spectral.probes.sinks",
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

__all__ = sorted([*_PUBLIC, *_MODULES, "__version__"])

# in a Jupyter kernel without ipywidgets: no "IProgress not found" TqdmWarning when
# TransformerLens imports tqdm.auto (see tl_spectral.progress)
importlib.import_module("tl_spectral.progress").quiet_tqdm_auto()


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:  # not cached: every use warns
        new, where = _DEPRECATED[name]
        from tl_spectral._deprecation import warn_deprecated

        warn_deprecated(f"tl_spectral.{name}", f"tl_spectral.{new}" if new != name else
                        "run_probes_with_logits, which returns (logits, results)")
        return getattr(importlib.import_module(where), new)
    if name in _MODULES:
        mod = importlib.import_module(_MODULES[name])
    elif name in _PUBLIC:
        mod = getattr(importlib.import_module(_PUBLIC[name]), name)
    else:
        raise AttributeError(f"module 'tl_spectral' has no attribute {name!r}; the public "
                             "names are in tl_spectral.__all__ (docs/api.md)")
    globals()[name] = mod
    return mod


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
