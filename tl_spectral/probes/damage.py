"""Helpers every intervention shares (faithfulness curves, zeroing the sink's value): the
damage metric of a forward pass, the attention mask of a padded batch and the corpus order
that keeps batches short."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from tl_spectral.model_view import ModelView
from tl_spectral.probes.base import StopForward
from tl_spectral.probes.runner import Corpus

__all__ = ["LOGIT_BUDGET", "METRICS", "DamageMetric", "by_length", "logit_rows", "next_token_nll",
           "nll_sum", "padding_attention_mask"]

#: the damage metrics: PPL change (decoders), embedding distance (encoders)
METRICS = ("delta_ppl", "embedding_distance")


def by_length(corpus: Corpus) -> Corpus:
    """The corpus sorted by decreasing length (batches then carry little padding; every
    statistic here is a sum over documents, so the order does not matter)."""
    order = torch.sort(corpus.mask.sum(1), descending=True, stable=True).indices
    return Corpus(tokens=corpus.tokens[order], mask=corpus.mask[order])


#: bytes of float32 logits one intervention pass may form (the rows of a pass are capped so
#: that rows × T × d_vocab × 4 stays under it: Gemma 3's 262,144-token vocabulary at T = 256
#: takes 268 MB a row)
LOGIT_BUDGET = 1 << 30


def logit_rows(view: ModelView, length: int, budget: Optional[int] = None) -> int:
    """The most rows of ``length`` tokens whose float32 logits fit in ``budget`` bytes
    (default :data:`LOGIT_BUDGET`; at least 1)."""
    budget = LOGIT_BUDGET if budget is None else budget
    per_row = max(1, int(length)) * max(1, int(view.d_vocab)) * 4
    return max(1, int(budget) // per_row)


def next_token_nll(logits: Tensor, tokens: Tensor) -> Tensor:
    """``[rows, T − 1]`` negative log-likelihood of each next token, row by row in float32
    (no full ``log_softmax`` copy of the logits: ``logsumexp − logit of the target``)."""
    return _nll_rows(logits[:, :-1], tokens[:, 1:])


def nll_sum(view: ModelView, tokens: Tensor, mask: Optional[Tensor] = None,
            fwd_hooks: Optional[list] = None, max_rows: int = 8) -> tuple[float, int]:
    """Sum and count of the next-token NLL of ``view`` on the windows ``tokens [n, T]``
    (targets at positions 1…T−1 where ``mask`` marks real tokens; with ``fwd_hooks`` in every
    pass): at most ``max_rows`` windows a pass and never more logits than
    :data:`LOGIT_BUDGET` at once, the NLL taken row by row (:func:`next_token_nll`, no
    ``log_softmax`` copy). ``exp(sum / count)`` is the perplexity."""
    rows = max(1, min(int(max_rows), logit_rows(view, int(tokens.shape[1]) - 1)))
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for s in range(0, int(tokens.shape[0]), rows):
            w = tokens[s:s + rows]
            kw = {"fwd_hooks": fwd_hooks} if fwd_hooks else {"return_type": "logits"}
            logits = view.run(w[:, :-1], **kw)
            nll = _nll_rows(logits, w[:, 1:])
            keep = torch.ones_like(nll, dtype=torch.bool) if mask is None \
                else mask[s:s + rows, 1:].to(nll.device).bool()
            tot += float(nll[keep].double().sum())
            cnt += int(keep.sum())
            del logits
    return tot, cnt


def _nll_rows(logits: Tensor, targets: Tensor) -> Tensor:
    """``[rows, T]`` NLL of ``targets`` under ``logits [rows, T, V]``, row by row."""
    out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
    targets = targets.to(logits.device)
    for r in range(logits.shape[0]):
        row = logits[r].float()
        out[r] = torch.logsumexp(row, -1) - row.gather(-1, targets[r].unsqueeze(-1)).squeeze(-1)
    return out


class DamageMetric:
    """Per-row damage statistics of one forward pass (clean or intervened)."""

    def __init__(self, view: ModelView, metric: Optional[str]):
        if metric is None:
            metric = "delta_ppl" if view.causal else "embedding_distance"
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if metric == "delta_ppl" and not view.causal:
            raise ValueError(
                "delta_ppl needs a causal decoder; for an encoder pass metric="
                "'embedding_distance'"
            )
        self.view = view
        self.metric = metric

    def run(
        self, tokens: Tensor, mask: Tensor, hooks: list, *, attn_mask: Optional[Tensor]
    ) -> Tensor:
        """Decoder: ``[rows, 2]`` (NLL sum, count); encoder: ``[rows, d_model]`` embedding."""
        view = self.view
        if self.metric == "delta_ppl":
            with torch.no_grad():
                logits = view.run(tokens, attention_mask=attn_mask, fwd_hooks=hooks)
            nll = next_token_nll(logits, tokens)
            ok = (mask[:, 1:] & mask[:, :-1]).to(nll.device)
            return torch.stack([(nll * ok).sum(-1), ok.sum(-1).to(nll.dtype)], -1).double().cpu()
        name = f"blocks.{view.n_layers - 1}.hook_resid_post"
        cap: dict[str, Tensor] = {}

        def hook(t: Tensor, hook: Any = None) -> Tensor:
            cap["h"] = t.detach()
            raise StopForward  # the head (a random MLM head for MiniLM) is not needed

        try:
            with torch.no_grad():
                view.run(tokens, attention_mask=attn_mask, fwd_hooks=hooks + [(name, hook)],
                         return_type=None)
        except StopForward:
            pass
        h = cap["h"].double()
        w = mask.to(h.device, h.dtype).unsqueeze(-1)
        e = (h * w).sum(1) / w.sum(1).clamp_min(1.0)
        return torch.nn.functional.normalize(e, dim=-1).cpu()


def padding_attention_mask(view: ModelView, mask: Tensor) -> Optional[Tensor]:
    """The attention mask a forward pass needs: None for causal decoders (real tokens never
    see right padding) and for unpadded batches, else the padding mask of the keys."""
    return None if (view.causal or bool(mask.all())) else mask.long()
