"""Convert a tl_spectral :class:`~tl_spectral.models.gpt.GPT` into a TransformerLens model.

On TransformerLens 4.x the result is a ``TransformerBridge`` around TransformerLens' own
native model (``TransformerBridge.boot_native``); on TransformerLens 3.9 it is a
``HookedTransformer``. Either way ``tl_model(tokens)`` returns the same logits as
``model(tokens)`` (float32: max abs difference <= 1e-4, tested) and every standard hook
(``blocks.{l}.attn.hook_pattern``, ``hook_q/k/v/z``, ``hook_resid_*``...) is available.

What the converter guarantees and how:

- **Normalization.** ``"ln"`` maps to ``normalization_type="LN"`` (same eps), ``"none"`` to
  ``normalization_type=None`` (no LayerNorm anywhere, the final one included).
- **Softmax attention** maps one-to-one (W_Q, W_K, W_V, W_O and their biases).
- **S–D attention** (SPEC B.7): ``W_Q = W_P (S − D)``, ``W_K = W_P``,
  ``b_Q = b_P (S − D)``, ``b_K = b_P``; values and output unchanged. The pattern of the
  converted model equals the S–D pattern.
- **Unequal head dimensions per layer** are zero-padded to the largest, ``d_max``: the padded
  query/key/value coordinates are zero, so scores and outputs are unchanged, and W_Q, b_Q of
  a layer with ``d_head_l < d_max`` are multiplied by ``sqrt(d_max / d_head_l)`` so that
  TransformerLens' ``1/sqrt(d_max)`` scale gives the layer's own ``1/sqrt(d_head_l)``.
  (``hook_q`` of such a layer is therefore the scaled, padded query.)
- **Rotary positions** (``positional="rotary"``) map to ``positional_embedding_type="rotary"``
  with the same ``rotary_dim`` and ``rotary_base``; our :class:`~tl_spectral.models.attention.
  Rotary` uses TransformerLens' native adjacent pairing ``(2k, 2k+1)`` and computes its
  cos/sin tables with the same operations, so rotated q, k agree bit for bit (TL 3.9:
  ``rotary_adjacent_pairs=True``). Zero padding of unequal head dimensions appends
  coordinates after ``rotary_dim`` (which is at most every d_head), so it commutes with the
  rotation.
- **Tied embeddings** are copied into both the embedding and the unembedding.
- **Exactness.** In eval mode our model computes attention and LayerNorm with the same
  operations as TransformerLens' native model and bridge (explicit softmax pattern, the
  folded S–D query, LayerNorm written out), so the logits of a softmax / S–D model with
  uniform head dimensions are typically bit-identical; training mode uses fused kernels
  (``scaled_dot_product_attention``, fused LayerNorm) that agree to float32 round-off.
- **Linear attention** (SPEC B.5) becomes a standard attention layer with W_Q, W_K, W_V, W_O
  copied (no 1/sqrt(d) correction, zero-padded when needed) plus three *permanent* hooks
  (:func:`install_linear_pattern_hooks`): ``blocks.{l}.attn.hook_q`` and ``hook_k`` are
  captured, and ``blocks.{l}.attn.hook_pattern`` returns the causal linear pattern
  ``α_ij = φ(q_i)·φ(k_j) / Σ_{j'<=i} φ(q_i)·φ(k_j')`` (``φ = elu + 1``, on the layer's own
  ``d_head`` coordinates). TransformerLens applies the pattern hook before the value matmul,
  so the logits equal the native model's, and every probe that reads ``hook_pattern`` (hooks
  registered later run after the permanent one) sees the linear pattern. The hooks survive
  ``reset_hooks()``; ``reset_hooks(including_permanent=True)`` removes them and turns the
  layer back into softmax attention over the same q, k (a different model).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tl_spectral.models.gpt import GPT


def tl_major_version() -> int:
    """3 when TransformerLens 3.x (HookedTransformer) is installed, else 4."""
    try:
        import transformer_lens.HookedTransformer  # noqa: F401  (exists on 3.x only)

        return 3
    except ImportError:
        return 4


def _check_model(model: GPT) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"to_transformer_lens expects a tl_spectral GPT, got "
                        f"{type(model).__name__}")
    for l in range(model.cfg.n_layers):
        kind = model.cfg.layer_attention(l)
        if kind not in ("softmax", "sd", "linear"):
            raise NotImplementedError(
                f"layer {l} uses {kind!r} attention, which TransformerLens' softmax attention "
                "cannot express; only 'softmax', 'sd' and 'linear' layers convert"
            )
    heads = model.cfg.heads_per_layer
    if len(set(heads)) > 1:
        raise NotImplementedError(
            f"the model has {heads} heads per layer; TransformerLens needs one head count for "
            "every layer, so a head-allocated GPT does not convert (train, evaluate and "
            "measure it natively with tl_spectral.models)"
        )


def tl_attention_weights(model: GPT) -> list[dict[str, torch.Tensor]]:
    """Per layer, the TransformerLens attention weights after S–D folding, padding and
    scale correction (all float32 on CPU): W_Q, W_K, W_V [head, d_model, d_max];
    b_Q, b_K, b_V [head, d_max]; W_O [head, d_max, d_model]; b_O [d_model]."""
    _check_model(model)
    d_max = max(model.cfg.d_heads)
    out = []
    for l, blk in enumerate(model.blocks):
        w = {k: v.detach().float().cpu() for k, v in blk.attn.weights().items()}
        d = w["W_Q"].shape[-1]
        pad = d_max - d
        if pad:
            if model.cfg.layer_attention(l) != "linear":  # linear layers: hooks read raw q
                scale = math.sqrt(d_max / d)
                w["W_Q"] = w["W_Q"] * scale
                w["b_Q"] = w["b_Q"] * scale
            for k in ("W_Q", "W_K", "W_V"):
                w[k] = torch.nn.functional.pad(w[k], (0, pad))
            for k in ("b_Q", "b_K", "b_V"):
                w[k] = torch.nn.functional.pad(w[k], (0, pad))
            w["W_O"] = torch.nn.functional.pad(w["W_O"], (0, 0, 0, pad))
        out.append(w)
    return out


def to_transformer_lens_config(model: GPT, *, device: str | torch.device = "cpu"):
    """The TransformerLens config of the converted model.

    TL 4.x: a ``TransformerBridgeConfig``; TL 3.9: a ``HookedTransformerConfig``. d_head is
    the largest head dimension of the model (smaller ones are zero-padded);
    ``normalization_type`` is ``"LN"`` or ``None``.
    """
    _check_model(model)
    c = model.cfg
    common: dict[str, Any] = {
        "d_model": c.d_model,
        "d_head": max(c.d_heads),
        "n_layers": c.n_layers,
        "n_ctx": c.n_ctx,
        "n_heads": c.layer_n_heads(0),
        "d_vocab": c.vocab_size,
        "d_mlp": c.d_mlp,
        "act_fn": "gelu",
        "eps": c.ln_eps,
        "normalization_type": "LN" if c.normalization == "ln" else None,
        "attention_dir": "causal",
        "positional_embedding_type": "rotary" if c.positional == "rotary" else "standard",
        "original_architecture": "tl_spectral.GPT",
        "model_name": "tl_spectral-gpt",
    }
    if c.positional == "rotary":
        common["rotary_dim"], common["rotary_base"] = c.rotary_dim, c.rotary_base
    if tl_major_version() == 3:  # pragma: no cover - TL 3.9 only
        from transformer_lens import HookedTransformerConfig

        if c.positional == "rotary":
            common["rotary_adjacent_pairs"] = True
        return HookedTransformerConfig(**common, d_vocab_out=c.vocab_size, device=str(device),
                                       default_prepend_bos=False)
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(**common, d_vocab_out=c.vocab_size, seed=0,
                                   tokenizer_prepends_bos=False)


def to_transformer_lens(model: GPT, *, device: str | torch.device = "cpu", tokenizer=None):
    """A TransformerLens model computing the same function as ``model``.

    Returns a ``TransformerBridge`` (TL 4.x) or ``HookedTransformer`` (TL 3.9) in eval mode,
    float32, on ``device``. ``tl_model(tokens [batch, pos])`` -> logits [batch, pos, vocab]
    equal to ``model(tokens)`` (max abs diff <= 1e-4). ``tokenizer`` is attached when given
    (a Hugging Face tokenizer; the character tokenizers of this project are returned beside
    the model by :func:`tl_spectral.zoo.load` instead).
    """
    cfg = to_transformer_lens_config(model, device=device)
    if tl_major_version() == 3:
        return _to_hooked_transformer(model, cfg, device)
    return _to_bridge(model, cfg, device, tokenizer)


def _to_bridge(model: GPT, cfg, device, tokenizer):
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (attaches boot_native)
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_native(cfg, tokenizer=tokenizer)
    native = bridge.original_model
    params = {n.replace("._original_component", ""): p for n, p in native.named_parameters()}
    c = model.cfg
    H, d_max, dm = c.layer_n_heads(0), max(c.d_heads), c.d_model
    src: dict[str, torch.Tensor] = {
        "tok_embed.weight": model.tok_embed.weight,
        "head.weight": model.unembed.weight,
    }
    if model.pos_embed is not None:
        src["pos.weight"] = model.pos_embed.weight
    if c.normalization == "ln":
        src["ln_out.weight"], src["ln_out.bias"] = model.ln_f.weight, model.ln_f.bias
    for l, (blk, w) in enumerate(zip(model.blocks, tl_attention_weights(model))):
        p = f"layers.{l}."
        for name, W, b in (("q", w["W_Q"], w["b_Q"]), ("k", w["W_K"], w["b_K"]),
                           ("v", w["W_V"], w["b_V"])):
            src[p + f"attn.{name}.weight"] = W.permute(0, 2, 1).reshape(H * d_max, dm)
            src[p + f"attn.{name}.bias"] = b.reshape(H * d_max)
        src[p + "attn.o.weight"] = w["W_O"].reshape(H * d_max, dm).T
        src[p + "attn.o.bias"] = w["b_O"]
        src[p + "mlp.fc_in.weight"], src[p + "mlp.fc_in.bias"] = (blk.mlp.fc_in.weight,
                                                                  blk.mlp.fc_in.bias)
        src[p + "mlp.fc_out.weight"], src[p + "mlp.fc_out.bias"] = (blk.mlp.fc_out.weight,
                                                                    blk.mlp.fc_out.bias)
        if c.normalization == "ln":
            for ln in ("ln1", "ln2"):
                mod = getattr(blk, ln)
                src[p + f"{ln}.weight"], src[p + f"{ln}.bias"] = mod.weight, mod.bias
    missing = sorted(set(params) - set(src))
    unused = sorted(set(src) - set(params))
    if missing or unused:
        raise RuntimeError(  # the native model's layout changed under us
            f"TransformerLens native model layout not understood: no source for {missing}, "
            f"no target for {unused}"
        )
    with torch.no_grad():
        for name, value in src.items():
            target = params[name]
            if target.shape != value.shape:
                raise RuntimeError(f"{name}: native shape {tuple(target.shape)} vs "
                                   f"converted {tuple(value.shape)}")
            target.copy_(value.detach().to(target.dtype))
    bridge.to(device)
    bridge.eval()
    install_linear_pattern_hooks(bridge, _linear_layers(model))
    return bridge


def _to_hooked_transformer(model: GPT, cfg, device):  # pragma: no cover - TL 3.9 only
    from transformer_lens import HookedTransformer

    ht = HookedTransformer(cfg)
    c = model.cfg
    sd: dict[str, torch.Tensor] = {
        "embed.W_E": model.tok_embed.weight.detach(),
        "unembed.W_U": model.unembed.weight.detach().T,
        "unembed.b_U": torch.zeros(c.vocab_size),
    }
    if model.pos_embed is not None:
        sd["pos_embed.W_pos"] = model.pos_embed.weight.detach()
    if c.normalization == "ln":
        sd["ln_final.w"], sd["ln_final.b"] = model.ln_f.weight.detach(), model.ln_f.bias.detach()
    for l, (blk, w) in enumerate(zip(model.blocks, tl_attention_weights(model))):
        p = f"blocks.{l}."
        for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            sd[p + "attn." + k] = w[k]
        sd[p + "mlp.W_in"] = blk.mlp.fc_in.weight.detach().T
        sd[p + "mlp.b_in"] = blk.mlp.fc_in.bias.detach()
        sd[p + "mlp.W_out"] = blk.mlp.fc_out.weight.detach().T
        sd[p + "mlp.b_out"] = blk.mlp.fc_out.bias.detach()
        if c.normalization == "ln":
            for ln in ("ln1", "ln2"):
                mod = getattr(blk, ln)
                sd[p + f"{ln}.w"], sd[p + f"{ln}.b"] = mod.weight.detach(), mod.bias.detach()
    sd = {k: v.float().contiguous() for k, v in sd.items()}
    expected = ht.state_dict()
    missing = [k for k in expected if k not in sd and not _is_buffer_key(k)]
    unknown = [k for k in sd if k not in expected]
    if missing or unknown:
        raise RuntimeError(f"HookedTransformer layout not understood: missing {missing}, "
                           f"unknown {unknown}")
    ht.load_state_dict(sd, strict=False)
    ht.to(device)
    ht.eval()
    install_linear_pattern_hooks(ht, _linear_layers(model))
    return ht


def _is_buffer_key(k: str) -> bool:  # pragma: no cover - TL 3.9 only
    return k.endswith(("IGNORE", "mask", ".attn.rotary_sin", ".attn.rotary_cos"))


def max_logit_diff(model: GPT, tl_model, tokens: torch.Tensor) -> float:
    """max |model(tokens) − tl_model(tokens)| over tokens [batch, pos] (no grad), with
    ``model`` in eval mode (restored afterwards)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            a = model(tokens)
            b = tl_model(tokens)
    finally:
        model.train(was_training)
    return float((a.float() - b.float().to(a.device)).abs().max())


# ------------------------------------------------------------------- linear attention
def _linear_layers(model: GPT) -> dict[int, int]:
    """{layer: d_head} of the model's ``"linear"`` attention layers."""
    return {l: model.cfg.layer_d_head(l) for l in range(model.cfg.n_layers)
            if model.cfg.layer_attention(l) == "linear"}


class LinearPatternHook:
    """Permanent hooks that turn a TransformerLens softmax attention layer into causal ELU+1
    linear attention on the same q, k, v (SPEC B.5).

    ``capture_q`` / ``capture_k`` (on ``hook_q`` / ``hook_k``, ``[batch, pos, head, d]``)
    keep the first ``d_head`` coordinates (the rest is zero padding, where φ(0) = 1 would
    add a constant); ``pattern`` (on ``hook_pattern``, ``[batch, head, query, key]``) returns
    ``linear_attention_pattern(q, k)`` in place of the softmax pattern. The hook points must
    sit before any rotary embedding and before the softmax scale (true for TransformerLens'
    ``hook_q`` / ``hook_k``); the causal mask is the only mask applied (right padding of a
    causal model leaves real tokens unchanged).
    """

    def __init__(self, layer: int, d_head: int):
        self.layer, self.d_head = int(layer), int(d_head)
        self._q: torch.Tensor | None = None
        self._k: torch.Tensor | None = None

    def capture_q(self, t: torch.Tensor, hook=None) -> torch.Tensor:
        self._q = t[..., :self.d_head]
        return t

    def capture_k(self, t: torch.Tensor, hook=None) -> torch.Tensor:
        self._k = t[..., :self.d_head]
        return t

    def pattern(self, pattern: torch.Tensor, hook=None) -> torch.Tensor:
        from tl_spectral.models.attention import linear_attention_pattern

        if self._q is None or self._k is None:
            raise RuntimeError(f"layer {self.layer}: hook_pattern fired before hook_q/hook_k; "
                               "the linear-attention hooks need TransformerLens' standard order")
        q, k = self._q.transpose(1, 2), self._k.transpose(1, 2)  # [b, head, pos, d]
        self._q = self._k = None
        if k.shape[1] != q.shape[1]:  # grouped keys: repeat to the query heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        lin = linear_attention_pattern(q.float(), k.float())
        return lin.to(pattern.dtype)

    def names(self) -> dict[str, str]:
        p = f"blocks.{self.layer}.attn."
        return {"q": p + "hook_q", "k": p + "hook_k", "pattern": p + "hook_pattern"}


def install_linear_pattern_hooks(tl_model, layers: dict[int, int]) -> list[LinearPatternHook]:
    """Add the permanent :class:`LinearPatternHook` of every ``{layer: d_head}`` to a
    TransformerBridge / HookedTransformer. Returns the hook objects (one per layer)."""
    hooks = []
    for l, d in sorted(layers.items()):
        h = LinearPatternHook(l, d)
        n = h.names()
        tl_model.add_perma_hook(n["q"], h.capture_q)
        tl_model.add_perma_hook(n["k"], h.capture_k)
        tl_model.add_perma_hook(n["pattern"], h.pattern)
        hooks.append(h)
    return hooks
