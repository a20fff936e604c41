"""The contribution-weight study of docs/contributions.md (SPEC part C): contribution
statistics, sinks, faithfulness curves and the zero-the-sink intervention on a zoo model.

    tl-spectral study contributions --model minilm --n-docs 64 --length 128 \
        --data-dir ../shared/data --out docs/results/contributions --fig-dir docs/figures
    tl-spectral study contributions --model char-shakespeare --n-docs 32 --length 256 \
        --out docs/results/contributions --fig-dir docs/figures
    tl-spectral study contributions --quick          # char-shakespeare, 8 windows of 64

MiniLM reads real sentences from ``DATA_DIR/wiki_excerpt.txt`` (``--data-dir``); the char
model reads windows of the bundled Tiny Shakespeare's validation part. Writes
``OUT/<model>_summary.json`` (tables), ``OUT/<model>_*.safetensors`` (results) and figures
``FIG/contributions_<model>_*.png``; :func:`markdown` renders the doc tables from the JSON.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from tl_spectral.probes import ContributionProbe, SinkProbe
from tl_spectral.usage import ArgumentParser
from tl_spectral.viz.contribution_plots import plot_faithfulness_areas
from tl_spectral_studies._common import (
    StudyUsageError,
    add_caption,
    add_run_arguments,
    prepare_out,
    require_data_dir,
)

NAME = "contributions"

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




# ----------------------------------------------------------------------------- study
def wiki_sentences(path: str | Path, n: int, seed: int = 0, min_words: int = 8,
                   max_words: int = 40) -> list[str]:
    """``n`` real sentences (``min_words``–``max_words`` words) drawn from a Wikipedia text
    file (``wiki_excerpt.txt`` of the project's shared data folder)."""
    path = Path(path)
    if not path.is_file():
        raise StudyUsageError(f"no Wikipedia excerpt at {path}; pass --data-dir DIR with "
                              "DIR/wiki_excerpt.txt")
    sents = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        for s in re.split(r"(?<=[.!?])\s+", line):
            if min_words <= len(s.split()) <= max_words:
                sents.append(s)
    if len(sents) < n:
        raise StudyUsageError(f"only {len(sents)} sentences of {path} qualify, "
                              f"{n} were asked for")
    return random.Random(seed).sample(sents, n)


def load_study_data(name: str, n_docs: int, length: int, seed: int = 0,
                    data_dir: str | Path | None = None):
    """Model, tokenizer, tokens [n, T] and attention mask for the study."""
    from tl_spectral.models import zoo

    if name == "minilm":
        wiki = require_data_dir(data_dir, "wiki_excerpt.txt (MiniLM's sentences)")
        sents = wiki_sentences(wiki / "wiki_excerpt.txt", n_docs, seed)
    model, tok = zoo.load(name)
    if name == "minilm":
        enc = tok(sents, padding=True, truncation=True,
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
    data_dir: str | Path | None = None,
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
    model, tok, tokens, am = load_study_data(name, n_docs, length, seed, data_dir)
    slug = name.replace("-", "_")

    def save(fig, what: str) -> str:
        add_caption(fig, f"{name}: {int(tokens.shape[0])} documents × {int(tokens.shape[1])} "
                         f"tokens, seed {seed}; tl-spectral study contributions")
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
    stats.save(results_dir / f"{slug}_contribution_stats.safetensors", overwrite=True)
    sinks.save(results_dir / f"{slug}_sink_stats.safetensors", overwrite=True)
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
    zs.save(results_dir / f"{slug}_sink_intervention.safetensors", overwrite=True)
    out["sink_intervention"] = zs.rows()
    out["clean"] = zs.clean
    summary_path = results_dir / f"{slug}_summary.json"
    f_path = results_dir / f"{slug}_faithfulness.safetensors"
    if run_faithfulness:
        nf = tokens.shape[0] if faith_docs is None else faith_docs
        f = faithfulness(model, tokens[:nf], attention_mask=am[:nf], layer=layer,
                         measures=measures, batch_size=batch_size, seed=seed)
        f.model_name = name
        f.save(f_path, overwrite=True)
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


def run_study(out_dir: str | Path, *, model: str = "char-shakespeare", n_docs: int = 32,
              length: int = 256, fig_dir: str | Path | None = None, quick: bool = False,
              data_dir: str | Path | None = None, **kwargs: Any) -> dict:
    """The study on one zoo model into ``out_dir`` (figures in ``fig_dir``, default
    ``out_dir/figures``); ``quick``: 8 windows of 64, faithfulness on 4 documents with three
    measures. Other keyword arguments go to :func:`contribution_study`."""
    out = Path(out_dir)
    if quick:
        n_docs, length = min(n_docs, 8), min(length, 64)
        kwargs["faith_docs"] = min(kwargs.get("faith_docs") or 4, 4)
        kwargs["measures"] = ("attention", "contribution", "random")
    return contribution_study(model, n_docs, length,
                              Path(fig_dir) if fig_dir else out / "figures", out,
                              data_dir=data_dir, **kwargs)


def markdown(results_dir: str | Path) -> str:
    """The doc tables of every ``<model>_summary.json`` under ``results_dir``."""
    parts = []
    for p in sorted(Path(results_dir).glob("*_summary.json")):
        out = json.loads(p.read_text())
        parts.append(f"### {out['model']}: {out['n_docs']} documents, {out['n_tokens']} tokens\n")
        parts += [out["markdown"]["stats"], "", out["markdown"]["sinks"], "",
                  out["markdown"]["sink_intervention"], ""]
        for setting, v in out["faithfulness"].items():
            parts += [f"Faithfulness, {setting}:", "", v["markdown"], ""]
    return "\n".join(parts)


def main(argv: Sequence[str], prog: str = "tl-spectral study contributions") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="tl_spectral_study_contributions")
    ap.add_argument("--model", default="char-shakespeare", help="minilm | char-shakespeare")
    ap.add_argument("--data-dir", default=None, help="folder of wiki_excerpt.txt (MiniLM)")
    ap.add_argument("--n-docs", type=int, default=32)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--faith-docs", type=int, default=None)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--skip-faithfulness", action="store_true",
                    help="keep the faithfulness results of an earlier run in --out")
    args = ap.parse_args(list(argv))
    out = prepare_out(args.out, NAME, overwrite=args.overwrite)
    res = run_study(out, model=args.model, n_docs=args.n_docs, length=args.length,
                    fig_dir=args.fig_dir, quick=args.quick, data_dir=args.data_dir,
                    faith_docs=args.faith_docs, layer=args.layer, batch_size=args.batch_size,
                    run_faithfulness=not args.skip_faithfulness)
    print(res["markdown"]["stats"])
    print(res["markdown"]["sinks"])
    print(res["markdown"]["sink_intervention"])
    for s, v in res["faithfulness"].items():
        print(f"\n{s}\n{v['markdown']}\n{v['ordering']}")
    print(out.resolve())
    return 0
