"""Composable probes that run inside one TransformerLens forward pass.

A probe needs no registration to run (pass it to ``run_probes``). Adding a built-in probe:
one new module here, one import line below and one line in ``tl_spectral._PUBLIC`` (and
docs/api.md); see docs/probes.md.
"""

from tl_spectral.probes.attention_stats import AttentionStats, AttentionStatsResult
from tl_spectral.probes.base import LayerCapture, Probe, merge_tensor, reduce_state
from tl_spectral.probes.contributions import ContributionProbe, ContributionStats
from tl_spectral.probes.fields import (
    AttentionFieldProbe,
    AttentionFields,
    StreamedAttentionFields,
)
from tl_spectral.probes.head_scores import HeadScores, HeadScoresResult
from tl_spectral.probes.runner import Corpus, ProbeRun, as_corpus, run_probes, run_probes_on_cache
from tl_spectral.probes.sinks import SinkProbe, SinkStats

__all__ = [
    "AttentionFieldProbe",
    "AttentionFields",
    "StreamedAttentionFields",
    "AttentionStats",
    "AttentionStatsResult",
    "ContributionProbe",
    "ContributionStats",
    "HeadScores",
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
]
