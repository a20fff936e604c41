"""The generated blocks of docs/contributions.md (SPEC C, seed 003): the claim table (labels
by :mod:`tl_spectral_studies.claims.rules`; C.anti and C.norm by their registry rule), the
faithfulness, order, statistics and sink tables, from the committed summaries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tl_spectral_studies._common import (
    fmt_interval,
)

N_RESAMPLES = 1000
"""Bootstrap resamples of the committed summaries (the study's default)."""


def faithfulness_markdown(res: Any, setting: int = 0, fmt: str = "{:.4g}") -> str:
    """Markdown table: measure × comprehensiveness area × sufficiency area."""
    unit = "ΔPPL" if res.metric == "delta_ppl" else "1 − cos(e', e)"
    lines = [f"| measure | comprehensiveness area ({unit}) ↑ | sufficiency area ({unit}) ↓ |",
             "|---|---|---|"]
    from tl_spectral.probes.faithfulness import structural_aliases

    same = {**structural_aliases(res.measures, res.mode, res.level), **res.aliases}
    for row in res.to_rows(setting):
        alias = same.get(row["measure"])
        name = row["measure"] + (f" (= {alias})" if alias else "")
        lines.append(f"| {name} | {fmt.format(row['comprehensiveness_area'])} | "
                     f"{fmt.format(row['sufficiency_area'])} |")
    return "\n".join(lines)


def rows_markdown(rows: Sequence[dict], fmt: str = "{:.3g}") -> str:
    """Markdown table from a list of dicts with the same keys."""
    if not rows:
        return ""
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(fmt.format(r[k]) if isinstance(r[k], float) else str(r[k])
                                     for k in keys) + " |")
    return "\n".join(out)





COMMANDS = {
    "char_shakespeare": "tl-spectral study contributions --model char-shakespeare --n-docs 32 "
                        "--length 256 --out docs/results/contributions --fig-dir docs/figures",
    "minilm": "tl-spectral study contributions --model minilm --n-docs 64 --length 128 "
              "--data-dir ../shared/data --out docs/results/contributions --fig-dir docs/figures",
}
"""The command that writes each model's committed summary (its provenance)."""

MODEL_LABEL = {
    "char_shakespeare": "char-shakespeare (1.2 M), 32 Tiny Shakespeare windows × 256",
    "minilm": "MiniLM (22 M, encoder), 64 Wikipedia sentences",
}
PAPER_SCALE = "paper: 7–8 B decoders, GSM8K / FineWeb-Edu"

PAPER_STEPS = (("attention", "value_weighted"), ("value_weighted", "output_normalized"),
               ("output_normalized", "contribution"), ("attention", "contribution"),
               ("contribution", "abs_contribution"))


def _iv(d: dict, *index: int) -> dict:
    """The interval at ``index`` of a nested ``{"estimate", "low", "high"}`` of lists."""
    out = {}
    for k in ("estimate", "low", "high"):
        v = d[k]
        for i in index:
            v = v[i]
        out[k] = v
    return out


from tl_spectral_studies.verdicts import DESCRIPTIVE  # noqa: E402


def _verdict(iv: dict, claim_positive: bool = True) -> str:
    """``reproduced`` when the interval excludes the opposite of the claim, ``opposite``
    when it excludes the claim, else not distinguishable."""
    from tl_spectral_studies.verdicts import side

    return side(iv, 0.0, below=not claim_positive)


def _load_summaries(results_dir: str | Path) -> dict[str, dict]:
    return {p.name[: -len("_summary.json")]: json.loads(p.read_text())
            for p in sorted(Path(results_dir).glob("*_summary.json"))}


def _faith_table(s: dict, si: int) -> str:
    meta, fi = s["faithfulness_meta"], s["faithfulness_intervals"]
    unit = "ΔPPL" if meta["metric"] == "delta_ppl" else "1 − cos(e', e)"
    lines = [f"| measure | comprehensiveness area ({unit}) ↑ [95% CI] | "
             f"sufficiency area ({unit}) ↓ [95% CI] |", "|---|---|---|"]
    for mi, m in enumerate(meta["measures"]):
        alias = meta["aliases"].get(m)
        name = m + (f" (= {alias})" if alias else "")
        c, su = _iv(fi["areas"], si, mi, 0), _iv(fi["areas"], si, mi, 1)
        lines.append(f"| {name} | {fmt_interval(c, '{:.4g}')} | {fmt_interval(su, '{:.4g}')} |")
    return "\n".join(lines)


def _step_rows(s: dict, si: int) -> list[tuple[str, str, dict | None, str]]:
    """(step, criterion, interval of the paper-direction difference, verdict) per step."""
    meta, fi = s["faithfulness_meta"], s["faithfulness_intervals"]
    ms = meta["measures"]
    rows = []
    for a, b in PAPER_STEPS:
        if a not in ms or b not in ms:
            continue
        ia, ib = ms.index(a), ms.index(b)
        tie = meta["aliases"].get(b) == a or meta["aliases"].get(a) == b
        for crit, ci in (("comprehensiveness", 0), ("sufficiency", 1)):
            # positive = b better than a: larger comprehensiveness, smaller sufficiency
            d = _iv(fi["differences"], si, ib, ia, ci) if ci == 0 else \
                _iv(fi["differences"], si, ia, ib, ci)
            step = f"{a} < {b}" + (" (diagnostic, not the paper's)" if "abs_" in b else "")
            if tie:
                rows.append((step, crit, None, "tie by construction (same ranking)"))
            elif "abs_" in b:  # a diagnostic, not a claim: say which ranking does better
                rows.append((step, crit, d, "|C| better" if d["low"] > 0 else "C better"
                             if d["high"] < 0 else "not distinguishable at this size"))
            else:
                rows.append((step, crit, d, _verdict(d)))
    return rows


def _order_table(s: dict) -> str:
    lines = ["| setting | step | criterion | better − worse area [95% CI] | verdict |",
             "|---|---|---|---|---|"]
    for si, setting in enumerate(s["faithfulness_meta"]["settings"]):
        for step, crit, d, v in _step_rows(s, si):
            lines.append(f"| {setting} | {step} | {crit} | "
                         f"{fmt_interval(d, '{:.3g}') if d else '0 (identical curves)'} | {v} |")
    return "\n".join(lines)


def _interval_rows(rows: list[dict], fmt: str = "{:.3g}") -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(str(r[k]) if k == "layer" else fmt_interval(r[k], fmt)
                                     for k in keys) + " |")
    return "\n".join(out)


def _verdict_rows(slug: str, s: dict | None) -> list[str]:
    label = MODEL_LABEL.get(slug, slug)
    if s is None:
        return [f"| all claims | {label}† | needs rerun: `{COMMANDS[slug]}` | — |"]
    ms = s["faithfulness_meta"]["measures"]
    fi = s["faithfulness_intervals"]
    unit = "ΔPPL" if s["faithfulness_meta"]["metric"] == "delta_ppl" else "1 − cos"
    who = f"{label}†"
    ia, ic = ms.index("attention"), ms.index("contribution")
    rows = []
    for si, setting in enumerate(s["faithfulness_meta"]["settings"]):
        comp = _iv(fi["differences"], si, ic, ia, 0)
        suff = _iv(fi["differences"], si, ia, ic, 1)
        rows.append(f"| contribution beats raw attention, comprehensiveness (seed 003 §3.1) | "
                    f"{who}; {setting} | area(C) − area(α) = {fmt_interval(comp)} {unit} | "
                    f"{_verdict(comp)} |")
        rows.append(f"| contribution beats raw attention, sufficiency (seed 003 §3.1) | "
                    f"{who}; {setting} | area(α) − area(C) = {fmt_interval(suff)} {unit} | "
                    f"{_verdict(suff)} |")
        steps = [r for r in _step_rows(s, si)
                 if "abs_" not in r[0] and r[0] != "attention < contribution"]
        for crit in ("comprehensiveness", "sufficiency"):
            cs = [r for r in steps if r[1] == crit]
            nums = "; ".join(f"{st}: " + (fmt_interval(d) if d else "tie by construction")
                             for st, _, d, _ in cs)
            v = order_label([v for _, _, d, v in cs if d], sum(d is None for _, _, d, _ in cs))
            rows.append(f"| full order α < value-weighted < output-normalized < C, {crit} (seed "
                        f"003 §3.1) | {who}; {setting} | better − worse area per step: {nums} | "
                        f"{v} |")
    return rows + _sink_rows(who, s)


def _sink_rows(who: str, s: dict) -> list[str]:
    """The sink rows of one model's summary (seed 003 §3.2–3.3): C.anti and C.norm by the
    claims registry's per-layer rule."""
    rows = []
    st, sk = s["stats_intervals"], s["sink_intervals"]
    li = max(range(len(sk)), key=lambda i: sk[i]["sink_rate"]["estimate"])
    a0, c0 = st[li]["attn_on_first_token"], st[li]["C_on_first_token"]
    share = sk[li]["sink_head_share"]
    if share["high"] <= 0:
        gap = ("does not apply: this model has no sink (no head's Gu key score of token 0 "
               "above 0.3 in any document)")
    else:
        gap = "reproduced" if a0["low"] > c0["high"] else (
            "**not reproduced**: C on the first token is not below its attention"
            if a0["high"] < c0["low"] else "not distinguishable at this size")
    rows.append(f"| sinks: high attention, little contribution (seed 003 §3.2) | {who}; layer "
                f"{st[li]['layer']} (highest sink rate) | sink-head share {fmt_interval(share)}; "
                f"α on token 0 {fmt_interval(a0)}, C on token 0 {fmt_interval(c0)} | {gap} |")
    neg = [str(r["layer"]) for r in sk if r["cos_v0_s"]["high"] < 0]
    pos = [str(r["layer"]) for r in sk if r["cos_v0_s"]["low"] > 0]
    no_sink = all(r["sink_head_share"]["high"] <= 0 for r in sk)
    from tl_spectral_studies.claims import seed003  # the rule of claims C.anti and C.norm
    from tl_spectral_studies.verdicts import paper_label

    ids = [r["layer"] for r in sk]
    if no_sink:
        anti = ("does not apply: this model has no sink (no sink head in any layer), so there "
                "is no sink value to be anti-aligned")
    else:
        m = seed003.over_layers(ids, [r["cos_v0_s"] for r in sk], 0.0, above=False,
                                what="cos(ṽ_0, s) < 0")
        anti = f"{paper_label(m.label)} (C.anti: {m.number})"
    del neg, pos
    rows.append(f"| sink value anti-aligned, cos(ṽ_0, s) < 0 (seed 003 §3.2–3.3) | {who} | "
                + "; ".join(f"layer {r['layer']} {fmt_interval(r['cos_v0_s'])}" for r in sk)
                + f" | {anti} |")
    sr = s["sink_rows"]
    shares = [r.get("rho_star_in_0_1") for r in sr]
    rows.append(f"| norm-minimising sink rate ρ* < 1 (seed 003 §3.3) | {who} | share of queries "
                f"with 0 < ρ* < 1: " + ", ".join(f"layer {r['layer']} {x:.2f}" for r, x in
                                                 zip(sr, shares) if x is not None)
                + f" | {rho_star_label(shares)} |")
    shrink = [r for r in sk if r["rel_delta_norm"]["high"] < 0]
    nm = seed003.over_layers(ids, [r["rel_delta_norm"] for r in sk], 0.0, above=True,
                             what="Δ‖o‖/‖o‖ > 0")
    rows.append(f"| sinks suppress the output norm: zeroing the sink value raises ‖o‖ (seed 003 "
                f"§3.3) | {who} | Δ‖o‖/‖o‖ {fmt_interval(sk[0]['rel_delta_norm'])} (layer "
                f"{sk[0]['layer']}) … {fmt_interval(sk[-1]['rel_delta_norm'])} (layer "
                f"{sk[-1]['layer']}); below 0 in {len(shrink)} of {len(sk)} layers | "
                f"{paper_label(nm.label)} (C.norm: {nm.number}) |")
    dc = [r["delta_cos"] for r in sr if "delta_cos" in r]
    si = {x["setting"]: x for x in s.get("sink_intervention", [])}
    allx = si.get("all layers", {})
    eff = "; ".join(f"{k} {v:+.3g}" for k, v in allx.items() if k != "setting")
    rows.append(f"| removing the sink's value collapses outputs into the semantic cone and raises "
                f"PPL (seed 003 §3.3) | {who} | Δcos(o, s̄) per layer "
                + ", ".join(f"{x:+.4f}" for x in dc) + f"; all layers zeroed: {eff} | "
                + (f"{DESCRIPTIVE} (no interval in the summary): cos(o, s̄) rises in "
                   f"{sum(x > 0 for x in dc)} of {len(dc)} layers" if not no_sink else
                   "does not apply: this model has no sink") + " |")
    return rows


def global_order_rows(r: dict) -> list[str]:
    """The four-measure order under a global ranking (one ``faithfulness_scope`` result, its
    all-layers setting): each adjacent step's paired difference, judged by :func:`_verdict`
    (better = larger comprehensiveness, smaller sufficiency), then :func:`order_label`."""
    steps = [x for x in r["paired"] if x["setting"] == "all layers"]
    if not steps:
        return []
    out = []
    for crit in ("comprehensiveness", "sufficiency"):
        cells, vs = [], []
        for x in steps:
            d = x[f"{crit}_a_minus_b"]
            # b better than a: comprehensiveness b − a > 0, sufficiency a − b > 0
            iv = ({"estimate": -d["estimate"], "low": -d["high"], "high": -d["low"]}
                  if crit == "comprehensiveness" else d)
            vs.append(_verdict(iv))
            cells.append(f"{x['a']} < {x['b']}: {fmt_interval(iv)}")
        out.append(f"| full order α < value-weighted < output-normalized < C, {crit}, global "
                   f"ranking ({r['scope']} scope, {r['level']} level; seed 003 §3.1) | "
                   f"{r['model']}†; {r['n_docs']} validation windows × 256, all layers | "
                   f"better − worse area per "
                   f"step: {'; '.join(cells)} | {order_label(vs, 0)} |")
    return out


ORDER_RULE = ("the order is reproduced only when every step can be tested and each step's "
              "paired interval lies on the claimed side; partly when at least one step holds "
              "and none is reversed; not reproduced when a step is reversed")
from tl_spectral_studies.claims.seed003 import (  # noqa: E402  (one declaration)
    LAYERS_RULE,
    RHO_SHARE,
)


def order_label(step_verdicts: Sequence[str], n_ties: int) -> str:
    """The four-measure order from its steps by :func:`tl_spectral_studies.claims.rules.steps`
    ("partly" needs a step that holds and none reversed); a tie by construction is untestable,
    so the full order is then at most partly reproduced."""
    from tl_spectral_studies.claims import rules

    lab = rules.steps([rules.base(v) for v in step_verdicts] + [rules.TIE] * n_ties)
    if lab == rules.NOT_REPRODUCED:
        return "**not reproduced**: at least one step's interval excludes the order"
    if lab == rules.PARTLY:
        held = sum(rules.base(v) == rules.REPRODUCED for v in step_verdicts)
        tie = (f"; {n_ties} step is a tie by construction (same ranking), so the full order "
               "is not tested") if n_ties else ""
        return f"partly: {held} of the {len(step_verdicts)} testable steps reproduced{tie}"
    if lab == rules.NOT_DISTINGUISHABLE:
        return "not distinguishable at this size"
    return lab


def rho_star_label(shares: Sequence[float | None]) -> str:
    """ρ* < 1: the share of queries with 0 < ρ* < 1 per layer against :data:`RHO_SHARE`
    (descriptive: the summary holds no interval for the share)."""
    v = [x for x in shares if x is not None]
    if not v:
        return "needs rerun (no per-query ρ* share in this summary)"
    k = sum(x > RHO_SHARE for x in v)
    return (f"{DESCRIPTIVE} (no interval): more than {RHO_SHARE:.0%} of queries have "
            f"0 < ρ* < 1 in {k} of {len(v)} layers"
            + (" — reproduced by that rule" if k == len(v) else ""))


_ORDER = "full order α < value-weighted < output-normalized < C, "
_GLOBAL = ", global ranking (layer scope, {} level; seed 003 §3.1)"


def _hierarchy(crit: str) -> Any:
    """The per-setting full-order rows: all layers -> the study's all-layer record, one
    layer (ours: layer 3) -> its one-layer record (SmolLM2: layer 15)."""
    def ids(cells: Sequence[str]) -> tuple[str, ...]:
        one = re.search(r"; layer \d+$", cells[1]) is not None
        return (f"C.hierarchy.{crit}.{'layer15' if one else 'alllayers'}",)
    return ids


SMOL_IDS: dict[str, Any] = {
    # claim row of the verdict table -> the SmolLM2 verdict ids (docs/results/real_decoder/
    # verdicts.json) that answer it; None: SmolLM2 has no measurement for it
    "all claims": None,  # the "needs rerun" row of a model without a summary
    "contribution beats raw attention, comprehensiveness (seed 003 §3.1)": None,
    "contribution beats raw attention, sufficiency (seed 003 §3.1)": None,
    _ORDER + "comprehensiveness (seed 003 §3.1)": _hierarchy("comp"),
    _ORDER + "sufficiency (seed 003 §3.1)": _hierarchy("suff"),
    "sinks: high attention, little contribution (seed 003 §3.2)": ("C.sink", "C.little"),
    "sink value anti-aligned, cos(ṽ_0, s) < 0 (seed 003 §3.2–3.3)": ("C.anti",),
    "norm-minimising sink rate ρ* < 1 (seed 003 §3.3)": ("C.rho",),
    "sinks suppress the output norm: zeroing the sink value raises ‖o‖ (seed 003 §3.3)":
        ("C.norm",),
    "removing the sink's value collapses outputs into the semantic cone and raises PPL (seed "
    "003 §3.3)": ("C.cone", "C.zero_ppl"),
    # SmolLM2's hierarchy ranks layer-wide (a global ranking of layer scope), all layers
    **{_ORDER + crit + _GLOBAL.format(level): (f"C.hierarchy.{c}.alllayers",)
       for crit, c in (("comprehensiveness", "comp"), ("sufficiency", "suff"))
       for level in ("head", "token")},
    "the value's norm vs its cosine: which part of the sink's small contribution each "
    "explains (seed 003 §3.2)": ("C.split",),
    "tail tokens: contribution set jointly by attention and direction (seed 003 §3.2)":
        ("C.tail",),
    "downstream benchmarks (MMLU, Winogrande, BoolQ) and GSM8K / FineWeb-Edu perplexity "
    "(seed 003 §2)": None,
}


def tables(results_dir: str | Path, *, smol_verdicts: str | Path | None = None
           ) -> dict[str, str]:
    """Every generated table of docs/contributions.md, by block key, from the committed
    ``<model>_summary.json`` files (models without one get a "needs rerun" verdict row).
    The claim table's SmolLM2 column reads ``smol_verdicts`` (default: the real-decoder
    study's verdicts.json beside ``results_dir``) through :data:`SMOL_IDS`."""
    from tl_spectral_studies import smol_column

    sums = _load_summaries(results_dir)
    out: dict[str, str] = {}
    verdict = ["| paper's claim (source) | ours: model, data, setting | ours: number [95% CI] | "
               "verdict |", "|---|---|---|---|"]
    full = {k: v for k, v in sums.items() if "faithfulness_intervals" in v}
    for slug in COMMANDS:
        verdict += _verdict_rows(slug, full.get(slug))
    n_res = {s["faithfulness_intervals"]["n_resamples"] for s in full.values()} or {N_RESAMPLES}
    verdict.append("")
    verdict.append(f"† unequal scale: the {PAPER_SCALE.removeprefix('paper: ')} of the paper "
                   "against models of 1.2 M and 22 M parameters on a few thousand tokens.")
    verdict.append("")
    verdict.append(f"Intervals: 95% percentile bootstrap over documents, "
                   f"{', '.join(str(n) for n in sorted(n_res))} resamples, seed 0. The paper "
                   "reports these claims without numbers in the summary we could read "
                   "(seed 003), so each row compares a sign or an order. Per-layer calls "
                   "(anti-alignment, ‖o‖) use each layer's 95% interval with no correction for "
                   "the 6 layers: they describe where the sign is resolved, and a claim \"in "
                   "every layer\" is read off them only when every interval is far from 0 "
                   "(the files hold 95% intervals only, so a Holm or Bonferroni call, which "
                   "needs 99.2% intervals for 6 layers, cannot be made from them). Over the "
                   "layers (claims C.anti, C.norm, the same rule for every model in "
                   "[claims.md](claims.md)): " + LAYERS_RULE + ". Full order: "
                   + ORDER_RULE + ".")
    scope = [json.loads(p.read_text()) for p in
             sorted((Path(results_dir).parent / "faithfulness_scope").glob("*.json"))]
    for r in scope:  # the largest run of each (model, scope, level); smaller ones are records
        if int(r["n_docs"]) == max(int(x["n_docs"]) for x in scope if
                                   (x["model"], x["scope"], x["level"]) ==
                                   (r["model"], r["scope"], r["level"])):
            verdict[-4:-4] = global_order_rows(r)
    verdict.insert(-4, "| the value's norm vs its cosine: which part of the sink's small "
                       "contribution each explains (seed 003 §3.2) | — | — | not implemented: "
                       "the summary does not define the split |")
    verdict.insert(-4, "| tail tokens: contribution set jointly by attention and direction "
                       "(seed 003 §3.2) | — | — | not implemented: the summary does not define "
                       "tail tokens or the measure |")
    verdict.insert(-4, "| downstream benchmarks (MMLU, Winogrande, BoolQ) and GSM8K / "
                       "FineWeb-Edu perplexity (seed 003 §2) | — | — | out of scope offline: "
                       "no network at run time and no 7–8 B model |")
    out["contributions/verdict"] = smol_column.add_columns(
        "\n".join(verdict), smol_column.ids_from(SMOL_IDS, "docs/contributions.md"),
        results_dir, smol_verdicts)
    for slug, s in sums.items():
        k = f"contributions/{slug}"
        rerun = (f"No intervals in this summary (written before they existed); needs rerun: "
                 f"`{COMMANDS.get(slug, 'tl-spectral study contributions')}`")
        old_format = slug not in full
        for si, setting in enumerate(s["faithfulness"]):
            out[f"{k}/faithfulness/{si}"] = (s["faithfulness"][setting]["markdown"] + "\n\n"
                                             + rerun if old_format else _faith_table(s, si))
        out[f"{k}/order"] = rerun if old_format else _order_table(s)
        out[f"{k}/stats"] = rows_markdown(s["stats_rows"])
        out[f"{k}/stats_intervals"] = rerun if old_format else _interval_rows(s["stats_intervals"])
        out[f"{k}/sinks"] = rows_markdown(s["sink_rows"])
        out[f"{k}/sink_intervals"] = rerun if old_format else _interval_rows(s["sink_intervals"])
        out[f"{k}/sink_intervention"] = rows_markdown(s["sink_intervention"], "{:.4g}")
        out[f"{k}/provenance"] = (f"{s['n_docs']} documents, {s['n_tokens']} tokens, seed "
                                  f"{s.get('seed', 0)}: `{s.get('command') or COMMANDS.get(slug, '')}`")
    for p in sorted((Path(results_dir).parent / "faithfulness_scope").glob("*.json")):
        out[f"contributions/faithfulness_scope/{p.stem}"] = faithfulness_scope_markdown(p)
    return out


def faithfulness_scope_markdown(path: str | Path) -> str:
    """The tables of one ``tl_spectral_studies/faithfulness_scope.py`` result (issue 17 item 4): per
    measure the comprehensiveness and sufficiency areas with removal in all layers, then the
    paired differences of the paper's adjacent measures in every setting, with their 95%
    intervals over documents, and the command that made it."""
    d = json.loads(Path(path).read_text())
    iv = {c: d[f"{c}_area"] for c in ("comprehensiveness", "sufficiency")}

    def cell(c: str, si: int, mi: int) -> str:
        v = iv[c]
        return fmt_interval({"estimate": v["estimate"][si][mi], "low": v["low"][si][mi],
                             "high": v["high"][si][mi]}, "{:.3g}")

    L = [f"| measure ({d['settings'][0]}) | comprehensiveness (higher = better) | "
         "sufficiency (lower = better) |", "|---|---|---|"]
    for mi, m in enumerate(d["measures"]):
        L.append(f"| {m} | {cell('comprehensiveness', 0, mi)} | {cell('sufficiency', 0, mi)} |")
    L += ["", "| setting | a − b | comprehensiveness | sufficiency |", "|---|---|---|---|"]
    for p in d["paired"]:
        L.append(f"| {p['setting']} | {p['a']} − {p['b']} | "
                 f"{fmt_interval(p['comprehensiveness_a_minus_b'], '{:+.3g}')} | "
                 f"{fmt_interval(p['sufficiency_a_minus_b'], '{:+.3g}')} |")
    L += ["", f"{d['model']}, {d['n_docs']} validation windows ({d['n_tokens']} tokens), scope "
          f"{d['scope']}, level {d['level']}, {d['mode']} mode, clean PPL {d['clean_ppl']:.3f}; "
          f"areas = mean ΔPPL over the removal fractions; intervals: {d['interval']}; "
          f"{d['seconds']:.0f} s: `{d['command']}`."]
    return "\n".join(L)


def markdown(results_dir: str | Path) -> str:
    """The doc tables of every ``<model>_summary.json`` under ``results_dir`` (the blocks
    of :func:`tables`, each under its key)."""
    return "\n\n".join(f"<!-- {k} -->\n{v}" for k, v in tables(results_dir).items()) + "\n"


