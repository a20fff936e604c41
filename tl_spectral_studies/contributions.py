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
import math
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
from tl_spectral_studies.contributions_tables import (  # noqa: F401  (re-exported)
    COMMANDS,
    MODEL_LABEL,
    N_RESAMPLES,
    ORDER_RULE,
    PAPER_SCALE,
    PAPER_STEPS,
    RHO_SHARE,
    SMOL_IDS,
    _iv,
    _load_summaries,
    _step_rows,
    _verdict,
    _verdict_rows,
    faithfulness_markdown,
    faithfulness_scope_markdown,
    global_order_rows,
    markdown,
    order_label,
    rho_star_label,
    rows_markdown,
    tables,
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
    "abs_contribution",
)
"""Measures of the faithfulness study: the paper's four (inter mode), the two that differ
in intra mode, a random ranking as reference and ``|C_ij|`` (``abs_contribution``, a
diagnostic of the sign, not one of the paper's measures)."""

"""Bootstrap resamples of the study's intervals (over documents, percentile, seed 0)."""

STAT_INTERVAL_COLUMNS = {
    "C_on_first_token": "tokens", "attn_on_first_token": "tokens",
    "neg_pair_share": "tokens",
    "spearman_attention_vs_c": "docs", "spearman_value_weighted_vs_c": "docs",
}
SINK_INTERVAL_COLUMNS = {
    "sink_rate": "tokens", "sink_head_share": "docs", "cos_v0_s": "tokens",
    "rho_star_clamped": "tokens", "rel_delta_norm": "tokens",
}
"""Columns of the statistics / sink tables that get a bootstrap interval, and the weight of
a document in their mean (``tokens``: its real tokens, the statistic being a mean over
queries; ``docs``: 1, a per-document quantity)."""





# ----------------------------------------------------------------------------- per document
def faithfulness_per_document(
    model: Any, tokens: torch.Tensor, attention_mask: torch.Tensor, *,
    layer: Optional[int] = None, measures: Sequence[str] = STUDY_MEASURES, seed: int = 0,
    rows_per_pass: int = 64,
) -> dict[str, Any]:
    """Faithfulness statistics of every document alone, so that the curves of any set of
    documents (a bootstrap resample) are exact sums of per-document terms.

    Runs :func:`~tl_spectral.probes.faithfulness.faithfulness` on each document (its real
    tokens only; the random ranking seeded ``seed + d``). Returns ``{"metric", "measures",
    "fractions", "settings", "layer", "strategy", "aliases", "sums" [N, S, M, 2, F],
    "counts" [N], "clean_sums" [N]}``: for ΔPPL the summed NLL of each condition
    (comprehensiveness, sufficiency), the number of predicted tokens and the clean summed
    NLL (recovered exactly from the document's PPLs: ``n · log PPL``); for the embedding
    distance the document's ``1 − cos`` per condition, 1 and 0. :func:`pooled_curves`
    turns any index set into curves.
    """
    from tl_spectral.probes.faithfulness import faithfulness

    sums, counts, clean_sums = [], [], []
    aliases: Optional[dict] = None
    meta: dict[str, Any] = {}
    for d in range(int(tokens.shape[0])):
        n = int(attention_mask[d].sum())
        f = faithfulness(model, tokens[d:d + 1, :n], attention_mask=attention_mask[d:d + 1, :n],
                         layer=layer, measures=measures, batch_size=1, seed=seed + d,
                         rows_per_pass=rows_per_pass)
        curves = torch.stack([f.comprehensiveness, f.sufficiency], 2).double()  # [S, M, 2, F]
        if f.metric == "delta_ppl":
            cnt = float(f.n_tokens)
            sums.append(cnt * torch.log(curves + f.clean))
            counts.append(cnt)
            clean_sums.append(cnt * math.log(f.clean))
        else:
            sums.append(curves)
            counts.append(1.0)
            clean_sums.append(0.0)
        aliases = dict(f.aliases) if aliases is None else {
            k: v for k, v in aliases.items() if f.aliases.get(k) == v}
        meta = {"metric": f.metric, "measures": list(f.measures), "fractions": list(f.fractions),
                "settings": list(f.settings), "layer": f.layer, "strategy": f.strategy,
                "mode": f.mode, "level": f.level}
    return {**meta, "aliases": aliases or {}, "sums": torch.stack(sums),
            "counts": torch.tensor(counts, dtype=torch.float64),
            "clean_sums": torch.tensor(clean_sums, dtype=torch.float64)}


def pooled_curves(per_doc: dict[str, Any], idx: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, float]:
    """Curves ``[S, M, 2, F]`` and clean PPL of the documents ``idx`` (repeats allowed;
    default all) from :func:`faithfulness_per_document`'s terms: ΔPPL = exp(Σ NLL / Σ n) −
    exp(Σ clean NLL / Σ n), the corpus PPL exactly as one batched run computes it; the
    embedding distance is the mean over the documents."""
    s, c, cs = per_doc["sums"], per_doc["counts"], per_doc["clean_sums"]
    if idx is not None:
        s, c, cs = s[idx], c[idx], cs[idx]
    if per_doc["metric"] == "delta_ppl":
        n = c.sum()
        clean = torch.exp(cs.sum() / n)
        return torch.exp(s.sum(0) / n) - clean, float(clean)
    return s.mean(0), 0.0


def pooled_areas(per_doc: dict[str, Any], idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Areas ``[S, M, 2]`` (comprehensiveness, sufficiency) of the documents ``idx``."""
    from tl_spectral.analysis.faithfulness import curve_area

    curves, _ = pooled_curves(per_doc, idx)
    return curve_area(per_doc["fractions"], curves)


def pooled_result(per_doc: dict[str, Any], model_name: str = ""):
    """The :class:`FaithfulnessResult` of all documents from the per-document terms."""
    from tl_spectral.probes.faithfulness import FaithfulnessResult

    curves, clean = pooled_curves(per_doc)
    areas = pooled_areas(per_doc)
    return FaithfulnessResult(
        metric=per_doc["metric"], measures=per_doc["measures"], fractions=per_doc["fractions"],
        settings=per_doc["settings"], comprehensiveness=curves[:, :, 0].float(),
        sufficiency=curves[:, :, 1].float(), comprehensiveness_area=areas[..., 0].float(),
        sufficiency_area=areas[..., 1].float(), clean=clean, mode=per_doc["mode"],
        level=per_doc["level"], layer=per_doc["layer"], strategy=per_doc["strategy"],
        n_docs=int(per_doc["sums"].shape[0]),
        n_tokens=int(per_doc["counts"].sum()) if per_doc["metric"] == "delta_ppl" else 0,
        model_name=model_name, aliases=per_doc["aliases"])


def faithfulness_intervals(per_doc: dict[str, Any], n_resamples: int = N_RESAMPLES,
                           seed: int = 0) -> dict[str, Any]:
    """Bootstrap intervals over documents of every area ``[S, M, 2]`` and of every
    difference of two measures' areas ``[S, M (a), M (b), 2]`` = area(a) − area(b)."""
    from tl_spectral.analysis.bootstrap import bootstrap

    S, M = len(per_doc["settings"]), len(per_doc["measures"])

    def stat(idx: torch.Tensor) -> torch.Tensor:
        a = pooled_areas(per_doc, idx)  # [S, M, 2]
        d = a[:, :, None, :] - a[:, None, :, :]
        return torch.cat([a.flatten(), d.flatten()])

    iv = bootstrap(stat, int(per_doc["sums"].shape[0]), n_resamples=n_resamples, seed=seed)
    k = S * M * 2

    def part(sl: slice, shape: tuple) -> dict:
        return {"estimate": iv.estimate[sl].reshape(shape).tolist(),
                "low": iv.low[sl].reshape(shape).tolist(),
                "high": iv.high[sl].reshape(shape).tolist()}

    return {"n_resamples": iv.n_resamples, "seed": iv.seed, "level": iv.level,
            "areas": part(slice(0, k), (S, M, 2)),
            "differences": part(slice(k, None), (S, M, M, 2))}


def probe_rows_per_document(model: Any, tokens: torch.Tensor, attention_mask: torch.Tensor
                            ) -> dict[str, Any]:
    """The statistics and sink rows (one per layer) of every document alone, with the
    document's real-token count: ``{"n_tokens" [N], "stats" [N][L] rows, "sinks" [N][L]}``."""
    from tl_spectral.probes import run_probes

    out: dict[str, Any] = {"n_tokens": [], "stats": [], "sinks": []}
    for d in range(int(tokens.shape[0])):
        n = int(attention_mask[d].sum())
        res = run_probes(model, tokens[d:d + 1, :n],
                         [ContributionProbe(rank_stride=1), SinkProbe()],
                         attention_mask=attention_mask[d:d + 1, :n], batch_size=1,
                         progress=False)
        out["n_tokens"].append(n)
        out["stats"].append(res["contributions"].to_rows())
        out["sinks"].append(res["sinks"].to_rows())
    return out


def row_intervals(rows_per_doc: list[list[dict]], n_tokens: Sequence[int],
                  columns: dict[str, str], n_resamples: int = N_RESAMPLES, seed: int = 0
                  ) -> list[dict]:
    """Per layer, the bootstrap interval of the weighted mean over documents of each column
    (weights per ``columns``: ``tokens`` or ``docs``; NaN values carry no weight)."""
    from tl_spectral.analysis.bootstrap import bootstrap

    L = len(rows_per_doc[0])
    cols = list(columns)
    vals = torch.tensor([[[float(r[li][c]) for c in cols] for li in range(L)]
                         for r in rows_per_doc], dtype=torch.float64)  # [N, L, C]
    w_tok = torch.tensor([float(n) for n in n_tokens], dtype=torch.float64)
    w = torch.stack([w_tok if columns[c] == "tokens" else torch.ones_like(w_tok)
                     for c in cols], -1)[:, None, :].expand_as(vals)  # [N, L, C]
    ok = torch.isfinite(vals)
    v0 = torch.where(ok, vals, torch.zeros_like(vals))
    w0 = torch.where(ok, w, torch.zeros_like(w))

    def stat(idx: torch.Tensor) -> torch.Tensor:
        return (v0[idx] * w0[idx]).sum(0) / w0[idx].sum(0)

    iv = bootstrap(stat, vals.shape[0], n_resamples=n_resamples, seed=seed)
    out = []
    for li in range(L):
        row: dict[str, Any] = {"layer": rows_per_doc[0][li]["layer"]}
        for ci, c in enumerate(cols):
            row[c] = iv[li, ci].to_dict()
        out.append(row)
    return out


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
    w = document_windows(val, tok, n_docs, length, seed=seed,
                         bos_id=getattr(tok, "bos_id", None))  # a start-token model: [BOS] first
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
    command: str = "",
) -> dict:
    """Run probes, faithfulness and the sink intervention; write figures and results.

    Returns a JSON-able summary with the markdown tables. ``run_faithfulness=False`` keeps
    the saved faithfulness result of an earlier run (the slow part) and redoes the rest.

    Longer than 80 lines on purpose: one run from windows to summary; its steps share the run's
    tensors, and splitting would pass a dozen locals between pieces."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tl_spectral.probes import run_probes
    from tl_spectral.probes.contributions import layer_maps
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
    # the kept per-query maps of document 0 (every layer × head × T × T) are the bulk of the
    # file (52 MB for char-shakespeare) and no table or figure reads them: keep the middle
    # layer's first 64 positions, as the report does
    from tl_spectral.viz.contribution_plots import slim_contribution_stats

    mid_layer = stats.layers[len(stats.layers) // 2] if layer is None else layer
    slim_contribution_stats(stats, mid_layer, 64).save(
        results_dir / f"{slug}_contribution_stats.safetensors", overwrite=True)
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
    out["stats_rows"] = stats.to_rows()
    out["sink_rows"] = sinks.to_rows()
    out["sink_head_share"] = sinks.sink_head_share.tolist()
    zs = zero_sink_value(model, tokens, attention_mask=am, batch_size=batch_size)
    zs.save(results_dir / f"{slug}_sink_intervention.safetensors", overwrite=True)
    out["sink_intervention"] = zs.to_rows()
    out["clean"] = zs.clean
    summary_path = results_dir / f"{slug}_summary.json"
    f_path = results_dir / f"{slug}_faithfulness.safetensors"
    docs_path = results_dir / f"{slug}_faithfulness_docs.safetensors"
    nf = tokens.shape[0] if faith_docs is None else faith_docs
    if run_faithfulness:
        per_doc = faithfulness_per_document(model, tokens[:nf], am[:nf], layer=layer,
                                            measures=measures, seed=seed)
        _save_per_doc(per_doc, docs_path)
    else:
        if not docs_path.is_file():
            raise StudyUsageError(f"--skip-faithfulness needs {docs_path} of an earlier run; "
                                  "run without --skip-faithfulness")
        per_doc = _load_per_doc(docs_path)
    f = pooled_result(per_doc, name)
    f.save(f_path, overwrite=True)
    figs["faithfulness"] = save(f.plot_curves(), "faithfulness")
    figs["faithfulness_areas"] = save(plot_faithfulness_areas(f), "faithfulness_areas")
    out["faithfulness"] = {
        s: {"table": f.to_rows(si), "ordering": f.ordering(si),
            "markdown": faithfulness_markdown(f, si)}
        for si, s in enumerate(f.settings)
    }
    out["faithfulness_meta"] = {"metric": f.metric, "clean": f.clean, "strategy": f.strategy,
                                "aliases": f.aliases, "n_docs": f.n_docs, "layer": f.layer,
                                "measures": list(f.measures), "settings": list(f.settings)}
    out["faithfulness_intervals"] = faithfulness_intervals(per_doc, N_RESAMPLES, seed)
    rows = probe_rows_per_document(model, tokens, am)
    out["stats_intervals"] = row_intervals(rows["stats"], rows["n_tokens"],
                                           STAT_INTERVAL_COLUMNS, N_RESAMPLES, seed)
    out["sink_intervals"] = row_intervals(rows["sinks"], rows["n_tokens"],
                                          SINK_INTERVAL_COLUMNS, N_RESAMPLES, seed)
    out["seed"] = seed
    out["command"] = command
    return _finish(out, figs, summary_path)


def _save_per_doc(per_doc: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    meta = {k: v for k, v in per_doc.items() if not isinstance(v, torch.Tensor)}
    save_file({k: v.contiguous() for k, v in per_doc.items() if isinstance(v, torch.Tensor)},
              str(path), metadata={"meta": json.dumps(meta)})


def _load_per_doc(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["meta"])
        return {**meta, **{k: fh.get_tensor(k) for k in fh.keys()}}


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
                    run_faithfulness=not args.skip_faithfulness,
                    command=" ".join(["tl-spectral study contributions", *argv]))
    print(res["markdown"]["stats"])
    print(res["markdown"]["sinks"])
    print(res["markdown"]["sink_intervention"])
    for s, v in res["faithfulness"].items():
        print(f"\n{s}\n{v['markdown']}\n{v['ordering']}")
    print(out.resolve())
    return 0

