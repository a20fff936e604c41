"""The Probe protocol: what a probe needs from the forward pass and how its state merges.

A probe

1. declares, per layer, the tensors it needs (:data:`tl_spectral.model_view.CAPTURE_KINDS`:
   ``resid_pre``, ``attn_in``, ``q``, ``k``, ``v``, ``pattern``, ``z``, ``mlp_out``,
   ``resid_post``) in :meth:`Probe.requires`;
2. receives one :class:`LayerCapture` per layer and batch in :meth:`Probe.update`, and
   folds it into its state — a dict of tensors, each with a reduction ("sum", "cat" or
   "max") in :attr:`Probe.reductions`;
3. turns its state into a :class:`~tl_spectral.results.Result` in :meth:`Probe.result`.

Because the state is a dict of reducible tensors, shards of a corpus processed apart
combine with :meth:`Probe.merge`, and under ``torch.distributed`` the runner reduces them
across processes (:func:`reduce_state`).

State and runs: every ``run_probes`` call starts its probes fresh (:meth:`Probe.reset`);
``run_probes(..., accumulate=True)`` instead adds the new corpus to the state the probe
already holds (its documents numbered after the ones it has seen), and :meth:`Probe.merge`
combines two probes run apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from tl_spectral.model_view import ModelView
    from tl_spectral.results import Result


class StopForward(Exception):
    """Raised inside a hook once everything needed is captured: ends the forward pass early
    (the runner and the interventions catch it)."""


@dataclass
class LayerCapture:
    """Tensors of one layer for one batch. Only the requested ones are set.

    mask: [batch, pos] bool, True at real (non-padding) tokens.
    pattern: [batch, head, query, key]; q, k, v, z: [batch, pos, head, d_head] (key/value
    heads repeated to the query heads); attn_in, resid_pre, mlp_out, resid_post:
    [batch, pos, d_model]. tokens: [batch, pos] (−1 where unknown, e.g. a capture built from
    an ActivationCache without ``tokens=``).
    doc_index: [batch] index of each row in the corpus (for per-document state).
    All on the model's device. Floating captures are float32 (or float64) whatever the
    model's dtype; ``model_dtype`` is the dtype the model computed them in, and
    :attr:`tolerance` a relative tolerance scaled to it for checks on them.
    """

    layer: int
    mask: Tensor
    tokens: Tensor
    doc_index: Tensor
    pattern: Optional[Tensor] = None
    v: Optional[Tensor] = None
    attn_in: Optional[Tensor] = None
    resid_pre: Optional[Tensor] = None
    model_dtype: torch.dtype = torch.float32
    q: Optional[Tensor] = None
    k: Optional[Tensor] = None
    z: Optional[Tensor] = None
    mlp_out: Optional[Tensor] = None
    resid_post: Optional[Tensor] = None
    shared: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    """Quantities derived from this capture that several probes need (the value products,
    head outputs, pattern sums of :mod:`tl_spectral.probes.shared`), formed by the first
    probe that asks and reused by the others; a capture lives for one layer of one batch."""

    @property
    def tolerance(self) -> float:
        """``max(1e-3, 8 · eps(model_dtype))``: 1e-3 in float32, 6.3e-2 in bfloat16, 7.8e-3 in
        float16."""
        return max(1e-3, 8.0 * float(torch.finfo(self.model_dtype).eps))

    @property
    def lengths(self) -> Tensor:
        """[batch] number of real tokens per row."""
        return self.mask.sum(dim=1)

    @property
    def pair_mask(self) -> Tensor:
        """[batch, query, key] True where both the query and the key are real tokens."""
        return self.mask[:, :, None] & self.mask[:, None, :]


def _pad_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(t.shape) == tuple(shape):
        return t
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


def merge_tensor(a: Tensor, b: Tensor, reduction: str) -> Tensor:
    """Combine two state tensors. "sum" zero-pads trailing dims to the larger shape."""
    if reduction == "cat":
        if a.shape[1:] != b.shape[1:]:
            tail = tuple(max(x, y) for x, y in zip(a.shape[1:], b.shape[1:]))
            a = _pad_to(a, (a.shape[0], *tail))
            b = _pad_to(b, (b.shape[0], *tail))
        return torch.cat([a, b.to(a.device)], dim=0)
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
    if a.dim() != b.dim():
        raise ValueError(f"cannot merge state tensors of shapes {tuple(a.shape)}, {tuple(b.shape)}")
    a, b = _pad_to(a, shape), _pad_to(b.to(a.device), shape)
    if reduction == "sum":
        return a + b
    if reduction == "max":
        return torch.maximum(a, b)
    raise ValueError(f"unknown reduction {reduction!r}; use 'sum', 'cat' or 'max'")


class Probe:
    """Base class of all probes. Subclasses set ``name`` and implement the four methods.

    Naming: a probe class ends in ``Probe`` (``SinkProbe``); what its ``result()`` returns is
    a :class:`~tl_spectral.results.Result` named for what it holds (``SinkStats``).
    """

    name: str = "probe"
    """Key of the probe's result in ``run_probes``' output: a class default, which an
    instance may override (the built-in probes' ``name=`` argument)."""
    reductions: dict[str, str] = {}
    """Reduction of each state key (a class default, which an instance may extend); keys
    not listed are summed."""

    def __init__(self) -> None:
        self.state: dict[str, Tensor] = {}
        self.view: Optional["ModelView"] = None
        self._docs_seen = 0

    # -- to implement -------------------------------------------------------------
    def requires(self, view: "ModelView") -> dict[int, set[str]]:
        """Layers this probe reads, each with the capture kinds it needs."""
        raise NotImplementedError

    def _read_layers(self, view: "ModelView") -> list[int]:
        """The probe's ``layers`` (every layer of ``view`` when None), stored back on it: the
        layers a ``requires`` of a probe with a ``layers`` argument reads."""
        layers = getattr(self, "layers", None)
        self.layers = list(range(view.n_layers)) if layers is None else layers
        return self.layers

    def update(self, cap: LayerCapture) -> None:
        """Fold one layer's capture of one batch into ``self.state``."""
        raise NotImplementedError

    def result(self) -> "Result":
        """Turn the (merged) state into a Result."""
        raise NotImplementedError

    def begin(self, n_docs: int, length: int) -> None:
        """Called by the runner before the first batch with the corpus size and its padded
        length (batches may be shorter: trailing padding columns are trimmed)."""

    def next_pass(self) -> bool:
        """Called by ``run_probes`` after each pass over the corpus (the states already
        reduced across processes): True when the probe needs another pass over the same
        corpus (a streaming probe that fixed its band windows in the first). Default: one
        pass."""
        return False

    # -- provided -----------------------------------------------------------------
    def reset(self) -> None:
        """Forget every document seen: ``run_probes`` calls this at the start of each run
        unless ``accumulate=True``. Override it (calling ``super().reset()``) when a probe
        keeps per-corpus data outside ``self.state``. Weights are not per-corpus data but
        must not outlive a run either: a probe reads them from the model on every run
        (e.g. drops its copies in :meth:`requires`, which the runner calls once per run), so
        weights edited in place between two runs are seen by the second."""
        self.state = {}
        self._docs_seen = 0

    @property
    def docs_seen(self) -> int:
        """Documents folded into the state (all runs since the last reset, merges included)."""
        return int(getattr(self, "_docs_seen", 0))

    def bind(self, view: "ModelView") -> None:
        """Called by the runner before the first batch."""
        if self.view is not None and self.view.model is not view.model:
            raise ValueError(
                f"probe {self.name!r} was already used on another model; create a new probe"
            )
        self.view = view

    def accumulate(self, key: str, value: Tensor) -> None:
        """Add ``value`` into state ``key`` with the key's reduction (growing shapes as needed)."""
        value = value.detach()
        red = self.reductions.get(key, "sum")
        cur = self.state.get(key)
        if cur is None:
            self.state[key] = value.clone()
        elif red == "sum" and cur.shape == value.shape:
            cur.add_(value.to(cur.device, cur.dtype))
        else:
            self.state[key] = merge_tensor(cur, value.to(cur.dtype), red)

    def merge(self, other: "Probe") -> "Probe":
        """Combine ``other``'s state into this probe's (shards of one corpus). Returns self."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        if self.view is None:
            self.view = other.view
        self._docs_seen = self.docs_seen + other.docs_seen
        for key, value in other.state.items():
            if key in self.state:
                self.state[key] = merge_tensor(self.state[key], value, self.reductions.get(key, "sum"))
            else:
                self.state[key] = value.clone()
        return self

    def _require_state(self) -> None:
        if not self.state:
            raise RuntimeError(
                f"probe {self.name!r} has seen no data; run it with run_probes(model, tokens, "
                "[probe]) first"
            )


def reduce_state(probe: Probe) -> None:
    """Reduce a probe's state across the processes of the default torch.distributed group.

    "sum"/"max" states are all-reduced; "cat" states are all-gathered in rank order (rank
    0's rows first), so contiguous shards reproduce the single-process order.
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    keys = sorted(probe.state)
    # every rank must hold the same keys with the same number of dims; each key's reduction
    # comes from the ranks that hold it, so a key declared on some ranks only (ContributionProbe's
    # kept maps: the rank whose shard holds the kept documents) is reduced alike on every rank
    all_keys: list[Optional[list]] = [None] * world
    dist.all_gather_object(all_keys, [(k, tuple(probe.state[k].shape), str(probe.state[k].dtype),
                                       probe.reductions.get(k, "sum")) for k in keys])
    union: dict[str, tuple[list[int], str]] = {}
    kinds: dict[str, str] = {}
    for lst in all_keys:
        for k, shape, dtype, red in lst or []:
            if kinds.setdefault(k, red) != red:
                raise RuntimeError(f"probe {probe.name!r}: state {k!r} is reduced by "
                                   f"{kinds[k]!r} on one process and {red!r} on another; "
                                   "declare its reduction in the probe's reductions on all")
            if k not in union:
                union[k] = (list(shape), dtype)
            else:
                cur = union[k][0]
                start = 1 if red == "cat" else 0
                for d in range(start, len(shape)):
                    cur[d] = max(cur[d], shape[d])
    missing = {k: r for k, r in kinds.items() if probe.reductions.get(k, "sum") != r}
    if missing:  # an instance-level copy: the class default is shared by every instance
        probe.reductions = {**probe.reductions, **missing}
    for k, (shape, dtype_s) in sorted(union.items()):
        red = kinds[k]
        dtype = getattr(torch, dtype_s.replace("torch.", ""))
        local = probe.state.get(k)
        if red == "cat":
            tail = tuple(shape[1:])
            if local is None:
                local = torch.zeros((0, *tail), dtype=dtype)
            local = _pad_to(local, (local.shape[0], *tail)).contiguous()
            sizes: list[Optional[int]] = [None] * world
            dist.all_gather_object(sizes, int(local.shape[0]))
            n_max = max(int(s) for s in sizes)  # type: ignore[arg-type]
            padded = _pad_to(local, (n_max, *tail)).contiguous()
            bufs = [torch.zeros_like(padded) for _ in range(world)]
            dist.all_gather(bufs, padded)
            probe.state[k] = torch.cat([b[: int(s)] for b, s in zip(bufs, sizes)], dim=0)  # type: ignore[arg-type]
        else:
            if local is None:
                local = torch.zeros(shape, dtype=dtype)
                if red == "max":
                    local.fill_(float("-inf"))
            local = _pad_to(local, tuple(shape)).contiguous()
            op = dist.ReduceOp.SUM if red == "sum" else dist.ReduceOp.MAX
            dist.all_reduce(local, op=op)
            probe.state[k] = local
