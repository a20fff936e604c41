"""Trainer for the GPT family: AdamW, warm-up + cosine schedule, clipping, evaluation,
safetensors checkpoints, exact resume, DistributedDataParallel.

Python API::

    trainer = Trainer(model, train_tokens, val_tokens, TrainConfig(steps=2000, out_dir="runs/x"))
    history = trainer.fit()

Command line: ``tl-spectral train --config FILE`` (see :func:`train_cli`); the JSON file holds
``{"model": {GPTConfig fields}, "data": {...}, "train": {TrainConfig fields}}``.

Determinism: batches are windows drawn from a seeded ``torch.Generator`` whose state is
saved in every checkpoint together with the weights and the AdamW moments, so a run
resumed from a checkpoint reproduces the loss curve of the uninterrupted run exactly
(same device and thread count; on CUDA up to the non-determinism of its kernels).

Distributed: under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the trainer joins
the process group (gloo on CPU, nccl on CUDA), wraps the model in DDP and gives each rank a
contiguous slice of the same global batch, so the update equals the single-process one.
Rank 0 alone writes logs and checkpoints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tl_spectral.models.gpt import (
    GPT,
    GPTConfig,
    load_state_file,
    model_state,
    read_checkpoint_config,
    save_model,
)

STATE_FORMAT = "tl_spectral.trainer/1"


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
    ``weight_decay`` on matrices/embeddings only; ``grad_clip`` (global norm, 0 = off).
    Every ``eval_every`` steps: validation loss/perplexity on ``eval_windows`` evenly spaced
    windows of the validation tokens (None = all). Every ``checkpoint_every`` steps: a
    checkpoint in ``out_dir/checkpoints`` (the last ``keep_checkpoints`` are kept).
    ``resume``: continue from the last complete checkpoint in ``out_dir`` if any.
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
    seed: int = 0
    device: str = "auto"
    num_threads: int | None = None
    progress: bool = True
    log_every: int = 10

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
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


@dataclass
class TrainHistory:
    """What a run produced: per-step train loss, evaluation records, throughput."""

    train_loss: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    tokens_seen: int = 0
    train_seconds: float = 0.0

    @property
    def final_val_loss(self) -> float | None:
        return self.evals[-1]["val_loss"] if self.evals else None


def _resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


def _as_token_tensor(tokens, what: str, min_len: int) -> torch.Tensor:
    t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    if t.numel() < min_len:
        raise ValueError(f"{what} holds {t.numel()} tokens; at least {min_len} are needed "
                         f"(one window of seq_len+1)")
    return t


class Trainer:
    """Train a :class:`GPT` on a 1-D token stream.

    model: a GPT (or any module with ``.cfg.n_ctx`` and ``forward(tokens)->logits``);
    train_tokens / val_tokens: 1-D int tensors (or sequences) of token ids.
    """

    def __init__(self, model: GPT, train_tokens, val_tokens, config: TrainConfig,
                 *, extra_metadata: dict[str, Any] | None = None):
        self.cfg = config
        self.seq_len = config.seq_len or model.cfg.n_ctx
        if self.seq_len > model.cfg.n_ctx:
            raise ValueError(f"seq_len={self.seq_len} exceeds the model's n_ctx={model.cfg.n_ctx}")
        self.train_tokens = _as_token_tensor(train_tokens, "train_tokens", self.seq_len + 1)
        self.val_tokens = _as_token_tensor(val_tokens, "val_tokens", self.seq_len + 1)
        vmax = int(max(self.train_tokens.max(), self.val_tokens.max()))
        if vmax >= model.cfg.vocab_size or int(min(self.train_tokens.min(),
                                                    self.val_tokens.min())) < 0:
            raise ValueError(f"token ids must lie in [0, vocab_size={model.cfg.vocab_size}), "
                             f"found max id {vmax}")
        self.extra_metadata = dict(extra_metadata or {})

        # distributed setup ------------------------------------------------------------
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = self.world_size > 1
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = _resolve_device(config.device, local_rank)
        if self.distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                backend = "nccl" if self.device.type == "cuda" else "gloo"
                dist.init_process_group(backend=backend)
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            if config.batch_size % self.world_size:
                raise ValueError(f"batch_size={config.batch_size} must be divisible by the "
                                 f"world size {self.world_size}")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)

        self.model = model.to(self.device)
        self.train_module: nn.Module = self.model
        if self.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_module = DDP(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = self._make_optimizer()
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.history = TrainHistory()
        self.out_dir = Path(config.out_dir) if config.out_dir else None
        if self.out_dir is not None and config.resume:
            self.resume()

    # --------------------------------------------------------------------- optimizer
    def _make_optimizer(self) -> torch.optim.Optimizer:
        decay, no_decay = [], []
        for _, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.dim() >= 2 else no_decay).append(p)
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        kw: dict[str, Any] = {}
        if self.device.type == "cuda":
            kw["fused"] = True
        return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=self.cfg.betas,
                                 eps=self.cfg.eps, **kw)

    # --------------------------------------------------------------------------- data
    def _batch(self) -> torch.Tensor:
        """This rank's slice of the next global batch: [batch/world, seq_len+1]."""
        n = self.train_tokens.numel() - (self.seq_len + 1) + 1
        starts = torch.randint(0, n, (self.cfg.batch_size,), generator=self.generator)
        per = self.cfg.batch_size // self.world_size
        starts = starts[self.rank * per:(self.rank + 1) * per]
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        return self.train_tokens[idx].to(self.device, non_blocking=True)

    def val_windows(self) -> torch.Tensor:
        """Validation windows [n, seq_len+1], stride seq_len (each target counted once);
        ``eval_windows`` of them evenly spaced, or all."""
        n = (self.val_tokens.numel() - 1) // self.seq_len
        starts = torch.arange(n) * self.seq_len
        if self.cfg.eval_windows is not None and self.cfg.eval_windows < n:
            pick = torch.linspace(0, n - 1, self.cfg.eval_windows).round().long()
            starts = starts[pick]
        return self.val_tokens[starts[:, None] + torch.arange(self.seq_len + 1)[None, :]]

    @torch.no_grad()
    def evaluate(self, windows: torch.Tensor | None = None) -> dict[str, float]:
        """Validation loss (nats/token, mean over every target) and perplexity."""
        import torch.nn.functional as F

        windows = self.val_windows() if windows is None else windows
        if self.distributed:
            windows = windows[self.rank::self.world_size]
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i in range(0, windows.shape[0], self.cfg.eval_batch_size):
            w = windows[i:i + self.cfg.eval_batch_size].to(self.device)
            logits = self.model(w[:, :-1])
            total[0] += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                        w[:, 1:].reshape(-1), reduction="sum").double()
            total[1] += w[:, 1:].numel()
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(total)
        self.model.train(was_training)
        loss = float(total[0] / total[1])
        return {"val_loss": loss, "val_ppl": math.exp(loss)}

    # ---------------------------------------------------------------------------- fit
    def fit(self, stop_at: int | None = None) -> TrainHistory:
        """Train until ``cfg.steps`` (or until ``stop_at`` steps, to pause a run: the
        schedule still follows ``cfg.steps``). Returns the :class:`TrainHistory`."""
        from tqdm.auto import tqdm

        end = self.cfg.steps if stop_at is None else min(stop_at, self.cfg.steps)
        model, cfg = self.train_module, self.cfg
        model.train()
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress or self.rank,
                   desc="train", dynamic_ncols=True)
        t0 = time.perf_counter()
        tokens_per_step = cfg.batch_size * self.seq_len
        while self.step < end:
            lr = cfg.lr_at(self.step)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            batch = self._batch()
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"training loss became {loss.item()} at step {self.step}; lower lr "
                    f"(now {lr:.3g}) or set grad_clip")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            loss_d = loss.detach()
            if self.distributed:
                import torch.distributed as dist

                dist.all_reduce(loss_d)
                loss_d /= self.world_size
            loss_f = float(loss_d)
            self.step += 1
            self.history.train_loss.append(loss_f)
            self.history.tokens_seen += tokens_per_step
            bar.update(1)
            if self.step % cfg.log_every == 0:
                bar.set_postfix(loss=f"{loss_f:.4f}", lr=f"{lr:.2e}")
                self._log({"step": self.step, "loss": loss_f, "lr": lr})
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                ev = {"step": self.step, **self.evaluate()}
                self.history.evals.append(ev)
                self._log(ev)
                if cfg.progress and not self.rank:
                    bar.write(f"step {self.step}: val_loss {ev['val_loss']:.4f} "
                              f"ppl {ev['val_ppl']:.3f}")
            if self.out_dir is not None and (self.step % cfg.checkpoint_every == 0
                                             or self.step == cfg.steps):
                self.history.train_seconds += time.perf_counter() - t0
                t0 = time.perf_counter()
                self.save_checkpoint()
        bar.close()
        self.history.train_seconds += time.perf_counter() - t0
        return self.history

    def _log(self, record: dict[str, Any]) -> None:
        if self.out_dir is None or self.rank:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # -------------------------------------------------------------------- checkpoints
    @property
    def checkpoint_root(self) -> Path:
        if self.out_dir is None:
            raise ValueError("this trainer has no out_dir; set TrainConfig.out_dir")
        return self.out_dir / "checkpoints"

    def save_checkpoint(self) -> Path | None:
        """Write ``out_dir/checkpoints/step_XXXXXXX`` (weights, config, optimizer moments,
        data-generator state, history). Atomic: written to a temporary folder, then renamed.
        Returns the folder (None on ranks other than 0)."""
        if self.rank == 0:
            from safetensors.torch import save_file

            root = self.checkpoint_root
            root.mkdir(parents=True, exist_ok=True)
            final = root / f"step_{self.step:07d}"
            tmp = root / f".tmp_step_{self.step:07d}"
            shutil.rmtree(tmp, ignore_errors=True)
            save_model(self.model, tmp, extra={"train": self.cfg.to_dict(), "step": self.step,
                                               **self.extra_metadata})
            tensors: dict[str, torch.Tensor] = {
                "rng.data": self.generator.get_state().clone()}
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            for i, p in enumerate(params):
                st = self.optimizer.state.get(p, {})
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        tensors[f"optim.{i}.{k}"] = v.detach().cpu().contiguous()
            save_file(tensors, str(tmp / "trainer_state.safetensors"),
                      metadata={"format": STATE_FORMAT})
            meta = {"format": STATE_FORMAT, "step": self.step, "seq_len": self.seq_len,
                    "world_size": self.world_size, "train": self.cfg.to_dict(),
                    "history": dataclasses.asdict(self.history)}
            (tmp / "trainer_state.json").write_text(json.dumps(meta) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            done = sorted(p for p in root.glob("step_*") if p.is_dir())
            for old in done[:-self.cfg.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        else:
            final = None
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()
        return final

    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint folder in ``out_dir``, or None."""
        if self.out_dir is None or not self.checkpoint_root.is_dir():
            return None
        done = sorted(p for p in self.checkpoint_root.glob("step_*")
                      if (p / "trainer_state.json").is_file())
        return done[-1] if done else None

    def resume(self, path: str | Path | None = None) -> bool:
        """Load weights, optimizer moments, generator state and history from ``path`` (or
        the last checkpoint). Returns False when there is nothing to resume from."""
        path = Path(path) if path is not None else self.last_checkpoint()
        if path is None:
            return False
        doc = read_checkpoint_config(path)
        saved_cfg = GPTConfig.from_dict(doc["model"])
        if saved_cfg.to_dict() != self.model.cfg.to_dict():
            raise ValueError(f"checkpoint {path} holds a different model configuration than "
                             "the model passed to the Trainer; use a fresh out_dir or the "
                             "same GPTConfig")
        try:
            meta = json.loads((path / "trainer_state.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}/trainer_state.json is unreadable ({e})") from None
        if meta.get("format") != STATE_FORMAT:
            raise ValueError(f"{path}/trainer_state.json is not a tl_spectral trainer state")
        if meta["seq_len"] != self.seq_len:
            raise ValueError(f"checkpoint seq_len {meta['seq_len']} != {self.seq_len}")
        weights = load_state_file(path / "model.safetensors")
        expected = model_state(self.model)
        if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape
                                                for k in expected):
            raise ValueError(f"{path}/model.safetensors does not match the model: a foreign "
                             "or corrupted checkpoint")
        self.model.load_state_dict(weights, strict=not self.model.cfg.tied_embeddings)
        state = load_state_file(path / "trainer_state.safetensors")
        if "rng.data" not in state:
            raise ValueError(f"{path}/trainer_state.safetensors lacks the generator state")
        self.generator.set_state(state["rng.data"])
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            st = {k.split(".", 2)[2]: v for k, v in state.items()
                  if k.startswith(f"optim.{i}.")}
            if st:
                for k, v in st.items():
                    if k != "step" and v.shape != p.shape:
                        raise ValueError(f"optimizer state {i}.{k} has shape {tuple(v.shape)}, "
                                         f"parameter has {tuple(p.shape)}")
                self.optimizer.state[p] = {
                    k: (v if k == "step" else v.to(p.device)) for k, v in st.items()}
        self.step = int(meta["step"])
        h = meta.get("history", {})
        self.history = TrainHistory(**h)
        return True


# ------------------------------------------------------------------------------- CLI
def _load_data(data: dict[str, Any]):
    """(tokenizer, train_ids, val_ids) from the ``data`` section of a run config."""
    from tl_spectral.data import CharTokenizer, load_text, tiny_shakespeare, train_val_split

    corpus = data.get("corpus", "tiny_shakespeare")
    text = tiny_shakespeare() if corpus == "tiny_shakespeare" else load_text(corpus)
    if data.get("tokenizer", "char") != "char":
        raise ValueError(f"only the 'char' tokenizer is supported by train_cli, "
                         f"got {data.get('tokenizer')!r}")
    train_text, val_text = train_val_split(text, float(data.get("val_fraction", 0.1)))
    tok = CharTokenizer.from_text(text)
    return tok, torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text))


def run_from_config(doc: dict[str, Any], *, overrides: dict[str, Any] | None = None
                    ) -> tuple[Trainer, TrainHistory]:
    """Build model, data and trainer from a run config (dict) and train. At the end rank 0
    writes ``out_dir/final`` (model.safetensors + config.json with tokenizer and metrics)."""
    for key in ("model", "train"):
        if key not in doc:
            raise ValueError(f"the run config needs a {key!r} section")
    train_cfg = TrainConfig.from_dict({**doc["train"], **(overrides or {})})
    torch.manual_seed(train_cfg.seed)
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    tok, train_ids, val_ids = _load_data(doc.get("data", {}))
    mdoc = dict(doc["model"])
    if mdoc.get("vocab_size") in (None, "auto"):
        mdoc["vocab_size"] = tok.vocab_size
    model = GPT(GPTConfig.from_dict(mdoc))
    tok_doc = json.loads(tok.to_json())
    trainer = Trainer(model, train_ids, val_ids, train_cfg,
                      extra_metadata={"tokenizer": tok_doc, "data": doc.get("data", {})})
    history = trainer.fit()
    if trainer.out_dir is not None:
        full = trainer.evaluate(_all_windows(trainer))  # every rank joins the all_reduce
    if trainer.out_dir is not None and trainer.rank == 0:
        save_model(trainer.model, trainer.out_dir / "final", extra={
            "tokenizer": tok_doc, "data": doc.get("data", {}), "train": train_cfg.to_dict(),
            "metrics": {**full, "steps": trainer.step, "tokens_seen": history.tokens_seen,
                        "eval": "all validation windows of seq_len+1, stride seq_len"}})
    return trainer, history


def _all_windows(trainer: Trainer) -> torch.Tensor:
    n = (trainer.val_tokens.numel() - 1) // trainer.seq_len
    starts = torch.arange(n) * trainer.seq_len
    return trainer.val_tokens[starts[:, None] + torch.arange(trainer.seq_len + 1)[None, :]]


def train_cli(argv: list[str]) -> int:
    """``tl-spectral train --config FILE [--out-dir DIR] [--steps N] [--device D]
    [--no-progress]``. Returns the exit status (0 on success)."""
    ap = argparse.ArgumentParser(prog="tl-spectral train",
                                 description="Train a tl_spectral GPT from a JSON run config.")
    ap.add_argument("--config", required=True, help="JSON file with model/data/train sections")
    ap.add_argument("--out-dir", help="override train.out_dir")
    ap.add_argument("--steps", type=int, help="override train.steps")
    ap.add_argument("--device", help="override train.device (auto|cpu|cuda)")
    ap.add_argument("--threads", type=int, help="override train.num_threads")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    args = ap.parse_args(argv)
    path = Path(args.config)
    if not path.is_file():
        ap.error(f"no config file at {path}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        ap.error(f"{path} is not valid JSON: {e}")
    ov: dict[str, Any] = {}
    if args.out_dir:
        ov["out_dir"] = args.out_dir
    if args.steps:
        ov["steps"] = args.steps
    if args.device:
        ov["device"] = args.device
    if args.threads:
        ov["num_threads"] = args.threads
    if args.no_progress:
        ov["progress"] = False
    trainer, history = run_from_config(doc, overrides=ov)
    if trainer.rank == 0:
        print(json.dumps({"step": trainer.step, "val_loss": history.final_val_loss,
                          "out_dir": str(trainer.out_dir) if trainer.out_dir else None}))
    if trainer.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    raise SystemExit(train_cli(sys.argv[1:]))
