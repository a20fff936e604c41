"""Composable probes that run inside one TransformerLens forward pass.

A probe needs no registration to run (pass it to ``run_probes``). Probe classes end in
``Probe``; their results are :class:`~tl_spectral.results.Result` kinds. Adding a built-in probe:
one new module here, one import line below and one line in ``tl_spectral._PUBLIC`` (and
docs/api.md); see docs/probes.md.
"""

from tl_spectral._deprecation import module_getattr
from tl_spectral.probes.attention_stats import AttentionStatsProbe, AttentionStatsResult
from tl_spectral.probes.base import LayerCapture, Probe, merge_tensor, reduce_state
from tl_spectral.probes.contributions import ContributionProbe, ContributionStats
from tl_spectral.probes.fields import (
    AttentionFieldProbe,
    AttentionFields,
    StreamedAttentionFields,
)
from tl_spectral.probes.head_scores import HeadScoresProbe, HeadScoresResult
from tl_spectral.probes.runner import (
    Corpus,
    ProbeRun,
    as_corpus,
    run_probes,
    run_probes_on_cache,
    run_probes_with_logits,
)
from tl_spectral.probes.sinks import SinkProbe, SinkStats

__all__ = [
    "AttentionFieldProbe",
    "AttentionFields",
    "StreamedAttentionFields",
    "AttentionStatsProbe",
    "AttentionStatsResult",
    "ContributionProbe",
    "ContributionStats",
    "HeadScoresProbe",
    "HeadScoresResult",
    "SinkProbe",
    "SinkStats",
    "Corpus",
    "LayerCapture",
    "Probe",
    "ProbeRun",
    "as_corpus",
    "merge_tensor",
    "reduce_state",
    "run_probes",
    "run_probes_on_cache",
    "run_probes_with_logits",
]

#: old names of the probe classes, deprecated (docs/api.md, "Deprecated spellings")
__getattr__ = module_getattr(__name__, {
    "AttentionStats": ("AttentionStatsProbe", "tl_spectral.probes.attention_stats"),
    "HeadScores": ("HeadScoresProbe", "tl_spectral.probes.head_scores"),
})
