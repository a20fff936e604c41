"""Model-side faithfulness evaluation (SPEC C.3): remove (query, source) pairs, measure damage.

For a removal fraction ``r`` each query ranks its allowed sources by a measure and the
top (comprehensiveness) or bottom (sufficiency) ``round(r · n_i)`` of them are removed by
zeroing ``α_ij`` without renormalizing (``tl_spectral.analysis.faithfulness``). The model is
then run again with the removal applied, either in every layer at once or in one chosen
layer, and the damage is measured:

* decoders: ``ΔPPL = PPL(intervened) − PPL(clean)``, next-token perplexity over the real
  positions of the corpus;
* encoders: the change of the sentence embedding, ``1 − cos(e', e)`` with ``e`` the mean
  over real tokens of the last hidden state (the all-MiniLM-L6-v2 pooling). *Choice*: an
  encoder such as all-MiniLM-L6-v2 has no trained language-model head (its checkpoint holds
  no MLM weights; TransformerLens attaches a random one), so a perplexity would measure
  noise; the sentence embedding is what the model is trained to produce.

How the removal reaches the model (:func:`intervention_strategy`, checked once per model):

* ``"pattern"``: a hook on ``blocks.{l}.attn.hook_pattern`` returns the pattern with the
  removed pairs zeroed. Works where the attention is computed by TransformerLens itself
  (``TransformerBridge.boot_native``, ``HookedTransformer``).
* ``"z"``: ``TransformerBridge.boot_transformers`` delegates attention to the Hugging Face
  module and fires ``hook_pattern`` *after* the output is computed, discarding edits (it
  warns "The edit is discarded"). There the hook on ``hook_z`` (the input of ``W_O``)
  subtracts the removed pairs' share, ``z'_i = z_i − Σ_{j removed} α_ij v_j``, with ``α``
  recomputed in the same pass from ``hook_q``/``hook_k`` (``softmax(q kᵀ / scale)`` with the
  causal and key-padding masks). The recomputation is validated against the model's own
  ``hook_pattern`` when the strategy is chosen; a backend where it does not match raises.

Both give exactly ``o'_i = o_i − Σ_{j removed} α_ij ṽ_j``, and at ``r = 0`` (no pair removed)
the forward pass is unchanged bit for bit (the z hook subtracts exact zeros).

Batched: the conditions (measure × top/bottom × fraction × setting) of one batch of
documents are stacked along the batch axis, ``rows_per_pass`` rows per forward pass, each
row with its own removal masks.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from typing import Any, Callable, ClassVar, Optional, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_spectral._deprecation import (
    check_choice,
    deprecated_method,
    renamed_arguments,
    warn_deprecated,
)
from tl_spectral.analysis.contributions import MEASURES, contribution_weights
from tl_spectral.analysis.faithfulness import (
    WHICH,
    allowed_mask,
    check_scope,
    curve_area,
    fraction_grid,
    removal_counts,
)
from tl_spectral.model_view import ModelView
from tl_spectral.probes.damage import (  # noqa: F401 - METRICS, by_length public here
    METRICS,
    DamageMetric,
    by_length,
    logit_rows,
    padding_attention_mask,
)
from tl_spectral.probes.runner import Corpus, as_corpus, check_count, with_padding
from tl_spectral.results import Result, register_result
from tl_spectral.types import ContributionMode, FaithfulnessLevel, FaithfulnessScope

STRATEGIES = ("pattern", "z")
PAPER_ORDER = ("attention", "value_weighted", "output_normalized", "contribution")
"""The paper's hierarchy of measures, worst to best."""
DEFAULT_MEASURES = (*MEASURES, "random")
EXTRA_MEASURES = ("random", "abs_contribution")
"""References beside the paper's measures: ``random`` (seeded uniform scores) and
``abs_contribution`` (``|C_ij|`` at token level, ``|c_ij^h|`` per head: a diagnostic that
ranks strongly destructive sources as important instead of unimportant)."""

_STRATEGY: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------- strategy
def _attn_scale(view: ModelView) -> float:
    cfg = view.cfg
    if not getattr(cfg, "use_attn_scale", True):
        return 1.0
    s = float(getattr(cfg, "attn_scale", -1.0) or -1.0)
    return s if s > 0 else math.sqrt(view.d_head)


def recompute_pattern(
    q: Float[Tensor, "batch query head d_head"],
    k: Float[Tensor, "batch key kv_head d_head"],
    *,
    scale: float,
    causal: bool,
    key_mask: Optional[Bool[Tensor, "batch key"]] = None,
) -> Float[Tensor, "batch head query key"]:
    """``softmax(q kᵀ / scale)`` with the causal and key-padding masks. [batch, head, query, key].

    Grouped-query keys are repeated over their query heads. Rows with no allowed key (a
    padded query of a causal model cannot occur here; all keys padded cannot either) are 0.
    """
    H, kv = q.shape[2], k.shape[2]
    if kv != H:
        k = k.repeat_interleave(H // kv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / scale
    T_q, T_k = scores.shape[-2:]
    allow = torch.ones(T_q, T_k, dtype=torch.bool, device=scores.device)
    if causal:
        allow = allow.tril(T_k - T_q)
    allow = allow[None, None]
    if key_mask is not None:
        allow = allow & key_mask.to(scores.device).bool()[:, None, None, :]
    scores = scores.masked_fill(~allow, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(p, nan=0.0)


def intervention_strategy(model: Any) -> str:
    """``"pattern"`` if editing ``hook_pattern`` changes the attention output, else ``"z"``.

    Steps: 1. run 6 tokens twice, once with layer 0's pattern halved, and compare layer 0's
    ``hook_z``; 2. if the edit was discarded, check that :func:`recompute_pattern` from
    ``hook_q``/``hook_k`` reproduces ``hook_pattern`` (max abs diff ≤ 1e-4) so the ``z``
    intervention is exact. Cached per model. Raises ``RuntimeError`` if neither works.
    """
    view = model if isinstance(model, ModelView) else ModelView(model)
    cached = _STRATEGY.get(view.model)
    if cached is not None:
        return cached
    view.check_patterns()
    n = min(6, view.n_ctx)
    vocab = max(2, view.d_vocab)
    tokens = (torch.arange(n) * 7 + 3).remainder(vocab).unsqueeze(0)
    caps: dict[str, Tensor] = {}

    def grab(key: str) -> Callable:
        def hook(t: Tensor, hook: Any = None) -> Tensor:
            caps[key] = t.detach().clone()
            return t

        return hook

    def halve(t: Tensor, hook: Any = None) -> Tensor:
        return t * 0.5

    names = {kind: f"blocks.0.attn.hook_{kind}" for kind in ("q", "k", "z", "pattern")}
    with torch.no_grad():
        view.run(
            tokens,
            fwd_hooks=[(names[k], grab(k)) for k in ("q", "k", "z", "pattern")],
            return_type=None,
        )
        clean = dict(caps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            view.run(
                tokens,
                fwd_hooks=[(names["pattern"], halve), (names["z"], grab("z_edit"))],
                return_type=None,
            )
    if not torch.allclose(caps["z_edit"], clean["z"]):
        strategy = "pattern"
    else:
        p = recompute_pattern(
            clean["q"], clean["k"], scale=_attn_scale(view), causal=view.causal
        )
        err = float((p - clean["pattern"].float()).abs().max())
        if err > 1e-4:
            raise RuntimeError(
                f"{view.name}: edits of hook_pattern are discarded by this backend, and the "
                f"pattern recomputed from hook_q/hook_k differs from hook_pattern by {err:.2e} "
                "(rotary or other position terms?), so pairs cannot be removed exactly; use a "
                "model whose attention TransformerLens computes (boot_native / HookedTransformer)"
            )
        strategy = "z"
    _STRATEGY[view.model] = strategy
    return strategy


# ----------------------------------------------------------------------------- hooks
def removal_hooks(
    view: ModelView,
    masks: dict[int, Bool[Tensor, "batch head_or_1 query key"]],
    *,
    key_mask: Optional[Bool[Tensor, "batch key"]] = None,
    strategy: Optional[str] = None,
) -> list[tuple[str, Callable]]:
    """Forward hooks that zero ``α_ij`` of the pairs marked True in ``masks[layer]``.

    masks: layer → bool ``[batch, head or 1, query, key]`` (head axis 1 = the same pairs in
    every head); key_mask: ``[batch, key]`` True at real tokens (needed by the ``z``
    strategy on padded batches); strategy: ``"pattern"`` | ``"z"`` (default: detected with
    :func:`intervention_strategy`).
    """
    strategy = strategy or intervention_strategy(view)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    hooks: list[tuple[str, Callable]] = []
    for layer, m in sorted(masks.items()):
        view._check_layer(layer)
        if m.dtype != torch.bool or m.ndim != 4:
            raise ValueError(
                f"masks[{layer}] must be a bool [batch, head or 1, query, key] tensor, got "
                f"{m.dtype} {tuple(m.shape)}"
            )
        if strategy == "pattern":
            hooks.append((view.hook_pattern(layer), _pattern_hook(m)))
        else:
            hooks.extend(_z_hooks(view, layer, m, key_mask))
    return hooks


def _pattern_hook(m: Tensor) -> Callable:
    def hook(t: Tensor, hook: Any = None) -> Tensor:
        return t.masked_fill(m.to(t.device), 0.0)

    return hook


def _z_hooks(view: ModelView, layer: int, m: Tensor, key_mask: Optional[Tensor]) -> list:
    store: dict[str, Tensor] = {}
    scale = _attn_scale(view)

    def grab(key: str) -> Callable:
        def hook(t: Tensor, hook: Any = None) -> Tensor:
            store[key] = t
            return t

        return hook

    def z_hook(t: Tensor, hook: Any = None) -> Tensor:
        p = recompute_pattern(
            store["q"].detach(), store["k"].detach(), scale=scale, causal=view.causal,
            key_mask=key_mask,
        )
        removed = p * m.to(p.device)
        v = view.repeat_kv(store["v"].detach().float(), 2)  # [b, k, H, d]
        delta = torch.einsum("bhqk,bkhd->bqhd", removed, v)
        store.clear()
        return t - delta.to(t.dtype)

    base = f"blocks.{layer}.attn"
    return [
        (f"{base}.hook_q", grab("q")),
        (f"{base}.hook_k", grab("k")),
        (f"{base}.hook_v", grab("v")),
        (f"{base}.hook_z", z_hook),
    ]


def check_targets(met: DamageMetric, corpus: Corpus, what: str) -> None:
    """ΔPPL needs a next-token target: refuse a corpus whose documents are all 1 token."""
    if met.metric == "delta_ppl" and int(corpus.mask.sum(1).max()) < 2:
        raise ValueError(
            f"{what} measures ΔPPL over next-token targets, and every document here has 1 "
            "token (no target); pass documents of at least 2 tokens"
        )


# ----------------------------------------------------------------------------- ranking
def removal_ranks(
    scores: Float[Tensor, "batch head_or_1 query key"],
    which: str,
    allowed: Bool[Tensor, "batch_or_1 head_or_1 query key"],
    scope: str = "query",
) -> Int[Tensor, "batch head query key"]:
    """Rank of each pair in the removal order of ``analysis.faithfulness.removal_mask``.

    The pairs removed at fraction ``r`` are exactly ``(rank < removal_counts(allowed, r))
    & allowed`` (``scope="query"``; for ``"layer"`` the count of :func:`scope_counts`), so
    one ranking serves every fraction. Same order as ``removal_mask``: stable sort by
    score (descending for ``top``, ascending for ``bottom``; ties → earlier key first, or
    earlier flattened (query, key) position for ``"layer"``), allowed pairs before
    disallowed ones. For ``"layer"`` the rank runs over the whole [query, key] slice. int32.
    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    check_scope(scope)
    shape = torch.broadcast_shapes(scores.shape, allowed.shape)
    if scope == "layer":
        flat = (*shape[:-2], 1, shape[-2] * shape[-1])
        r = removal_ranks(scores.expand(shape).reshape(flat), which,
                          allowed.to(scores.device).expand(shape).reshape(flat))
        return r.reshape(shape)
    s = scores.expand(shape)
    a = allowed.to(scores.device).expand(shape)
    if torch.isnan(s[a]).any():
        raise ValueError("scores have NaN on allowed pairs; mask or replace them first")
    key = s.double() if which == "bottom" else -s.double()
    order = torch.sort(key, dim=-1, stable=True).indices
    a_sorted = a.gather(-1, order)
    order = order.gather(-1, torch.sort((~a_sorted).to(torch.uint8), dim=-1, stable=True).indices)
    ranks = torch.empty(shape, dtype=torch.int32, device=scores.device)
    ar = torch.arange(shape[-1], device=order.device, dtype=torch.int32).expand(shape)
    ranks.scatter_(-1, order, ar.contiguous())
    return ranks


def scope_counts(allowed: Bool[Tensor, "batch_or_1 head_or_1 query key"], fraction: float,
                 scope: str = "query") -> Tensor:
    """Pairs to remove at ``fraction``, shaped to compare with :func:`removal_ranks`:
    ``[b, h, query, 1]`` per query (``"query"``) or ``[b, h, 1, 1]`` per layer slice
    (``"layer"``: ``round(fraction · N)``, N = allowed pairs of the slice)."""
    if check_scope(scope) == "layer":
        return removal_counts(allowed.flatten(-2), fraction)[..., None, None]
    return removal_counts(allowed, fraction).unsqueeze(-1)


def structural_aliases(measures: Sequence[str], mode: str, level: str,
                       scope: str = "query") -> dict[str, str]:
    """Measures whose removal order equals value_weighted's by construction.

    With ``scope="query"`` removal ranks each query's sources. ``output_normalized =
    α ‖ṽ_j‖ / ‖o‖`` divides the value-weighted score by a positive constant of the row
    when ``‖o‖ = ‖o_i‖`` (inter mode) or when each head ranks alone (``level="head"``,
    ``‖o_i^h‖`` constant per head and row): the same order in exact arithmetic (float
    rounding could only swap exact near-ties). With ``scope="layer"`` the factor varies
    across the ranked pairs (over queries), so nothing is aliased. Returns
    ``{"output_normalized[@mode]": "value_weighted[@…]"}``.
    """
    vw = next((m for m in measures if m.partition("@")[0] == "value_weighted"), None)
    out: dict[str, str] = {}
    if vw is None or check_scope(scope) == "layer":
        return out
    for m in measures:
        base, eff = _parse_measure(m, mode)
        if base == "output_normalized" and (eff == "inter" or level == "head"):
            out[m] = vw
    return out


def _parse_measure(name: str, mode: str) -> tuple[str, str]:
    base, _, m = name.partition("@")
    m = m or mode
    if base not in EXTRA_MEASURES and base not in MEASURES:
        raise ValueError(
            f"unknown measure {name!r}; use one of {MEASURES + EXTRA_MEASURES}, optionally "
            "with a mode suffix such as 'contribution@intra'"
        )
    if m not in ("intra", "inter"):
        raise ValueError(f"measure {name!r}: mode must be 'intra' or 'inter'")
    return base, m


# ----------------------------------------------------------------------------- result
@register_result
@dataclasses.dataclass
class FaithfulnessResult(Result):
    """Comprehensiveness and sufficiency curves and their areas.

    comprehensiveness, sufficiency: ``[setting, measure, fraction]`` damage (``metric``:
    ΔPPL for decoders, embedding distance ``1 − cos`` for encoders; 0 = no damage) after
    removing the top / bottom fraction of each query's sources; ``*_area``: ``[setting,
    measure]`` trapezoid area divided by the span of the fraction grid (the curve's mean);
    ``clean``: clean PPL (decoders) or 0. settings: e.g. ``["all layers", "layer 3"]``.
    ``aliases``: measure → a measure with the same removal order (by construction, see
    :func:`structural_aliases`, or found identical in every batch); its curves are copied,
    not recomputed. ``scope``: ``"query"`` or ``"layer"`` ranking (see
    ``analysis.faithfulness``). ``doc_stats``: per-document statistics ``[doc, setting,
    measure, 2 (top, bottom), fraction, 2 (NLL sum, target count) | 1 (embedding
    distance)]`` and ``clean_doc`` ``[doc, 2 | 1]`` (documents in the order the probe ran
    them: sorted by decreasing length), from which :meth:`area_intervals` and
    :meth:`area_difference` bootstrap over documents (None in results of older versions).
    """

    kind: ClassVar[str] = "faithfulness"
    main_plot: ClassVar[str | None] = "plot_curves"
    array_shapes = {
        "comprehensiveness": "float?[setting, measure, fraction]",
        "sufficiency": "float?[setting, measure, fraction]",
        "comprehensiveness_area": "float?[setting, measure]",
        "sufficiency_area": "float?[setting, measure]",
        "doc_stats": "float?[doc, setting, measure, 2, fraction, _]", "clean_doc": "float?[doc, _]",
    }
    array_dims = {"setting": "settings", "measure": "measures", "fraction": "fractions"}

    metric: str
    measures: list
    fractions: list
    settings: list
    comprehensiveness: Tensor
    sufficiency: Tensor
    comprehensiveness_area: Tensor
    sufficiency_area: Tensor
    clean: float
    mode: str = "inter"
    level: str = "token"
    layer: int = 0
    strategy: str = "pattern"
    n_docs: int = 0
    n_tokens: int = 0
    model_name: str = ""
    aliases: dict = dataclasses.field(default_factory=dict)
    scope: str = "query"
    doc_stats: Optional[Tensor] = None
    clean_doc: Optional[Tensor] = None

    def _areas(self, idx: Tensor) -> Tensor:
        """``[2 (comprehensiveness, sufficiency), setting, measure]`` areas of the documents
        ``idx`` (with repeats in a bootstrap resample)."""
        if self.doc_stats is None or self.clean_doc is None:
            raise ValueError("this result holds no per-document statistics (saved by an "
                             "older version); rerun faithfulness() to get intervals")
        d = self.doc_stats[idx].sum(0)  # [S, M, 2, F, dim]
        if self.metric == "delta_ppl":
            c = self.clean_doc[idx].sum(0)
            curves = torch.exp(d[..., 0] / d[..., 1].clamp_min(1.0)) - math.exp(
                float(c[0] / c[1].clamp_min(1.0)))
        else:
            curves = d[..., 0] / len(idx)
        return curve_area(self.fractions, curves).permute(2, 0, 1)

    def area_intervals(self, *, n_resamples: int = 1000, seed: int = 0,
                       level: float = 0.95) -> dict:
        """Bootstrap over documents of the curve areas: ``{"comprehensiveness_area":
        Intervals [setting, measure], "sufficiency_area": ...}``."""
        from tl_spectral.analysis.bootstrap import bootstrap

        iv = bootstrap(self._areas, self._n_docs_for_bootstrap(), n_resamples=n_resamples,
                       seed=seed, level=level)
        return {"comprehensiveness_area": iv[0], "sufficiency_area": iv[1]}

    def _n_docs_for_bootstrap(self) -> int:
        if self.doc_stats is None or self.clean_doc is None:
            self._areas(torch.arange(0))  # raises the clear error
        n = int(self.doc_stats.shape[0])  # type: ignore[union-attr]
        if n < 2:
            raise ValueError(f"a bootstrap needs at least 2 documents, this result has {n}")
        return n

    def area_difference(self, a: str, b: str, *, setting: int = 0, n_resamples: int = 1000,
                        seed: int = 0, level: float = 0.95) -> dict:
        """Paired bootstrap over documents of ``area(a) − area(b)`` for measures ``a`` and
        ``b``: ``{"comprehensiveness": Interval, "sufficiency": Interval}`` (an interval
        that excludes 0 separates the two measures on this corpus)."""
        from tl_spectral.analysis.bootstrap import bootstrap

        for m in (a, b):
            if m not in self.measures:
                raise ValueError(f"unknown measure {m!r}; this result has {self.measures}")
        ia, ib = self.measures.index(a), self.measures.index(b)
        n = self._n_docs_for_bootstrap()
        iv = bootstrap(lambda idx: (lambda A: A[:, setting, ia] - A[:, setting, ib])(
            self._areas(idx)), n, n_resamples=n_resamples, seed=seed, level=level)
        return {"comprehensiveness": iv[0], "sufficiency": iv[1]}

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self, setting: Optional[int] = None) -> list[dict[str, Any]]:
        """The main table (the Result protocol's, read by ``to_frame`` and the HTML view).

        One row per setting and measure: ``{setting, measure, comprehensiveness_area,
        sufficiency_area}``; with ``setting`` (an index into ``settings``), that setting's
        rows only, without the ``setting`` column.
        """
        if setting is None:
            return [{"setting": s, **row} for si, s in enumerate(self.settings)
                    for row in self.to_rows(si)]
        return [
            {
                "measure": m,
                "comprehensiveness_area": float(self.comprehensiveness_area[setting, i]),
                "sufficiency_area": float(self.sufficiency_area[setting, i]),
            }
            for i, m in enumerate(self.measures)
        ]

    def table(self, setting: int = 0) -> list[dict]:
        """Deprecated: use ``to_rows(setting)`` (removed in tl_spectral 0.3)."""
        warn_deprecated(f"{type(self).__name__}.table(setting)",
                        f"{type(self).__name__}.to_rows(setting)", stacklevel=3)
        return self.to_rows(setting)

    def ordering(self, setting: int = 0) -> dict:
        """Measures ordered best first (comprehensiveness: largest area; sufficiency:
        smallest), and, per contribution mode whose four measures were all evaluated,
        whether the paper's order attention < value_weighted < output_normalized <
        contribution holds (``paper_order[mode][criterion]``). A pair whose removal sets
        were identical (``aliases``) counts as a tie that does not break the order; the
        number of such ties is reported (``paper_order[mode]["ties"]``)."""
        comp = self.comprehensiveness_area[setting].tolist()
        suff = self.sufficiency_area[setting].tolist()
        idx = range(len(self.measures))
        out: dict[str, Any] = {
            "comprehensiveness": [self.measures[i] for i in sorted(idx, key=lambda i: -comp[i])],
            "sufficiency": [self.measures[i] for i in sorted(idx, key=lambda i: suff[i])],
            "paper_order": {},
        }
        for mode in ("inter", "intra"):
            chain = []
            for base in PAPER_ORDER:
                options = [f"{base}@{mode}"]
                if mode == self.mode:
                    options.insert(0, base)
                if base in ("attention", "value_weighted"):  # mode-independent
                    options += [base, f"{base}@inter", f"{base}@intra"]
                found = next((o for o in options if o in self.measures), None)
                chain.append(found)
            if None in chain:
                continue
            pos = [self.measures.index(n) for n in chain]
            res = {"measures": chain, "ties": 0}
            for crit, vals, better in (("comprehensiveness", comp, lambda a, b: b > a),
                                       ("sufficiency", suff, lambda a, b: b < a)):
                ok = True
                same = {**structural_aliases(self.measures, self.mode, self.level,
                                             self.scope), **self.aliases}
                for (na, ia), (nb, ib) in zip(zip(chain, pos), list(zip(chain, pos))[1:]):
                    if same.get(nb) == na or same.get(na) == nb:
                        res["ties"] += crit == "comprehensiveness"
                        continue
                    ok = ok and better(vals[ia], vals[ib])
                res[crit] = ok
            out["paper_order"][mode] = res
        return out

    def plot_curves(self):
        """Comprehensiveness and sufficiency curves, one panel per setting and criterion."""
        return self._draw("plot_curves")


# ----------------------------------------------------------------------------- main loop
def capture_layers(
    view: ModelView, tokens: Tensor, mask: Tensor, metric: Optional[DamageMetric] = None
) -> tuple[dict[int, tuple[Tensor, Tensor]], Optional[Tensor]]:
    """One clean pass: ``{layer: (pattern [b, H, T, T], v [b, T, H, d_head])}`` and, with a
    metric, its per-row clean statistics."""
    caps: dict[int, dict[str, Tensor]] = {}

    def grab(layer: int, kind: str) -> Callable:
        def hook(t: Tensor, hook: Any = None) -> Tensor:
            caps.setdefault(layer, {})[kind] = t.detach()
            return t

        return hook

    hooks = [(view.hook_pattern(l), grab(l, "pattern")) for l in range(view.n_layers)]
    hooks += [(view.hook_v(l), grab(l, "v")) for l in range(view.n_layers)]
    am = padding_attention_mask(view, mask)
    if metric is not None:
        stats = metric.run(tokens, mask, hooks, attn_mask=am)
    else:
        with torch.no_grad():
            view.run(tokens, attention_mask=am, fwd_hooks=hooks, return_type=None)
        stats = None
    out = {l: (c["pattern"], view.repeat_kv(c["v"], 2)) for l, c in caps.items()}
    return out, stats


def _measure_scores(
    view: ModelView, caps: dict, mask: Tensor, measures: Sequence[str], mode: str, level: str,
    gen: torch.Generator,
) -> dict[str, dict[int, Tensor]]:
    """measure → layer → scores ``[b, H|1, T, T]``."""
    out: dict[str, dict[int, Tensor]] = {m: {} for m in measures}
    qm = mask.to(view.device)
    for layer in range(view.n_layers):
        pattern, v = caps[layer]
        W_O = view.weights(layer).W_O.to(pattern.device)
        maps = {}
        for name in measures:
            base, m = _parse_measure(name, mode)
            if base == "random":
                shape = (pattern.shape[0], 1 if level == "token" else pattern.shape[1],
                         *pattern.shape[-2:])
                out[name][layer] = torch.rand(shape, generator=gen).to(pattern.device)
                continue
            if m not in maps:
                maps[m] = contribution_weights(pattern, v, W_O, m, qm)
            cm = maps[m]
            if base == "abs_contribution":
                c = cm.token_level("contribution") if level == "token" else cm.contribution
                out[name][layer] = c.abs()
                continue
            out[name][layer] = cm.token_level(base) if level == "token" else cm.measure(base)
        del maps
    return out


@renamed_arguments(data="tokens")
def faithfulness(
    model: Any,
    tokens: Any,
    *,
    layer: Optional[int] = None,
    measures: Sequence[str] = DEFAULT_MEASURES,
    fractions: Optional[Sequence[float]] = None,
    mode: ContributionMode = "inter",
    level: FaithfulnessLevel = "token",
    scope: FaithfulnessScope = "query",
    metric: Optional[str] = None,
    batch_size: int = 8,
    rows_per_pass: int = 64,
    seed: int = 0,
    attention_mask: Optional[Tensor] = None,
    progress: Optional[bool] = None,
) -> FaithfulnessResult:
    """Comprehensiveness and sufficiency curves of each measure (SPEC C.3).

    model: TransformerLens model or ModelView; tokens: anything ``as_corpus`` reads (right
    padded; ``data=`` is its deprecated name); layer: the one layer of the single-layer
    setting (default ``n_layers // 2``;
    the other setting removes in all layers at once); measures: names from
    ``analysis.contributions.MEASURES``, ``"random"`` (seeded uniform scores, a reference) or
    ``"abs_contribution"`` (``|C_ij|``, a diagnostic), optionally suffixed ``@intra`` / ``@inter`` to override ``mode``; fractions: removal grid
    (default 0, 0.1, …, 0.9); mode: contribution mode; level: ``"token"`` (a pair (i, j) is
    ranked by the sum over heads of the measure and removed in every head) or ``"head"``
    (each head ranks and removes its own pairs); scope: ``"query"`` (each query ranks its
    sources, SPEC C.3) or ``"layer"`` (all allowed pairs of a document's layer — per head at
    head level — ranked together, ``round(r · N)`` removed: a global ranking under which
    value-weighted and output-normalized can differ); metric: ``"delta_ppl"`` (decoders, default)
    or ``"embedding_distance"`` (encoders, default); rows_per_pass: rows of one batched
    intervention pass (documents × conditions); progress: a bar over the batches (None:
    on a terminal or in a notebook, once the run takes 2 s).

    Steps per batch of documents: 1. a clean pass captures every layer's pattern and values
    and the clean statistics; 2. every measure is computed per layer and its removal order
    ranked once (``removal_ranks``) for top and bottom; 3. the conditions (setting ×
    measure × top/bottom × fraction > 0, plus one fraction-0 run shared by all curves) are
    stacked ``rows_per_pass`` rows at a time and run with :func:`removal_hooks`; 4. the
    statistics are kept per document (``doc_stats``, for bootstrap intervals) and summed
    over the corpus, turned into ΔPPL (``exp`` of the mean NLL minus the clean PPL) or the
    mean embedding distance, and integrated (``curve_area``).
    """
    # Long on purpose: the checks of every argument, then one loop (batches × settings ×
    # measures) filling one statistics tensor; the steps inside are helpers already.
    view = model if isinstance(model, ModelView) else ModelView(model)
    check_choice("level", level, FaithfulnessLevel)
    check_choice("mode", mode, ContributionMode)
    check_scope(scope)
    measures = list(measures)
    if not measures or len(set(measures)) != len(measures):
        raise ValueError(f"measures must be a non-empty list of distinct names, got {measures}")
    for m in measures:
        _parse_measure(m, mode)
    fr = fraction_grid() if fractions is None else [float(f) for f in fractions]
    if len(fr) < 2 or fr[0] != 0.0 or any(b <= a for a, b in zip(fr, fr[1:])) or fr[-1] > 1:
        raise ValueError(f"fractions must increase strictly from 0 to at most 1, got {fr}")
    layer = view.n_layers // 2 if layer is None else int(layer)
    view._check_layer(layer)
    batch_size = check_count("batch_size", batch_size)
    rows_per_pass = check_count("rows_per_pass", rows_per_pass)
    data, attention_mask = with_padding(view, tokens, attention_mask, "faithfulness")
    corpus: Corpus = by_length(as_corpus(data, attention_mask))
    strategy = intervention_strategy(view)
    met = DamageMetric(view, metric)
    check_targets(met, corpus, "faithfulness")
    if met.metric == "delta_ppl":  # a pass's logits within LOGIT_BUDGET (large vocabularies)
        cap = logit_rows(view, int(corpus.tokens.shape[1]))
        batch_size, rows_per_pass = min(batch_size, cap), min(rows_per_pass, cap)
    settings = ["all layers", f"layer {layer}"]
    setting_layers = [list(range(view.n_layers)), [layer]]
    S, M, F = len(settings), len(measures), len(fr)
    gen = torch.Generator().manual_seed(seed)
    dim = 2 if met.metric == "delta_ppl" else 1
    # accumulated statistics per condition: [S, M, 2 (top, bottom), F, dim]
    doc_parts: list[Tensor] = []  # per batch: [b, S, M, 2, F, dim]
    clean_parts: list[Tensor] = []  # per batch: [b, dim]
    alias_seen: Optional[dict[str, str]] = None
    structural = structural_aliases(measures, mode, level, scope)
    scored = [m for m in measures if m not in structural]
    starts = range(0, len(corpus), batch_size)
    it: Any = starts
    if progress is not False:
        from tl_spectral.progress import progress_bar

        it = progress_bar(starts, desc="faithfulness", unit="batch", enabled=progress)
    for start in it:
        tokens = corpus.tokens[start : start + batch_size]
        mask = corpus.mask[start : start + batch_size]
        T_b = int(mask.sum(1).max())
        tokens, mask = tokens[:, :T_b], mask[:, :T_b]
        b = tokens.shape[0]
        caps, clean_rows = capture_layers(view, tokens, mask, met)
        assert clean_rows is not None
        allowed = allowed_mask(T_b, causal=view.causal, key_mask=mask, query_mask=mask).to(
            view.device
        )
        scores = _measure_scores(view, caps, mask, scored, mode, level, gen)
        del caps
        ranks: dict[tuple[str, str], dict[int, Tensor]] = {}
        for m in scored:
            for which in WHICH:
                ranks[m, which] = {
                    l: removal_ranks(scores[m][l], which, allowed, scope)
                    for l in range(view.n_layers)
                }
        del scores
        # measures whose removal order is identical to an earlier one's in this batch
        alias: dict[str, str] = dict(structural)
        for mi, m in enumerate(scored):
            for prev in scored[:mi]:
                if prev in alias:
                    continue
                if all(
                    torch.equal(ranks[m, w][l], ranks[prev, w][l])
                    for w in WHICH
                    for l in range(view.n_layers)
                ):
                    alias[m] = prev
                    break
        alias_seen = dict(alias) if alias_seen is None else {
            k: v for k, v in alias_seen.items() if alias.get(k) == v
        }
        counts = {f: scope_counts(allowed, f, scope) for f in fr}  # [b, 1, T | 1, 1]
        # conditions: (si, mi, wi, fi); fraction 0 once
        conds = [(0, 0, 0, 0)] + [
            (si, mi, wi, fi)
            for si in range(S)
            for mi, m in enumerate(measures)
            if m not in alias
            for wi in range(2)
            for fi in range(1, F)
        ]
        per = max(1, rows_per_pass // b)
        acc_b = torch.zeros(b, S, M, 2, F, dim, dtype=torch.float64)
        for c0 in range(0, len(conds), per):
            chunk = conds[c0 : c0 + per]
            masks: dict[int, Tensor] = {}
            for l in range(view.n_layers):
                parts = []
                any_l = False
                for si, mi, wi, fi in chunk:
                    if l in setting_layers[si] and fi > 0:
                        r = ranks[measures[mi], WHICH[wi]][l]
                        parts.append((r < counts[fr[fi]]) & allowed)
                        any_l = True
                    else:
                        parts.append(torch.zeros_like(allowed).expand(b, -1, -1, -1))
                if any_l:
                    hs = max(p.shape[1] for p in parts)
                    masks[l] = torch.cat([p.expand(-1, hs, -1, -1) for p in parts], 0)
            rows = len(chunk) * b
            tok_rep = tokens.repeat(len(chunk), 1)
            mask_rep = mask.repeat(len(chunk), 1)
            hooks = removal_hooks(view, masks, key_mask=mask_rep.to(view.device),
                                  strategy=strategy)
            stats = met.run(tok_rep, mask_rep, hooks,
                            attn_mask=padding_attention_mask(view, mask_rep))
            assert stats.shape[0] == rows
            for ci, (si, mi, wi, fi) in enumerate(chunk):
                row = stats[ci * b : (ci + 1) * b]
                if met.metric == "delta_ppl":
                    val = row  # [b, 2]: NLL sum, count per document
                else:  # embedding distance per document
                    val = (1.0 - (row * clean_rows).sum(-1)).unsqueeze(-1)
                if fi == 0:
                    acc_b[..., 0, :] += val[:, None, None, None, :]
                else:
                    acc_b[:, si, mi, wi, fi] += val
        for m in alias:
            root = m
            while root in alias:
                root = alias[root]
            acc_b[:, :, measures.index(m), :, 1:] = acc_b[:, :, measures.index(root), :, 1:]
        doc_parts.append(acc_b)
        clean_parts.append(clean_rows.double() if met.metric == "delta_ppl"
                           else torch.zeros(b, 1, dtype=torch.float64))
    doc_stats = torch.cat(doc_parts)
    clean_doc = torch.cat(clean_parts)
    acc = doc_stats.sum(0)
    clean_acc = clean_doc.sum(0)
    n_docs = len(corpus)
    if met.metric == "delta_ppl":
        n_tok = float(clean_acc[1])
        clean = math.exp(float(clean_acc[0]) / n_tok)
        curves = torch.exp(acc[..., 0] / acc[..., 1].clamp_min(1.0)) - clean
    else:
        n_tok = float(corpus.mask.sum())
        clean = 0.0
        curves = acc[..., 0] / n_docs
    comp, suff = curves[:, :, 0].float(), curves[:, :, 1].float()
    return FaithfulnessResult(
        metric=met.metric,
        measures=measures,
        fractions=fr,
        settings=settings,
        comprehensiveness=comp,
        sufficiency=suff,
        comprehensiveness_area=curve_area(fr, comp).float(),
        sufficiency_area=curve_area(fr, suff).float(),
        clean=clean,
        mode=mode,
        level=level,
        layer=layer,
        strategy=strategy,
        n_docs=n_docs,
        n_tokens=int(n_tok),
        model_name=view.name,
        aliases=alias_seen or {},
        scope=scope,
        doc_stats=doc_stats,
        clean_doc=clean_doc,
    )
