"""Spectral surgery (SPEC B.5–B.6): turn the measured cascade into cheaper models.

- :func:`linearize` — swap chosen layers' softmax / S–D attention for causal ELU+1 linear
  attention on the same projections (zero-shot), optionally followed by a short fine-tune
  of the swapped layers only (:class:`FineTune`).
- :func:`linearization_curve` — ΔPPL for ``k = 0..n_layers`` leading layers linearized
  (:class:`LinearizationCurve`; :func:`plot_collapse` draws the paper's collapse curve).
- :func:`tl_linearization_curve` — the same zero-shot curve for any causal TransformerLens
  model, by pattern hooks (used by the report section).
- :func:`cascade_allocation` — per-layer head dimension from the measured routing rank
  under a budget of attention parameters (:class:`CascadeAllocation`); :func:`train_model`
  trains a configuration with the project's :class:`~tl_spectral.models.train.Trainer`;
  :class:`AllocationStudy` holds attention parameters vs PPL.

"Same projections" (*choice*, SPEC B.5): the linear layer's ``q = x W_Q + b_Q``,
``k = x W_K + b_K`` are the softmax layer's own (for S–D: ``W_Q = W_P (S − D)``,
``W_K = W_P``, SPEC B.7), with no ``1/sqrt(d_head)`` factor, ``v`` and ``W_O`` unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tl_spectral._deprecation import deprecated_method, renamed_arguments
from tl_spectral.data.inputs import as_token_tensor
from tl_spectral.models.attention import LinearAttention, make_attention
from tl_spectral.models.gpt import GPT, GPTConfig
from tl_spectral.results import Result, plotter, register_result

__all__ = [
    "AllocationStudy",
    "CascadeAllocation",
    "FineTune",
    "LinearizationCurve",
    "allocated_config",
    "attention_param_count",
    "cascade_allocation",
    "fine_tune_layers",
    "linear_from",
    "linearize",
    "linearization_curve",
    "measured_routing_rank",
    "perplexity",
    "plot_collapse",
    "tl_linearization_curve",
    "train_model",
]


# ------------------------------------------------------------------------ linearize
def linear_from(attn: nn.Module) -> LinearAttention:
    """A :class:`LinearAttention` on the same projections as a softmax or S–D module
    (anything with ``weights()`` in TransformerLens layout: W_Q/W_K/W_V ``[head, d_model,
    d_head]``, W_O ``[head, d_head, d_model]``, biases ``[head, d_head]`` / ``[d_model]``)."""
    if not hasattr(attn, "weights") or not hasattr(attn, "n_heads"):
        raise TypeError(f"linear_from needs a softmax or S–D attention module, got "
                        f"{type(attn).__name__}")
    w = attn.weights()
    h, dm, d = w["W_Q"].shape
    lin = LinearAttention(dm, h, d, attn.n_ctx)
    with torch.no_grad():
        W = torch.cat([w[k].permute(0, 2, 1).reshape(h * d, dm) for k in ("W_Q", "W_K", "W_V")])
        b = torch.cat([w[k].reshape(h * d) for k in ("b_Q", "b_K", "b_V")])
        lin.qkv.weight.copy_(W)
        lin.qkv.bias.copy_(b)
        lin.out.weight.copy_(w["W_O"].reshape(h * d, dm).T)
        lin.out.bias.copy_(w["b_O"])
    p = next(attn.parameters())
    return lin.to(device=p.device, dtype=p.dtype)


def _check_layers(model: GPT, layers: Sequence[int] | int) -> list[int]:
    if not isinstance(model, GPT):
        raise TypeError(f"expected a tl_spectral GPT, got {type(model).__name__}")
    if isinstance(layers, int):
        layers = [layers]
    out = sorted({int(l) for l in layers})
    bad = [l for l in out if not 0 <= l < model.cfg.n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range; the model has {model.cfg.n_layers} layers "
                         f"(pass indices in 0..{model.cfg.n_layers - 1})")
    return out


@dataclasses.dataclass
class FineTune:
    """Short fine-tune of the swapped layers (their attention parameters only).

    steps: optimizer steps (0 = zero-shot); batch_size windows of ``seq_len + 1`` tokens
    (``seq_len`` None = the model's n_ctx) drawn from ``train_tokens`` with a generator
    seeded by ``seed``; AdamW (``lr``, ``weight_decay``), linear warm-up over
    ``warmup_steps`` then cosine to ``min_lr``; gradient clipping ``grad_clip`` (0 = off).
    """

    steps: int = 150
    batch_size: int = 16
    seq_len: int | None = None
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"FineTune.steps must be an int >= 0, got {self.steps!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"FineTune.batch_size must be a positive int, got {self.batch_size!r}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got {self.lr}, {self.min_lr}")

    def lr_at(self, step: int) -> float:
        """The Trainer's schedule: linear warm-up, then cosine to ``min_lr``."""
        from tl_spectral.models.train import warmup_cosine_lr

        return warmup_cosine_lr(step, lr=self.lr, min_lr=self.min_lr,
                                warmup_steps=self.warmup_steps, steps=self.steps)


def fine_tune_layers(model: GPT, layers: Sequence[int], train_tokens: torch.Tensor,
                     config: FineTune) -> list[float]:
    """Train only ``blocks[l].attn`` for ``l`` in ``layers`` (in place; every other parameter
    frozen for the duration and restored after). train_tokens: 1-D int ``[n_tokens]``.
    Returns the per-step training loss (nats/token)."""
    layers = _check_layers(model, layers)
    seq = config.seq_len or model.cfg.n_ctx
    ids = torch.as_tensor(train_tokens, dtype=torch.long).reshape(-1)
    if ids.numel() < seq + 1:
        raise ValueError(f"train_tokens holds {ids.numel()} tokens; a fine-tune window needs "
                         f"seq_len+1 = {seq + 1}")
    if config.steps == 0 or not layers:
        return []
    params = [p for l in layers for p in model.blocks[l].attn.parameters()]
    trainable = {id(p) for p in params}
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    device = next(model.parameters()).device
    losses = []
    was_training = model.training
    model.train()
    try:
        for step in range(config.steps):
            for g in opt.param_groups:
                g["lr"] = config.lr_at(step)
            starts = torch.randint(0, ids.numel() - seq, (config.batch_size,), generator=gen)
            batch = ids[starts[:, None] + torch.arange(seq + 1)[None, :]].to(device)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   batch[:, 1:].reshape(-1))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"fine-tune loss became {loss.item()} at step {step}; "
                                         "lower FineTune.lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(saved[n])
        model.train(was_training)
    return losses


def linearize(model: GPT, layers: Sequence[int] | int, *, train_tokens: torch.Tensor | None = None,
              fine_tune: FineTune | int | None = None) -> GPT:
    """A copy of ``model`` whose ``layers`` run causal ELU+1 linear attention (SPEC B.5) on
    the same projections (:func:`linear_from`); the input model is unchanged.

    ``layers``: indices of softmax / S–D layers (linear layers are left as they are; an empty
    list returns an exact copy). ``fine_tune``: a :class:`FineTune` (or its number of steps)
    to train the swapped layers afterwards on ``train_tokens`` (1-D int); None or 0 steps =
    zero-shot. The copy's config lists the new kinds per layer, so it saves, loads and
    converts to TransformerLens like any GPT. Returns the copy in eval mode.
    """
    layers = _check_layers(model, layers)
    if isinstance(fine_tune, int):
        fine_tune = FineTune(steps=fine_tune)
    if fine_tune is not None and fine_tune.steps > 0 and train_tokens is None:
        raise ValueError("a fine-tune needs train_tokens (1-D token ids); pass them, or "
                         "fine_tune=None for the zero-shot swap")
    m = copy.deepcopy(model)
    c = m.cfg
    kinds = [c.layer_attention(l) for l in range(c.n_layers)]
    opts = [c.layer_attention_options(l) for l in range(c.n_layers)]
    swapped = []
    for l in layers:
        if kinds[l] == "linear":
            continue
        m.blocks[l].attn = linear_from(m.blocks[l].attn)
        kinds[l], opts[l] = "linear", {}
        swapped.append(l)
    if swapped:
        m.cfg = dataclasses.replace(c, attention=kinds, attention_options=opts)
    if fine_tune is not None and fine_tune.steps > 0 and swapped:
        fine_tune_layers(m, swapped, train_tokens, fine_tune)
    return m.eval()


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor, *, batch_size: int = 16
               ) -> dict[str, float]:
    """Mean next-token cross-entropy ``loss`` (nats) and ``ppl`` over ``windows``
    ``[n, seq_len + 1]`` (a tensor, lists of ids or ``DocumentWindows``; every target counted
    once). The model is put in eval mode."""
    windows = as_token_tensor(windows, "windows", min_len=2)
    model.eval()
    tot, n = 0.0, 0
    device = next(model.parameters()).device
    for s in range(0, windows.shape[0], batch_size):
        w = windows[s:s + batch_size].to(device)
        logits = model(w[:, :-1])
        tot += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                     w[:, 1:].reshape(-1), reduction="sum"))
        n += w[:, 1:].numel()
    loss = tot / n
    return {"loss": loss, "ppl": math.exp(loss)}


@torch.no_grad()
def window_losses(model: nn.Module, windows: torch.Tensor, *, batch_size: int = 16
                  ) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of every window ``[n, seq_len + 1]``, float64
    ``[n]``: the unit a bootstrap over windows resamples. With windows of equal length their
    mean is :func:`perplexity`'s ``loss``. The model is put in eval mode."""
    windows = as_token_tensor(windows, "windows", min_len=2)
    model.eval()
    device = next(model.parameters()).device
    out = []
    for s in range(0, windows.shape[0], batch_size):
        w = windows[s:s + batch_size].to(device)
        logits = model(w[:, :-1]).float()
        ce = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none")
        out.append(ce.double().mean(1).cpu())
    return torch.cat(out)


# ---------------------------------------------------------------- the ΔPPL curve
@register_result
@dataclasses.dataclass
class LinearizationCurve(Result):
    """ΔPPL when the first ``k`` layers are linearized (SPEC B.5), for each ``k`` in ``ks``.

    Fields: ``model_name``, ``attention`` (the model's kind, "softmax" / "sd"),
    ``normalization``, ``n_layers``, ``ks`` (list of k), ``base_ppl`` (k = 0),
    ``ppl_zero_shot`` (per k), ``ppl_fine_tuned`` (per k, or None), ``fine_tune`` (the
    :class:`FineTune` as a dict, or None), ``n_windows``, ``seq_len``, ``note``,
    ``ppl_control`` (per k, or None): the same fine-tune of the same k layers *without*
    linearization — the control that separates the cost of linear attention from the
    effect of the extra training steps.
    """

    kind: ClassVar[str] = "linearization_curve"

    model_name: str
    attention: str
    normalization: str
    n_layers: int
    ks: list
    base_ppl: float
    ppl_zero_shot: list
    ppl_fine_tuned: list | None = None
    fine_tune: dict | None = None
    n_windows: int = 0
    seq_len: int = 0
    note: str = ""
    ppl_control: list | None = None

    _WHICH = ("zero_shot", "fine_tuned", "control", "fine_tuned_vs_control")

    def rel_delta(self, which: str = "zero_shot") -> list[float]:
        """Relative ΔPPL per k. ``which``: "zero_shot", "fine_tuned", "control" (each
        against PPL(k=0)), or "fine_tuned_vs_control" (fine-tuned linearized model against
        the control fine-tune of the same layers without linearization)."""
        if which not in self._WHICH:
            raise ValueError(f"which must be one of {self._WHICH}, got {which!r}")
        ppl = {"zero_shot": self.ppl_zero_shot, "fine_tuned": self.ppl_fine_tuned,
               "control": self.ppl_control,
               "fine_tuned_vs_control": self.ppl_fine_tuned}[which]
        ref = (self.ppl_control if which == "fine_tuned_vs_control"
               else [self.base_ppl] * len(self.ks))
        if ppl is None or ref is None:
            raise ValueError(f"this curve has no {which!r} PPL; run linearization_curve with "
                             "fine_tune=FineTune(...)" + (", control=True" if "control" in which
                                                           else ""))
        return [p / r - 1.0 for p, r in zip(ppl, ref)]

    def max_k_within(self, tol: float, which: str = "zero_shot") -> int:
        """The largest k such that every k' <= k stays within ``tol`` relative ΔPPL."""
        best = 0
        for k, r in zip(self.ks, self.rel_delta(which)):
            if r > tol:
                break
            best = k
        return best

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict[str, Any]]:
        rows = []
        ft = self.rel_delta("fine_tuned") if self.ppl_fine_tuned is not None else None
        for i, k in enumerate(self.ks):
            r = {"k": k, "ppl_zero_shot": self.ppl_zero_shot[i],
                 "delta_zero_shot_%": 100 * self.rel_delta()[i]}
            if ft is not None:
                r["ppl_fine_tuned"] = self.ppl_fine_tuned[i]
                r["delta_fine_tuned_%"] = 100 * ft[i]
            if self.ppl_control is not None:
                r["ppl_control"] = self.ppl_control[i]
                r["delta_control_%"] = 100 * self.rel_delta("control")[i]
                r["delta_fine_tuned_vs_control_%"] = 100 * self.rel_delta(
                    "fine_tuned_vs_control")[i]
            rows.append(r)
        return rows

    def plot(self, ax: Any = None):
        """Relative ΔPPL (%) vs k (zero-shot solid, fine-tuned dashed). Returns a Figure."""
        return self._draw("plot", ax=ax)


def plot_collapse(curves: Sequence[LinearizationCurve], ax: Any = None,
                  thresholds: Sequence[float] = (0.014, 0.05),
                  fine_tuned: Sequence[LinearizationCurve] = ()):
    """The collapse curve: relative ΔPPL (%, symlog) vs number of leading layers linearized,
    one colour per model, zero-shot solid and fine-tuned dashed; the paper's 1.4% and 5%
    marks as horizontal lines. ``fine_tuned``: further curves of which only the fine-tuned
    line is drawn (in the colour of the zero-shot curve with the same model name).
    Returns a matplotlib Figure."""
    return plotter("linearization_curve", "collapse")(curves, ax=ax, thresholds=thresholds,
                                                      fine_tuned=fine_tuned)


@renamed_arguments(windows="tokens")
def linearization_curve(model: GPT, tokens: torch.Tensor, *, ks: Sequence[int] | None = None,
                        train_tokens: torch.Tensor | None = None,
                        fine_tune: FineTune | int | None = None, control: bool = False,
                        name: str = "model", batch_size: int = 16,
                        progress: bool | None = None) -> LinearizationCurve:
    """PPL on ``tokens`` ``[n, seq_len + 1]`` with the first ``k`` layers linearized, for
    ``k`` in ``ks`` (default ``0..n_layers``); zero-shot, and after a fine-tune of the
    swapped layers when ``fine_tune`` is given (each k fine-tuned from the original model).
    ``control``: with a fine-tune, also fine-tune the same k layers of the original model
    *without* swapping them (same steps, data and seed) — ``ppl_control``. progress: a line
    per k (None: on a terminal or in a notebook, when fine-tuning). ``windows=``: the
    deprecated name of ``tokens``."""
    if not isinstance(model, GPT):
        raise TypeError(f"expected a tl_spectral GPT, got {type(model).__name__}")
    windows = as_token_tensor(tokens, "tokens", min_len=2)
    L = model.cfg.n_layers
    ks = list(range(L + 1)) if ks is None else sorted({int(k) for k in ks})
    if any(not 0 <= k <= L for k in ks):
        raise ValueError(f"every k must lie in 0..{L}, got {ks}")
    if 0 not in ks:
        ks = [0] + ks
    if isinstance(fine_tune, int):
        fine_tune = FineTune(steps=fine_tune)
    do_ft = fine_tune is not None and fine_tune.steps > 0
    if do_ft and train_tokens is None:
        raise ValueError("fine-tuned curves need train_tokens")
    if control and not do_ft:
        raise ValueError("control=True compares fine-tunes: pass fine_tune=FineTune(...) too")
    if progress is None:
        from tl_spectral.progress import interactive

        progress = do_ft and interactive()
    zs, ft = [], [] if do_ft else None
    ctl = [] if control else None
    for k in ks:
        m = linearize(model, list(range(k)))
        zs.append(perplexity(m, windows, batch_size=batch_size)["ppl"])
        if do_ft:
            if k == 0:
                ft.append(zs[-1])
            else:
                m = linearize(model, list(range(k)), train_tokens=train_tokens,
                              fine_tune=fine_tune)
                ft.append(perplexity(m, windows, batch_size=batch_size)["ppl"])
        if ctl is not None:
            if k == 0:
                ctl.append(zs[-1])
            else:
                m = copy.deepcopy(model)
                fine_tune_layers(m, list(range(k)), train_tokens, fine_tune)
                ctl.append(perplexity(m, windows, batch_size=batch_size)["ppl"])
        if progress:
            print(f"[{name}] k={k}: zero-shot {zs[-1]:.4f}"
                  + (f", fine-tuned {ft[-1]:.4f}" if do_ft else "")
                  + (f", control {ctl[-1]:.4f}" if ctl is not None else ""), flush=True)
    kinds = sorted({model.cfg.layer_attention(l) for l in range(L)})
    return LinearizationCurve(
        model_name=name, attention="+".join(kinds), normalization=model.cfg.normalization,
        n_layers=L, ks=ks, base_ppl=zs[0], ppl_zero_shot=zs, ppl_fine_tuned=ft,
        fine_tune=dataclasses.asdict(fine_tune) if do_ft else None,
        n_windows=int(windows.shape[0]), seq_len=int(windows.shape[1] - 1), ppl_control=ctl)


@torch.no_grad()
def tl_linearization_curve(model: Any, tokens: torch.Tensor, *, ks: Sequence[int] | None = None,
                           name: str | None = None, batch_size: int = 8,
                           base_ppl: float | None = None,
                           stop_at: float | None = None) -> LinearizationCurve:
    """Zero-shot linearization curve of a causal TransformerLens model (or ModelView), by
    pattern hooks: for each k the first k layers' patterns are replaced by
    ``α_ij ∝ φ(q_i)·φ(k_j)`` on the model's own ``hook_q`` / ``hook_k``
    (:class:`~tl_spectral.models.convert.LinearPatternHook`); on a rotary model (a
    TransformerBridge) on its rotated ``hook_rot_q`` / ``hook_rot_k``, the vectors whose dot
    product forms the score (after QK-norm where the model has one; a sliding window is not
    applied to the linear pattern). tokens: ``[n, pos + 1]``.

    ``base_ppl``: the model's perplexity on these very windows when already known (k = 0
    is then not run again). ``stop_at``: stop the curve once two k in a row are at or above
    ``stop_at`` relative ΔPPL (collapsed: the larger k of the grid cannot come back within any
    tolerance the curve is read for); the curve then holds the k it ran.

    Caveat: on a converted GPT with unequal d_head per layer, ``hook_q`` of a narrower
    layer is scaled by ``sqrt(d_max / d_l)`` (see ``convert``), so its linear pattern differs
    from :func:`linearize`'s; with one d_head the two agree.
    """
    from tl_spectral.model_view import ModelView
    from tl_spectral.models.convert import LinearPatternHook
    from tl_spectral.probes.damage import nll_sum

    tokens = as_token_tensor(tokens, "tokens", min_len=2)
    view = model if isinstance(model, ModelView) else ModelView(model)
    if not view.causal:
        raise ValueError(f"{view.name} is not a causal language model; the ΔPPL curve needs "
                         "next-token prediction")
    pe = str(getattr(getattr(view.model, "cfg", None), "positional_embedding_type", "standard"))
    rot = pe == "rotary" and _has_rotated_hooks(view)
    if pe != "standard" and not rot:
        raise ValueError(f"{view.name} uses {pe!r} positions and no hook on its rotated "
                         "queries and keys (hook_rot_q / hook_rot_k) fires: hook_q/hook_k "
                         "are not the vectors whose dot product forms the score; pass a model "
                         "with standard positions or a TransformerBridge of a rotary model")
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [n, pos+1], got {tuple(tokens.shape)}")
    L = view.n_layers
    ks = list(range(L + 1)) if ks is None else sorted({0, *[int(k) for k in ks]})
    ppl: list[float] = []
    stopped = None
    for k in ks:
        if k == 0 and base_ppl is not None:
            ppl.append(float(base_ppl))
            continue
        if stop_at is not None and len(ppl) >= 3 and \
                min(ppl[-1], ppl[-2]) / ppl[0] - 1.0 >= stop_at:
            stopped = k
            break
        hooks = []
        for l in range(k):
            h = LinearPatternHook(l, view.d_head)
            n = h.names()
            if rot:  # the rotated vectors (after any QK-norm): their dot product is the score
                n = {**n, "q": f"blocks.{l}.attn.hook_rot_q", "k": f"blocks.{l}.attn.hook_rot_k"}
            hooks += [(n["q"], h.capture_q), (n["k"], h.capture_k), (n["pattern"], h.pattern)]
        tot, cnt = nll_sum(view, tokens, fwd_hooks=hooks, max_rows=batch_size)
        ppl.append(math.exp(tot / cnt))
    ks = ks[:len(ppl)]
    return LinearizationCurve(
        model_name=name or view.name, attention="tl", normalization="?", n_layers=L, ks=ks,
        base_ppl=ppl[0], ppl_zero_shot=ppl, n_windows=int(tokens.shape[0]),
        seq_len=int(tokens.shape[1] - 1),
        note="zero-shot via TransformerLens pattern hooks"
             + (" on the rotated queries and keys (hook_rot_q / hook_rot_k)" if rot else "")
             + (f"; stopped before k = {stopped}: two k in a row at or above "
                f"+{100 * stop_at:.0f}%" if stopped is not None else ""))


def _has_rotated_hooks(view: Any) -> bool:
    """Whether the model exposes its rotated queries and keys (TransformerBridge of a rotary
    model: ``blocks.0.attn.hook_rot_q`` / ``hook_rot_k``, ``[batch, pos, head, d]``)."""
    names = getattr(view.model, "hook_dict", None) or {}
    if "blocks.0.attn.hook_rot_q" not in names or "blocks.0.attn.hook_rot_k" not in names:
        return False
    # declared is not enough: a bridge of a native rotary model lists them but never calls
    # them (its attention rotates inside); check on two tokens that both fire
    fired: set[str] = set()

    def seen(t: torch.Tensor, hook: Any = None) -> torch.Tensor:
        fired.add(hook.name)
        return t

    with torch.no_grad():
        view.run(torch.zeros(1, 2, dtype=torch.long),
                 fwd_hooks=[("blocks.0.attn.hook_rot_q", seen),
                            ("blocks.0.attn.hook_rot_k", seen)])
    return fired == {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"}


# ------------------------------------------------------------ cascade allocation
def attention_param_count(cfg: GPTConfig, d_heads: Sequence[int] | None = None) -> int:
    """Number of attention parameters (every layer's attention module, biases included) of
    a GPT with config ``cfg`` — or with head dimensions ``d_heads`` (one per layer) in
    place of ``cfg``'s. Built on the meta device: nothing is allocated."""
    d_heads = cfg.d_heads if d_heads is None else [int(d) for d in d_heads]
    if len(d_heads) != cfg.n_layers:
        raise ValueError(f"d_heads lists {len(d_heads)} layers, the model has {cfg.n_layers}")
    total = 0
    with torch.device("meta"):
        for l, d in enumerate(d_heads):
            att = make_attention(cfg.layer_attention(l), cfg.d_model, cfg.layer_n_heads(l), int(d),
                                 cfg.n_ctx, **cfg.layer_attention_options(l))
            total += sum(p.numel() for p in att.parameters())
    return int(total)


_SOURCES = ("auto", "S", "R")


def measured_routing_rank(model: GPT, measure: str = "entropy", source: str = "auto"
                          ) -> list[float]:
    """Per layer, the mean over heads of the routing rank: the effective rank of S for S–D
    layers (SPEC B.3), of R = (M − Mᵀ)/2 for softmax layers (SPEC B.1, LayerNorm folded).
    ``measure``: "entropy" (Roy–Vetterli) or "participation". ``source``: "auto" (S for
    S–D models, R for softmax ones), "S", or "R" — for an S–D model R is its *effective*
    routing ``W_P S W_Pᵀ`` in the residual space (the skew part of ``M = W_P (S − D) W_Pᵀ``).
    Returns ``[n_layers]`` floats."""
    from tl_spectral.geometry.model import model_qk_geometry, model_sd_geometry

    if measure not in ("entropy", "participation"):
        raise ValueError(f"measure must be 'entropy' or 'participation', got {measure!r}")
    if source not in _SOURCES:
        raise ValueError(f"source must be one of {_SOURCES}, got {source!r}")
    kinds = {model.cfg.layer_attention(l) for l in range(model.cfg.n_layers)}
    if source == "S" and kinds != {"sd"}:
        raise ValueError(f"source='S' needs a model whose layers are all 'sd', got kinds "
                         f"{sorted(kinds)}; use source='R'")
    if source == "R" and kinds <= {"sd", "softmax"} and kinds:
        g = model_qk_geometry(model)
        r = g.eff_rank_R if measure == "entropy" else g.pr_R
    elif kinds == {"sd"}:
        g = model_sd_geometry(model)
        r = g.eff_rank_S if measure == "entropy" else g.pr_S
    elif kinds == {"softmax"}:
        g = model_qk_geometry(model)
        r = g.eff_rank_R if measure == "entropy" else g.pr_R
    else:
        raise ValueError(f"cascade_allocation needs a model whose layers are all 'sd' or all "
                         f"'softmax', got kinds {sorted(kinds)}")
    return [float(x) for x in r.double().mean(-1)]


def allocated_config(cfg: GPTConfig, d_heads: Sequence[int]) -> GPTConfig:
    """``cfg`` with one head dimension per layer (everything else unchanged)."""
    d_heads = [int(d) for d in d_heads]
    if len(d_heads) != cfg.n_layers:
        raise ValueError(f"d_heads lists {len(d_heads)} layers, the model has {cfg.n_layers}")
    return dataclasses.replace(cfg, d_head=d_heads)


@register_result
@dataclasses.dataclass
class CascadeAllocation(Result):
    """Per-layer head dimensions from the measured routing rank (SPEC B.6).

    Fields: ``model_name``, ``measure``, ``rank`` (per layer, mean over heads),
    ``d_head_uniform`` (the measured model's, per layer), ``d_head`` (allocated),
    ``budget`` (fraction of the uniform attention parameters allowed), ``scale`` (d ≈
    scale · rank before rounding), ``multiple``, ``d_min``, ``d_max``,
    ``params_uniform`` / ``params_allocated`` (attention parameters), ``model_config``
    (the measured model's GPTConfig as a dict).
    """

    kind: ClassVar[str] = "cascade_allocation"

    model_name: str
    measure: str
    rank: list
    d_head_uniform: list
    d_head: list
    budget: float
    scale: float
    multiple: int
    d_min: int
    d_max: int
    params_uniform: int
    params_allocated: int
    model_config: dict
    source: str = "auto"

    @property
    def saving(self) -> float:
        """Fraction of attention parameters removed: 1 − allocated / uniform."""
        return 1.0 - self.params_allocated / self.params_uniform

    def config(self) -> GPTConfig:
        """The reallocated model's :class:`GPTConfig`."""
        return allocated_config(GPTConfig.from_dict(self.model_config), self.d_head)

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict[str, Any]]:
        return [{"layer": l, "routing_rank": r, "d_head_uniform": u, "d_head": d}
                for l, (r, u, d) in enumerate(zip(self.rank, self.d_head_uniform, self.d_head))]

    def plot(self, ax: Any = None):
        """Routing rank and allocated d_head per layer (bars: uniform vs allocated)."""
        return self._draw("plot", ax=ax)


def cascade_allocation(model: GPT, budget: float = 0.5, *, measure: str = "entropy",
                       source: str = "auto", multiple: int = 4, d_min: int | None = None,
                       d_max: int | None = None, rank: Sequence[float] | None = None,
                       name: str = "model") -> CascadeAllocation:
    """Head dimension per layer in proportion to the measured routing rank (SPEC B.6).

    Steps: 1. ``rank_l`` = mean over heads of the routing rank of layer l
    (:func:`measured_routing_rank`, or the given ``rank``); the head dimension it needs is
    ``n_l = rank_l`` for S–D (S is d_head × d_head, and its effective routing
    ``W_P S W_Pᵀ`` has rank <= d_head) and ``rank_l / 2`` for softmax (R has
    rank <= 2·d_head). ``source`` ("auto" | "S" | "R") picks the matrix whose rank is
    measured (see :func:`measured_routing_rank`). 2. for a scale ``s``,
    ``d_l(s) = clip(multiple · ceil(max(s · n_l, n_l) / multiple), d_min, d_max)`` —
    never below the need. 3. the largest ``s`` (bisection) whose attention
    parameter count is at most ``budget`` × the uniform model's.

    budget: fraction in (0, 1] of the measured (uniform) model's attention parameters.
    multiple: granularity of d_head (default 4); d_min (default ``multiple``) and d_max
    (default the model's largest d_head) bound every layer.
    Raises ``ValueError`` when even the smallest allocation exceeds the budget.
    """
    if not 0 < budget <= 1:
        raise ValueError(f"budget is a fraction of the uniform model's attention parameters, "
                         f"in (0, 1]; got {budget!r}")
    cfg = model.cfg
    multiple = int(multiple)
    if multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple}")
    d_min = multiple if d_min is None else int(d_min)
    d_max = max(cfg.d_heads) if d_max is None else int(d_max)
    if not 1 <= d_min <= d_max:
        raise ValueError(f"need 1 <= d_min <= d_max, got d_min={d_min}, d_max={d_max}")
    if rank is None:
        r = measured_routing_rank(model, measure, source)
    else:
        r = [float(x) for x in rank]
    if len(r) != cfg.n_layers or any(not math.isfinite(x) or x < 0 for x in r):
        raise ValueError(f"rank must hold {cfg.n_layers} finite non-negative values, got {r}")
    # the head dimension a rank needs: S (S–D) is d_head × d_head, so rank <= d_head; R of a
    # softmax head is a rank <= 2·d_head matrix in the residual space, so rank / 2 <= d_head
    per = [2.0 if cfg.layer_attention(l) == "softmax" else 1.0 for l in range(cfg.n_layers)]
    need = [x / c for x, c in zip(r, per)]
    uniform = attention_param_count(cfg)
    cap = budget * uniform

    def dims(s: float) -> list[int]:
        return [min(d_max, max(d_min, multiple * math.ceil(max(s * x, x) / multiple - 1e-9)))
                for x in need]

    lo_d = dims(0.0)
    if attention_param_count(cfg, lo_d) > cap:
        raise ValueError(
            f"budget {budget} allows {cap:.0f} attention parameters but the smallest allocation "
            f"{lo_d} (d_min={d_min}, never below the needed d_head {[round(x, 2) for x in need]}) "
            f"needs {attention_param_count(cfg, lo_d)}; raise budget or lower d_min/multiple")
    lo, hi = 0.0, float(d_max) / max(min(x for x in need), 1e-3) + 1.0
    if attention_param_count(cfg, dims(hi)) <= cap:
        lo = hi
    else:
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            if attention_param_count(cfg, dims(mid)) <= cap:
                lo = mid
            else:
                hi = mid
    d = dims(lo)
    return CascadeAllocation(
        model_name=name, measure=measure, source=source, rank=r, d_head_uniform=cfg.d_heads, d_head=d,
        budget=float(budget), scale=float(lo), multiple=multiple, d_min=d_min, d_max=d_max,
        params_uniform=uniform, params_allocated=attention_param_count(cfg, d),
        model_config=cfg.to_dict())


def train_model(cfg: GPTConfig, train_tokens: torch.Tensor, val_tokens: torch.Tensor,
                train_config: Any, *, seed: int = 0,
                extra_metadata: dict[str, Any] | None = None) -> tuple[GPT, Any]:
    """Build ``GPT(cfg)`` (initialised under ``torch.manual_seed(seed)``) and train it with the
    project's :class:`~tl_spectral.models.train.Trainer` (``train_config`` a
    :class:`~tl_spectral.models.train.TrainConfig`; an ``out_dir`` makes the run resumable).
    Returns ``(model, history)``."""
    from tl_spectral.models.train import Trainer

    torch.manual_seed(seed)
    model = GPT(cfg)
    tr = Trainer(model, train_tokens, val_tokens, train_config, extra_metadata=extra_metadata)
    hist = tr.fit()
    return tr.model.eval(), hist


@register_result
@dataclasses.dataclass
class AllocationStudy(Result):
    """Attention parameters vs PPL of a uniform and a cascade-allocated model (and any other
    variant) trained with the same recipe. ``rows``: one dict per model with ``name``,
    ``d_head`` (list), ``attention_params``, ``total_params``, ``ppl``, ``loss``, ``steps``.
    ``recipe``: the TrainConfig as a dict; ``note``: free text."""

    kind: ClassVar[str] = "allocation_study"

    rows: list
    recipe: dict
    n_windows: int
    seq_len: int
    note: str = ""

    def to_rows(self) -> list[dict[str, Any]]:
        base = next((r for r in self.rows if r["name"].startswith("uniform")), self.rows[0])
        out = []
        for r in self.rows:
            out.append({**{k: v for k, v in r.items() if k != "d_head"},
                        "d_head": " ".join(str(d) for d in r["d_head"]),
                        "attn_params_%": 100 * r["attention_params"] / base["attention_params"],
                        "delta_ppl_%": 100 * (r["ppl"] / base["ppl"] - 1)})
        return out

    def plot(self, ax: Any = None):
        """PPL vs attention parameters, one point per model. Returns a Figure."""
        return self._draw("plot", ax=ax)
