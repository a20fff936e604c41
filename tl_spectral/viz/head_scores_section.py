"""Report section: the per-head scores of :class:`~tl_spectral.probes.head_scores.HeadScoresProbe`
(previous-token, duplicate-token, induction on repeated random sequences; for encoders the
attention on [CLS], [SEP] and punctuation), one heads-by-layer map per score."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

from tl_spectral.probes.head_scores import HeadScoresProbe, repeated_random_tokens
from tl_spectral.viz.context import ModelPass, register_section

if TYPE_CHECKING:
    from tl_spectral.probes import Probe
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report

#: length of the random block that is repeated for the induction score, and sequences
INDUCTION_HALF = 48
INDUCTION_SEQS = 4


def encoder_token_sets(tokenizer: Any) -> dict[str, list[int]]:
    """{name: ids}: the tokenizer's [CLS] and [SEP] tokens and every token that is
    punctuation only (e.g. ".", ",", "##!")."""
    out: dict[str, list[int]] = {}
    for name, attr in (("CLS", "cls_token_id"), ("SEP", "sep_token_id")):
        i = getattr(tokenizer, attr, None)
        if isinstance(i, int):
            out[name] = [i]
    conv = getattr(tokenizer, "convert_ids_to_tokens", None)
    n = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
    if conv is not None and n:
        punct = set(string.punctuation)
        toks = conv(list(range(n)))
        ids = [i for i, t in enumerate(toks)
               if isinstance(t, str) and t.lstrip("#Ġ▁") and set(t.lstrip("#Ġ▁")) <= punct]
        if ids:
            out["punctuation"] = ids
    return out


def repeated_sequences(ctx: ReportContext) -> tuple[Any, int]:
    """The induction probe's input: ``INDUCTION_SEQS`` repeated random sequences (a random
    block of ``half`` tokens of the vocabulary of (at most 64 of) the report's windows, past
    position 0, then the same block again, after position 0 of the first window), seeded."""
    import torch

    sample = ctx.tokens[: min(64, int(ctx.tokens.shape[0]))]
    used = torch.unique(sample[:, 1:] if sample.shape[1] > 1 else sample)
    half = max(2, min(INDUCTION_HALF, (ctx.view.n_ctx - 1) // 2,
                      (int(ctx.tokens.shape[1]) - 1) // 2))
    prefix = ctx.tokens[0, :1].tolist()
    rep = repeated_random_tokens(used.tolist(), INDUCTION_SEQS, half, prefix=prefix,
                                 seed=int(ctx.options.meta.get("seed", 0) or 0))
    return rep, half


def induction_pass(ctx: ReportContext) -> Any:
    """The induction pass: head scores on the repeated random sequences (all real tokens)."""
    import torch

    from tl_spectral.probes import run_probes

    rep, _ = repeated_sequences(ctx)
    return run_probes(ctx.view, rep, [HeadScoresProbe()], progress=False,
                      attention_mask=torch.ones_like(rep, dtype=torch.bool))["head_scores"]


@register_section
class HeadScoresSection:
    """A report section (the ``ReportSection`` protocol: key, title, probes, render)."""

    key = "head_scores"
    title = "Head scores (previous-token, induction, duplicate-token)"
    order = 15

    def probes(self, ctx: ReportContext) -> list[Probe]:
        sets = {} if ctx.view.causal else encoder_token_sets(ctx.tokenizer)
        return [HeadScoresProbe(token_sets=sets)]

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        return [ModelPass("head_scores_repeated", "head scores: induction on repeated random "
                          "sequences", induction_pass)]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        from tl_spectral.viz.multiples import heads_by_layer_figure

        res = results["head_scores"]
        res.save(ctx.results_dir / "head_scores.safetensors")
        report.section(self.title)
        rep, half = repeated_sequences(ctx)
        ind = results["head_scores_repeated"]
        ind.save(ctx.results_dir / "head_scores_repeated.safetensors")
        report.text(
            "Per head, the scores of TransformerLens' head detector [TL] "
            "(transformer_lens.head_detector.detect_head, error measure \"mul\"): the mean over "
            "queries of the attention on the previous token (previous-token), on earlier "
            "occurrences of the current token (duplicate-token), and on the token right after "
            "an earlier occurrence of the current token (induction [O]). Previous- and "
            "duplicate-token scores are measured on the report's windows; the induction score "
            f"on {INDUCTION_SEQS} repeated random sequences (a random block of {half} tokens "
            "of the corpus's vocabulary, then the same block again, after position 0 of the "
            "first window): only the second block's queries have an earlier copy, so an "
            "induction head scores about 0.5 there and a head that ignores content far less. "
            "The first-token score is the "
            "position-0 mass of the attention statistics, shown there once.")
        best = {name: r.top(name, 1)[0] for name, r in (("previous_token", res),
                                                         ("duplicate_token", res),
                                                         ("induction", ind))}
        if ctx.view.causal:
            _presence(report, ctx, best, {
                "previous_token": planted_score(ctx.tokens, ctx.mask, "previous_token"),
                "duplicate_token": planted_score(ctx.tokens, ctx.mask, "duplicate_token"),
                "induction": planted_score(rep, None, "induction")})
        panels = [
            {"values": res.previous_token.numpy(), "title": "previous-token score, scale [0, 1]",
             "vmin": 0.0, "vmax": 1.0, "cbar": "score"},
            {"values": ind.induction.numpy(), "title": "induction score (repeated random "
                                                       "tokens), scale [0, 1]",
             "vmin": 0.0, "vmax": 1.0, "cbar": "score"},
            {"values": res.duplicate_token.numpy(), "title": "duplicate-token score, scale "
                                                             "[0, 1]",
             "vmin": 0.0, "vmax": 1.0, "cbar": "score"},
        ]
        # [CLS] only at position 0: its mass is the position-0 mass, shown once (attention
        # statistics)
        same_cls = "CLS" in res.set_names and bool(
            (res.set_mass["CLS"] - res.first_token).abs().max() < 1e-6)
        if same_cls:
            report.text("Attention on [CLS] equals the position-0 mass here ([CLS] occurs only "
                        "at position 0 of every window): shown once, under attention "
                        "statistics.")
        for name in res.set_names:
            if name == "CLS" and same_cls:
                continue
            panels.append({"values": res.set_mass[name].numpy(),
                           "title": f"attention on {name}, scale [0, 1]", "vmin": 0.0,
                           "vmax": 1.0, "cmap": "magma", "cbar": "share"})
        report.figure(heads_by_layer_figure(panels, res.layers, ncols=3),
                      "Look for bright heads: a bright head in the first map looks back one "
                      "token, in the second copies what followed the current token last time "
                      "(induction), in the third attends to earlier copies of the current token.")
        if res.set_names:
            tops = "; ".join(
                f"{n}: L{t[0]}H{t[1]} ({100 * t[2]:.0f}%)" for n in res.set_names
                if not (n == "CLS" and same_cls) for t in res.top(n, 1))
        if res.set_names and tops:
            report.finding(f"Encoder heads: the strongest attention on special and "
                           f"punctuation tokens — {tops}.")
        rows = res.to_rows()
        for r, i in zip(rows, ind.to_rows()):
            r["induction_repeated"] = i["induction"]
            del r["first_token"]  # the attention statistics' first_token_mass, shown there
            if "CLS" in res.set_names and same_cls:
                del r["mass_on_CLS"]
        report.table(rows, "per-head scores (induction_repeated: on the repeated random "
                           "sequences; induction: on the report's windows)", name="head_scores",
                     show=_top_rows(rows))


#: a head counts as doing a job from this share of the score a planted head (one that puts
#: all its attention where the detection pattern points, whenever it points anywhere) gets
#: on the same inputs — this report's rule
PRESENCE_SHARE = 0.5

_JOBS = {"previous_token": "previous-token", "duplicate_token": "duplicate-token",
         "induction": "induction"}


def planted_score(tokens: Any, mask: Any, score: str) -> float:
    """The score a planted head gets on ``tokens [n, T]``: the share of real queries whose
    detection pattern (probes.head_scores) marks at least one key — the previous token
    (i ≥ 1), an earlier copy of the current token (duplicate), or the token after one
    (induction)."""
    import torch

    if not isinstance(tokens, torch.Tensor):  # a token file's windows: read 64 at a time
        from tl_spectral.probes.corpus import as_corpus

        corpus = as_corpus(tokens, mask)
        hits = real = 0
        for lo in range(0, len(corpus), 64):
            t, m = corpus.batch(lo, min(lo + 64, len(corpus)))
            hits += _planted_hits(t, m, score)
            real += int(m.sum())
        return hits / max(real, 1)
    m = None if mask is None else torch.as_tensor(mask).bool()
    if m is None:
        m = torch.ones(tokens.shape, dtype=torch.bool)
    return _planted_hits(tokens, m, score) / max(int(m.sum()), 1)


def _planted_hits(t: Any, m: Any, score: str) -> int:
    """The real queries ``m`` of ``t [n, T]`` whose planted head marks at least one key."""
    import torch

    n, T = t.shape
    idx = torch.arange(T)
    if score == "previous_token":
        has = (idx >= 1)[None, :].expand(n, T)
    elif score == "duplicate_token":
        same = t[:, :, None] == t[:, None, :]
        has = (same & (idx[None, :] < idx[:, None])).any(-1)
    elif score == "induction":
        shifted = t[:, :, None] == t[:, None, :-1]  # key j = k' + 1, t_(j−1) = t_i
        has = (shifted & (idx[None, :-1] < idx[:, None])).any(-1) if T > 1 \
            else torch.zeros(n, T, dtype=torch.bool)
    else:
        raise ValueError(f"unknown score {score!r}; pick one of {sorted(_JOBS)}")
    return int((has & m.to(has.device)).sum())


def _presence(report: Report, ctx: ReportContext, best: dict, planted: dict) -> None:
    """Per score: a head that reaches PRESENCE_SHARE of a planted head's score is recorded
    as doing the job (named once, in the heads finding); the jobs no head does are ONE
    finding of absence, with the best score, the planted score and the rule; both in a
    table of references."""
    rows, absent = [], []
    for name, (lay, h, v) in best.items():
        ref = planted[name]
        rows.append({"score": name, "planted_head": ref, "counted_from": PRESENCE_SHARE * ref,
                     "best": v, "best_layer": lay, "best_head": h})
        if ref > 0 and v >= PRESENCE_SHARE * ref:
            ctx.add_head_role(lay, h, f"a {_JOBS[name]} head ({v:.2f}; planted "
                                      f"{ref:.2f})")
        else:
            absent.append(f"no {_JOBS[name]} head (best {v:.2f}, a planted one scores "
                          f"{ref:.2f})")
    report.table(rows, "head-score references: a planted head's score and the best head's",
                 name="head_score_references")
    if absent:
        report.finding(
            "Head scores [TL]: " + "; ".join(absent) + f". A head counts from "
            f"{100 * PRESENCE_SHARE:.0f}% of a planted head's score on the same inputs "
            "(this report's rule; the planted score is the share of queries the detection "
            "pattern marks).")


def _top_rows(rows: list[dict]) -> list[int]:
    keep: set[int] = set()
    for k in ("previous_token", "induction_repeated", "duplicate_token"):
        keep |= set(sorted(range(len(rows)), key=lambda i: -rows[i][k])[:4])
    return sorted(keep)
