"""Seed 000 (arXiv 2606.06573, SPEC A): scale-selective POD of attention fields — the claims.

Measures read ``scales.json`` of ``tl-spectral study real-decoder`` (T_spec, the allocation)
and the depth-thirds result of ``tl-spectral study pod-depth`` (the bands and H*: the first
against the last third of the stack, depth as a fraction ``l/(L − 1)``). The band cut-offs
(fine a ≤ 7, coarse a ≥ 20 tokens) are the paper's, measured on a *character* model; on a
BPE model a token spans several characters, so the same cut-offs in tokens are longer spans
of text. We apply them unchanged (*choice*: the paper gives no rule to convert them) and say
so beside every band verdict.
"""

from __future__ import annotations

from typing import Any

from tl_spectral_studies._common import fmt_interval
from tl_spectral_studies.claims import rules
from tl_spectral_studies.claims.registry import Claim, Measurement, Results, claim
from tl_spectral_studies.claims.seed003 import layer_list

BAND_NOTE = ("band cut-offs a ≤ 7 and a ≥ 20 are the char model's (tokens = characters), "
             "applied unchanged to BPE tokens (*choice*)")


def _m(iv: dict | None, number: str, label: str, n: int | None = None,
       note: str = "") -> Measurement:
    return Measurement(number, label, None if iv is None else float(iv["estimate"]),
                       None if iv is None else (float(iv["low"]), float(iv["high"])), n, note)


THIRDS = ("depth as a fraction of the stack, l/(L − 1): the first third below 1/3, the last "
          "third from 2/3 (tl_spectral_studies.depth), so models of different depths are "
          "compared at equal fractions")
VARIANTS = {"zeroed": "the key-0 column zeroed", "renormalized": "rows renormalized without it"}


def _variants(d: dict[str, Any], labels: dict[str, str]) -> str:
    """The sink-column check of a depth-thirds result: the label of the paper's field (with the
    key-0 column) against the fields without it."""
    others = [v for v in d["variants"] if v != "with"]
    if all(labels[v] == labels["with"] for v in others):
        return "the same label with " + " and with ".join(VARIANTS.get(v, v) for v in others)
    return "; ".join(f"{VARIANTS.get(v, v)}: {labels[v]}" for v in others)


def _band_label(ivs: dict[str, Any]) -> tuple[str, list[str]]:
    st = [rules.sign(ivs["early"], 0.0, above=True), rules.sign(ivs["late"], 0.0, above=False)]
    return rules.steps(st), st


def bands(res: Results) -> Measurement | None:
    """E fine − E coarse (paper cut-offs, the field with the key-0 column) averaged over the
    first and the last third of the stack (:data:`THIRDS`), from ``tl-spectral study
    pod-depth``."""
    d = res.depth()
    if d is None:
        return None
    c = next(x for x in d["claims"] if x["id"] == "bands.paper")
    labels = {v: _band_label(c["intervals"][v])[0] for v in d["variants"]}
    lab, st = _band_label(c["intervals"]["with"])
    e, l_ = c["intervals"]["with"]["early"], c["intervals"]["with"]["late"]
    th = d["thirds"]
    mde = max(rules.mde(e), rules.mde(l_))
    return Measurement(
        f"E fine − E coarse, mean over the first third (layers {layer_list(th['early'])}) "
        f"{fmt_interval(e, '{:+.3f}')} (fine > coarse: {st[0]}), over the last third (layers "
        f"{layer_list(th['late'])}) {fmt_interval(l_, '{:+.3f}')} (coarse > fine: {st[1]}); "
        + _variants(d, labels), lab, float(e["estimate"]), (float(e["low"]), float(e["high"])),
        d["n_docs"], BAND_NOTE + "; interval: the first third's; MDE: the larger of the two "
        "steps'", mde)


def _hstar_label(d: dict[str, Any], vi: int) -> tuple[str, list[int]]:
    """The H* label of one field variant and the layers of the two thirds bounded by N."""
    from tl_spectral.analysis.scale_pod import h_star_bounded

    sp, N, th = d["spectrum"], d["n_docs"], d["thirds"]
    bound = [li for li in th["early"] + th["late"]
             if h_star_bounded(sp["layers"][vi][li][0]["estimate"], N)]
    jk = sp["late_minus_early"][vi][0]
    if bound:
        return f"{rules.NOT_TESTED}: H* bounded by N", bound
    return rules.sign(jk, 0.0, above=False) + (
        " (zero-width jackknife interval: every replicate gives the same counts; not "
        "certainty)" if jk["low"] == jk["high"] else ""), bound


def hstar(res: Results) -> Measurement | None:
    """H* of the last third − H* of the first third of the stack (:data:`THIRDS`), from
    ``tl-spectral study pod-depth``; not tested when a layer of the two thirds is bounded by
    N (tl_spectral's ``h_star_bounded``, computed from the stored H* and N)."""
    d = res.depth()
    if d is None:
        return None
    sp, N, th = d["spectrum"], d["n_docs"], d["thirds"]
    labels = {v: _hstar_label(d, vi)[0] for vi, v in enumerate(d["variants"])}
    lab, bound = _hstar_label(d, d["variants"].index("with"))
    vi = d["variants"].index("with")
    e, l_, jk = sp["early"][vi][0], sp["late"][vi][0], sp["late_minus_early"][vi][0]
    n_th = len(th["early"]) + len(th["late"])
    return _m(jk, f"H* mean over the first third (layers {layer_list(th['early'])}) "
              f"{e['estimate']:.1f}, over the last third (layers {layer_list(th['late'])}) "
              f"{l_['estimate']:.1f} of N = {N}; last − first third "
              f"{fmt_interval(jk, '{:+.2f}')} (jackknife); {len(bound)} of these {n_th} layers "
              f"bounded by N (H* ≥ {_bound(N)}, tl_spectral's h_star_bounded); "
              + _variants(d, labels), lab, N,
              "the pod-depth study's own table labels H* by the older bound N − 1"
              if bound and not all(h >= N - 1 for h in _hs(d, bound)) else "")


def _hs(d: dict[str, Any], layers: list[int]) -> list[float]:
    vi = d["variants"].index("with")
    return [d["spectrum"]["layers"][vi][li][0]["estimate"] for li in layers]


def _bound(n: int) -> int:
    from tl_spectral.analysis.scale_pod import h_star_bound

    return h_star_bound(n)


def tspec(res: Results) -> Measurement | None:
    """T_spec (99% fit) of the last third − the first third of the stack (:data:`THIRDS`),
    from ``tl-spectral study pod-depth`` when the model has it (issue 39 item 4: depth as a
    fraction of the stack); else the real-decoder study's last − first layer."""
    d = res.depth()
    if d is not None:
        c = next((x for x in d["claims"] if x["id"] == "tspec"), None)
        if c is not None:
            sp, th = d["spectrum"], d["thirds"]
            vi = d["variants"].index("with")
            e, l_, jt = sp["early"][vi][1], sp["late"][vi][1], sp["late_minus_early"][vi][1]
            return _m(jt, f"T_spec (99% fit) mean over the first third (layers "
                      f"{layer_list(th['early'])}) {e['estimate']:.3g}, over the last third "
                      f"(layers {layer_list(th['late'])}) {l_['estimate']:.3g}; last − first "
                      f"third {fmt_interval(jt, '{:+.3g}')} (jackknife); "
                      + _variants(d, c["labels"]), c["labels"]["with"], d["n_docs"])
    sc = res.json("scales")
    if sc is None:
        return None
    jt = sc["bootstrap"]["jackknife"]["last_minus_first"]["T_spec_99"]
    return _m(jt, f"T_spec (99% fit) last − first layer {fmt_interval(jt, '{:+.3g}')} "
              "(jackknife)", f"{rules.DESCRIPTIVE}: {_word(jt)}", sc["n_docs"])


def _word(iv: dict[str, Any]) -> str:
    up, down = rules.sign(iv, 0.0, above=True), rules.sign(iv, 0.0, above=False)
    return "rises" if up == rules.REPRODUCED else "falls" if down == rules.REPRODUCED else \
        "no change distinguishable"


def alloc(res: Results) -> Measurement | None:
    sc = res.json("scales")
    if sc is None:
        return None
    rec = [row["recommended_heads"] for row in sc["table"]]
    uni = sc["table"][0].get("uniform_heads")
    return Measurement(f"recommended heads per layer {rec} (uniform {uni})",
                       f"{rules.DESCRIPTIVE}: no trained test", n=sc["n_docs"])


P = "seed 000"
claim(Claim("A.bands", P, "A.4", "fine scales (a ≤ 7) early, coarse (a ≥ 20) late",
            "two steps by the sign rule on E fine − E coarse averaged over thirds of the "
            f"stack ({THIRDS}; the pod-depth study's field with the key-0 column) — first "
            "third fine > coarse, last third coarse > fine — then " + rules.STEPS_RULE + "; "
            + BAND_NOTE, bands, panel="A.bands", caveat=BAND_NOTE))
claim(Claim("A.hstar", P, "A.8", "H*(0.1) higher early than late (paper: > 150 vs ≈ 91 at "
            "N = 150)", "sign rule on H* of the last third − H* of the first third of the "
            f"stack ({THIRDS}; jackknife interval, the pod-depth study's field with the key-0 "
            "column); not tested when a layer of the two thirds has H* bounded by N "
            "(tl_spectral's h_star_bounded, H* ≥ h_star_bound(N), from the stored H* and N: "
            "a statistic bounded by N carries no verdict)", hstar, panel="A.hstar"))
claim(Claim("A.tspec", P, "A.7", "T_spec changes with depth", "descriptive (the papers' "
            "direction is contradicted within its own summary, SPEC A.7): the sign of the "
            "jackknife interval of T_spec of the last third − the first third of the stack "
            f"({THIRDS}; the pod-depth study's field with the key-0 column) where the model has "
            "the pod-depth study, else of the stack's last layer − its first", tspec,
            panel="A.tspec"))
claim(Claim("A.alloc", P, "A.10", "head allocation ∝ H* differs from the uniform allocation",
            "no rule: an allocation is advice until a model trained with it is compared (not "
            "done here)", alloc, no_interval="an allocation (recommended heads per layer) is "
            "advice, not an estimate with an error"))
