"""Models by name, as ``tl-spectral analyze --model`` takes them: a zoo name, ``"random"``
(a seeded random reference model) or the folder of a local Hugging Face model.

:func:`load_named_model` is not :func:`tl_spectral.models.load_model`, which reads one of
the project's own checkpoints from its folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tl_spectral.usage import UsageError

__all__ = ["load_named_model", "random_reference_model", "resolve_model"]


def random_reference_model(seed: int = 0):
    """A seeded random TransformerBridge of the char-shakespeare size (6L, 8H, d 128, ctx 256)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from tl_spectral.data import CharTokenizer, tiny_shakespeare

    tok = CharTokenizer.from_text(tiny_shakespeare())
    cfg = TransformerBridgeConfig(
        d_model=128, d_head=16, n_layers=6, n_ctx=256, n_heads=8, d_vocab=tok.vocab_size,
        act_fn="gelu", normalization_type="LN", seed=seed, model_name="random-6L",
    )
    return TransformerBridge.boot_native(cfg, model_name="random-6L"), tok


def resolve_model(name: str) -> tuple[str, str]:
    """(kind, target) for ``--model``: ("zoo", name), ("random", "random") or ("hf", folder).

    A bare name is looked up in the zoo first (a local folder of the same name does not
    shadow it); a local Hugging Face folder is given as a path (with a ``/`` or starting
    with ``.``), holding ``config.json``. Raises :class:`UsageError` otherwise."""
    from tl_spectral.models import zoo

    if name == "random":
        return "random", name
    if name in zoo.available():
        return "zoo", name
    looks_like_path = "/" in name or name.startswith(".") or os.sep in name
    p = Path(name)
    if looks_like_path and p.is_dir() and (p / "config.json").is_file():
        return "hf", str(p)
    if looks_like_path and p.exists():
        raise UsageError(f"--model {name}: no config.json in that folder; pass a Hugging Face "
                         "model folder (save_pretrained output)")
    hint = f" (for the local folder, pass ./{name})" if p.is_dir() else ""
    raise UsageError(f"unknown model {name!r}{hint}; pass a zoo name "
                     f"({', '.join(zoo.available())}), 'random', or the path of a local Hugging "
                     "Face folder")


def load_named_model(name: str) -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer from a zoo name, "random" or an HF folder
    (see :func:`resolve_model`)."""
    kind, target = resolve_model(name)
    if kind == "random":
        return random_reference_model()
    if kind == "hf":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(target, device="cpu")
        return model, model.tokenizer
    from tl_spectral.models import zoo

    return zoo.load(target)
