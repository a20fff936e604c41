"""ModelView: the one adapter between tl_spectral and TransformerLens.

Supports ``TransformerBridge`` (TransformerLens 4.x, also present in 3.9) and
``HookedTransformer`` / ``HookedEncoder`` (TransformerLens 3.9). Everything else in the
library asks a ModelView for hook names, dimensions and weights, never the model itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

CAPTURE_KINDS = ("resid_pre", "attn_in", "v", "pattern", "q", "k", "z", "mlp_out", "resid_post")
"""Tensors a probe can ask for, per layer (the runner hooks each needed one once per layer and
batch, whatever the number of probes reading it).

- ``resid_pre``: ``[batch, pos, d_model]`` residual stream entering block ``l``.
- ``attn_in``: ``[batch, pos, d_model]`` the input of the attention (after ln1 when the
  model is pre-LN; the residual stream for post-LN encoders such as BERT).
- ``q``, ``k``, ``v``: ``[batch, pos, head, d_head]`` queries, keys and values; keys and
  values are repeated to the query heads for grouped-query models. Queries and keys are the
  projections ``x W_Q + b_Q``, ``x W_K + b_K`` before any QK-norm and before rotary positions
  (Gemma 3's bridge: ``hook_q_normed`` / ``hook_rot_q`` hold the normalized and rotated ones).
- ``pattern``: ``[batch, head, query, key]`` post-softmax attention pattern.
- ``z``: ``[batch, pos, head, d_head]`` each head's pattern-weighted values (before W_O).
- ``mlp_out``: ``[batch, pos, d_model]`` the MLP's output (what it adds to the residual).
- ``resid_post``: ``[batch, pos, d_model]`` residual stream leaving block ``l``
  (TransformerLens' ``hook_resid_post``).

In the order of one block's forward pass: resid_pre, attn_in, q, k, v, pattern, z, mlp_out,
resid_post (the first four keep their historical positions in the tuple).
"""

#: TransformerLens hook name of each capture kind (``{layer}`` filled in); ``attn_in`` depends
#: on the backend (see :meth:`ModelView.hook_name`).
_HOOK_NAMES = {
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "v": "blocks.{layer}.attn.hook_v",
    "q": "blocks.{layer}.attn.hook_q",
    "k": "blocks.{layer}.attn.hook_k",
    "z": "blocks.{layer}.attn.hook_z",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
}


class _BlocksDone(Exception):
    """Raised by :meth:`ModelView.run` once the last hooked block has run (nothing after it
    is wanted)."""


def _last_hooked_block(fwd_hooks: list) -> Optional[int]:
    """The largest ``l`` of hook names ``blocks.{l}.…``, or None when some hook is not on a
    block (a name filter, the embedding, the final norm, the unembedding) or there is none."""
    last = None
    for name, _ in fwd_hooks:
        parts = name.split(".") if isinstance(name, str) else []
        if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
            return None
        last = max(int(parts[1]), -1 if last is None else last)
    return last


class PatternsNotExposedError(RuntimeError):
    """The model runs its attention fused (e.g. SDPA) and never exposes the pattern."""


@dataclass
class AttentionWeights:
    """Weights of one attention layer in TransformerLens layout.

    W_Q: [head, d_model, d_head]; W_K, W_V: [head, d_model, d_head] (key/value heads
    repeated to the query heads); W_O: [head, d_head, d_model]; b_Q, b_K, b_V: [head, d_head];
    b_O: [d_model]. ``folded`` says whether a preceding LayerNorm was folded in.
    """

    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor
    b_K: Tensor
    b_V: Tensor
    b_O: Tensor
    folded: bool = False


def dtype_eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype (float32's for non-floating ones)."""
    if not dtype.is_floating_point:
        dtype = torch.float32
    return float(torch.finfo(dtype).eps)


@dataclass
class NormAffine:
    """A pre-attention normalization as applied: ``gain ⊙ n(x) + bias``.

    kind: "LN" (``n(x) = (x − mean) / sqrt(var + eps)``) or "RMS" (``n(x) = x /
    sqrt(mean(x²) + eps)``); gain, bias: ``[d_model]`` float32 (bias zero for RMS).
    """

    kind: str
    gain: Tensor
    bias: Tensor
    eps: float

    def normalize(self, x: Tensor) -> Tensor:
        """``n(x)`` over the last dim (no gain, no bias)."""
        if self.kind == "LN":
            x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def apply(self, x: Tensor) -> Tensor:
        return self.normalize(x) * self.gain.to(x) + self.bias.to(x)


def _backend_of(model: Any) -> str:
    cls_names = {c.__name__ for c in type(model).__mro__}
    if "TransformerBridge" in cls_names:
        return "bridge"
    if "HookedEncoder" in cls_names:
        return "hooked_encoder"
    if "HookedTransformer" in cls_names:
        return "hooked_transformer"
    raise TypeError(
        f"ModelView needs a TransformerLens model (TransformerBridge on TL 4.x, "
        f"HookedTransformer or HookedEncoder on TL 3.9), got {type(model).__name__}. "
        "Load one with tl_spectral.zoo.load(name), TransformerBridge.boot_transformers(path) "
        "or tl_spectral.models.to_transformer_lens(model)."
    )


class ModelView:
    """Read-only view of a TransformerLens model.

    Attributes: ``n_layers``, ``n_heads``, ``n_kv_heads`` (key/value heads; equals n_heads
    unless grouped-query), ``d_model``, ``d_head``, ``n_ctx``, ``d_vocab``, ``causal``
    (False for bidirectional encoders), ``backend`` ("bridge" | "hooked_transformer" |
    "hooked_encoder"), ``normalization`` (e.g. "LN" or None), ``pre_ln``, ``positional``
    (TransformerLens' ``positional_embedding_type``, e.g. "standard" or "rotary"; see
    :meth:`rotary_metadata`).
    """

    def __init__(self, model: Any):
        if isinstance(model, ModelView):
            model = model.model
        self.model = model
        self.backend = _backend_of(model)
        cfg = model.cfg
        self.cfg = cfg
        self.n_layers: int = int(cfg.n_layers)
        self.n_heads: int = int(cfg.n_heads)
        kv = getattr(cfg, "n_key_value_heads", None)
        self.n_kv_heads: int = int(kv) if kv else self.n_heads
        self.d_model: int = int(cfg.d_model)
        self.d_head: int = int(cfg.d_head)
        self.n_ctx: int = int(cfg.n_ctx)
        self.d_vocab: int = int(getattr(cfg, "d_vocab", -1))
        if self.backend == "hooked_encoder":
            self.causal = False
        else:
            self.causal = getattr(cfg, "attention_dir", "causal") == "causal"
        self.normalization: Optional[str] = getattr(cfg, "normalization_type", None)
        arch = str(getattr(cfg, "architecture", "") or getattr(cfg, "original_architecture", ""))
        # BERT-family encoders are post-LN: the attention reads the residual stream directly.
        self.pre_ln = self.normalization is not None and not (
            self.backend == "hooked_encoder" or "Bert" in arch or not self.causal
        )
        self.positional: str = str(getattr(cfg, "positional_embedding_type", None)
                                   or "standard").lower()
        self._patterns_checked = False

    # ------------------------------------------------------------------ rotary metadata
    @torch.no_grad()
    def rotary_metadata(self) -> Optional[dict[str, Any]]:
        """What the model's rotary embedding does, read from the module that applies it.

        Returns None for models without rotary positions, else ``{"inv_freq": [rotary_dim/2]
        float64 tensor (radians per position), "rotary_dim": int, "pairing": "half" |
        "adjacent", "attention_scaling": float, "source": str}``:

        * Hugging Face models (bridge): the ``inv_freq`` buffer of the model's ``rotary_emb``
          (rope scaling and partial rotary included: TransformerLens' ``cfg.rotary_dim`` is
          None for a GPT-NeoX with ``rotary_pct < 1``, so the config is not trusted for it),
          its ``attention_scaling``; pairing ``"adjacent"`` iff ``cfg.rotary_adjacent_pairs``
          (GPT-J style) else rotate_half (``"half"``: GPT-NeoX, Llama, Qwen2, Mistral, Gemma).
        * TransformerLens' native model (``boot_native``, converted tl_spectral GPTs): its
          cos/sin tables (angles at position 1), adjacent pairing.
        * otherwise (HookedTransformer): ``cfg.rotary_dim``, ``cfg.rotary_base``,
          ``cfg.rotary_adjacent_pairs``; a ``rope_scaling`` it cannot read raises.

        Raises ``ValueError`` when layers use different rotary embeddings (e.g. Gemma 3's
        local/global bases) — one spec per model is all this reads.
        """
        if self.positional != "rotary":
            return None
        cfg = self.cfg
        adjacent = bool(getattr(cfg, "rotary_adjacent_pairs", False))
        root = getattr(self.model, "original_model", None)
        if root is not None:
            native = getattr(root, "rotary", None)
            if native is not None and hasattr(native, "cos_cached"):
                rd = int(native.rotary_dim)
                ang = torch.atan2(native.sin_cached[1, 0:rd:2].double(),
                                  native.cos_cached[1, 0:rd:2].double())
                return {"inv_freq": ang, "rotary_dim": rd, "pairing": "adjacent",
                        "attention_scaling": 1.0, "source": "native cos/sin tables"}
            per = _per_type_rotary(self)
            if per is not None:  # one rotary embedding per layer type (Gemma 3)
                if len({tuple(m["inv_freq"].tolist()) for m in per}) > 1:
                    raise ValueError(
                        f"{self.name} uses different rotary frequencies per layer type "
                        f"({', '.join(sorted({m['source'] for m in per}))}); read them per "
                        "layer with tl_spectral.model_view.layer_rotary_metadata(model)")
                return dict(per[0])
            found = [(n, m) for n, m in root.named_modules()
                     if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
            if found:
                freqs = {tuple(m.inv_freq.double().tolist()) for _, m in found}
                scales = {float(getattr(m, "attention_scaling", 1.0) or 1.0) for _, m in found}
                if len(freqs) > 1 or len(scales) > 1:
                    raise ValueError(
                        f"{self.name} has {len(found)} rotary embeddings with different "
                        f"frequencies ({', '.join(n for n, _ in found)}); the rotary geometry "
                        "reads one per model")
                n, m = found[0]
                inv = m.inv_freq.detach().double().cpu().clone()
                return {"inv_freq": inv, "rotary_dim": 2 * inv.numel(),
                        "pairing": "adjacent" if adjacent else "half",
                        "attention_scaling": scales.pop(), "source": f"{n}.inv_freq"}
        scaling = getattr(cfg, "rope_scaling", None)
        if isinstance(scaling, dict) and str(scaling.get("rope_type") or scaling.get("type")
                                             or "default").lower() != "default":
            raise ValueError(f"{self.name}: rope_scaling {scaling!r} is not read from the "
                             "config; no rotary module with inv_freq was found")
        rd = getattr(cfg, "rotary_dim", None) or self.d_head
        base = float(getattr(cfg, "rotary_base", 10000) or 10000)
        inv = 1.0 / (base ** (torch.arange(0, int(rd), 2).float() / int(rd)))
        return {"inv_freq": inv.double(), "rotary_dim": int(rd),
                "pairing": "adjacent" if adjacent else "half", "attention_scaling": 1.0,
                "source": "config (rotary_dim, rotary_base)"}

    # ------------------------------------------------------------------ naming
    @property
    def name(self) -> str:
        """The model's name (its config's ``model_name``, else its class name)."""
        return str(getattr(self.cfg, "model_name", type(self.model).__name__))

    def hook_name(self, kind: str, layer: int) -> str:
        """TransformerLens hook name of capture ``kind`` (see CAPTURE_KINDS) at ``layer``.

        The same names on TransformerBridge (TL 4.x, as aliases) and on HookedTransformer /
        HookedEncoder (TL 3.9); whether the model has the hook point is :meth:`has_hook`.
        """
        self._check_layer(layer)
        if kind in _HOOK_NAMES:
            return _HOOK_NAMES[kind].format(layer=layer)
        if kind == "attn_in":
            if self.backend == "bridge":
                return f"blocks.{layer}.attn.hook_in"
            if self.pre_ln:
                return f"blocks.{layer}.ln1.hook_normalized"
            return f"blocks.{layer}.hook_resid_pre"
        raise ValueError(f"unknown capture kind {kind!r}; pass one of {CAPTURE_KINDS}")

    def has_hook(self, name: str) -> bool:
        """Whether the model has a hook point called ``name``."""
        try:
            return name in self.model.hook_dict
        except Exception:  # pragma: no cover - a model without hook_dict
            return False

    def patterns_not_exposed_message(self, layer: int = 0) -> str:
        """The message of :class:`PatternsNotExposedError` for ``layer``."""
        return (
            f"{self.name}: {self.hook_name('pattern', layer)} never fired, so the post-softmax "
            "attention patterns are not exposed (fused or SDPA attention). Load the model "
            "with eager attention, e.g. TransformerBridge.boot_transformers(path, "
            "hf_config_overrides={'attn_implementation': 'eager'}), or on TL 3.9 use "
            "HookedTransformer (which always materialises patterns)."
        )

    def hook_pattern(self, layer: int) -> str:
        """The hook name of ``layer``'s attention pattern."""
        return self.hook_name("pattern", layer)

    def hook_v(self, layer: int) -> str:
        """The hook name of ``layer``'s values."""
        return self.hook_name("v", layer)

    def hook_attn_in(self, layer: int) -> str:
        """The hook name of ``layer``'s attention input."""
        return self.hook_name("attn_in", layer)

    def hook_resid_pre(self, layer: int) -> str:
        """The hook name of the residual stream entering ``layer``."""
        return self.hook_name("resid_pre", layer)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range: the model has {self.n_layers} layers")

    # ------------------------------------------------------------------ weights
    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    def _attn(self, layer: int):
        self._check_layer(layer)
        return self.model.blocks[layer].attn

    def repeat_kv(self, t: Tensor, dim: int) -> Tensor:
        """Repeat key/value heads to the query heads along ``dim`` (HF / Llama grouping)."""
        if t.shape[dim] == self.n_heads:
            return t
        if t.shape[dim] != self.n_kv_heads:
            raise ValueError(
                f"expected {self.n_kv_heads} key/value heads or {self.n_heads} heads along "
                f"dim {dim}, got shape {tuple(t.shape)}"
            )
        return t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=dim)

    @torch.no_grad()
    def ln1_affine(self, layer: int, *, check: bool = True) -> Optional["NormAffine"]:
        """The pre-attention normalization of ``layer`` as the model applies it, or None.

        Returns a :class:`NormAffine` ``(kind, gain, bias, eps)`` (float32, CPU) with
        ``ln1(x) = gain ⊙ n(x) + bias``, ``n(x) = (x − mean)/sqrt(var + eps)`` for
        ``kind="LN"`` and ``n(x) = x / sqrt(mean(x²) + eps)`` for ``kind="RMS"``. Gemma's
        RMSNorm (weight stored as ``w``, applied as ``1 + w``) gets ``gain = 1 + w``.
        None for post-LN models, models without normalization and already-folded ones.

        ``check``: run the module on a few random vectors and raise ``ValueError`` when it
        does not compute ``gain ⊙ n(x) + bias`` within a tolerance scaled to its dtype
        (an unknown normalization variant would otherwise be folded wrongly).
        """
        self._check_layer(layer)
        if not self.pre_ln:
            return None
        block = self.model.blocks[layer]
        ln = getattr(block, "ln1", None)
        if ln is None:
            return None
        mod = getattr(ln, "original_component", None)
        if not isinstance(mod, torch.nn.Module):
            mod = ln
        w = getattr(mod, "weight", None)
        b = getattr(mod, "bias", None)
        if w is None:
            w = getattr(ln, "w", None)
            b = getattr(ln, "b", None)
        if not isinstance(w, Tensor):
            return None
        cls = type(mod).__name__
        norm = str(self.normalization or "")
        kind = "RMS" if ("RMS" in cls.upper() or norm.upper().startswith("RMS")) else "LN"
        gain = w.detach().to(torch.float32).cpu()
        offset = bool(getattr(self.cfg, "rmsnorm_uses_offset", False)) or cls.startswith("Gemma")
        if kind == "RMS" and offset and self.backend == "bridge":
            gain = 1.0 + gain  # Gemma: the HF module multiplies by (1 + weight)
        bias = (torch.zeros_like(gain) if not isinstance(b, Tensor) or kind == "RMS"
                else b.detach().to(torch.float32).cpu())
        eps = None
        for name in ("eps", "variance_epsilon"):
            e = getattr(mod, name, None)
            if isinstance(e, (int, float)):
                eps = float(e)
                break
        if eps is None:
            eps = float(getattr(self.cfg, "eps", 1e-5))
        aff = NormAffine(kind=kind, gain=gain, bias=bias, eps=eps)
        if check:
            self._check_norm(layer, mod, aff)
        return aff

    def _check_norm(self, layer: int, mod: Any, aff: "NormAffine") -> None:
        p = next(iter(mod.parameters()), None)
        dtype = p.dtype if p is not None else self.dtype
        device = p.device if p is not None else self.device
        g = torch.Generator().manual_seed(1234 + layer)
        x = torch.randn(4, self.d_model, generator=g) + 0.3
        try:
            y = mod(x.to(device=device, dtype=dtype))
        except Exception:  # a module that cannot run alone: trust the declared kind
            return
        if isinstance(y, tuple):
            y = y[0]
        y = y.detach().double().cpu()
        ref = aff.apply(x.double())
        err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        tol = 50 * dtype_eps(dtype) + 1e-5
        if err > tol:
            raise ValueError(
                f"layer {layer}: cannot fold the normalization {type(mod).__name__}: it does "
                f"not compute gain ⊙ n(x) + bias with n = {aff.kind} (relative error {err:.2e} "
                f"> {tol:.1e}); read the weights with fold_ln=False")

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the model's parameters (e.g. torch.bfloat16)."""
        for p in self.model.parameters():
            if p.dtype.is_floating_point:
                return p.dtype
        return torch.float32

    @property
    def tolerance(self) -> float:
        """A relative tolerance for checks on this model's activations: ``max(1e-3,
        8 · eps(dtype))`` (1e-3 for float32/float64, 6.3e-2 for bfloat16, 7.8e-3 for
        float16)."""
        return max(1e-3, 8.0 * dtype_eps(self.dtype))

    @torch.no_grad()
    def weights(self, layer: int, *, fold_ln: bool = False,
                device: Optional[torch.device | str] = None) -> AttentionWeights:
        """Attention weights of ``layer`` (detached float32 copies, TransformerLens layout).

        ``fold_ln=True`` folds the pre-attention normalization into W_Q, W_K, W_V and their
        biases, as the model applies it (see :meth:`ln1_affine`):

        * LayerNorm ``g ⊙ (x − mean)/std + b``: gain and bias folded, then the weights are
          centred over d_model (TransformerLens' ``fold_ln`` + ``center``); the folded
          weights act on ``(x − mean) / std``;
        * RMSNorm ``g ⊙ x / rms(x)`` (Llama, Qwen2, Mistral...): the gain only, no centring
          (the RMS-normalized input has no zero-mean constraint); the folded weights act on
          ``x / rms(x)``;
        * Gemma's RMSNorm applies ``(1 + w) ⊙ x / rms(x)``: the gain folded is ``1 + w``.

        For post-LN encoders and models without normalization (or whose normalization is
        already folded, e.g. HookedTransformer's LNPre) there is nothing to fold and the
        weights are returned as they are (``folded`` False).

        ``device``: where the copies go (default the CPU; pass ``view.device`` to keep them
        on the model's device with no round trip).
        """
        dev = torch.device("cpu") if device is None else torch.device(device)
        attn = self._attn(layer)

        def get(name: str, shape: tuple[int, ...]) -> Tensor:
            t = getattr(attn, name, None)
            if t is None and name.startswith(("W_K", "W_V", "b_K", "b_V")):
                t = getattr(attn, "_" + name, None)
            if t is None:
                if name.startswith("b_"):
                    return torch.zeros(shape, device=dev)
                raise PatternsNotExposedError(
                    f"layer {layer}: the attention module exposes no {name}; "
                    "its weights cannot be read"
                )
            return t.detach().to(device=dev, dtype=torch.float32, copy=True)

        H, dm, dh = self.n_heads, self.d_model, self.d_head
        W_Q = get("W_Q", (H, dm, dh))
        W_K = self.repeat_kv(get("W_K", (H, dm, dh)), 0)
        W_V = self.repeat_kv(get("W_V", (H, dm, dh)), 0)
        W_O = get("W_O", (H, dh, dm))
        b_Q = get("b_Q", (H, dh))
        b_K = self.repeat_kv(get("b_K", (H, dh)), 0)
        b_V = self.repeat_kv(get("b_V", (H, dh)), 0)
        b_O = get("b_O", (dm,))
        folded = False
        if fold_ln and self.pre_ln:
            norm = self.ln1_affine(layer)
            if norm is not None:
                new = {}
                for Wn, bn in (("W_Q", b_Q), ("W_K", b_K), ("W_V", b_V)):
                    W = {"W_Q": W_Q, "W_K": W_K, "W_V": W_V}[Wn]
                    bias = bn + torch.einsum("m,hmd->hd", norm.bias.to(dev), W)
                    Wf = W * norm.gain.to(dev)[None, :, None]
                    if norm.kind == "LN":  # LayerNorm output has zero mean: centre (TL fold_ln)
                        Wf = Wf - Wf.mean(dim=1, keepdim=True)
                    new[Wn] = (Wf, bias)
                (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = new["W_Q"], new["W_K"], new["W_V"]
                folded = True
        return AttentionWeights(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, folded=folded)

    def stacked_weights(self, *, fold_ln: bool = False,
                        device: Optional[torch.device | str] = None) -> dict[str, Tensor]:
        """All layers' weights stacked: W_Q [layer, head, d_model, d_head], etc."""
        per = [self.weights(layer, fold_ln=fold_ln, device=device) for layer in range(self.n_layers)]
        names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
        return {n: torch.stack([getattr(p, n) for p in per]) for n in names}

    # ------------------------------------------------------------------ running
    def run(
        self,
        tokens: Tensor,
        attention_mask: Optional[Tensor] = None,
        fwd_hooks: Optional[list[tuple[str, Callable]]] = None,
        return_type: Optional[str] = "logits",
    ) -> Any:
        """One forward pass with ``fwd_hooks`` attached for its duration.

        tokens: [batch, pos] int64; attention_mask: [batch, pos] (1 = real token).

        ``return_type=None`` with hooks on blocks only: the pass stops once the last hooked
        block has run (after its ``hook_resid_post`` hooks), so the final norm and the
        unembedding never run — no ``[batch, pos, d_vocab]`` logits (Gemma 3: 262,144 per
        token) are formed where nothing reads them. Returns None then.
        """
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device)
        tokens = tokens.to(self.device)
        if self.backend == "hooked_encoder":
            # HookedEncoder (TL 3.9) needs its mask: without one, some rows come out zeroed
            kwargs.pop("attention_mask", None)
            if attention_mask is None:
                attention_mask = torch.ones(tokens.shape, dtype=torch.long)
            kwargs["one_zero_attention_mask"] = attention_mask.to(self.device)
        if return_type is not None:
            kwargs["return_type"] = return_type
        hooks = list(fwd_hooks or [])
        last = _last_hooked_block(hooks) if return_type is None else None
        if last is not None and self.has_hook(f"blocks.{last}.hook_resid_post"):
            def stop(t: Tensor, hook: Any = None) -> Tensor:
                raise _BlocksDone

            hooks.append((f"blocks.{last}.hook_resid_post", stop))  # after the caller's hooks
        try:
            with self.model.hooks(fwd_hooks=hooks):
                return self.model(tokens, **kwargs)
        except _BlocksDone:
            return None

    def logits_from_resid(self, resid: Tensor) -> Tensor:
        """The model's logits from the last block's output ``resid [..., d_model]``
        (``blocks.{n_layers − 1}.hook_resid_post``): its final norm, then its unembedding.
        Lets a probe take the next-token loss of a few windows in the probe pass, whose
        blocks run over them anyway (the sanity check's perplexity), without a second pass.
        Only where :meth:`logits_from_resid_ok` (checked before the pass: it runs the
        model)."""
        norm = getattr(self.model, "ln_final", None)
        x = resid.to(self.dtype)
        return self.model.unembed(norm(x) if norm is not None else x)

    def logits_from_resid_ok(self) -> bool:
        """Whether :meth:`logits_from_resid` gives the logits of :meth:`run`: a causal model
        with an ``unembed`` module, and on 8 tokens the two agree (no soft-cap or other step
        after the unembedding). One pass of 8 tokens, once per view; never inside a
        pass (hooks attached)."""
        ok = getattr(self, "_resid_logits_checked", None)
        if ok is not None:
            return ok
        ok = False
        if self.causal and callable(getattr(self.model, "unembed", None)):
            last = f"blocks.{self.n_layers - 1}.hook_resid_post"
            held: list[Tensor] = []

            def grab(t: Tensor, hook: Any = None) -> Tensor:
                held.append(t.detach())
                return t

            toks = torch.arange(8, dtype=torch.long).remainder(max(1, self.d_vocab))[None]
            try:
                with torch.no_grad():  # one pass: its logits and its last block's output
                    ref = self.run(toks, fwd_hooks=[(last, grab)], return_type="logits")
                    mine = self.logits_from_resid(held[0]) if held else None
                ok = mine is not None and tuple(mine.shape) == tuple(ref.shape) and bool(
                    torch.allclose(mine.float(), ref.float(), rtol=1e-4,
                                   atol=1e-4 * float(ref.abs().max())))
            except Exception:  # noqa: BLE001 - any failure: not this route, the full pass
                ok = False
        self._resid_logits_checked = ok
        return ok

    def check_patterns(self) -> None:
        """Raise :class:`PatternsNotExposedError` unless layer 0's pattern hook fires.

        Fused attention kernels (SDPA, flash attention) never form the post-softmax
        pattern, so no probe can see it. This runs its own 1 × 4-token pass; ``run_probes``
        does not call it (it checks inside its real pass that every needed pattern hook
        fired).
        """
        if self._patterns_checked:
            return
        fired: list[Tensor] = []

        def hook(t: Tensor, hook: Any) -> Tensor:
            fired.append(t.detach())
            return t

        n = min(4, self.n_ctx)
        tokens = torch.zeros(1, n, dtype=torch.long)
        if self.d_vocab > 1:
            tokens = torch.arange(n).remainder(self.d_vocab).unsqueeze(0)
        try:
            hook_name = self.hook_pattern(0)
            if hook_name not in self.model.hook_dict:
                raise KeyError(hook_name)
            with torch.no_grad():
                self.run(tokens, fwd_hooks=[(hook_name, hook)], return_type=None)
        except KeyError:
            fired.clear()
        if not fired:
            raise PatternsNotExposedError(self.patterns_not_exposed_message(0))
        self._patterns_checked = True

    def __repr__(self) -> str:
        kind = "causal" if self.causal else "bidirectional"
        return (
            f"ModelView({self.name}: {self.backend}, {self.n_layers} layers x {self.n_heads} "
            f"heads (kv {self.n_kv_heads}), d_model {self.d_model}, d_head {self.d_head}, "
            f"{kind}, norm {self.normalization})"
        )


# ---------------------------------------------------------------------- per-layer facts
def _hf_text_config(model: Any) -> Any:
    """The Hugging Face (text) config behind a TransformerBridge, or None."""
    root = getattr(model, "original_model", None)
    hf_cfg = getattr(root, "config", None)
    if hf_cfg is not None and callable(getattr(hf_cfg, "get_text_config", None)):
        hf_cfg = hf_cfg.get_text_config()
    return hf_cfg


def layer_windows(model: Any) -> list[Optional[int]]:
    """Per layer, the sliding-window width ``W`` of its causal attention, or None for full
    attention: a query at ``i`` may attend to the keys ``i − W + 1 … i`` (lags ``0 … W − 1``,
    ``W`` keys including itself), as Hugging Face's ``sliding_window_overlay`` (``j > i − W``)
    and TransformerLens' local attention (``window_size``) mask them.

    Read from the model's configuration, in one place for every statistic:

    * TransformerBridge: the Hugging Face config's ``layer_types`` (``"sliding_attention"``
      layers get ``sliding_window``; Gemma 2/3, Qwen2 with ``use_sliding_window``) or, without
      ``layer_types``, a ``sliding_window`` that applies to every layer (Mistral);
    * HookedTransformer (TL 3.9): ``cfg.attn_types`` (``"local"`` layers get
      ``cfg.window_size``).

    Bidirectional models and models without windows get ``[None] * n_layers``. A layer type
    that is neither full nor sliding (e.g. chunked attention) raises ``ValueError``.
    """
    view = model if isinstance(model, ModelView) else ModelView(model)
    L = view.n_layers
    if not view.causal:
        return [None] * L
    hf_cfg = _hf_text_config(view.model) if view.backend == "bridge" else None
    if hf_cfg is not None:
        sw = getattr(hf_cfg, "sliding_window", None)
        types = getattr(hf_cfg, "layer_types", None)
        if types is not None:
            types = list(types)[:L]
            bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
            if bad:
                raise ValueError(f"{view.name}: layer types {bad} are neither full nor sliding "
                                 "attention; their key support is not read")
            if any(t == "sliding_attention" for t in types) and not sw:
                raise ValueError(f"{view.name}: sliding-attention layers but no sliding_window "
                                 "in the config")
            return [int(sw) if t == "sliding_attention" else None for t in types]
        if sw and getattr(hf_cfg, "use_sliding_window", True) is not False:
            return [int(sw)] * L
        return [None] * L
    kinds = getattr(view.cfg, "attn_types", None)
    size = getattr(view.cfg, "window_size", None)
    if kinds is not None and size:
        return [int(size) if str(k) == "local" else None for k in list(kinds)[:L]]
    return [None] * L


def window_allowed(T: int, window: Optional[int], *, causal: bool = True,
                   device: Any = None) -> Tensor:
    """``[T, T]`` bool: the (query, key) pairs a layer may attend to in a window of ``T``
    tokens — causal ``0 ≤ i − j < W`` (``W = window``, None: no limit), or every pair for a
    bidirectional layer."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    if not causal:
        return torch.ones(T, T, dtype=torch.bool, device=device)
    ok = j <= i
    if window is not None:
        ok = ok & (i - j < int(window))
    return ok


def lag_pair_counts(T: int, window: Optional[int], n_lags: Optional[int] = None) -> Tensor:
    """Number of causal (query, key) pairs at each lag ``ℓ = 0 … n_lags − 1`` in one window of
    ``T`` tokens that a layer of window ``W`` may attend to: ``T − ℓ`` for ``ℓ < W``, else 0
    (float64 ``[n_lags]``, default ``n_lags = T``)."""
    n = T if n_lags is None else int(n_lags)
    lag = torch.arange(n, dtype=torch.float64)
    c = (T - lag).clamp_min(0.0)
    if window is not None:
        c = torch.where(lag < int(window), c, torch.zeros_like(c))
    return c


@torch.no_grad()
def layer_rotary_metadata(model: Any) -> Optional[list[dict[str, Any]]]:
    """Per layer, :meth:`ModelView.rotary_metadata` of the rotary embedding that layer uses;
    None for models without rotary positions.

    Models whose layer types use different rotary embeddings (Gemma 3: θ = 10,000 in its
    sliding-window layers, 1,000,000 in its full-attention ones) hold them in one
    Hugging Face rotary module as ``{layer_type}_inv_freq`` buffers with
    ``{layer_type}_attention_scaling``; each layer gets the buffer of its
    ``config.layer_types`` entry (``source`` names it). Every other model gets the one
    :meth:`ModelView.rotary_metadata` for every layer.
    """
    view = model if isinstance(model, ModelView) else ModelView(model)
    if view.positional != "rotary":
        return None
    per = _per_type_rotary(view)
    if per is not None:
        return per
    meta = view.rotary_metadata()
    return [dict(meta) for _ in range(view.n_layers)] if meta is not None else None


def _per_type_rotary(view: ModelView) -> Optional[list[dict[str, Any]]]:
    """The per-layer-type rotary metadata of :func:`layer_rotary_metadata`, or None when
    the model keeps no ``{layer_type}_inv_freq`` buffers."""
    hf_cfg = _hf_text_config(view.model) if view.backend == "bridge" else None
    types = getattr(hf_cfg, "layer_types", None) if hf_cfg is not None else None
    root = getattr(view.model, "original_model", None)
    per_type: dict[str, dict[str, Any]] = {}
    if types is not None and root is not None:
        for n, m in root.named_modules():
            for t in set(types):
                inv = getattr(m, f"{t}_inv_freq", None)
                if isinstance(inv, Tensor) and t not in per_type:
                    inv = inv.detach().double().cpu().clone()
                    scale = float(getattr(m, f"{t}_attention_scaling", 1.0) or 1.0)
                    adjacent = bool(getattr(view.cfg, "rotary_adjacent_pairs", False))
                    per_type[t] = {"inv_freq": inv, "rotary_dim": 2 * inv.numel(),
                                   "pairing": "adjacent" if adjacent else "half",
                                   "attention_scaling": scale, "source": f"{n}.{t}_inv_freq"}
    if per_type:
        missing = sorted({t for t in types[: view.n_layers] if t not in per_type})
        if missing:
            raise ValueError(f"{view.name}: no rotary frequencies for layer types {missing}")
        return [dict(per_type[t]) for t in list(types)[: view.n_layers]]
    return None
