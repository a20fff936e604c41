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
    fmt_interval,
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
    "abs_contribution",
)
"""Measures of the faithfulness study: the paper's four (inter mode), the two that differ
in intra mode, a random ranking as reference and ``|C_ij|`` (``abs_contribution``, a
diagnostic of the sign, not one of the paper's measures)."""

N_RESAMPLES = 1000
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
    """
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
    lo, hi = (iv["low"], iv["high"]) if claim_positive else (-iv["high"], -iv["low"])
    if lo > 0:
        return "reproduced"
    if hi < 0:
        return "**not reproduced**: the interval excludes the claim"
    return "not distinguishable at this size"


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
    if no_sink:
        anti = ("does not apply: this model has no sink (no sink head in any layer), so there "
                "is no sink value to be anti-aligned")
    elif len(neg) == len(sk):
        anti = "reproduced in every layer"
    elif not neg:
        anti = ("**not reproduced**: the interval lies above 0 in layers " + ", ".join(pos)
                if pos else "not distinguishable at this size")
    else:
        anti = "reproduced in layers " + ", ".join(neg) + " only"
    rows.append(f"| sink value anti-aligned, cos(ṽ_0, s) < 0 (seed 003 §3.2–3.3) | {who} | "
                + "; ".join(f"layer {r['layer']} {fmt_interval(r['cos_v0_s'])}" for r in sk)
                + f" | {anti} |")
    sr = s["sink_rows"]
    shares = [r.get("rho_star_in_0_1") for r in sr]
    rows.append(f"| norm-minimising sink rate ρ* < 1 (seed 003 §3.3) | {who} | share of queries "
                f"with 0 < ρ* < 1: " + ", ".join(f"layer {r['layer']} {x:.2f}" for r, x in
                                                 zip(sr, shares) if x is not None)
                + f" | {rho_star_label(shares)} |")
    grow = [r for r in sk if r["rel_delta_norm"]["low"] > 0]
    shrink = [r for r in sk if r["rel_delta_norm"]["high"] < 0]
    rows.append(f"| sinks suppress the output norm: zeroing the sink value raises ‖o‖ (seed 003 "
                f"§3.3) | {who} | Δ‖o‖/‖o‖ {fmt_interval(sk[0]['rel_delta_norm'])} (layer "
                f"{sk[0]['layer']}) … {fmt_interval(sk[-1]['rel_delta_norm'])} (layer "
                f"{sk[-1]['layer']}); below 0 in {len(shrink)} of {len(sk)} layers | "
                f"{'**not reproduced**: ‖o‖ falls' if len(shrink) == len(sk) else ('reproduced' if len(grow) == len(sk) else 'not distinguishable at this size')} |")
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
              "paired interval lies on the claimed side")
RHO_SHARE = 0.5
"""ρ* < 1 holds in a layer when more than this share of its queries have 0 < ρ* < 1 (*choice*)."""


def order_label(step_verdicts: Sequence[str], n_ties: int) -> str:
    """The four-measure order from its steps: :data:`ORDER_RULE`; a tie by construction is
    untestable, so the full order is at most partly reproduced."""
    if any(v.startswith("**not") for v in step_verdicts):
        return "**not reproduced**: at least one step's interval excludes the order"
    if step_verdicts and all(v == "reproduced" for v in step_verdicts):
        if n_ties:
            return (f"partly: the {len(step_verdicts)} testable steps reproduced; {n_ties} step "
                    "is a tie by construction (same ranking), so the full order is not tested")
        return "reproduced"
    return "not distinguishable at this size"


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
                   "needs 99.2% intervals for 6 layers, cannot be made from them). Full order: "
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
    smol = smol_column.load(smol_verdicts or smol_column.verdicts_path(results_dir))
    out["contributions/verdict"] = smol_column.add_column(
        "\n".join(verdict), smol_column.ids_from(SMOL_IDS, "docs/contributions.md"), smol)
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
