"""The generated blocks of docs/surgery.md (SPEC B.5–B.6, seed 002): the claim table with
its labels (collapse by :func:`tl_spectral_studies.claims.rules.first_collapse`), the
linearization, fine-tuning, allocation and seed tables, from the committed results.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


# ----------------------------------------------------------------------------- doc tables
def _md_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])

    def f(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(f(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(out)


RETRAIN = {
    "softmax-ln": "tl-spectral train --config configs/char-shakespeare.json",
    "softmax-noln": "tl-spectral train --config configs/char-shakespeare-noln.json",
    "sd-ln": "tl-spectral train --config configs/sd-char-shakespeare.json",
    "sd-noln": "tl-spectral train --config configs/sd-char-shakespeare-noln.json",
    "sd-noln-long": "tl-spectral train --config configs/sd-char-shakespeare-noln-long.json",
}
"""The training run behind each model name of the curves (none of these runs, with their
checkpoints, is shipped; the zoo holds only the final char-shakespeare[-noln] and
sd-char-shakespeare[-noln] weights)."""

ALLOC_RETRAIN = {
    "long": ("allocate --model runs/char-shakespeare-noln --budget 0.5 --multiple 2 --tag long; "
             "train-alloc --which W --tag long --steps 2600 --warmup 200 --eval-every 200 "
             "[--seed 1] for W in uniform, cascade, matched, and --seed 2 for W in cascade, "
             "matched; evaluate --tag long"),
    "sd": ("allocate --model runs/sd-char-shakespeare-noln-long --budget 0.5 --multiple 2 "
           "--source R --tag sd; train-alloc --which W --tag sd --steps 2600 --warmup 200 "
           "--eval-every 200 for W in uniform, cascade, matched, and --seed 1, --seed 2 for W "
           "in cascade, matched; evaluate --tag sd"),
    "sdS": ("allocate --model runs/sd-char-shakespeare-noln-long --budget 0.65 --multiple 2 "
            "--source S --tag sdS; train-alloc --which W --tag sdS --steps 2600 --warmup 200 "
            "--eval-every 200 for W in uniform, cascade; evaluate --tag sdS"),
    "": ("allocate --model runs/char-shakespeare-noln --budget 0.5 --multiple 2; train-alloc "
         "--which W --steps 300 for W in uniform, cascade; evaluate"),
}
"""The ``tl-spectral study surgery`` subcommands behind each allocation study (by tag),
after training the measured model (:data:`RETRAIN`)."""

SEED_SPREAD_RULE = ("two seeds: a difference counts only when both seeds give the same sign "
                    "and each exceeds the uniform model's own seed-to-seed change")


def _curves(d: Path) -> dict[str, Any]:
    from tl_spectral.interventions.surgery import LinearizationCurve

    return {p.stem[len("curve_"):]: LinearizationCurve.load(p)
            for p in sorted(d.glob("curve_*.safetensors"))}


def _where(note: str) -> str:
    """``runs/NAME/checkpoints/step_0001000 (step 1000)`` -> ``NAME, step 1000``: the
    checkpoint a curve was measured on, without the (unshipped) run folder."""
    run = note.split("/")[1] if note.startswith("runs/") else note
    step = note[note.find("(") + 1:note.rfind(")")] if "(" in note else ""
    return f"{run}, {step}" if step else run


SHIPPED = {"softmax-ln": "char-shakespeare", "softmax-noln": "char-shakespeare-noln",
           "sd-ln@1000": "sd-char-shakespeare", "sd-noln@1000": "sd-char-shakespeare-noln"}
"""Curves whose checkpoint is the final weights of a zoo model (shipped)."""


def _retrain_line(names: Sequence[str]) -> str:
    shipped = [n for n in names if n.removesuffix("_ft") in SHIPPED]
    other = [n for n in names if n not in shipped]
    parts = []
    if shipped:
        parts.append("the checkpoints of " + ", ".join(sorted({n.removesuffix("_ft") for n in shipped}))
                     + " are the shipped zoo models "
                     + ", ".join(sorted({SHIPPED[n.removesuffix("_ft")] for n in shipped}))
                     + " (`tl-spectral study surgery --out DIR` recomputes the zero-shot curves "
                       "of char-shakespeare-noln and sd-char-shakespeare-noln from them)")
    base = sorted({n.split("@")[0].removesuffix("_ft") for n in other})
    if base:
        parts.append("the others need retraining (the runs and their checkpoints are not "
                     "shipped): " + "; ".join(f"`{RETRAIN[b]}` ({b})" for b in base if b in RETRAIN)
                     + ", then `tl-spectral study surgery curves ...` as recorded in "
                       "`tl_spectral_studies/surgery.py`")
    return "Re-checking: " + "; ".join(parts) + "."


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def linearization_markdown(curves: dict[str, Any], names: Sequence[str],
                           header: str = "model (final, 2,600 steps)", *,
                           retrain: bool = True) -> str:
    """Zero-shot relative ΔPPL (%) for k = 1..L, with the largest k within 5% and 1.4%
    (``""`` when none of ``names`` is in ``curves``); ``retrain``: with the line saying how
    to re-check them."""
    cs = [(n, curves[n]) for n in names if n in curves]
    if not cs:  # a folder without these curves (e.g. the output of run_study)
        return ""
    L = max(len(c.ks) for _, c in cs) - 1
    rows = [f"| {header} | PPL k=0 | " + " | ".join(f"k={k}" for k in range(1, L + 1))
            + " | k within 5% | within 1.4% |", "|---|---|" + "---|" * L + "---|---|"]
    for n, c in cs:
        rel = c.rel_delta()
        rows.append(f"| {n} ({_where(c.note)}) | {c.base_ppl:.3f} | "
                    + " | ".join(_pct(r) for r in rel[1:]) + f" | {c.max_k_within(0.05)} | "
                    f"{c.max_k_within(0.014)} |")
    if retrain:
        rows += ["", _retrain_line(names)]
    return "\n".join(rows)


def finetune_markdown(curves: dict[str, Any], names: Sequence[str]) -> str:
    """Fine-tuned curves: zero-shot, fine-tuned, control and fine-tuned vs control (%)."""
    if not any(n in curves for n in names):
        return ""
    rows = ["| model (checkpoint) | k | zero-shot | fine-tuned | control (no swap) | "
            "fine-tuned vs control |", "|---|---|---|---|---|---|"]
    for n in names:
        c = curves.get(n)
        if c is None:
            continue
        zs, ft = c.rel_delta(), c.rel_delta("fine_tuned")
        ctl = c.rel_delta("control") if c.ppl_control is not None else None
        vs = c.rel_delta("fine_tuned_vs_control") if ctl is not None else None
        for i, k in enumerate(c.ks):
            if k == 0:
                continue
            rows.append(f"| {n.removesuffix('_ft')} ({_where(c.note)}) | {k} | {_pct(zs[i])} | "
                        f"{_pct(ft[i])} | {_pct(ctl[i]) if ctl is not None else '—'} | "
                        f"{_pct(vs[i]) if vs is not None else '—'} |")
    rows += ["", _retrain_line(names)]
    return "\n".join(rows)


def _study_rows(d: Path, tag: str) -> list[dict[str, Any]] | None:
    """Rows of ``allocation_study{tag}`` with ΔPPL against the uniform model *of the same
    seed* (``delta_same_seed_%``; None where that seed has no uniform run)."""
    from tl_spectral.interventions.surgery import AllocationStudy

    p = d / f"allocation_study{tag}.safetensors"
    if not p.is_file():
        return None
    st = AllocationStudy.load(p)
    rows = []
    for r in st.rows:
        seed = r["name"].split("(seed ")[1].rstrip(")") if "(seed " in r["name"] else "0"
        rows.append({**r, "seed": seed})
    base = {r["seed"]: r for r in rows if r["name"].split(" (")[0] == "uniform"}
    ref = base.get("0", rows[0])
    for r in rows:
        b = base.get(r["seed"])
        r["attn_params_%"] = 100 * r["attention_params"] / ref["attention_params"]
        r["delta_same_seed_%"] = None if b is None else 100 * (r["ppl"] / b["ppl"] - 1)
    return rows


def allocation_markdown(d: Path, tag: str) -> str:
    rows = _study_rows(d, tag)
    if rows is None:
        return ""
    out = ["| model | seed | d_head per layer | attention params | % of uniform | PPL | "
           "ΔPPL % vs uniform of the same seed |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        dl = r["delta_same_seed_%"]
        out.append(f"| {r['name'].split(' (')[0]} | {r['seed']} | "
                   f"{' '.join(str(x) for x in r['d_head'])} | {r['attention_params']:,} | "
                   f"{r['attn_params_%']:.1f} | {r['ppl']:.3f} | "
                   f"{'—' if dl is None else f'{dl:+.2f}'} |")
    out += ["", f"Needs retraining to re-check (the models are not shipped): "
                f"`tl-spectral study surgery {ALLOC_RETRAIN.get(tag.lstrip('_'), '...')}`."]
    return "\n".join(out)


def allocations_markdown(d: Path) -> str:
    """Every cascade allocation (routing rank per layer → d_head), one table each."""
    from tl_spectral.interventions.surgery import CascadeAllocation

    md = []
    for p in sorted(d.glob("allocation*.safetensors")):
        if "study" in p.stem:
            continue
        al = CascadeAllocation.load(p)
        src = {"S": "rank of S", "R": "effective routing rank"}.get(al.source, "rank of R")
        md.append(f"`{p.stem}` ({al.model_name}, {src}, saving {100 * al.saving:.1f}%):\n\n"
                  + _md_table(al.to_rows()))
    return "\n\n".join(md)


def seed_markdown(d: Path, tag: str = "_long") -> str:
    """PPL of every model per seed (with ΔPPL against the uniform model of the same seed where
    that seed has one) and each model's seed-to-seed range."""
    rows = _study_rows(d, tag)
    if rows is None:
        return ""
    names = []
    for r in rows:
        n = r["name"].split(" (")[0]
        if n not in names:
            names.append(n)
    seeds = sorted({r["seed"] for r in rows}, key=int)
    by = {(r["name"].split(" (")[0], r["seed"]): r for r in rows}
    out = ["| model | " + " | ".join(f"seed {s}: PPL (ΔPPL vs uniform, same seed)" for s in seeds)
           + " | seed-to-seed PPL range (max / min − 1) |", "|---|" + "---|" * len(seeds) + "---|"]
    for n in names:
        cells = []
        for s in seeds:
            r = by.get((n, s))
            dl = None if r is None else r["delta_same_seed_%"]
            cells.append("—" if r is None else f"{r['ppl']:.3f}"
                         + (" (no uniform run)" if dl is None else f" ({dl:+.2f}%)"))
        p = [by[(n, s)]["ppl"] for s in seeds if (n, s) in by]
        ch = f"{100 * (max(p) / min(p) - 1):.1f}% ({len(p)} seeds)" if len(p) >= 2 else ""
        out.append(f"| {n} | " + " | ".join(cells) + f" | {ch} |")
    return "\n".join(out)


SEEDS_T_RULE = ("three or more seeds: a difference counts only when the 95% t-interval of its "
                "mean over seeds excludes 0")


def _t975(dof: int) -> float:
    """Two-sided 95% quantile of Student's t with ``dof`` degrees of freedom."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.975, dof))


def seed_difference(diffs: Sequence[float]) -> dict[str, float]:
    """Mean of per-seed differences with its 95% t-interval over seeds (n ≥ 2): mean ±
    t(0.975, n − 1) · sd / √n; ``t`` is the quantile used."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = (sum((x - mean) ** 2 for x in diffs) / (n - 1)) ** 0.5
    t = _t975(n - 1)
    half = t * sd / n ** 0.5
    return {"estimate": mean, "low": mean - half, "high": mean + half, "sd": sd, "n": n, "t": t}


def _paired_seeds(rows: list[dict[str, Any]], a: str, b: str) -> list[str]:
    """Seeds (ascending) with both model ``a`` and model ``b``."""
    have = {(r["name"].split(" (")[0], r["seed"]) for r in rows}
    return sorted((s for (n, s) in have if n == a and (b, s) in have), key=int)


def _alloc_verdict(d: Path, tag: str, a: str, b: str) -> tuple[str, str]:
    """``(numbers, verdict)`` for "model a vs model b": per seed the PPL of a relative to b
    of the same seed (%), then the seed rule (:data:`SEED_SPREAD_RULE` with two seeds,
    :data:`SEEDS_T_RULE` with three or more)."""
    rows = _study_rows(d, tag) or []
    by = {(r["name"].split(" (")[0], r["seed"]): r for r in rows}
    seeds = _paired_seeds(rows, a, b)
    diffs = [100 * (by[(a, s)]["ppl"] / by[(b, s)]["ppl"] - 1) for s in seeds]
    spread = _uniform_spread(rows) if sum(n == "uniform" for n, _ in by) >= 2 else None
    nums = ", ".join(f"{x:+.2f}%" for x in diffs) + f" (seed{'s' if len(diffs) > 1 else ''} "
    nums += " / ".join(seeds) + ")"
    iv = seed_difference(diffs) if len(diffs) >= 3 else None
    if iv is not None:
        nums += f"; mean {iv['estimate']:+.2f}% [{iv['low']:+.2f}, {iv['high']:+.2f}]"
    if spread is not None:
        nums += f"; uniform seed-to-seed range {spread:.1f}%"
    if len(diffs) < 2:
        return nums, "not distinguishable at this size (one seed; no spread to compare with)"
    if iv is not None:
        if iv["low"] > 0 or iv["high"] < 0:
            return nums, "resolved (" + ("worse" if iv["estimate"] > 0 else "better") + ")"
        return nums, "not distinguishable at this size (" + SEEDS_T_RULE + ")"
    same = all(x > 0 for x in diffs) or all(x < 0 for x in diffs)
    if same and spread is not None and all(abs(x) > spread for x in diffs):
        return nums, "resolved (" + ("worse" if diffs[0] > 0 else "better") + ")"
    return nums, "not distinguishable at this size (" + SEED_SPREAD_RULE + ")"


def _uniform_spread(rows: list[dict[str, Any]]) -> float:
    """Seed-to-seed range of the full uniform model's PPL, max / min − 1 (%; 0 with one seed)."""
    u = [r["ppl"] for r in rows if r["name"].split(" (")[0] == "uniform"]
    return 100 * (max(u) / min(u) - 1) if len(u) >= 2 else 0.0


def depth_label(k: int, L: int, paper_k: int, paper_L: int) -> str:
    """A linearization depth claim ("first paper_k of paper_L layers"): comparable only at
    the paper's depth; otherwise the share of depth, described."""
    if L == paper_L:
        return "reproduced" if k >= paper_k else "**not reproduced**"
    return (f"not comparable: {k} of {L} ({k / L:.0%} of the depth) vs {paper_k} of {paper_L} "
            f"({paper_k / paper_L:.0%}) at 100× fewer parameters; no like-for-like test at "
            f"{L} layers")


def first_k_beyond(rel: Sequence[float], threshold: float) -> int | None:
    """The first k whose relative ΔPPL exceeds ``threshold`` (None: never)."""
    return next((k for k, x in enumerate(rel) if k and x > threshold), None)


def collapse_k(rel: Sequence[float]) -> int | None:
    """The first k at which the model collapses: relative ΔPPL ≥ +100% (the PPL doubles;
    :data:`~tl_spectral_studies.verdicts.CATASTROPHIC_REL`)."""
    from tl_spectral_studies.claims.rules import first_collapse

    return first_collapse(dict(enumerate(rel)))


def collapse_label(with_ln: int | None, without_ln: int | None, paper_k: int = 3) -> str:
    """"Standard attention collapses from layer 3": collapse = first k with ΔPPL ≥ +100%."""
    def one(k):
        return "no collapse" if k is None else f"collapse at k = {k}"

    hit = [k == paper_k for k in (with_ln, without_ln)]
    head = ("reproduced" if all(hit) else "**not reproduced**" if not any(hit) else
            "reproduced with LayerNorm only" if hit[0] else "reproduced without LayerNorm only")
    return (f"{head} (rule: collapse = the first k whose ΔPPL is ≥ +100%): with LN "
            f"{one(with_ln)}, without LN {one(without_ln)}")


def graceful_label(extra_layers: int, finetuned_diff: float, spread: float) -> str:
    """S–D vs softmax, one seed each: the zero-shot depth within 5% (descriptive) and the
    fine-tuned difference against the uniform model's seed-to-seed change."""
    zs = (f"zero-shot: {extra_layers:+d} layer{'s' if abs(extra_layers) != 1 else ''} within 5% "
          "for S–D (descriptive: one seed each)")
    ft = ("after fine-tuning: not distinguishable at this size (the difference "
          f"{finetuned_diff:+.1f} points is below the {spread:.1f}% seed-to-seed change)"
          if abs(finetuned_diff) < spread else
          f"after fine-tuning: S–D {'better' if finetuned_diff < 0 else 'worse'} by "
          f"{abs(finetuned_diff):.1f} points, more than the {spread:.1f}% seed-to-seed change "
          "(one seed)")
    return zs + "; " + ft


def paper_range_label(vals: Sequence[float], lo: float, hi: float) -> str:
    """Each seed's cost inside the paper's range [lo, hi] (%)?"""
    k = sum(lo <= x <= hi for x in vals)
    return ("inside the paper's range for every seed" if k == len(vals) else
            "outside the paper's range for every seed" if k == 0 else
            f"inside the paper's range for {k} of {len(vals)} seeds")


SMOL_IDS: dict[str, tuple[str, ...] | None] = {
    # claim row of the verdict table -> the SmolLM2 verdict ids (docs/results/real_decoder/
    # verdicts.json) that answer it; None: no SmolLM2 measurement (SmolLM2 is one trained
    # standard-attention model: no S–D pair, no trained allocation). The study's
    # linearization record measures the S–D rows' claim on SmolLM2's standard heads (its
    # number holds k = 1…4, which answers both rows).
    "S–D: first 7 of 12 layers linearized at < 5% PPL": ("B.linear",),
    "S–D: first 4 layers within 1.4%": ("B.linear",),
    "standard attention collapses from layer 3": ("B.collapse3",),
    "S–D degrades more gracefully than standard attention": None,
    "47–65% fewer attention parameters": None,
    "at +3.9% to +8.4% PPL": None,
    "(the real test) the cascade beats a uniform model of equal size": None,
    "(the real test, S–D)": None,
}


def verdict_markdown(d: Path, *, smol_verdicts: str | Path | None = None) -> str:
    """The claim table of docs/surgery.md (SPEC B.5–B.6, seed 002) from the committed
    results in ``d``, with the SmolLM2 column from ``smol_verdicts`` (default: the
    real-decoder study's verdicts.json beside ``d``) through :data:`SMOL_IDS`.

    Longer than 80 lines on purpose: one row per claim of the table, in the doc's order."""
    from tl_spectral_studies import smol_column

    curves = _curves(d)
    out = ["| paper's claim (SPEC B.5–B.6; seed 002; 125 M S–D / GPT-scale) | ours: model, "
           "data, budget | ours: number | uncertainty | verdict |", "|---|---|---|---|---|"]
    scale = "6-layer 1.2 M-parameter char model, 32 validation windows × 256 — unequal scale"
    sd, smn, sml = curves.get("sd-noln-long"), curves.get("softmax-noln"), curves.get("softmax-ln")
    no_iv = ("none: the curve files hold the PPL of the 32 windows together, not per-window "
             "losses (re-checking: see the tables below)")
    spread = _uniform_spread(_study_rows(d, "_long") or [])
    if sd is not None:
        rel = sd.rel_delta()
        L = len(sd.ks) - 1
        k5, k14 = sd.max_k_within(0.05), sd.max_k_within(0.014)
        out.append(f"| S–D: first 7 of 12 layers linearized at < 5% PPL | sd-noln-long, {scale} "
                   f"and depth ({L} layers), 2,600 steps | first {k5} of {L} within 5% "
                   f"(k = {k5}: {_pct(rel[k5])}%, k = {k5 + 1}: {_pct(rel[k5 + 1])}%) | "
                   f"{no_iv} | {depth_label(k5, L, 7, 12)} |")
        out.append(f"| S–D: first 4 layers within 1.4% | sd-noln-long, as above | "
                   f"{k14} layers within 1.4% (k = {k14}: {_pct(rel[k14])}%, k = {k14 + 1}: "
                   f"{_pct(rel[k14 + 1])}%) | {no_iv} | {depth_label(k14, L, 4, 12)} |")
    if sml is not None and smn is not None:
        a, b = sml.rel_delta(), smn.rel_delta()
        ca, cb = collapse_k(a), collapse_k(b)
        first = [first_k_beyond(x, 0.05) for x in (a, b)]
        jumps = [x[k] for x, k in zip((a, b), first) if k is not None]
        ratio = (f"the first steps beyond 5% (with LN k = {first[0]}: {_pct(a[first[0]])}%, "
                 f"without k = {first[1]}: {_pct(b[first[1]])}%) are "
                 f"{min(jumps) * 100 / spread:.0f}–{max(jumps) * 100 / spread:.0f}× the "
                 f"{spread:.1f}% seed-to-seed change of the uniform softmax model"
                 if spread and len(jumps) == 2 else "no seed spread to compare with")
        out.append(f"| standard attention collapses from layer 3 | softmax-ln / softmax-noln, "
                   f"{scale}, 2,600 steps | with LN: k = 2 {_pct(a[2])}%, k = 3 {_pct(a[3])}%; "
                   f"without LN: k = 3 {_pct(b[3])}%, k = 4 {_pct(b[4])}%, k = 5 {_pct(b[5])}% | "
                   f"{no_iv}; {ratio} | {collapse_label(ca, cb)} |")
    ft_sd, ft_sm = curves.get("sd-noln-long_ft"), curves.get("softmax-noln_ft")
    if sd is not None and smn is not None and ft_sd is not None and ft_sm is not None:
        i4 = ft_sd.ks.index(4)
        z_sd, z_sm = sd.max_k_within(0.05), smn.max_k_within(0.05)
        f_sd = 100 * ft_sd.rel_delta("fine_tuned_vs_control")[i4]
        f_sm = 100 * ft_sm.rel_delta("fine_tuned_vs_control")[ft_sm.ks.index(4)]
        out.append(f"| S–D degrades more gracefully than standard attention | sd-noln-long vs "
                   f"softmax-noln, equal budgets (2,600 steps), {scale} | zero-shot: within 5% "
                   f"up to k = {z_sd} vs {z_sm} (k = 4: {_pct(sd.rel_delta()[4])}% vs "
                   f"{_pct(smn.rel_delta()[4])}%); fine-tuned net of the control, k = 4: "
                   f"{f_sd:+.1f}% vs {f_sm:+.1f}% | one seed each; {no_iv} | "
                   f"{graceful_label(z_sd - z_sm, f_sd - f_sm, spread)} |")
    rows = _study_rows(d, "_long")
    if rows:
        casc = next(r for r in rows if r["name"] == "cascade")
        out.append(f"| 47–65% fewer attention parameters | softmax cascade from the routing rank, "
                   f"budget 0.5 | {100 - casc['attn_params_%']:.0f}% fewer (d_head "
                   f"{' '.join(str(x) for x in casc['d_head'])}) | none applies: the saving is "
                   f"set by the chosen budget | not a test (the budget sets it); the test is "
                   f"the next rows |")
        sd_rows = _study_rows(d, "_sd") or []
        for label, rs in (("softmax cascade", rows), ("S–D cascade (effective routing rank)",
                                                      sd_rows)):
            c0 = [r for r in rs if r["name"].split(" (")[0] == "cascade"
                  and r["delta_same_seed_%"] is not None]
            u8 = [r for r in rs if r["name"].split(" (")[0] == "uniform-8"
                  and r["delta_same_seed_%"] is not None]
            if not c0:
                continue
            vals = [r["delta_same_seed_%"] for r in c0]
            out.append(f"| at +3.9% to +8.4% PPL | {label} vs uniform d_head 16, same seed, "
                       f"2,600 steps each, {scale} | "
                       + " / ".join(f"{x:+.2f}%" for x in vals)
                       + f" (seed{'s' if len(c0) > 1 else ''} "
                       f"{' / '.join(r['seed'] for r in c0)}) | no interval from {len(c0)} "
                       f"seed{'s' if len(c0) > 1 else ''}"
                       + (f"; the uniform model itself moves {_uniform_spread(rs):.1f}% between "
                          "seeds" if _uniform_spread(rs) else "") + " | "
                       + paper_range_label(vals, 3.9, 8.4)
                       + (", but a uniform model of equal size costs "
                          + " / ".join(f"{r['delta_same_seed_%']:+.2f}%" for r in u8)
                          + ": the cost is that of the size (the real-test rows)" if u8 else "")
                       + " |")
    for tag, what in (("_long", "(the real test) the cascade beats a uniform model of equal "
                                "size | softmax cascade (48%) vs uniform d_head 8 (50%)"),
                      ("_sd", "(the real test, S–D) | S–D cascade from the effective routing "
                              "rank (49%) vs uniform d_head 8 (49%)")):
        if not _study_rows(d, tag):
            continue
        nums, v = _alloc_verdict(d, tag, "cascade", "uniform-8")
        n = len(_paired_seeds(_study_rows(d, tag) or [], "cascade", "uniform-8"))
        unc = ("one seed: no interval" if n == 1 else
               f"no interval from two seeds; {SEED_SPREAD_RULE}" if n == 2 else
               f"95% t-interval over {n} seeds "
               f"({_t975(n - 1):.3f} × sd / √{n})")
        out.append(f"| {what}, PPL of the cascade / PPL of the equal-budget model − 1 per seed, "
                   f"2,600 steps | {nums} | {unc} | {v} |")
    if len(out) <= 2:
        return ""
    return smol_column.add_columns("\n".join(out),
                                   smol_column.ids_from(SMOL_IDS, "docs/surgery.md"), d,
                                   smol_verdicts)


def tables(results_dir: str | Path, *, smol_verdicts: str | Path | None = None
           ) -> dict[str, str]:
    """Every generated block of docs/surgery.md, by key, from the committed result files
    (the claim table's SmolLM2 column from ``smol_verdicts``, see :func:`verdict_markdown`)."""
    d = Path(results_dir)
    curves = _curves(d)
    final = ["sd-noln-long", "softmax-noln", "softmax-ln"]
    steps = [n for n in curves if "@" in n and not n.endswith("_ft")]
    order = {"1000": 0, "500": 1, "400": 2, "300": 3}
    steps.sort(key=lambda n: (order.get(n.split("@")[1], 9), n))
    out = {
        "surgery/verdict": verdict_markdown(d, smol_verdicts=smol_verdicts),
        "surgery/linearization_equal": linearization_markdown(curves, final),
        "surgery/finetune_control": finetune_markdown(curves, ["sd-noln-long_ft",
                                                               "softmax-noln_ft"]),
        "surgery/allocation_equal": "\n\n".join(
            x for x in (allocation_markdown(d, "_long"), allocation_markdown(d, "_sd"),
                        allocation_markdown(d, "_sdS")) if x),
        "surgery/seeds": seed_markdown(d, "_long"),
        "surgery/seeds_sd": seed_markdown(d, "_sd"),
        "surgery/session1_linearization": linearization_markdown(
            curves, ["softmax-ln", "softmax-noln"] + steps, header="model (checkpoint)"),
        "surgery/session1_finetune": finetune_markdown(
            curves, sorted(n for n in curves if n.endswith("_ft") and "@" in n)),
        "surgery/session1_allocation": allocation_markdown(d, ""),
        "surgery/allocations": allocations_markdown(d),
    }
    return out


def markdown(results_dir: str | Path) -> str:
    """The study's tables from the result files in ``results_dir`` (``docs/results/surgery``
    for the docs): every generated block of docs/surgery.md (:func:`tables`) under its key,
    then the raw tables of every curve and allocation file (ΔPPL of an allocation study
    against the uniform model of the same seed)."""
    from tl_spectral.interventions.surgery import CascadeAllocation, LinearizationCurve

    d = Path(results_dir)
    md = [f"<!-- {k} -->\n{v}" for k, v in tables(d).items() if v.strip()]
    for p in sorted(d.glob("curve_*.safetensors")):
        c = LinearizationCurve.load(p)
        n = p.stem[len("curve_"):]
        md.append(f"### {n}  (base PPL {c.base_ppl:.4f}; {_where(c.note)})\n\n"
                  + _md_table(c.to_rows()))
    for p in sorted(d.glob("allocation*.safetensors")):
        tag = p.stem.split("allocation_study" if "study" in p.stem else "allocation")[1]
        if "study" in p.stem:
            md.append(f"### allocation study{tag}\n\n" + allocation_markdown(d, tag))
        else:
            al = CascadeAllocation.load(p)
            md.append(f"### allocation{tag} ({al.model_name}, saving {100 * al.saving:.1f}%)"
                      "\n\n" + _md_table(al.to_rows()))
    return "\n\n".join(md) + "\n"


