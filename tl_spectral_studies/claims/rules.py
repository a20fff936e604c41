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
  attention) gets no reproduction label, only its number;
* :func:`mde`, :func:`sensitivity`, :func:`panel_verdict`, :func:`one_framing` — the evidence
  of a record (issue 39): its minimum detectable effect, its robustness over the sensitivity
  panel, the record a complete panel gives, and the sensitivity of a record no panel tests.

Labels are plain words (:data:`LABELS`); a doc may render them (bold, a reason after a
colon) through :func:`display`, never re-decide them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
DEPENDS = "depends on"
"""A panel-backed label whose cells disagree (:func:`panel_verdict`)."""
TIE = "tie by construction"
LABELS = (REPRODUCED, NOT_REPRODUCED, NOT_DISTINGUISHABLE, PARTLY, MIXED, NOT_COMPARABLE,
          NOT_TESTED, NOT_MEASURED, NOT_YET_MEASURED, DESCRIPTIVE, DEPENDS)

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


# ------------------------------------------------------------ evidence (issue 39)
ROBUST = "robust"
MDE_RULE = ("minimum detectable effect at the sample's n: MDE = (z_{1−α/2} + z_{power}) · SE, "
            "α = 0.05, power 0.80 (z sum 2.80), with SE = (high − low) / (2 · z_{0.975}) "
            "from the 95% bootstrap interval")
SENSITIVITY_RULE = ("robust when the label is the same in every panel cell (a descriptive "
                    "label with its direction: \"descriptive: rises\" and \"descriptive: "
                    "falls\" differ); else \"depends on F\", naming every factor F whose "
                    "levels change the label while the other factors are held fixed; \"not "
                    "tested\" when no cell is tested")


def verdict_key(label: str) -> str:
    """What :func:`sensitivity` compares: the rule's word (:func:`base`), and for a
    descriptive label its direction too."""
    b = base(label)
    return label.replace("**", "").strip() if b == DESCRIPTIVE else b


def _z(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def se_from_interval(iv: Mapping[str, Any], level: float = LEVEL) -> float:
    """The standard error a normal interval of ``level`` of width ``high − low`` implies."""
    lo, hi = _lo_hi(iv)
    return (hi - lo) / (2.0 * _z(0.5 + level / 2.0))


def mde(iv: Mapping[str, Any] | None = None, *, se: float | None = None, alpha: float = 0.05,
        power: float = 0.80) -> float | None:
    """:data:`MDE_RULE`: the smallest true effect a two-sided test at ``alpha`` detects with
    probability ``power``, ``(z_{1−α/2} + z_{power}) · SE``; ``SE`` given or read from a 95%
    interval. None without either."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must lie in (0, 1), got {alpha}, {power}")
    if se is None:
        if iv is None:
            return None
        se = se_from_interval(iv)
    if se < 0 or math.isnan(se):
        raise ValueError(f"a standard error must be >= 0, got {se}")
    return (_z(1 - alpha / 2) + _z(power)) * se


def sensitivity(cells: Sequence[tuple[Mapping[str, Any], str]]) -> str:
    """:data:`SENSITIVITY_RULE` over ``(factors, label)`` pairs, one per panel cell (labels
    compared by their rule word, :func:`base`).

    A factor is named when two cells that differ in that factor only carry different labels;
    when the labels differ but no such pair exists (an incomplete panel), every factor that
    varies among the cells is named."""
    if not cells:
        return NOT_TESTED
    labels = {verdict_key(lab) for _, lab in cells}
    if labels == {NOT_TESTED}:
        return NOT_TESTED
    if len(labels) == 1:
        return ROBUST
    names = list(cells[0][0])
    for f, _ in cells:
        if list(f) != names:
            raise ValueError(f"every cell needs the same factors {names}, got {list(f)}")
    hits = []
    for name in names:
        groups: dict[tuple, set] = {}
        for f, lab in cells:
            rest = tuple((k, f[k]) for k in names if k != name)
            groups.setdefault(rest, set()).add((f[name], verdict_key(lab)))
        if any(len({lab for _, lab in g}) > 1 for g in groups.values()):
            hits.append(name)
    if not hits:
        hits = [n for n in names if len({f[n] for f, _ in cells}) > 1]
    return "depends on " + ", ".join(hits)


PANEL_RULE = ("a claim that the model's evidence panel tests with the same measure and rule "
              "takes its record from the panel once every cell has run: label = the cells' "
              "common label when the panel is robust, else the sensitivity with the label "
              "counts (\"depends on draw (reproduced in 17 of 18 cells, not reproduced in 1)\"); "
              "number = the range of the cell estimates; n = the per-cell n and the number of "
              "cells; interval = the lowest cell low to the highest cell high; MDE = the "
              "largest cell MDE. Until every cell has run, the record stays the study's and "
              "its sensitivity reads \"… so far (k of K cells)\"")
ONE_FRAMING_RULE = ("a real-decoder record no panel tests has the sensitivity \"not tested: "
                    "one framing (…)\", naming the first token, corpus and window draw its "
                    "results file records (\"not recorded\" where it records none: the "
                    "study's faithfulness.json and interventions.json were made before its "
                    "steps recorded first_token, corpus and window_seed; a rerun of the step "
                    "records them)")


@dataclass(frozen=True)
class PanelVerdict:
    """What :func:`panel_verdict` makes of one claim's panel cells."""

    complete: bool
    sensitivity: str
    """:func:`sensitivity` of the cells; "… so far (k of K cells)" while incomplete."""
    label: str
    """The record's label (:data:`PANEL_RULE`); meaningful once ``complete``."""
    cells: int
    cells_expected: int
    n: int | None
    """The smallest per-cell n (``n_max`` the largest)."""
    n_max: int | None
    estimates: tuple[float, float] | None
    """The lowest and highest cell estimate (None: the cells hold labels only)."""
    interval: tuple[float, float] | None
    """The lowest cell low and the highest cell high."""
    mde: float | None
    """The largest cell MDE."""
    counts: tuple[tuple[str, int], ...]
    """(label, number of cells), the most frequent first."""


def _label_counts(labels: Sequence[str]) -> tuple[tuple[str, int], ...]:
    c = Counter(verdict_key(x) for x in labels)
    order = {w: i for i, w in enumerate(LABELS)}
    return tuple(sorted(c.items(), key=lambda kv: (-kv[1], order.get(kv[0], len(order)),
                                                    kv[0])))


def panel_verdict(cells: Sequence[Mapping[str, Any]], cells_expected: int,
                  complete: bool = True) -> PanelVerdict:
    """:data:`PANEL_RULE` over one claim's panel cells.

    ``cells``: ``{"factors", "label", "n"}`` and, where the cell has an interval,
    ``"estimate", "low", "high"`` (``"mde"``: else from the interval by :func:`mde`);
    ``cells_expected``: the panel's size for this claim; ``complete``: the summary's own flag
    (both it and ``len(cells) >= cells_expected`` must hold). The sensitivity is
    :func:`sensitivity` of the cells (so a filtered subset of a summary's cells gets its own)."""
    if not cells:
        raise ValueError("a panel verdict needs at least one cell")
    k, K = len(cells), int(cells_expected)
    done = bool(complete) and k >= K
    sens = sensitivity([(c["factors"], c["label"]) for c in cells])
    counts = _label_counts([c["label"] for c in cells])
    if sens in (ROBUST, NOT_TESTED):
        label = Counter(c["label"] for c in cells).most_common(1)[0][0]
    else:
        label = f"{sens} (" + ", ".join(
            f"{w} in {n} of {k} cells" if i == 0 else f"{w} in {n}"
            for i, (w, n) in enumerate(counts)) + ")"
    if not done:
        sens = f"{sens} so far ({k} of {K} cells)"
    ivs = [c for c in cells if c.get("low") is not None and c.get("high") is not None]
    est = [float(c["estimate"]) for c in ivs if c.get("estimate") is not None]
    mdes = [float(c["mde"]) for c in cells if c.get("mde") is not None] + [
        mde(c) for c in ivs if c.get("mde") is None]  # a cell of steps: its largest step MDE
    ns = [int(c["n"]) for c in cells if c.get("n") is not None]
    return PanelVerdict(
        done, sens, label, k, K, min(ns) if ns else None, max(ns) if ns else None,
        (min(est), max(est)) if est else None,
        (min(float(c["low"]) for c in ivs), max(float(c["high"]) for c in ivs)) if ivs
        else None, max(mdes) if mdes else None, counts)


WEIGHTS_ONLY = "no framing: weights only"
WEIGHTS_ONLY_RULE = ("a record whose measure reads the weights alone (no window, corpus or "
                     "first token enters) has the sensitivity \"no framing: weights only "
                     "(…)\": no panel can move it, so it is neither robust nor one framing")


def weights_only(what: str) -> str:
    """:data:`WEIGHTS_ONLY_RULE`: the sensitivity of a record read from the weights alone."""
    return f"{WEIGHTS_ONLY} ({what})"


def one_framing(framing: str) -> str:
    """:data:`ONE_FRAMING_RULE`: the sensitivity of a record no panel tests."""
    return f"{NOT_TESTED}: one framing ({framing or 'not recorded'})"
