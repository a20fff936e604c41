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


def check_suffix_nll(ops, hf, toks: torch.Tensor, batch_size: int = 2) -> None:
    """The one-layer-at-a-time removal run from layer ``l`` on (``window_nll`` with ``start``
    and the clean pass's ``layer_inputs``) equals the full pass with the same layer changed,
    for every layer and both removals; the clean pass of ``layer_inputs`` is ``window_nll``'s;
    a change below ``start``, missing inputs or another batch size is refused."""
    import pytest

    L = len(hf.model.layers)
    clean, inputs = ops.layer_inputs(hf, toks, batch_size=batch_size)
    torch.testing.assert_close(clean, ops.window_nll(hf, toks, batch_size=batch_size),
                               rtol=0, atol=0)
    assert len(inputs) == -(-toks.shape[0] // batch_size) and len(inputs[0]) == L
    for li in range(L):
        for mode in ("routing", "filtering"):
            full = ops.window_nll(hf, toks, {li: mode}, batch_size=batch_size)
            part = ops.window_nll(hf, toks, {li: mode}, batch_size=batch_size, start=li,
                                  inputs=inputs)
            torch.testing.assert_close(part, full, rtol=1e-6, atol=1e-6)
            assert not torch.allclose(full, clean)  # the change is seen
    # the layers are restored: a plain pass is the clean one again
    torch.testing.assert_close(ops.window_nll(hf, toks, batch_size=batch_size), clean,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="below start"):
        ops.window_nll(hf, toks, {0: "routing"}, start=1, inputs=inputs, batch_size=batch_size)
    with pytest.raises(ValueError, match="needs inputs"):
        ops.window_nll(hf, toks, {1: "routing"}, start=1)
    with pytest.raises(ValueError, match="same batch_size"):
        ops.window_nll(hf, toks, {1: "routing"}, start=1, inputs=inputs,
                       batch_size=batch_size + 1)
