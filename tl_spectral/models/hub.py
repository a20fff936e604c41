"""The machine a model loads on: the Hugging Face hub offline for one load only, and a
device check before any weights load. The ground of the model loaders (``gguf``, ``zoo``,
``loading`` import it; it imports none of them)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

__all__ = ["check_device", "hub_offline"]

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """The Hugging Face hub offline for the duration of a load only: the environment
    variables and ``huggingface_hub``'s constant (read once at its import) are restored
    afterwards, so a user's later ``from_pretrained("gpt2")`` can still download."""
    import huggingface_hub.constants as hub  # imported first: it reads the environment once

    old_env = {k: os.environ.get(k) for k in _OFFLINE_VARS}
    old_const = hub.HF_HUB_OFFLINE
    os.environ.update({k: "1" for k in _OFFLINE_VARS})
    hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = old_const
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_device(device: Any) -> None:
    """ValueError (one line) for a device this machine does not have, before any weights
    load: ``"cuda"`` without CUDA, ``"mps"`` without MPS."""
    import torch

    kind = str(device).split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: CUDA is not available here; pass "
                         "device='cpu'")
    if kind == "mps" and not (hasattr(torch.backends, "mps")
                              and torch.backends.mps.is_available()):
        raise ValueError(f"device={str(device)!r}: MPS is not available here; pass "
                         "device='cpu'")
