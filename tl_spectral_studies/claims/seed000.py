"""Seed 000 (arXiv 2606.06573, SPEC A): scale-selective POD of attention fields — the claims.

Measures read ``scales.json`` of ``tl-spectral study real-decoder``. The band cut-offs
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

BAND_NOTE = ("band cut-offs a ≤ 7 and a ≥ 20 are the char model's (tokens = characters), "
             "applied unchanged to BPE tokens (*choice*)")


def _hstar(x: Any) -> int | None:
    try:
        return int(str(x).lstrip(">≥ ").split("–")[0])
    except ValueError:
        return None


def _m(iv: dict | None, number: str, label: str, n: int | None = None,
       note: str = "") -> Measurement:
    return Measurement(number, label, None if iv is None else float(iv["estimate"]),
                       None if iv is None else (float(iv["low"]), float(iv["high"])), n, note)


def bands(res: Results) -> Measurement | None:
    sc = res.json("scales")
    if sc is None:
        return None
    tb, b = sc["table"], sc["bootstrap"]
    e0, eL = b["layers"][0]["E_fine_minus_coarse"], b["layers"][-1]["E_fine_minus_coarse"]
    st = [rules.sign(e0, 0.0, above=True), rules.sign(eL, 0.0, above=False)]
    return _m(e0, f"E fine − E coarse: layer {tb[0]['layer']} {fmt_interval(e0, '{:+.2f}')} "
              f"(fine > coarse: {st[0]}), layer {tb[-1]['layer']} {fmt_interval(eL, '{:+.2f}')} "
              f"(coarse > fine: {st[1]})", rules.steps(st), sc["n_docs"], BAND_NOTE)


def hstar(res: Results) -> Measurement | None:
    sc = res.json("scales")
    if sc is None:
        return None
    tb, N = sc["table"], sc["n_docs"]
    hs = [_hstar(row["H_star"]) for row in tb]
    flagged = any("H_star_bounded" in row for row in tb)
    # the library's one rule where the results carry it (H* ≥ h_star_bound(N): a 1/k
    # spectrum's H*, which grows with N), else the older rule of H* at N − 1
    bound = sum(1 for row, h in zip(tb, hs) if (row.get("H_star_bounded") if flagged else
                                                 h is not None and h >= N - 1))
    where = (f"bounded by N (H* ≥ {_bound(N)}, tl_spectral's h_star_bounded)" if flagged
             else "at the bound N − 1")
    jk = sc["bootstrap"]["jackknife"]["last_minus_first"]["H_star"]
    lab = (f"{rules.NOT_TESTED}: H* bounded by N" if bound else
           rules.sign(jk, 0.0, above=False) + (
               " (zero-width jackknife interval: every replicate gives the same counts; not "
               "certainty)" if jk["low"] == jk["high"] else ""))
    return _m(jk, f"H* first {tb[0]['H_star']}, last {tb[-1]['H_star']} of N = {N}; last − first "
              f"{fmt_interval(jk, '{:+.1f}')} (jackknife); {bound} layers {where}",
              lab, N)


def _bound(n: int) -> int:
    from tl_spectral.analysis.scale_pod import h_star_bound

    return h_star_bound(n)


def tspec(res: Results) -> Measurement | None:
    sc = res.json("scales")
    if sc is None:
        return None
    jt = sc["bootstrap"]["jackknife"]["last_minus_first"]["T_spec_99"]
    up, down = rules.sign(jt, 0.0, above=True), rules.sign(jt, 0.0, above=False)
    word = "rises" if up == rules.REPRODUCED else "falls" if down == rules.REPRODUCED else \
        "no change distinguishable"
    return _m(jt, f"T_spec (99% fit) last − first {fmt_interval(jt, '{:+.3g}')} (jackknife)",
              f"{rules.DESCRIPTIVE}: {word}", sc["n_docs"])


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
            "two steps by the sign rule — first layer fine > coarse, last layer coarse > fine "
            "— then " + rules.STEPS_RULE + "; " + BAND_NOTE, bands))
claim(Claim("A.hstar", P, "A.8", "H*(0.1) higher early than late (paper: > 150 vs ≈ 91 at "
            "N = 150)", "sign rule on last − first (jackknife interval); not tested when a "
            "layer's H* is bounded by N (tl_spectral's h_star_bounded where the results "
            "flag it, else H* at N − 1: a statistic bounded by N carries no verdict)", hstar))
claim(Claim("A.tspec", P, "A.7", "T_spec changes with depth", "descriptive (the papers' "
            "direction is contradicted within its own summary, SPEC A.7): the sign of the "
            "jackknife interval", tspec))
claim(Claim("A.alloc", P, "A.10", "head allocation ∝ H* differs from the uniform allocation",
            "no rule: an allocation is advice until a model trained with it is compared (not "
            "done here)", alloc))
