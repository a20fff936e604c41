"""The generated blocks of docs/real_decoder.md from the committed results of
``tl-spectral study real-decoder``: the verdict table and the "In short" bullets from the claims
registry's records, and one table per step; SmolLM2's from ``docs/results/real_decoder``,
Gemma-3's (``real_decoder/gemma3-270m/...`` blocks) from its ``gemma3-270m`` folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from tl_spectral_studies._common import fmt_interval

REGISTRY_KEYS = {"smollm2-135m": "smollm2-135m", "gemma3-270m": "gemma-3-270m"}
"""The claims registry's column of each zoo model of the study."""
GEMMA_DIR = "gemma3-270m"
"""Gemma-3's results folder under SmolLM2's (``docs/results/real_decoder/gemma3-270m``)."""


# ----------------------------------------------------------------------------- verdicts
def verdicts(results_dir: str | Path, model: str = "smollm2-135m") -> list[dict]:
    """The verdict records of the claims registry (:mod:`tl_spectral_studies.claims`) for the
    results in ``results_dir``, as ``verdicts.json`` holds them (measured claims only).
    Every label comes from :mod:`tl_spectral_studies.claims.rules`. ``model``: a zoo name
    of :data:`REGISTRY_KEYS` or a registry column key."""
    import dataclasses

    from tl_spectral_studies.claims import catalog, registry, render

    key = REGISTRY_KEYS.get(model, model)
    m = dataclasses.replace(registry.MODELS[key], results=str(Path(results_dir).resolve()))
    recs = catalog.records(registry.ROOT, {m.key: m})
    return render.model_records(recs, m.key)


# ----------------------------------------------------------------------------- tables
def verdict_markdown(V: list[dict]) -> str:
    """The verdict table of docs/real_decoder.md from the records: number, n (per cell × cells
    for a panel-backed record), minimum detectable effect, label, sensitivity, rule."""
    L = ["| claim (paper) | number [95% CI] | n | MDE | verdict | sensitivity | rule |",
         "|---|---|---|---|---|---|---|"]
    for v in V:
        note = f" ({v['note']})" if v.get("note") else ""
        n = "—" if v.get("n") is None else (f"{v['n']} × {v['cells']} cells" if v.get("cells")
                                           else str(v["n"]))
        mde = "—" if v.get("mde") is None else f"{v['mde']:.3g}"
        cells = [f"{v['id']}: {v['claim']}", f"{v['number']}{note}", n, mde, v["label"],
                 v.get("sensitivity") or "—", v["rule"]]
        L.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return "\n".join(L)


def _iv_cell(iv: dict, i: int | None = None, fmt: str = "{:.3f}") -> str:
    if i is None:
        return fmt_interval(iv, fmt)
    return fmt_interval({k: iv[k][i] for k in ("estimate", "low", "high")}, fmt)


def sinks_markdown(s: dict) -> str:
    lay = s["layer_ids"]
    out = []
    for name, st in s["settings"].items():
        out.append(f"**{name}** (first tokens: {', '.join(sorted(set(st['first_tokens'])))}; "
                   f"sink layers: {st['sink_layers'] or 'none'}; zero the sink in every layer: "
                   f"PPL'/PPL − 1 = {fmt_interval(st['zero_sink_ppl'], '{:+.3g}')})")
        out.append("")
        out.append("| layer | α_i0 | C_i0 | ‖ṽ_0‖/mean ‖ṽ_j‖ | cos(o,ṽ_0) | cos(o,ṽ_j) | "
                   "cos(ṽ_0,s) | 0<ρ*<1 | ‖o'‖/‖o‖−1 | cone clean → zeroed | max head α_i0 | "
                   "sink heads (key score > 0.3) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        b, p = st["brute"], st["probe"]
        for i, li in enumerate(lay):
            out.append(
                f"| {li} | {_iv_cell(b['attn0'], i)} | {_iv_cell(b['C0'], i)} | "
                f"{_iv_cell(b['v0_over_vothers'], i, '{:.2f}')} | "
                f"{b['cos_factor']['estimate'][i]:.2f} | "
                f"{b['cos_factor_others']['estimate'][i]:.2f} | "
                f"{_iv_cell(p['cos_v0_s'], i, '{:.2f}')} | "
                f"{_iv_cell(p['rho_star_in_0_1'], i, '{:.2f}')} | "
                f"{b['rel_norm_change']['estimate'][i]:+.2f} | "
                f"{b['cone_clean']['estimate'][i]:.2f} → {b['cone_zeroed']['estimate'][i]:.2f} | "
                f"{max(st['brute_head_attn0'][i]):.3f} | "
                f"{sum(1 for x in st['head_key_score'][i] if x > 0.3)} of "
                f"{len(st['head_key_score'][i])} |")
        out.append("")
    return "\n".join(out).rstrip()


def faith_markdown(f: dict) -> str:
    L = ["| setting | measure | comprehensiveness area [95% CI] | sufficiency area [95% CI] |",
         "|---|---|---|---|"]
    for si, sname in enumerate(f["settings"]):
        for mi, m in enumerate(f["measures"]):
            c = {k: f["areas"][k][si][mi][0] for k in ("estimate", "low", "high")}
            s = {k: f["areas"][k][si][mi][1] for k in ("estimate", "low", "high")}
            L.append(f"| {sname} | {m} | {fmt_interval(c)} | {fmt_interval(s)} |")
    L.append("")
    L.append(f"Areas of the relative ΔPPL curve (PPL'/PPL − 1) over removal fractions "
             f"{f['fractions'][0]}–{f['fractions'][-1]}; {f['n_docs']} documents of "
             f"{f['length']} tokens (start token first), layer-wide ranking; intervals: "
             f"bootstrap over documents. Aliases (identical rankings by construction): "
             f"{f['aliases'] or 'none'}.")
    return "\n".join(L)


def routing_markdown(r: dict) -> str:
    offs = r["offsets"]
    L = ["| layer | " + " | ".join(f"Δ = {o}" for o in offs) + " | causal mean (min–max) | "
         "rank R at Δ = 0 | rank F at Δ = 0 |", "|---|" + "---|" * (len(offs) + 3)]
    for row in r["per_layer"]:
        name = f"{row['layer']} ({row['type']})" if "type" in row else f"{row['layer']}"
        L.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in row["rf_by_offset"])
                 + f" | {row['rf_causal']:.3f} ({row['rf_causal_min']:.3f}–"
                 f"{row['rf_causal_max']:.3f}) | {row['rank_R_by_offset'][0]:.1f} | "
                 f"{row['rank_F_by_offset'][0]:.1f} |")
    L.append("| Gaussian | " + " | ".join(f"{x:.3f}" for x in r["gaussian_rf_by_offset"])
             + f" | {r['gaussian']['routing_fraction_causal']:.3f} | "
             f"{r['gaussian']['eff_rank_R_delta0']:.1f} | {r['gaussian']['eff_rank_F_delta0']:.1f} |")
    L.append("")
    L.append(f"Routing fraction ‖R(Δ)‖²/‖M(Δ)‖² (head mean), M(Δ) = W_Q R(Δ) W_Kᵀ with the RMSNorm "
             f"gain folded; causal mean over the offsets of a {r['n_ctx']}-token window; "
             f"capacity {r['capacity']}. Over all {r['n_heads_total']} heads: Δ = 0 "
             f"{fmt_interval(r['routing_fraction_delta0'])}, causal "
             f"{fmt_interval(r['routing_fraction_causal'])}; Δ = {offs[-1]} minus Δ = 0 "
             f"{fmt_interval(r['offset_effect'], '{:+.3g}')}; last − first third of the "
             f"layers: causal routing fraction {fmt_interval(r['depth_effect_rf'], '{:+.3g}')}, "
             f"rank of R {fmt_interval(r['depth_effect_rank_R'], '{:+.3g}')} (intervals: "
             f"bootstrap over heads).")
    if "by_type" in r:
        L += ["", by_type_markdown(r["by_type"])]
    return "\n".join(L)


def by_type_markdown(bt: dict) -> str:
    """The budget and rank of the local (sliding-window) and global layers apart."""
    L = ["| layer type | layers | heads | routing fraction Δ = 0 | causal | rank R at Δ = 0 | "
         "rank F at Δ = 0 | Gaussian: fraction Δ = 0 / causal / rank R |", "|---|" + "---|" * 7]
    for t, x in bt.items():
        g = x["gaussian"]
        L.append(f"| {t} | {_layers_text(x['layers'])} | {x['n_heads']} | "
                 f"{fmt_interval(x['routing_fraction_delta0'])} | "
                 f"{fmt_interval(x['routing_fraction_causal'])} | "
                 f"{fmt_interval(x['eff_rank_R_delta0'], '{:.1f}')} | "
                 f"{fmt_interval(x['eff_rank_F_delta0'], '{:.1f}')} | "
                 f"{g['routing_fraction_delta0']:.3f} / {g['routing_fraction_causal']:.3f} / "
                 f"{g['eff_rank_R_delta0']:.1f} |")
    return "\n".join(L)


def _layers_text(ids: list[int]) -> str:
    from tl_spectral_studies.claims.seed003 import layer_list

    return layer_list(ids)


def scales_markdown(sc: dict) -> str:
    b = sc["bootstrap"]
    types = sc.get("layer_types")
    L = ["| layer | dominant scales | E fine | E medium | E coarse | E fine − coarse [95% CI] | "
         "T_spec (R²) | H*(0.1) [jackknife] | heads rec. / uniform |", "|---|" + "---|" * 8]
    for i, row in enumerate(sc["table"]):
        jk = b["jackknife"]["layers"][i]["H_star"]
        name = f"{row['layer']} ({types[i]})" if types else f"{row['layer']}"
        L.append(f"| {name} | {row['dominant_scales']} | {row['E_fine']:.2f} | "
                 f"{row['E_medium']:.2f} | {row['E_coarse']:.2f} | "
                 f"{fmt_interval(b['layers'][i]['E_fine_minus_coarse'], '{:+.2f}')} | "
                 f"{row['T_spec']:.3g} ({row['tspec_r2']:.2f}) | {row['H_star']} "
                 f"[{jk['low']:.0f}, {jk['high']:.0f}] | {row['recommended_heads']} / "
                 f"{row['uniform_heads']} |")
    L.append("")
    L.append(f"N = {sc['n_docs']} windows × {sc['length']} tokens ({sc['corpus']}); H* ≤ N − 1 "
             f"by construction. Per-head diversity (layers "
             f"{[p['layer'] for p in sc['per_head']]}): "
             + "; ".join(f"layer {p['layer']}: {_diversity_text(p['diversity'])}"
                         for p in sc["per_head"]) + ".")
    if types:
        L += ["", scales_by_type_markdown(sc)]
    return "\n".join(L)


def scales_by_type_markdown(sc: dict) -> str:
    """Band energies and H* of the local (sliding-window) and global layers apart: the mean
    over each type's layers (point estimates of the rows above)."""
    L = ["| layer type | layers | mean E fine | mean E medium | mean E coarse | mean E fine − "
         "coarse | H*(0.1) range |", "|---|" + "---|" * 6]
    rows, types = sc["table"], sc["layer_types"]
    for t in ("local", "global"):
        sel = [r for r, x in zip(rows, types) if x == t]
        if not sel:
            continue

        def mean(k: str, sel: list = sel) -> float:
            return sum(float(r[k]) for r in sel) / len(sel)

        hs = [str(r["H_star"]) for r in sel]
        L.append(f"| {t} | {_layers_text([int(r['layer']) for r in sel])} | "
                 f"{mean('E_fine'):.2f} | {mean('E_medium'):.2f} | {mean('E_coarse'):.2f} | "
                 f"{mean('E_fine') - mean('E_coarse'):+.2f} | {min(hs, key=_h)}–"
                 f"{max(hs, key=_h)} |")
    return "\n".join(L)


def _h(x: str) -> float:
    try:
        return float(str(x).lstrip(">≥ ").split("–")[0])
    except ValueError:
        return float("nan")


def _diversity_text(d: dict) -> str:
    def g(k: str, fmt: str = "{:.2f}") -> str:
        v = d.get(k)
        return "—" if v is None else fmt.format(v) if isinstance(v, float) else str(v)

    return (f"peak scales {g('peak_scale_min')}–{g('peak_scale_max')} "
            f"(log2 std {g('log2_peak_scale_std')}), {g('n_scale_classes')} scale classes, "
            f"band counts {d.get('band_counts')}, mean pairwise TV {g('mean_pairwise_tv')}, "
            f"head H* {g('H_star_min')}–{g('H_star_max')}")


def interventions_markdown(it: dict) -> str:
    L = [f"Clean PPL {it['ppl_clean']:.3f} ({it['n_docs']} windows × {it['length']} tokens).",
         "", "| leading layers linearized k | PPL | PPL'/PPL − 1 [95% CI, paired] |",
         "|---|---|---|"]
    for row in it["linearization"]:
        L.append(f"| {row['k']} | {row['ppl_changed']:.3f} | "
                 f"{fmt_interval(row, '{:+.3g}')} |")
    L += ["", "| layers | keep routing (filtering removed) | keep filtering (routing removed) | "
          "log PPL difference (routing removed − filtering removed) |", "|---|---|---|---|"]
    for label, row in it["removal"].items():
        L.append(f"| {label} | {fmt_interval(row['keep_routing'], '{:+.3g}')} | "
                 f"{fmt_interval(row['keep_filtering'], '{:+.3g}')} | "
                 f"{fmt_interval(row['log_ppl_routing_removed_minus_filtering_removed'], '{:+.3g}')} |")
    return "\n".join(L)


STEP_TABLES = (("sinks", sinks_markdown), ("faithfulness", faith_markdown),
               ("routing", routing_markdown), ("scales", scales_markdown),
               ("interventions", interventions_markdown))


def tables(results_dir: str | Path) -> dict[str, str]:
    """Every generated block of docs/real_decoder.md, by key: SmolLM2's from ``results_dir``,
    Gemma-3's (``real_decoder/gemma3-270m/<block>``) from its :data:`GEMMA_DIR` there."""
    import dataclasses

    from tl_spectral_studies.claims import catalog, registry, render

    d = Path(results_dir)
    out = {"real_decoder/verdict": verdict_markdown(verdicts(d))}
    m = dataclasses.replace(registry.MODELS["smollm2-135m"], results=str(d.resolve()))
    out["real_decoder/in_short"] = render.in_short(catalog.records(registry.ROOT, {m.key: m}))
    out.update(step_tables(d, "real_decoder"))
    g = d / GEMMA_DIR
    if g.is_dir():
        out[f"real_decoder/{GEMMA_DIR}/verdict"] = verdict_markdown(verdicts(g, GEMMA_DIR))
        out.update(step_tables(g, f"real_decoder/{GEMMA_DIR}"))
    from tl_spectral_studies.evidence_summary import run_times, runs_markdown

    ev = d / "evidence"
    runs = [run_times(ev, m) for m in ("smollm2-135m", "gemma3-270m") if (ev / m).is_dir()]
    if runs:  # the full panel's jobs as they ran: the compute plan measured at full size
        out["real_decoder/evidence_runs"] = runs_markdown(runs)
    for model, key in (("smollm2-135m", "real_decoder/evidence_cells"),
                       ("gemma3-270m", "real_decoder/gemma3-270m/evidence_cells")):
        summary = d / "evidence" / model / "summary.json"
        if summary.is_file():  # the evidence panel's cells so far
            from tl_spectral_studies.evidence_summary import cells_markdown

            out[key] = cells_markdown(json.loads(summary.read_text()))
    from tl_spectral_studies import gemma_window_tables  # the last section: Gemma-3's window

    out.update(gemma_window_tables.tables(d / "gemma_window"))
    return out


def step_tables(d: Path, prefix: str) -> dict[str, str]:
    """The table of every step whose results are in ``d``, keyed ``prefix/<step>``."""
    out = {}
    for step, fn in STEP_TABLES:
        p = d / f"{step}.json"
        if p.is_file():
            out[f"{prefix}/{step}"] = fn(json.loads(p.read_text()))
    return out


def markdown(results_dir: str | Path, model: str = "smollm2-135m") -> str:
    """The verdict table and step tables of one model's results folder."""
    d = Path(results_dir)
    if model == "smollm2-135m":
        return "\n\n".join(tables(d).values())
    return "\n\n".join([verdict_markdown(verdicts(d, model)),
                        *step_tables(d, "real_decoder").values()])


def write_verdicts(results_dir: str | Path, model: str = "smollm2-135m") -> list[dict]:
    V = verdicts(results_dir, model)
    (Path(results_dir) / "verdicts.json").write_text(
        json.dumps(V, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return V


