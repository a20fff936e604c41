"""The training configuration of the GPT family: :class:`TrainConfig` (bounds checked at
construction), the learning-rate schedule and the device check (split from ``train.py``)."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from tl_spectral.checks import is_int, is_real

__all__ = ["IDENTITY_FIELDS", "TrainConfig", "warmup_cosine_lr"]

#: TrainConfig fields that define a run (with the model configuration and the training
#: tokens): changing any of them changes the trajectory of the weights.
# ``steps`` is not part of the identity: extending (or shortening) a run is a resume of the
# same run — its cosine schedule changes from the resumed step on, as log.jsonl records.
IDENTITY_FIELDS = ("batch_size", "lr", "min_lr", "warmup_steps", "weight_decay",
                   "betas", "eps", "grad_clip", "seed")


def warmup_cosine_lr(step: int, *, lr: float, min_lr: float, warmup_steps: int,
                     steps: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warm-up to ``lr`` over
    ``warmup_steps``, then a cosine from ``lr`` to ``min_lr`` at ``steps``."""
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, steps - warmup_steps)
    frac = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * frac))


@dataclass
class TrainConfig:
    """Training hyper-parameters (JSON-loadable with :meth:`from_dict`).

    steps: total optimizer steps; batch_size: global batch (windows of ``seq_len+1``
    tokens; ``seq_len`` None = the model's n_ctx); lr peaks after ``warmup_steps`` of linear
    warm-up and decays along a cosine to ``min_lr`` at ``steps``; AdamW with
    ``weight_decay`` on matrices/embeddings only, except the parameters whose names match
    one of the shell-style patterns of ``no_decay`` (``fnmatch`` on
    ``model.named_parameters()`` names, e.g. ``["*.A", "*.delta"]`` for the S–D kernels;
    every pattern must match a parameter); ``grad_clip`` (global norm, 0 = off).
    Every ``eval_every`` steps: validation loss/perplexity on ``eval_windows`` evenly spaced
    windows of the validation tokens (None = all). Every ``checkpoint_every`` steps: a
    checkpoint in ``out_dir/checkpoints`` (the last ``keep_checkpoints`` are kept).
    ``resume``: continue from the last intact checkpoint of the same run in ``out_dir`` if
    any. ``overwrite``: delete the outputs of whatever run ``out_dir`` holds (checkpoints,
    final/, log.jsonl) and start afresh; without it a run refuses an ``out_dir`` that holds
    another run's outputs (:class:`RunConflictError`).
    """

    steps: int = 1000
    batch_size: int = 32
    seq_len: int | None = None
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_windows: int | None = None
    eval_batch_size: int = 32
    checkpoint_every: int = 250
    keep_checkpoints: int = 2
    out_dir: str | None = None
    resume: bool = True
    overwrite: bool = False
    seed: int = 0
    device: str = "auto"
    num_threads: int | None = None
    progress: bool = True
    log_every: int = 10
    no_decay: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._check_bounds()
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        if isinstance(self.no_decay, str) or not all(isinstance(x, str) and x
                                                      for x in self.no_decay):
            raise ValueError("TrainConfig.no_decay must be a list of parameter-name patterns "
                             f"such as ['*.A', '*.delta'], got {self.no_decay!r}")
        self.no_decay = list(self.no_decay)
        for name in ("steps", "batch_size", "eval_every", "checkpoint_every", "eval_batch_size",
                     "log_every", "keep_checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        if self.warmup_steps < 0 or self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps must lie in [0, steps={self.steps}], "
                             f"got {self.warmup_steps}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, "
                             f"min_lr={self.min_lr}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:i]', got {self.device!r}")

    def _check_bounds(self) -> None:
        """Types and ranges of the fields that used to be accepted silently (a negative
        weight decay, a clip of -1 that switched clipping off, seq_len 0 read as n_ctx, ...):
        a ``ValueError`` naming the field and what to pass, before anything is built."""
        def num(v) -> bool:
            return is_real(v, numpy=True) and math.isfinite(v)

        def whole(v) -> bool:
            return is_int(v, numpy=True)

        for name, ok, want in (
                ("lr", num(self.lr), "a finite number > 0"),
                ("min_lr", num(self.min_lr), "a finite number >= 0"),
                ("weight_decay", num(self.weight_decay) and self.weight_decay >= 0,
                 "a finite number >= 0 (0: no decay)"),
                ("grad_clip", num(self.grad_clip) and self.grad_clip >= 0,
                 "a finite number >= 0 (0: no clipping)"),
                ("eps", num(self.eps) and self.eps > 0, "a finite number > 0, e.g. 1e-8"),
                ("warmup_steps", whole(self.warmup_steps), "an int >= 0"),
                ("seq_len", self.seq_len is None or whole(self.seq_len) and self.seq_len >= 1,
                 "an int >= 1, or null for the model's n_ctx"),
                ("eval_windows", self.eval_windows is None or
                 whole(self.eval_windows) and self.eval_windows >= 1,
                 "an int >= 1, or null for every validation window"),
                ("num_threads", self.num_threads is None or
                 whole(self.num_threads) and self.num_threads >= 1,
                 "an int >= 1, or null for torch's default"),
                ("seed", whole(self.seed) and 0 <= self.seed < 2**63,
                 "an int in [0, 2**63)"),
                ("device", isinstance(self.device, str), "'auto', 'cpu' or 'cuda[:i]'"),
                ("out_dir", self.out_dir is None or isinstance(self.out_dir, (str, os.PathLike)),
                 "a folder path or null")):
            if not ok:
                raise ValueError(f"TrainConfig.{name} must be {want}, got {getattr(self, name)!r}")
        b = self.betas
        if isinstance(b, (str, bytes)) or not hasattr(b, "__len__") or len(b) != 2 or \
                not all(num(x) and 0 <= x < 1 for x in b):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), e.g. "
                             f"[0.9, 0.99], got {b!r}")
        if self.out_dir is not None:
            self.out_dir = os.fspath(self.out_dir)  # a Path too (saved as JSON)

    def check_device(self) -> None:
        """The device is there: 'cuda' on a machine without CUDA (or a GPU index past the
        last) is a ``ValueError`` naming what to pass instead."""
        resolve_device(self.device)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted(names)}")
        return cls(**d)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up then cosine."""
        return warmup_cosine_lr(step, lr=self.lr, min_lr=self.min_lr,
                                warmup_steps=self.warmup_steps, steps=self.steps)

    def identity(self) -> dict[str, Any]:
        """The fields of :data:`IDENTITY_FIELDS` (JSON-able): what a resume must not change;
        ``no_decay`` too when it is set (absent when empty, so older runs keep their id)."""
        d = self.to_dict()
        out = {k: d[k] for k in IDENTITY_FIELDS}
        if self.no_decay:
            out["no_decay"] = list(self.no_decay)
        return out


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The torch device a training config's ``device`` names (``"auto"``: CUDA if torch sees
    one, else CPU; ``"cuda"``: this process's ``local_rank`` GPU); one-line ValueError naming
    what to pass when this machine has no such device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: this machine has no CUDA GPU that torch can use; "
                         "pass --device cpu (train.device 'cpu' or 'auto')")
    if name == "cuda":
        name = f"cuda:{local_rank}"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a device; pass 'auto', 'cpu' or "
                         "'cuda[:i]'") from None
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA "
                         f"GPU(s); pass cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return dev
