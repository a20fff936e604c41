"""``tl-spectral analyze --baseline random``: the same configuration re-initialised, run on
the same windows, as a reference for the spectral numbers (H*, T_spec, band shares).

:func:`random_copy` deep-copies the model and draws every weight afresh the way GPT-2 /
Hugging Face initialise a transformer: matrices (and embeddings) ``N(0, 0.02²)``, biases 0,
normalization gains 1 and biases 0 — whatever the model's own initialisation was, a
reference that has learned nothing. Seeded."""

from __future__ import annotations

import copy
from typing import Any

import torch

#: the standard deviation of the re-initialised matrices (GPT-2's initializer_range)
INIT_STD = 0.02


def random_copy(model: Any, seed: int = 0) -> Any:
    """A deep copy of ``model`` with re-initialised weights (module doc). The copy's plain
    floating parameters start empty (every one is then drawn or filled: the old weights are
    never copied), and float32 matrices are drawn in place — the same values as drawing a
    float32 tensor and scaling it."""
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p), requires_grad=p.requires_grad)
            for p in model.parameters()
            if type(p) is torch.nn.Parameter and p.is_floating_point()}
    twin = copy.deepcopy(model, memo)
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in twin.named_parameters():
            low = name.lower()
            is_norm = any(k in low for k in ("norm", "ln_", ".ln", "ln1", "ln2", "ln_f"))
            if p.dim() >= 2 and not is_norm:
                if p.dtype == torch.float32 and p.is_contiguous() and p.device.type == "cpu":
                    torch.randn(p.shape, generator=g, dtype=torch.float32, out=p.data)
                    p.mul_(INIT_STD)
                else:
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p)
                            * INIT_STD)
            elif is_norm and (low.endswith("weight") or low.endswith(".w")):
                p.fill_(1.0)
            else:
                p.zero_()
    return twin
