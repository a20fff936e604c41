"""The GPT family the project trains: a small decoder-only transformer.

Token + learned position embeddings (or rotary positions, ``positional="rotary"``), ``n_layers`` pre-norm blocks
(``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``, LayerNorm or no normalization at all),
a GELU MLP (exact erf GELU), a final norm and an unembedding (tied to the token
embedding or not, no bias). The attention kind is a parameter (``"softmax"``, ``"sd"``,
``"linear"``; per model or per layer) and the head dimension may differ per layer.

Checkpoints are a directory with ``model.safetensors`` (weights) and ``config.json``
(``GPTConfig.to_dict()`` plus optional tokenizer/metadata); :func:`load_checkpoint` validates
names and shapes and raises ``ValueError`` for corrupted or foreign files. Nothing is
ever unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tl_spectral.checks import check_int, is_int, is_real
from tl_spectral.models.attention import ATTENTION_KINDS, Rotary, make_attention

CONFIG_FORMAT = "tl_spectral.gpt/1"
_NORMALIZATIONS = ("ln", "none")
_POSITIONALS = ("learned", "rotary")
_ROTARY_FIELDS = ("positional", "rotary_dim", "rotary_base")


@dataclass
class GPTConfig:
    """Configuration of a :class:`GPT`.

    n_heads: one int for all layers or a list with one int per layer (a head allocation;
    such a model trains and evaluates natively, but TransformerLens needs one head count for
    every layer, so it does not convert). d_head: one int for all layers, a list with one int
    per layer, or None for ``d_model // n_heads`` (a single n_heads only). attention: one kind for all layers or a list per layer.
    attention_options: keyword options of the attention kind (one dict for all layers, or a
    list of dicts per layer). d_mlp: None means ``4 * d_model``.

    positional: ``"learned"`` (an ``n_ctx × d_model`` position embedding added to the token
    embedding, the default) or ``"rotary"`` (no position embedding; RoPE on the queries and
    keys of every layer, :class:`~tl_spectral.models.attention.Rotary`: adjacent pairs
    ``(2k, 2k+1)`` on the first ``rotary_dim`` head coordinates, frequencies
    ``rotary_base^(−2k/rotary_dim)``). rotary_dim: None means the smallest d_head; it must be
    even and at most every layer's d_head. Only softmax and S–D layers take rotary positions.
    """

    vocab_size: int
    n_layers: int = 6
    n_heads: int | list[int] = 8
    d_model: int = 128
    d_head: int | list[int] | None = None
    n_ctx: int = 256
    d_mlp: int | None = None
    normalization: str = "ln"
    tied_embeddings: bool = False
    attention: str | list[str] = "softmax"
    attention_options: dict[str, Any] | list[dict[str, Any]] = field(default_factory=dict)
    ln_eps: float = 1e-5
    init_std: float = 0.02
    positional: str = "learned"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_ctx"):
            check_int(f"GPTConfig.{name}", getattr(self, name), minimum=1,
                      what="a positive int", hint=f"e.g. {name}=64")
        if isinstance(self.n_heads, (list, tuple)):
            self.n_heads = list(self.n_heads)
            if len(self.n_heads) != self.n_layers:
                raise ValueError(
                    f"n_heads lists {len(self.n_heads)} layers, the model has {self.n_layers}; "
                    "pass one head count per layer or a single int"
                )
        for v in self.n_heads if isinstance(self.n_heads, list) else [self.n_heads]:
            if not (is_int(v) and v >= 1):
                raise ValueError(f"GPTConfig.n_heads must be a positive int or a list of them, "
                                 f"got {self.n_heads!r}; pass e.g. n_heads=4")
        if self.d_head is None and isinstance(self.n_heads, list):
            raise ValueError(f"n_heads={self.n_heads} varies by layer: pass d_head explicitly "
                             "(e.g. d_head=16)")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "pass d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if isinstance(self.d_head, (list, tuple)):
            self.d_head = [int(d) for d in self.d_head]
            if len(self.d_head) != self.n_layers:
                raise ValueError(
                    f"d_head lists {len(self.d_head)} layers, the model has {self.n_layers}; "
                    "pass one d_head per layer or a single int"
                )
        dh = self.d_head if isinstance(self.d_head, list) else [self.d_head]
        if any((not isinstance(d, int)) or d < 1 for d in dh):
            raise ValueError(f"every d_head must be a positive int, got {self.d_head!r}")
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if self.normalization not in _NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {_NORMALIZATIONS}, got {self.normalization!r}"
            )
        if isinstance(self.attention, (list, tuple)):
            self.attention = list(self.attention)
            if len(self.attention) != self.n_layers:
                raise ValueError(
                    f"attention lists {len(self.attention)} layers, the model has "
                    f"{self.n_layers}"
                )
        for kind in self.attention if isinstance(self.attention, list) else [self.attention]:
            if kind not in ATTENTION_KINDS:
                raise ValueError(
                    f"unknown attention kind {kind!r}; known: {sorted(ATTENTION_KINDS)}"
                )
        if isinstance(self.attention_options, (list, tuple)):
            self.attention_options = [dict(o) for o in self.attention_options]
            if len(self.attention_options) != self.n_layers:
                raise ValueError("attention_options as a list needs one dict per layer")
        self._check_positional()

    def _check_positional(self) -> None:
        if self.positional not in _POSITIONALS:
            raise ValueError(f"positional must be one of {_POSITIONALS}, got "
                             f"{self.positional!r}")
        if self.positional == "learned":
            if self.rotary_dim is not None:
                raise ValueError(f"rotary_dim={self.rotary_dim!r} needs positional='rotary'; "
                                 "drop it or set positional='rotary'")
            return
        d_min = min(self.d_heads)
        if self.rotary_dim is None:
            self.rotary_dim = d_min
        rd = self.rotary_dim
        check_int("rotary_dim", rd, minimum=2, maximum=d_min, even=True,
                  what=f"an even int in [2, min d_head={d_min}]")
        if not (is_real(self.rotary_base) and self.rotary_base > 1):
            raise ValueError(f"rotary_base must be a number > 1, got {self.rotary_base!r}; "
                             "pass e.g. rotary_base=10000.0")
        self.rotary_base = float(self.rotary_base)
        lin = [l for l in range(self.n_layers) if self.layer_attention(l) == "linear"]
        if lin:
            raise ValueError(f"positional='rotary' needs softmax or sd layers; layers {lin} "
                             "are 'linear' attention, which takes no rotary positions")

    # per-layer accessors ------------------------------------------------------------
    def layer_d_head(self, layer: int) -> int:
        """The head dimension of ``layer``."""
        return self.d_head[layer] if isinstance(self.d_head, list) else int(self.d_head)

    def layer_n_heads(self, layer: int) -> int:
        """The number of heads of ``layer``."""
        return self.n_heads[layer] if isinstance(self.n_heads, list) else int(self.n_heads)

    @property
    def heads_per_layer(self) -> list[int]:
        """Number of heads of every layer."""
        return [self.layer_n_heads(l) for l in range(self.n_layers)]

    def layer_attention(self, layer: int) -> str:
        """The attention kind of ``layer`` (``"softmax"``, ``"sd"``, ``"linear"``, ...)."""
        return self.attention[layer] if isinstance(self.attention, list) else self.attention

    def layer_attention_options(self, layer: int) -> dict[str, Any]:
        """A copy of the attention options of ``layer``."""
        o = self.attention_options
        return dict(o[layer]) if isinstance(o, list) else dict(o)

    @property
    def d_heads(self) -> list[int]:
        """Head dimension of every layer."""
        return [self.layer_d_head(l) for l in range(self.n_layers)]

    # JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form. With learned positions the rotary fields (``positional``,
        ``rotary_dim``, ``rotary_base``) are left out, so the dict — and with it the run
        identity of the trainer and every saved config — is the one written before those
        fields existed."""
        d = {"format": CONFIG_FORMAT, **dataclasses.asdict(self)}
        if self.positional == "learned":
            for k in _ROTARY_FIELDS:
                d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """The config :meth:`to_dict` wrote (its ``format`` checked); TypeError / ValueError
        otherwise."""
        if not isinstance(d, dict):
            raise TypeError(f"a GPT config must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        fmt = d.pop("format", CONFIG_FORMAT)
        if fmt != CONFIG_FORMAT:
            raise ValueError(f"not a tl_spectral GPT config: format={fmt!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known fields: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        """The config as indented JSON (:meth:`to_dict`), read back by :meth:`from_json`."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, s: str) -> GPTConfig:
        """The config :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(s))


class MLP(nn.Module):
    """fc_out(gelu(fc_in(x))), exact (erf) GELU."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_mlp)
        self.fc_out = nn.Linear(d_mlp, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (fused kernel) in training mode; in eval mode the same function
    written out as TransformerLens' bridge computes it, ``(x − mean) / sqrt(var + eps) · w + b``,
    so that converted models agree to the round-off of identical operations."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return super().forward(x)
        x = x - x.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        return (x / scale) * self.weight + self.bias


def _norm(cfg: GPTConfig) -> nn.Module:
    return LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.normalization == "ln" else nn.Identity()


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.ln1 = _norm(cfg)
        rotary = (Rotary(cfg.rotary_dim, cfg.n_ctx, cfg.rotary_base)
                  if cfg.positional == "rotary" else None)
        self.attn = make_attention(
            cfg.layer_attention(layer), cfg.d_model, cfg.layer_n_heads(layer), cfg.layer_d_head(layer),
            cfg.n_ctx, rotary=rotary, **cfg.layer_attention_options(layer),
        )
        self.ln2 = _norm(cfg)
        self.mlp = MLP(cfg.d_model, cfg.d_mlp)

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        if return_pattern:
            a, pattern = self.attn(self.ln1(x), return_pattern=True)
            x = x + a
            return x + self.mlp(self.ln2(x)), pattern
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-style decoder. ``forward(tokens [batch, pos]) -> logits [batch, pos, vocab]``.

    Modules: ``tok_embed`` (Embedding vocab×d_model), ``pos_embed`` (Embedding n_ctx×d_model;
    None with ``positional="rotary"``, whose rotation lives in ``blocks[l].attn.rotary``),
    ``blocks[l]`` (``ln1``, ``attn``, ``ln2``, ``mlp.fc_in``, ``mlp.fc_out``), ``ln_f``,
    ``unembed`` (Linear d_model -> vocab, no bias; its weight *is* ``tok_embed.weight``
    when ``tied_embeddings``).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = (nn.Embedding(cfg.n_ctx, cfg.d_model)
                          if cfg.positional == "learned" else None)
        self.blocks = nn.ModuleList([Block(cfg, l) for l in range(cfg.n_layers)])
        self.ln_f = _norm(cfg)
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.unembed.weight = self.tok_embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, init_std²) weights, zero biases, residual-writing
        projections (attention ``out``, ``mlp.fc_out``) scaled by ``1/sqrt(2·n_layers)``."""
        std = self.cfg.init_std
        for name, m in self.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                s = std
                if name.endswith(("attn.out", "mlp.fc_out")):
                    s = std / math.sqrt(2 * self.cfg.n_layers)
                nn.init.normal_(m.weight, 0.0, s)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:
            if hasattr(blk.attn, "reset_sd_parameters"):
                blk.attn.reset_sd_parameters()

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"{tokens.shape[1]} positions exceed the context n_ctx={self.cfg.n_ctx}; "
                "pass at most n_ctx tokens per row"
            )

    def forward(self, tokens: torch.Tensor, *, return_patterns: bool = False):
        """tokens: [batch, pos] int -> logits [batch, pos, vocab]; with ``return_patterns``
        also the list of per-layer patterns, each [batch, head, query, key]."""
        self._check_tokens(tokens)
        x = self.tok_embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(tokens.shape[1], device=tokens.device))
        patterns = []
        for blk in self.blocks:
            if return_patterns:
                x, pat = blk(x, return_pattern=True)
                patterns.append(pat)
            else:
                x = blk(x)
        logits = self.unembed(self.ln_f(x))
        return (logits, patterns) if return_patterns else logits

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of tokens [batch, pos+1] (pos <= n_ctx):
        logits of ``tokens[:, :-1]`` against targets ``tokens[:, 1:]``. Returns a scalar."""
        if tokens.dim() != 2 or tokens.shape[1] < 2:
            raise ValueError(
                f"loss needs tokens [batch, pos+1] with pos+1 >= 2, got {tuple(tokens.shape)}"
            )
        logits = self(tokens[:, :-1])
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
        )

    def num_params(self) -> int:
        """The number of parameters of the model (every tensor, embeddings included)."""
        return sum(p.numel() for p in self.parameters())


# ------------------------------------------------------------------------- checkpoints
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def model_state(model: GPT) -> dict[str, torch.Tensor]:
    """State dict to save: contiguous CPU tensors, the tied unembedding left out."""
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tied_embeddings:
        sd.pop("unembed.weight", None)
    return sd


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of the file at ``path`` (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_file_durably(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it, so that a later rename publishes complete
    bytes even after a crash."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_model_files(model: GPT, directory: str | Path,
                      extra: dict[str, Any] | None = None) -> str:
    """Write ``model.safetensors`` + ``config.json`` into the (existing or new) folder
    ``directory``, not atomically; config.json records the weights' sha256 under
    ``"weights_sha256"``. Returns that checksum. :func:`save_model` is the atomic version."""
    from safetensors.torch import save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    blob = save(model_state(model), metadata={"format": CONFIG_FORMAT})
    digest = sha256_bytes(blob)
    write_file_durably(directory / WEIGHTS_NAME, blob)
    doc = {"model": model.cfg.to_dict(), **(extra or {}), "weights_sha256": digest}
    write_file_durably(directory / CONFIG_NAME, (json.dumps(doc, indent=2) + "\n").encode())
    return digest


def replace_dir(src: str | Path, dst: str | Path) -> None:
    """Publish the complete folder ``src`` under the name ``dst`` by renaming.

    When ``dst`` does not exist this is one atomic ``rename``. When it does, the two are
    exchanged atomically where the OS offers it (Linux ``renameat2(RENAME_EXCHANGE)``) and
    the old folder, now at ``src``, is deleted; elsewhere the old folder is first renamed
    aside, so a crash leaves either folder intact under some name, never a mixture."""
    src, dst = Path(src), Path(dst)
    if not dst.exists():
        os.replace(src, dst)
    elif _rename_exchange(src, dst):
        shutil.rmtree(src, ignore_errors=True)
    else:  # pragma: no cover - non-Linux fallback
        aside = dst.with_name(f".old_{dst.name}_{os.getpid()}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(dst, aside)
        os.replace(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(dst.parent)


def _rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swap the names ``a`` and ``b`` (Linux only); False when unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange)
    return rc == 0


def save_model(model: GPT, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model.safetensors`` + ``config.json`` into ``directory``; ``extra`` entries
    (JSON-able: tokenizer, metrics, ...) are stored in config.json beside ``"model"``.

    Atomic: both files are written (and fsynced) into a temporary sibling folder that then
    replaces ``directory`` by a rename, so a crash never pairs new weights with an old
    config.json. config.json records the sha256 of the weights (``"weights_sha256"``),
    which :func:`load_checkpoint` checks."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".tmp_{directory.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_model_files(model, tmp, extra)
    _fsync_dir(tmp)
    replace_dir(tmp, directory)
    return directory


def read_checkpoint_config(directory: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory, with clear errors."""
    directory = Path(directory)
    p = directory / CONFIG_NAME
    if not p.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_NAME} in {directory}; pass a directory written by save_model"
        )
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p} is not valid JSON ({e}); the checkpoint is corrupted") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise ValueError(f"{p} has no 'model' entry: not a tl_spectral checkpoint config")
    return doc


def _safetensors_errors() -> tuple[type[BaseException], ...]:
    import safetensors

    names = ("SafetensorError", "SafetensorsError")  # the name differs across versions
    errs = tuple(getattr(safetensors, n) for n in names if hasattr(safetensors, n))
    return (*errs, OSError, RuntimeError, ValueError)


_SAFETENSORS_ERRORS = _safetensors_errors()


def load_state_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file, turning any parse failure into a clear ``ValueError``."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file at {path}")
    try:
        return load_file(str(path))
    except _SAFETENSORS_ERRORS as e:
        raise ValueError(
            f"{path} is not a readable safetensors file ({e}); the checkpoint is corrupted "
            "or not a tl_spectral checkpoint"
        ) from None


def load_checkpoint(directory: str | Path, map_location: str | torch.device = "cpu") -> GPT:
    """Load a :class:`GPT` saved by :func:`save_model` (``tls.load_model(directory)`` gives
    the same model as a TransformerLens model, with its tokenizer).

    Validates that the weights hold exactly the expected names and shapes and only finite
    values, and (when config.json records one) that their sha256 is the recorded one;
    raises ``ValueError`` naming the missing / unexpected / mis-shaped tensors, or the
    mismatch, otherwise.
    """
    directory = Path(directory)
    doc = read_checkpoint_config(directory)
    # the weights are checked before the model is built: a hostile config.json (a model of
    # billions of parameters) must give the error below, not exhaust the memory
    state = load_state_file(directory / WEIGHTS_NAME)
    _check_config_against_state(doc["model"], state, directory)
    cfg = GPTConfig.from_dict(doc["model"])
    with torch.device("meta"):  # shapes only: no memory
        meta = GPT(cfg)
    expected = {k: v.shape for k, v in meta.state_dict().items()}
    if cfg.tied_embeddings:
        expected.pop("unembed.weight", None)
    del meta
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = sorted(k for k in set(expected) & set(state) if expected[k] != state[k].shape)
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
        if bad:
            parts.append(
                "mis-shaped " + ", ".join(
                    f"{k}: file {tuple(state[k].shape)} vs config {tuple(expected[k])}"
                    for k in bad[:5]
                )
            )
        raise ValueError(
            f"{directory / WEIGHTS_NAME} does not match its config.json ("
            + "; ".join(parts) + "): a foreign or corrupted checkpoint"
        )
    for k, v in state.items():
        if not torch.isfinite(v).all():
            raise ValueError(f"{directory / WEIGHTS_NAME}: tensor {k} holds NaN/inf values")
    expected_sha = doc.get("weights_sha256")
    if expected_sha is not None:
        got = sha256_file(directory / WEIGHTS_NAME)
        if got != expected_sha:
            raise ValueError(
                f"{directory / WEIGHTS_NAME} does not belong to {directory / CONFIG_NAME} "
                f"(sha256 {got[:12]}..., config.json expects {str(expected_sha)[:12]}...): "
                "the checkpoint is corrupted or mixes files of two saves"
            )
    model = GPT(cfg)  # only now, with every check passed
    model.load_state_dict(state, strict=not cfg.tied_embeddings)
    return model.to(map_location)


_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)
                   if f.default is not dataclasses.MISSING}


def _check_config_against_state(mdoc: Any, state: dict[str, torch.Tensor],
                                directory: Path) -> None:
    """The sizes config.json claims (vocab_size, d_model, n_ctx, n_layers) against the
    weights actually there, before any model is built from it (``ValueError``)."""
    if not isinstance(mdoc, dict):
        raise ValueError(f"{directory / CONFIG_NAME}: 'model' is not an object")
    emb = state.get("tok_embed.weight")
    if emb is None or emb.ndim != 2:
        raise ValueError(f"{directory / WEIGHTS_NAME} has no 2-D tok_embed.weight: not a "
                         "tl_spectral GPT checkpoint")
    layers = {int(k.split(".")[1]) for k in state
              if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    claims = {"vocab_size": int(emb.shape[0]), "d_model": int(emb.shape[1]),
              "n_layers": max(layers) + 1 if layers else 0}
    pos = state.get("pos_embed.weight")
    if pos is not None and pos.ndim == 2:
        claims["n_ctx"] = int(pos.shape[0])
    for key, have in claims.items():
        want = mdoc.get(key, _FIELD_DEFAULTS.get(key))
        if want != have:
            raise ValueError(
                f"{directory / WEIGHTS_NAME} is mis-shaped for its config.json, which says "
                f"{key}={want!r} where the weights hold {have}: a foreign or corrupted "
                "checkpoint")


def __getattr__(name: str) -> Any:
    if name == "load_model":  # the old name of load_checkpoint, deprecated
        from tl_spectral._deprecation import deprecated_function

        return deprecated_function(load_checkpoint, "tl_spectral.models.load_model",
                                   "tl_spectral.models.load_checkpoint (the project's GPT) or "
                                   "tl_spectral.load_model (a TransformerLens model)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
