"""Routing and filtering at the model level (SPEC B.1–B.3): ``geometry.qk`` for every head of a
TransformerLens model (normalization folded) or of a native :class:`~tl_spectral.models.GPT`,
``geometry.sd_geometry`` of a native S–D model, and the per-layer table of either.

- :func:`model_qk_geometry` — the kernel ``M = W_Q W_Kᵀ`` of every head.
- :func:`model_rotary_geometry` — rotary models: the kernel ``W_Q R(Δ) W_Kᵀ`` per offset Δ.
- :func:`model_sd_geometry` — the routing rank of S and the eigenvalues of S − D.
- :func:`geometry_layer_table` — per-layer rows (routing fraction, ranks, stability).
- :func:`random_baseline` — the no-structure reference of i.i.d. Gaussian weights.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from tl_spectral.checks import is_int
from tl_spectral.geometry.qk import (
    DEFAULT_ZERO_RTOL,
    QKGeometry,
    SDGeometry,
    qk_geometry,
    sd_geometry,
)

__all__ = [
    "UnreadableHeadsError",
    "geometry_layer_table",
    "model_qk_geometry",
    "model_rotary_geometry",
    "model_sd_geometry",
    "native_attention_weights",
    "random_baseline",
]


class UnreadableHeadsError(ValueError):
    """The QK geometry of some heads of this model is not defined or not readable."""


# -------------------------------------------------------------- model-level geometry
def _is_native_gpt(model: Any) -> bool:
    """The project's own GPT (``tl_spectral.models.gpt``), told by its config's per-layer
    attention kinds (geometry reads models; it does not import them)."""
    cfg = getattr(model, "cfg", None)
    return callable(getattr(cfg, "layer_attention", None)) and hasattr(model, "blocks") \
        and not hasattr(model, "run_with_hooks")


def _fold_ln1(w: dict[str, torch.Tensor], ln: nn.Module) -> dict[str, torch.Tensor]:
    """Fold a LayerNorm (gain g, bias b) into W_Q/W_K/W_V [head, d_model, d_head] and their
    biases, then centre the weights over d_model (TransformerLens fold_ln + centring)."""
    g = ln.weight.detach().to(torch.float64)
    b = ln.bias.detach().to(torch.float64)
    out = dict(w)
    for wn, bn in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
        W = w[wn].to(torch.float64)
        out[bn] = w[bn].to(torch.float64) + torch.einsum("m,hmd->hd", b, W)
        Wf = W * g[None, :, None]
        out[wn] = Wf - Wf.mean(dim=1, keepdim=True)
    return out


def native_attention_weights(model: Any, *, fold_ln: bool = True) -> list[dict[str, torch.Tensor]]:
    """Per layer, the TransformerLens-layout weights of a native GPT's attention (no
    zero-padding; S–D layers as W_Q = W_P (S − D), W_K = W_P), the pre-attention LayerNorm
    folded in when ``fold_ln`` (W_Q/W_K/W_V ``[head, d_model, d_head_l]``, b_Q/b_K
    ``[head, d_head_l]``). Raises :class:`UnreadableHeadsError` for linear-attention layers."""
    bad = [(i, blk.attn.__class__.__name__) for i, blk in enumerate(model.blocks)
           if model.cfg.layer_attention(i) not in ("softmax", "sd")]
    if bad:
        raise UnreadableHeadsError(
            "cannot read the QK geometry of layers "
            + ", ".join(f"{i} ({name}, kind {model.cfg.layer_attention(i)!r})" for i, name in bad)
            + ": their score is not a bilinear form x_i W_Q W_Kᵀ x_jᵀ (linear attention scores "
            "φ(q)·φ(k) with φ = elu + 1), so M = W_Q W_Kᵀ does not describe them; analyse the "
            "softmax / S–D layers of a model without linear layers")
    out = []
    for blk in model.blocks:
        w = {k: v.detach() for k, v in blk.attn.weights().items()}
        if fold_ln and isinstance(blk.ln1, nn.LayerNorm):
            w = _fold_ln1(w, blk.ln1)
        out.append(w)
    return out


def qk_norm_gains(view: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The per-head query and key norm gains of a QK-norm model (Gemma 3, Qwen 3, OLMo 2),
    read from the modules as they compute: ``(g_q, g_k)``, each ``[layer, d_head]`` float64
    (Gemma's ``(1 + w)`` included), or None when the attention has no ``q_norm``/``k_norm``.

    Each module is run on random vectors ``y``; its output must be ``g ⊙ y / sqrt(mean(y²)
    + eps)`` with one gain ``g`` per coordinate (the RMSNorm over ``d_head`` that every such
    model applies per head), else :class:`UnreadableHeadsError`. With these gains the score
    of a head is ``(1 / (r_q(i) r_k(j))) · qᵢᵀ D_q R(j − i) D_k kⱼ`` (``D = diag(g)``, ``r``
    the norm's root mean square of the un-normalized head vector): see
    docs/routing_filtering.md, "QK-norm"."""
    blocks = getattr(view.model, "blocks", None)
    if blocks is None:
        return None
    out: dict[str, list[torch.Tensor]] = {"q_norm": [], "k_norm": []}
    for layer, blk in enumerate(blocks):
        attn = getattr(blk, "attn", None)
        for name in out:
            mod = getattr(attn, name, None)
            if mod is None:
                if layer == 0 and name == "q_norm":
                    if getattr(view.cfg, "use_qk_norm", False):
                        raise UnreadableHeadsError(
                            f"{view.name} uses QK-norm but exposes no q_norm module; its "
                            "kernel cannot be read")
                    return None
                raise UnreadableHeadsError(f"layer {layer}: no {name} beside the other "
                                           "layers' QK-norm")
            out[name].append(_norm_gain(getattr(mod, "original_component", None) or mod,
                                        view.d_head, f"layer {layer} {name}"))
    return torch.stack(out["q_norm"]), torch.stack(out["k_norm"])


@torch.no_grad()
def _norm_gain(mod: nn.Module, d_head: int, what: str) -> torch.Tensor:
    """``g`` of an RMSNorm ``g ⊙ y / sqrt(mean(y²) + eps)`` over ``d_head``, from its output."""
    eps = next((float(getattr(mod, n)) for n in ("eps", "variance_epsilon")
                if isinstance(getattr(mod, n, None), (int, float))), 1e-6)
    p = next(iter(mod.parameters()), None)
    dt = p.dtype if p is not None else torch.float32
    dev = p.device if p is not None else torch.device("cpu")
    y = torch.randn(8, d_head, generator=torch.Generator().manual_seed(7)).double() + 0.1
    out = mod(y.to(device=dev, dtype=dt))
    out = (out[0] if isinstance(out, tuple) else out).double().cpu()
    n = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    g = (out * n).sum(0) / (n * n).sum(0)  # least squares per coordinate
    err = float((out - n * g).abs().max() / out.abs().max().clamp_min(1e-30))
    tol = 100 * float(torch.finfo(dt).eps) + 1e-6
    if err > tol:
        raise UnreadableHeadsError(
            f"{what} ({type(mod).__name__}) does not compute g ⊙ y / rms(y) (relative error "
            f"{err:.1e}); the QK-norm cannot be folded into the kernel")
    return g


def _fold_qk_norm(view: Any, st: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``st`` (stacked weights) with the QK-norm gains folded: ``W_Q D_q``, ``W_K D_k`` (and
    the biases, which the norm scales too); unchanged for models without QK-norm."""
    gains = qk_norm_gains(view)
    if gains is None:
        return st
    gq, gk = gains
    out = dict(st)
    for wn, bn, g in (("W_Q", "b_Q", gq), ("W_K", "b_K", gk)):
        gl = g.to(st[wn].dtype)
        out[wn] = st[wn] * gl[:, None, None, :]
        if bn in st:
            out[bn] = st[bn] * gl[:, None, :].to(st[bn].dtype)
    return out


def _positional_of(model: Any) -> str:
    if _is_native_gpt(model):
        return "rotary" if model.cfg.positional == "rotary" else "standard"
    pe = getattr(getattr(model, "cfg", None), "positional_embedding_type", None)
    return str(pe or "standard").lower()


def _check_positional(model: Any, allow_rotary: bool) -> None:
    pe = _positional_of(model)
    if pe == "rotary" and not allow_rotary:
        raise UnreadableHeadsError(
            "this model uses rotary positions: its kernel W_Q R(j − i) W_Kᵀ depends on the "
            "offset; call tl_spectral.geometry.model.model_rotary_geometry(model) (or pass "
            "allow_rotary=True for the offset-0 kernel W_Q W_Kᵀ only)")
    if pe == "alibi" and not allow_rotary:
        raise UnreadableHeadsError(
            "this model uses ALiBi positions (an additive per-head bias on the score): W_Q W_Kᵀ "
            "is its bilinear kernel at every offset; pass allow_rotary=True to analyse it")


def model_qk_geometry(
    model: Any,
    *,
    fold_ln: bool = True,
    biases: bool = True,
    allow_rotary: bool = False,
    zero_rtol: float = DEFAULT_ZERO_RTOL,
) -> QKGeometry:
    """``geometry.qk`` for every head of a model (SPEC B.1): the kernel ``M = W_Q W_Kᵀ``.

    model: a TransformerLens model (TransformerBridge / HookedTransformer / HookedEncoder,
        or a :class:`~tl_spectral.model_view.ModelView`) — weights are read through
        ``ModelView.stacked_weights(fold_ln=fold_ln)`` — or a native
        :class:`~tl_spectral.models.GPT` (its own weights, LayerNorm folded the same way;
        unequal ``d_head`` per layer stay unpadded).
    fold_ln: fold the pre-attention LayerNorm (pre-LN models only; post-LN encoders such as
        BERT/MiniLM read the residual stream directly and are analysed as they are) and, for
        QK-norm models (Gemma 3), the query and key norm gains (:func:`qk_norm_gains`): the
        kernel is then ``W_Q D_q D_k W_Kᵀ``, exact up to a positive factor per (query, key)
        token pair (docs/routing_filtering.md, "QK-norm").
    biases: also report ``key_bias_norm`` / ``query_bias_norm`` (see ``qk_geometry``).
    allow_rotary: analyse rotary/ALiBi models anyway (the kernel at offset 0). Without it a
        rotary model (TransformerLens or a native GPT with ``positional="rotary"``) raises
        :class:`UnreadableHeadsError` naming :func:`model_rotary_geometry`, the
        offset-resolved analysis.

    Returns a :class:`QKGeometry` with ``[layer, head, ...]`` fields. Raises
    :class:`UnreadableHeadsError` (a ``ValueError``) naming the layers whose heads cannot be
    read and why (linear attention, no W_Q exposed, rotary positions, non-finite weights).
    """
    if _is_native_gpt(model):
        _check_positional(model, allow_rotary)
        ws = native_attention_weights(model, fold_ln=fold_ln)
        WQ, WK = [w["W_Q"] for w in ws], [w["W_K"] for w in ws]
        bq = [w["b_Q"] for w in ws] if biases else None
        bk = [w["b_K"] for w in ws] if biases else None
        names = [f"L{i}" for i in range(len(ws))]
    else:
        from tl_spectral.model_view import ModelView, PatternsNotExposedError

        view = model if isinstance(model, ModelView) else ModelView(model)
        _check_positional(view.model, allow_rotary)
        try:
            st = view.stacked_weights(fold_ln=fold_ln)
        except PatternsNotExposedError as e:
            raise UnreadableHeadsError(
                f"cannot read the query/key weights of {view.name}: {e}. The QK geometry "
                "needs W_Q and W_K per head (TransformerLens layout)") from e
        if fold_ln:
            st = _fold_qk_norm(view, st)
        WQ, WK = st["W_Q"], st["W_K"]
        bq, bk = (st["b_Q"], st["b_K"]) if biases else (None, None)
        names = [f"L{i}" for i in range(view.n_layers)]
    try:
        return qk_geometry(WQ, WK, b_Q=bq, b_K=bk, layer_names=names, zero_rtol=zero_rtol)
    except ValueError as e:
        raise UnreadableHeadsError(f"the model's heads cannot be analysed: {e}") from e


#: The default window of :func:`model_rotary_geometry`: the analysed window when you pass it
#: (``n_ctx=``; ``tl-spectral analyze`` passes its ``--length``), else the model's context
#: capped at this many positions (SmolLM2's 8,192 took 133 s, 256 took 38 s).
DEFAULT_ROTARY_CTX = 1024


def _layer_selection(layers: Any, n_layers: int) -> list[int]:
    """``layers=`` as a list of distinct layer indices in ``[0, n_layers)`` (None = all)."""
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, str)) or not all(
            is_int(i) for i in layers):
        raise ValueError(f"layers must be a list of layer indices, got {layers!r}")
    out = list(layers)
    bad = [i for i in out if not 0 <= i < n_layers]
    if not out or bad or len(set(out)) != len(out):
        raise ValueError(f"layers={layers!r}: pass distinct indices in [0, {n_layers - 1}] "
                         f"(the model has {n_layers} layers)")
    return out


def model_rotary_geometry(
    model: Any,
    *,
    offsets: Any = None,
    distribution: Any = "causal",
    n_ctx: int | None = None,
    layers: Sequence[int] | None = None,
    fold_ln: bool = True,
    average_ranks: bool = True,
    rank_offsets: Any = "auto",
    progress: bool | None = None,
    spectra: bool = True,
) -> Any:
    """The offset-resolved QK geometry of a rotary model (:func:`tl_spectral.geometry.rotary.
    rotary_qk_geometry`): every head's ``M(Δ) = W_Q R(Δ) W_Kᵀ``, Δ = j − i.

    model: a TransformerLens model (bridge / HookedTransformer, or a ModelView) with
        ``positional_embedding_type="rotary"`` — weights through
        ``ModelView.stacked_weights(fold_ln=fold_ln)``, the rotary frequencies, pairing and
        scaling through ``ModelView.rotary_metadata()`` — or a native
        :class:`~tl_spectral.models.GPT` with ``positional="rotary"`` (adjacent pairing).
    offsets: where energies and spectra are reported (default 0, −1, −2, −4, … −(n_ctx − 1)).
    distribution: the offset distribution of the averages (``"causal"``: Δ of a uniform causal
        pair in a window of n_ctx positions; ``"uniform"``; or ``{Δ: weight}``).
    n_ctx: the window of the offset distribution and the default offsets: pass the length
        of the windows you analyse (the report passes its ``--length``); default
        ``min(model context, DEFAULT_ROTARY_CTX)`` = at most 1,024 positions (the whole
        8,192-token context of SmolLM2 took 133 s and averages over offsets no window of
        yours holds).
    layers: the layers to analyse (indices; default all). The result's rows are those
        layers' rows of the full result, named ``L{index}``.
    fold_ln: fold the pre-attention normalization and, for QK-norm models, the query and
        key norm gains (``W_Q D_q R(Δ) D_k W_Kᵀ``; see :func:`model_qk_geometry`). Each layer
        is rotated by its own rotary embedding (:func:`~tl_spectral.model_view.
        layer_rotary_metadata`: Gemma 3's local and global θ), and a sliding-window
        layer's averages use the offset distribution restricted to the offsets it attends
        to, ``|Δ| < W`` (:func:`~tl_spectral.model_view.layer_windows`; the result's
        ``windows``).
    average_ranks: also average the effective ranks over the distribution.
    rank_offsets: the offsets of that average (default ``"auto"``: every offset of the
        distribution when that is cheap, else an equal-mass quantile sample within a ~10 s
        budget; ``None``: every offset, exact; an int: at most that many); see
        :func:`~tl_spectral.geometry.rotary.rotary_qk_geometry`.
    progress: a progress bar over the layers (default None: on a terminal or in a notebook,
        when the spectra take more than a few seconds).
    spectra: False: the singular values at ``offsets`` (and their ranks) left NaN, not
        computed (:func:`~tl_spectral.geometry.rotary.rotary_qk_geometry`).

    Raises :class:`UnreadableHeadsError` for models without rotary positions (use
    :func:`model_qk_geometry`) or whose heads cannot be read.
    """
    # Long on purpose: the docstring (the rotary forms and options); the code is
    # one read of each layer's weights and rotary spec, then one call.
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    if _positional_of(model.model if hasattr(model, "rotary_metadata") else model) != "rotary":
        raise UnreadableHeadsError(
            "this model has no rotary positions: its kernel W_Q W_Kᵀ does not depend on the "
            "offset; call model_qk_geometry(model)")
    if _is_native_gpt(model):
        ws = native_attention_weights(model, fold_ln=fold_ln)
        WQ, WK = [w["W_Q"] for w in ws], [w["W_K"] for w in ws]
        # θ_k = base^(−2k / rotary_dim), as models.attention.rotary_inv_freq (adjacent pairs)
        spec = RotarySpec.from_base(model.cfg.rotary_dim, model.cfg.rotary_base, "adjacent")
        ctx = model.cfg.n_ctx
        windows = None
    else:
        from tl_spectral.model_view import ModelView, PatternsNotExposedError

        view = model if isinstance(model, ModelView) else ModelView(model)
        from tl_spectral.model_view import layer_rotary_metadata, layer_windows

        try:
            metas = layer_rotary_metadata(view)
            windows = layer_windows(view)  # sliding-window layers: averages over |Δ| < W
            windows = None if all(w is None for w in windows) else windows
            st = view.stacked_weights(fold_ln=fold_ln)
        except (PatternsNotExposedError, ValueError) as e:
            raise UnreadableHeadsError(f"cannot read the rotary heads of {view.name}: {e}") from e
        if fold_ln:
            st = _fold_qk_norm(view, st)
        # each layer's own rotary embedding (Gemma 3: θ 10⁴ local, 10⁶ global layers)
        specs = [RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
                 for m in metas or []]
        spec = specs[0] if len({tuple(s.inv_freq.tolist()) + (s.attention_scaling,)
                                for s in specs}) == 1 else specs
        WQ, WK = st["W_Q"], st["W_K"]
        ctx = view.n_ctx
    n_ctx = min(int(ctx), DEFAULT_ROTARY_CTX) if n_ctx is None else n_ctx
    keep = _layer_selection(layers, len(WQ))
    WQ, WK = [WQ[i] for i in keep], [WK[i] for i in keep]
    if isinstance(spec, list):
        spec = [spec[i] for i in keep]
    if windows is not None:
        windows = [windows[i] for i in keep]
    try:
        return rotary_qk_geometry(WQ, WK, spec, offsets=offsets, distribution=distribution,
                                  n_ctx=n_ctx, average_ranks=average_ranks,
                                  rank_offsets=rank_offsets, progress=progress,
                                  windows=windows, layer_names=[f"L{i}" for i in keep],
                                  spectra=spectra)
    except ValueError as e:
        raise UnreadableHeadsError(f"the model's rotary heads cannot be analysed: {e}") from e


def model_sd_geometry(model: Any, *, zero_rtol: float = DEFAULT_ZERO_RTOL) -> SDGeometry:
    """``geometry.sd_geometry`` of the S–D layers of a native GPT (SPEC B.2–B.3): the
    routing rank of every head's S (the spectral cascade) and the eigenvalues of S − D.
    Layer names are ``L{index}`` of the S–D layers only. Raises ``ValueError`` if the
    model has no S–D layer."""
    if not _is_native_gpt(model):
        raise TypeError(
            f"model_sd_geometry needs a native tl_spectral GPT, got {type(model).__name__}; "
            "for a converted TransformerLens model use "
            "geometry.qk.recover_sd_from_qk(W_Q, W_K) on its (unfolded) weights")
    idx = [i for i in range(model.cfg.n_layers) if model.cfg.layer_attention(i) == "sd"]
    if not idx:
        raise ValueError("the model has no S–D attention layer (attention='sd')")
    with torch.no_grad():
        S = [model.blocks[i].attn.S().detach() for i in idx]
        D = [model.blocks[i].attn.D().detach() for i in idx]
    return sd_geometry(S, D, layer_names=[f"L{i}" for i in idx], zero_rtol=zero_rtol)


def geometry_layer_table(geo: QKGeometry | SDGeometry, *, measure: str = "entropy"
                         ) -> list[dict[str, Any]]:
    """Per-layer rows: routing fraction (mean over heads), routing rank (mean ± std over
    heads, entropy or participation-ratio measure), capacity, and for QK geometry the share
    of unstable heads and of positive-real eigenvalues; for S–D the share of stable heads."""
    if measure not in ("entropy", "participation"):
        raise ValueError(f"measure must be 'entropy' or 'participation', got {measure!r}")
    rows = []
    if isinstance(geo, SDGeometry):
        rk = geo.eff_rank_S if measure == "entropy" else geo.pr_S
        for i, name in enumerate(geo.layer_names):
            rows.append({"layer": name, "d_head": int(geo.d_head[i]),
                         "routing_fraction": float(geo.routing_fraction[i].mean()),
                         "rank_S": float(rk[i].mean()), "rank_S_std": float(rk[i].std(0)),
                         "rank_S_min": float(rk[i].min()), "rank_S_max": float(rk[i].max()),
                         "stable_share": float(geo.stable[i].double().mean())})
        return rows
    rk = geo.eff_rank_R if measure == "entropy" else geo.pr_R
    for i, name in enumerate(geo.layer_names):
        rows.append({"layer": name, "d_head": int(geo.d_head[i]),
                     "capacity": int(geo.routing_capacity[i]),
                     "routing_fraction": float(geo.routing_fraction[i].mean()),
                     "rank_R": float(rk[i].mean()), "rank_R_std": float(rk[i].std(0)),
                     "rank_F": float(geo.eff_rank_F[i].mean()),
                     "unstable_share": float(geo.unstable[i].double().mean()),
                     "positive_eig_share": float(geo.positive_share[i].mean())})
    return rows



def random_baseline(d_model: int, n_heads: int, d_head: int, n_layers: int = 1, seed: int = 0
                    ) -> QKGeometry:
    """QK geometry of i.i.d. Gaussian W_Q, W_K of the given shape (the no-structure
    reference: routing fraction ≈ 0.5)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n_layers, n_heads, d_model, d_head)
    return qk_geometry(torch.randn(shape, generator=g), torch.randn(shape, generator=g))
