"""Report section: is this a trained language model (issue 40 item 3)?

For every causal language model: the perplexity of the report's own windows beside two
references — the same architecture with random weights (:func:`~tl_spectral.viz.baseline.
random_copy`, the ``--baseline random`` twin) and a unigram model of the same windows
(``exp`` of the unigram entropy of the predicted tokens, fitted on them: an optimistic
reference) — and the vocabulary size (uniform guessing). A model whose perplexity is not
below the unigram reference has learned no more than token frequencies: the report says it
looks untrained, first. Encoders (no next-token prediction) get the attention-entropy check
of the attention statistics only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tl_spectral.probes.base import Probe
from tl_spectral.viz.context import ModelPass, register_section

if TYPE_CHECKING:
    from tl_spectral.viz.context import ReportContext
    from tl_spectral.viz.report import Report

#: windows of the perplexity check (the first ones of the report) on models of up to
#: ``SHALLOW_LAYERS`` layers; deeper models (real decoders, where one window's pass with a
#: vocabulary of 50-260 k costs seconds) read about ``SANITY_TOKENS_DEEP`` tokens (4 windows
#: of 256, 1 of 1,024): a reference of magnitude, not a measurement (the unigram and random
#: references sit 10-10,000x away)
SANITY_DOCS, SANITY_TOKENS_DEEP, SHALLOW_LAYERS = 16, 1024, 12
#: about this many tokens of those windows (the first ones, at least one window) are what the
#: random-weight twin reads: its perplexity sits near the vocabulary size, a reference of
#: magnitude that a few hundred tokens fix (a quarter of a deep check's second full pass)
RANDOM_TWIN_TOKENS = 256


def perplexity_windows(ctx: ReportContext) -> int:
    """How many of the report's first windows the perplexity passes read (the sanity check
    and the linearization curve share them, so the curve's k = 0 is the sanity pass's)."""
    n = SANITY_DOCS if ctx.view.n_layers <= SHALLOW_LAYERS else \
        max(1, round(SANITY_TOKENS_DEEP / int(ctx.tokens.shape[1])))
    return min(n, int(ctx.tokens.shape[0]))


def twin_windows(ctx: ReportContext) -> int:
    """How many of the perplexity check's windows (:func:`perplexity_windows`, the first
    ones) the random-weight twin reads: about ``RANDOM_TWIN_TOKENS`` tokens, at least one
    window."""
    T = int(ctx.tokens.shape[1])
    return min(perplexity_windows(ctx), max(1, round(RANDOM_TWIN_TOKENS / T)))


def window_perplexity(view: Any, tokens: Any, mask: Any = None, batch_size: int = 8) -> float:
    """Next-token perplexity of ``view`` on the windows ``tokens [n, T]`` (targets at
    positions 1…T−1 where ``mask`` marks real tokens), a few windows at a time so the logits
    of a large vocabulary never exist for all windows at once
    (:func:`~tl_spectral.probes.damage.nll_sum`)."""
    from tl_spectral.probes.damage import nll_sum

    tot, cnt = nll_sum(view, tokens, mask, max_rows=batch_size)
    return math.exp(tot / max(cnt, 1))


def unigram_perplexity(tokens: Any, mask: Any = None) -> float:
    """``exp`` of the entropy of the predicted tokens' frequencies (positions 1…T−1, real
    tokens only): the perplexity of a unigram model fitted on these very windows."""
    import torch

    tgt = tokens[:, 1:]
    if mask is not None:
        tgt = tgt[mask[:, 1:].bool()]
    _, counts = torch.unique(tgt.reshape(-1), return_counts=True)
    p = counts.double() / counts.sum()
    return float(torch.exp(-(p * p.log()).sum()))


@register_section
class SanitySection:
    """A report section (the ``ReportSection`` protocol: key, title, probes, render)."""

    key = "sanity"
    title = "Sanity: is this a trained language model?"
    order = 5

    def probes(self, ctx: ReportContext) -> list:
        """The model's own perplexity is taken in the probe pass (:class:`WindowNLLProbe`:
        its blocks run over these windows anyway) where the model's final norm and
        unembedding give its logits from the last block's output; else the sanity pass
        runs the model again over them."""
        ok = getattr(ctx.view, "logits_from_resid_ok", None)  # a live model's view only
        if not ctx.view.causal or ok is None or not ok():
            return []
        return [WindowNLLProbe(perplexity_windows(ctx))]

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        if not ctx.view.causal:
            return []
        return [ModelPass("sanity_perplexity", "sanity: perplexity of the model, of its random "
                          "twin and of a unigram model", sanity_perplexities)]

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        report.section(self.title)
        if not ctx.view.causal:
            report.text("This model is bidirectional (an encoder): there is no next-token "
                        "perplexity to check. The attention statistics' uniform-attention "
                        "check is its sanity check.")
            return
        r = results["sanity_perplexity"]
        ppl, ppl_rand, ppl_uni = r["model_ppl"], r["random_weights_ppl"], r["unigram_ppl"]
        n, n_pred, V = r["windows"], r["predicted_tokens"], r["vocabulary"]
        ctx.sanity.update({"ppl": ppl, "ppl_random": ppl_rand, "ppl_unigram": ppl_uni})
        n_rand = r.get("random_weights_windows", n)
        twin = "" if n_rand == n else (
            f" — on the first {n_rand} of these windows ({r['random_weights_tokens']} "
            "predicted tokens): its perplexity sits near the vocabulary size whatever the "
            "sample, a reference of magnitude")
        report.text(
            f"Perplexity of next-token prediction on the first {n} of the report's windows "
            f"({n_pred} predicted tokens), beside the same architecture with random weights "
            f"(matrices N(0, 0.02²), gains 1, biases 0; seeded{twin}), a unigram model of "
            "these windows (exp of the entropy of their token frequencies: what counting "
            "tokens achieves) and the vocabulary size (uniform guessing). A trained model sits "
            "far below the unigram reference; a model at or above it has learned nothing a "
            "token count does not know.")
        report.table([dict(r)],
                     "perplexity of the model and its references", name="sanity_perplexity")
        if ppl >= ppl_uni:
            report.finding(
                f"This model looks untrained: its perplexity on the report's windows is "
                f"{ppl:.4g}, no better than a unigram model of the same windows ({ppl_uni:.4g}); "
                f"the same architecture with random weights scores {ppl_rand:.4g}"
                + (f" and uniform guessing {V}" if V else "")
                + ". The numbers below describe a network that has not learned this text.",
                first="top")
        else:
            report.finding(
                f"Sanity: perplexity {ppl:.4g} on the report's windows, below a unigram model "
                f"of them ({ppl_uni:.4g}) and the same architecture with random weights "
                f"({ppl_rand:.4g}): a trained language model.", first=True)


def sanity_perplexities(ctx: ReportContext) -> dict[str, Any]:
    """The sanity pass: perplexity of the model and of a unigram model on the first
    :func:`perplexity_windows` windows, and of its random-weight twin on the first
    :func:`twin_windows` of them (a JSON-able row)."""
    n = perplexity_windows(ctx)
    toks = ctx.tokens[:n]
    mask = None if ctx.mask is None else ctx.mask[:n]
    took = ctx.probe_results.pop(WindowNLLProbe.name, None)  # the probe pass's, if it ran
    if took is not None and took["windows"] == n and took["count"] == _predicted(toks, mask):
        ppl = math.exp(took["nll_sum"] / max(took["count"], 1))
    else:
        ppl = window_perplexity(ctx.view, toks, mask)
    if mask is None or bool(mask.all()):  # every token real: the curve's k = 0 exactly
        ctx.baseline_cache[("model_ppl", n)] = ppl
    m = twin_windows(ctx)
    ppl_rand = _random_twin_perplexity(ctx, toks[:m], None if mask is None else mask[:m])
    return {"model_ppl": ppl, "random_weights_ppl": ppl_rand,
            "unigram_ppl": unigram_perplexity(toks, mask),
            "vocabulary": int(getattr(ctx.view, "d_vocab", 0) or 0), "windows": n,
            "predicted_tokens": _predicted(toks, mask), "random_weights_windows": m,
            "random_weights_tokens": _predicted(toks[:m], None if mask is None else mask[:m])}


def _predicted(toks: Any, mask: Any) -> int:
    """Next-token predictions of the windows ``toks`` (real targets where ``mask``)."""
    return int(mask[:, 1:].sum()) if mask is not None else \
        int(toks.shape[0]) * (int(toks.shape[1]) - 1)


def _random_twin_perplexity(ctx: ReportContext, toks: Any, mask: Any) -> float:
    """Perplexity of the re-initialised twin (kept for ``--baseline random``, else freed)."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.baseline import random_copy

    cache = ctx.baseline_cache
    view = cache.get("view")
    if view is None:
        seed = int(ctx.options.meta.get("seed", 0) or 0)
        view = ModelView(random_copy(ctx.view.model, seed=seed))
        if ctx.options.baseline == "random":
            cache["view"] = view
    return window_perplexity(view, toks, mask)


class WindowNLLProbe(Probe):
    """The summed next-token NLL of the corpus' first ``n_windows`` windows, taken in the
    probe pass: the last block's output of those rows through the model's final norm and
    unembedding (:meth:`~tl_spectral.model_view.ModelView.logits_from_resid`), one window at a
    time (a window's logits, never a batch's), targets at positions 1…T−1 where the batch's
    mask marks real tokens — what :func:`window_perplexity` computes with a pass of its own.
    Result: ``{"nll_sum", "count", "windows"}`` (plain numbers; summed across the processes
    of ``torchrun``). Only for a model whose view passes
    :meth:`~tl_spectral.model_view.ModelView.logits_from_resid_ok` (the section checks)."""

    name = "sanity_window_nll"

    def __init__(self, n_windows: int) -> None:
        super().__init__()
        self.n_windows = int(n_windows)

    def requires(self, view: Any) -> dict[int, set[str]]:
        return {int(view.n_layers) - 1: {"resid_post"}}

    def update(self, cap: Any) -> None:
        import torch

        from tl_spectral.probes.damage import next_token_nll

        rows = (cap.doc_index < self.n_windows).nonzero().flatten().tolist()
        tot = torch.zeros(1, dtype=torch.float64)
        cnt = torch.zeros(1, dtype=torch.float64)
        for r in rows:
            real = cap.mask[r, 1:].bool()
            with torch.no_grad():
                logits = self.view.logits_from_resid(cap.resid_post[r:r + 1])
                nll = next_token_nll(logits, cap.tokens[r:r + 1])[0]  # targets 1…T−1
            tot += nll[real.to(nll.device)].double().sum().cpu()
            cnt += float(real.sum())
            del logits
        self.accumulate("nll_sum", tot)
        self.accumulate("count", cnt)

    def result(self) -> dict[str, Any]:
        return {"nll_sum": float(self.state["nll_sum"]) if self.state else 0.0,
                "count": int(self.state["count"]) if self.state else 0,
                "windows": self.n_windows}
