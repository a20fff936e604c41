"""The generated blocks of docs/routing_filtering.md other than the claim table (the study's
tables, the rank-truncation and S–D run blocks), rendered from the committed results; the
claim table is :mod:`tl_spectral_studies.routing_claims`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tl_spectral.interventions.ablations import (
    ABLATIONS_SD,
    ABLATIONS_SOFTMAX,
)
from tl_spectral_studies.routing_claims import (  # noqa: F401  (re-exported)
    FAR_BELOW_CAPACITY,
    HEADS_NOTE,
    LATE_RANK,
    MINIMAL_RANK,
    PAPER_COLLAPSE_PPL,
    RETRAIN,
    RUNS_COMMAND,
    SMOL_IDS,
    STANDARD_MODELS,
    STUDY_COMMAND,
    _head_mean,
    _heads,
    _per_layer,
    claim_rows,
    sd_truncation_label,
    truncation_label,
    verdict_markdown,
)
from tl_spectral_studies.routing_rotary import rotary_cascade_markdown


def _fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def study_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables of a study summary (``summary.json`` of :func:`run_study`): overview,
    routing rank per layer, ablations, the cascade over training, Gaussian baselines.

    Longer than 80 lines on purpose: one table per section of the summary, in the doc's order."""
    L: list[str] = []
    models = summary["models"]
    L.append("| model | attention | LN | params | step (finished) | val PPL | heads | unstable "
             "| routing fraction | rank R (entropy / PR) / capacity |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for n, e in models.items():
        if "error" in e:
            why = (f"needs retraining: `{RETRAIN[n]}`, then `{RUNS_COMMAND}`" if n in RETRAIN
                   else f"missing: {e['error']}")
            L.append(f"| {n} | — | — | — | {why} | | | | | |")
            continue
        q = e["qk"]
        cfg = e.get("config", {})
        att = cfg.get("attention", "softmax (BERT)")
        ln = {"ln": "yes", "none": "no"}.get(cfg.get("normalization"), "post-LN")
        ppl = e.get("val_metrics_all_windows", {}).get("val_ppl")
        if ppl is None and "ablation" in e:
            ppl = e["ablation"]["baseline_ppl"]
        stp = f"{e['step']} ({'yes' if e['finished'] else 'no'})" if "step" in e else "—"
        L.append(f"| {n} | {att} | {ln} | {e.get('n_params', '—')} | {stp} | "
                 f"{_fmt(ppl) if ppl else '—'} | {q['n_heads_total']} | {q['unstable_heads']} | "
                 f"{q['routing_fraction_mean']:.3f} | {q['rank_R_mean']:.1f} / "
                 f"{q['pr_R_mean']:.1f} / {q['capacity']} |")
    L.append("")
    n_layers = max((len(e["qk"]["layers"]) for e in models.values() if "qk" in e), default=0)
    L.append("| model | rank of | " + " | ".join(f"L{i}" for i in range(n_layers))
             + " | minimal-rank layers |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "qk" not in e:
            continue
        if "sd" in e:
            r = [x["rank_S"] for x in e["sd"]["layers"]]
            pr = e["sd"]["layers_pr"]
            share = f"{e['sd']['minimal_rank_layer_share']:.0%}"
            L.append(f"| {n} | S (entropy / PR) | " + " | ".join(
                f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + f" | {share} |")
        r = [x["rank_R"] for x in e["qk"]["layers"]]
        pr = e["qk"]["layers_pr"]
        L.append(f"| {n} | R (entropy / PR) | " + " | ".join(
            f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + " | |")
    L.append("")
    kinds = list(ABLATIONS_SD) + list(ABLATIONS_SOFTMAX)
    L.append("| model | PPL (windows) | " + " | ".join(k.replace("_", " ") for k in kinds) + " |")
    L.append("|---|---|" + "---|" * len(kinds))
    for n, e in models.items():
        if "ablation" not in e:
            continue
        a = e["ablation"]
        cells = []
        for k in kinds:
            r = [x for x in a["rows"] if x["ablation"] == k and x["layers"] == "all"]
            cells.append(f"{r[0]['delta_ppl']:+.3g} ({r[0]['rel_delta']:+.1%})" if r else "—")
        L.append(f"| {n} | {a['baseline_ppl']:.3g} ({a['n_windows']}×{a['seq_len']}) | "
                 + " | ".join(cells) + " |")
    L.append("")
    L.append("Per-layer ablations (ΔPPL when only that layer is ablated):")
    L.append("")
    L.append("| model | ablation | " + " | ".join(f"L{i}" for i in range(n_layers)) + " |")
    L.append("|---|---|" + "---|" * n_layers)
    for n, e in models.items():
        if "ablation" not in e:
            continue
        for k in kinds:
            rows = sorted((x for x in e["ablation"]["rows"] if x["ablation"] == k
                           and x["layers"] != "all"), key=lambda x: x["layers"])
            if rows:
                L.append(f"| {n} | {k.replace('_', ' ')} | "
                         + " | ".join(f"{x['delta_ppl']:+.3g}" for x in rows) + " |")
    L.append("")
    L.append("Routing rank per layer over training (entropy effective rank, mean over heads; "
             "S–D models: rank of S / rank of R = W_P S W_Pᵀ; softmax: rank of R; val loss in "
             "nats where the run evaluated):")
    L.append("")
    L.append("| model | step | " + " | ".join(f"L{i}" for i in range(n_layers)) + " | val loss |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "cascade_steps" not in e:
            continue
        steps = e["cascade_steps"]
        pick = sorted({0, len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4,
                           len(steps) - 1})
        is_sd = "sd" in e
        for i in pick:
            vl = e["cascade_val_loss"][i]
            if is_sd and "cascade_rank_R_mean" in e:
                cells = [f"{a:.1f} / {b:.1f}" for a, b in zip(e["cascade_rank_mean"][i],
                                                             e["cascade_rank_R_mean"][i])]
            else:
                cells = [f"{x:.1f}" for x in e["cascade_rank_mean"][i]]
            L.append(f"| {n} | {steps[i]} | " + " | ".join(cells) + " | "
                     + (f"{vl:.3f}" if vl > 0 else "") + " |")
    L.append("")
    L.append("| Gaussian W_Q, W_K (d_model, heads, d_head) | routing fraction | rank R (entropy "
             "/ PR) / capacity | unstable heads |")
    L.append("|---|---|---|---|")
    for n, b in summary.get("baselines", {}).items():
        L.append(f"| {n.split('_', 1)[1].replace('_', ', ')} | {b['routing_fraction_mean']:.3f} "
                 f"| {b['rank_R_mean']:.1f} / {b['pr_R_mean']:.1f} / {b['capacity']} | "
                 f"{b['unstable_heads']} of {b['n_heads_total']} |")
    return "\n".join(L) + "\n"


def rank_truncation_markdown(path: str | Path) -> str:
    """The rank-truncation table of docs/routing_filtering.md from
    ``docs/results/surgery/rank_truncation.json``: relative ΔPPL (%) with its interval per
    part and r, and the paired difference filtering − routing (points; bold when its interval
    excludes 0)."""
    s = json.loads(Path(path).read_text())
    rs = sorted({r["r"] for m in s["models"] for r in m["rows"] if r["r"] < m["full_rank"]})
    out = ["| model (baseline PPL) | part | " + " | ".join(f"r = {r}" for r in rs) + " |",
           "|---|---|" + "---|" * len(rs)]
    for m in s["models"]:
        by = {(r["part"], r["r"]): r for r in m["rows"]}
        sd = m["attention"] == "sd"
        for k, part in enumerate(("routing", "filtering")):
            cells = []
            for r in rs:
                x = by.get((part, r))
                cells.append("0 (full)" if r >= m["full_rank"] else "—" if x is None else
                             f"{100 * x['rel_delta_ppl']:+.1f}% [{100 * x['rel_delta_low']:.1f}, "
                             f"{100 * x['rel_delta_high']:.1f}]")
            name = f"{m['model']} ({m['baseline_ppl']:.3f})" if k == 0 else ""
            out.append(f"| {name} | {part}{' (S)' if sd and k == 0 else ' (D)' if sd else ''} | "
                       + " | ".join(cells) + " |")
        pd = {x["r"]: x for x in m["paired"]}
        cells = []
        for r in rs:
            x = pd.get(r)
            if x is None or r >= m["full_rank"]:
                cells.append("")
                continue
            c = (f"{100 * x['filtering_minus_routing']:+.1f} [{100 * x['low']:+.1f}, "
                 f"{100 * x['high']:+.1f}]")
            cells.append(f"**{c}**" if x["low"] > 0 or x["high"] < 0 else c)
        out.append("| | **filtering − routing** | " + " | ".join(cells) + " |")
    out += ["", f"{s['models'][0]['windows']}; {s['models'][0]['interval']}; differences in "
                f"percentage points, paired over the same resamples. Full rank (both parts "
                f"whole) gives the baseline exactly and is left out. `{s['command']}`."]
    return "\n".join(out)


def tables(results_dir: str | Path, *, smol_verdicts: str | Path | None = None
           ) -> dict[str, str]:
    """Every generated block of docs/routing_filtering.md, by key, from the committed
    ``summary.json`` and per-head CSVs. The cascade over training needs the training runs
    (not shipped): its block says how to retrain. The sections' verdict lines
    (``routing/verdict_line/<key>``) come from the claim table's own rows; the claim table's
    SmolLM2 column from ``smol_verdicts`` (see :func:`verdict_markdown`)."""
    from tl_spectral_studies.verdicts import verdict_line

    d = Path(results_dir)
    long = sd_noln_long_markdown(d.parent / "surgery")
    parts = [c for c in study_markdown(json.loads((d / "summary.json").read_text())).strip()
             .split("\n\n") if c.startswith("|")]  # the tables, without their headings
    keys = ["overview", "ranks", "ablations", "ablations_layers", "cascade_training",
            "baselines"]
    rows = claim_rows(d)
    out = {"routing/verdict": verdict_markdown(d, smol_verdicts=smol_verdicts)}
    for key in ("inversion", "cascade", "filtering_collapse"):
        if any(r.key == key for r in rows):
            out[f"routing/verdict_line/{key}"] = verdict_line(rows, key)
    rt = d.parent / "surgery" / "rank_truncation.json"
    if rt.is_file():
        out["routing/rank_truncation"] = rank_truncation_markdown(rt)
    if (d / "rotary_sd" / "summary.json").is_file():
        out["routing/rotary_sd"] = rotary_cascade_markdown(d / "rotary_sd").strip()
    for k, p in zip(keys, parts):
        out[f"routing/{k}"] = p
    if out["routing/cascade_training"].count("\n") < 2:  # a header without rows
        out["routing/cascade_training"] = (
            "The cascade over training reads every checkpoint of the training runs, which are "
            "not shipped (the zoo holds final weights only). Needs retraining: "
            + "; ".join(f"`{c}`" for c in (
                "tl-spectral train --config configs/char-shakespeare.json",
                "tl-spectral train --config configs/char-shakespeare-noln.json",
                "tl-spectral train --config configs/sd-char-shakespeare.json",
                "tl-spectral train --config configs/sd-char-shakespeare-noln.json",
                RETRAIN["bpe-softmax-noln"], RETRAIN["bpe-sd-noln"]))
            + f", then `{RUNS_COMMAND}`.")
    if long:
        out["routing/sd_noln_long"] = long
    if (d / "sd_runs" / "summary.json").is_file():
        from tl_spectral_studies.sd_runs import sd_runs_markdown

        out["routing/sd_runs"] = sd_runs_markdown(d / "sd_runs").strip()
    return out


def sd_noln_long_markdown(surgery_dir: Path) -> str:
    """Rank of S and effective routing rank per layer of ``sd-noln-long`` at its final step,
    from the allocation files of the surgery study (``allocation_sdS.json``: rank of S,
    ``allocation_sd.json``: effective ``W_P S W_Pᵀ``; means over the 8 heads)."""
    pS, pR = surgery_dir / "allocation_sdS.json", surgery_dir / "allocation_sd.json"
    if not (pS.is_file() and pR.is_file()):
        return ""
    S, R = json.loads(pS.read_text()), json.loads(pR.read_text())
    L = len(S["rank"])
    return "\n".join([
        "| step | rank of | " + " | ".join(f"L{i}" for i in range(L)) + " |",
        "|---|---|" + "---|" * L,
        f"| {S['step']} | S | " + " | ".join(f"{x:.1f}" for x in S["rank"]) + " |",
        f"| {R['step']} | effective routing W_P S W_Pᵀ | "
        + " | ".join(f"{x:.1f}" for x in R["rank"]) + " |",
        "",
        "The earlier checkpoints (steps 300, 500, 1,000) and the per-head ranks were read from "
        "the training run, which is not shipped. Needs retraining: "
        f"`{RETRAIN['sd-noln-long']}`, then `tl-spectral study surgery cascade --model "
        "runs/sd-char-shakespeare-noln-long`."])


def markdown(results_dir: str | Path) -> str:
    """The doc tables of docs/routing_filtering.md from ``results_dir`` (:func:`tables`, each
    under its key)."""
    return "\n\n".join(f"<!-- {k} -->\n{v}" for k, v in tables(results_dir).items()) + "\n"



