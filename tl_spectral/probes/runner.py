"""run_probes: many probes, one forward pass per batch, no activation cache.

Steps per batch:
1. union of the probes' requirements -> one hook per (layer, kind) tensor;
2. each hook stores its tensor in the layer's :class:`LayerCapture`; as soon as a layer
   holds every tensor some probe asked of it, the probes that read that layer are
   updated and the capture is freed;
3. after the last layer any probe needs, the pass is stopped (no wasted compute on later
   layers or the unembedding), unless the user's own hooks (``fwd_hooks``) sit on that layer
   or later, or the logits are asked for.

The user's hooks run in the same pass, before the runner's capture on a shared hook point.
There is no other pass: the checks (every needed hook fired; pattern rows finite and
summing to 1) happen on the real batches. Probes start fresh on every call unless
``accumulate=True``. :func:`run_probes_on_cache` feeds the same probes from an
``ActivationCache``.

Precision: captures of half-precision models (bfloat16, float16) are cast to float32 before
any probe sees them, so every analysis computes in float32 or better; the pattern check uses
a tolerance scaled to the model's dtype (:attr:`ModelView.tolerance`). Attention weights
that underflowed to exactly 0 in the model's own softmax are counted, and a warning names
the layers where statistics of small weights are then not meaningful.

Device: captures, masks, token ids and probe states stay on the model's device (CUDA when
the model is on a GPU); nothing is copied to the CPU in the per-batch path. Results move to
the CPU when they are built (``probe.result()``), i.e. for saving and plotting.

Threads: the capture hooks are attached to the model, so every pass on a model sees every
hook added to it. Runs on one model are therefore sequential: a second thread calling
:func:`run_probes` on a model another thread is running probes on gets a ``RuntimeError``
at once (nothing of either run is touched). Use one model per thread.
"""

from __future__ import annotations

import functools
import re
import threading
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor

from tl_spectral._deprecation import renamed_arguments, warn_deprecated
from tl_spectral.model_view import (
    CAPTURE_KINDS,
    ModelView,
    PatternsNotExposedError,
    layer_windows,
    window_allowed,
)
from tl_spectral.probes.base import LayerCapture, Probe, StopForward, reduce_state
from tl_spectral.probes.corpus import (  # noqa: F401  (re-exported: the runner's inputs)
    Corpus,
    LazyCorpus,
    PaddingInferredWarning,
    as_corpus,
    check_count,
    check_right_padded,
    document_ids,
    infer_padding,
    mask_bool,
    numpy_ids_as_tensor,
    shard_range,
    with_padding,
)
from tl_spectral.probes.heap import note_freed, release_free_heap

HALF_DTYPES = (torch.float16, torch.bfloat16)


def analysis_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype analyses compute in for tensors the model produced in ``dtype``: float32
    for half precision (and float32), float64 kept."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class UnderflowWarning(UserWarning):
    """Attention weights underflowed to 0 in a half-precision model's softmax."""


class ProbeRun(NamedTuple):
    """Deprecated: what the deprecated ``run_probes(..., return_logits=True)`` returns; unpacks
    as ``results, logits``. Use :func:`run_probes_with_logits`, which returns ``(logits,
    results)`` in the order of TransformerLens' ``run_with_cache`` (``(logits, cache)``).

    results: ``{probe.name: Result}`` as ``run_probes`` returns by default.
    logits: ``[n_docs, pos, d_vocab]`` on the CPU, the model's logits of every document in
    corpus order (this process's shard under ``torch.distributed``), zero at padded
    positions; None when the logits went to an ``on_logits`` callback only.
    """

    results: dict[str, Any]
    logits: Optional[Tensor]


HookFn = Callable[..., Any]
_EMBED_HOOKS = ("hook_embed", "hook_pos_embed", "hook_tokens", "embed.", "pos_embed.")


def _hook_layer(name: Any) -> Optional[int]:
    """The block a user hook sits in (-1 for the embeddings), or None (after the blocks,
    or unknown: a name filter)."""
    if not isinstance(name, str):
        return None
    m = re.match(r"blocks\.(\d+)\.", name)
    if m:
        return int(m.group(1))
    if name.startswith(_EMBED_HOOKS):
        return -1
    return None


def _probe_classes() -> dict[str, type]:
    """Probe classes by their result name, derived from the subclasses of :class:`Probe`
    defined so far (the library's own are imported with :mod:`tl_spectral.probes`)."""
    out: dict[str, type] = {}
    todo = list(Probe.__subclasses__())
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        n = getattr(c, "name", None)
        if isinstance(n, str) and n != "probe" and not c.__name__.startswith("_"):
            out.setdefault(n, c)
    return out


def _plan(
    view: ModelView, probes: Union[Probe, Iterable[Probe]], accumulate: bool
) -> tuple[list[Probe], dict[int, set[str]], dict[int, list[Probe]]]:
    """Validate the probes, reset them (unless accumulating), bind them and collect the
    union of their needs: layer -> kinds, layer -> probes reading it."""
    probe_list = [probes] if isinstance(probes, (Probe, type, str)) else list(probes)
    if not probe_list:
        raise ValueError("pass at least one probe")
    for p in probe_list:
        if isinstance(p, Probe):
            continue
        if isinstance(p, type) and issubclass(p, Probe):
            raise TypeError(f"probes takes probe objects: pass {p.__name__}() (an instance, "
                            f"with its options), not the class {p.__name__}")
        if isinstance(p, str):
            known = _probe_classes()
            hint = (f"{known[p].__name__}()" if p in known
                    else f"one of {', '.join(c.__name__ + '()' for c in known.values())}")
            raise TypeError(f"probes takes probe objects, not names: for {p!r} pass {hint}")
        raise TypeError(f"probes takes Probe objects (e.g. AttentionStatsProbe()), got "
                        f"{type(p).__name__}")
    names = [p.name for p in probe_list]
    if len(set(names)) != len(names):
        raise ValueError(f"two probes share a name: {names}; give each probe a distinct name")
    needs: dict[int, set[str]] = {}
    readers: dict[int, list[Probe]] = {}
    for p in probe_list:
        p.bind(view)
        if not accumulate:
            p.reset()
        for layer, kinds in p.requires(view).items():
            view._check_layer(layer)
            bad = set(kinds) - set(CAPTURE_KINDS)
            if bad:
                raise ValueError(
                    f"probe {p.name!r} asks for unknown captures {sorted(bad)}; the capture "
                    f"kinds are {list(CAPTURE_KINDS)}"
                )
            needs.setdefault(layer, set()).update(kinds)
            readers.setdefault(layer, []).append(p)
    return probe_list, needs, readers


def _check_token_ids(view: ModelView, corpus: Corpus) -> Corpus:
    """Ids of real tokens must lie in [0, d_vocab); out-of-range ids at padded positions
    (e.g. a pad id of -1) are replaced by 0, which no real token ever sees."""
    real = corpus.tokens[corpus.mask]
    vocab = view.d_vocab
    if real.numel() and int(real.min()) < 0:
        raise ValueError(
            f"token id {int(real.min())} is negative: ids must lie in the model's vocabulary "
            f"of {vocab if vocab > 0 else 'its'} ids (0 … {vocab - 1 if vocab > 0 else 'd_vocab - 1'}); "
            "mark padding with attention_mask instead of a negative id"
        )
    if vocab > 0 and real.numel() and int(real.max()) >= vocab:
        raise ValueError(
            f"token id {int(real.max())} is outside the model's vocabulary of "
            f"{vocab}; tokenize with the model's tokenizer"
        )
    out_of_range = corpus.tokens < 0
    if vocab > 0:
        out_of_range |= corpus.tokens >= vocab
    bad_pad = ~corpus.mask & out_of_range
    if bool(bad_pad.any()):
        corpus = Corpus(tokens=corpus.tokens.masked_fill(bad_pad, 0), mask=corpus.mask)
    return corpus


def _check_hooks_exist(view: ModelView, needs: dict[int, set[str]],
                       readers: dict[int, list[Probe]]) -> None:
    for layer, kinds in sorted(needs.items()):
        for kind in sorted(kinds):
            name = view.hook_name(kind, layer)
            if view.has_hook(name):
                continue
            if kind == "pattern":
                raise PatternsNotExposedError(view.patterns_not_exposed_message(layer))
            who = [p.name for p in readers[layer]]
            raise ValueError(
                f"{view.name} does not expose the capture kind {kind!r} at layer {layer} (it "
                f"has no hook point {name!r}), which probes {who} ask for"
            )


def _hooked_points(view: ModelView, user_hooks: Sequence[tuple[Any, HookFn]]) -> set[int]:
    """ids of the hook points that hooks other than the runner's will edit in the pass: the
    user's ``fwd_hooks`` and hooks already attached to the model."""
    out: set[int] = set()
    hook_dict = getattr(view.model, "hook_dict", {})
    for name, _ in user_hooks:
        if isinstance(name, str) and name in hook_dict:
            out.add(id(hook_dict[name]))
        elif callable(name):
            out.update(id(hp) for n, hp in hook_dict.items() if name(n))
    for hp in hook_dict.values():
        # hooks added with add_hook / model.hooks(); permanent ones are often the model's own
        if any(not getattr(h, "is_permanent", False) for h in getattr(hp, "fwd_hooks", None) or []):
            out.add(id(hp))
    return out


def _validate_user_hooks(view: ModelView, fwd_hooks: Optional[Sequence]) -> list[tuple[Any, HookFn]]:
    hooks = list(fwd_hooks or [])
    for item in hooks:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1])):
            raise TypeError(
                f"fwd_hooks takes (hook_name, function) pairs as for run_with_hooks, got {item!r}"
            )
        name = item[0]
        if isinstance(name, str) and not view.has_hook(name):
            raise ValueError(f"fwd_hooks: the model has no hook point {name!r}")
        if not isinstance(name, str) and not callable(name):
            raise TypeError(f"fwd_hooks: a hook name must be a string or a name filter, got {name!r}")
    return [tuple(h) for h in hooks]  # type: ignore[misc]


#: id(model) -> (thread ident, depth) of the run_probes call holding the model. Entries are
#: removed when that call returns, so the ids never outlive their models here.
_RUNNING: dict[int, tuple[int, int]] = {}
_RUNNING_LOCK = threading.Lock()


def _one_run_per_model(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: the call holds its model (first argument) for its duration; another
    thread's call on the same model raises a one-line ``RuntimeError`` before it starts.
    The capture hooks live on the model, so two concurrent passes would each see the other's
    batches (and the first to finish would remove the other's hooks). The same thread may
    re-enter (e.g. from ``on_logits``)."""

    @functools.wraps(fn)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> Any:
        key = id(model.model if isinstance(model, ModelView) else model)
        me = threading.get_ident()
        with _RUNNING_LOCK:
            owner, depth = _RUNNING.get(key, (me, 0))
            if owner != me:
                raise RuntimeError(
                    f"run_probes: another thread is running probes on this model "
                    f"({type(model).__name__}); runs on one model must be sequential: use one "
                    "model per thread, or wait for the other run to finish")
            _RUNNING[key] = (me, depth + 1)
        try:
            return fn(model, *args, **kwargs)
        finally:
            with _RUNNING_LOCK:
                if depth:
                    _RUNNING[key] = (me, depth)
                else:
                    del _RUNNING[key]

    return wrapper


@renamed_arguments(data="tokens")
@_one_run_per_model
def run_probes(
    model: Any,
    tokens: Any,
    probes: Union[Probe, Iterable[Probe]],
    batch_size: int = 16,
    progress: Optional[bool] = None,
    *,
    attention_mask: Optional[Tensor] = None,
    distributed: Optional[bool] = None,
    check_finite: bool = True,
    fwd_hooks: Optional[Sequence[tuple[Any, HookFn]]] = None,
    return_logits: bool = False,
    on_logits: Optional[Callable[[int, Tensor], Any]] = None,
    accumulate: bool = False,
    check_patterns: bool = True,
) -> Any:
    """Run ``probes`` over ``tokens`` with one forward pass per batch; return their results.

    model: a TransformerLens model (or a :class:`ModelView`). tokens: the documents, as
    ``model.to_tokens`` gives them (a ``[n_docs, pos]`` id tensor) or a ``DocumentWindows``
    or a list of id sequences (see :func:`as_corpus`; ``data=`` is its deprecated name);
    lazy windows (:meth:`TokenFile.windows <tl_spectral.data.tokenfile.TokenFile.windows>`)
    are read batch by batch, never all at once; an ``ActivationCache`` of the model is
    handed to :func:`run_probes_on_cache`.

    Passes: a probe whose ``next_pass()`` returns True after a pass (its states already
    reduced across processes) gets another pass over the same corpus — e.g.
    ``AttentionFieldProbe(streaming=True)``, which fixes its band windows after the first.
    Returns ``{probe.name: probe.result()}``, always; :func:`run_probes_with_logits` also
    returns the logits. progress: a progress bar over the batches (None: shown on a
    terminal or in a notebook once the run takes more than 2 s; see
    :func:`tl_spectral.progress.progress_bar`).

    State: each call starts its probes fresh (:meth:`Probe.reset`). ``accumulate=True``
    adds this corpus to what the probes already hold instead (their documents numbered
    after the ones seen before, as if the corpora were one); :meth:`Probe.merge` combines
    probes run apart (e.g. on shards).

    Your hooks in the same pass: ``fwd_hooks=[(hook_name, fn), ...]`` as for
    ``model.run_with_hooks``; they run on every real batch (no other pass happens) and, on a
    hook point the runner also reads, before its capture: probes see the tensors your hooks
    return. With hooks past the last layer the probes need (or a name filter), the pass runs
    to the end instead of stopping early.

    Logits: :func:`run_probes_with_logits` returns them with the results
    (``return_logits=True`` here is its deprecated spelling, returning ``ProbeRun(results,
    logits)``); ``on_logits(start, logits)`` receives each batch's ``[batch, pos, d_vocab]``
    logits on the model's device (``start``: corpus index of the batch's first document;
    trailing padding columns trimmed), so they never pile up in memory. Padded positions hold
    zeros.

    Checks, inside the real pass: every needed hook fires (a model whose attention is fused
    raises :class:`PatternsNotExposedError`); rows of real queries of each captured pattern
    are finite (``check_finite``) and sum to 1 (``check_patterns``; pass False to run probes
    on patterns your hooks edited). ``check_finite=False`` skips both.

    ``distributed``: None = automatic (used when ``torch.distributed`` is initialised with
    more than one process). Each process then runs its contiguous shard of the corpus and
    the probe states are reduced across processes before the results are built, so every
    rank returns the whole-corpus results.

    Threads: runs on one model must be sequential (the hooks live on the model); a call
    while another thread runs probes on the same model raises ``RuntimeError``. Use one
    model per thread.
    """
    # Long on purpose: the public entry (checks, the pass loop with extra passes for streaming
    # probes, the logits); each step inside is a helper already.
    if return_logits and not isinstance(return_logits, _KeepLogits):
        warn_deprecated("run_probes(..., return_logits=True)",  # 5: past the decorators
                        "logits, results = run_probes_with_logits(...)", stacklevel=5)
    data = tokens
    view = model if isinstance(model, ModelView) else ModelView(model)
    batch_size = check_count("batch_size", batch_size)
    if hasattr(data, "cache_dict"):  # an ActivationCache: no pass to run
        if fwd_hooks or return_logits or on_logits is not None:
            raise ValueError(
                "data is an ActivationCache: there is no forward pass for fwd_hooks or logits; "
                "pass the tokens instead, or drop those arguments"
            )
        return run_probes_on_cache(data, probes, model=view, attention_mask=attention_mask,
                                   accumulate=accumulate, check_finite=check_finite,
                                   check_patterns=check_patterns)
    user_hooks = _validate_user_hooks(view, fwd_hooks)
    data, attention_mask = with_padding(view, data, attention_mask, "run_probes")
    corpus = as_corpus(data, attention_mask)
    if corpus.length > view.n_ctx:
        raise ValueError(
            f"documents of {corpus.length} tokens are longer than the model's context "
            f"of {view.n_ctx}; pass windows of at most {view.n_ctx} tokens"
        )
    if isinstance(corpus, Corpus):
        corpus = _check_token_ids(view, corpus)
    probe_list, needs, readers = _plan(view, probes, accumulate)
    _check_hooks_exist(view, needs, readers)
    offsets = {id(p): p.docs_seen for p in probe_list}
    for p in probe_list:
        p.begin(len(corpus), corpus.length)
    want_logits = bool(return_logits) or on_logits is not None
    edited = _hooked_points(view, user_hooks)

    if distributed is None:
        distributed = (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        )
    lo, hi = 0, len(corpus)
    if distributed:
        lo, hi = shard_range(len(corpus), torch.distributed.get_rank(), torch.distributed.get_world_size())

    underflow: dict[int, Tensor] = {}
    kept: list[tuple[int, Tensor]] = []
    active = probe_list
    n_pass = 0
    while True:
        last_layer = max(needs) if needs else -1
        stop_early = not want_logits and all(
            (lay := _hook_layer(name)) is not None and lay < last_layer for name, _ in user_hooks
        )
        plan = _PassPlan(needs=needs, readers=readers, last_layer=last_layer,
                         check_finite=check_finite, check_patterns=check_patterns,
                         underflow=underflow, user_hooks=user_hooks, stop_early=stop_early,
                         want_logits=want_logits, edited=edited, offsets=offsets)
        starts = range(lo, hi, batch_size)
        iterator: Iterable[int] = starts
        if progress is not False:
            from tl_spectral.progress import progress_bar

            desc = f"probes ({', '.join(p.name for p in active)})"
            if n_pass:
                desc += f", pass {n_pass + 1}"
            iterator = progress_bar(starts, desc=desc, unit="batch", total=len(starts),
                                    enabled=progress)

        for start in iterator:
            stop = min(start + batch_size, hi)
            tokens, mask = corpus.batch(start, stop)
            if not isinstance(corpus, Corpus):
                tokens = _check_token_ids(view, Corpus(tokens=tokens, mask=mask)).tokens
            # trim trailing all-padding columns of this batch
            T_b = int(mask.sum(dim=1).max())
            tokens, mask = tokens[:, :T_b], mask[:, :T_b]
            doc_index = torch.arange(start, stop, device=view.device)
            logits = _run_batch(view, tokens, mask, doc_index, plan)
            if logits is not None:
                if on_logits is not None:
                    on_logits(start, logits)
                if return_logits:
                    kept.append((start - lo, logits.cpu()))
        if distributed:
            for p in active:
                reduce_state(p)
        again = [p for p in active if callable(getattr(p, "next_pass", None)) and p.next_pass()]
        if not again:
            break
        # another pass over the same corpus for the probes that ask for it (no logits: the
        # first pass delivered them)
        active, n_pass, want_logits = again, n_pass + 1, False
        needs, readers = {}, {}
        for p in active:
            for layer, kinds in p.requires(view).items():
                needs.setdefault(layer, set()).update(kinds)
                readers.setdefault(layer, []).append(p)
    _warn_underflow(view, underflow)

    for p in probe_list:
        p._docs_seen = p.docs_seen + len(corpus)
    release_free_heap()  # the pass's freed buffers back to the system before the results
    results = {p.name: p.result() for p in probe_list}
    if not return_logits:
        return results
    all_logits = None
    if kept:
        vocab = kept[0][1].shape[-1]
        all_logits = torch.zeros(hi - lo, corpus.length, vocab, dtype=kept[0][1].dtype)
        for i, lg in kept:
            all_logits[i : i + lg.shape[0], : lg.shape[1]] = lg
    return ProbeRun(results, all_logits)


@renamed_arguments(data="tokens")
def run_probes_with_logits(
    model: Any,
    tokens: Any,
    probes: Union[Probe, Iterable[Probe]],
    batch_size: int = 16,
    progress: Optional[bool] = None,
    *,
    attention_mask: Optional[Tensor] = None,
    distributed: Optional[bool] = None,
    check_finite: bool = True,
    fwd_hooks: Optional[Sequence[tuple[Any, HookFn]]] = None,
    accumulate: bool = False,
    check_patterns: bool = True,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`run_probes` that also returns the model's logits: ``logits, results``, in the
    order of TransformerLens' ``logits, cache = model.run_with_cache(tokens)``.

    logits: ``[n_docs, pos, d_vocab]`` on the CPU, every document in corpus order (this
    process's shard under ``torch.distributed``), zero at padded positions; every batch runs
    to the end. results: ``{probe.name: Result}`` as :func:`run_probes` returns. The
    arguments are :func:`run_probes`' (to receive each batch's logits on the model's device
    instead of keeping them all, pass ``on_logits=`` to :func:`run_probes`).
    """
    results, logits = _run_probes_kept_logits(
        model, tokens, probes, batch_size, progress, attention_mask=attention_mask,
        distributed=distributed, check_finite=check_finite, fwd_hooks=fwd_hooks,
        accumulate=accumulate, check_patterns=check_patterns)
    return logits, results


def _run_probes_kept_logits(*args: Any, **kwargs: Any) -> "ProbeRun":
    """``run_probes(..., return_logits=True)`` without its deprecation warning."""
    return run_probes.__wrapped__(*args, return_logits=_KEEP_LOGITS, **kwargs)


class _KeepLogits(int):
    """The runner's own truthy ``return_logits`` (not the user's deprecated ``True``)."""


_KEEP_LOGITS = _KeepLogits(1)


def run_probes_on_cache(
    cache: Any,
    probes: Union[Probe, Iterable[Probe]],
    *,
    model: Any = None,
    attention_mask: Optional[Tensor] = None,
    tokens: Optional[Tensor] = None,
    accumulate: bool = False,
    check_finite: bool = True,
    check_patterns: bool = True,
) -> dict[str, Any]:
    """Compute ``probes`` from an ``ActivationCache`` you already hold; same results as
    :func:`run_probes` on the tokens of the cache (run as one batch).

    cache: from ``model.run_with_cache(tokens)`` (or a ``{hook_name: tensor}`` dict); it must
    hold every hook the probes need (``ModelView(model).hook_name(kind, layer)``; a cache
    built with ``names_filter`` that lacks some gets an error listing them). model: the
    model (or ModelView) that produced it; default ``cache.model``. attention_mask:
    ``[batch, pos]`` (1 = real token) when the cached batch is right-padded; pass the same
    mask the model ran with. tokens: the ``[batch, pos]`` token ids, stored by probes
    that keep them (e.g. ContributionProbe's ``keep_docs``; −1 when not given) and, without
    a mask, read for padding as :func:`run_probes` does. With neither, the padding is read
    from the cache's ``hook_embed`` (positions holding the pad token's embedding), with the
    same :class:`PaddingInferredWarning`; a cache without ``hook_embed`` gets a
    :class:`PaddingUnknownWarning` (every position counted as a token).
    accumulate, check_finite, check_patterns: as for :func:`run_probes`.
    """
    # Long on purpose: the cache's checks (its model, the hooks the probes read, mask and
    # tokens against the cache's shape), then the same per-layer feed as run_probes.
    if model is None:
        model = getattr(cache, "model", None)
        if model is None:
            raise ValueError("this cache does not name its model; pass model=")
    view = model if isinstance(model, ModelView) else ModelView(model)
    probe_list, needs, readers = _plan(view, probes, accumulate)
    entries = getattr(cache, "cache_dict", cache)
    batched = bool(getattr(cache, "has_batch_dim", True))
    wanted = [(layer, kind, view.hook_name(kind, layer))
              for layer, kinds in sorted(needs.items()) for kind in sorted(kinds)]
    missing = [name for _, _, name in wanted if name not in entries]
    if missing:
        pats = [n for n in missing if n.endswith("hook_pattern")]
        hint = (" (a model with fused / SDPA attention never fills hook_pattern: load it with "
                "eager attention)") if pats else ""
        raise KeyError(
            f"the cache lacks {missing}, which the probes {[p.name for p in probe_list]} read; "
            f"run the model with run_with_cache(tokens, names_filter={missing!r} + …) or "
            f"without names_filter{hint}"
        )
    def get(name: str) -> Tensor:
        t = entries[name]
        return t if batched else t.unsqueeze(0)

    first_layer, first_kind, first_name = wanted[0]
    t0 = get(first_name)
    B = int(t0.shape[0])
    T = int(t0.shape[-1] if first_kind == "pattern" else t0.shape[1])
    device = t0.device
    if attention_mask is None and tokens is None:
        attention_mask = _cache_padding(view, entries, batched, B, T)
    if attention_mask is None and tokens is not None:
        tokens = numpy_ids_as_tensor(tokens)
        if isinstance(tokens, Tensor) and tokens.dim() == 2 and tuple(tokens.shape) == (B, T):
            _, attention_mask = infer_padding(view, tokens.long(), what="run_probes_on_cache",
                                              shift=False)
    if attention_mask is None:
        mask = torch.ones(B, T, dtype=torch.bool)
    else:
        if tuple(attention_mask.shape) != (B, T):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} differs from the cache's "
                f"batch of {B} x {T} positions"
            )
        mask = mask_bool(attention_mask).cpu()
        check_right_padded(mask)
    if tokens is None:
        tok = torch.full((B, T), -1, dtype=torch.long)
    else:
        tok = torch.as_tensor(tokens).long()
        if tok.dim() == 1:
            tok = tok.unsqueeze(0)
        if tuple(tok.shape) != (B, T):
            raise ValueError(f"tokens shape {tuple(tok.shape)} differs from the cache's {B} x {T}")
    offsets = {id(p): p.docs_seen for p in probe_list}
    for p in probe_list:
        p.begin(B, T)
    ctx = _BatchContext(view, mask, tok, device, check_finite=check_finite,
                        check_patterns=check_patterns, edited=set(), underflow={},
                        dtype=t0.dtype)
    doc_index = torch.arange(B, device=device)
    for layer, kinds in sorted(needs.items()):
        cap = ctx.new_capture(layer, doc_index)
        for kind in kinds:
            setattr(cap, kind, ctx.prepare(kind, layer, get(view.hook_name(kind, layer)).to(device),
                                           hooked=False))
        _update(readers[layer], cap, offsets)
    _warn_underflow(view, ctx.underflow)
    for p in probe_list:
        p._docs_seen = p.docs_seen + B
    return {p.name: p.result() for p in probe_list}


class PaddingUnknownWarning(UserWarning):
    """A cached batch of several rows, passed without ``tokens`` or ``attention_mask``, whose
    padding cannot be read from the cache: every position is taken as a real token."""


def _cache_padding(view: ModelView, entries: Any, batched: bool, B: int,
                   T: int) -> Optional[Tensor]:
    """The padding of a cached batch passed without ``tokens`` or ``attention_mask``, inferred
    as :func:`run_probes` infers it from tokens (:func:`infer_padding`, with its warning): the
    pad-id positions are those where the cache's ``hook_embed`` is the pad token's embedding
    (the row of ``W_E``, exactly). Without ``hook_embed`` (a ``names_filter`` cache) a
    :class:`PaddingUnknownWarning` says the padding could not be checked. Nothing is done
    for one row or a model whose tokenizer has no special pad id (as in run_probes)."""
    tok = getattr(view.model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    added = getattr(tok, "added_tokens_decoder", None) or {}
    if B < 2 or not isinstance(pad, int) or not getattr(added.get(pad), "special", False):
        return None
    emb = entries["hook_embed"] if "hook_embed" in entries else None
    W_E = getattr(view.model, "W_E", None)
    if emb is not None and not batched:
        emb = emb.unsqueeze(0)
    if emb is None or not isinstance(W_E, Tensor) or tuple(emb.shape[:2]) != (B, T) \
            or not 0 <= pad < W_E.shape[0] or emb.shape[-1] != W_E.shape[-1]:
        warnings.warn(
            f"run_probes_on_cache: a batch of {B} rows without tokens= or attention_mask=, "
            "and a cache without hook_embed to read the padding from: every position is "
            "taken as a real token. Pass attention_mask (1 = real token; torch.ones(batch, "
            "pos) if nothing is padded) or tokens= (the padding is then inferred)",
            PaddingUnknownWarning, stacklevel=3)
        return None
    row = W_E[pad].detach().to(emb.device, emb.dtype)
    is_pad = (emb.detach() == row).all(dim=-1)
    proxy = torch.where(is_pad, pad, -1).long().cpu()  # the pad id where the cache shows it
    _, mask = infer_padding(view, proxy, what="run_probes_on_cache (padding read from the "
                            "cache's hook_embed)", shift=False)
    return mask


def _update(readers: list[Probe], cap: LayerCapture, offsets: dict[int, int]) -> None:
    for p in readers:
        off = offsets.get(id(p), 0)
        p.update(cap if not off else replace(cap, doc_index=cap.doc_index + off))


class _BatchContext:
    """Per-batch state of the capture hooks: masks, tolerances, checks, underflow counts."""

    def __init__(self, view: ModelView, mask: Tensor, tokens: Tensor, device: torch.device, *,
                 check_finite: bool, check_patterns: bool, edited: set[int],
                 underflow: Optional[dict[int, Tensor]], dtype: Optional[torch.dtype] = None):
        self.view = view
        self.device = device
        self.mask = mask.to(device)
        self.tokens = tokens.to(device)
        self.padless = bool(mask.all())
        self.model_dtype = view.dtype if dtype is None else dtype
        self.check_finite = check_finite
        self.check_patterns = check_patterns
        self.edited = edited
        self.underflow = underflow
        # rows of a softmax in the model's dtype sum to 1 within a few of its epsilons per term
        self.row_tol = max(1e-3, view.tolerance)
        self.allowed: Optional[Tensor] = None
        if self.model_dtype in HALF_DTYPES and underflow is not None:
            T_b = tokens.shape[1]
            allowed = self.mask[:, None, :, None] & self.mask[:, None, None, :]
            if view.causal:
                allowed = allowed & torch.ones(T_b, T_b, dtype=torch.bool, device=device).tril()
            self.allowed = allowed

    def _layer_allowed(self, layer: int) -> Tensor:
        """``allowed`` cut to the layer's sliding window (:func:`layer_windows`)."""
        assert self.allowed is not None
        if getattr(self, "_windows", None) is None:
            self._windows = layer_windows(self.view)
        w = self._windows[layer]
        if w is None or w >= self.allowed.shape[-1]:
            return self.allowed
        T_b = self.allowed.shape[-1]
        return self.allowed & window_allowed(T_b, w, device=self.allowed.device)

    def new_capture(self, layer: int, doc_index: Tensor) -> LayerCapture:
        return LayerCapture(layer=layer, mask=self.mask, tokens=self.tokens,
                            doc_index=doc_index, model_dtype=self.model_dtype)

    def prepare(self, kind: str, layer: int, t: Tensor, hooked: bool) -> Tensor:
        """Detach, count underflow, cast to the analysis dtype, repeat kv heads, check rows."""
        x = t.detach()
        if kind == "pattern" and self.allowed is not None and self.underflow is not None:
            # exact zeros where the model could attend (inside a sliding-window layer's
            # window): underflow in its own softmax
            allowed = self._layer_allowed(layer)
            n_zero = ((x == 0) & allowed).sum()
            n_all = allowed.sum() * x.shape[1]
            prev = self.underflow.get(layer)
            cur = torch.stack([n_zero, n_all]).double()
            self.underflow[layer] = cur if prev is None else prev + cur
        if x.dtype != analysis_dtype(x.dtype):
            x = x.to(analysis_dtype(x.dtype))  # half precision: analyses in float32
        if kind in ("k", "v"):
            x = self.view.repeat_kv(x, 2)
        if kind == "pattern" and self.check_finite:
            self._check_rows(layer, x, hooked)
        return x

    def _check_rows(self, layer: int, x: Tensor, hooked: bool) -> None:
        # rows of real queries must be finite and sum to 1 (one cheap reduction);
        # catches NaN/inf and backends that silently zero NaN rows
        rows = x.sum(-1)  # [b, h, q]
        ok = torch.isfinite(rows)
        if self.check_patterns:
            ok &= (rows - 1.0).abs() < self.row_tol
        bad = ~ok
        if not self.padless:
            bad &= self.mask[:, None, :]
        if not bool(bad.any()):
            return
        dt = str(self.model_dtype).replace("torch.", "")
        what = (f"NaN, inf or do not sum to 1 within {self.row_tol:.1e} (model dtype {dt})"
                if self.check_patterns else "NaN or inf")
        name = self.view.hook_name("pattern", layer)
        if hooked:
            raise FloatingPointError(
                f"layer {layer}: a hook edited the attention pattern ({name}): rows at real "
                f"positions are {what}, so they are no longer a softmax. Probes read the "
                "pattern after your hooks; pass check_patterns=False to run them on the "
                "edited pattern anyway"
                + ("" if self.check_patterns else " (check_finite=False also lets NaN and inf through)")
            )
        raise FloatingPointError(
            f"layer {layer}: attention pattern rows at real positions are {what}; check the "
            "model's weights and the input tokens (or, if a hook on "
            f"{name} edits the pattern on purpose, pass check_patterns=False)"
        )


@dataclass
class _PassPlan:
    """What every batch of one pass over the corpus shares: the captures (layer -> kinds)
    and their readers, the checks, the user's hooks, the logits wanted."""

    needs: dict[int, set[str]]
    readers: dict[int, list[Probe]]
    last_layer: int
    check_finite: bool
    check_patterns: bool = True
    underflow: Optional[dict[int, Tensor]] = None
    user_hooks: Sequence[tuple[Any, HookFn]] = ()
    stop_early: bool = True
    want_logits: bool = False
    edited: set[int] = field(default_factory=set)
    offsets: dict[int, int] = field(default_factory=dict)


def _run_batch(view: ModelView, tokens: Tensor, mask: Tensor, doc_index: Tensor,
               plan: _PassPlan) -> Optional[Tensor]:
    """One forward pass over a batch with the capture hooks (after ``plan.user_hooks``);
    returns the logits when ``plan.want_logits``."""
    needs, readers, last_layer = plan.needs, plan.readers, plan.last_layer
    stop_early, want_logits, offsets = plan.stop_early, plan.want_logits, plan.offsets
    captures: dict[int, LayerCapture] = {}
    freed = [0]  # pattern bytes captured since the last heap trim (heap.note_freed)
    pending = {layer: set(kinds) for layer, kinds in needs.items()}
    device = view.device
    ctx = _BatchContext(view, mask, tokens, device, check_finite=plan.check_finite,
                        check_patterns=plan.check_patterns, edited=plan.edited,
                        underflow=plan.underflow)
    doc_index = doc_index.to(device)
    hook_dict = getattr(view.model, "hook_dict", {})

    def make_hook(layer: int, kind: str):
        name = view.hook_name(kind, layer)
        hooked = name in hook_dict and id(hook_dict[name]) in ctx.edited

        def hook(t: Tensor, hook: Any = None) -> Tensor:
            cap = captures.get(layer)
            if cap is None:
                cap = captures[layer] = ctx.new_capture(layer, doc_index)
            setattr(cap, kind, ctx.prepare(kind, layer, t, hooked))
            pending[layer].discard(kind)
            if not pending[layer]:
                _update(readers[layer], cap, offsets)
                del captures[layer]
                if cap.pattern is not None:  # its T × T buffers are freed: trim now and then
                    note_freed(freed, cap.pattern.numel() * cap.pattern.element_size())
                if stop_early and layer == last_layer and not any(pending.values()):
                    raise StopForward
            return t

        return hook

    # the user's hooks first: on a shared hook point TransformerLens runs hooks in the
    # order they were added, so the captures see what the user's hooks return
    fwd_hooks = list(plan.user_hooks) + [
        (view.hook_name(kind, layer), make_hook(layer, kind))
        for layer, kinds in sorted(needs.items())
        for kind in kinds
    ]
    # Causal decoders with right padding need no mask (real tokens never see the pad);
    # bidirectional encoders must mask padded keys.
    attn_mask = None if (view.causal or bool(mask.all())) else mask.long()
    out = None
    try:
        with torch.no_grad():
            out = view.run(tokens, attention_mask=attn_mask, fwd_hooks=fwd_hooks,
                           return_type="logits" if want_logits else None)
    except StopForward:
        pass
    if any(pending.values()):
        missing = {layer: sorted(k) for layer, k in pending.items() if k}
        for layer in sorted(missing):
            if "pattern" in missing[layer]:
                raise PatternsNotExposedError(view.patterns_not_exposed_message(layer))
        names = [view.hook_name(k, layer) for layer, ks in sorted(missing.items()) for k in ks]
        raise RuntimeError(
            f"the forward pass never produced {missing}: the hook points {names} exist but "
            "never fired, so the model does not expose these captures"
        )
    if want_logits and isinstance(out, Tensor):
        out = out.detach()
        if not ctx.padless:  # padded positions: zero, not the logits of the pad token
            out = out.masked_fill(~ctx.mask[..., None], 0)
        return out
    return None


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
