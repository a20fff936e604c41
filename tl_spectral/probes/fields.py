"""AttentionFieldProbe: attention fields of an ensemble of documents, in lag coordinates.

Per layer it streams the head-mean field ``A_s(i, j)`` (or every head's, on request) of each
document ``s`` into lag coordinates (SPEC A.3; causal ``tau = i - j``, bidirectional
``tau = j - i``), truncated to ``max_lag``, in float32. It keeps

- a running sum per (query, lag) for the ensemble mean (the Reynolds split) — causal: its
  triangle ``τ ≤ i`` only, ``T(T + 1)/2`` values with every lag — with the pair counts of
  padded batches (full windows are counted by length, ``n_full``, and their counts formed
  in :meth:`AttentionFieldProbe.result`), and
- the per-document lag fields (a "cat" state), so fluctuations ``u_s = A_s - Ā`` are
  formed once at the end.

N = 1,000 documents at T = 256 with all 256 lags is 262 MB per layer (float32): the state
grows linearly in N (docs/probes.md, "Memory: how each probe grows"). Padded positions
never enter the mean, and their fluctuation is set to zero (no energy).

``streaming=True`` keeps instead statistics whose size does not grow with N (see
:mod:`tl_spectral.analysis.streaming_pod` and docs/scale_pod.md, "Corpora larger than
memory"): two passes over the corpus (``run_probes`` makes both) — the first accumulates the
mean, the lag second moment (scalogram, dominant scales, band windows), the coherence
cross-spectrum and the whole field's rank-capped factors; the second the band snapshots'
factors under the windows the first pass fixed. Every POD's factors and buffered windows
share one preallocated buffer folded in place
(:class:`~tl_spectral.analysis.streaming_pod.FactorBuffer`), over the field's valid entries
only (causal: ``τ ≤ i``, :mod:`tl_spectral.probes.field_stream`): memory set by the rank cap
and ``fold_every``, not by N. Its result, :class:`StreamedAttentionFields`, offers the same
``.scale_pod(...)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral.analysis.scale_pod import lag_fields
from tl_spectral.analysis.scale_pod_options import ScalePODOptions
from tl_spectral.checks import check_int, is_int
from tl_spectral.probes import shared
from tl_spectral.probes.base import LayerCapture, Probe, merge_tensor
from tl_spectral.probes.pair_fields import needs_values, pair_field
from tl_spectral.results import Result, register_result
from tl_spectral.types import FieldKind


def _lag_fields(A: Tensor, *, causal: bool, max_lag: Optional[int]) -> tuple[Tensor, Tensor]:
    """:func:`~tl_spectral.analysis.scale_pod.lag_fields`, the causal case by a skewed copy
    instead of a gather (same values: data movement only; several times faster at T = 1,024).

    Row ``i`` of ``A`` flipped (``R_i[m] = A[i, T − 1 − m]``) and followed by ``T`` zeros,
    read with row stride ``2T − 1`` from offset ``T − 1``: entry ``(i, τ)`` is
    ``R_i[T − 1 − i + τ] = A[i, i − τ]``, and the zeros where ``τ > i``."""
    T = int(A.shape[-1])
    if not causal or A.ndim < 2 or A.shape[-2] != T or T < 2:
        return lag_fields(A, causal=causal, max_lag=max_lag)
    L = T - 1 if max_lag is None else int(max_lag)
    if not 0 <= L <= T - 1:
        return lag_fields(A, causal=causal, max_lag=max_lag)  # its error message
    lead = A.shape[:-2]
    n = 1
    for x in lead:
        n *= int(x)
    X = torch.zeros(n, T, 2 * T, dtype=A.dtype, device=A.device)
    X[:, :, :T] = A.reshape(n, T, T).flip(-1)
    F = X.as_strided((n, T, L + 1), (2 * T * T, 2 * T - 1, 1), T - 1).clone()
    return F.reshape(*lead, T, L + 1), torch.arange(0, L + 1)


def _causal_mean_lag_field(p: Tensor, max_lag: Optional[int]) -> tuple[Tensor, Tensor]:
    """``_lag_fields(p.mean(1), causal=True, max_lag)`` of a causal pattern ``p [b, H, T, T]``
    with standard strides, without forming the ``T × T`` head mean: ``F[b, i, τ] = mean_h
    p[b, h, i, i − τ]`` (0 where ``τ > i``), ``[b, T, L + 1]``, and the lags.

    Per block of query rows ``a … e − 1`` (:func:`tl_spectral.probes.shared.query_blocks`),
    row ``i`` of every head read from ``e − 1`` entries before its diagonal (stride
    ``T + 1`` between rows) holds ``p[i, i − τ]`` at column ``e − 1 − τ`` (where ``τ > i``
    the view reaches into the zero upper triangle of row ``i − 1``): only the lower
    triangle is read, half of what the head mean reads. The first block (``a = 0``), which
    would reach before the tensor, goes through :func:`_lag_fields` on its corner."""
    b, H, T, _ = p.shape
    L = T - 1 if max_lag is None else int(max_lag)
    F = torch.zeros(b, T, T, dtype=p.dtype, device=p.device)
    for a, e, _ in shared.query_blocks(T, True):
        for d in range(b):
            pd = p[d]
            if a == 0:
                F[d, :e, :e] = _lag_fields(pd[:, :e, :e].mean(0), causal=True, max_lag=None)[0]
                continue
            rows = pd.as_strided((H, e - a, e), (T * T, T + 1, 1),
                                 pd.storage_offset() + a * (T + 1) - (e - 1))
            F[d, a:e, :e] = rows.mean(0).flip(-1)
    return F[..., : L + 1], torch.arange(0, L + 1)


@functools.lru_cache(maxsize=4)
def _tri_mask(T: int, n_lags: int, device: torch.device) -> Tensor:
    """``[T, n_lags]`` bool, True at ``τ ≤ i`` (see :meth:`AttentionFieldProbe._tri`)."""
    i = torch.arange(T, device=device)[:, None]
    return torch.arange(n_lags, device=device)[None, :] <= i


@register_result
@dataclass
class AttentionFields(Result):
    """Lag-coordinate attention fields of every captured layer.

    fields: ``{str(layer): [N, T, n_lags]}`` raw lag fields F_s(i, tau) (per-head:
      ``[N, head, T, n_lags]``); mean: ``{str(layer): [T, n_lags]}`` ensemble mean over real
      positions; doc_mask: ``[N, T]`` 1 at real tokens; lags: ``[n_lags]``;
      field: which per-pair field (:data:`~tl_spectral.probes.pair_fields.FIELD_KINDS`).
    """

    kind: ClassVar[str] = "attention_fields"
    main_plot: ClassVar[str | None] = "plot_mean"
    array_shapes = {
        "fields": "float[doc, head, pos, lag] if per_head else float[doc, pos, lag]",
        "mean": "float[head, pos, lag] if per_head else float[pos, lag]",
        "doc_mask": "int[doc, pos] | bool[doc, pos]", "lags": "int[lag]",
    }

    fields: dict
    mean: dict
    doc_mask: Tensor
    lags: Tensor
    layers: list = field(default_factory=list)
    causal: bool = True
    per_head: bool = False
    model_name: str = ""
    field: str = "attention"

    @property
    def n_docs(self) -> int:
        """The number of documents the fields were captured from."""
        return int(self.doc_mask.shape[0])

    def fluctuations(self, layer: int) -> Tensor:
        """``F_s - F̄`` of ``layer``: ``[N, T, n_lags]``; zero at padded queries and at lags that
        reach before the first token (causal) or past the end."""
        F = self.fields[str(layer)]
        mean = self.mean[str(layer)]
        u = F - mean
        m = self.doc_mask.to(F.dtype)
        if self.per_head:
            m = m[:, None]
        u = u * m[..., None]
        # keys outside the document: lag_fields wrote 0 there for every document
        T = F.shape[-2]
        i = torch.arange(T)[:, None]
        j = i - self.lags[None, :] if self.causal else i + self.lags[None, :]
        inside = ((j >= 0) & (j < T)).to(F.dtype)
        return u * inside

    def scale_pod(self, n_heads: int | Sequence[int], *,
                  options: Optional[ScalePODOptions] = None, **kwargs: Any):
        """Scale-selective POD of every layer (see :func:`tl_spectral.analysis.scale_pod.scale_pod`);
        per-head fields get :func:`~tl_spectral.analysis.scale_pod.scale_pod_heads` (every head;
        ``n_heads`` unused). options: a :class:`ScalePODOptions`; other keyword arguments
        (``head_budget``, ``n_modes``, ``coherence_queries``; per head ``head_chunk``, ...)
        go to those functions."""
        from tl_spectral.analysis.scale_pod import scale_pod, scale_pod_heads

        options = ScalePODOptions.of(options, ScalePODOptions.split(kwargs),
                                     "AttentionFields.scale_pod")
        if self.n_docs < 2:
            raise ValueError(f"POD needs at least 2 documents, the ensemble has {self.n_docs}")
        fl = [self.fluctuations(layer) for layer in self.layers]
        if self.per_head:
            return scale_pod_heads(fl, self.lags, layer_ids=self.layers, options=options,
                                   **kwargs)
        return scale_pod(fl, self.lags, n_heads=n_heads, layer_ids=self.layers, options=options,
                         **kwargs)

    def plot_mean(self):
        """Mean lag profile per layer: ``Σ_i F̄(i, tau)`` against ``tau``."""
        return self._draw("plot_mean")


class AttentionFieldProbe(Probe):
    """Capture lag-coordinate attention fields of each document.

    layers: layers to capture (default all). field: the per-pair map captured (default
    ``"attention"``; ``"contribution"`` (inter-head), ``"contribution_intra"``,
    ``"value_weighted"``, ``"value_weighted_raw"``: see :mod:`tl_spectral.probes.pair_fields`
    for definitions and normalisation), in the same forward pass as every other probe; the
    default probe name is ``"attention_fields"`` for attention and ``"<field>_fields"``
    otherwise. per_head: keep each head's field instead of the head-combined one (the head
    mean; for ``"contribution"`` the head sum ``C_ij``, whose rows sum to 1).
    max_lag: largest |lag| kept (default T − 1: all lags). offload: keep the
    per-document fields (the large state) in CPU memory instead of on the model's device
    (default False: every state stays on the model's device; the result is on the CPU).
    """

    name = "attention_fields"
    def __init__(self, layers: Optional[Sequence[int]] = None, *, per_head: bool = False,
                 max_lag: Optional[int] = None, name: Optional[str] = None,
                 offload: bool = False, field: FieldKind = "attention", streaming: bool = False,
                 rank: int = 128, n_modes: int = 8, fold_every: int = 128,
                 options: Optional[ScalePODOptions] = None,
                 coherence_queries: int | Sequence[int] | None = 16, jackknife_groups: int = 8,
                 jackknife_seed: int = 0, band_options: Optional[dict] = None):
        """field: the per-pair map captured (see :mod:`tl_spectral.probes.pair_fields`).
        streaming: keep constant-memory statistics instead of every document's field (two
        passes; full windows only, head mean only). rank: the rank cap K of every streamed
        POD (whole field and bands): eigenvalues beyond K are not kept; ``H*`` is exact, or
        bounds (``lo–hi``, ``≥ lo``, ``> K``) when the cap dropped energy. n_modes: modes
        kept per POD in the result. fold_every: documents
        buffered before a factor update (larger: faster, ``fold_every × d`` floats more per
        POD, ``d`` the field's valid entries: ``T(T + 1)/2`` causal with every lag). options (streaming only): the :class:`ScalePODOptions` whose band
        settings (``scales``, ``wavelet``, ``max_dominant``, ``min_ratio``,
        ``min_peak_fraction``, ``window_threshold``, ``lag_window``) choose the band windows
        before the second pass (``epsilon`` goes to the result's ``.scale_pod(options=...)``);
        coherence_queries (streaming only): the coherence's queries, as in
        :func:`~tl_spectral.analysis.scale_pod.scale_pod_layer`. band_options: the old dict
        of both (deprecated).
        jackknife_groups, jackknife_seed (streaming only): the second pass also keeps, per
        group of documents (:func:`~tl_spectral.analysis.streaming_pod.document_groups`),
        the whole field's second moments in the first pass's ``K`` POD directions — ``G (K² +
        K + d)`` floats per layer and one ``[b, d] × [d, K]`` product per batch — so the
        delete-a-group jackknife of H* and T_spec needs no per-document field
        (``streamed_pod_jackknife`` of viz/uncertainty.py); 0 turns it off."""
        super().__init__()
        self.field = field
        self._values = needs_values(field)  # validates the kind
        self._W: dict[int, Tensor] = {}
        if name is None and field != "attention":
            name = f"{field}_fields"
        self.offload = bool(offload)
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        self.per_head = per_head
        self.max_lag = max_lag
        if name is not None:
            self.name = name
        self.reductions = {"doc_mask": "cat", "doc_index": "cat"}
        self.streaming = bool(streaming)
        options, coherence_queries = _probe_options(options, coherence_queries, band_options)
        if self.streaming:
            if per_head:
                raise ValueError("streaming=True keeps the head-mean field only; pass per_head=False "
                                 "(or streaming=False for per-head fields)")
            check_int("rank", rank, minimum=1)
            check_int("n_modes", n_modes, minimum=0)
            check_int("fold_every", fold_every, minimum=1)
            self.options = options or ScalePODOptions()
            self.band_options = _band_dict(self.options, coherence_queries)
        elif options is not None or not _same_queries(coherence_queries, 16):
            raise ValueError("options and coherence_queries apply to streaming=True only; pass "
                             "them to the result's .scale_pod(options=ScalePODOptions(...)) "
                             "instead")
        if not (is_int(jackknife_groups) and jackknife_groups == 0):
            check_int("jackknife_groups", jackknife_groups, minimum=2,
                      what="0 (off) or an int >= 2", hint="0 or e.g. jackknife_groups=8")
        self.jackknife_groups = int(jackknife_groups)
        self.jackknife_seed = int(jackknife_seed)
        self._jk_group: Optional[Tensor] = None
        self._jk_basis: dict = {}
        self.rank = int(rank)
        self.n_modes = min(int(n_modes), self.rank)
        self.fold_every = int(fold_every)
        self._phase = 0
        self._pass1: dict = {}
        self._selection: dict = {}
        self._fb: dict = {}  # prefix -> FactorBuffer (the factor states, folded in place)
        self._ix: dict = {}  # layer -> the folded entries of its fields (field_stream)
        self._n_hint: Optional[int] = None

    def reset(self) -> None:
        super().reset()
        self._phase = 0
        self._pass1 = {}
        self._selection = {}
        self._jk_basis = {}
        self._fb, self._ix = {}, {}

    def requires(self, view) -> dict[int, set[str]]:
        if self.layers is None:
            self.layers = list(range(view.n_layers))
        for layer in self.layers:
            self.reductions[f"{layer}.fields"] = "cat"  # type: ignore[index]
            for part in ("full", *(f"band{m}" for m in range(8))):
                for key in ("W", "sums", "ns", "pending"):
                    self.reductions[f"{layer}.{part}.{key}"] = "cat"  # type: ignore[index]
        self._W = {}  # W_O is read from this run's model
        kinds = {"pattern", "v"} if self._values else {"pattern"}
        return {layer: set(kinds) for layer in self.layers}

    def _w_o(self, layer: int, device: torch.device) -> Optional[Tensor]:
        """The layer's ``W_O [head, d_head, d_model]`` on ``device`` (None for attention)."""
        if not self._values:
            return None
        W = self._W.get(layer)
        if W is None or W.device != device:
            assert self.view is not None
            W = self.view.weights(layer).W_O.to(device)
            self._W = {layer: W}  # the current layer's only
        return W

    def begin(self, n_docs: int, length: int) -> None:
        if self.max_lag is not None and self.max_lag > length - 1:
            raise ValueError(
                f"max_lag={self.max_lag} exceeds the document length {length} - 1; "
                f"pass max_lag <= {length - 1}"
            )
        self.length = length
        self._n_hint = int(n_docs)
        if self.streaming and self.jackknife_groups and n_docs >= 2:
            from tl_spectral.analysis.streaming_pod import document_groups

            grp = torch.zeros(int(n_docs), dtype=torch.long)
            for g, idx in enumerate(document_groups(n_docs, self.jackknife_groups,
                                                    self.jackknife_seed)):
                grp[idx] = g
            self._jk_group = grp
        else:
            self._jk_group = None

    def update(self, cap: LayerCapture) -> None:
        assert cap.pattern is not None and self.layers is not None and self.view is not None
        T = self.length
        mask = cap.mask
        p = cap.pattern
        b, H, T_b, K = p.shape
        if (self.field == "attention" and not self.per_head and self.view.causal and T_b == T
                and K == T and T > 1 and p.dtype in (torch.float32, torch.float64)
                and p.stride() == (H * T * T, T * T, T, 1) and bool(mask.all())):
            # full causal windows: the head mean in lag coordinates straight from the
            # pattern's lower triangle (the same values as the general path below)
            F, lags = _causal_mean_lag_field(p, self.max_lag)
        else:
            # the field A [b, (h,) q, k]; padded pairs are 0 (never count)
            A = pair_field(cap, self.field, W_O=self._w_o(cap.layer, cap.pattern.device),
                           per_head=self.per_head).float()
            T_b = A.shape[-1]
            if T_b < T:  # a batch whose trailing padding was trimmed: pad back to T
                pad = T - T_b
                A = torch.nn.functional.pad(A, (0, pad, 0, pad))
                mask = torch.nn.functional.pad(mask, (0, pad), value=False)
            F, lags = _lag_fields(A, causal=self.view.causal, max_lag=self.max_lag)
        # counts per (query, lag): a real query and a real key inside the document (and,
        # in a sliding-window layer, inside the layer's window: the lags it may attend to)
        window = self._window(cap.layer)
        if bool(mask.all()):  # full windows: every document's count is the same
            count = self._full_count(T, lags, F, window).expand(mask.shape[0], -1, -1)
        else:
            i = torch.arange(T, device=F.device)[:, None]
            lg = lags[None, :].to(F.device)
            j = i - lg if self.view.causal else i + lg
            inside = (j >= 0) & (j < T)
            if window is not None and self.view.causal:
                inside = inside & (lg < int(window))
            key_real = mask[:, j.clamp(0, T - 1)] & inside[None]  # [b, T, n_lags]
            count = (mask[:, :, None] & key_real).to(F.dtype)
        layer = cap.layer
        if self.streaming:  # constant-memory statistics instead of every document's field
            self._stream(layer, F, mask, count, cap.doc_index)
            return
        if self.view.causal:  # the causal lag field's sum is 0 above its diagonal: keep the
            S = F.sum(dim=0)  # [(head,) T, n_lags] → [(head,) T(T + 1)/2] (full lags)
            self._keep(f"{layer}.sum_tri", S.masked_select(self._tri(F)).reshape(
                *S.shape[:-2], -1))
            del S
        else:
            self.accumulate(f"{layer}.sum", F.sum(dim=0))
        if bool(mask.all()):  # full windows: their count is n · _full_count, formed in result()
            n_full = torch.zeros(T, dtype=torch.float64, device=F.device)
            n_full[T - 1] = float(mask.shape[0])  # by window length: runs of several merge
            self.accumulate(f"{layer}.n_full", n_full)
        else:
            self.accumulate(f"{layer}.count", count.sum(dim=0))
        self._keep(f"{layer}.fields", F.to("cpu") if self.offload else F.contiguous())
        if layer == self.layers[0]:
            self.accumulate("doc_mask", mask.to(torch.uint8))
            self.accumulate("doc_index", cap.doc_index)

    def result(self) -> AttentionFields:
        if self.streaming:
            return self._streamed_result()
        self._require_state()
        assert self.layers is not None
        s = {k: v.cpu() for k, v in self.state.items()}  # state lives on the model's device
        T = int(s["doc_mask"].shape[1])
        n_lags = int(s[f"{self.layers[0]}.fields"].shape[-1])
        causal = self.view.causal if self.view is not None else True
        L = (n_lags - 1) if causal else (n_lags - 1) // 2
        lags = torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)
        fields, means, dens = {}, {}, {}
        for layer in self.layers:
            F = fields[str(layer)] = s[f"{layer}.fields"]
            S = s.get(f"{layer}.sum")
            if S is None:  # the causal triangle (τ ≤ i) back into [(head,) T, n_lags]
                S = F.new_zeros(F.shape[1:])
                S.masked_scatter_(self._tri(S), s[f"{layer}.sum_tri"].to(S.dtype))
            else:
                S = S.clone()
            # the mean where(count > 0, S / max(count, 1), 0), in place in S; layers with the
            # same full-window counts share the divisor
            nf = s.get(f"{layer}.n_full")
            key = (None if f"{layer}.count" in s else
                   (tuple(nf.tolist()) if nf is not None else (), self._window(layer)))
            den = dens.get(key) if key is not None else None
            if den is None:
                cnt = self._count(s, layer, lags, S)
                den = (cnt.clamp_min(1.0), cnt <= 0)
                if key is not None:
                    dens[key] = den
            means[str(layer)] = S.div_(den[0]).masked_fill_(den[1], 0.0)
            del S, den
        return AttentionFields(
            fields=fields, mean=means, doc_mask=s["doc_mask"].to(torch.uint8)[:, :T], lags=lags,
            layers=list(self.layers), causal=causal, per_head=self.per_head,
            model_name=self.view.name if self.view is not None else "", field=self.field,
        )

    def _keep(self, key: str, value: Tensor) -> None:
        """:meth:`accumulate` of a tensor this update made and no one else holds: the first
        batch's is kept as it is instead of copied (no second ``T × n_lags`` buffer per
        layer, and no hole left below the kept one in the allocator's heap)."""
        own = (value.is_contiguous() and value.storage_offset() == 0
               and value.untyped_storage().nbytes() == value.numel() * value.element_size())
        if key not in self.state and own:
            self.state[key] = value.detach()
        else:
            self.accumulate(key, value)

    @staticmethod
    def _tri(like: Tensor) -> Tensor:
        """``[T, n_lags]`` bool, True at ``τ ≤ i``: the causal lag field's nonzero part, kept
        row by row (``T(T + 1)/2`` of ``T²`` values with every lag). The order is row-major,
        so a shorter window's triangle is a prefix of a longer one's, as zero-padding the
        square field at the end (the "sum" reduction of runs of two lengths) requires."""
        return _tri_mask(int(like.shape[-2]), int(like.shape[-1]), like.device)

    def pair_counts(self, layer: int) -> Tensor:
        """Documents counted at each (query, lag) of ``layer`` — a real query and a real key
        inside the document and the layer's window — ``[T, n_lags]`` on the CPU: the
        divisor of the ensemble mean (full windows' counts are formed here, not stored)."""
        if self.streaming:
            raise ValueError("pair_counts is for streaming=False; a streaming probe keeps "
                             "its counts in the first pass's statistics")
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items() if k.startswith(f"{layer}.")}
        F = s[f"{layer}.fields"]
        return self._count(s, layer, self._lags(int(F.shape[-1])), F[0])

    def _count(self, s: dict, layer: int, lags: Tensor, S: Tensor) -> Tensor:
        """Pairs per (query, lag) of the layer's documents, ``[T, n_lags]``: the padded
        batches' counts (``count``) plus, per window length ``t``, ``n_full[t − 1]`` full
        windows' :meth:`_full_count` zero-padded to ``[T, n_lags]`` (not stored per layer:
        ``T × n_lags`` floats fewer per layer; the same integers as summing every batch's)."""
        T, n_lags = int(S.shape[-2]), int(lags.numel())
        cnt = s.get(f"{layer}.count")
        cnt = torch.zeros(T, n_lags, dtype=S.dtype) if cnt is None else cnt.to(S.dtype, copy=True)
        n_full = s.get(f"{layer}.n_full")
        causal = lags.numel() == 0 or int(lags[0]) == 0
        for t in ([] if n_full is None else torch.nonzero(n_full).flatten().tolist()):
            L = t if self.max_lag is None else int(self.max_lag)  # t = length − 1
            lg = torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)
            full = self._full_count(t + 1, lg, S, self._window(layer)) * float(n_full[t])
            cnt[: full.shape[0], : full.shape[1]] += full
        return cnt

    # ------------------------------------------------------------------ streaming
    def _window(self, layer: int) -> Optional[int]:
        """The layer's sliding window (None: full attention; :func:`~tl_spectral.
        model_view.layer_windows`), read once per model."""
        from tl_spectral.model_view import layer_windows

        if self.view is None:
            return None
        if getattr(self, "_windows_of", None) is not self.view:
            self._windows, self._windows_of = layer_windows(self.view), self.view
        return self._windows[layer]

    def _full_count(self, T: int, lags: Tensor, like: Tensor,
                    window: Optional[int] = None) -> Tensor:
        """``[T, n_lags]``: 1 where query ``i`` and its key at lag ``τ`` lie inside a full
        window of ``T`` tokens (``0 ≤ i ∓ τ < T``) and, causal, inside the layer's sliding
        window (``τ < window``), else 0; kept between updates."""
        causal = bool(self.view is not None and self.view.causal)
        key = (T, causal, int(lags[0]), int(lags.numel()), like.dtype, like.device, window)
        cached = getattr(self, "_count_cache", None)
        if cached is None or cached[0] != key:
            i = torch.arange(T, device=like.device)[:, None]
            lg = lags[None, :].to(like.device)
            j = i - lg if causal else i + lg
            ok = (j >= 0) & (j < T)
            if causal and window is not None:
                ok = ok & (lg < int(window))
            self._count_cache = cached = (key, ok.to(like.dtype))
        return cached[1]

    def _stream(self, layer: int, F: Tensor, mask: Tensor, count: Tensor,
                doc_index: Optional[Tensor] = None) -> None:
        """Fold one batch's lag fields ``F [b, T, n_lags]`` into the streamed statistics: the
        first pass's sums, and the valid entries of every field appended to the factor
        buffers of the pass (:mod:`~tl_spectral.probes.field_stream`)."""
        from tl_spectral.probes.field_stream import lag_moment

        if not bool(mask.all()):
            raise ValueError(
                "AttentionFieldProbe(streaming=True) needs full windows (no padding); cut "
                "equal windows, e.g. with document_windows or a token file's windows()"
            )
        b = int(F.shape[0])
        ix = self._index(layer, int(F.shape[-2]), int(F.shape[-1]))
        flat = F.reshape(b, -1)
        if self._phase == 0:
            self.accumulate(f"{layer}.sum", F.sum(dim=0, dtype=torch.float64))
            self.accumulate(f"{layer}.count", count.sum(dim=0))
            self.accumulate(f"{layer}.moment", lag_moment(F))
            if self.layers is not None and layer == self.layers[0]:
                self.accumulate("n_docs", torch.tensor([float(b)], dtype=torch.float64,
                                                       device=F.device))
            parts = [(f"{layer}.full", ix["index"], None, ix["n"])]
        elif self._phase != 1:
            raise RuntimeError("this streaming probe has finished both passes; reset it (run "
                               "run_probes again) to start over")
        else:
            if layer in self._jk_basis and doc_index is not None:
                full = flat if ix["index"] is None else flat[:, ix["index"].to(F.device)]
                self._jackknife_moments(layer, full, doc_index)
            parts = [(f"{layer}.band{m}", bi["index"], bi["weight"], int(bi["index"].numel()))
                     for m, bi in enumerate(ix["bands"])]
        dev = torch.device("cpu") if self.offload else F.device
        pending = 0
        for prefix, index, weight, dim in parts:
            fb = self._part(self.state, prefix, dim, dev, b)
            fb.append(flat, index, weight)
            fb.publish(self.state, prefix)
            pending = fb.p
        if pending >= self.fold_every:
            self._flush(layer)

    def _index(self, layer: int, T: int, n_lags: int) -> dict:
        """The folded entries of ``layer``'s fields (:func:`~tl_spectral.probes.field_stream.
        field_index`) and, once the bands are chosen, each band's (``"bands"``)."""
        from tl_spectral.probes.field_stream import band_index, field_index

        ix = self._ix.get(layer)
        if ix is None or ix["key"] != (T, n_lags):
            causal = self.view.causal if self.view is not None else True
            ix = field_index(T, self._lags(n_lags), causal=causal, window=self._window(layer))
            ix["key"], ix["n"] = (T, n_lags), int(ix["valid"].sum())
            self._ix[layer] = ix
        sel = self._selection.get(layer)
        if sel is not None and ix.get("selection") is not sel:
            ix["bands"] = [band_index(ix["valid"], mk, w)
                           for w, mk in zip(sel["windows"], sel["masks"])]
            ix["selection"] = sel
        return ix

    def _capacity(self, batch: int) -> int:
        """Rows of a new factor buffer: ``rank`` factors, the largest pending block (``fold_every
        − 1 + batch``), the between-group rows — fewer when the corpus is shorter."""
        n = self._n_hint if self._n_hint else 1 << 62
        return min(self.rank, n) + min(self.fold_every - 1 + max(batch, 1), n) + 2

    def _part(self, store: dict, prefix: str, dim: Optional[int] = None, device=None,
              batch: int = 0):
        """The :class:`~tl_spectral.analysis.streaming_pod.FactorBuffer` of ``prefix`` whose
        state ``store`` holds: the probe's own while ``store`` holds its views, else (a merged,
        reduced or new state) one built from ``store`` or, with ``dim``, an empty one."""
        from tl_spectral.analysis.streaming_pod import FactorBuffer, StreamingFactors

        fb = self._fb.get(prefix)
        if fb is not None and fb.owns(store, prefix):
            return fb
        if f"{prefix}.W" in store:
            st = StreamingFactors(*(store[f"{prefix}.{k}"] for k in
                                    ("W", "sums", "ns", "sumsq", "dropped")))
            fb = FactorBuffer.adopt(st, store.get(f"{prefix}.pending"), self._capacity(batch))
        elif dim is None:
            return None
        else:
            fb = FactorBuffer(dim, self._capacity(batch), torch.float32, device)
        self._fb[prefix] = fb
        fb.publish(store, prefix)
        return fb

    def _jackknife_moments(self, layer: int, Y: Tensor, doc_index: Tensor) -> None:
        """Second pass: the per-group moments of :func:`~tl_spectral.probes.field_stream.
        jackknife_moments` (``Y [b, d]``: the documents' fields over the folded entries)."""
        from tl_spectral.probes.field_stream import jackknife_moments

        assert self._jk_group is not None
        for k, v in jackknife_moments(self._jk_basis[layer], self._jk_group,
                                      self.jackknife_groups, Y, doc_index).items():
            self.accumulate(f"{layer}.jk.{k}", v)

    def _coherence_setup(self, T: int, n_lags: int) -> None:
        from tl_spectral.analysis.streaming_pod import coherence_query_index
        from tl_spectral.analysis.wavelets import LagCWT, default_scales

        if getattr(self, "_coh_T", None) == (T, n_lags):
            return
        opts = self.band_options
        self._coh_q = coherence_query_index(opts["coherence_queries"], T)
        scales = default_scales(T) if opts["scales"] is None else opts["scales"]
        self._coh_op = LagCWT(n_lags, scales, opts["wavelet"], dtype=torch.float32)
        self._coh_T = (T, n_lags)

    def _flush(self, layer: int) -> None:
        """Fold the buffered fields of ``layer`` into its factors, in place (and, in the first
        pass, add their coherence cross-spectrum)."""
        if self._phase == 0:
            fb = self._part(self.state, f"{layer}.full")
            if fb is None or fb.p == 0:
                return
            T, n_lags = self.length, int(self.state[f"{layer}.moment"].shape[0])
            self._coherence_setup(T, n_lags)
            if self._coh_q is not None:
                from tl_spectral.analysis.coherence import cross_spectrum
                from tl_spectral.probes.field_stream import query_rows

                ix = self._index(layer, T, n_lags)
                G = cross_spectrum(query_rows(fb.pending, ix["valid"], self._coh_q), self._coh_op)
                self.accumulate(f"{layer}.coh_re", G.real.contiguous())
                if G.is_complex():
                    self.accumulate(f"{layer}.coh_im", G.imag.contiguous())
            fb.fold(self.rank)
            fb.publish(self.state, f"{layer}.full")
            return
        for m in range(len(self._selection[layer]["a_star"])):
            fb = self._part(self.state, f"{layer}.band{m}")
            if fb is not None and fb.p:
                fb.fold(self.rank)
                fb.publish(self.state, f"{layer}.band{m}")

    def next_pass(self) -> bool:
        """Called by ``run_probes`` after a pass over the corpus (states already reduced
        across processes): True when the probe needs another pass over the same corpus.
        A streaming probe fixes its band windows after the first pass and needs a second."""
        if not self.streaming or self.layers is None:
            return False
        for layer in self.layers:
            self._flush(layer)
        if self._phase == 0:
            from tl_spectral.analysis.streaming_pod import select_bands

            if not self.state:
                return False
            N = float(self.state["n_docs"])
            for layer in self.layers:
                C = self._centred_moment(self.state, layer, N)
                n_lags = int(C.shape[0])
                lags = self._lags(n_lags)
                self._selection[layer] = select_bands(C.cpu(), lags, self.length, self.band_options)
                fb = self._part(self.state, f"{layer}.full")
                if not fb.folded or fb.r > self.rank:
                    fb.fold(self.rank)
                fb.compact()  # pass 2 keeps the factor rows only
                fb.publish(self.state, f"{layer}.full")
                if self._jk_group is not None:  # the jackknife's basis: the full field's POD
                    from tl_spectral.probes.field_stream import jackknife_basis

                    self._jk_basis[layer] = jackknife_basis(
                        fb.W, fb.factors().mean.to(fb.W.device, torch.float32))
                for m in range(len(self._selection[layer]["a_star"])):
                    for k in ("W", "sums", "ns", "pending"):
                        self.reductions[f"{layer}.band{m}.{k}"] = "cat"  # type: ignore[index]
            self._pass1, self.state = self.state, {}
            self._phase = 1
            return True
        self._phase = 2
        return False

    def _lags(self, n_lags: int) -> Tensor:
        causal = self.view.causal if self.view is not None else True
        L = (n_lags - 1) if causal else (n_lags - 1) // 2
        return torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)

    @staticmethod
    def _centred_moment(state: dict, layer: int, N: float) -> Tensor:
        """``C = mean_{s,i} u u^T`` of the fluctuations ``u = F - F̄`` (float64 ``[n_lags,
        n_lags]``): ``(sum F F^T - S^T S / N) / (N T)`` with ``S`` the ``[T, n_lags]`` sum —
        the rank-T mean correction is exact."""
        S = state[f"{layer}.sum"].to(torch.float64)
        M = state[f"{layer}.moment"].to(torch.float64)
        T = int(S.shape[0])
        return (M - S.T @ S / N) / (N * T)

    def merge(self, other: "Probe") -> "Probe":
        """Combine ``other``'s state into this one's (shards of one corpus). Streaming
        probes merge at the same pass: after the first pass, or after the second when both
        used the same band windows (the windows of the merged first pass)."""
        if not self.streaming:
            return super().merge(other)
        if type(other) is not type(self) or not getattr(other, "streaming", False):
            raise TypeError("cannot merge a non-streaming probe into a streaming one")
        o: AttentionFieldProbe = other  # type: ignore[assignment]
        if o._phase != self._phase:
            raise ValueError(
                f"cannot merge streaming probes at different passes ({self._phase} and "
                f"{o._phase}); merge after the first pass, fix the windows, then run the second"
            )
        if self._phase >= 1:
            for layer in self.layers or []:
                a, b = self._selection.get(layer), o._selection.get(layer)
                if a is None or b is None or a["a_star"] != b["a_star"]:
                    raise ValueError(
                        f"layer {layer}: the two probes chose different band windows (from "
                        "different first passes); merge the first passes, then run the "
                        "second pass on each shard with the merged probe's windows"
                    )
            # the jackknife's per-group moments add up only in one basis (the merged first
            # pass's): moments taken in different first passes' bases are dropped
            from tl_spectral.probes.field_stream import basis_matrix

            for layer in self.layers or []:
                a, b = self._jk_basis.get(layer), o._jk_basis.get(layer)
                if a is not None and b is not None:
                    a, b = basis_matrix(a), basis_matrix(b)
                same = (a is not None and b is not None and a.shape == b.shape
                        and torch.allclose(a, b.to(a.device), atol=1e-6))
                if not same:
                    for st in (self.state, o.state):
                        for k in [k for k in st if k.startswith(f"{layer}.jk.")]:
                            del st[k]
                    self._jk_basis.pop(layer, None)
        if self.layers is not None:
            for layer in self.layers:
                self._flush(layer)
                o._flush(layer)
        if self._phase >= 1:  # the first passes' statistics (moved aside after pass 1)
            for key, value in o._pass1.items():
                cur = self._pass1.get(key)
                self._pass1[key] = value.clone() if cur is None else merge_tensor(
                    cur, value, self.reductions.get(key, "sum"))
        return super().merge(other)

    def _streamed_result(self) -> "StreamedAttentionFields":
        from tl_spectral.analysis.coherence import coherence_from_spectrum
        from tl_spectral.analysis.streaming_pod import spectrum
        from tl_spectral.probes.field_stream import scatter_rows

        if self._phase != 2:
            if not self.state and not self._pass1:
                self._require_state()
            raise RuntimeError(
                f"probe {self.name!r} (streaming=True) needs two passes over the corpus and has "
                f"made {self._phase}; run it with run_probes, which makes both"
            )
        assert self.layers is not None
        p1 = {k: v.cpu() for k, v in self._pass1.items() if ".full." not in k}
        N = float(p1["n_docs"])
        T = self.length
        means, moments, coh, eig, modes, pods, jk = {}, {}, {}, {}, {}, {}, {}
        for layer in self.layers:
            key = str(layer)
            cnt = p1[f"{layer}.count"].to(torch.float64)
            means[key] = torch.where(cnt > 0, p1[f"{layer}.sum"] / cnt.clamp_min(1.0), 0.0).float()
            moments[key] = self._centred_moment(p1, layer, N)
            if f"{layer}.coh_re" in p1:
                self._coherence_setup(T, int(moments[key].shape[0]))
                from tl_spectral.analysis.coherence import cross_spectrum

                G = p1[f"{layer}.coh_re"]
                if f"{layer}.coh_im" in p1:
                    G = torch.complex(G, p1[f"{layer}.coh_im"])
                mu = means[key].to(torch.float64)[self._coh_q][None]  # [1, Q, n_lags]
                G = G - N * cross_spectrum(mu, self._coh_op)
                coh[key] = coherence_from_spectrum(G).to(torch.float32)
            ix = self._index(layer, T, int(moments[key].shape[0]))
            places = [("full", ix["index"], ix["dim"])]
            places += [(f"band{m}", bi["pos"], bi["dim"]) for m, bi in enumerate(ix["bands"])]
            for part, pos, dim in places:
                src = self._pass1 if part == "full" else self.state
                fb = self._part(src, f"{layer}.{part}")
                if not fb.folded or fb.r > self.rank:  # merged states: one group, <= K rows
                    fb.fold(self.rank)
                    fb.publish(src, f"{layer}.{part}")
                st = fb.factors()
                lam, md = spectrum(st, self.n_modes)
                pk = f"{layer}.{part}"  # modes back into the rectangle of the field or band
                eig[pk], modes[pk] = lam.cpu(), scatter_rows(md.float().cpu(), pos, dim)
                pods[pk] = {"dim": dim, "dropped": float(st.dropped) / N,
                            "scatter": st.total_scatter / N}
            if f"{layer}.jk.C" in self.state:
                s = {k: self.state[f"{layer}.jk.{k}"].cpu().to(torch.float64)
                     for k in ("C", "c", "n", "sumsq", "sums")}
                used = s["n"] > 0  # document_groups makes fewer groups when chunks run short
                s = {k: v[used] for k, v in s.items()}
                sums = s.pop("sums")
                s["gram"] = sums @ sums.T
                jk.update({f"{key}.{k}": v for k, v in s.items()})
        return StreamedAttentionFields(
            mean=means, moment=moments, coherence=coh, eigenvalues=eig, modes=modes, pods=pods,
            lags=self._lags(int(moments[str(self.layers[0])].shape[0])), layers=list(self.layers),
            n_documents=int(round(N)), length=int(T),
            causal=self.view.causal if self.view is not None else True, rank=self.rank,
            band_options=_jsonable(self.band_options),
            model_name=self.view.name if self.view is not None else "",
            jackknife=jk,
            jackknife_meta=({"n_groups": int(self.jackknife_groups), "seed": self.jackknife_seed}
                            if jk else {}),
        )


def _probe_options(options: Optional[ScalePODOptions], coherence_queries: Any,
                   band_options: Optional[dict]) -> tuple[Optional[ScalePODOptions], Any]:
    """The probe's options and coherence queries; the deprecated ``band_options`` dict is
    split into both (its keys checked by :func:`~tl_spectral.analysis.streaming_pod.band_options`)."""
    if options is not None and not isinstance(options, ScalePODOptions):
        raise ValueError(f"options must be a ScalePODOptions (got {type(options).__name__})")
    if options is not None and float(options.epsilon) != ScalePODOptions().epsilon:
        raise ValueError("epsilon chooses no band window; pass it to the streamed result's "
                         ".scale_pod(options=ScalePODOptions(epsilon=...)), not to the probe")
    if band_options is None:
        return options, coherence_queries
    from tl_spectral._deprecation import warn_deprecated
    from tl_spectral.analysis.streaming_pod import band_options as _checked

    warn_deprecated("AttentionFieldProbe(band_options={...})",
                    "AttentionFieldProbe(options=ScalePODOptions(...), coherence_queries=...)",
                    stacklevel=4)
    if options is not None:
        raise ValueError("pass options=ScalePODOptions(...) only, not band_options too")
    _checked(band_options)  # unknown keys: one-line error
    d = dict(band_options)
    coherence_queries = d.pop("coherence_queries", coherence_queries)
    return ScalePODOptions(**d), coherence_queries


def _band_dict(options: ScalePODOptions, coherence_queries: Any) -> dict:
    """The band settings of ``options`` and the coherence queries as the dict the streamed
    band selection reads (:func:`~tl_spectral.analysis.streaming_pod.band_options`)."""
    from tl_spectral.analysis.streaming_pod import BAND_OPTIONS, band_options

    d = {k: getattr(options, k) for k in BAND_OPTIONS if k != "coherence_queries"}
    return band_options({**d, "coherence_queries": coherence_queries})


def _check_band_settings(asked: dict, opts: dict) -> None:
    """Refuse a streamed ``.scale_pod`` setting ``asked`` that is no band setting or differs
    from the probe's ``opts``: the windows were fixed before the second pass."""
    for k, v in asked.items():
        if k not in opts:
            raise ValueError(f"unknown option {k!r} for a streamed scale POD; pass "
                             "options=ScalePODOptions(...), n_modes, head_budget or "
                             "coherence_queries")
        if _jsonable({k: v})[k] != _jsonable({k: opts[k]})[k]:
            raise ValueError(
                f"{k}={v!r} differs from the streaming probe's {opts[k]!r}: the band windows "
                "were fixed before the second pass; pass it to AttentionFieldProbe("
                "streaming=True, options=ScalePODOptions(...) or coherence_queries=...) "
                "and run it again"
            )


def _same_queries(a: Any, b: Any) -> bool:
    return _jsonable({"q": a})["q"] == _jsonable({"q": b})["q"]


def _jsonable(opts: dict) -> dict:
    out = {}
    for k, v in opts.items():
        if isinstance(v, Tensor):
            v = v.tolist()
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


@register_result
@dataclass
class StreamedAttentionFields(Result):
    """What ``AttentionFieldProbe(streaming=True)`` keeps: statistics of the lag fields whose
    size does not grow with the number of documents.

    mean: ``{str(layer): [T, n_lags]}`` ensemble mean; moment: ``{str(layer): [n_lags,
    n_lags]}`` float64 centred lag second moment ``mean_{s,i} u u^T`` (the scalogram's input);
    coherence: ``{str(layer): [S, Q, Q]}`` ``gamma_ij(a)`` (empty without coherence queries);
    eigenvalues: ``{"L.full" | "L.band<m>": [k <= rank]}`` top POD eigenvalues; modes: same
    keys, ``[n_modes, dim]``; pods: same keys, ``{"dim", "dropped", "scatter"}`` (energy the
    rank cap dropped, exact total energy, both per document). ``band_options``: the options
    that chose the band windows (``.scale_pod`` refuses others). jackknife: ``{"L.C" | "L.c" | "L.n" |
    "L.sumsq" | "L.gram": tensor}`` per layer ``L`` and group of documents (``jackknife_meta``:
    groups, seed), the input of :func:`~tl_spectral.analysis.streaming_pod.projected_group_spectrum`
    (empty with ``jackknife_groups=0``).
    """

    kind: ClassVar[str] = "streamed_attention_fields"
    main_plot: ClassVar[str | None] = "plot_mean"
    array_shapes = {
        "mean": "float[pos, lag]", "moment": "float[lag, lag]", "coherence": "float[scale, cq, cq]",
        "eigenvalues": "float[_]", "modes": "float[_, _]", "lags": "int[lag]",
        # per group of documents: C [G, K, K], c [G, K], gram [G, G], n and sumsq [G]
        "jackknife": "float[jkgroup, _, _] | float[jkgroup, _] | float[jkgroup]",
    }
    array_dims = {"pos": "length"}

    mean: dict
    moment: dict
    coherence: dict
    eigenvalues: dict
    modes: dict
    pods: dict
    lags: Tensor
    layers: list = field(default_factory=list)
    n_documents: int = 0
    length: int = 0
    causal: bool = True
    rank: int = 0
    band_options: dict = field(default_factory=dict)
    model_name: str = ""
    jackknife: dict = field(default_factory=dict)
    jackknife_meta: dict = field(default_factory=dict)

    @property
    def n_docs(self) -> int:
        """The number of documents streamed into the fields."""
        return int(self.n_documents)

    def plot_mean(self):
        """Mean lag profile per layer: ``mean_i F̄(i, tau)`` against ``tau``."""
        return self._draw("plot_mean")

    def scale_pod(self, n_heads: int | Sequence[int], *, head_budget: int | None = None,
                  n_modes: int | None = None, options: Optional[ScalePODOptions] = None,
                  **kwargs: Any):
        """Scale-selective POD of every layer from the streamed statistics: a
        :class:`~tl_spectral.analysis.scale_pod.ScalePODResult` like
        :meth:`AttentionFields.scale_pod`'s (per-document coefficients empty; every POD
        summary adds ``rank_cap``, ``spectrum_complete`` and ``tspec_exact``; ``H_star_str``
        reads ``"> K"`` when ``H*`` lies beyond the rank cap). options: a
        :class:`ScalePODOptions` whose ``epsilon`` is used; its band settings (and a
        ``coherence_queries`` keyword) must equal the probe's ``band_options`` (the windows
        were fixed before the second pass)."""
        from tl_spectral.analysis.scale_pod import ScalePODResult, allocation_table
        from tl_spectral.analysis.streaming_pod import (
            band_options,
            coherence_query_index,
            pod_from_spectrum,
            scale_pod_layer_streamed,
            select_bands,
        )

        old = ScalePODOptions.split(kwargs)
        opts = band_options(self.band_options)
        asked = dict(kwargs)  # the settings to check against the probe's
        asked.update({k: v for k, v in old.items() if k in opts} if options is None else
                     {k: getattr(options, k) for k in opts if k != "coherence_queries"})
        epsilon = ScalePODOptions.of(options, old, "StreamedAttentionFields.scale_pod").epsilon
        if self.n_docs < 2:
            raise ValueError(f"POD needs at least 2 documents, the ensemble has {self.n_docs}")
        _check_band_settings(asked, opts)
        L = len(self.layers)
        uniform = [int(n_heads)] * L if isinstance(n_heads, int) else [int(x) for x in n_heads]
        if len(uniform) != L:
            raise ValueError(f"n_heads has {len(uniform)} entries for {L} layers")
        budget = sum(uniform) if head_budget is None else int(head_budget)
        T, N = int(self.length), int(self.n_documents)
        q = coherence_query_index(opts["coherence_queries"], T)
        config = {
            "wavelet": opts["wavelet"], "epsilon": float(epsilon),
            "max_dominant": int(opts["max_dominant"]), "min_ratio": float(opts["min_ratio"]),
            "min_peak_fraction": float(opts["min_peak_fraction"]),
            "window_threshold": float(opts["window_threshold"]), "lag_window": opts["lag_window"],
            "n_modes": int(n_modes if n_modes is not None else min(
                (m.shape[0] for m in self.modes.values()), default=0)),
            "center": False, "streaming": True, "rank_cap": int(self.rank),
        }
        out = []
        for layer in self.layers:
            key = str(layer)
            sel = select_bands(self.moment[key], self.lags, T, opts)
            config["n_scales"] = int(sel["scales"].numel())

            def pod_of(part: str):
                pk = f"{layer}.{part}"
                md = self.modes[pk]
                if n_modes is not None:
                    if n_modes > md.shape[0] and md.shape[0] < self.eigenvalues[pk].numel():
                        raise ValueError(f"n_modes={n_modes} exceeds the {md.shape[0]} modes the "
                                         "probe kept; pass n_modes to the probe")
                    md = md[:n_modes]
                meta = self.pods[pk]
                return pod_from_spectrum(
                    self.eigenvalues[pk], md.to(torch.float64), total_energy=meta["scatter"],
                    n_snapshots=N, dim=int(meta["dim"]), dropped=meta["dropped"],
                    epsilon=epsilon,
                )

            full = pod_of("full")
            bands = [pod_of(f"band{m}") for m in range(len(sel["a_star"]))]
            coh = self.coherence.get(key) if q is not None else None
            out.append(scale_pod_layer_streamed(
                layer=layer, n_documents=N, T=T, lags=self.lags, selection=sel, full=full,
                bands=bands, coherence=coh, coherence_queries=q if coh is not None else None,
                rank_cap=self.rank, config=config,
            ))
        return ScalePODResult(layers=out, allocation=allocation_table(out, uniform, budget),
                              head_budget=budget, config=dict(out[0].config))
