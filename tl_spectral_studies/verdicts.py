"""Table helpers of the reproduction docs over the one rules module
(:mod:`tl_spectral_studies.claims.rules`, where every label is made): the paper docs'
wording of a label (:func:`paper_label`), claim-table rows, intervals over heads and the
tests over layers; each rule is stated in words beside it (the ``*_RULE`` strings, printed
under the tables).

A claim table is a list of :class:`Row` (claim, model, number, label, rule). The generator of
a doc renders the table *and* every section's verdict line from the same rows
(:func:`table`, :func:`verdict_line`), so the two cannot disagree.

Adding a model (a new column or rows, e.g. SmolLM2): each claim is one rule applied to one
model's committed results, so a model is one entry in the doc's model list plus its result
files, and every claim it has data for gets its cell from the same rule —

- scale-pod (columns): ``scale_pod.VERDICT_RUNS`` ((model, N) → column label; a run on
  overlapping windows is made descriptive by :func:`~tl_spectral_studies.scale_pod.overlapping`)
  and the run's ``scale_pod_<model>_N<n>.json``;
- routing (rows per model): ``routing.STANDARD_MODELS`` (model → its Gaussian baseline in
  ``summary.json``) and ``<model>_heads.csv`` from ``tl-spectral study routing``;
- contributions (rows per model): ``contributions.COMMANDS`` / ``MODEL_LABEL`` and the
  model's ``<slug>_summary.json``;
- surgery: the claims are about trained S–D / softmax pairs of one recipe; a pretrained
  model has no row there.

A real decoder (SmolLM2-135M, and the next one) is a *column* instead: one entry in
``tl_spectral_studies/claims/models.py``; the claims registry (:mod:`tl_spectral_studies.
claims`) evaluates every declared claim on its results, and
:func:`tl_spectral_studies.smol_column.add_columns` appends one column per such model to the
four claim tables through each doc's ``SMOL_IDS`` (claim row → claim ids, None = not
measured). The routing rows' ``STANDARD_MODELS`` and the B.rank rule are the registry's
(:mod:`tl_spectral_studies.claims.seed002`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tl_spectral_studies.claims import rules

LEVEL = 0.95
ALPHA = 0.05

REPRODUCED = "reproduced"
NOT_REPRODUCED = "**not reproduced**"
NOT_DISTINGUISHABLE = "not distinguishable at this size"
DOES_NOT_APPLY = "does not apply"
DESCRIPTIVE = "descriptive"

SIDE_RULE = ("reproduced when the 95% interval lies wholly on the claim's side of the threshold, "
             "not reproduced when it lies wholly on the other side, else not distinguishable")
HEADS_RULE = ("intervals over heads: 95% t-interval of the head mean (mean ± t(0.975, n − 1) · "
              "sd / √n), honest at 8 heads per layer where a percentile bootstrap over 8 values "
              "under-covers")
MINIMUM_RULE = ("layer 0 is the minimum when a one-sided Welch t-test over heads puts its mean "
                "below every other layer's, each at 5% after Holm's correction for the L − 1 "
                "comparisons")
CATASTROPHIC_REL = rules.CATASTROPHIC_REL
CHEAP_REL = rules.CHEAP_REL
REMOVAL_RULE = (f"catastrophic: ΔPPL ≥ +{CATASTROPHIC_REL:.0%} (the PPL at least doubles); "
                f"cheap: below +{CHEAP_REL:.0%}; costly in between")


@dataclass
class Row:
    """One row of a claim table: ``key`` names it (the section verdict lines use it)."""

    key: str
    claim: str
    model: str
    number: str
    label: str
    uncertainty: str = ""


def table(rows: Sequence[Row], header: Sequence[str], *, uncertainty: bool = False) -> str:
    """The markdown claim table of ``rows`` under ``header`` (4 columns, or 5 with the
    ``uncertainty`` column before the verdict)."""
    n = len(header)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * n]
    for r in rows:
        cells = [r.claim, r.model, r.number] + ([r.uncertainty] if uncertainty else []) + [r.label]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def verdict_line(rows: Sequence[Row], key: str) -> str:
    """The verdict line of a section: every row with ``key``, as ``model: label`` — the same
    text the claim table shows."""
    hit = [r for r in rows if r.key == key]
    if not hit:
        raise KeyError(f"no claim row {key!r}")
    if len(hit) == 1:
        return f"**Verdict** (claim table: {hit[0].claim}; {hit[0].model}): {hit[0].label}."
    return ("**Verdict** (the claim table's rows for this claim):\n\n"
            + "\n".join(f"- {r.claim} — {r.model}: {r.label}" for r in hit))


# ------------------------------------------------------------------ intervals
def t_quantile(dof: int, level: float = LEVEL) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.5 + level / 2, dof))


from tl_spectral.analysis.bootstrap import t_interval  # noqa: E402,F401  (statistics floor)


def side(iv: dict[str, float], threshold: float, *, below: bool = True) -> str:
    """:data:`SIDE_RULE`: the claim is "value < threshold" (``below``) or "value > threshold"."""
    return paper_label(rules.sign(iv, threshold, above=not below))


def paper_label(label: str) -> str:
    """A label of :mod:`tl_spectral_studies.claims.rules` in the paper docs' wording (the
    rule's word unchanged; bold and the reason for a negative, "at this size" for a tie)."""
    if label == rules.NOT_REPRODUCED:
        return NOT_REPRODUCED + " (the interval excludes the claim)"
    if label == rules.NOT_DISTINGUISHABLE:
        return NOT_DISTINGUISHABLE
    return label


# ------------------------------------------------------------------ tests over heads
def welch_less(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided p-value of Welch's t-test for mean(a) < mean(b)."""
    from scipy.stats import ttest_ind

    return float(ttest_ind(list(a), list(b), equal_var=False, alternative="less").pvalue)


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected at family-wise level ``alpha``."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m = len(pvalues)
    rejected = [False] * m
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def layer0_minimum(per_layer: Sequence[Sequence[float]], alpha: float = ALPHA) -> str:
    """:data:`MINIMUM_RULE` on per-head values ``per_layer[layer] = [head values]``."""
    if len(per_layer) < 2:
        raise ValueError(f"a layer-0 verdict needs at least 2 layers, got {len(per_layer)}")
    p = [welch_less(per_layer[0], other) for other in per_layer[1:]]
    rej = holm(p, alpha)
    if all(rej):
        return "layer 0 is the minimum"
    means = [sum(x) / len(x) for x in per_layer]
    if means[0] < min(means[1:]):
        return (f"layer 0 is the lowest mean but not separated ({sum(rej)} of {len(rej)} "
                "comparisons after Holm)")
    return "no layer-0 minimum"


def layer0_minimum_descriptive(means: Sequence[float]) -> str:
    """Without per-head values (a stored summary holds only head means and percentile
    intervals over 8 heads): a description, not a test."""
    if means[0] < min(means[1:]):
        return "layer 0 has the lowest head mean (descriptive: no test)"
    return "layer 0 does not have the lowest head mean"


def monotone_rise(means: Sequence[float]) -> bool:
    """Every layer's mean above the previous layer's."""
    return all(b > a for a, b in zip(means, means[1:]))


# ------------------------------------------------------------------ ablations
def removal_class(rel: float) -> str:
    """:data:`REMOVAL_RULE` for one relative ΔPPL."""
    return rules.removal_class(rel)


def count_label(hits: Sequence[bool], what: str) -> str:
    """"reproduced in every …" / "in k of n …" / "not reproduced in any …"."""
    k, n = sum(bool(h) for h in hits), len(hits)
    if n and k == n:
        return f"{REPRODUCED} in every {what}"
    if k == 0:
        return f"{NOT_REPRODUCED} in any {what}"
    return f"reproduced in {k} of {n} {what}s"


def holm_note(n_tests: int) -> str:
    return (f"per-layer calls: 95% intervals each, no correction for the {n_tests} layers "
            f"(at least one false call in {n_tests} independent tests at 5% has probability "
            f"{1 - 0.95 ** n_tests:.0%} when no layer differs)")
