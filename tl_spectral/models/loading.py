"""Models by name, as ``tl-spectral analyze --model`` takes them: a zoo name, ``"random"``
(a seeded random reference model), the folder of a local Hugging Face model or a ``.gguf``
file (dequantized once into the cache, :mod:`tl_spectral.models.gguf`).

:func:`load_model` (``tls.load_model``) is the public loader: those, and a folder of the
project's own checkpoint; :func:`tl_spectral.models.load_checkpoint` reads such a folder as
the project's GPT itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tl_spectral.checks import is_int
from tl_spectral.models.hub import check_device, hub_offline
from tl_spectral.usage import UsageError

__all__ = ["ModelInfo", "check_device", "hf_folder_info", "hub_offline", "load_model",
           "load_named_model", "model_info", "random_reference_model", "resolve_model"]

#: the context of :func:`random_reference_model` (the char-shakespeare size)
RANDOM_N_CTX = 256


def random_reference_model(seed: int = 0):
    """A seeded random TransformerBridge of the char-shakespeare size (6L, 8H, d 128, ctx 256)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from tl_spectral.data import CharTokenizer, tiny_shakespeare

    tok = CharTokenizer.from_text(tiny_shakespeare())
    cfg = TransformerBridgeConfig(
        d_model=128, d_head=16, n_layers=6, n_ctx=RANDOM_N_CTX, n_heads=8, d_vocab=tok.vocab_size,
        act_fn="gelu", normalization_type="LN", seed=seed, model_name="random-6L",
    )
    return TransformerBridge.boot_native(cfg, model_name="random-6L"), tok


def resolve_model(name: str) -> tuple[str, str]:
    """(kind, target) for ``--model``: ("zoo", name), ("random", "random"), ("hf", folder)
    or ("gguf", file).

    A bare name is looked up in the zoo first (a local folder of the same name does not
    shadow it); a local Hugging Face folder is given as a path (with a ``/`` or starting
    with ``.``), holding ``config.json``. Raises :class:`UsageError` otherwise."""
    from tl_spectral.models import zoo

    if name == "random":
        return "random", name
    if name in zoo.available():
        return "zoo", name
    if name.lower().endswith(".gguf"):
        return "gguf", _check_gguf_file(Path(name), name)
    looks_like_path = "/" in name or name.startswith(".") or os.sep in name
    p = Path(name)
    if looks_like_path and p.is_dir() and (p / "config.json").is_file():
        _check_hf_weights(p, name)
        return "hf", str(p)
    if looks_like_path and p.exists():
        raise UsageError(f"--model {name}: no config.json in that folder; pass a Hugging Face "
                         "model folder (save_pretrained output)")
    hint = f" (for the local folder, pass ./{name})" if p.is_dir() else ""
    raise UsageError(f"unknown model {name!r}{hint}; pass a zoo name "
                     f"({', '.join(zoo.available())}), 'random', the path of a local Hugging "
                     "Face folder, or of a .gguf file")


@dataclass(frozen=True)
class ModelInfo:
    """What a model is, read from its metadata without loading its weights (:func:`model_info`);
    None where only the loaded model can say.

    n_ctx: its context (the longest window); causal: False for a bidirectional encoder;
    prepend_bos: its start-token convention (windows start with the tokenizer's start token,
    as in its training); bos_fixed: that convention is fixed by its training and its
    tokenizer (the project's character models), not a default a caller may change."""

    n_ctx: Optional[int] = None
    causal: Optional[bool] = None
    prepend_bos: Optional[bool] = None
    bos_fixed: bool = False

    @classmethod
    def of_loaded(cls, model: Any) -> "ModelInfo":
        """The same, read from a loaded model (its ModelView and ``default_prepend_bos``)."""
        from tl_spectral.model_view import ModelView

        view = model if isinstance(model, ModelView) else ModelView(model)
        return cls(view.n_ctx, view.causal,
                   bool(getattr(view.cfg, "default_prepend_bos", False)))


def model_info(name: str) -> ModelInfo:
    """:class:`ModelInfo` of a ``--model`` name (:func:`resolve_model`'s kinds), from metadata
    only: the character checkpoints' config.json, a Hugging Face folder's config.json (as
    TransformerBridge will boot it, :func:`hf_folder_info`), the GGUF entries' declarations and
    their cached config.json. A GGUF decoder whose cache is not built yet has no context length
    here (the load builds it)."""
    kind, target = resolve_model(name)
    if kind == "random":
        return ModelInfo(RANDOM_N_CTX, True, False)
    if kind == "hf":
        return ModelInfo(*hf_folder_info(target))
    from tl_spectral.models import gguf, zoo

    if kind == "gguf" or target in gguf.ENTRIES:
        return _gguf_info(target)
    if target in zoo.SHIPPED:  # the project's GPT: causal
        doc = zoo.checkpoint_info(target)
        bos = zoo.char_tokenizer(doc).bos_id is not None
        return ModelInfo(int(doc["model"]["n_ctx"]), True, bos, bos_fixed=True)
    try:
        folder = zoo.minilm_path()  # the one other zoo entry: a Hugging Face folder
    except ImportError:  # not installed: the load says which package to install
        return ModelInfo()
    return ModelInfo(*hf_folder_info(folder), prepend_bos=False)


def _gguf_info(target: str) -> ModelInfo:
    """A GGUF decoder: causal (the GGUF loader reads causal language models only); its
    start-token convention from the zoo entry or the file's header; its context from its
    cached config.json when the cache is built."""
    from tl_spectral.models import gguf

    if gguf.is_gguf_path(target):  # its cache folder is named by the file's hash: not read
        try:
            return ModelInfo(None, True, gguf.read_header(target)["add_bos_token"])
        except (ValueError, ImportError):
            return ModelInfo(None, True)
    folder = gguf.cache_dir(target)
    n_ctx = hf_folder_info(folder)[0] if (folder / "config.json").is_file() else None
    return ModelInfo(n_ctx, True, gguf.ENTRIES[target].prepend_bos)


def hf_folder_info(folder: str | os.PathLike) -> tuple[Optional[int], Optional[bool]]:
    """``(n_ctx, causal)`` of a Hugging Face folder as ``TransformerBridge.boot_transformers``
    will boot it: its config.json (transformers' ``AutoConfig``, offline) through
    TransformerLens' config mapping and architecture adapter, with no weights loaded.
    ``(None, None)`` where they cannot say (TransformerLens 3.9, an architecture it does not
    know, an unreadable config): the load then says what is wrong."""
    try:
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.factories.architecture_adapter_factory import (
            ArchitectureAdapterFactory,
        )
        from transformer_lens.model_bridge.sources.transformers import (
            determine_architecture_from_hf_config,
            map_default_transformer_lens_config,
        )
        from transformers import AutoConfig

        with hub_offline():
            hf = AutoConfig.from_pretrained(str(folder))
        cfg = TransformerBridgeConfig.from_dict(dict(map_default_transformer_lens_config(hf)
                                                     .__dict__))
        cfg.architecture = determine_architecture_from_hf_config(hf)
        cfg = ArchitectureAdapterFactory.select_architecture_adapter(cfg).cfg
        return int(cfg.n_ctx), getattr(cfg, "attention_dir", "causal") == "causal"
    except Exception:  # noqa: BLE001 - metadata only: the load reports what is wrong
        return None, None


def _check_gguf_file(p: Path, name: str) -> str:
    """``--model file.gguf``: a readable GGUF file of a supported architecture (its header
    is read, not its weights)."""
    from tl_spectral.models import gguf

    if not p.is_file():
        raise UsageError(f"--model {name}: no such file; pass the path of a .gguf file")
    try:
        gguf.check_architecture(gguf.read_header(p)["architecture"], f"--model {name}")
    except (ValueError, ImportError) as e:
        raise UsageError(_one_line(e)) from None
    return str(p)


#: Weight files that are read by unpickling (or in another framework): never loaded.
_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.h5", "*.msgpack")


def _check_hf_weights(folder: Path, name: str) -> None:
    """A Hugging Face folder holds safetensors weights: a folder with only pickled ones
    (``pytorch_model.bin``) is refused with how to convert them, never unpickled."""
    if any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").is_file():
        _check_hf_config_size(folder, name)
        return
    pickled = sorted(q.name for pat in _PICKLE_WEIGHTS for q in folder.glob(pat))
    if not pickled:
        raise UsageError(f"--model {name}: no model.safetensors in that folder; pass a "
                         "Hugging Face folder saved with save_pretrained (safetensors)")
    src = (folder / pickled[0]).resolve()
    raise UsageError(
        f"--model {name} holds only pickled weights ({', '.join(pickled[:3])}); tl-spectral "
        "reads safetensors only. Convert them once, in an environment you trust with that "
        "file: python -c \"import torch; from safetensors.torch import save_file; "
        f"sd = torch.load('{src}', map_location='cpu', weights_only=True); "
        "save_file({k: v.clone().contiguous() for k, v in sd.items()}, "
        f"'{src.parent / 'model.safetensors'}', metadata={{'format': 'pt'}})\" (or "
        "save_pretrained(folder, safe_serialization=True) on the loaded model)")


def _check_hf_config_size(folder: Path, name: str) -> None:
    """config.json must not describe a model far larger than the weights there: the model
    is built from config.json before its weights load, so a hostile config (a vocabulary or
    width of billions) would exhaust the memory. A lower bound of the parameters it implies
    (embedding + one norm per layer) is compared with the tensors in the safetensors
    headers (read without loading them)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"--model {name}: its config.json is not readable JSON "
                         f"({_one_line(e)[:100]})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--model {name}: its config.json is not a JSON object")
    cfg = {**cfg, **(cfg.get("text_config") or {})} if isinstance(
        cfg.get("text_config"), dict) else cfg

    def first(*keys: str) -> int:
        for k in keys:
            v = cfg.get(k)
            if v is not None:
                if not (is_int(v) and v >= 0):
                    raise UsageError(f"--model {name}: config.json {k}={v!r} is not a "
                                     "non-negative int; the folder is damaged")
                return v
        return 0

    width = first("hidden_size", "n_embd", "d_model")
    implied = first("vocab_size") * width + first("num_hidden_layers", "n_layer",
                                                  "num_layers") * width
    if implied <= 10**6:
        return
    from safetensors import safe_open

    held = 0
    try:
        for f in folder.glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    n = 1
                    for d in fh.get_slice(k).get_shape():
                        n *= int(d)
                    held += n
    except Exception as e:  # noqa: BLE001 - any unreadable header: the user's file
        raise UsageError(f"--model {name}: {f.name} is not a readable safetensors file "
                         f"({_one_line(e)[:100]})") from None
    if implied > 2 * held + 10**6:
        raise UsageError(f"--model {name}: config.json describes at least {implied:,} "
                         f"parameters but the weights hold {held:,}; the folder's config and "
                         "weights do not belong together (refused before building the model)")


def _one_line(e: BaseException) -> str:
    return " ".join((str(e) or type(e).__name__).split())


def load_named_model(name: str) -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer from a zoo name, "random" or an HF folder
    (see :func:`resolve_model`); the command line's ``--model``. :func:`load_model` also
    takes a folder of the project's own checkpoint."""
    kind, target = resolve_model(name)
    if kind == "random":
        return random_reference_model()
    if kind == "hf":
        return _boot_hf_folder(target, "cpu")
    if kind == "gguf":
        from tl_spectral.models import gguf

        return gguf.load(target)
    from tl_spectral.models import zoo

    return zoo.load(target)


def _boot_hf_folder(folder: str, device: Any) -> tuple[Any, Any]:
    """A local Hugging Face folder booted as a TransformerBridge (TransformerLens 4.x), the
    hub offline for the load only."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # TransformerLens 3.9
        raise UsageError(
            f"{folder}: a Hugging Face folder is booted with TransformerLens 4's "
            "TransformerBridge.boot_transformers; on TransformerLens 3.9 build the model "
            "yourself (HookedTransformer.from_pretrained(official_name, hf_model=...)) and "
            "pass it to the probes") from None
    with hub_offline():
        model = TransformerBridge.boot_transformers(folder, device=device)
    return model, model.tokenizer


def _is_checkpoint(folder: Path) -> bool:
    """``folder`` holds a checkpoint of the project's GPT (``save_model``'s config.json)."""
    from tl_spectral.models.gpt import read_checkpoint_config

    try:
        read_checkpoint_config(folder)
    except (OSError, ValueError, RecursionError):
        return False
    return True


def load_model(name_or_folder: str | os.PathLike, *, device: Any = "cpu") -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer, offline: the one loader of the public API.

    name_or_folder: a zoo name (``tls.zoo.available()``), ``"random"`` (a seeded random
    6-layer TransformerBridge and the character tokenizer), the folder of a local Hugging
    Face model (config.json + safetensors weights; booted with TransformerLens 4's
    ``TransformerBridge.boot_transformers``), a ``.gguf`` file (dequantized once into the
    cache, :mod:`tl_spectral.models.gguf`), or a folder written by
    :func:`tl_spectral.models.save_model` (the project's GPT, converted with
    :func:`~tl_spectral.models.convert.to_transformer_lens`, and its character tokenizer, or
    None when the checkpoint records none).
    A bare name is a zoo name; give a folder as a path (``"./my-model"``) or a ``Path``.
    The project's GPT itself (for surgery) is :func:`tl_spectral.models.load_checkpoint`.

    Raises ``ValueError`` (one line) for an unknown name, a folder that holds neither kind
    of model, one with only pickled weights (never unpickled), or a device this machine
    does not have.
    """
    check_device(device)
    if isinstance(name_or_folder, os.PathLike):
        path = Path(name_or_folder)
        name = str(path) if ("/" in str(path) or os.sep in str(path)) else f"./{path}"
    else:
        name = str(name_or_folder)
    folder = Path(name)
    if name not in ("random",) and folder.is_dir() and _is_checkpoint(folder):
        from tl_spectral.models import zoo
        from tl_spectral.models.convert import to_transformer_lens
        from tl_spectral.models.gpt import load_checkpoint, read_checkpoint_config

        gpt = load_checkpoint(folder, map_location=device).eval()
        doc = read_checkpoint_config(folder)
        tok = zoo.char_tokenizer(doc) if "tokenizer" in doc else None
        tl_model = to_transformer_lens(gpt, device=device)
        if tok is not None:
            zoo.attach_tokenizer(tl_model, tok, prepend_bos=getattr(tok, "bos", False))
        return tl_model, tok
    kind, target = resolve_model(name)
    if kind == "random":
        model, tok = random_reference_model()
        return model.to(device), tok
    if kind == "hf":
        return _boot_hf_folder(target, device)
    if kind == "gguf":
        from tl_spectral.models import gguf

        return gguf.load(target, device)
    from tl_spectral.models import zoo

    return zoo.load(target, device=device)
