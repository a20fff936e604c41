"""Seed 003 (arXiv 2606.07604, SPEC C): contribution weights and sink geometry — the claims.

Measures read the committed results as data: for a real decoder (``layout="real_decoder"``)
``sinks.json`` / ``faithfulness.json`` of ``tl-spectral study real-decoder``; for the char
models and MiniLM (``layout="paper"``) ``docs/results/contributions/<slug>_summary.json``.
The per-layer claims use the library probe's per-layer intervals in both layouts (the same
measure and the same rule for every model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tl_spectral_studies._common import fmt_interval
from tl_spectral_studies.claims import rules
from tl_spectral_studies.claims.registry import Claim, Measurement, Results, claim

SINK_LAYER_MIN = 0.5
"""A sink layer: the interval of its mean α_i0 (start token in front) lies above this."""
RHO_SHARE = 0.5
"""ρ* < 1 holds when more than this share of queries have 0 < ρ* < 1 (*choice*: a majority)."""
TAIL_MARGIN = 0.05
TAIL_SOURCE = ("*our choice*: 5 points of output share, the 5% tolerance the surgery paper "
               "uses for 'within tolerance' (SPEC B.5); seed 003 gives no number, and a sign "
               "rule alone would call any nonzero difference a reproduction")
LAYERS_RULE = ("the sign rule in each layer, then over layers: reproduced when it holds in "
               "every layer, not reproduced when every layer is reversed or none holds and "
               "some are reversed, mixed when some hold and some are reversed, partly when "
               "some hold and none is reversed")

LAYERS_COUNT = "a count over layers, each layer labelled by its own 95% interval"


# ------------------------------------------------------------------ reading the results
def _setting(res: Results) -> dict | None:
    s = res.json("sinks")
    return None if s is None else s["settings"]["wiki_start"]


def _summary(res: Results) -> dict | None:
    slug = res.model.slugs.get("contributions")
    if slug is None:
        return None
    p = res.path(f"contributions/{slug}_summary.json")
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def _per_layer(res: Results, key: str) -> tuple[list[int], list[dict]] | None:
    """(layer ids, per-layer intervals) of one SinkProbe quantity, either layout."""
    st = _setting(res)
    if st is not None:
        p = st["probe"][key]
        lay = res.json("sinks")["layer_ids"]
        return lay, [{"estimate": p["estimate"][i], "low": p["low"][i], "high": p["high"][i]}
                     for i in range(len(lay))]
    s = _summary(res)
    if s is None or not s.get("sink_intervals") or key not in s["sink_intervals"][0]:
        return None
    return [r["layer"] for r in s["sink_intervals"]], [r[key] for r in s["sink_intervals"]]


def sink_layers(res: Results) -> list[int] | None:
    """The sink layers by the documented interval rule (:data:`SINK_LAYER_MIN`)."""
    st = _setting(res)
    if st is None:
        return None
    a = st["brute"]["attn0"]
    ivs = [{"low": lo, "high": hi} for lo, hi in zip(a["low"], a["high"])]
    return rules.select_layers(ivs, SINK_LAYER_MIN, res.json("sinks")["layer_ids"])


def selection_note(res: Results) -> str:
    """The caveat of a number pooled over the sink layers the run selected: provisional when
    chosen and tested on the same windows, or (selected on one half, tested on the other)
    when the run has fewer windows than the evidence runner's panel
    (:data:`tl_spectral_studies.evidence_panel.DEFAULTS`, 64)."""
    from tl_spectral_studies.evidence_panel import DEFAULTS

    st = _setting(res)
    sel = st.get("selection") or {}
    if sel.get("rule") == "interval" and sel.get("split"):
        n = res.json("sinks")["n_docs"]
        if n >= DEFAULTS["windows"]:
            return ""
        return (f"provisional: {n} windows (sink layers selected on "
                f"{len(sel['select_windows'])}, pooled on the other "
                f"{len(sel['test_windows'])}); the adequate sample is the evidence panel's "
                "(python -m tl_spectral_studies.evidence)")
    doc = sink_layers(res)
    return (f"provisional: pooled over the sink layers the run chose by point estimate on the "
            f"same {res.json('sinks')['n_docs']} windows ({layer_list(st['sink_layers'])}); the "
            f"documented interval rule gives {layer_list(doc)}; a rerun that selects on half "
            "the windows and tests on the other half is pending (issue 39)")


def layer_list(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0–2, 5, 7–8"``."""
    ids = sorted(ids)
    if not ids:
        return "none"
    out, start = [], ids[0]
    for a, b in zip(ids, ids[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return ", ".join(out)


def over_layers(ids: Sequence[int], ivs: Sequence[Mapping[str, Any]], threshold: float, *,
                above: bool, what: str) -> Measurement:
    """:data:`LAYERS_RULE` on per-layer intervals, with the layer lists in the number."""
    labs = [rules.sign(iv, threshold, above=above) for iv in ivs]
    hold = [i for i, x in zip(ids, labs) if x == rules.REPRODUCED]
    rev = [i for i, x in zip(ids, labs) if x == rules.NOT_REPRODUCED]
    number = (f"{what}: holds in {len(hold)} of {len(ids)} layers ({layer_list(hold)}), "
              f"reversed in {len(rev)} ({layer_list(rev)})")
    return Measurement(number, rules.over_layers(labs), n=len(ids))


def _pooled(res: Results, key: str) -> dict | None:
    st = _setting(res)
    return None if st is None else st.get("pooled", {}).get(key)


def _m(iv: Mapping[str, Any] | None, number: str, label: str, note: str = "",
       n: int | None = None) -> Measurement:
    return Measurement(number, label, None if iv is None else float(iv["estimate"]),
                       None if iv is None else (float(iv["low"]), float(iv["high"])), n, note)


# ------------------------------------------------------------------ measures
def sink_count(res: Results) -> Measurement | None:
    sel = sink_layers(res)
    if sel is None:
        return None
    st = _setting(res)
    n = len(res.json("sinks")["layer_ids"])
    mx = max(max(r) for r in st["head_sink_rate"])
    return Measurement(f"{len(sel)} of {n} layers with the interval of mean α_i0 above "
                       f"{SINK_LAYER_MIN} ({layer_list(sel)}); largest head sink rate {mx:.3f}",
                       rules.at_least_one([True] * len(sel)), n=n)


NO_SINK_LAYER = Measurement("no sink layer selected", f"{rules.NOT_TESTED}: no sink layer")


def little(res: Results) -> Measurement | None:
    r = _pooled(res, "C0_over_attn0")
    if r is None:
        return None if _setting(res) is None else NO_SINK_LAYER
    return _m(r, f"C_i0 / α_i0 over the sink layers {fmt_interval(r)}",
              rules.sign(r, 0.5, above=False), selection_note(res),
              res.json("sinks")["n_docs"])


NO_SINK = "does not apply: this model has no sink (no sink head in any layer)"


def no_sink(res: Results) -> bool:
    """Paper layout: no layer's interval of the sink-head share lies above 0."""
    s = _summary(res) if _setting(res) is None else None
    return s is not None and all(r["sink_head_share"]["high"] <= 0 for r in s["sink_intervals"])


def anti(res: Results) -> Measurement | None:
    pl = _per_layer(res, "cos_v0_s")
    if pl is None:
        return None
    if no_sink(res):
        return Measurement(over_layers(*pl, 0.0, above=False, what="cos(ṽ_0, s) < 0").number,
                           NO_SINK, n=len(pl[0]))
    m = over_layers(*pl, 0.0, above=False, what="cos(ṽ_0, s) < 0")
    r = _pooled(res, "cos_v0_s")
    extra = f"; pooled over the sink layers {fmt_interval(r, '{:+.3g}')}" if r else ""
    return Measurement(m.number + extra, m.label, n=m.n,
                       note=selection_note(res) if r else "")


def rho(res: Results) -> Measurement | None:
    r = _pooled(res, "rho_star_in_0_1")
    if r is not None:
        return _m(r, f"share of queries with 0 < ρ* < 1 over the sink layers {fmt_interval(r)}",
                  rules.sign(r, RHO_SHARE, above=True), selection_note(res),
                  res.json("sinks")["n_docs"])
    s = _summary(res)
    if s is None:
        return None
    sh = [x.get("rho_star_in_0_1") for x in s["sink_rows"]]
    if any(x is None for x in sh):
        return None
    k = sum(x > RHO_SHARE for x in sh)
    return Measurement(f"share of queries with 0 < ρ* < 1 above {RHO_SHARE:.0%} in {k} of "
                       f"{len(sh)} layers (no interval in the summary)",
                       f"{rules.DESCRIPTIVE}: " + rules.count([x > RHO_SHARE for x in sh]),
                       n=len(sh))


def zero_ppl(res: Results) -> Measurement | None:
    st = _setting(res)
    if st is None:
        return None
    r = st["zero_sink_ppl"]
    return _m(r, f"PPL'/PPL − 1 = {fmt_interval(r, '{:+.3g}')} (every layer, paired over "
              "windows)", rules.sign(r, 0.0, above=True), n=res.json("sinks")["n_docs"])


def cone(res: Results) -> Measurement | None:
    """SPEC C.4: the change of cos(o_i, s̄_i) when the sink's value is zeroed (the probe's
    ``delta_cos``), per layer; a rise is the collapse into the semantic cone."""
    pl = _per_layer(res, "delta_cos")
    if pl is not None:
        return over_layers(*pl, 0.0, above=True, what="Δcos(o, s̄) > 0")
    s = _summary(res)
    if s is None or "delta_cos" not in s["sink_rows"][0]:
        return None
    dc = [r["delta_cos"] for r in s["sink_rows"]]
    ids = [r["layer"] for r in s["sink_rows"]]
    up = [i for i, x in zip(ids, dc) if x > 0]
    return Measurement(f"Δcos(o, s̄) > 0 in {len(up)} of {len(dc)} layers ({layer_list(up)}; "
                       "point estimates, no interval in the summary)",
                       NO_SINK if no_sink(res) else
                       f"{rules.DESCRIPTIVE}: " + rules.count([x > 0 for x in dc]), n=len(dc))


def norm(res: Results) -> Measurement | None:
    """Seed 003 §3.3: sinks suppress the output norm, so zeroing the sink's value raises
    ‖o‖ (Δ‖o‖/‖o‖ > 0), per layer."""
    pl = _per_layer(res, "rel_delta_norm")
    if pl is None:
        return None
    return over_layers(*pl, 0.0, above=True, what="Δ‖o‖/‖o‖ > 0")


def split(res: Results) -> Measurement | None:
    r1, r2 = _pooled(res, "v0_over_vothers"), _pooled(res, "cos_minus_others")
    if r1 is None or r2 is None:
        return None if _setting(res) is None else NO_SINK_LAYER
    l1, l2 = rules.sign(r1, 1.0, above=False), rules.sign(r2, 0.0, above=False)
    return _m(r1, f"‖ṽ_0‖ / mean ‖ṽ_j‖ {fmt_interval(r1)} (norm factor: {l1}); "
              f"cos(o, ṽ_0) − cos(o, ṽ_j) {fmt_interval(r2, '{:+.3g}')} (cosine factor: {l2})",
              rules.steps([l1, l2]), selection_note(res), res.json("sinks")["n_docs"])


def tail(res: Results) -> Measurement | None:
    r = _pooled(res, "tail_C_minus_attn")
    if r is None:
        return None if _setting(res) is None else NO_SINK_LAYER
    return _m(r, f"contribution share − attention share of tail tokens "
              f"{fmt_interval(r, '{:+.3g}')} (practical margin ±{TAIL_MARGIN})",
              rules.two_sided(r, 0.0, practical=TAIL_MARGIN), selection_note(res),
              res.json("sinks")["n_docs"])


def puzzle(res: Results) -> Measurement | None:
    s = res.json("sinks")
    if s is None or "wiki_no_start" not in s["settings"]:
        return None
    st, ns = s["settings"]["wiki_start"], s["settings"]["wiki_no_start"]
    lay = s["layer_ids"]
    li = lay.index(24) if 24 in lay else len(lay) - 1
    b0 = ns["brute"]
    diff = max(ns["probe_vs_brute_max_abs_diff_C0"], ns["probe_vs_brute_max_abs_diff_attn0"])
    return Measurement(
        f"layer {lay[li]} no start token: α_i0 {b0['attn0']['estimate'][li]:.3f}, C_i0 "
        f"{b0['C0']['estimate'][li]:.3f}; with start token: α_i0 "
        f"{st['brute']['attn0']['estimate'][li]:.3f}, C_i0 {st['brute']['C0']['estimate'][li]:.3f}"
        f"; library probe − brute force from the HF modules, max over documents and layers "
        f"{diff:.1e}", "the model (the measure matches the brute force)" if diff < 1e-3 else
        "the measure (the probe differs from the brute force)", n=s["n_docs"])


FAITH_MEASURES = ("attention", "value_weighted", "output_normalized", "contribution", "random")
HIERARCHY = ("attention", "value_weighted", "output_normalized", "contribution")


def hierarchy_steps(diff: dict, aliases: dict, setting: int, kind: int) -> list[tuple]:
    """(step, label, interval) of the four-measure order; ``kind`` 0: comprehensiveness
    (larger area more faithful: the step holds above 0), 1: sufficiency (below 0)."""
    M = list(FAITH_MEASURES)
    out = []
    for a, b in zip(HIERARCHY, HIERARCHY[1:]):
        if aliases.get(b) == a or aliases.get(a) == b:
            out.append((f"{a} < {b}", rules.TIE, None))
            continue
        ia, ib = M.index(a), M.index(b)
        iv = {k: diff[k][setting][ib][ia][kind] for k in ("estimate", "low", "high")}
        out.append((f"{a} < {b}", rules.sign(iv, 0.0, above=kind == 0), iv))
    return out


def hierarchy(kind: int, setting_name: str):
    """The measure of one hierarchy record (criterion ``kind``, one setting)."""
    def measure(res: Results) -> Measurement | None:
        f = res.json("faithfulness")
        if f is None:
            return None
        names = [s.replace(" ", "") for s in f["settings"]]
        if setting_name not in names:
            return None
        st = hierarchy_steps(f["differences"], f["aliases"], names.index(setting_name), kind)
        txt = "; ".join(f"{n}: {lb}" + (f" {fmt_interval(iv, '{:+.3g}')}" if iv else "")
                        for n, lb, iv in st)
        return Measurement(f"layer-wide ranking, {f['n_docs']} documents; steps (difference "
                           f"of areas of PPL'/PPL − 1): {txt}",
                           rules.steps([lb for _, lb, _ in st]), n=f["n_docs"])
    return measure


P = "seed 003"
claim(Claim("C.sink", f"{P} §3.2", "C.4", "decoders with a start token form attention sinks",
            f"a count over layers (no interval of its own): reproduced when at least one layer "
            f"is selected by the documented rule ({rules.SELECT_RULE}; threshold "
            f"{SINK_LAYER_MIN})", sink_count,
            no_interval="a count of the layers its rule selects, each by its own interval",
            panel="C.sink"))
claim(Claim("C.little", f"{P} §3.2", "C.4",
            "the sink draws attention but contributes little to the output",
            "sign rule on C_i0 / α_i0 pooled over the sink layers against 0.5 (the sink "
            "supplies less than half the output share its attention would give)", little,
            panel="C.little"))
claim(Claim("C.anti", f"{P} §3.2–3.3", "C.4", "the sink's value is anti-aligned with the "
            "mean output of the other tokens, cos(ṽ_0, s_i) < 0",
            LAYERS_RULE + " (claim: cos < 0)", anti, no_interval=LAYERS_COUNT, panel="C.anti"))
claim(Claim("C.rho", f"{P} §3.3", "C.4", "the optimal sink rate ρ* lies below 1 (0 < ρ* < 1)",
            f"sign rule on the share of queries with 0 < ρ* < 1 against {RHO_SHARE} (a "
            "majority); without an interval, a descriptive count over layers", rho,
            panel="C.rho"))
claim(Claim("C.zero_ppl", f"{P} §3.3", "C.4", "removing the sink's value raises perplexity",
            "sign rule against 0 (relative change, paired over windows)", zero_ppl,
            panel="C.zero_ppl"))
claim(Claim("C.cone", f"{P} §3.3", "C.4", "without the sink, outputs collapse into the "
            "semantic cone: cos(o_i, s̄_i) rises when the sink's value is zeroed",
            LAYERS_RULE + " (claim: Δcos(o, s̄) > 0, the SinkProbe's delta_cos)", cone,
            no_interval=LAYERS_COUNT, panel="C.cone", panel_apart="C.cone.pooled"))
claim(Claim("C.norm", f"{P} §3.3", "C.4", "sinks suppress the output norm: zeroing the "
            "sink's value raises ‖o‖", LAYERS_RULE + " (claim: Δ‖o‖/‖o‖ > 0)", norm,
            no_interval=LAYERS_COUNT, panel="C.norm", panel_apart="C.norm.pooled"))
claim(Claim("C.split", f"{P} §3.2", "C.1", "the sink's small contribution comes from its "
            "value norm and its direction", "each factor by the sign rule (norm ratio < 1; "
            "cosine below the other tokens' by α-weighted mean), then " + rules.STEPS_RULE,
            split, panel="C.split"))
claim(Claim("C.tail", f"{P} §3.2", "C.1", "tail tokens: their contribution is set jointly "
            "by attention and alignment (not by attention alone)",
            f"two-sided sign rule with a practical margin of ±{TAIL_MARGIN} ({rules.PRACTICAL_RULE})",
            tail, threshold=(TAIL_MARGIN, TAIL_SOURCE), panel="C.tail"))
claim(Claim("C.puzzle", "issue 26", "C.1", "without a start token, position 0 draws most "
            "of layer 24's attention and supplies most of its output — model or measure?",
            "measure wrong when the library's C_i0 or α_i0 (mean over queries, query 0 "
            "included) differs from the brute force from the HF modules by more than 1e-3 on "
            "any document and layer", puzzle,
            no_interval="a numerical check (the largest absolute difference, probe − brute "
            "force) against a tolerance of 1e-3, not an estimate"))
for _k, _kn in ((0, "comprehensiveness"), (1, "sufficiency")):
    for _s, _sn, _words in (("alllayers", "all layers", "all layers"),
                            ("layer15", "middle layer", "the middle layer: SmolLM2's 15, "
                             "Gemma-3's 9")):
        claim(Claim(f"C.hierarchy.{_kn[:4]}.{_s}", f"{P} §3.1", "C.3",
                    "faithfulness hierarchy attention < value-weighted < output-normalized < "
                    f"contribution ({_kn}, {_words})",
                    "every step by the sign rule on the area difference (comprehensiveness: "
                    "above 0; sufficiency: below 0), then " + rules.STEPS_RULE
                    + " (the step intervals: in the number column of a one-framing record, "
                    "in the panel summary's cells for a panel record)",
                    hierarchy(_k, _s), panel="C.hierarchy",
                    panel_cells=(("criterion, setting", f"{_kn}, {_sn}"),),
                    no_interval="three steps, each with its own interval (in the number)"))
