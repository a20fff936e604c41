"""Checks shared by the real-decoder study tests (Llama and Gemma-3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_window_nll(ops, hf, toks: torch.Tensor) -> torch.Tensor:
    """``ops.window_nll`` of a Hugging Face causal LM on ``toks [n, T]`` equals the summed
    cross entropy of its own logits, window by window; returns the NLLs."""
    nll = ops.window_nll(hf, toks, batch_size=2)
    with torch.no_grad():
        lg = hf(toks).logits[:, :-1]
    want = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), toks[:, 1:].reshape(-1),
                           reduction="none").view(toks.shape[0], -1).sum(1).double()
    torch.testing.assert_close(nll, want, rtol=1e-5, atol=1e-5)
    return nll
