"""The GPT family the project trains, its trainer, the TransformerLens converter and the zoo.

- :class:`GPT` / :class:`GPTConfig` (``gpt.py``): decoder-only transformer; attention kind
  (``"softmax"``, ``"sd"``, ``"linear"``) and head dimension per layer; LayerNorm or none.
  :func:`save_model` / :func:`load_checkpoint` write and read a checkpoint folder
  (``load_model`` is the deprecated name of ``load_checkpoint``).
- :class:`Trainer` / :class:`TrainConfig` (``train.py``): AdamW, warm-up + cosine, exact resume.
- :func:`to_transformer_lens` (``convert.py``): same logits inside TransformerLens.
- ``tl_spectral.models.surgery`` and ``tl_spectral.models.ablations``: deprecated paths of
  :mod:`tl_spectral.interventions.surgery` and :mod:`tl_spectral.interventions.ablations`
  (the experiments on models moved out of the model family; removed in tl_spectral 0.3).
- ``tl_spectral.models.zoo`` (``zoo.py``, also ``tl_spectral.zoo``): the shipped checkpoints, offline.

``convert`` and ``zoo`` import TransformerLens lazily (only when called).
"""

from tl_spectral._deprecation import install_moved_modules
from tl_spectral.models.attention import (
    ATTENTION_KINDS,
    LinearAttention,
    SDAttention,
    SoftmaxAttention,
    make_attention,
    register_attention,
)
from tl_spectral.models.gpt import GPT, GPTConfig, load_checkpoint, save_model

install_moved_modules()  # the old paths tl_spectral.models.surgery / .ablations

_TRAIN_NAMES = ("TrainConfig", "Trainer", "TrainHistory", "train_cli")
#: submodules moved to tl_spectral.interventions (deprecated here until tl_spectral 0.3)
_MOVED = ("ablations", "surgery")


def __getattr__(name):
    # train.py is imported lazily so that ``python -m tl_spectral.models.train`` runs cleanly
    if name in _TRAIN_NAMES:
        from tl_spectral.models import train

        return getattr(train, name)
    if name in _MOVED:
        import importlib
        import warnings

        from tl_spectral._deprecation import warn_deprecated

        warn_deprecated(f"tl_spectral.models.{name}", f"tl_spectral.interventions.{name}")
        # the old name, imported through the moved-module finder (one warning, at the
        # caller's line; by name: the ground floor never imports the interventions)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(f"tl_spectral.models.{name}")
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
