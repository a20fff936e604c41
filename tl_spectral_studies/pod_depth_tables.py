"""The markdown of docs/scale_pod.md, "Across depth, tokenizers and the sink column", from the
JSON files of :mod:`tl_spectral_studies.pod_depth` (``OUT/pod_depth_<model>.json``) and, for
MiniLM (bidirectional: no sink-column run), the committed scale-POD run
``docs/results/scale_pod/scale_pod_minilm_N150.json`` restated by depth fraction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tl_spectral_studies._common import fmt_interval

ORDER = ("char-shakespeare-d256", "char-shakespeare", "smollm2-135m", "gemma3-270m")
LABEL = {"char-shakespeare-d256": "char model (d256, the paper's width)",
         "char-shakespeare": "char model (d128)", "smollm2-135m": "SmolLM2-135M",
         "gemma3-270m": "Gemma-3-270M", "minilm": "MiniLM-L6 (bidirectional)"}
MINILM = "scale_pod/scale_pod_minilm_N150.json"
"""MiniLM's committed scale-POD run, relative to ``docs/results``."""


def load(out: str | Path) -> list[dict[str, Any]]:
    """The runs in ``out``, in :data:`ORDER`."""
    runs = {}
    for p in Path(out).glob("pod_depth_*.json"):
        d = json.loads(p.read_text(encoding="utf-8"))
        runs[d["model"]] = d
    return [runs[m] for m in ORDER if m in runs] + [
        runs[m] for m in sorted(runs) if m not in ORDER]


def _f(iv: dict, fmt: str = "{:+.2f}") -> str:
    return fmt_interval(iv, fmt)


def claims_table(runs: list[dict[str, Any]]) -> str:
    """One row per model and claim: the three fields' number [95% CI] — label, the verdict."""
    rows = ["| model | claim (thirds of the stack) | with the key-0 column (the paper's field) "
            "| key-0 column zeroed | rows renormalized without it | verdict |",
            "|---|---|---|---|---|---|"]
    for d in runs:
        for c in d["claims"]:
            cells = []
            for v in d["variants"]:
                iv = c["intervals"][v]
                if "early" in iv:
                    num = (f"early {_f(iv['early'])}, late {_f(iv['late'])}")
                else:
                    num = _f(iv, "{:+.1f}" if c["id"] == "hstar" else "{:+.3f}")
                cells.append(f"{num} — {c['labels'][v]}")
            verdict = f"**{c['verdict']}**" if c["sink_dependent"] else c["verdict"]
            rows.append(f"| {LABEL.get(d['model'], d['model'])} | {c['claim']} | "
                        + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(rows)


def layers_table(d: dict[str, Any]) -> str:
    """Per layer: depth, sink mass, the key-0 column's share of the fluctuation energy, H*,
    T_spec and E fine − E coarse (paper cut-offs) of the three fields, and Δ H* (zeroed −
    with, renormalized − with) with their jackknife intervals."""
    sp, b = d["spectrum"], d["bands"]
    rows = ["| layer | l/(L−1) | third | mean α(i, 0) | key-0 share of the fluctuation energy "
            "| H* with / zeroed / renorm. | Δ H* zeroed − with | Δ H* renorm. − with "
            "| T_spec with / zeroed / renorm. | E fine − coarse with / zeroed / renorm. |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for li, r in enumerate(d["layers"]):
        h = [sp["layers"][v][li][0] for v in range(3)]
        t = [sp["layers"][v][li][1] for v in range(3)]
        e = [b["layers"][v][li][0][3] for v in range(3)]
        dh = [sp["minus_with"][v][li][0] for v in (1, 2)]
        rows.append(
            f"| {li} | {r['depth']:.2f} | {r['third']} | {r['sink_mass']:.2f} | "
            f"{r['with']['column_share']:.2f} | "
            + " / ".join(f"{x['estimate']:.0f}" for x in h) + " | "
            + " | ".join(_f(x, "{:+.0f}") for x in dh) + " | "
            + " / ".join(f"{x['estimate']:.2f}" for x in t) + " | "
            + " / ".join(f"{x['estimate']:+.2f}" for x in e) + " |")
    return "\n".join(rows)


def _minilm_row(path: Path) -> list[str] | None:
    """MiniLM's committed per-layer point estimates as third means (no interval)."""
    if not path.exists():
        return None
    from tl_spectral_studies.depth import third_layers

    d = json.loads(path.read_text(encoding="utf-8"))
    tb = d["table"]
    th = third_layers(len(tb))

    def mean(key, ls):
        return sum(float(str(tb[i][key]).lstrip(">≥ ")) if key != "fmc" else
                   tb[i]["E_fine"] - tb[i]["E_coarse"] for i in ls) / len(ls)
    cells = []
    for key, fmt in (("H_star", "{:.0f}"), ("T_spec", "{:.2f}"), ("fmc", "{:+.2f}")):
        cells.append(" / ".join(fmt.format(mean(key, th[t])) for t in ("early", "middle",
                                                                       "late")))
    return [LABEL["minilm"], f"{len(tb)}", f"{d['n_docs']} × {d['length']}", "—", *cells,
            "not measured", "—"]


def depth_table(runs: list[dict[str, Any]], minilm: Path | None = None) -> str:
    """Thirds of the stack side by side for every model (``with`` field): H*, T_spec and
    E fine − E coarse under both cut-off sets, each third's mean over its layers."""
    rows = ["| model | L | N × T | chars / token (cut-offs in tokens: text rule) "
            "| H* early / middle / late | T_spec early / middle / late "
            "| E fine − coarse, paper cut-offs (a ≤ 7, a ≥ 20 tokens) "
            "| E fine − coarse, text cut-offs | late − early of E fine − coarse (paper; text) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for d in runs:
        sp, b = d["spectrum"], d["bands"]

        def third(src, k, fmt, si=None):
            return " / ".join(
                fmt.format((src[t][0][si][k] if si is not None else src[t][0][k])["estimate"])
                for t in ("early", "middle", "late"))
        lo, hi = d["cutoffs"]["text"]
        lme = "; ".join(_f(b["late_minus_early"][0][si][3]) for si in range(2))
        rows.append(f"| {LABEL.get(d['model'], d['model'])} | {d['n_layers']} | "
                    f"{d['n_docs']} × {d['length']} | {d['chars_per_token']:.2f} "
                    f"(a ≤ {lo:.2f}, a ≥ {hi:.2f}) | {third(sp, 0, '{:.0f}')} | "
                    f"{third(sp, 1, '{:.2f}')} | {third(b, 3, '{:+.2f}', 0)} | "
                    f"{third(b, 3, '{:+.2f}', 1)} | {lme} |")
    m = None if minilm is None else _minilm_row(minilm)
    if m is not None:
        rows.append("| " + " | ".join(m) + " |")
    return "\n".join(rows)


def markdown(out: str | Path) -> str:
    """Every table of the section from ``out/pod_depth_*.json`` (``out`` =
    ``docs/results/real_decoder/pod_depth``; MiniLM's row from :data:`MINILM` two folders up)."""
    runs = load(out)
    minilm = Path(out).resolve().parents[1] / MINILM
    if not runs:
        return f"(no pod_depth_*.json in {out})"
    parts = ["Depth as a fraction of the stack (the `with` field; third means of the "
             "per-layer estimates):", "", depth_table(runs, minilm), "",
             "Claims by thirds, with and without the key-0 column:", "", claims_table(runs)]
    for d in runs:
        parts += ["", f"{LABEL.get(d['model'], d['model'])}, per layer ({d['n_docs']} windows "
                  f"× {d['length']} tokens, {d['windows']}; H* and T_spec: "
                  f"{d['intervals']['spectrum']}; bands: {d['intervals']['bands']}):", "",
                  layers_table(d)]
    return "\n".join(parts)
