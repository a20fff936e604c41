"""The GPT family the project trains, its trainer, the TransformerLens converter and the zoo.

- :class:`GPT` / :class:`GPTConfig` (``gpt.py``): decoder-only transformer; attention kind
  (``"softmax"``, ``"sd"``, ``"linear"``) and head dimension per layer; LayerNorm or none.
  :func:`save_model` / :func:`load_checkpoint` write and read a checkpoint folder
  (``load_model`` is the deprecated name of ``load_checkpoint``).
- :class:`Trainer` / :class:`TrainConfig` (``train.py``): AdamW, warm-up + cosine, exact resume.
- :func:`to_transformer_lens` (``convert.py``): same logits inside TransformerLens.
- :mod:`~tl_spectral.models.ablations`: the SPEC B.4 ablations with ΔPPL.
- :mod:`~tl_spectral.models.surgery`: linearization and cascade allocation (SPEC B.5–B.6).
- ``tl_spectral.models.zoo`` (``zoo.py``, also ``tl_spectral.zoo``): the shipped checkpoints, offline.

``convert`` and ``zoo`` import TransformerLens lazily (only when called).
"""

from tl_spectral.models.attention import (
    ATTENTION_KINDS,
    LinearAttention,
    SDAttention,
    SoftmaxAttention,
    make_attention,
    register_attention,
)
from tl_spectral.models.gpt import GPT, GPTConfig, load_checkpoint, save_model

_TRAIN_NAMES = ("TrainConfig", "Trainer", "TrainHistory", "train_cli")


def __getattr__(name):
    # train.py is imported lazily so that ``python -m tl_spectral.models.train`` runs cleanly
    if name in _TRAIN_NAMES:
        from tl_spectral.models import train

        return getattr(train, name)
    if name == "load_model":  # the old name of load_checkpoint, deprecated (warns)
        from tl_spectral.models import gpt

        return gpt.load_model
    raise AttributeError(f"module 'tl_spectral.models' has no attribute {name!r}")


def to_transformer_lens(model, **kwargs):
    """See :func:`tl_spectral.models.convert.to_transformer_lens`."""
    from tl_spectral.models.convert import to_transformer_lens as _f

    return _f(model, **kwargs)


def to_transformer_lens_config(model, **kwargs):
    """See :func:`tl_spectral.models.convert.to_transformer_lens_config`."""
    from tl_spectral.models.convert import to_transformer_lens_config as _f

    return _f(model, **kwargs)


__all__ = [
    "ATTENTION_KINDS",
    "GPT",
    "GPTConfig",
    "LinearAttention",
    "SDAttention",
    "SoftmaxAttention",
    "TrainConfig",
    "TrainHistory",
    "Trainer",
    "load_checkpoint",
    "make_attention",
    "register_attention",
    "save_model",
    "to_transformer_lens",
    "to_transformer_lens_config",
    "train_cli",
]
