"""circuitsvis views of results. Imports nothing of the library, so result classes may
call these without an import cycle.

``contribution_view`` shows a contribution map with ``circuitsvis.attention.attention_heads``
(one small heat map per head, plus the token level ``C = Σ_h c`` as the last "head"):
positive values in red, negative values (destructive interference) in blue, white at 0, with
symmetric limits ``±lim`` so equal magnitudes get equal colour depth. ``lim`` is the largest
|value| over the shown maps, or with ``clip_quantile < 1`` that quantile of |value|.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch


def contribution_view(
    maps: Any,
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

    if not (callable(getattr(maps, "measure", None)) and callable(getattr(maps, "token_level", None))):
        raise TypeError(
            f"contribution_view takes ContributionMaps first, got {type(maps).__name__}: pass "
            "e.g. layer_maps(model, tokens)[layer] (or ContributionStats.maps(layer)), then the "
            "document's token strings (model.to_str_tokens(tokens[0]))"
        )
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(
            f"contribution_view: tokens are the document's token strings, got "
            f"{type(tokens).__name__}{' of ' + type(next(iter(tokens))).__name__ if not isinstance(tokens, str) and len(tokens) else ''}; "
            "pass e.g. model.to_str_tokens(tokens[0])"
        )
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
