"""run_probes: many probes, one forward pass per batch, no activation cache.

Steps per batch:
1. union of the probes' requirements -> one hook per (layer, kind) tensor;
2. each hook stores its tensor in the layer's :class:`LayerCapture`; as soon as a layer
   holds every tensor some probe asked of it, the probes that read that layer are
   updated and the capture is freed;
3. after the last layer any probe needs, the pass is stopped (no wasted compute on later
   layers or the unembedding).

Precision: captures of half-precision models (bfloat16, float16) are cast to float32 before
any probe sees them, so every analysis computes in float32 or better; the pattern check uses
a tolerance scaled to the model's dtype (:attr:`ModelView.tolerance`). Attention weights
that underflowed to exactly 0 in the model's own softmax are counted, and a warning names
the layers where statistics of small weights are then not meaningful.

Device: captures, masks, token ids and probe states stay on the model's device (CUDA when
the model is on a GPU); nothing is copied to the CPU in the per-batch path. Results move to
the CPU when they are built (``probe.result()``), i.e. for saving and plotting.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

import torch
from torch import Tensor

from tl_spectral.model_view import CAPTURE_KINDS, ModelView
from tl_spectral.probes.base import LayerCapture, Probe, reduce_state


class _StopForward(Exception):
    """Raised inside the last needed hook to end the forward pass early."""


HALF_DTYPES = (torch.float16, torch.bfloat16)


def analysis_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype analyses compute in for tensors the model produced in ``dtype``: float32
    for half precision (and float32), float64 kept."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class UnderflowWarning(UserWarning):
    """Attention weights underflowed to 0 in a half-precision model's softmax."""


@dataclass
class Corpus:
    """Token batches with their padding mask. tokens, mask: [n_docs, pos]."""

    tokens: Tensor
    mask: Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def as_corpus(data: Any, attention_mask: Optional[Tensor] = None, pad_token: int = 0) -> Corpus:
    """Normalise ``data`` into a :class:`Corpus`.

    Accepts a ``DocumentWindows`` ensemble, a ``[n_docs, pos]`` int tensor (with an
    optional ``[n_docs, pos]`` attention mask, 1 = real token), or a sequence of 1-D token
    sequences of varying length (right-padded with ``pad_token``; the mask marks padding).
    """
    from tl_spectral.data.windows import DocumentWindows

    if isinstance(data, Corpus):
        return data
    if isinstance(data, DocumentWindows):
        data = data.tokens
    if isinstance(data, str):
        raise TypeError(
            "run_probes got a string; tokenize it first, e.g. "
            "document_windows(text, tokenizer, n_docs, length)"
        )
    if isinstance(data, Tensor):
        if data.dim() == 1:
            data = data.unsqueeze(0)
        if data.dim() != 2:
            raise ValueError(f"tokens must be [n_docs, pos], got shape {tuple(data.shape)}")
        if data.dtype.is_floating_point:
            raise TypeError(f"tokens must be integers, got {data.dtype}")
        if data.shape[0] == 0 or data.shape[1] == 0:
            raise ValueError(
                f"the corpus is empty (shape {tuple(data.shape)}); pass at least one document "
                "of at least one token"
            )
        if attention_mask is None:
            mask = torch.ones(data.shape, dtype=torch.bool)
        else:
            if attention_mask.shape != data.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} differs from tokens "
                    f"shape {tuple(data.shape)}"
                )
            mask = attention_mask.bool()
            _check_right_padded(mask)
        return Corpus(tokens=data.long(), mask=mask)
    if isinstance(data, Sequence):
        docs = [torch.as_tensor(d, dtype=torch.long).flatten() for d in data]
        if not docs:
            raise ValueError("the corpus is empty; pass at least one document")
        lengths = [int(d.numel()) for d in docs]
        if min(lengths) == 0:
            raise ValueError(f"document {lengths.index(0)} has no tokens")
        T = max(lengths)
        tokens = torch.full((len(docs), T), pad_token, dtype=torch.long)
        mask = torch.zeros((len(docs), T), dtype=torch.bool)
        for i, d in enumerate(docs):
            tokens[i, : d.numel()] = d
            mask[i, : d.numel()] = True
        return Corpus(tokens=tokens, mask=mask)
    raise TypeError(
        f"cannot read a corpus from {type(data).__name__}; pass DocumentWindows, a "
        "[n_docs, pos] token tensor, or a list of token lists"
    )


def _check_right_padded(mask: Tensor) -> None:
    # a real token after a padding position means left padding or holes
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ValueError(
            "attention_mask must be right-padded (real tokens first, then padding); "
            "left padding shifts positions and would mix lags"
        )
    if (~mask[:, 0]).any():
        raise ValueError("a document in the corpus has no real token (mask row all zeros)")


def _shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    per = (n + world - 1) // world
    return min(n, rank * per), min(n, (rank + 1) * per)


def run_probes(
    model: Any,
    data: Any,
    probes: Union[Probe, Iterable[Probe]],
    batch_size: int = 16,
    progress: bool = True,
    *,
    attention_mask: Optional[Tensor] = None,
    distributed: Optional[bool] = None,
    check_finite: bool = True,
) -> dict[str, Any]:
    """Run ``probes`` over ``data`` with one forward pass per batch; return their results.

    model: a TransformerLens model (or a :class:`ModelView`). data: see :func:`as_corpus`.
    Returns ``{probe.name: probe.result()}``; the probes keep their merged state, so they can
    also be merged with probes run on other shards (:meth:`Probe.merge`).

    ``distributed``: None = automatic (used when ``torch.distributed`` is initialised with
    more than one process). Each process then runs its contiguous shard of the corpus and
    the probe states are reduced across processes before the results are built, so every
    rank returns the whole-corpus results.
    """
    view = model if isinstance(model, ModelView) else ModelView(model)
    probe_list = [probes] if isinstance(probes, Probe) else list(probes)
    if not probe_list:
        raise ValueError("pass at least one probe")
    names = [p.name for p in probe_list]
    if len(set(names)) != len(names):
        raise ValueError(f"two probes share a name: {names}; give each probe a distinct name")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    corpus = as_corpus(data, attention_mask)
    if corpus.tokens.shape[1] > view.n_ctx:
        raise ValueError(
            f"documents of {corpus.tokens.shape[1]} tokens are longer than the model's context "
            f"of {view.n_ctx}; pass windows of at most {view.n_ctx} tokens"
        )
    if view.d_vocab > 0 and int(corpus.tokens.max()) >= view.d_vocab:
        raise ValueError(
            f"token id {int(corpus.tokens.max())} is outside the model's vocabulary of "
            f"{view.d_vocab}; tokenize with the model's tokenizer"
        )

    needs: dict[int, set[str]] = {}
    readers: dict[int, list[Probe]] = {}
    for p in probe_list:
        p.bind(view)
        for layer, kinds in p.requires(view).items():
            view._check_layer(layer)
            bad = set(kinds) - set(CAPTURE_KINDS)
            if bad:
                raise ValueError(f"probe {p.name!r} asks for unknown captures {sorted(bad)}")
            needs.setdefault(layer, set()).update(kinds)
            readers.setdefault(layer, []).append(p)
    for p in probe_list:
        p.begin(len(corpus), int(corpus.tokens.shape[1]))
    if any("pattern" in k for k in needs.values()):
        view.check_patterns()
    last_layer = max(needs) if needs else -1

    if distributed is None:
        distributed = (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        )
    lo, hi = 0, len(corpus)
    if distributed:
        lo, hi = _shard_range(len(corpus), torch.distributed.get_rank(), torch.distributed.get_world_size())

    starts = range(lo, hi, batch_size)
    iterator: Iterable[int] = starts
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(starts, desc=f"probes ({', '.join(names)})", unit="batch")

    underflow: dict[int, Tensor] = {}
    for start in iterator:
        stop = min(start + batch_size, hi)
        tokens = corpus.tokens[start:stop]
        mask = corpus.mask[start:stop]
        # trim trailing all-padding columns of this batch
        T_b = int(mask.sum(dim=1).max())
        tokens, mask = tokens[:, :T_b], mask[:, :T_b]
        doc_index = torch.arange(start, stop, device=view.device)
        _run_batch(view, tokens, mask, doc_index, needs, readers, last_layer, check_finite,
                   underflow=underflow)
    _warn_underflow(view, underflow)

    if distributed:
        for p in probe_list:
            reduce_state(p)
    return {p.name: p.result() for p in probe_list}


def _run_batch(
    view: ModelView,
    tokens: Tensor,
    mask: Tensor,
    doc_index: Tensor,
    needs: dict[int, set[str]],
    readers: dict[int, list[Probe]],
    last_layer: int,
    check_finite: bool,
    underflow: Optional[dict[int, Tensor]] = None,
) -> None:
    captures: dict[int, LayerCapture] = {}
    pending = {layer: set(kinds) for layer, kinds in needs.items()}
    device = view.device
    mask_dev = mask.to(device)
    tokens_dev = tokens.to(device)
    doc_index = doc_index.to(device)
    padless = bool(mask.all())
    model_dtype = view.dtype
    half = model_dtype in HALF_DTYPES
    # rows of a softmax in the model's dtype sum to 1 within a few of its epsilons per term
    row_tol = max(1e-3, view.tolerance)
    allowed: Optional[Tensor] = None
    if half and underflow is not None:
        T_b = tokens.shape[1]
        allowed = mask_dev[:, None, :, None] & mask_dev[:, None, None, :]
        if view.causal:
            allowed = allowed & torch.ones(T_b, T_b, dtype=torch.bool, device=device).tril()

    def make_hook(layer: int, kind: str):
        def hook(t: Tensor, hook: Any = None) -> Tensor:
            cap = captures.get(layer)
            if cap is None:
                cap = captures[layer] = LayerCapture(
                    layer=layer, mask=mask_dev, tokens=tokens_dev, doc_index=doc_index,
                    model_dtype=model_dtype,
                )
            x = t.detach()
            if kind == "pattern" and allowed is not None:
                # exact zeros where the model could attend: underflow in its own softmax
                n_zero = ((x == 0) & allowed).sum()
                n_all = allowed.sum() * x.shape[1]
                prev = underflow.get(layer)  # type: ignore[union-attr]
                cur = torch.stack([n_zero, n_all]).double()
                underflow[layer] = cur if prev is None else prev + cur  # type: ignore[index]
            if x.dtype != analysis_dtype(x.dtype):
                x = x.to(analysis_dtype(x.dtype))  # half precision: analyses in float32
            if kind == "v":
                x = view.repeat_kv(x, 2)
            if kind == "pattern" and check_finite:
                # rows of real queries must be finite and sum to 1 (one cheap reduction);
                # catches NaN/inf and backends that silently zero NaN rows
                rows = x.sum(-1)  # [b, h, q]
                bad = ~(torch.isfinite(rows) & ((rows - 1.0).abs() < row_tol))
                if not padless:
                    bad &= mask_dev[:, None, :]
                if bool(bad.any()):
                    raise FloatingPointError(
                        f"layer {layer}: attention pattern rows at real positions are NaN, inf "
                        f"or do not sum to 1 within {row_tol:.1e} (model dtype "
                        f"{str(model_dtype).replace('torch.', '')}); check the model's weights "
                        "and the input tokens"
                    )
            setattr(cap, kind, x)
            pending[layer].discard(kind)
            if not pending[layer]:
                for p in readers[layer]:
                    p.update(cap)
                del captures[layer]
                if layer == last_layer and not any(pending.values()):
                    raise _StopForward
            return t

        return hook

    fwd_hooks = [
        (view.hook_name(kind, layer), make_hook(layer, kind))
        for layer, kinds in sorted(needs.items())
        for kind in kinds
    ]
    # Causal decoders with right padding need no mask (real tokens never see the pad);
    # bidirectional encoders must mask padded keys.
    attn_mask = None if (view.causal or bool(mask.all())) else mask.long()
    try:
        with torch.no_grad():
            view.run(tokens, attention_mask=attn_mask, fwd_hooks=fwd_hooks, return_type=None)
    except _StopForward:
        pass
    if any(pending.values()):
        missing = {layer: sorted(k) for layer, k in pending.items() if k}
        raise RuntimeError(
            f"the forward pass never produced {missing}; the model does not expose these hooks"
        )


def _warn_underflow(view: ModelView, underflow: dict[int, Tensor], threshold: float = 1e-4) -> None:
    """Warn when a half-precision model's softmax rounded attention weights to exactly 0."""
    if not underflow:
        return
    bad = []
    for layer, c in sorted(underflow.items()):
        n_zero, n_all = (float(x) for x in c.tolist())
        share = n_zero / max(n_all, 1.0)
        if share > threshold:
            bad.append(f"layer {layer}: {share:.2%}")
    if bad:
        dt = str(view.dtype).replace("torch.", "")
        fi = torch.finfo(view.dtype)
        warnings.warn(
            f"{view.name} runs in {dt}: attention weights too small for {dt} (below "
            f"~{fi.tiny * fi.eps:.0e}; relative precision {fi.eps:.1e}) underflow to exactly 0 "
            "in the model's own softmax "
            f"({', '.join(bad)} of the allowed query-key pairs). Statistics of small weights are "
            "not meaningful there: the entropy and log-scale tails of the attention fields, "
            "rank correlations among the far keys, and contribution weights and rho* of the "
            "zeroed pairs (they are exactly 0). Load the model in float32 for these.",
            UnderflowWarning, stacklevel=3,
        )
