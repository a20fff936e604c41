"""The only place a verdict label is made (issue 38; DESIGN.md "claims as data").

Every label in the reproduction docs, their claim tables, the verdict records and the prose
quoted from them comes from a function here applied to numbers:

* :func:`sign` — the sign rule, once: the 95% interval against a threshold on the claim's
  side, with an optional *practical* margin where a sign alone would pass any nonzero
  difference (the margin and its source are part of the claim's declaration);
* :func:`steps` — a claim made of steps: "partly" only when at least one step holds and
  none is reversed;
* :func:`count` — a count over layers, models or seeds;
* :func:`select_layers` — a selection (e.g. sink layers) by the documented interval rule,
  with :func:`split_windows` to select on one half of the windows and test on the other;
* :func:`first_collapse` / :func:`removal_class` — the ablation thresholds;
* :data:`NOT_COMPARABLE` — a claim about another model class (S–D-only claims on standard
  attention) gets no reproduction label, only its number.

Labels are plain words (:data:`LABELS`); a doc may render them (bold, a reason after a
colon) through :func:`display`, never re-decide them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

LEVEL = 0.95

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_DISTINGUISHABLE = "not distinguishable"
PARTLY = "partly"
NOT_COMPARABLE = "not comparable"
NOT_TESTED = "not tested"
NOT_MEASURED = "not measured"
NOT_YET_MEASURED = "not yet measured"
DESCRIPTIVE = "descriptive"
MIXED = "mixed"
TIE = "tie by construction"
LABELS = (REPRODUCED, NOT_REPRODUCED, NOT_DISTINGUISHABLE, PARTLY, MIXED, NOT_COMPARABLE,
          NOT_TESTED, NOT_MEASURED, NOT_YET_MEASURED, DESCRIPTIVE)

SIGN_RULE = ("reproduced when the 95% interval lies wholly on the claim's side of the "
             "threshold, not reproduced when it lies wholly on the other side, else not "
             "distinguishable")
PRACTICAL_RULE = ("with a practical margin m: reproduced when the interval lies wholly beyond "
                  "threshold ± m on the claim's side, not reproduced when it lies wholly short "
                  "of it (the effect, if any, is smaller than m), else not distinguishable")
STEPS_RULE = ("reproduced when every step holds, not reproduced when a step is reversed, "
              "partly when at least one step holds and none is reversed, else not "
              "distinguishable")
SELECT_RULE = ("a layer is selected when its 95% interval lies wholly above the threshold "
               "(the point estimate alone does not select)")
CATASTROPHIC_REL = 1.0
"""Relative ΔPPL from which a removal counts as catastrophic / a model as collapsed (the PPL
at least doubles)."""
CHEAP_REL = 0.10
"""Relative ΔPPL below which a removal counts as cheap (char-model ablation tables)."""


def _lo_hi(iv: Mapping[str, Any]) -> tuple[float, float]:
    try:
        lo, hi = float(iv["low"]), float(iv["high"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"an interval needs 'low' and 'high', got {iv!r}") from e
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"not an interval: low {lo}, high {hi}")
    return lo, hi


def sign(iv: Mapping[str, Any] | None, threshold: float = 0.0, *, above: bool,
         practical: float = 0.0) -> str:
    """The sign rule (:data:`SIGN_RULE`, with :data:`PRACTICAL_RULE` when ``practical`` > 0).

    Args:
        iv: ``{"low", "high"}`` (e.g. a 95% bootstrap interval); None → :data:`NOT_TESTED`.
        threshold: the value the claim is compared with.
        above: the claim is "value > threshold" (True) or "value < threshold" (False).
        practical: a margin ≥ 0; the claim then needs the interval beyond threshold ± margin,
            and an interval wholly short of that margin is "not reproduced" (too small).

    Returns:
        One of :data:`REPRODUCED`, :data:`NOT_REPRODUCED`, :data:`NOT_DISTINGUISHABLE`,
        :data:`NOT_TESTED`.
    """
    if iv is None:
        return NOT_TESTED
    if practical < 0:
        raise ValueError(f"practical margin must be >= 0, got {practical}")
    lo, hi = _lo_hi(iv)
    if not above:
        lo, hi, threshold = -hi, -lo, -threshold
    edge = threshold + practical
    if lo > edge:
        return REPRODUCED
    if (hi < edge) if practical else (hi < threshold):
        return NOT_REPRODUCED
    return NOT_DISTINGUISHABLE


def two_sided(iv: Mapping[str, Any] | None, threshold: float = 0.0, *,
              practical: float = 0.0) -> str:
    """"The value differs from ``threshold``" by at least ``practical``: reproduced when the
    interval lies wholly outside threshold ± practical, not reproduced when it lies wholly
    inside (a difference, if any, below the margin; with no margin this never happens),
    else not distinguishable."""
    if iv is None:
        return NOT_TESTED
    up = sign(iv, threshold, above=True, practical=practical)
    down = sign(iv, threshold, above=False, practical=practical)
    if REPRODUCED in (up, down):
        return REPRODUCED
    if practical and up == down == NOT_REPRODUCED:
        return NOT_REPRODUCED
    return NOT_DISTINGUISHABLE


def steps(labels: Sequence[str]) -> str:
    """:data:`STEPS_RULE` over step labels (ties by construction count as untestable)."""
    testable = [x for x in labels if x != TIE]
    if any(x == NOT_REPRODUCED for x in testable):
        return NOT_REPRODUCED
    if testable and all(x == REPRODUCED for x in testable) and len(testable) == len(labels):
        return REPRODUCED
    if any(x == REPRODUCED for x in testable):
        return PARTLY
    return NOT_DISTINGUISHABLE


def over_layers(labels: Sequence[str]) -> str:
    """Per-layer sign labels → one label: reproduced when every layer holds; partly when
    some hold and none is reversed; :data:`MIXED` when some hold and some are reversed;
    not reproduced when none holds and some are reversed; else not distinguishable."""
    hold = sum(x == REPRODUCED for x in labels)
    rev = sum(x == NOT_REPRODUCED for x in labels)
    if not labels:
        return NOT_TESTED
    if hold == len(labels):
        return REPRODUCED
    if hold and rev:
        return MIXED
    if hold:
        return PARTLY
    return NOT_REPRODUCED if rev else NOT_DISTINGUISHABLE


def at_least_one(hits: Sequence[bool]) -> str:
    """An existence claim: reproduced when at least one item holds."""
    return REPRODUCED if any(hits) else NOT_REPRODUCED


def count(hits: Sequence[bool]) -> str:
    """A count: reproduced in every item, not reproduced in none, else partly."""
    k, n = sum(bool(h) for h in hits), len(hits)
    if n == 0:
        return NOT_TESTED
    return REPRODUCED if k == n else NOT_REPRODUCED if k == 0 else PARTLY


def select_layers(ivs: Sequence[Mapping[str, Any]], threshold: float,
                  layer_ids: Sequence[int] | None = None) -> list[int]:
    """:data:`SELECT_RULE`: the layers (ids) whose interval lies wholly above ``threshold``."""
    ids = list(range(len(ivs))) if layer_ids is None else list(layer_ids)
    if len(ids) != len(ivs):
        raise ValueError(f"{len(ivs)} intervals for {len(ids)} layer ids")
    return [i for i, iv in zip(ids, ivs) if _lo_hi(iv)[0] > threshold]


def split_windows(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Two disjoint halves of ``n`` windows (a seeded permutation): select on the first,
    test on the second, so that a selection is never tested on the data that chose it."""
    if n < 2:
        raise ValueError(f"a split needs at least 2 windows, got {n}")
    import random

    order = list(range(n))
    random.Random(seed).shuffle(order)
    h = n // 2
    return sorted(order[:h]), sorted(order[h:])


def first_collapse(rel: Mapping[int, Mapping[str, Any] | float]) -> int | None:
    """The first k ≥ 1 whose relative ΔPPL is at least :data:`CATASTROPHIC_REL` (the PPL
    doubles): with an interval, its lower end; without one, the number (None: never)."""
    for k in sorted(rel):
        v = rel[k]
        x = float(v["low"]) if isinstance(v, Mapping) else float(v)
        if k and x >= CATASTROPHIC_REL:
            return k
    return None


def removal_class(rel: float) -> str:
    """catastrophic (≥ :data:`CATASTROPHIC_REL`), cheap (< :data:`CHEAP_REL`), else costly."""
    if rel >= CATASTROPHIC_REL:
        return "catastrophic"
    if rel < CHEAP_REL:
        return "cheap"
    return "costly"


def not_comparable(reason: str) -> str:
    """The label of a claim about another model class: no reproduction verdict."""
    return f"{NOT_COMPARABLE}: {reason}"


def base(label: str) -> str:
    """The rule's word of a label (``"partly: …"`` → ``"partly"``; bold removed)."""
    s = label.replace("**", "").strip()
    for w in sorted(LABELS, key=len, reverse=True):
        if s.startswith(w):
            return w
    return s


def display(label: str, *, bold_negative: bool = True) -> str:
    """A label as the paper docs print it: "not reproduced" in bold."""
    if bold_negative and label.startswith(NOT_REPRODUCED):
        return f"**{NOT_REPRODUCED}**" + label[len(NOT_REPRODUCED):]
    return label
