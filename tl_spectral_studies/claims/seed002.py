"""Seed 002 (arXiv 2605.18826, SPEC B): routing and filtering; S–D attention — the claims.

The S–D paper's claims about S–D models (the cascade of S's rank over depth, zero-shot
linearization of the first layers) are declared for S–D models only: on standard attention
they are "not comparable" (their number is still shown). Measures read ``routing.json`` /
``interventions.json`` of ``tl-spectral study real-decoder``, or for the char models and
MiniLM ``docs/results/routing/<name>_heads.csv`` and ``summary.json``.
"""

from __future__ import annotations

import json
from typing import Any

from tl_spectral_studies._common import fmt_interval
from tl_spectral_studies.claims import rules
from tl_spectral_studies.claims.registry import SD, STANDARD, Claim, Measurement, Results, claim

FAR_BELOW_CAPACITY = 0.5
"""Routing rank "far below capacity": at most this share of min(2·d_head, d_model) (*choice*;
the paper gives no number)."""
CHEAP = 0.05
"""A removal is cheap when the upper end of its paired interval of PPL'/PPL − 1 is below
this (+5%, the surgery paper's tolerance for linearization)."""
PAPER_COLLAPSE_K = 3
SD_ONLY = ("the claim is made for S–D attention (the S matrix's rank, linearization of an S–D "
           "model); this model has standard attention, where the paper itself expects "
           "otherwise")


def _iv(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(d[k]) for k in ("estimate", "low", "high")}


def _m(iv: dict | None, number: str, label: str, n: int | None = None) -> Measurement:
    return Measurement(number, label, None if iv is None else float(iv["estimate"]),
                       None if iv is None else (float(iv["low"]), float(iv["high"])), n)


#: The standard-attention models of the routing study with the Gaussian kernel of the same
#: shape (``docs/results/routing/summary.json`` "baselines").
STANDARD_MODELS = {"minilm": "gaussian_384_12_32", "char-shakespeare": "gaussian_128_8_16",
                   "char-shakespeare-noln": "gaussian_128_8_16"}


def _paper_heads(res: Results) -> tuple[list[dict], dict] | None:
    """(per-head rows, Gaussian baseline) of a paper-layout model."""
    import csv

    name = res.model.slugs.get("routing")
    if name is None or name not in STANDARD_MODELS:
        return None
    d = res.path("routing")
    p = d / f"{name}_heads.csv"
    if not p.is_file():
        return None
    with p.open(newline="") as fh:
        h = list(csv.DictReader(fh))
    s = json.loads((d / "summary.json").read_text(encoding="utf-8"))
    return h, s["baselines"][STANDARD_MODELS[name]]


def _head_iv(h: list[dict], col: str) -> dict:
    from tl_spectral.analysis.bootstrap import t_interval

    return t_interval([float(r[col]) for r in h])


def budget(key: str):
    """Routing fraction < 0.5 (Δ = 0, or over the causal offsets of a rotary model)."""
    def measure(res: Results) -> Measurement | None:
        r = res.json("routing")
        if r is not None:
            iv, g, n = r[key], r["gaussian"][key], r["n_heads_total"]
        elif key == "routing_fraction_delta0" and (ph := _paper_heads(res)):
            h, base = ph
            iv, g, n = _head_iv(h, "routing_fraction"), base["routing_fraction_mean"], len(h)
        else:
            return None
        return _m(iv, f"routing fraction {fmt_interval(iv)} over {n} heads; Gaussian kernel "
                  f"{g:.3f}", rules.sign(iv, 0.5, above=False), n)
    return measure


def rank_label(iv: dict, random_rank: float, capacity: float) -> tuple[str, list[str]]:
    """Two steps — below a random kernel's rank; far below capacity — by :func:`rules.steps`."""
    st = [rules.sign(iv, random_rank, above=False),
          rules.sign(iv, FAR_BELOW_CAPACITY * capacity, above=False)]
    return rules.steps(st), st


def rank(res: Results) -> Measurement | None:
    r = res.json("routing")
    if r is not None:
        iv, cap, g, n = r["eff_rank_R_delta0"], r["capacity"], r["gaussian"]["eff_rank_R_delta0"], \
            r["n_heads_total"]
    elif ph := _paper_heads(res):
        h, base = ph
        iv, cap, g, n = (_head_iv(h, "eff_rank_R"), float(h[0]["routing_capacity"]),
                         base["rank_R_mean"], len(h))
    else:
        return None
    lab, st = rank_label(iv, g, cap)
    return _m(iv, f"entropy rank of R {fmt_interval(iv)} of {cap:.0f} "
              f"({100 * iv['estimate'] / cap:.0f}% of capacity); Gaussian kernel {g:.1f}; "
              f"below the random kernel: {st[0]}; at most {FAR_BELOW_CAPACITY:.0%} of "
              f"capacity: {st[1]}", lab, n)


def depth(res: Results) -> Measurement | None:
    r = res.json("routing")
    if r is None:
        return None
    iv = r["depth_effect_rank_R"]
    return _m(iv, f"rank of R, last third − first third of the layers "
              f"{fmt_interval(iv, '{:+.3g}')}", rules.sign(iv, 0.0, above=True),
              r["n_heads_total"])


def _lin(res: Results) -> dict[int, dict] | None:
    it = res.json("interventions")
    return None if it is None else {row["k"]: row for row in it["linearization"]}


def linear(res: Results) -> Measurement | None:
    lin = _lin(res)
    if not lin:
        return None
    ks = sorted(lin)
    kmax = 0
    for k in ks:
        if lin[k]["high"] >= CHEAP:
            break
        kmax = k
    return _m(lin[ks[0]], "PPL'/PPL − 1: " + "; ".join(
        f"k = {k}: {fmt_interval(lin[k], '{:+.3g}')}" for k in ks[:4])
        + f"; largest k within +{CHEAP:.0%}: {kmax}",
        rules.REPRODUCED if kmax >= 4 else rules.NOT_REPRODUCED,
        res.json("interventions")["n_docs"])


def collapse(res: Results) -> Measurement | None:
    lin = _lin(res)
    if not lin:
        return None
    k = rules.first_collapse(lin)
    lab = (rules.REPRODUCED if k == PAPER_COLLAPSE_K else
           f"{rules.NOT_REPRODUCED}: " + ("no collapse" if k is None else
                                          f"collapse at k = {k}, "
                                          + ("earlier" if k < PAPER_COLLAPSE_K else "later")))
    return _m(lin.get(k) if k else None, "PPL'/PPL − 1: " + "; ".join(
        f"k = {x}: {fmt_interval(lin[x], '{:+.3g}')}" for x in sorted(lin) if 0 < x <= 3)
        + f"; first k with the interval at or above +100%: {k}", lab,
        res.json("interventions")["n_docs"])


def inversion_steps(row: dict) -> list[str]:
    """(routing removal costs less than filtering removal, routing removal is cheap)."""
    return [rules.sign(row["log_ppl_routing_removed_minus_filtering_removed"], 0.0, above=False),
            rules.sign(row["keep_filtering"], CHEAP, above=False)]


def inversion(res: Results) -> Measurement | None:
    it = res.json("interventions")
    if it is None:
        return None
    a = it["removal"]["all layers"]
    d = a["log_ppl_routing_removed_minus_filtering_removed"]
    st = inversion_steps(a)
    return _m(d, f"keep routing (filtering removed) {fmt_interval(a['keep_routing'], '{:+.3g}')}"
              f", keep filtering (routing removed) {fmt_interval(a['keep_filtering'], '{:+.3g}')}"
              f" (PPL'/PPL − 1); log PPL(routing removed) − log PPL(filtering removed) "
              f"{fmt_interval(d, '{:+.3g}')}; costs less: {st[0]}; cheap: {st[1]}",
              rules.steps(st), it["n_docs"])


def inversion_layers(res: Results) -> Measurement | None:
    from tl_spectral_studies.claims.seed003 import layer_list

    it = res.json("interventions")
    if it is None:
        return None
    single = {int(k.split()[-1]): v for k, v in it["removal"].items() if k != "all layers"}
    if not single:
        return None
    labs = {k: rules.steps(inversion_steps(v)) for k, v in single.items()}
    less = [k for k, v in single.items() if inversion_steps(v)[0] == rules.REPRODUCED]
    more = [k for k, v in single.items() if inversion_steps(v)[0] == rules.NOT_REPRODUCED]
    ok = [k for k, v in labs.items() if v == rules.REPRODUCED]
    return Measurement(f"{len(single)} layers: routing removal costs less in {len(less)} "
                       f"({layer_list(less)}), more in {len(more)} ({layer_list(more)}); both "
                       f"steps hold in {len(ok)} ({layer_list(ok)})",
                       rules.count([v == rules.REPRODUCED for v in labs.values()]),
                       n=it["n_docs"])


P = "seed 002"
LAYER_PANEL = ("its evidence panel crosses the first token only (the Wikipedia excerpt, draw "
               "0): two passes per layer, 60 per SmolLM2 cell, 36 per Gemma-3 cell")
claim(Claim("B.budget.routing_fraction_delta0", P, "B.1", "filtering dominates the spectral "
            "budget (routing fraction < 0.5), Δ = 0", "sign rule against 0.5 (interval over "
            "heads)", budget("routing_fraction_delta0")))
claim(Claim("B.budget.routing_fraction_causal", P, "B.1", "filtering dominates the spectral "
            "budget (routing fraction < 0.5), causal offset distribution", "sign rule against "
            "0.5 (interval over heads)", budget("routing_fraction_causal")))
claim(Claim("B.rank", P, "B.1", "routing runs at low rank, far below the capacity "
            "min(2·d_head, d_model)", "two steps by the sign rule — below an i.i.d. Gaussian "
            f"kernel's rank; at most {FAR_BELOW_CAPACITY:.0%} of capacity — then "
            + rules.STEPS_RULE, rank))
claim(Claim("B.depth", P, "B.3", "routing rank rises with depth (the cascade)",
            "sign rule on last third − first third against 0", depth, applies_to=frozenset({SD}),
            not_comparable=SD_ONLY))
claim(Claim("B.linear", P, "B.5", "early layers linearize zero-shot (first 4 layers within "
            "1.4%, first 7 < 5% of a 125 M S–D model)", "reproduced when linearizing the "
            "leading 4 layers stays within +5% (upper end of the paired interval, every k ≤ 4)",
            linear, applies_to=frozenset({SD}), not_comparable=SD_ONLY))
claim(Claim("B.collapse3", P, "B.5", "standard attention collapses under linearization from "
            "layer 3", "collapse = the first k whose PPL'/PPL − 1 is at or above +100% (the "
            "interval's lower end where there is one); reproduced when that k is 3",
            collapse, applies_to=frozenset({STANDARD}), not_comparable="the claim is about "
            "standard attention", panel="B.collapse3"))
claim(Claim("B.inversion", P, "B.4", "the inversion: in standard attention removing "
            "filtering is prohibitive, removing routing cheap (every layer at once)",
            "two steps by the sign rule — log PPL(routing removed) − log PPL(filtering "
            f"removed) < 0; routing removal cheap (upper end below +{CHEAP:.0%}) — then "
            + rules.STEPS_RULE, inversion, applies_to=frozenset({STANDARD}),
            not_comparable="the claim is about standard attention", panel="B.inversion"))
claim(Claim("B.inversion.layer", P, "B.4", "the inversion, one layer at a time",
            "the rule of B.inversion in each layer, then a count (no multiple-comparison "
            "correction, so descriptive)", inversion_layers, applies_to=frozenset({STANDARD}),
            not_comparable="the claim is about standard attention",
            no_interval="a count of layers, each labelled by its own intervals",
            panel="B.inversion.layer", caveat=LAYER_PANEL))
