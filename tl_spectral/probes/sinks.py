"""SinkProbe: attention-sink rates and sink geometry inside the forward pass (SPEC C.4).

Per layer and batch, :func:`tl_spectral.analysis.sinks.sink_geometry` is evaluated and
folded into mergeable sums and histograms:

* sink rate per head (mean over real queries of ``α_i0``) and, for comparison, the mean
  attention on each document's last real token (where BERT-style encoders put ``[SEP]``);
* the Gu et al. key score of the sink per head (mean over documents of
  ``Σ_i α_i0 / n_0``), the share of documents in which the head is a sink head (score >
  ``threshold``) and the layer's mean share of sink heads;
* anti-alignment ``cos(ṽ_0, s_i)``: histogram on [−1, 1] and mean, per head;
* optimal sink rate ``ρ*`` per query: histogram on [−1, 2] (values outside fall in the end
  bins) and a 2-D histogram against the observed ``α_i0``; the share of ``ρ*`` in (0, 1) and
  of queries whose observed rate exceeds the clamped optimum ``clamp(ρ*, 0, 1)``;
* the zero-the-sink-value intervention, analytically: ``Δ‖o‖`` (absolute and relative to
  ``‖o‖``) and ``Δcos = cos(o', s̄) − cos(o, s̄)`` per head and for the layer.

The intervention's effect on the model's loss (ΔPPL, or the change of the sentence
embedding for encoders) needs extra forward passes: :func:`zero_sink_value`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Optional, Sequence

import torch
from torch import Tensor

from tl_spectral._deprecation import deprecated_method, renamed_arguments
from tl_spectral.analysis.contributions import all_finite
from tl_spectral.analysis.sinks import check_sink_index, sink_geometry_from_products
from tl_spectral.model_view import ModelView
from tl_spectral.probes import shared
from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral.results import Result, register_result

ANTI_RANGE = (-1.0, 1.0)
RHO_RANGE = (-1.0, 2.0)
ALPHA_RANGE = (0.0, 1.0)


def _bin(x: Tensor, lo: float, hi: float, n: int) -> Tensor:
    """Bin index in [0, n) of ``x`` on [lo, hi]; values outside go to the end bins."""
    return ((x - lo) / (hi - lo) * n).floor().clamp_(0, n - 1).long()


def _hist(x: Tensor, ok: Tensor, head: Tensor, H: int, lo: float, hi: float, n: int) -> Tensor:
    """Per-head histogram ``[H, n]`` of the entries of ``x`` where ``ok``; head index ``head``."""
    idx = head[ok] * n + _bin(x[ok], lo, hi, n)
    return torch.bincount(idx, minlength=H * n).reshape(H, n).double()


@register_result
@dataclasses.dataclass
class SinkStats(Result):
    """Sink statistics of a corpus, per layer (axis 0) and head.

    Rates [layer, head]: ``sink_rate`` (mean ``α_i0``), ``last_token_rate`` (mean attention
    on the last real token), ``key_score`` (mean over documents of the Gu key score of the
    sink), ``sink_head_doc_share`` (share of documents where the head is a sink head);
    ``sink_head`` [layer, head] bool: corpus key score > ``threshold``; ``sink_head_share``
    [layer]: share of heads with ``sink_head``; ``doc_sink_head_share`` [layer]: mean over
    documents of the per-document share.

    Geometry: ``anti_hist`` [layer, head, n_bins] on ``anti_edges``, ``anti_mean``
    [layer, head]; ``rho_hist`` [layer, head, n_bins] on ``rho_edges``; ``rho_alpha_hist``
    [layer, n_bins, n_bins] (ρ* rows on ``rho_edges``, observed ``α_i0`` columns on
    ``alpha_edges``); ``rho_mean`` (mean of ``clamp(ρ*, 0, 1)``), ``alpha_on_rho`` (mean
    ``α_i0`` over the same queries), ``rho_in_unit`` (share with 0 < ρ* < 1),
    ``over_sink`` (share with ``α_i0 > clamp(ρ*, 0, 1)``), ``sink_value_ratio`` (mean of
    ``‖ṽ_0‖ / ‖s̄_i‖``; ρ* → 1 as it → 0), all [layer, head].

    Intervention (analytic): ``head_delta_norm``, ``head_rel_delta_norm``
    (``Δ‖o^h‖/‖o^h‖``), ``head_delta_cos`` [layer, head]; ``delta_norm``,
    ``rel_delta_norm``, ``delta_cos`` [layer] for the layer output. The model-level
    effect (ΔPPL) comes from :func:`zero_sink_value`.
    """

    kind: ClassVar[str] = "sink_stats"
    main_plot: ClassVar[str | None] = "plot_rates"
    array_shapes = {
        "sink_rate": "float[layer, head]", "last_token_rate": "float[layer, head]",
        "key_score": "float[layer, head]", "sink_head": "bool[layer, head]",
        "sink_head_doc_share": "float[layer, head]", "sink_head_share": "float[layer]",
        "doc_sink_head_share": "float[layer]", "anti_hist": "float[layer, head, bin]",
        "anti_edges": "float[bin+1]", "anti_mean": "float[layer, head]",
        "rho_hist": "float[layer, head, bin]", "rho_edges": "float[bin+1]",
        "rho_alpha_hist": "float[layer, bin, bin]", "alpha_edges": "float[bin+1]",
        "rho_mean": "float[layer, head]", "alpha_on_rho": "float[layer, head]",
        "rho_in_unit": "float[layer, head]", "over_sink": "float[layer, head]",
        "sink_value_ratio": "float[layer, head]", "head_delta_norm": "float[layer, head]",
        "head_rel_delta_norm": "float[layer, head]", "head_delta_cos": "float[layer, head]",
        "delta_norm": "float[layer]", "rel_delta_norm": "float[layer]", "delta_cos": "float[layer]",
        "n_queries": "int[layer]",
    }
    array_dims = {"layer": "layers"}

    layers: list
    causal: bool
    sink_index: int
    threshold: float
    sink_rate: Tensor
    last_token_rate: Tensor
    key_score: Tensor
    sink_head: Tensor
    sink_head_doc_share: Tensor
    sink_head_share: Tensor
    doc_sink_head_share: Tensor
    anti_hist: Tensor
    anti_edges: Tensor
    anti_mean: Tensor
    rho_hist: Tensor
    rho_edges: Tensor
    rho_alpha_hist: Tensor
    alpha_edges: Tensor
    rho_mean: Tensor
    alpha_on_rho: Tensor
    rho_in_unit: Tensor
    over_sink: Tensor
    sink_value_ratio: Tensor
    head_delta_norm: Tensor
    head_rel_delta_norm: Tensor
    head_delta_cos: Tensor
    delta_norm: Tensor
    rel_delta_norm: Tensor
    delta_cos: Tensor
    n_queries: Tensor
    n_docs: int = 0
    model_name: str = ""

    rows = deprecated_method("to_rows", "rows")
    summary_rows = deprecated_method("to_rows", "summary_rows")

    def to_rows(self) -> list[dict]:
        """One row per layer (head means unless stated)."""
        rows = []
        for li, layer in enumerate(self.layers):
            rows.append({
                "layer": int(layer),
                "sink_rate": float(self.sink_rate[li].mean()),
                "max_head_sink_rate": float(self.sink_rate[li].max()),
                "last_token_rate": float(self.last_token_rate[li].mean()),
                "sink_head_share": float(self.sink_head_share[li]),
                "cos_v0_s": float(self.anti_mean[li].mean()),
                "rho_star_clamped": float(self.rho_mean[li].mean()),
                "alpha_i0_same_q": float(self.alpha_on_rho[li].mean()),
                "rho_star_in_0_1": float(self.rho_in_unit[li].mean()),
                "over_sink_share": float(self.over_sink[li].mean()),
                "v0_over_sbar": float(self.sink_value_ratio[li].mean()),
                "rel_delta_norm": float(self.rel_delta_norm[li]),
                "delta_cos": float(self.delta_cos[li]),
            })
        return rows

    # -------------------------------------------------------------- plots
    def plot_rates(self):
        """Heat maps (layer × head) of the sink rate and the Gu key score, each on its data
        range with a colour bar; sink heads (key score > threshold) marked with a dot."""
        return self._draw("plot_rates")

    def plot_rho_star(self):
        """Histogram of ρ* per layer, and ρ* against the observed α_i0 (log count, colour
        bar) with the diagonal ρ* = α_i0."""
        return self._draw("plot_rho_star")

    def plot_anti_alignment(self):
        """Distribution of cos(ṽ_0, s_i) per layer (all heads), and its mean per head."""
        return self._draw("plot_anti_alignment")


class SinkProbe(Probe):
    """Sink rates, Gu key scores, anti-alignment, ρ* and the analytic zero-sink intervention
    (SPEC C.4).

    layers: layers to read (default all); sink_index: the sink key (0); threshold: sink-head
    threshold on the key score (0.3, Gu et al.); n_bins: histogram bins.
    """

    name = "sinks"

    def __init__(
        self,
        layers: Optional[Sequence[int]] = None,
        sink_index: int = 0,
        threshold: float = 0.3,
        n_bins: int = 40,
        name: Optional[str] = None,
    ):
        super().__init__()
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {n_bins}")
        self.layers = None if layers is None else sorted(set(int(x) for x in layers))
        self.sink_index = int(sink_index)
        self.threshold = float(threshold)
        self.n_bins = int(n_bins)
        if name is not None:
            self.name = name
        self._W: dict[int, Tensor] = {}

    def requires(self, view: ModelView) -> dict[int, set[str]]:
        layers = self._read_layers(view)
        self._W = {}  # W_O is read from this run's model (weights edited in place between runs)
        return {layer: {"pattern", "v"} for layer in layers}

    def _window(self, layer: int) -> Optional[int]:
        """The layer's sliding window (None: full attention), read once per run."""
        from tl_spectral.model_view import layer_windows

        if getattr(self, "_windows_of", None) is not self.view:
            self._windows, self._windows_of = layer_windows(self.view), self.view
        return self._windows[layer]

    def update(self, cap: LayerCapture) -> None:
        # Long on purpose: the per-layer statistics of the probe in formula order, reusing
        # the shared value products (tl_spectral.probes.shared).
        assert cap.pattern is not None and cap.v is not None and self.view is not None
        layer = cap.layer
        p = cap.pattern.float()
        W = self._W.get(layer)
        if W is None or W.device != p.device:  # on the model's device; the current layer's
            W = self.view.weights(layer, device=p.device).W_O  # only (not one per layer
            self._W = {layer: W}  # for the whole run)
        qm = cap.mask
        causal = self.view.causal
        check_sink_index(self.sink_index, p.shape[-1])
        # the value products and layer outputs are shared with the other probes reading
        # this layer (ContributionProbe forms the same ones): tl_spectral.probes.shared
        W = W.to(p.dtype)
        vp = shared.value_products(cap, W, causal, self.sink_index)
        if not (all_finite(vp.vh) and all_finite(W)):
            raise ValueError(f"layer {layer}: v or W_O has NaN/inf entries")
        g = sink_geometry_from_products(
            shared.query_pattern(cap), vp.vh, W, qm, vp.gram, vp.vnorm, vp.w, vp.w_bound,
            vp.mass, vp.z, causal=causal, sink_index=self.sink_index, threshold=self.threshold,
            o=shared.head_outputs(cap, W, causal, self.sink_index, "o"),
            s=shared.head_outputs(cap, W, causal, self.sink_index, "s"),
            key_totals=shared.pattern_doc_source_sums(cap), window=self._window(layer),
        )
        b, H, T = g.anti_alignment.shape
        nb = self.n_bins
        acc = self.accumulate
        real = qm[:, None, :].expand(b, H, T)
        n_q = qm.sum().double()
        acc(f"{layer}.n_q", n_q.reshape(1))
        acc(f"{layer}.n_docs", torch.full((1,), float(b), dtype=torch.float64, device=p.device))
        acc(f"{layer}.rate", (g.sink_rate * qm.sum(-1, keepdim=True)).sum(0).double())
        last = (qm.sum(-1) - 1).clamp_min(0)  # [b]
        a_last = p[torch.arange(b, device=p.device), :, :, last]  # [b, H, T] (not a gather)
        acc(f"{layer}.last", (a_last * real).sum((0, 2)).double())
        ks = g.key_score[..., self.sink_index]  # [b, H]
        acc(f"{layer}.key", ks.sum(0).double())
        acc(f"{layer}.sink_doc", g.sink_head.sum(0).double())
        head = torch.arange(H, device=p.device).view(1, H, 1).expand(b, H, T)
        keep = lambda t: t  # noqa: E731  (state stays on the model's device)
        acc(f"{layer}.anti_hist", keep(_hist(g.anti_alignment, g.anti_alignment_valid, head, H,
                                            *ANTI_RANGE, nb)))
        acc(f"{layer}.anti_sum", keep((g.anti_alignment * g.anti_alignment_valid).sum((0, 2)).double()))
        acc(f"{layer}.anti_n", keep(g.anti_alignment_valid.sum((0, 2)).double()))
        ok = g.rho_star_valid
        rho, a0 = g.rho_star, p[..., self.sink_index]
        acc(f"{layer}.rho_hist", keep(_hist(rho, ok, head, H, *RHO_RANGE, nb)))
        r_bin = _bin(rho[ok], *RHO_RANGE, nb)
        a_bin = _bin(a0[ok], *ALPHA_RANGE, nb)
        acc(f"{layer}.rho_alpha", keep(torch.bincount(r_bin * nb + a_bin, minlength=nb * nb)
                                      .reshape(nb, nb).double()))
        rc = rho.clamp(0.0, 1.0)
        acc(f"{layer}.rho_n", keep(ok.sum((0, 2)).double()))
        acc(f"{layer}.rho_sum", keep((rc * ok).sum((0, 2)).double()))
        acc(f"{layer}.alpha_on_rho", keep((a0 * ok).sum((0, 2)).double()))
        acc(f"{layer}.rho_unit", keep((ok & (rho > 0) & (rho < 1)).sum((0, 2)).double()))
        acc(f"{layer}.over", keep((ok & (a0 > rc)).sum((0, 2)).double()))
        # ‖ṽ_0‖ / ‖s̄_i‖: a small sink value puts the minimum of the ρ-curve near ρ = 1
        r_ok = g.curve_valid & (g.semantic_norm > 0)
        ratio = g.sink_value_norm.unsqueeze(-1) / torch.where(r_ok, g.semantic_norm, 1.0)
        acc(f"{layer}.vratio", keep((ratio * r_ok).sum((0, 2)).double()))
        acc(f"{layer}.vratio_n", keep(r_ok.sum((0, 2)).double()))
        # analytic intervention, per head
        on = g.head_output_norm
        acc(f"{layer}.hdn", keep((g.head_delta_norm * real).sum((0, 2)).double()))
        rel_ok = real & (on > 0)
        rel = torch.where(rel_ok, g.head_delta_norm / torch.where(rel_ok, on, 1.0), 0.0)
        acc(f"{layer}.hrel", keep(rel.sum((0, 2)).double()))
        acc(f"{layer}.hrel_n", keep(rel_ok.sum((0, 2)).double()))
        acc(f"{layer}.hdc", keep((g.head_delta_cos * g.head_delta_cos_valid).sum((0, 2)).double()))
        acc(f"{layer}.hdc_n", keep(g.head_delta_cos_valid.sum((0, 2)).double()))
        # layer level
        lo = g.output_norm
        lrel_ok = qm & (lo > 0)
        lrel = torch.where(lrel_ok, g.delta_norm / torch.where(lrel_ok, lo, 1.0), 0.0)
        acc(f"{layer}.ldn", keep((g.delta_norm * qm).sum().double().reshape(1)))
        acc(f"{layer}.lrel", keep(lrel.sum().double().reshape(1)))
        acc(f"{layer}.lrel_n", keep(lrel_ok.sum().double().reshape(1)))
        acc(f"{layer}.ldc", keep((g.delta_cos * g.delta_cos_valid).sum().double().reshape(1)))
        acc(f"{layer}.ldc_n", keep(g.delta_cos_valid.sum().double().reshape(1)))
        acc(f"{layer}.share", keep(g.sink_head_share.sum().double().reshape(1)))

    def result(self) -> SinkStats:
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items()}  # state lives on the model's device
        layers = list(self.layers or [])

        def st(key: str) -> Tensor:
            return torch.stack([s[f"{layer}.{key}"] for layer in layers])

        def div(a: Tensor, b: Tensor) -> Tensor:
            return torch.where(b > 0, a / b.clamp_min(1e-300), 0.0).float()

        n_q = st("n_q")  # [L, 1]
        n_docs = st("n_docs")  # [L, 1]
        key = div(st("key"), n_docs)
        sink_head = key > self.threshold
        nb = self.n_bins
        view = self.view
        return SinkStats(
            layers=layers,
            causal=view.causal if view is not None else True,
            sink_index=self.sink_index,
            threshold=self.threshold,
            sink_rate=div(st("rate"), n_q),
            last_token_rate=div(st("last"), n_q),
            key_score=key,
            sink_head=sink_head,
            sink_head_doc_share=div(st("sink_doc"), n_docs),
            sink_head_share=sink_head.float().mean(-1),
            doc_sink_head_share=div(st("share"), n_docs)[:, 0],
            anti_hist=st("anti_hist").float(),
            anti_edges=torch.linspace(*ANTI_RANGE, nb + 1),
            anti_mean=div(st("anti_sum"), st("anti_n")),
            rho_hist=st("rho_hist").float(),
            rho_edges=torch.linspace(*RHO_RANGE, nb + 1),
            rho_alpha_hist=st("rho_alpha").float(),
            alpha_edges=torch.linspace(*ALPHA_RANGE, nb + 1),
            rho_mean=div(st("rho_sum"), st("rho_n")),
            alpha_on_rho=div(st("alpha_on_rho"), st("rho_n")),
            rho_in_unit=div(st("rho_unit"), st("rho_n")),
            over_sink=div(st("over"), st("rho_n")),
            sink_value_ratio=div(st("vratio"), st("vratio_n")),
            head_delta_norm=div(st("hdn"), n_q),
            head_rel_delta_norm=div(st("hrel"), st("hrel_n")),
            head_delta_cos=div(st("hdc"), st("hdc_n")),
            delta_norm=div(st("ldn"), n_q)[:, 0],
            rel_delta_norm=div(st("lrel"), st("lrel_n"))[:, 0],
            delta_cos=div(st("ldc"), st("ldc_n"))[:, 0],
            n_queries=n_q[:, 0].long(),
            n_docs=int(n_docs[0, 0]) if len(layers) else 0,
            model_name=view.name if view is not None else "",
        )


# ----------------------------------------------------------------------------- ΔPPL
@register_result
@dataclasses.dataclass
class SinkInterventionResult(Result):
    """Model-level effect of zeroing the sink's projected value ``ṽ_0`` (every head).

    settings: ``"layer l"`` for each layer alone, then ``"all layers"``; ``delta``
    [setting]: ΔPPL (decoders) or mean embedding distance ``1 − cos(e', e)`` (encoders);
    ``clean``: clean PPL (decoders) or 0.
    """

    kind: ClassVar[str] = "sink_intervention"
    array_shapes = {"delta": "float?[setting]"}
    array_dims = {"setting": "settings"}

    metric: str
    settings: list
    delta: Tensor
    clean: float
    sink_index: int = 0
    n_docs: int = 0
    model_name: str = ""

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict]:
        name = "ΔPPL" if self.metric == "delta_ppl" else "1 − cos(e', e)"
        return [{"setting": s, name: float(d)} for s, d in zip(self.settings, self.delta)]

    def headline(self) -> dict:
        return {"metric": self.metric, "clean": float(self.clean),
                "delta_all_layers": float(self.delta[-1]) if len(self.delta) else float("nan")}

    def plot(self, ax=None):
        """Bars of the effect of zeroing the sink's value, per layer and for all layers."""
        return self._draw("plot", ax=ax)


@renamed_arguments(data="tokens")
def zero_sink_value(
    model: Any,
    tokens: Any,
    *,
    layers: Optional[Sequence[int]] = None,
    sink_index: int = 0,
    metric: Optional[str] = None,
    batch_size: int = 8,
    rows_per_pass: int = 64,
    attention_mask: Optional[Tensor] = None,
) -> SinkInterventionResult:
    """ΔPPL (or embedding change) when the sink's projected value is zeroed.

    Zeroing ``ṽ_0`` for every query is zeroing ``α_i0`` without renormalizing
    (``o' = o − α_i0 ṽ_0``), so the intervention reuses the faithfulness hooks
    (:func:`tl_spectral.probes.faithfulness.removal_hooks`) with the sink column removed.
    Settings: each layer of ``layers`` (default all) alone, then all of them at once.
    tokens: the documents (as for :func:`~tl_spectral.probes.runner.run_probes`; ``data=`` is
    its deprecated name).
    """
    # Long on purpose: the checks of every argument, then one loop over batches with
    # the clean and the intervened pass side by side (as faithfulness).
    from tl_spectral.analysis.faithfulness import allowed_mask
    from tl_spectral.probes.damage import (
        DamageMetric,
        by_length,
        logit_rows,
        padding_attention_mask,
    )
    from tl_spectral.probes.faithfulness import (
        check_targets,
        intervention_strategy,
        removal_hooks,
    )
    from tl_spectral.probes.runner import as_corpus, check_count, with_padding

    view = model if isinstance(model, ModelView) else ModelView(model)
    layers = list(range(view.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        view._check_layer(layer)
    batch_size = check_count("batch_size", batch_size)
    rows_per_pass = check_count("rows_per_pass", rows_per_pass)
    data, attention_mask = with_padding(view, tokens, attention_mask, "zero_sink_value")
    corpus = by_length(as_corpus(data, attention_mask))
    strategy = intervention_strategy(view)
    met = DamageMetric(view, metric)
    check_targets(met, corpus, "zero_sink_value")
    if met.metric == "delta_ppl":  # a pass's logits within LOGIT_BUDGET (large vocabularies)
        cap = logit_rows(view, int(corpus.tokens.shape[1]))
        batch_size, rows_per_pass = min(batch_size, cap), min(rows_per_pass, cap)
    settings = [[l] for l in layers] + [layers]
    names = [f"layer {l}" for l in layers] + ["all layers"]
    S = len(settings)
    dim = 2 if met.metric == "delta_ppl" else 1
    acc = torch.zeros(S, dim, dtype=torch.float64)
    clean_acc = torch.zeros(dim, dtype=torch.float64)
    for start in range(0, len(corpus), batch_size):
        tokens = corpus.tokens[start : start + batch_size]
        mask = corpus.mask[start : start + batch_size]
        T_b = int(mask.sum(1).max())
        tokens, mask = tokens[:, :T_b], mask[:, :T_b]
        if sink_index >= T_b:
            raise ValueError(f"sink_index {sink_index} is beyond the batch length {T_b}")
        b = tokens.shape[0]
        clean_rows = met.run(tokens, mask, [], attn_mask=padding_attention_mask(view, mask))
        allowed = allowed_mask(T_b, causal=view.causal, key_mask=mask, query_mask=mask)
        col = torch.zeros_like(allowed)
        col[..., sink_index] = True
        sink_mask = (allowed & col).to(view.device)  # [b, 1, T, T]
        none = torch.zeros_like(sink_mask)
        per = max(1, rows_per_pass // b)
        for c0 in range(0, S, per):
            chunk = list(range(c0, min(S, c0 + per)))
            masks = {}
            for layer in layers:
                parts = [sink_mask if layer in settings[si] else none for si in chunk]
                masks[layer] = torch.cat(parts, 0)
            tok_rep = tokens.repeat(len(chunk), 1)
            mask_rep = mask.repeat(len(chunk), 1)
            hooks = removal_hooks(view, masks, key_mask=mask_rep.to(view.device),
                                  strategy=strategy)
            stats = met.run(tok_rep, mask_rep, hooks,
                            attn_mask=padding_attention_mask(view, mask_rep))
            for ci, si in enumerate(chunk):
                row = stats[ci * b : (ci + 1) * b]
                if met.metric == "delta_ppl":
                    acc[si] += row.sum(0)
                else:
                    acc[si] += (1.0 - (row * clean_rows).sum(-1)).sum()
        if met.metric == "delta_ppl":
            clean_acc += clean_rows.sum(0)
    if met.metric == "delta_ppl":
        clean = math.exp(float(clean_acc[0] / clean_acc[1]))
        delta = torch.exp(acc[:, 0] / acc[:, 1]) - clean
    else:
        clean = 0.0
        delta = acc[:, 0] / len(corpus)
    bad = [n for n, d in zip(names, delta.tolist()) if not math.isfinite(d)]
    if bad or not math.isfinite(clean):
        import warnings

        warnings.warn(
            f"zero_sink_value: the effect is NaN or inf for {', '.join(bad) or 'the clean run'} "
            f"(clean {'PPL' if met.metric == 'delta_ppl' else 'value'} {clean:.4g}): the "
            "model's loss or hidden states are not finite on this corpus; check its weights "
            "and dtype (float32 avoids half-precision overflow)", RuntimeWarning, stacklevel=2)
    return SinkInterventionResult(
        metric=met.metric, settings=names, delta=delta.float(), clean=clean,
        sink_index=int(sink_index), n_docs=len(corpus), model_name=view.name,
    )
