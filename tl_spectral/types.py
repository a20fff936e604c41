"""The mode strings of the public API as ``Literal`` types: one place that lists each
argument's allowed values (an editor completes them; a type checker checks them), and
which the functions validate against with a one-line error
(:func:`tl_spectral._deprecation.check_choice`). Importing this module needs no torch."""

from __future__ import annotations

from typing import Literal

#: ``mode`` of contributions (SPEC C.1): project on the layer output (``"inter"``) or on
#: each head's own output (``"intra"``)
ContributionMode = Literal["inter", "intra"]
#: ``level`` of :func:`~tl_spectral.probes.faithfulness.faithfulness`: a pair ranked by the
#: sum over heads and removed in every head (``"token"``), or per head (``"head"``)
FaithfulnessLevel = Literal["token", "head"]
#: ``scope`` of faithfulness: each query ranks its sources (``"query"``), or every pair of
#: a document's layer is ranked together (``"layer"``)
FaithfulnessScope = Literal["query", "layer"]
#: ``field`` of :class:`~tl_spectral.probes.fields.AttentionFieldProbe`: the per-pair map
#: whose lag field is captured (:mod:`tl_spectral.probes.pair_fields`)
FieldKind = Literal["attention", "contribution", "contribution_intra", "value_weighted",
                    "value_weighted_raw"]

__all__ = ["ContributionMode", "FaithfulnessLevel", "FaithfulnessScope", "FieldKind"]
