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
import re
import shutil
import time
import warnings
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
    replace_dir,
    save_model,
    sha256_bytes,
    sha256_file,
    write_file_durably,
    write_model_files,
)
from tl_spectral.models.train_config import (  # noqa: F401 - re-exported
    IDENTITY_FIELDS,
    TrainConfig,
    resolve_device,
    warmup_cosine_lr,
)

STATE_FORMAT = "tl_spectral.trainer/1"
#: The files of a checkpoint folder ``checkpoints/step_XXXXXXX``.
CHECKPOINT_FILES = ("model.safetensors", "config.json", "trainer_state.json",
                    "trainer_state.safetensors")
RUN_FILE = "run.json"


class RunConflictError(ValueError):
    """``out_dir`` holds the outputs of another run (a different configuration, seed or
    data); the new run refuses to overwrite or prune them unless ``overwrite`` is set."""


class CorruptCheckpointError(ValueError):
    """A checkpoint failed verification (checksum, NaN/inf values, unreadable files)."""


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


def _as_token_tensor(tokens, what: str, min_len: int) -> torch.Tensor:
    t = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    if t.numel() < min_len:
        raise ValueError(f"{what} holds {t.numel()} tokens; at least {min_len} are needed "
                         f"(one window of seq_len+1)")
    return t


def _canonical(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _step_of(path: Path) -> int | None:
    """The step number of a ``step_XXXXXXX`` folder name, or None."""
    name = path.name
    if not name.startswith("step_") or not name[5:].isdigit():
        return None
    return int(name[5:])


def _read_meta(path: Path) -> dict[str, Any]:
    """The verified ``trainer_state.json`` of checkpoint ``path``
    (:class:`CorruptCheckpointError` when unreadable or altered)."""
    f = path / "trainer_state.json"
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"{f} is unreadable ({e}); the checkpoint is corrupted"
                                     ) from None
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
        raise CorruptCheckpointError(f"{f} is not a tl_spectral trainer state (corrupted?)")
    want = meta.get("meta_sha256")
    if want is not None:
        body = {k: v for k, v in meta.items() if k != "meta_sha256"}
        if sha256_bytes(_canonical(body).encode()) != want:
            raise CorruptCheckpointError(f"{f} fails its checksum; the checkpoint is corrupted")
    return meta


class Trainer:
    """Train a :class:`GPT` on a 1-D token stream.

    model: a GPT (or any module with ``.cfg.n_ctx`` and ``forward(tokens)->logits``);
    train_tokens / val_tokens: 1-D int tensors (or sequences) of token ids.

    Run identity (:attr:`run_id`): a hash of the model configuration, the TrainConfig
    fields of :data:`IDENTITY_FIELDS` (seed included), ``seq_len`` and the training tokens.
    It is written to ``out_dir/run.json`` and into every checkpoint; a trainer whose
    ``out_dir`` holds another run's outputs raises :class:`RunConflictError` unless
    ``overwrite`` is set, and it never overwrites or prunes another run's checkpoints.

    bos_id: a start token put in front of every window (training and validation): a
    window is then ``[bos_id] + seq_len`` consecutive stream tokens, so the model reads
    ``[bos_id] + seq_len-1`` tokens and predicts all ``seq_len`` stream tokens (the first
    from the start token alone). None (default): windows are ``seq_len+1`` stream tokens.
    A run with a start token has another run id (``bos_id`` joins the identity).
    """

    def __init__(self, model: GPT, train_tokens, val_tokens, config: TrainConfig,
                 *, extra_metadata: dict[str, Any] | None = None,
                 bos_id: int | None = None):
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
        if bos_id is not None and not (isinstance(bos_id, int) and
                                       0 <= bos_id < model.cfg.vocab_size):
            raise ValueError(f"bos_id must be an int in [0, vocab_size={model.cfg.vocab_size}),"
                             f" got {bos_id!r}")
        self.bos_id = bos_id
        self.extra_metadata = dict(extra_metadata or {})

        # distributed setup ------------------------------------------------------------
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = self.world_size > 1
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = resolve_device(config.device, local_rank)
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
        self.run_identity = {
            "model": self.model.cfg.to_dict(), "train": config.identity(),
            "seq_len": self.seq_len,
            "train_tokens_sha256": sha256_bytes(self.train_tokens.numpy().tobytes())}
        if bos_id is not None:  # absent otherwise: older runs keep their run id
            self.run_identity["bos_id"] = bos_id
        self.run_id = sha256_bytes(_canonical(self.run_identity).encode())[:16]
        self.rejected_checkpoints: list[tuple[Path, str]] = []
        if self.out_dir is not None:
            self._prepare_out_dir()
            if config.resume and not config.overwrite:
                self.resume()

    # ---------------------------------------------------------------- run identity
    def _foreign_reason(self, run_id: str | None, model: dict | None,
                        train: dict | None) -> str | None:
        """Why a recorded run differs from this one (None: the same run). Outputs of older
        versions carry no run id; they are compared on model and identity fields."""
        if run_id is not None:
            if run_id == self.run_id:
                return None
        if model is not None and model != self.model.cfg.to_dict():
            return "a different model configuration"
        if train is not None:
            mine = self.cfg.identity()
            # no_decay is recorded only when set: absent means []
            train = {"no_decay": [], **train}
            mine = {"no_decay": [], **mine}
            diff = sorted(k for k in mine if k in train and
                          _canonical(train[k]) != _canonical(mine[k]))
            if diff:
                return "different training settings (" + ", ".join(
                    f"{k}: {train[k]!r} there, {mine[k]!r} here" for k in diff[:4]) + ")"
        if run_id is not None:
            return "different data or sequence length"
        return None

    def _find_foreign_run(self) -> str | None:
        """A description of another run's outputs in ``out_dir``, or None."""
        assert self.out_dir is not None
        if self.out_dir.exists() and not self.out_dir.is_dir():
            return f"{self.out_dir} is a file, not a folder"
        run_file = self.out_dir / RUN_FILE
        ours = False  # run.json names this run: the log beside it is this run's
        if run_file.is_file():
            try:
                doc = json.loads(run_file.read_text())
                why = self._foreign_reason(doc.get("run_id"), doc.get("identity", {}).get(
                    "model"), doc.get("identity", {}).get("train"))
            except (OSError, ValueError, AttributeError):
                why = "an unreadable run.json"
            if why:
                return f"{run_file} records another run ({why})"
            ours = True
        elif run_file.exists():
            return f"{run_file} is not a file"
        root = self.out_dir / "checkpoints"
        for ck in sorted(root.glob("step_*")) if root.is_dir() else []:
            if _step_of(ck) is None:
                continue
            odd = sorted(p.name for p in ck.iterdir()) if ck.is_dir() and not \
                ck.is_symlink() else None
            if odd is None or set(odd) - set(CHECKPOINT_FILES):
                # a later save of that step would replace it: not ours to replace
                return (f"{ck} is not a checkpoint a run wrote (it holds "
                        f"{', '.join((odd or [])[:3]) or 'no folder'})")
            if not (ck / "trainer_state.json").is_file():
                continue
            try:
                meta = _read_meta(ck)
                model = json.loads((ck / "config.json").read_text()).get("model")
            except (OSError, ValueError, AttributeError):
                continue  # a damaged checkpoint: resume reports it
            if meta.get("meta_sha256") is not None and meta.get("run_id") == self.run_id:
                continue  # verified as this run's; a damaged config.json is resume's to report
            why = self._foreign_reason(meta.get("run_id"), model, meta.get("train"))
            if why:
                return f"checkpoint {ck} belongs to another run ({why})"
        why = self._foreign_final(self.out_dir / "final")
        if why:
            return why
        log = self.out_dir / "log.jsonl"
        ours = ours or (self.out_dir / "final" / "config.json").is_file()  # checked above
        if (log.exists() or log.is_symlink()) and not ours and not self._run_checkpoints():
            return (f"{log} is not this run's log (no {RUN_FILE}, checkpoint or final/ of "
                    "this run beside it)")
        return None

    def _foreign_final(self, final: Path) -> str | None:
        """Why ``final`` (out_dir/final, replaced whole at the end of a run) is not this
        run's to replace, or None (absent, empty, or this run's own)."""
        if not (final.exists() or final.is_symlink()):
            return None
        if final.is_symlink() or not final.is_dir():
            return f"{final} is not a folder a run wrote"
        names = sorted(p.name for p in final.iterdir())
        if not names:
            return None
        extra = [n for n in names if n not in ("model.safetensors", "config.json")]
        if extra:
            return f"{final} holds files a run does not write ({', '.join(extra[:3])})"
        cfg = final / "config.json"
        try:
            doc = json.loads(cfg.read_text())
            why = self._foreign_reason(doc.get("run_id"), doc.get("model"), doc.get("train"))
        except (OSError, ValueError, AttributeError):
            why = f"its {cfg.name} is missing or unreadable"
        return f"{final} belongs to another run ({why})" if why else None

    def _prepare_out_dir(self) -> None:
        """Refuse another run's out_dir (or clear it with ``overwrite``), remove leftover
        temporary folders of interrupted saves."""
        assert self.out_dir is not None
        if self.cfg.overwrite:
            if self.rank == 0:
                for name in ("checkpoints", "final"):
                    shutil.rmtree(self.out_dir / name, ignore_errors=True)
                for name in ("log.jsonl", RUN_FILE):
                    (self.out_dir / name).unlink(missing_ok=True)
        else:
            foreign = self._find_foreign_run()
            if foreign:
                raise RunConflictError(
                    f"out_dir {self.out_dir} holds another run's outputs: {foreign}; use a "
                    "fresh out_dir, or pass --overwrite (TrainConfig.overwrite=True) to "
                    "delete them")
        if self.rank == 0 and self.out_dir.is_dir():
            # only the names the trainer's own saves use (a pid or a step number in them)
            leftovers = [p for p in self.out_dir.iterdir() if re.fullmatch(
                r"\.tmp_final_\d+|\.old_final_\d+|"
                + re.escape(f".tmp_{RUN_FILE}") + r"|\.tmp_log\.jsonl", p.name)]
            if (self.out_dir / "checkpoints").is_dir():
                leftovers += [p for p in (self.out_dir / "checkpoints").iterdir()
                              if re.fullmatch(r"\.tmp_step_\d+|\.old_step_\d+_\d+", p.name)]
            for p in leftovers:
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        self._barrier()

    def _write_run_file(self) -> None:
        if self.out_dir is None or self.rank:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        doc = {"run_id": self.run_id, "identity": self.run_identity}
        path = self.out_dir / RUN_FILE
        try:
            if json.loads(path.read_text()) == doc:
                return
        except (OSError, ValueError):
            pass
        tmp = self.out_dir / f".tmp_{RUN_FILE}"
        write_file_durably(tmp, (json.dumps(doc, indent=1) + "\n").encode())
        os.replace(tmp, path)

    def _barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    # --------------------------------------------------------------------- optimizer
    def decay_split(self) -> tuple[list[str], list[str]]:
        """(names of the parameters with weight decay, names without): decay goes to
        parameters of >= 2 dimensions not matched by any ``no_decay`` pattern."""
        from fnmatch import fnmatchcase

        pats = self.cfg.no_decay
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        unused = [pat for pat in pats if not any(fnmatchcase(n, pat) for n, _ in named)]
        if unused:
            raise ValueError(f"no_decay patterns {unused} match no parameter of the model; "
                             f"names look like {[n for n, _ in named[:4]]} (shell patterns "
                             "such as '*.A', 'blocks.0.*')")
        decay, no = [], []
        for n, p in named:
            excluded = p.dim() < 2 or any(fnmatchcase(n, pat) for pat in pats)
            (no if excluded else decay).append(n)
        return decay, no

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = dict(self.model.named_parameters())
        names_decay, names_no = self.decay_split()
        decay = [params[n] for n in names_decay]
        no_decay = [params[n] for n in names_no]
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        kw: dict[str, Any] = {}
        if self.device.type == "cuda":
            kw["fused"] = True
        return torch.optim.AdamW(groups, lr=self.cfg.lr, betas=self.cfg.betas,
                                 eps=self.cfg.eps, **kw)

    # --------------------------------------------------------------------------- data
    @property
    def _stream_len(self) -> int:
        """Stream tokens per window: seq_len+1, or seq_len after a start token."""
        return self.seq_len + (1 if self.bos_id is None else 0)

    def _frame(self, tokens: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """Windows [len(starts), seq_len+1] of ``tokens`` at ``starts`` (with the start
        token in front when ``bos_id`` is set)."""
        w = tokens[starts[:, None] + torch.arange(self._stream_len)[None, :]]
        if self.bos_id is not None:
            w = torch.cat([torch.full((w.shape[0], 1), self.bos_id, dtype=w.dtype), w], 1)
        return w

    def _batch(self) -> torch.Tensor:
        """This rank's slice of the next global batch: [batch/world, seq_len+1]."""
        n = self.train_tokens.numel() - self._stream_len + 1
        starts = torch.randint(0, n, (self.cfg.batch_size,), generator=self.generator)
        per = self.cfg.batch_size // self.world_size
        starts = starts[self.rank * per:(self.rank + 1) * per]
        return self._frame(self.train_tokens, starts).to(self.device, non_blocking=True)

    def val_windows(self, limit: int | None = -1) -> torch.Tensor:
        """Validation windows [n, seq_len+1], stride seq_len (each target counted once;
        with a start token each window is ``[bos_id]`` + seq_len stream tokens);
        ``limit`` of them evenly spaced (default: ``eval_windows``; None = all)."""
        limit = self.cfg.eval_windows if limit == -1 else limit
        n = (self.val_tokens.numel() - self._stream_len + self.seq_len) // self.seq_len
        starts = torch.arange(n) * self.seq_len
        if limit is not None and limit < n:
            pick = torch.linspace(0, n - 1, limit).round().long()
            starts = starts[pick]
        return self._frame(self.val_tokens, starts)

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
        from tl_spectral.progress import progress_bar as tqdm

        end = self.cfg.steps if stop_at is None else min(stop_at, self.cfg.steps)
        model, cfg = self.train_module, self.cfg
        if self.out_dir is not None and self.rank == 0:
            self._write_run_file()
            self._truncate_log(self.step)
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

    def _truncate_log(self, step: int) -> None:
        """Drop the records of ``log.jsonl`` after ``step`` (written by the interrupted
        part of a run that resumes at ``step``), and any torn last line."""
        if self.out_dir is None or self.rank:
            return
        path = self.out_dir / "log.jsonl"
        if not path.is_file():
            return
        keep, changed = [], False
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict) and int(rec.get("step", 0)) <= step
            except (ValueError, TypeError):
                ok = False
            if ok:
                keep.append(line)
            else:
                changed = True
        if changed:
            tmp = self.out_dir / ".tmp_log.jsonl"
            write_file_durably(tmp, "".join(x + "\n" for x in keep).encode())
            os.replace(tmp, path)

    # -------------------------------------------------------------------- checkpoints
    @property
    def checkpoint_root(self) -> Path:
        if self.out_dir is None:
            raise ValueError("this trainer has no out_dir; set TrainConfig.out_dir")
        return self.out_dir / "checkpoints"

    def save_checkpoint(self) -> Path | None:
        """Write ``out_dir/checkpoints/step_XXXXXXX`` (weights, config, optimizer moments,
        data-generator state, history; ``trainer_state.json`` records the run id and the
        sha256 of every other file). Atomic: written and fsynced in a temporary folder, then
        renamed. Then prunes this run's checkpoints by step number to the last
        ``keep_checkpoints`` (never another run's). Returns the folder (None on ranks
        other than 0)."""
        if self.rank == 0:
            from safetensors.torch import save

            self._write_run_file()
            root = self.checkpoint_root
            root.mkdir(parents=True, exist_ok=True)
            final = root / f"step_{self.step:07d}"
            tmp = root / f".tmp_step_{self.step:07d}"
            shutil.rmtree(tmp, ignore_errors=True)
            files: dict[str, str] = {}
            files["model.safetensors"] = write_model_files(
                self.model, tmp, extra={"train": self.cfg.to_dict(), "step": self.step,
                                        "run_id": self.run_id, **self.extra_metadata})
            files["config.json"] = sha256_file(tmp / "config.json")
            tensors: dict[str, torch.Tensor] = {
                "rng.data": self.generator.get_state().clone()}
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            for i, p in enumerate(params):
                st = self.optimizer.state.get(p, {})
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        tensors[f"optim.{i}.{k}"] = v.detach().cpu().contiguous()
            blob = save(tensors, metadata={"format": STATE_FORMAT})
            files["trainer_state.safetensors"] = sha256_bytes(blob)
            write_file_durably(tmp / "trainer_state.safetensors", blob)
            meta = {"format": STATE_FORMAT, "step": self.step, "seq_len": self.seq_len,
                    "world_size": self.world_size, "train": self.cfg.to_dict(),
                    "run_id": self.run_id, "files": files,
                    "history": dataclasses.asdict(self.history)}
            meta["meta_sha256"] = sha256_bytes(_canonical(meta).encode())
            write_file_durably(tmp / "trainer_state.json", (json.dumps(meta) + "\n").encode())
            replace_dir(tmp, final)
            self._prune()
        else:
            final = None
        self._barrier()
        return final

    def _run_checkpoints(self, *, unreadable: bool = False) -> list[Path]:
        """This run's checkpoint folders, sorted by step number (oldest first). A folder
        whose trainer_state.json cannot be read counts as this run's when its config.json
        names this run, or (``unreadable=True``, for resume to report it) when neither
        file names any run."""
        if self.out_dir is None or not self.checkpoint_root.is_dir():
            return []
        mine = []
        for p in self.checkpoint_root.glob("step_*"):
            step = _step_of(p)
            if step is None or not p.is_dir():
                continue
            try:
                run_id = _read_meta(p).get("run_id")
            except (CorruptCheckpointError, OSError):
                try:
                    run_id = json.loads((p / "config.json").read_text()).get("run_id")
                except (OSError, ValueError, AttributeError):
                    run_id = None
            if run_id == self.run_id or (unreadable and run_id is None):
                mine.append((step, p))
        return [p for _, p in sorted(mine)]

    def _prune(self) -> None:
        """Delete this run's oldest checkpoints, keeping the last ``keep_checkpoints`` by
        step number."""
        for old in self._run_checkpoints()[:-self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def verify_checkpoint(self, path: str | Path) -> tuple[dict[str, Any],
                                                         dict[str, torch.Tensor],
                                                         dict[str, torch.Tensor]]:
        """Read and check checkpoint ``path`` without applying it: the sha256 of every file
        recorded in ``trainer_state.json``, readable safetensors, names and shapes that fit
        this model, finite weights and optimizer moments. Returns (meta, weights, state);
        raises :class:`CorruptCheckpointError` (or ``ValueError`` for a checkpoint of
        another model) naming the problem."""
        path = Path(path)
        meta = _read_meta(path)
        for name, want in (meta.get("files") or {}).items():
            f = path / name
            if not f.is_file():
                raise CorruptCheckpointError(f"{f} is missing; the checkpoint is corrupted")
            got = sha256_file(f)
            if got != want:
                raise CorruptCheckpointError(
                    f"{f} fails its checksum (sha256 {got[:12]}..., recorded {want[:12]}...); "
                    "the checkpoint is corrupted")
        try:
            doc = read_checkpoint_config(path)
            saved_cfg = GPTConfig.from_dict(doc["model"])
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise CorruptCheckpointError(f"{path}/config.json: {e} (corrupted)") from None
        if saved_cfg.to_dict() != self.model.cfg.to_dict():
            raise ValueError(f"checkpoint {path} holds a different model configuration than "
                             "the model passed to the Trainer; use a fresh out_dir or the "
                             "same GPTConfig")
        if meta.get("seq_len") != self.seq_len:
            raise ValueError(f"checkpoint seq_len {meta.get('seq_len')} != {self.seq_len}")
        try:
            weights = load_state_file(path / "model.safetensors")
            state = load_state_file(path / "trainer_state.safetensors")
        except (ValueError, FileNotFoundError) as e:
            raise CorruptCheckpointError(str(e)) from None
        expected = model_state(self.model)
        if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape
                                                for k in expected):
            raise CorruptCheckpointError(f"{path}/model.safetensors does not match the model: "
                                         "a foreign or corrupted checkpoint")
        if "rng.data" not in state:
            raise CorruptCheckpointError(f"{path}/trainer_state.safetensors lacks the "
                                         "generator state (corrupted)")
        for what, tensors in (("weight", weights), ("optimizer state", state)):
            for k, v in tensors.items():
                if v.is_floating_point() and not torch.isfinite(v).all():
                    raise CorruptCheckpointError(
                        f"checkpoint {path}: {what} {k} holds NaN/inf values (corrupted or "
                        "diverged)")
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            for k, v in state.items():
                if k.startswith(f"optim.{i}.") and not k.endswith(".step") and \
                        v.shape != p.shape:
                    raise CorruptCheckpointError(
                        f"optimizer state {k[6:]} has shape {tuple(v.shape)}, parameter has "
                        f"{tuple(p.shape)}: a foreign or corrupted checkpoint")
        return meta, weights, state

    def resume(self, path: str | Path | None = None) -> bool:
        """Load weights, optimizer moments, generator state and history from ``path`` (or
        the newest intact checkpoint of this run). Returns False when there is nothing to
        resume from.

        Every checkpoint is verified first (:meth:`verify_checkpoint`). Without ``path``,
        a bad newest checkpoint is reported (a warning, stderr and ``log.jsonl``) and the
        previous one is tried, and so on; when none is intact a ``ValueError`` names them
        all. With ``path``, a bad checkpoint raises at once."""
        if path is not None:
            candidates = [Path(path)]
        else:
            candidates = self._run_checkpoints(unreadable=True)[::-1]
            if not candidates:
                return False
        self.rejected_checkpoints = []
        for cand in candidates:
            try:
                meta, weights, state = self.verify_checkpoint(cand)
            except CorruptCheckpointError as e:
                if path is not None:
                    raise
                self.rejected_checkpoints.append((cand, str(e)))
                msg = f"tl_spectral: skipping bad checkpoint {cand}: {e}"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                continue
            self._apply_checkpoint(meta, weights, state)
            if self.rejected_checkpoints:
                self._truncate_log(self.step)
                for bad, why in self.rejected_checkpoints:
                    self._log({"step": self.step, "event": "bad_checkpoint_skipped",
                               "path": str(bad), "error": why, "resumed_from": str(cand)})
            return True
        raise CorruptCheckpointError(
            f"no intact checkpoint to resume from in {self.checkpoint_root}: "
            + "; ".join(f"{p.name}: {why}" for p, why in self.rejected_checkpoints)
            + ". Delete them, or pass --overwrite (TrainConfig.overwrite=True) to start afresh")

    def _apply_checkpoint(self, meta: dict[str, Any], weights: dict[str, torch.Tensor],
                          state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights, strict=not self.model.cfg.tied_embeddings)
        self.generator.set_state(state["rng.data"])
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            st = {k.split(".", 2)[2]: v for k, v in state.items()
                  if k.startswith(f"optim.{i}.")}
            if st:
                self.optimizer.state[p] = {
                    k: (v if k == "step" else v.to(p.device)) for k, v in st.items()}
        self.step = int(meta["step"])
        h = meta.get("history", {})
        self.history = TrainHistory(**h)


# ------------------------------------------------------------------------------- CLI
def _load_data(data: dict[str, Any]):
    """(tokenizer, train_ids, val_ids) from the ``data`` section of a run config."""
    from tl_spectral.data import CharTokenizer, load_text, tiny_shakespeare, train_val_split

    corpus = data.get("corpus", "tiny_shakespeare")
    text = tiny_shakespeare() if corpus == "tiny_shakespeare" else load_text(corpus)
    if data.get("tokenizer", "char") != "char":
        raise ValueError(f"only the 'char' tokenizer is supported by train_cli, "
                         f"got {data.get('tokenizer')!r}")
    bos = data.get("bos", False)
    if not isinstance(bos, bool):
        raise ValueError(f"data.bos must be true or false, got {bos!r}")
    train_text, val_text = train_val_split(text, float(data.get("val_fraction", 0.1)))
    tok = CharTokenizer.from_text(text, bos=bos)
    return tok, torch.tensor(tok.encode(train_text)), torch.tensor(tok.encode(val_text))


def run_from_config(doc: dict[str, Any], *, overrides: dict[str, Any] | None = None,
                    data: tuple[Any, Any, Any] | None = None,
                    extra_metrics: dict[str, Any] | None = None
                    ) -> tuple[Trainer, TrainHistory]:
    """Build model, data and trainer from a run config (dict) and train. At the end rank 0
    writes ``out_dir/final`` atomically (model.safetensors + config.json with tokenizer,
    metrics, run id, step and the weights' sha256).

    ``data``: ``(tokenizer, train_ids, val_ids)`` prepared by the caller (e.g. a study's own
    corpus) instead of the config's ``data`` section; ``extra_metrics`` are added to the
    final metrics (e.g. the validation ``<unk>`` share)."""
    for key in ("model", "train"):
        if key not in doc:
            raise ValueError(f"the run config needs a {key!r} section")
    train_cfg = TrainConfig.from_dict({**doc["train"], **(overrides or {})})
    train_cfg.check_device()  # before the data and the model are built
    torch.manual_seed(train_cfg.seed)
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    tok, train_ids, val_ids = data if data is not None else _load_data(doc.get("data", {}))
    mdoc = dict(doc["model"])
    if mdoc.get("vocab_size") in (None, "auto"):
        mdoc["vocab_size"] = tok.vocab_size
    gcfg = GPTConfig.from_dict(mdoc)
    if train_cfg.seq_len is not None and train_cfg.seq_len > gcfg.n_ctx:
        raise ValueError(f"train.seq_len={train_cfg.seq_len} exceeds the model's "
                         f"n_ctx={gcfg.n_ctx}; pass seq_len {gcfg.n_ctx} or less (or null)")
    model = GPT(gcfg)
    tok_doc = json.loads(tok.to_json())
    trainer = Trainer(model, train_ids, val_ids, train_cfg,
                      extra_metadata={"tokenizer": tok_doc, "data": doc.get("data", {})},
                      bos_id=getattr(tok, "bos_id", None))
    history = trainer.fit()
    if trainer.out_dir is not None:
        full = trainer.evaluate(_all_windows(trainer))  # every rank joins the all_reduce
    if trainer.out_dir is not None and trainer.rank == 0:
        save_model(trainer.model, trainer.out_dir / "final", extra={
            "tokenizer": tok_doc, "data": doc.get("data", {}), "train": train_cfg.to_dict(),
            "run_id": trainer.run_id, "step": trainer.step,
            "metrics": {**full, "steps": trainer.step, "tokens_seen": history.tokens_seen,
                        **(extra_metrics or {}),
                        "eval": "all validation windows of seq_len+1, stride seq_len"}})
    return trainer, history


def _all_windows(trainer: Trainer) -> torch.Tensor:
    return trainer.val_windows(limit=None)


def train_cli(argv: list[str]) -> int:
    """``tl-spectral train --config FILE [--out-dir DIR] [--steps N] [--seed S] [--device D]
    [--no-progress] [--overwrite]``. Returns the exit status (0 on success); an out_dir
    holding another run exits with status 2 and a one-line error."""
    ap = argparse.ArgumentParser(prog="tl-spectral train",
                                 description="Train a tl_spectral GPT from a JSON run config.")
    ap.add_argument("--config", required=True, help="JSON file with model/data/train sections")
    ap.add_argument("--out-dir", help="override train.out_dir")
    ap.add_argument("--steps", type=int, help="override train.steps")
    ap.add_argument("--seed", type=int,
                    help="override train.seed (initialisation and data order; another run: "
                         "use another --out-dir)")
    ap.add_argument("--device", help="override train.device (auto|cpu|cuda)")
    ap.add_argument("--threads", type=int, help="override train.num_threads")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument("--overwrite", action="store_true",
                    help="delete another run's checkpoints, final/ and log in out_dir first")
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
    if args.seed is not None:
        ov["seed"] = args.seed
    if args.device:
        ov["device"] = args.device
    if args.threads:
        ov["num_threads"] = args.threads
    if args.no_progress:
        ov["progress"] = False
    if args.overwrite:
        ov["overwrite"] = True
    try:
        trainer, history = run_from_config(doc, overrides=ov)
    except RunConflictError as e:
        ap.exit(2, f"tl-spectral train: error: {e}\n")
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
