"""One converter for every function that takes tokens: ``as_token_tensor``."""

from __future__ import annotations

from typing import Any

import torch


def as_token_tensor(tokens: Any, what: str = "tokens", *, min_len: int = 1) -> torch.Tensor:
    """``[n, T]`` int64 tokens from what a user holds: the ``DocumentWindows`` that
    :func:`~tl_spectral.data.document_windows` returns, a tensor (``[T]`` or ``[n, T]``), a
    list of token ids (one document) or a list of equal-length lists (documents).

    Raises ``TypeError`` / ``ValueError`` naming ``what`` and what to pass instead."""
    if hasattr(tokens, "tokens") and isinstance(tokens.tokens, torch.Tensor):
        tokens = tokens.tokens  # DocumentWindows
    if isinstance(tokens, (list, tuple)):
        if not tokens:
            raise ValueError(f"{what} is empty; pass token ids (a tensor [n, T], a list of "
                             "lists, or document_windows(...))")
        try:
            tokens = torch.tensor(tokens, dtype=torch.long)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{what}: the lists of token ids have different lengths or hold "
                             f"non-integers ({e}); pass equal-length lists, or use "
                             "run_probes with a padded batch") from None
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{what} must be token ids (a tensor [n, T], a list of lists, or "
                        f"document_windows(...)), got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2:
        raise ValueError(f"{what} must be [n, T] token ids, got shape {tuple(tokens.shape)}")
    if tokens.shape[1] < min_len:
        raise ValueError(f"{what} must hold at least {min_len} tokens per row, got "
                         f"{tokens.shape[1]}")
    return tokens.long()
