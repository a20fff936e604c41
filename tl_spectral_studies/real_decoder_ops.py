"""Operations of the real-decoder study on a Hugging Face decoder — Llama (SmolLM2-135M) or
Gemma 3 (Gemma-3-270M): attention re-implemented per layer with a chosen kernel, per-window
NLL, and the sink decomposition computed by brute force from the model's own modules.

The attention of a layer is recomputed from its ``q_proj``/``k_proj``/``v_proj``/``o_proj``
and the model's rotary ``(cos, sin)`` (the layer's own: Gemma 3 passes each layer the
embedding of its type, θ 10⁴ local / 10⁶ global). Gemma 3's pieces enter where its module
has them (:func:`_qkv`, :func:`_allowed`): QK-norm (``q_norm``/``k_norm``, RMSNorm per head
with gain ``1 + w``, applied before the rotation), one key/value head read by every query
head, the scaling ``query_pre_attn_scalar^(−1/2)`` (``attn.scaling``), the sliding window of
local layers (key j seen by query i when ``i − W < j ≤ i``); no score soft-cap (Gemma 3's
attention module passes none to its kernel). The per-token vectors below are the *normalized* query and key, so the routing /
filtering split of a QK-norm layer is that of the bilinear form on them (the folded form
``W_Q D_q R(Δ) D_k W_Kᵀ`` between RMS-normalized heads; see
:func:`tl_spectral.geometry.model.model_rotary_geometry`). A mode replaces the score:

* ``"none"``: softmax(q·k/sqrt(d)) — the layer as is (a test checks the logits are the
  model's own);
* ``"routing"`` / ``"filtering"``: only the skew (routing) or the symmetric (filtering) part
  of the folded kernel ``M(Δ) = W_Q C(−Δ) W_Kᵀ`` enters the score, ``½(x_i M x_jᵀ ∓ x_i Mᵀ
  x_jᵀ)``. With rotary positions ``x_i Mᵀ(Δ) x_jᵀ = k_i C(j − i) q_jᵀ``; a rotation conjugated
  by the reflection ``P`` (the second coordinate of every rotary pair negated) is its inverse,
  so ``k_i C(j−i) q_jᵀ = rope(k_i P, i) · rope(q_j P, j)``: the transposed kernel's score is
  one more product of per-token vectors (:func:`transposed_scores`);
* ``"linear"``: ELU+1 linear attention ``α_ij ∝ φ(q̂_i)·φ(k̂_j)`` on the layer's own rotated
  query and key (*choice*: rotated, so positions still enter; no ``1/sqrt(d)``, as
  :func:`tl_spectral.interventions.surgery.linearize` does);
* ``"zero_sink"``: ``α_i0`` set to 0 without renormalizing (the sink's projected value
  zeroed for every query, as :func:`tl_spectral.probes.sinks.zero_sink_value` does).

Only full (unpadded) windows are used: the causal (and sliding-window) mask is built here
and HF's attention mask is ignored.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

MODES = ("none", "routing", "filtering", "linear", "zero_sink")
HF_CLASSES = {"smollm2-135m": "LlamaForCausalLM", "gemma3-270m": "Gemma3ForCausalLM"}
"""The Hugging Face class of each zoo decoder the study recomputes."""
ATTENTIONS = ("LlamaAttention", "Gemma3Attention")
"""The attention modules :func:`attention_pattern` recomputes."""


def load_hf(model: str = "smollm2-135m", folder: Any = None) -> Any:
    """A plain Hugging Face decoder of :data:`HF_CLASSES` (float32, eager attention, eval)
    from the zoo model's cache folder (default :func:`tl_spectral.models.gguf.ensure_cache`,
    built on first use). The TransformerBridge's ``original_model`` cannot serve: the bridge
    swaps its attention modules for its own components."""
    import os

    if model not in HF_CLASSES:
        raise ValueError(f"no Hugging Face class for {model!r}; use one of {sorted(HF_CLASSES)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    if folder is None:
        from tl_spectral.models import gguf

        folder = gguf.ensure_cache(model, progress=False)
    cls = getattr(transformers, HF_CLASSES[model])
    hf = cls.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager")
    return hf.eval()


def hf_of(model: Any) -> Any:
    """``model`` itself when it is a Hugging Face Llama or Gemma 3 decoder (:func:`load_hf`)."""
    if not hasattr(model, "model") or not hasattr(model.model, "layers") or \
            type(model.model.layers[0].self_attn).__name__ not in ATTENTIONS:
        raise TypeError(f"expected a Hugging Face LlamaForCausalLM or Gemma3ForCausalLM "
                        f"(load_hf()), got {type(model).__name__}")
    return model


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    out, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return out


def _reflect(x: torch.Tensor) -> torch.Tensor:
    """``x P``: the second coordinate of every rotary pair negated (Llama's half pairing:
    pairs (f, f + d/2))."""
    h = x.shape[-1] // 2
    return torch.cat([x[..., :h], -x[..., h:]], -1)


def _qkv(attn: Any, hidden: torch.Tensor):
    """Unrotated ``q [b, H, T, d]``, ``k``, ``v [b, H_kv, T, d]``; QK-norm applied where the
    module has it (Gemma 3: before the rotation, as its forward does)."""
    b, T, _ = hidden.shape
    d = attn.head_dim
    q = attn.q_proj(hidden).view(b, T, -1, d).transpose(1, 2)
    k = attn.k_proj(hidden).view(b, T, -1, d).transpose(1, 2)
    v = attn.v_proj(hidden).view(b, T, -1, d).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, v


def _allowed(attn: Any, T: int, device: Any = None) -> torch.Tensor:
    """``[T, T]`` the keys each query sees: causal, and within the sliding window of a local
    layer (``i − W < j``, Hugging Face's ``sliding_window_overlay``)."""
    i = torch.arange(T, device=device)
    ok = i[None, :] <= i[:, None]
    w = getattr(attn, "sliding_window", None)
    if w is not None:
        ok = ok & (i[None, :] > i[:, None] - int(w))
    return ok


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def transposed_scores(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      groups: int) -> torch.Tensor:
    """``[b, H, T, T]`` with entry (i, j) = ``x_i M(j − i)ᵀ x_jᵀ`` (unscaled), from the
    unrotated ``q [b, H, T, d]`` and ``k [b, H_kv, T, d]``."""
    qh = _rope(_reflect(q), cos, sin)
    kh = _expand(_rope(_reflect(k), cos, sin), groups)
    return kh @ qh.transpose(-1, -2)


def attention_pattern(attn: Any, hidden: torch.Tensor, position_embeddings: Any, mode: str
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pattern [b, H, T, T], values [b, H, T, d])`` of one Llama attention module under
    ``mode`` (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"unknown attention mode {mode!r}; use one of {MODES}")
    cos, sin = position_embeddings
    q, k, v = _qkv(attn, hidden)
    groups = q.shape[1] // k.shape[1]
    causal = _allowed(attn, q.shape[-2], q.device)
    qr, kr = _rope(q, cos, sin), _expand(_rope(k, cos, sin), groups)
    vv = _expand(v, groups)
    if mode == "linear":
        w = (F.elu(qr) + 1) @ (F.elu(kr) + 1).transpose(-1, -2)
        w = w.masked_fill(~causal, 0.0)
        return w / w.sum(-1, keepdim=True), vv
    s = qr @ kr.transpose(-1, -2)
    if mode in ("routing", "filtering"):
        t = transposed_scores(q, k, cos, sin, groups)
        s = 0.5 * (s - t) if mode == "routing" else 0.5 * (s + t)
    s = (s * attn.scaling).float().masked_fill(~causal, float("-inf"))
    p = s.softmax(-1).to(q.dtype)
    if mode == "zero_sink":
        p = p.clone()
        p[..., 0] = 0.0
    return p, vv


def _forward(attn: Any, mode: str, capture: dict | None, hidden_states: torch.Tensor,
             position_embeddings: Any = None, attention_mask: Any = None, **kwargs: Any):
    p, vv = attention_pattern(attn, hidden_states, position_embeddings, mode)
    if capture is not None:
        capture[attn.layer_idx] = (p.detach(), vv.detach())
    b, _, T, _ = p.shape
    z = (p @ vv).transpose(1, 2).reshape(b, T, -1)
    return attn.o_proj(z), None


@contextlib.contextmanager
def patched(model: Any, modes: dict[int, str], capture: dict | None = None) -> Iterator[Any]:
    """The HF model with the attention of ``modes``' layers recomputed under their mode
    (other layers untouched); ``capture``: a dict filled with ``layer -> (pattern, values)``
    of the patched layers. Restores the modules on exit."""
    hf = hf_of(model)
    layers = hf.model.layers
    saved = {}
    try:
        for li, mode in modes.items():
            if not 0 <= int(li) < len(layers):
                raise ValueError(f"layer {li} out of range 0..{len(layers) - 1}")
            if mode not in MODES:
                raise ValueError(f"unknown attention mode {mode!r}; use one of {MODES}")
            attn = layers[int(li)].self_attn
            saved[int(li)] = attn.forward
            attn.forward = types.MethodType(
                lambda self, *a, _m=mode, **kw: _forward(self, _m, capture, *a, **kw), attn)
        yield hf
    finally:
        for li in saved:
            layers[li].self_attn.__dict__.pop("forward", None)  # back to the class's forward


def _nll(logits: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[b]`` float64 summed next-token NLL of the windows ``w`` from their logits."""
    logits = logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                           reduction="none").view(w.shape[0], -1).sum(1).double()


def window_nll(model: Any, tokens: torch.Tensor, modes: dict[int, str] | None = None, *,
               batch_size: int = 8, start: int = 0,
               inputs: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Summed next-token NLL of every window ``[n]`` (float64) under ``modes``; every window
    predicts ``T − 1`` tokens.

    ``start``, ``inputs``: the layers below ``start`` are not run; layer ``start`` reads the
    input hidden state of batch ``i`` from ``inputs[i][start]`` (:func:`layer_inputs` of the
    same windows and ``batch_size``). Where ``modes`` changes no layer below ``start`` this is
    the full pass's computation with its unchanged prefix read back (the one-layer-at-a-time
    removal runs the suffix only)."""
    modes = modes or {}
    start = int(start)
    if start and inputs is None:
        raise ValueError("window_nll: start > 0 needs inputs (layer_inputs of the same windows)")
    if any(int(li) < start for li in modes):
        raise ValueError(f"window_nll: modes {sorted(modes)} change a layer below start={start}; "
                         "its input would not be the stored one")
    out = []
    with patched(model, modes) as hf, skipped_prefix(hf, start) as feed, torch.no_grad():
        for b, s in enumerate(range(0, tokens.shape[0], batch_size)):
            w = tokens[s:s + batch_size]
            if start:
                h = inputs[b][start]  # type: ignore[index]
                if tuple(h.shape[:2]) != tuple(w.shape):
                    raise ValueError(f"window_nll: inputs of batch {b} are {tuple(h.shape)}, "
                                     f"not of windows {tuple(w.shape)}: use the same batch_size")
                feed(h)
            out.append(_nll(hf(w).logits, w))
    return torch.cat(out)


@contextlib.contextmanager
def skipped_prefix(model: Any, start: int) -> Iterator[Any]:
    """The decoder layers below ``start`` not run: each passes its input through and layer
    ``start − 1`` hands on the hidden state given to the yielded ``feed`` (the embeddings,
    masks and rotary tables are still made, which is cheap). Restores the layers on exit."""
    hf = hf_of(model)
    layers = hf.model.layers
    held: list[Any] = [None]

    def identity(*a: Any, **kw: Any) -> Any:
        return a[0] if a else kw["hidden_states"]

    def fed(*a: Any, **kw: Any) -> Any:
        if held[0] is None:
            raise RuntimeError("skipped_prefix: no hidden state fed for this batch")
        h, held[0] = held[0], None
        return h

    if not 0 <= int(start) < len(layers):
        raise ValueError(f"start {start} out of range 0..{len(layers) - 1}")
    try:
        for li in range(int(start)):
            layers[li].forward = fed if li == int(start) - 1 else identity
        yield lambda h: held.__setitem__(0, h)
    finally:
        for li in range(int(start)):
            layers[li].__dict__.pop("forward", None)


def layer_inputs(model: Any, tokens: torch.Tensor, *, batch_size: int = 8
                 ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """One clean pass: the summed NLL ``[n]`` (float64, as :func:`window_nll`) and, per batch
    of ``batch_size`` windows, the input hidden state of every decoder layer (``[L]`` tensors
    ``[b, T, d_model]``: what :func:`window_nll` reads with ``start``)."""
    hf = hf_of(model)
    layers = hf.model.layers
    cur: list[torch.Tensor | None] = [None] * len(layers)

    def grab(li: int) -> Any:
        def hook(mod: Any, args: tuple, kwargs: dict) -> None:
            cur[li] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return hook

    hooks = [blk.register_forward_pre_hook(grab(li), with_kwargs=True)
             for li, blk in enumerate(layers)]
    nll, saved = [], []
    try:
        with torch.no_grad():
            for s in range(0, tokens.shape[0], batch_size):
                w = tokens[s:s + batch_size]
                nll.append(_nll(hf(w).logits, w))
                saved.append(list(cur))  # type: ignore[arg-type]
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(nll), saved


def relative_ppl_change(clean: torch.Tensor, changed: torch.Tensor, n_pred: int, *,
                        n_resamples: int = 1000, seed: int = 0) -> dict:
    """PPL'/PPL − 1 over the windows (corpus PPL of each condition: exp of the summed NLL
    over the predicted tokens) with a paired percentile bootstrap over windows."""
    from tl_spectral.analysis.bootstrap import bootstrap

    def stat(idx: torch.Tensor) -> torch.Tensor:
        n = n_pred * len(idx)
        return torch.exp((changed[idx].sum() - clean[idx].sum()) / n) - 1.0

    iv = bootstrap(stat, int(clean.shape[0]), n_resamples=n_resamples, seed=seed)
    d = iv.to_dict()
    d["ppl_clean"] = math.exp(float(clean.sum()) / (n_pred * clean.shape[0]))
    d["ppl_changed"] = math.exp(float(changed.sum()) / (n_pred * clean.shape[0]))
    return d


# ------------------------------------------------------------------ sink decomposition
SINK_KEYS = ("attn0", "C0", "norm_factor", "cos_factor", "cos_factor_others",
             "v0_over_vothers", "tail_attn_share", "tail_C_share", "tail_neg_share",
             "rel_norm_change", "cos_o_zeroed", "cone_clean", "cone_zeroed")
"""Per layer and document (queries i ≥ 1): ``attn0`` mean α_i0 over heads and queries;
``C0`` mean token-level contribution of position 0 ``Σ_h α^h_i0 ⟨o_i, ṽ^h_0⟩/‖o_i‖²``;
its factors ``norm_factor`` (mean over heads and queries of ``‖ṽ^h_0‖/‖o_i‖``) and
``cos_factor`` (mean ``cos(o_i, ṽ^h_0)``), with ``cos_factor_others`` (the α-weighted mean
``cos(o_i, ṽ^h_j)`` over j ≥ 1) and ``v0_over_vothers`` (head mean of ``‖ṽ^h_0‖`` over the
mean ``‖ṽ^h_j‖``, j ≥ 1); tail tokens (j ≥ 1 with α^h_ij below the uniform 1/(i+1), per
head): their share of the attention, of the contribution ``Σ c`` and the share of their
contributions that are negative; the zero-the-sink intervention on the layer output
``o' = o − Σ_h α^h_i0 ṽ^h_0``: mean ``‖o'‖/‖o‖ − 1``, mean ``cos(o', o)``, and the mean
pairwise cosine of the outputs of a document (``cone_*``: a narrow cone is near 1)."""


def _mean_pair_cos(o: torch.Tensor) -> torch.Tensor:
    """Mean cosine over distinct pairs of the rows of ``o [n, d]``."""
    u = o / o.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    n = u.shape[0]
    g = u @ u.T
    return (g.sum() - g.diagonal().sum()) / (n * (n - 1))


def sink_decomposition(pattern: torch.Tensor, values: torch.Tensor, W_O: torch.Tensor
                       ) -> dict[str, torch.Tensor]:
    """:data:`SINK_KEYS` per document ``[b]`` of one layer, by brute force.

    pattern ``[b, H, T, T]``; values ``[b, H, T, d]`` (key heads expanded); W_O ``[H, d,
    d_model]``."""
    p, v = pattern.double(), values.double()
    W = W_O.double()
    vt = torch.einsum("bhjd,hdm->bhjm", v, W)  # ṽ [b, H, T, m]
    o_h = p @ vt  # [b, H, T, m]
    o = o_h.sum(1)  # [b, T, m]
    q = slice(1, None)  # queries i >= 1
    on = o.norm(dim=-1)  # [b, T]
    vn = vt.norm(dim=-1)  # [b, H, T]
    dot = torch.einsum("bim,bhjm->bhij", o, vt)  # ⟨o_i, ṽ_j⟩
    c = p * dot / (on[:, None, :, None] ** 2)  # c^h_ij [b, H, T, T]
    cos = dot / (on[:, None, :, None] * vn[:, :, None, :]).clamp_min(1e-30)
    out: dict[str, torch.Tensor] = {}
    out["attn0"] = p[:, :, q, 0].mean((1, 2))
    out["C0"] = c[:, :, q, 0].sum(1).mean(1)
    out["norm_factor"] = (vn[:, :, None, 0] / on[:, None, q]).mean((1, 2))
    out["cos_factor"] = cos[:, :, q, 0].mean((1, 2))
    po = p[:, :, q, 1:]
    out["cos_factor_others"] = (po * cos[:, :, q, 1:]).sum((1, 2, 3)) / po.sum((1, 2, 3))
    out["v0_over_vothers"] = (vn[:, :, 0] / vn[:, :, 1:].mean(-1)).mean(1)
    T = p.shape[-1]
    i = torch.arange(T, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    key_not0 = torch.ones(T, T, dtype=torch.bool)
    key_not0[:, 0] = False
    tail = (p < (1.0 / (i + 1))[:, None]) & causal & key_not0  # [b, H, T, T]
    tail[:, :, 0] = False
    H = p.shape[1]
    n_q = H * (T - 1)
    out["tail_attn_share"] = (p * tail).sum((1, 2, 3)) / n_q
    out["tail_C_share"] = (c * tail).sum((1, 2, 3)) / (T - 1)  # Σ_j C_ij = 1 per query
    out["tail_neg_share"] = ((c < 0) & tail).sum((1, 2, 3)) / tail.sum((1, 2, 3)).clamp_min(1)
    o0 = torch.einsum("bhi,bhm->bim", p[..., 0], vt[:, :, 0])  # Σ_h α_i0 ṽ_0
    oz = o - o0
    ozn = oz.norm(dim=-1)
    out["rel_norm_change"] = (ozn[:, q] / on[:, q] - 1).mean(1)
    out["cos_o_zeroed"] = ((o * oz).sum(-1)[:, q] / (on * ozn).clamp_min(1e-30)[:, q]).mean(1)
    out["cone_clean"] = torch.stack([_mean_pair_cos(o[d, q]) for d in range(o.shape[0])])
    out["cone_zeroed"] = torch.stack([_mean_pair_cos(oz[d, q]) for d in range(o.shape[0])])
    return out


def layer_W_O(model: Any, layer: int) -> torch.Tensor:
    """``W_O [H, d, d_model]`` of a layer from its ``o_proj``."""
    attn = hf_of(model).model.layers[layer].self_attn
    W = attn.o_proj.weight.detach()  # [d_model, H·d]
    d = attn.head_dim
    return W.T.reshape(-1, d, W.shape[0])


def sink_decompositions(model: Any, tokens: torch.Tensor, layers: Sequence[int] | None = None,
                        *, batch_size: int = 4) -> dict[str, torch.Tensor]:
    """:func:`sink_decomposition` of every layer: ``{key: [n_docs, n_layers]}`` plus
    ``"max_head_attn0"`` ``[n_docs, n_layers, H]`` (per-head mean α_i0)."""
    hf = hf_of(model)
    L = len(hf.model.layers)
    layers = list(range(L)) if layers is None else [int(x) for x in layers]
    W = {li: layer_W_O(model, li) for li in layers}
    rows: dict[str, list] = {k: [] for k in (*SINK_KEYS, "head_attn0")}
    for s in range(0, tokens.shape[0], batch_size):
        cap: dict = {}
        with patched(model, {li: "none" for li in layers}, capture=cap), torch.no_grad():
            hf(tokens[s:s + batch_size])
        per = {k: [] for k in rows}
        for li in layers:
            p, v = cap[li]
            d = sink_decomposition(p, v, W[li])
            for k in SINK_KEYS:
                per[k].append(d[k])
            per["head_attn0"].append(p[:, :, 1:, 0].double().mean(-1))
        for k in rows:
            rows[k].append(torch.stack(per[k], 1))
    return {k: torch.cat(v, 0) for k, v in rows.items()}
