"""The doc blocks of Gemma-3's natural experiment (docs/real_decoder.md, last section), from
the committed results of :mod:`tl_spectral_studies.gemma_window` (``routing.json``,
``probes.json``, ``twin.json``); ``real_decoder_tables.tables`` includes them under the
keys ``real_decoder/gemma_window/...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tl_spectral_studies._common import fmt_interval

PREFIX = "real_decoder/gemma_window/"


def _load(results_dir: Path, step: str) -> dict[str, Any] | None:
    p = Path(results_dir) / f"{step}.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def _at(iv: dict[str, Any], k: int) -> dict[str, float]:
    """Entry ``k`` of an interval dict of lists."""
    return {n: iv[n][k] for n in ("estimate", "low", "high")}


def _pct(iv: dict[str, Any] | None) -> str:
    """An interval of a share, in percent."""
    if not iv:
        return "—"
    return fmt_interval({k: 100 * iv[k] for k in ("estimate", "low", "high")}, "{:.3g}") + " %"


def _excludes0(iv: dict[str, Any]) -> bool:
    return iv["low"] > 0 or iv["high"] < 0


WINDOW_RULE = ("global and local layers differ when the interval over windows of "
               "mean(global layers) − mean(local layers) excludes 0 AND the exact layer-level "
               "permutation test on the per-layer estimates (every choice of 3 \"global\" "
               "layers among the 18; two-sided) gives p < 0.05 — the interval alone sees only "
               "the windows' variation, not the layers'; \"as the twin\" when that interval "
               "also holds the random-weight twin's difference.")
"""The stated rule of the (a) and (c) contrasts."""


def _label(iv: dict[str, Any] | None, per_layer: list[float], kinds: list[str],
           twin: dict[str, Any] | None) -> tuple[str, str]:
    """(exact layer-level p, label under :data:`WINDOW_RULE`)."""
    from tl_spectral_studies.gemma_window_routing import layer_permutation

    if not iv:
        return "—", "—"
    lp = layer_permutation(per_layer, [k == "global" for k in kinds])
    if not (_excludes0(iv) and lp["p"] < 0.05):
        return f"{lp['p']:.2g}", "not distinguishable"
    as_twin = twin is not None and iv["low"] <= twin["estimate"] <= iv["high"]
    return f"{lp['p']:.2g}", "differ" + (" (as the twin)" if as_twin else "")


def _kind(r: dict[str, Any], li: int) -> str:
    return f"{r['kinds'][li]} (W = {r['layer_windows'][li]})" if r["kinds"][li] == "local" \
        else "global"


# ---------------------------------------------------------------------------- (a)
def fields_markdown(p: dict[str, Any], twin: dict[str, Any] | None) -> str:
    """Per layer: energy at lags ≥ W (mean field, fluctuations), H*, T_spec and band shares
    with their jackknife intervals; then the global − local contrasts, trained and twin."""
    f = p["fields"]
    W = p["split"]
    head = (f"| layer | kind | mean field: energy at lags ≥ {W} | fluctuations: energy at lags "
            f"≥ {W} | H* (ε = {f['epsilon']}) | T_spec | E_fine | E_medium | E_coarse |")
    lines = [head, "|" + "---|" * 9]
    for r in f["per_layer"]:
        li = p["layers"].index(r["layer"])
        hs = fmt_interval(r["H_star"]) + (" (bounded)" if r["H_star_bounded"] else "")
        lines.append(f"| {r['layer']} | {_kind(p, li)} | {_pct(r['mean_beyond_share'])} | "
                     f"{_pct(r['fluct_beyond_share'])} | {hs} | {fmt_interval(r['T_spec'])} | "
                     f"{fmt_interval(r['E_fine'])} | {fmt_interval(r['E_medium'])} | "
                     f"{fmt_interval(r['E_coarse'])} |")
    lines += ["", "| global − local (layer means) | trained [jackknife] | p (layers, exact) "
              "| label | random-weight twin |", "|---|---|---|---|---|"]
    tw = (twin or {}).get("fields", {}).get("global_minus_local", {})
    kinds = [r["kind"] for r in f["per_layer"]]
    for k, label in (("mean_beyond_share", f"mean field: share at lags ≥ {W}"),
                     ("fluct_beyond_share", f"fluctuations: share at lags ≥ {W}"),
                     ("H_star", "H*"), ("T_spec", "T_spec"), ("E_fine", "E_fine"),
                     ("E_medium", "E_medium"), ("E_coarse", "E_coarse"),
                     ("fluct_energy", "fluctuation energy per window")):
        fmt = _pct if "share" in k else fmt_interval
        pl, lab = _label(f["global_minus_local"][k],
                         [r[k]["estimate"] for r in f["per_layer"]], kinds, tw.get(k))
        lines.append(f"| {label} | {fmt(f['global_minus_local'][k])} | {pl} | {lab} | "
                     f"{fmt(tw.get(k)) if tw else '—'} |")
    jk = f["jackknife"]
    lines += ["", f"{p['n_windows']} windows × {p['length']} tokens; 95% delete-a-group "
              f"jackknife over windows ({jk['n_groups']} groups, seed {jk['seed']}, t "
              f"quantile {jk['t_quantile']:.3g}); H* is bounded by the number of windows "
              f"when ≥ {f['h_star_bound']} (the library's rule, `h_star_bounded`); T_spec: "
              f"the power law over the modes holding {round(100 * f['fit_energy'])}% of the "
              "energy." + (f" Twin: {twin['n_windows']} windows, the same draw."
                           if twin else "") + f" Rule: {WINDOW_RULE}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- (b)
ROUTING_LABELS = {"rf_delta0": "routing fraction at Δ = 0",
                  "rf_causal": "routing fraction, causal offsets inside the layer's window",
                  "rank_R_delta0": "entropy rank of R at Δ = 0",
                  "rank_F_delta0": "entropy rank of F at Δ = 0"}


def routing_markdown(r: dict[str, Any]) -> str:
    """(b): local against global heads per statistic, trained and Gaussian, with the rule's
    label."""
    lines = ["| statistic | local heads | global heads | global − local [95% CI] | p (heads) "
             "| p (layers, exact) | Gaussian kernels: global − local [95% CI] | label |",
             "|" + "---|" * 8]
    for k, s in r["summary"].items():
        t, g = s["trained"], s["gaussian"]
        label = ROUTING_LABELS.get(k, f"routing fraction at Δ = {k.removeprefix('rf_at_')}")
        lines.append(f"| {label} | {t['local_mean']:.3g} ({t['n_local']}) | "
                     f"{t['global_mean']:.3g} ({t['n_global']}) | "
                     f"{fmt_interval(t['difference'], '{:+.3g}')} | {t['p_heads']:.2g} | "
                     f"{t['p_layers']:.2g} ({t['n_layer_splits']} splits) | "
                     f"{fmt_interval(g['difference'], '{:+.3g}')} | {s['verdict']} |")
    bases = sorted({float(f"{b:.4g}") for b in r["rope_base"]})  # 999,999.3 -> 1,000,000
    lines += ["", f"Rule: {r['rule']} Heads: {r['n_heads']} per layer reading "
              f"{r['n_kv_heads']} key head(s), d_head {r['d_head']}, d_model {r['d_model']} "
              f"(rank capacity {r['capacity']}); rotary bases read per layer: "
              + ", ".join(f"{b:,.0f}" for b in bases) + f"; offsets Δ = {r['offsets']}, causal "
              f"average over a window of {r['n_ctx']} positions (restricted to |Δ| < W in "
              "local layers); QK-norm gains folded."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- (c)
SINK_COLUMNS = (("A", "alpha0", "α_i0, i < W"), ("B", "alpha0", "α_i0, i ≥ W"),
                ("B", "first_visible", "α on the first visible key (j = i − W + 1), i ≥ W"),
                ("B", "top_weight", "top key's weight, i ≥ W"),
                ("B", "top_is_0", "top key = position 0, i ≥ W"),
                ("B", "top_is_first_visible", "top key = first visible key, i ≥ W"),
                ("B", "top_is_previous", "top key = i − 1, i ≥ W"),
                ("B", "top_rel_lag", "top key's relative lag, i ≥ W"),
                ("B", "mass_beyond", "mass at lags ≥ W, i ≥ W"))
POOLED_ROWS = (SINK_COLUMNS[:3] + (("A", "top_weight", "top key's weight, i < W"),)
               + SINK_COLUMNS[3:4] + (("A", "top_is_0", "top key = position 0, i < W"),)
               + SINK_COLUMNS[4:6] + (("A", "top_is_previous", "top key = i − 1, i < W"),)
               + SINK_COLUMNS[6:7] + (("A", "top_rel_lag", "top key's relative lag, i < W"),)
               + SINK_COLUMNS[7:])


def sinks_markdown(p: dict[str, Any], twin: dict[str, Any] | None) -> str:
    """(c): per layer the query statistics before and after the window edge and the
    SinkProbe's sink rate; then the pooled local / global means, trained and twin."""
    q, sp = p["queries"], p["sink_probe"]
    lines = ["| layer | kind | " + " | ".join(c[2] for c in SINK_COLUMNS)
             + " | SinkProbe sink rate | Gu key score of position 0 |",
             "|" + "---|" * (len(SINK_COLUMNS) + 4)]
    for li, layer in enumerate(p["layers"]):
        cells = [fmt_interval(_at(q[part][k]["per_layer"], li)) for part, k, _ in SINK_COLUMNS]
        cells += [fmt_interval(_at(sp[k]["per_layer"], li)) for k in ("sink_rate", "key_score")]
        lines.append(f"| {layer} | {_kind(p, li)} | " + " | ".join(cells) + " |")
    lines += ["", "| statistic | local layers | global layers | global − local | p (layers, "
              "exact) | label | twin: local | twin: global |", "|" + "---|" * 8]
    tq, ts = (twin or {}).get("queries", {}), (twin or {}).get("sink_probe", {})
    rows = [(q[part][k], tq.get(part, {}).get(k, {}), label) for part, k, label in
            POOLED_ROWS]
    rows += [(sp[k], ts.get(k, {}), label) for k, label in
             (("sink_rate", "SinkProbe sink rate (all queries)"),
              ("key_score", "Gu key score of position 0"),
              ("sink_head_share", "share of sink heads (key score > 0.3)"))]
    for s, t, label in rows:
        pl, lab = _label(s.get("global_minus_local"), s["per_layer"]["estimate"], p["kinds"],
                         t.get("global_minus_local"))
        lines.append(f"| {label} | {fmt_interval(s.get('local'))} | "
                     f"{fmt_interval(s.get('global'))} | "
                     f"{fmt_interval(s.get('global_minus_local'), '{:+.3g}')} | {pl} | {lab} | "
                     f"{fmt_interval(t.get('local'))} | {fmt_interval(t.get('global'))} |")
    lines += ["", f"W = {p['split']}; A: the {q['A']['n_queries_per_head']} queries 1 ≤ i < W "
              f"(query 0 left out), B: the {q['B']['n_queries_per_head']} queries i ≥ W, per "
              "head and window; head means per window; 95% percentile bootstrap over the "
              f"{p['n_windows']} windows; \"top key\": the most-attended key of a (head, query) "
              "(first one on ties); its relative lag: the lag divided by i − max(0, i − W + 1) "
              "(i for i < W, W − 1 for i ≥ W: 1 = the first key a W-window shows; above 1 in a "
              f"global layer = beyond a local window). Rule: {WINDOW_RULE} The largest α at "
              "lags ≥ W over every window and head, local layers: " + ", ".join(
                  f"{v:g}" for v, k in zip(q["beyond_max"], p["kinds"]) if k == "local")
              + "."]
    return "\n".join(lines)


def tokens_markdown(p: dict[str, Any], top: int = 3) -> str:
    """The key tokens that receive the most attention from the queries i ≥ W (position 0
    left out), per layer, with their ratio to uniform attention over the visible keys."""
    lines = [f"| layer | kind | top {top} key tokens, i ≥ W: share of the mass (× uniform) |",
             "|---|---|---|"]
    for row in p["key_tokens"]["B"]:
        li = p["layers"].index(row["layer"])
        toks = "; ".join(f"`{t['text']}` {100 * t['share']:.1f}% (×{t['ratio']:.2g})"
                         for t in row["tokens"][:top])
        lines.append(f"| {row['layer']} | {_kind(p, li)} | {toks} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------- answers
def answers_markdown(p: dict[str, Any], r: dict[str, Any] | None,
                     twin: dict[str, Any] | None) -> str:
    """The three answers in a few generated lines (every number from the results)."""
    W, f, q = p["split"], p["fields"], p["queries"]
    loc = [row for row in f["per_layer"] if row["kind"] == "local"]
    glo = [row for row in f["per_layer"] if row["kind"] == "global"]
    zero = all(row["mean_beyond_share"]["estimate"] == 0 == row["fluct_beyond_share"]
               ["estimate"] for row in loc) and all(
        v == 0 for v, k in zip(q["beyond_max"], p["kinds"]) if k == "local")
    c = f["global_minus_local"]
    tw = (twin or {}).get("fields", {}).get("global_minus_local", {})
    out = [f"- **(a) the window in the scale POD.** In the {len(loc)} local layers the "
           f"attention at lags ≥ {W} is exactly 0 "
           + ("in every window and head, so the field's energy there is exactly 0 (mean field "
              "and fluctuations)" if zero else "NOT everywhere (see the tables)")
           + "; the global layers hold "
           + ", ".join(f"layer {row['layer']}: {_pct(row['mean_beyond_share'])} of the mean "
                       f"field's and {_pct(row['fluct_beyond_share'])} of the fluctuations'"
                       for row in glo)
           + (f" (random twin, global − local: {_pct(tw['mean_beyond_share'])} and "
              f"{_pct(tw['fluct_beyond_share'])})" if tw else "")
           + ". Global − local, jackknife, and the label under the rule below the table: "
           + "; ".join(f"{n} {fmt_interval(c[k], '{:+.3g}')} ("
                       + _label(c[k], [row[k]["estimate"] for row in f["per_layer"]],
                                p["kinds"], tw.get(k))[1] + ")" for k, n in
                       (("H_star", "H*"), ("T_spec", "T_spec"), ("E_fine", "E_fine"),
                        ("E_coarse", "E_coarse")))
           + f"; H* is bounded by the {f['n_windows']} windows in "
           f"{sum(row['H_star_bounded'] for row in f['per_layer'])} of "
           f"{len(f['per_layer'])} layers."]
    if r:
        out.append("- **(b) routing and filtering, local (θ = 10⁴) vs global (θ = 10⁶) "
                   "heads.** " + "; ".join(
                       f"{ROUTING_LABELS.get(k, k)}: global − local "
                       f"{fmt_interval(s['trained']['difference'], '{:+.3g}')} (Gaussian "
                       f"{s['gaussian']['difference']['estimate']:+.3g}), {s['verdict']}"
                       for k, s in r["summary"].items() if k in ROUTING_LABELS) + ".")
    qa, qb = q["A"], q["B"]
    tq = (twin or {}).get("queries", {}).get("B", {})
    out.append(f"- **(c) sinks past the window edge.** Mean α_i0 for i < {W}: local "
               f"{fmt_interval(qa['alpha0']['local'])}, global "
               f"{fmt_interval(qa['alpha0']['global'])}; for i ≥ {W}: local "
               f"{fmt_interval(qb['alpha0']['local'])}, global "
               f"{fmt_interval(qb['alpha0']['global'])}. In the local layers the first "
               f"visible key takes {fmt_interval(qb['first_visible']['local'])} "
               + (f"(twin {fmt_interval(tq['first_visible']['local'])}) " if tq else "")
               + f"and is the top key for {_pct(qb['top_is_first_visible']['local'])} of the "
               f"(head, query) pairs; the top key's weight is "
               f"{fmt_interval(qb['top_weight']['local'])} (i < {W}: "
               f"{fmt_interval(qa['top_weight']['local'])}) at a mean relative lag of "
               f"{fmt_interval(qb['top_rel_lag']['local'])} (i < {W}: "
               f"{fmt_interval(qa['top_rel_lag']['local'])}; twin "
               + (fmt_interval(tq["top_rel_lag"]["local"]) if tq else "—")
               + f"); the previous token is the top key for "
               f"{_pct(qb['top_is_previous']['local'])} (twin "
               + (_pct(tq["top_is_previous"]["local"]) if tq else "—") + ")."
               + _token_sentence(p))
    return "\n".join(out)


def _token_sentence(p: dict[str, Any]) -> str:
    """Which key token takes the most attention mass (position 0 aside) from the queries
    i ≥ W, counted over the local layers."""
    if "key_tokens" not in p:
        return ""
    count: dict[str, int] = {}
    for row in p["key_tokens"]["B"]:
        if p["kinds"][p["layers"].index(row["layer"])] == "local" and row["tokens"]:
            t = row["tokens"][0]["text"]
            count[t] = count.get(t, 0) + 1
    top = sorted(count.items(), key=lambda kv: -kv[1])
    return (" The key token receiving the most of that mass, per local layer: "
            + ", ".join(f"`{t}` in {n}" for t, n in top) + " of "
            f"{sum(count.values())} layers (table below).")


def run_markdown(steps: dict[str, dict[str, Any]]) -> str:
    """How each file was made: the command, the sample and the step's own wall time."""
    what = {"routing": "weights only ({n} heads)", "probes": "{n} windows × {T} tokens",
            "twin": "{n} windows × {T} tokens, random-weight twin"}
    lines = ["| file | command | data | wall time (s) | threads |", "|---|---|---|---|---|"]
    for step, d in steps.items():
        n = (len(d["per_head"]["rf_delta0"]) * d["n_heads"] if step == "routing"
             else d["n_windows"])
        data = what[step].format(n=n, T=d.get("length"))
        lines.append(f"| `{step}.json` | `{d['command']}` | {data} | {d['seconds']} | "
                     f"{d['threads']} |")
    return "\n".join(lines)


def tables(results_dir: str | Path) -> dict[str, str]:
    """Every generated block of the section, by key (none when there are no results)."""
    d = Path(results_dir)
    p, r, twin = _load(d, "probes"), _load(d, "routing"), _load(d, "twin")
    out: dict[str, str] = {}
    if p is not None:
        out[PREFIX + "answers"] = answers_markdown(p, r, twin)
        out[PREFIX + "fields"] = fields_markdown(p, twin)
        out[PREFIX + "sinks"] = sinks_markdown(p, twin)
        if "key_tokens" in p:
            out[PREFIX + "tokens"] = tokens_markdown(p)
    if r is not None:
        out[PREFIX + "routing"] = routing_markdown(r)
    steps = {k: v for k, v in (("routing", r), ("probes", p), ("twin", twin)) if v is not None}
    if steps:
        out[PREFIX + "run"] = run_markdown(steps)
    return out


def markdown(results_dir: str | Path) -> str:
    return "\n\n".join(tables(results_dir).values())
