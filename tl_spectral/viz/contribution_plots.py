"""Views of contribution weights, faithfulness and sinks; the report section; the study runner.

Signed maps in circuitsvis. ``contribution_view`` shows a contribution map with
``circuitsvis.attention.attention_heads`` (one small heat map per head, plus the token level
``C = Σ_h c`` as the last "head"): positive values in red, negative values (destructive
interference) in blue, white at 0, with symmetric limits ``±lim`` so equal magnitudes get
equal colour depth. ``lim`` is the largest |value| over the shown maps, or with
``clip_quantile < 1`` that quantile of |value| (a sink column can otherwise wash out the
rest; values beyond are shown at full depth). Raw attention and the other non-negative
baselines are shown the same way (they are simply never blue).

``python -m tl_spectral.viz.contribution_plots --model minilm`` (or ``char-shakespeare``)
runs the whole study — probes, faithfulness, sink intervention — on a CPU-sized corpus and
writes figures (``docs/figures/contributions_<model>_*.png``), results (safetensors) and a
JSON summary with the tables.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from tl_spectral.analysis.contributions import ContributionMaps
from tl_spectral.probes import ContributionProbe, Probe, SinkProbe

if TYPE_CHECKING:  # sections.py imports this module: no runtime import back
    from tl_spectral.viz.report import Report
    from tl_spectral.viz.sections import ReportContext

STUDY_MEASURES = (
    "attention",
    "value_weighted",
    "output_normalized",
    "contribution",
    "output_normalized@intra",
    "contribution@intra",
    "random",
)
"""Measures of the faithfulness study: the paper's four (inter mode), the two that differ
in intra mode, and a random ranking as reference."""


# ----------------------------------------------------------------------------- views
def contribution_view(
    maps: ContributionMaps,
    tokens: Sequence[str],
    batch: int = 0,
    measure: str = "contribution",
    *,
    causal: bool = True,
    clip_quantile: float = 1.0,
    max_tokens: Optional[int] = None,
):
    """circuitsvis ``attention_heads`` view of one document's signed map.

    maps: ``ContributionMaps``; tokens: the document's token strings; measure: one of
    ``MEASURES``; the heads are followed by the token level (sum over heads). Red =
    positive, blue = negative, symmetric limits (see module doc). Returns a circuitsvis
    ``RenderedHTML``.
    """
    import circuitsvis as cv

    if not 0 < clip_quantile <= 1:
        raise ValueError(f"clip_quantile must be in (0, 1], got {clip_quantile}")
    per_head = maps.measure(measure)[batch]  # [H, q, k]
    token = maps.token_level(measure)[batch]  # [1, q, k]
    m = torch.cat([per_head, token]).detach().float().cpu()
    n = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
    m = m[:, :n, :n]
    a = m.abs().flatten()
    lim = float(a.max()) if clip_quantile == 1 else float(torch.quantile(a, clip_quantile))
    lim = lim or 1.0
    names = [f"{measure} H{h}" for h in range(per_head.shape[0])] + [f"{measure} Σ heads"]
    return cv.attention.attention_heads(
        attention=m.clamp(-lim, lim), tokens=list(tokens[:n]), attention_head_names=names,
        max_value=lim, min_value=-lim, positive_color="red", negative_color="blue",
        mask_upper_tri=causal,
    )


def plot_faithfulness_areas(res: Any):
    """Bars of the comprehensiveness and sufficiency areas per measure and setting."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    M, S = len(res.measures), len(res.settings)
    w = 0.8 / S
    for ax, (title, areas) in zip(axes, (("comprehensiveness area (higher = better)",
                                          res.comprehensiveness_area),
                                         ("sufficiency area (lower = better)",
                                          res.sufficiency_area))):
        for si, sname in enumerate(res.settings):
            ax.bar(torch.arange(M).numpy() + si * w, areas[si].numpy(), width=w, label=sname)
        ax.set_xticks(torch.arange(M).numpy() + 0.4 - w / 2, res.measures, rotation=35,
                      ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def faithfulness_markdown(res: Any, setting: int = 0, fmt: str = "{:.4g}") -> str:
    """Markdown table: measure × comprehensiveness area × sufficiency area."""
    unit = "ΔPPL" if res.metric == "delta_ppl" else "1 − cos(e', e)"
    lines = [f"| measure | comprehensiveness area ({unit}) ↑ | sufficiency area ({unit}) ↓ |",
             "|---|---|---|"]
    from tl_spectral.probes.faithfulness import structural_aliases

    same = {**structural_aliases(res.measures, res.mode, res.level), **res.aliases}
    for row in res.table(setting):
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


# ----------------------------------------------------------------------------- report
class ContributionSection:
    """Report section: contribution statistics, sinks, a signed circuitsvis view, and (with
    ``ctx.options["faithfulness_docs"] > 0``) faithfulness curves on that many documents."""

    key = "contributions"
    title = "Contribution weights and attention sinks"

    def probes(self, ctx: "ReportContext") -> list[Probe]:
        return [ContributionProbe(keep_docs=[0]), SinkProbe()]

    def render(self, report: "Report", results: dict[str, Any], ctx: "ReportContext") -> None:
        stats = results["contributions"]
        sinks = results["sinks"]
        stats.save(ctx.results_dir / "contribution_stats.safetensors")
        sinks.save(ctx.results_dir / "sink_stats.safetensors")
        report.section(self.title)
        report.text(
            "Contribution weights c_ij = ⟨o_i, α_ij ṽ_j⟩ / ‖o_i‖² (inter-head; token level "
            "C_ij = Σ_h c_ij^h, rows sum to 1) measure how much of each output a source "
            "actually supplies, and can be negative. Compared with raw attention α, "
            "value-weighted α‖ṽ‖ and output-normalized α‖ṽ‖/‖o‖."
        )
        report.table(stats.summary_rows(), "per layer: negative shares, first-token "
                                           "contribution vs attention, Spearman with c")
        report.figure(stats.plot_source(), "mean contribution and attention by source position")
        report.figure(stats.plot_lag(), "mean contribution and attention by lag")
        report.figure(stats.plot_negative(), "share of negative contribution (layer × head)")
        report.figure(stats.plot_rank_corr(), "rank correlation between the measures")
        report.table(sinks.summary_rows(), "sink statistics per layer")
        report.figure(sinks.plot_rates(), "sink rate and Gu key score (layer × head)")
        report.figure(sinks.plot_rho_star(), "optimal sink rate ρ* and observed α_i0")
        report.figure(sinks.plot_anti_alignment(), "anti-alignment cos(ṽ_0, s_i)")
        if stats.kept_maps:
            layer = stats.layers[-1]
            maps = stats.maps(layer, 0)
            n = int(stats.kept_mask[0].sum())
            toks = ctx.token_strings(stats.kept_tokens[0, :n])
            view = contribution_view(maps, toks, causal=stats.causal, max_tokens=64,
                                     clip_quantile=0.99)
            report.circuitsvis(view, f"contributions-layer-{layer}",
                               f"contribution weights of layer {layer}, document 0 (red = "
                               "positive, blue = negative; symmetric limits at the 99th "
                               "percentile of |c|; last panel = Σ heads)")
        n_f = int(ctx.options.get("faithfulness_docs", 0))
        if n_f > 0:
            from tl_spectral.probes.faithfulness import faithfulness

            res = faithfulness(ctx.view, ctx.tokens[:n_f])
            res.save(ctx.results_dir / "faithfulness.safetensors")
            report.figure(res.plot_curves(), "faithfulness curves")
            report.table(res.table(0), "faithfulness areas, all layers")
            report.table(res.table(1), f"faithfulness areas, layer {res.layer}")
        else:
            report.text("Faithfulness curves: not computed (set the report option "
                        "faithfulness_docs > 0; see docs/contributions.md for the results).")


# ----------------------------------------------------------------------------- study
def wiki_sentences(n: int, seed: int = 0, min_words: int = 8, max_words: int = 40) -> list[str]:
    """``n`` real sentences (``min_words``–``max_words`` words) drawn from the shared
    Wikipedia excerpt (``../shared/data/wiki_excerpt.txt`` beside the repository, or the
    path in ``TL_SPECTRAL_WIKI``)."""
    import os
    import random

    default = Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki_excerpt.txt"
    path = Path(os.environ.get("TL_SPECTRAL_WIKI", str(default)))
    if not path.is_file():
        raise FileNotFoundError(f"no Wikipedia excerpt at {path}; set TL_SPECTRAL_WIKI")
    sents = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        for s in re.split(r"(?<=[.!?])\s+", line):
            if min_words <= len(s.split()) <= max_words:
                sents.append(s)
    if len(sents) < n:
        raise ValueError(f"only {len(sents)} sentences qualify, {n} were asked for")
    return random.Random(seed).sample(sents, n)


def load_study_data(name: str, n_docs: int, length: int, seed: int = 0):
    """Model, tokenizer, tokens [n, T] and attention mask for the study."""
    from tl_spectral import zoo

    model, tok = zoo.load(name)
    if name == "minilm":
        enc = tok(wiki_sentences(n_docs, seed), padding=True, truncation=True,
                  max_length=length, return_tensors="pt")
        return model, tok, enc["input_ids"], enc["attention_mask"]
    from tl_spectral.data import document_windows, tiny_shakespeare, train_val_split

    _, val = train_val_split(tiny_shakespeare())
    w = document_windows(val, tok, n_docs, length, seed=seed)
    return model, tok, w.tokens, torch.ones_like(w.tokens)


def contribution_study(
    name: str,
    n_docs: int,
    length: int,
    fig_dir: Path,
    results_dir: Path,
    *,
    faith_docs: Optional[int] = None,
    layer: Optional[int] = None,
    measures: Sequence[str] = STUDY_MEASURES,
    batch_size: int = 8,
    seed: int = 0,
    run_faithfulness: bool = True,
) -> dict:
    """Run probes, faithfulness and the sink intervention; write figures and results.

    Returns a JSON-able summary with the markdown tables. ``run_faithfulness=False`` keeps
    the saved faithfulness result of an earlier run (the slow part) and redoes the rest.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tl_spectral.probes import run_probes
    from tl_spectral.probes.contributions import layer_maps
    from tl_spectral.probes.faithfulness import faithfulness
    from tl_spectral.probes.sinks import zero_sink_value

    fig_dir.mkdir(parents=True, exist_ok=True)
    results_dir.mkdir(parents=True, exist_ok=True)
    model, tok, tokens, am = load_study_data(name, n_docs, length, seed)
    slug = name.replace("-", "_")

    def save(fig, what: str) -> str:
        p = fig_dir / f"contributions_{slug}_{what}.png"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return str(p)

    out: dict[str, Any] = {"model": name, "n_docs": int(tokens.shape[0]),
                           "n_tokens": int(am.sum()), "length": int(tokens.shape[1])}
    probes = [ContributionProbe(keep_docs=[0], rank_stride=1), SinkProbe()]
    res = run_probes(model, tokens, probes,
                     attention_mask=am, batch_size=batch_size, progress=False)
    stats, sinks = res["contributions"], res["sinks"]
    stats.model_name = sinks.model_name = name
    stats.save(results_dir / f"{slug}_contribution_stats.safetensors")
    sinks.save(results_dir / f"{slug}_sink_stats.safetensors")
    figs = {
        "source": save(stats.plot_source(), "source"),
        "lag": save(stats.plot_lag(), "lag"),
        "negative": save(stats.plot_negative(), "negative"),
        "rank_corr": save(stats.plot_rank_corr(), "rank_corr"),
        "sink_rates": save(sinks.plot_rates(), "sink_rates"),
        "rho_star": save(sinks.plot_rho_star(), "rho_star"),
        "anti_alignment": save(sinks.plot_anti_alignment(), "cosines"),
    }
    n0 = int(am[0].sum())
    L = len(stats.layers)
    mid = L // 2 if layer is None else layer
    maps = layer_maps(model, tokens[:1, :n0], layers=[mid])[mid]
    figs["maps"] = save(maps.plot_maps(head=None, max_tokens=48), "maps")
    out["stats_rows"] = stats.summary_rows()
    out["sink_rows"] = sinks.summary_rows()
    out["sink_head_share"] = sinks.sink_head_share.tolist()
    zs = zero_sink_value(model, tokens, attention_mask=am, batch_size=batch_size)
    zs.save(results_dir / f"{slug}_sink_intervention.safetensors")
    out["sink_intervention"] = zs.rows()
    out["clean"] = zs.clean
    summary_path = results_dir / f"{slug}_summary.json"
    f_path = results_dir / f"{slug}_faithfulness.safetensors"
    if run_faithfulness:
        nf = tokens.shape[0] if faith_docs is None else faith_docs
        f = faithfulness(model, tokens[:nf], attention_mask=am[:nf], layer=layer,
                         measures=measures, batch_size=batch_size, seed=seed)
        f.model_name = name
        f.save(f_path)
    else:
        from tl_spectral.probes.faithfulness import FaithfulnessResult

        f = FaithfulnessResult.load(f_path)
        f.model_name = name
    figs["faithfulness"] = save(f.plot_curves(), "faithfulness")
    figs["faithfulness_areas"] = save(plot_faithfulness_areas(f), "faithfulness_areas")
    out["faithfulness"] = {
        s: {"table": f.table(si), "ordering": f.ordering(si),
            "markdown": faithfulness_markdown(f, si)}
        for si, s in enumerate(f.settings)
    }
    out["faithfulness_meta"] = {"metric": f.metric, "clean": f.clean, "strategy": f.strategy,
                                "aliases": f.aliases, "n_docs": f.n_docs, "layer": f.layer}
    return _finish(out, figs, summary_path)


def _finish(out: dict, figs: dict, summary_path: Path) -> dict:
    out["markdown"] = {"stats": rows_markdown(out["stats_rows"]),
                       "sinks": rows_markdown(out["sink_rows"]),
                       "sink_intervention": rows_markdown(out["sink_intervention"], "{:.4g}")}
    out["figures"] = figs
    summary_path.write_text(json.dumps(out, indent=2, default=float))
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="contribution-weight study on a zoo model")
    ap.add_argument("--model", default="minilm", help="minilm | char-shakespeare")
    ap.add_argument("--n-docs", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--faith-docs", type=int, default=None)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--fig-dir", default="docs/figures")
    ap.add_argument("--results-dir", default="runs/contributions")
    ap.add_argument("--skip-faithfulness", action="store_true",
                    help="keep the faithfulness results of an earlier run")
    args = ap.parse_args(argv)
    out = contribution_study(args.model, args.n_docs, args.length, Path(args.fig_dir),
                             Path(args.results_dir), faith_docs=args.faith_docs,
                             layer=args.layer, batch_size=args.batch_size,
                             run_faithfulness=not args.skip_faithfulness)
    print(out["markdown"]["stats"])
    print(out["markdown"]["sinks"])
    print(out["markdown"]["sink_intervention"])
    for s, v in out["faithfulness"].items():
        print(f"\n{s}\n{v['markdown']}\n{v['ordering']}")


if __name__ == "__main__":
    main()
