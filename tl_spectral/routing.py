"""Routing and filtering at the model level (SPEC B): QK geometry of every head of a model,
the B.4 ablations on the project's GPT models, the spectral cascade over training, and the
subword (GPT-2 BPE, top-K vocabulary) training used by the routing study.

Entry points:

- :func:`model_qk_geometry` — ``geometry.qk`` for every head of a TransformerLens model
  (LayerNorm folded) or of a native :class:`~tl_spectral.models.GPT` (converted first).
- :func:`model_sd_geometry` — ``geometry.sd_geometry`` of a native S–D model.
- :func:`ablate` / :func:`ablation_table` — filtering collapse / routing removal (S–D),
  symmetric / skew part removal (softmax) with ΔPPL.
- :func:`cascade_over_training` — routing rank per layer for every checkpoint of a run.
- :func:`run_bpe_from_config` / ``python -m tl_spectral.routing train-bpe --config F`` —
  Austen + Wikipedia, GPT-2 BPE truncated to the K most frequent training tokens.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tl_spectral.geometry.qk import (
    DEFAULT_ZERO_RTOL,
    QKGeometry,
    SDGeometry,
    qk_geometry,
    sd_geometry,
)
from tl_spectral.results import Result, register_result

__all__ = [
    "ABLATIONS_SD",
    "ABLATIONS_SOFTMAX",
    "AblationResult",
    "CascadeResult",
    "KernelPartAttention",
    "TopKBPE",
    "UnreadableHeadsError",
    "ablate",
    "ablation_table",
    "cascade_over_training",
    "figures_from_dir",
    "geometry_layer_table",
    "load_bpe_data",
    "model_qk_geometry",
    "model_sd_geometry",
    "perplexity",
    "run_bpe_from_config",
    "run_study",
    "study_figures",
    "study_markdown",
    "validation_windows",
]


class UnreadableHeadsError(ValueError):
    """The QK geometry of some heads of this model is not defined or not readable."""


# -------------------------------------------------------------- model-level geometry
def _is_native_gpt(model: Any) -> bool:
    from tl_spectral.models import GPT

    return isinstance(model, GPT)


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


def _check_positional(model: Any, allow_rotary: bool) -> None:
    pe = str(getattr(getattr(model, "cfg", None), "positional_embedding_type", "standard"))
    if pe in ("rotary", "alibi") and not allow_rotary:
        raise UnreadableHeadsError(
            f"this model uses {pe!r} positional embeddings: its score between positions i and "
            f"j is x_i W_Q P(i − j) W_Kᵀ x_jᵀ with a position-dependent P, so W_Q W_Kᵀ alone is "
            "only the kernel at offset 0; pass allow_rotary=True to analyse that kernel anyway")


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
        BERT/MiniLM read the residual stream directly and are analysed as they are).
    biases: also report ``key_bias_norm`` / ``query_bias_norm`` (see ``qk_geometry``).
    allow_rotary: analyse rotary/ALiBi models anyway (the kernel at offset 0).

    Returns a :class:`QKGeometry` with ``[layer, head, ...]`` fields. Raises
    :class:`UnreadableHeadsError` (a ``ValueError``) naming the layers whose heads cannot be
    read and why (linear attention, no W_Q exposed, rotary positions, non-finite weights).
    """
    if _is_native_gpt(model):
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
        WQ, WK = st["W_Q"], st["W_K"]
        bq, bk = (st["b_Q"], st["b_K"]) if biases else (None, None)
        names = [f"L{i}" for i in range(view.n_layers)]
    try:
        return qk_geometry(WQ, WK, b_Q=bq, b_K=bk, layer_names=names, zero_rtol=zero_rtol)
    except ValueError as e:
        raise UnreadableHeadsError(f"the model's heads cannot be analysed: {e}") from e


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


# ------------------------------------------------------------------------ ablations
ABLATIONS_SD = ("filtering_collapse", "routing_removal", "filtering_removal")
ABLATIONS_SOFTMAX = ("symmetric_removal", "skew_removal")


class KernelPartAttention(nn.Module):
    """Softmax attention whose bilinear score keeps only one part of ``M = W_Q W_Kᵀ``
    (SPEC B.4 for standard heads): ``keep="skew"`` (routing R; the symmetric part removed)
    or ``keep="symmetric"`` (filtering F; the skew part removed).

    With ``q⁰ = x W_Q``, ``k⁰ = x W_K`` (no biases), ``x_i M x_jᵀ = q⁰_i·k⁰_j`` and
    ``x_i Mᵀ x_jᵀ = k⁰_i·q⁰_j``, so the kept part is ``½(q⁰_i·k⁰_j ± k⁰_i·q⁰_j)``; the
    bias terms ``q⁰_i·b_K + b_Q·k⁰_j + b_Q·b_K`` are kept unchanged (*choice*, as in the
    geometry, which reads only the bilinear term). Acts on the block's attention input
    (after ``ln1``). forward(x [b, p, d_model]) -> [b, p, d_model].
    """

    def __init__(self, base: nn.Module, keep: str):
        super().__init__()
        if keep not in ("skew", "symmetric"):
            raise ValueError(f"keep must be 'skew' or 'symmetric', got {keep!r}")
        if not hasattr(base, "qkv"):
            raise TypeError(f"KernelPartAttention wraps softmax attention, got "
                            f"{type(base).__name__}")
        self.base, self.keep = base, keep
        self.n_heads, self.d_head = base.n_heads, base.d_head

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        w = self.base.weights()
        _b, p, _ = x.shape
        q0 = torch.einsum("bpm,hmd->bhpd", x, w["W_Q"])
        k0 = torch.einsum("bpm,hmd->bhpd", x, w["W_K"])
        v = torch.einsum("bpm,hmd->bhpd", x, w["W_V"]) + w["b_V"][None, :, None, :]
        qk = q0 @ k0.transpose(-1, -2)
        kq = k0 @ q0.transpose(-1, -2)
        bil = 0.5 * (qk - kq) if self.keep == "skew" else 0.5 * (qk + kq)
        bias = ((q0 * w["b_K"][None, :, None, :]).sum(-1)[..., :, None]
                + (k0 * w["b_Q"][None, :, None, :]).sum(-1)[..., None, :]
                + (w["b_Q"] * w["b_K"]).sum(-1)[None, :, None, None])
        scores = (bil + bias) / math.sqrt(self.d_head)
        mask = torch.ones(p, p, dtype=torch.bool, device=x.device).triu(1)
        pattern = scores.masked_fill(mask, float("-inf")).softmax(-1)
        z = pattern @ v
        out = torch.einsum("bhpd,hdm->bpm", z, w["W_O"]) + w["b_O"]
        return (out, pattern) if return_pattern else out


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))  # log(exp(y) − 1), stable


def ablate(model: Any, kind: str, layers: Sequence[int] | None = None) -> Any:
    """A copy of a native GPT with the SPEC B.4 ablation ``kind`` applied to ``layers``
    (default: every layer of the matching attention kind). The input model is unchanged.

    S–D layers: ``"filtering_collapse"`` (D → its mean diagonal value per head, times I:
    ``δ ← softplus⁻¹(mean softplus(δ))``), ``"routing_removal"`` (S = 0: ``A ← 0``),
    ``"filtering_removal"`` (D = 0). Softmax layers: ``"symmetric_removal"`` (keep only the
    routing part R of ``W_Q W_Kᵀ``), ``"skew_removal"`` (keep only the filtering part F);
    see :class:`KernelPartAttention`.
    """
    if not _is_native_gpt(model):
        raise TypeError(f"ablate needs a native tl_spectral GPT, got {type(model).__name__}")
    if kind in ABLATIONS_SD:
        want = "sd"
    elif kind in ABLATIONS_SOFTMAX:
        want = "softmax"
    else:
        raise ValueError(f"unknown ablation {kind!r}; S–D: {ABLATIONS_SD}, "
                         f"softmax: {ABLATIONS_SOFTMAX}")
    cands = [i for i in range(model.cfg.n_layers) if model.cfg.layer_attention(i) == want]
    layers = cands if layers is None else [int(i) for i in layers]
    wrong = [i for i in layers if i not in cands]
    if wrong or not layers:
        raise ValueError(f"ablation {kind!r} applies to {want!r} attention layers "
                         f"{cands}; got layers {list(layers)}")
    m = copy.deepcopy(model).eval()
    with torch.no_grad():
        for i in layers:
            att = m.blocks[i].attn
            if kind == "routing_removal":
                if att.routing == "skew":
                    att.A.zero_()
            elif kind == "filtering_collapse":
                if att.filtering == "diag":
                    mean = F.softplus(att.delta).mean(-1, keepdim=True)
                    att.delta.copy_(_inv_softplus(mean).expand_as(att.delta))
            elif kind == "filtering_removal":
                if att.filtering != "none":
                    att.delta.fill_(-1e4)  # softplus(-1e4) == 0 exactly in float32
            else:
                m.blocks[i].attn = KernelPartAttention(att, "skew" if kind ==
                                                       "symmetric_removal" else "symmetric")
    return m


def perplexity(model: nn.Module, windows: torch.Tensor, *, batch_size: int = 16) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) and its exponential over ``windows``
    ``[n, seq_len + 1]``: :func:`tl_spectral.models.surgery.perplexity` (one implementation)."""
    from tl_spectral.models.surgery import perplexity as _perplexity

    return _perplexity(model, windows, batch_size=batch_size)


@register_result
@dataclasses.dataclass
class AblationResult(Result):
    """SPEC B.4 ablations of one model with ΔPPL on the same validation windows.

    rows: one dict per (ablation, layers): ``ablation``, ``layers`` ("all" or an index),
    ``loss``, ``ppl``, ``delta_ppl`` (ppl − baseline), ``rel_delta`` (ΔPPL / baseline).
    """

    kind: ClassVar[str] = "routing_ablation"

    model_name: str
    attention: str
    baseline_loss: float
    baseline_ppl: float
    n_windows: int
    seq_len: int
    rows: list

    def to_rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]

    def plot(self, ax: Any = None):
        """ΔPPL of each ablation (all layers, log scale), and per layer. Returns a Figure."""
        import matplotlib.pyplot as plt

        kinds = sorted({r["ablation"] for r in self.rows})
        per = {k: sorted((r for r in self.rows if r["ablation"] == k and r["layers"] != "all"),
                         key=lambda r: r["layers"]) for k in kinds}
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4)) if ax is None else (ax.figure, [ax])
        a0 = axes[0]
        allrows = [next(r for r in self.rows if r["ablation"] == k and r["layers"] == "all")
                   for k in kinds if any(r["layers"] == "all" and r["ablation"] == k
                                         for r in self.rows)]
        a0.bar(range(len(allrows)), [max(r["delta_ppl"], 1e-3) for r in allrows],
               color="tab:purple")
        a0.set_yscale("log")
        a0.set_xticks(range(len(allrows)))
        a0.set_xticklabels([r["ablation"].replace("_", "\n") for r in allrows], fontsize=8)
        a0.set_ylabel("ΔPPL (all layers)")
        a0.set_title(f"{self.model_name}: baseline PPL {self.baseline_ppl:.3g}", fontsize=9)
        if len(axes) > 1:
            a1 = axes[1]
            for k in kinds:
                if per[k]:
                    a1.plot([r["layers"] for r in per[k]],
                            [max(r["delta_ppl"], 1e-3) for r in per[k]], "o-", label=k)
            a1.set_yscale("log")
            a1.set_xlabel("ablated layer")
            a1.set_ylabel("ΔPPL (one layer)")
            a1.legend(fontsize=7)
        fig.tight_layout()
        return fig


def ablation_table(model: Any, windows: torch.Tensor, *, kinds: Sequence[str] | None = None,
                   per_layer: bool = True, batch_size: int = 16, name: str = "model"
                   ) -> AblationResult:
    """Run the SPEC B.4 ablations of a native GPT on validation ``windows``
    ``[n, seq_len + 1]``: each ablation on all layers of its kind at once, and (``per_layer``)
    on each such layer alone. ``kinds`` default: every ablation that applies to the model's
    attention kinds."""
    kinds_present = {model.cfg.layer_attention(i) for i in range(model.cfg.n_layers)}
    if kinds is None:
        kinds = [k for k in ABLATIONS_SD if "sd" in kinds_present] + \
                [k for k in ABLATIONS_SOFTMAX if "softmax" in kinds_present]
    base = perplexity(model, windows, batch_size=batch_size)
    rows = []
    for k in kinds:
        want = "sd" if k in ABLATIONS_SD else "softmax"
        cands = [i for i in range(model.cfg.n_layers) if model.cfg.layer_attention(i) == want]
        targets: list[Any] = ["all"] + (cands if per_layer else [])
        for t in targets:
            m = ablate(model, k, None if t == "all" else [t])
            r = perplexity(m, windows, batch_size=batch_size)
            rows.append({"ablation": k, "layers": t, "loss": r["loss"], "ppl": r["ppl"],
                         "delta_ppl": r["ppl"] - base["ppl"],
                         "rel_delta": (r["ppl"] - base["ppl"]) / base["ppl"]})
    att = "+".join(sorted(kinds_present))
    return AblationResult(model_name=name, attention=att, baseline_loss=base["loss"],
                          baseline_ppl=base["ppl"], n_windows=int(windows.shape[0]),
                          seq_len=int(windows.shape[1] - 1), rows=rows)


# ------------------------------------------------------------- cascade over training
@register_result
@dataclasses.dataclass
class CascadeResult(Result):
    """Routing rank per layer over training (SPEC B.3), one entry per checkpoint.

    steps: ``[n_ckpt]``. rank_R, routing_fraction_R: ``[n_ckpt, layer, head]`` entropy
    effective rank of R and ‖R‖²/‖M‖² from the (LayerNorm-folded) kernel W_Q W_Kᵀ.
    rank_S, routing_fraction_S: ``[n_ckpt, layer, head]`` rank of S and ‖S‖²/‖S − D‖²
    (S–D models only, else None). val_loss: the run's validation losses at the checkpoint
    steps where it evaluated (``[n_ckpt]``, NaN-free: steps without evaluation hold -1).
    """

    kind: ClassVar[str] = "routing_cascade"

    run_name: str
    attention: str
    d_head: list
    steps: torch.Tensor
    rank_R: torch.Tensor
    routing_fraction_R: torch.Tensor
    val_loss: torch.Tensor
    rank_S: torch.Tensor | None = None
    routing_fraction_S: torch.Tensor | None = None

    def rank(self) -> torch.Tensor:
        """The routing rank followed by the cascade: S for S–D models, else R. [n, layer, head]"""
        return self.rank_S if self.rank_S is not None else self.rank_R

    def plot(self, ax: Any = None, which: str = "auto"):
        """Mean routing rank per layer vs training step (one line per layer). ``which``:
        "auto" (S for S–D models, else R), "S" or "R". Returns a Figure."""
        import matplotlib.pyplot as plt

        if which not in ("auto", "S", "R"):
            raise ValueError(f"which must be 'auto', 'S' or 'R', got {which!r}")
        if which == "S" and self.rank_S is None:
            raise ValueError(f"{self.run_name} has no S–D layer: plot which='R'")
        use_s = self.rank_S is not None and which != "R"
        fig, ax = plt.subplots(figsize=(5, 3.4)) if ax is None else (ax.figure, ax)
        r = (self.rank_S if use_s else self.rank_R).double().mean(-1).numpy()
        cmap = plt.get_cmap("viridis")
        L = r.shape[1]
        for l in range(L):
            ax.plot(self.steps.numpy(), r[:, l], "o-", ms=2.5, color=cmap(l / max(1, L - 1)),
                    label=f"L{l}")
        ax.set_xlabel("training step")
        ax.set_ylabel("routing rank of " + ("S" if use_s else "R (W_Q W_Kᵀ)"))
        ax.set_title(self.run_name, fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        return fig


def _checkpoint_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    out = []
    root = run_dir / "checkpoints"
    for p in sorted(root.glob("step_*")) if root.is_dir() else []:
        if (p / "trainer_state.json").is_file() and (p / "model.safetensors").is_file():
            out.append((int(p.name.split("_")[1]), p))
    if (run_dir / "final" / "model.safetensors").is_file():
        {s for s, _ in out}
        meta = json.loads((run_dir / "final" / "config.json").read_text())
        s = int(meta.get("metrics", {}).get("steps", -1))
        out = [(st, p) for st, p in out if st != s] + [(s, run_dir / "final")]
    return sorted(out)


def cascade_over_training(run_dir: str | Path, *, name: str | None = None) -> CascadeResult:
    """Routing rank per layer and head for every checkpoint of a training run
    (``run_dir/checkpoints/step_*`` and ``run_dir/final``)."""
    from tl_spectral.models import load_model

    run_dir = Path(run_dir)
    ck = _checkpoint_dirs(run_dir)
    if not ck:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}/checkpoints")
    evals: dict[int, float] = {}
    for sp in sorted((run_dir / "checkpoints").glob("step_*/trainer_state.json")):
        for e in json.loads(sp.read_text()).get("history", {}).get("evals", []):
            evals[int(e["step"])] = float(e["val_loss"])
    steps, rr, fr, rs, fs = [], [], [], [], []
    model = None
    for s, p in ck:
        model = load_model(p)
        g = model_qk_geometry(model, biases=False)
        steps.append(s)
        rr.append(g.eff_rank_R)
        fr.append(g.routing_fraction)
        if any(model.cfg.layer_attention(i) == "sd" for i in range(model.cfg.n_layers)):
            sg = model_sd_geometry(model)
            rs.append(sg.eff_rank_S)
            fs.append(sg.routing_fraction)
    assert model is not None
    kinds = sorted({model.cfg.layer_attention(i) for i in range(model.cfg.n_layers)})
    return CascadeResult(
        run_name=name or run_dir.name, attention="+".join(kinds), d_head=model.cfg.d_heads,
        steps=torch.tensor(steps), rank_R=torch.stack(rr), routing_fraction_R=torch.stack(fr),
        val_loss=torch.tensor([evals.get(s, -1.0) for s in steps], dtype=torch.float64),
        rank_S=torch.stack(rs) if rs else None,
        routing_fraction_S=torch.stack(fs) if fs else None)


# ------------------------------------------------------------------ BPE data (top-K vocab)
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


class TopKBPE:
    """GPT-2 BPE with the vocabulary truncated to the ``top_k - 1`` most frequent tokens of a
    training stream; every other GPT-2 id maps to one ``<unk>`` id (``top_k - 1``).

    keep: [top_k - 1] GPT-2 ids, most frequent first (new id = position in ``keep``).
    """

    def __init__(self, ranks_path: str | Path, keep: Sequence[int]):
        from tl_spectral.data import BPETokenizer

        self.bpe = BPETokenizer(ranks_path)
        self.keep = [int(i) for i in keep]
        if len(set(self.keep)) != len(self.keep):
            raise ValueError("TopKBPE: keep holds duplicate ids")
        self.vocab_size = len(self.keep) + 1
        self.unk_id = len(self.keep)
        lut = torch.full((self.bpe.vocab_size,), self.unk_id, dtype=torch.long)
        lut[torch.tensor(self.keep, dtype=torch.long)] = torch.arange(len(self.keep))
        self._lut = lut

    @classmethod
    def fit(cls, ranks_path: str | Path, train_ids: torch.Tensor, top_k: int) -> TopKBPE:
        """train_ids: [n] GPT-2 ids; keeps the ``top_k - 1`` most frequent (ties: lower id)."""
        if top_k < 2:
            raise ValueError(f"top_k must be >= 2 (one slot is <unk>), got {top_k}")
        counts = torch.bincount(train_ids.long(), minlength=1)
        order = sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))
        keep = [i for i in order if counts[i] > 0][: top_k - 1]
        return cls(ranks_path, keep)

    def map_ids(self, gpt2_ids: torch.Tensor) -> torch.Tensor:
        """gpt2_ids: [n] -> [n] ids in [0, vocab_size)."""
        return self._lut[gpt2_ids.long()]

    def encode(self, text: str) -> list[int]:
        return self.map_ids(torch.tensor(self.bpe.encode(text), dtype=torch.long)).tolist()

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join("<unk>" if i == self.unk_id else self.bpe.decode([self.keep[i]])
                       for i in ids)

    def to_json(self) -> str:
        return json.dumps({"type": "gpt2-bpe-topk", "ranks": "gpt2.tiktoken",
                           "top_k": self.vocab_size, "keep": self.keep})

    def __repr__(self) -> str:
        return f"TopKBPE(vocab_size={self.vocab_size})"


def _corpus_text(name: str, data_dir: Path) -> str:
    from tl_spectral.data import load_austen, load_wikipedia

    if name == "austen":
        return load_austen(data_dir / "austen.txt")
    if name == "wikipedia":
        return load_wikipedia(data_dir / "wiki_excerpt.txt")
    raise ValueError(f"unknown corpus {name!r}; use 'austen' or 'wikipedia'")


def load_bpe_data(data: dict[str, Any], cache_dir: str | Path | None = None):
    """(tokenizer, train_ids [n_train], val_ids [n_val]) for a ``data`` section
    ``{"corpora": ["austen", "wikipedia"], "data_dir": ..., "top_k": 4096,
    "val_fraction": 0.1}``. Each corpus is split into a leading train and a trailing
    validation part; the parts are encoded with GPT-2 BPE and concatenated in the given
    order. The vocabulary is fitted on the train part only. ``cache_dir``: encoded GPT-2
    ids are cached there (``bpe_ids.pt``) so that a resumed run does not re-encode."""
    from tl_spectral.data import BPETokenizer, train_val_split

    data_dir = Path(data.get("data_dir") or DEFAULT_DATA_DIR)
    ranks = data_dir / "gpt2.tiktoken"
    corpora = list(data.get("corpora", ["austen", "wikipedia"]))
    frac = float(data.get("val_fraction", 0.1))
    top_k = int(data.get("top_k", 4096))
    cache = Path(cache_dir) / "bpe_ids.pt" if cache_dir else None
    key = json.dumps({"corpora": corpora, "val_fraction": frac})
    ids = None
    if cache is not None and cache.is_file():
        blob = torch.load(cache, weights_only=True)
        if isinstance(blob, dict) and blob.get("key") == key:
            ids = blob["train"], blob["val"]
    if ids is None:
        bpe = BPETokenizer(ranks)
        tr, va = [], []
        for c in corpora:
            t, v = train_val_split(_corpus_text(c, data_dir), frac)
            tr.append(torch.tensor(bpe.encode(t), dtype=torch.long))
            va.append(torch.tensor(bpe.encode(v), dtype=torch.long))
        ids = torch.cat(tr), torch.cat(va)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"key": key, "train": ids[0], "val": ids[1]}, cache)
    tok = TopKBPE.fit(ranks, ids[0], top_k)
    return tok, tok.map_ids(ids[0]), tok.map_ids(ids[1])


def run_bpe_from_config(doc: dict[str, Any], *, overrides: dict[str, Any] | None = None):
    """Train a GPT on the BPE data of ``doc["data"]`` (see :func:`load_bpe_data`) with the
    project's Trainer (checkpoints + exact resume in ``train.out_dir``); at the end write
    ``out_dir/final`` (model, tokenizer with its kept ids, metrics on every validation
    window). Returns (trainer, history)."""
    from tl_spectral.models import GPT, GPTConfig, save_model
    from tl_spectral.models.train import TrainConfig, Trainer, _all_windows

    train_cfg = TrainConfig.from_dict({**doc["train"], **(overrides or {})})
    torch.manual_seed(train_cfg.seed)
    if train_cfg.num_threads:
        torch.set_num_threads(train_cfg.num_threads)
    tok, train_ids, val_ids = load_bpe_data(doc.get("data", {}), cache_dir=train_cfg.out_dir)
    mdoc = dict(doc["model"])
    if mdoc.get("vocab_size") in (None, "auto"):
        mdoc["vocab_size"] = tok.vocab_size
    model = GPT(GPTConfig.from_dict(mdoc))
    tok_doc = json.loads(tok.to_json())
    trainer = Trainer(model, train_ids, val_ids, train_cfg,
                      extra_metadata={"tokenizer": tok_doc, "data": doc.get("data", {})})
    history = trainer.fit()
    if trainer.out_dir is not None:
        full = trainer.evaluate(_all_windows(trainer))
        unk = float((val_ids == tok.unk_id).float().mean())
        save_model(trainer.model, trainer.out_dir / "final", extra={
            "tokenizer": tok_doc, "data": doc.get("data", {}), "train": train_cfg.to_dict(),
            "metrics": {**full, "steps": trainer.step, "tokens_seen": history.tokens_seen,
                        "val_unk_fraction": unk,
                        "eval": "all validation windows of seq_len+1, stride seq_len"}})
    return trainer, history


# ---------------------------------------------------------------------------- study
#: The models of the routing study (docs/routing_filtering.md, scripts/routing_study.sh).
STUDY_RUNS = {
    "char-shakespeare": "char", "char-shakespeare-noln": "char",
    "sd-char-shakespeare": "char", "sd-char-shakespeare-noln": "char",
    "bpe-softmax-noln": "bpe", "bpe-sd-noln": "bpe",
}


def latest_model_dir(run_dir: str | Path) -> tuple[Path, int, bool]:
    """(directory, step, finished) of a run's final model, else of its last checkpoint."""
    ck = _checkpoint_dirs(Path(run_dir))
    if not ck:
        raise FileNotFoundError(f"no checkpoint or final model under {run_dir}")
    step, path = ck[-1]
    return path, step, path.name == "final"


def validation_windows(model_dir: str | Path, kind: str, *, n_windows: int | None = None
                       ) -> torch.Tensor:
    """Validation windows ``[n, seq_len + 1]`` (stride seq_len, the trainer's evaluation
    windows) of a study run: ``kind`` "char" (bundled Tiny Shakespeare, last 10%, the
    run's own character table) or "bpe" (Austen + Wikipedia, last 10% of each, the run's
    top-K BPE). ``n_windows``: that many evenly spaced windows (None = all)."""
    from tl_spectral.data import CharTokenizer, tiny_shakespeare, train_val_split
    from tl_spectral.models.gpt import read_checkpoint_config

    meta = read_checkpoint_config(model_dir)
    seq = int(meta.get("train", {}).get("seq_len") or meta["model"]["n_ctx"])
    data = meta.get("data", {})
    if kind == "char":
        tok = CharTokenizer.from_json(json.dumps(meta["tokenizer"]))
        _, val = train_val_split(tiny_shakespeare(), float(data.get("val_fraction", 0.1)))
        ids = torch.tensor(tok.encode(val))
    elif kind == "bpe":
        tok, _, ids = load_bpe_data(data, cache_dir=Path(model_dir).parents[
            0 if Path(model_dir).name == "final" else 1])
        if tok.keep != list(meta["tokenizer"]["keep"]):
            raise ValueError(f"{model_dir}: the refitted top-K vocabulary differs from the run's")
    else:
        raise ValueError(f"kind must be 'char' or 'bpe', got {kind!r}")
    n = (ids.numel() - 1) // seq
    starts = torch.arange(n) * seq
    if n_windows is not None and n_windows < n:
        starts = starts[torch.linspace(0, n - 1, n_windows).round().long()]
    return ids[starts[:, None] + torch.arange(seq + 1)[None, :]]


def minimal_rank_share(rank: torch.Tensor, threshold: float = 3.0) -> float:
    """Share of layers whose mean routing rank (``rank`` ``[layer, head]``) is at most
    ``threshold`` (*choice*: 3 = one rotation plane plus slack; the paper's "minimal
    spectral rank" is rank 2)."""
    return float((rank.double().mean(-1) <= threshold).double().mean())


def _geometry_summary(geo: QKGeometry) -> dict[str, Any]:
    return {"n_heads_total": int(geo.n_layers * geo.n_heads),
            "unstable_heads": int(geo.unstable.sum()),
            "routing_fraction_mean": float(geo.routing_fraction.mean()),
            "rank_R_mean": float(geo.eff_rank_R.mean()), "pr_R_mean": float(geo.pr_R.mean()),
            "capacity": int(geo.routing_capacity.max()),
            "positive_eig_share_mean": float(geo.positive_share.mean()),
            "layers": geometry_layer_table(geo),
            "layers_pr": [r["rank_R"] for r in geometry_layer_table(geo, measure="participation")]}


def random_baseline(d_model: int, n_heads: int, d_head: int, n_layers: int = 1, seed: int = 0
                    ) -> QKGeometry:
    """QK geometry of i.i.d. Gaussian W_Q, W_K of the given shape (the no-structure
    reference: routing fraction ≈ 0.5)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n_layers, n_heads, d_model, d_head)
    return qk_geometry(torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def run_study(out_dir: str | Path = "runs/routing_study", *, runs_dir: str | Path = "runs",
              fig_dir: str | Path | None = "docs/figures", n_windows: int = 64,
              names: Sequence[str] | None = None, minilm: bool = True,
              per_layer: bool = True, merge: bool = True) -> dict[str, Any]:
    """The routing study of docs/routing_filtering.md: for MiniLM (if installed) and every
    study run found under ``runs_dir`` — QK geometry, S–D geometry, the cascade over
    training, the SPEC B.4 ablations with ΔPPL on ``n_windows`` evenly spaced validation
    windows. Results go to ``out_dir`` (one ``.safetensors`` per result and
    ``summary.json``; with ``merge`` an existing summary is updated, so the study can run
    in parts), figures (of everything in ``out_dir``) to ``fig_dir/routing_*.png``.
    Returns the summary."""
    from tl_spectral.models import load_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"n_windows": n_windows, "models": {}, "baselines": {}}
    if merge and (out / "summary.json").is_file():  # update the entries computed now
        summary = json.loads((out / "summary.json").read_text())
        summary["n_windows"] = n_windows
    geos: dict[str, QKGeometry] = {}
    sds: dict[str, SDGeometry] = {}
    cascades: dict[str, CascadeResult] = {}
    abls: dict[str, AblationResult] = {}
    if minilm:
        try:
            from tl_spectral.models import zoo

            enc, _ = zoo.load("minilm")
        except Exception as e:  # noqa: BLE001 - report why and go on
            summary["minilm_error"] = f"{type(e).__name__}: {e}"
        else:
            g = model_qk_geometry(enc)
            g.save(out / "minilm_qk.safetensors")
            g.to_csv(out / "minilm_heads.csv")
            geos["minilm"] = g
            summary["models"]["minilm"] = {"qk": _geometry_summary(g)}
    for shape in ((384, 12, 32), (128, 8, 16), (128, 4, 32)):
        summary["baselines"]["gaussian_{}_{}_{}".format(*shape)] = _geometry_summary(
            random_baseline(*shape, n_layers=2))
    for name in names or list(STUDY_RUNS):
        run = Path(runs_dir) / name
        try:
            mdir, step, finished = latest_model_dir(run)
        except FileNotFoundError as e:
            summary["models"][name] = {"error": str(e)}
            continue
        model = load_model(mdir).eval()
        entry: dict[str, Any] = {"model_dir": str(mdir), "step": step, "finished": finished,
                                 "config": model.cfg.to_dict(),
                                 "n_params": model.num_params()}
        meta = json.loads((mdir / "config.json").read_text())
        if "metrics" in meta:
            entry["val_metrics_all_windows"] = meta["metrics"]
        g = model_qk_geometry(model)
        g.save(out / f"{name}_qk.safetensors")
        g.to_csv(out / f"{name}_heads.csv")
        geos[name] = g
        entry["qk"] = _geometry_summary(g)
        if any(model.cfg.layer_attention(i) == "sd" for i in range(model.cfg.n_layers)):
            sg = model_sd_geometry(model)
            sg.save(out / f"{name}_sd.safetensors")
            sg.to_csv(out / f"{name}_sd_heads.csv")
            sds[name] = sg
            entry["sd"] = {"layers": geometry_layer_table(sg),
                           "layers_pr": [r["rank_S"] for r in
                                         geometry_layer_table(sg, measure="participation")],
                           "all_stable": sg.all_stable,
                           "minimal_rank_layer_share": minimal_rank_share(sg.eff_rank_S)}
        c = cascade_over_training(run, name=name)
        c.save(out / f"{name}_cascade.safetensors")
        cascades[name] = c
        entry["cascade_steps"] = c.steps.tolist()
        entry["cascade_rank_mean"] = c.rank().double().mean(-1).tolist()
        entry["cascade_rank_R_mean"] = c.rank_R.double().mean(-1).tolist()
        entry["cascade_val_loss"] = c.val_loss.tolist()
        win = validation_windows(mdir, STUDY_RUNS.get(name, "char"), n_windows=n_windows)
        a = ablation_table(model, win, name=name, per_layer=per_layer)
        a.save(out / f"{name}_ablation.safetensors")
        abls[name] = a
        entry["ablation"] = {"baseline_ppl": a.baseline_ppl, "baseline_loss": a.baseline_loss,
                             "rows": a.rows, "n_windows": a.n_windows, "seq_len": a.seq_len}
        summary["models"][name] = entry
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    order = ["minilm", *STUDY_RUNS]
    summary["models"] = dict(sorted(summary["models"].items(), key=lambda kv: (
        order.index(kv[0]) if kv[0] in order else len(order))))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if fig_dir is not None:
        figures_from_dir(out, fig_dir)
    return summary


def figures_from_dir(out_dir: str | Path, fig_dir: str | Path) -> list[Path]:
    """Rebuild the study figures from the results saved in ``out_dir`` by :func:`run_study`
    (models in the order of ``summary.json``)."""
    out = Path(out_dir)
    summary = json.loads((out / "summary.json").read_text())
    geos, sds, cascades, abls = {}, {}, {}, {}
    for name, e in summary["models"].items():
        if "error" in e:
            continue
        for suffix, store in (("qk", geos), ("sd", sds), ("cascade", cascades),
                              ("ablation", abls)):
            p = out / f"{name}_{suffix}.safetensors"
            if p.is_file():
                store[name] = Result.load(p)
    return study_figures(geos, sds, cascades, abls, fig_dir)


def study_figures(geos: dict[str, QKGeometry], sds: dict[str, SDGeometry],
                  cascades: dict[str, CascadeResult], abls: dict[str, AblationResult],
                  fig_dir: str | Path) -> list[Path]:
    """Write the study's figures (``routing_*.png``) into ``fig_dir``; returns the paths."""
    import matplotlib.pyplot as plt

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name):
        p = fig_dir / f"routing_{name}.png"
        fig.savefig(p, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)

    names = list(geos)
    if names:  # budget, rank of R, eigenvalues: one row per model
        fig, axes = plt.subplots(len(names), 3, figsize=(15, 3.3 * len(names)), squeeze=False)
        for i, n in enumerate(names):
            geos[n].plot_budget(ax=axes[i, 0])
            geos[n].plot_routing_rank(ax=axes[i, 1], show_capacity=True)
            geos[n].plot_eigenvalues(ax=axes[i, 2])
            for a in axes[i]:
                a.set_title(f"{n}: {a.get_title()}", fontsize=9)
        fig.tight_layout()
        save(fig, "qk_geometry")
    if sds:  # S–D: rank of S per layer and eigenvalues of S − D
        fig, axes = plt.subplots(len(sds), 2, figsize=(10, 3.3 * len(sds)), squeeze=False)
        for i, (n, sg) in enumerate(sds.items()):
            sg.plot_routing_rank(ax=axes[i, 0], show_capacity=True)
            sg.plot_eigenvalues(ax=axes[i, 1])
            for a in axes[i]:
                a.set_title(f"{n}: {a.get_title()}", fontsize=9)
        fig.tight_layout()
        save(fig, "sd_geometry")
    if cascades:  # the cascade by depth (final) and over training
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for j, (n, c) in enumerate(cascades.items()):
            col = f"C{j}"
            r = c.rank_R[-1].double().mean(-1).numpy()
            ax.plot(range(len(r)), r, "s--", color=col, label=f"{n} (R)")
            if c.rank_S is not None:
                r = c.rank_S[-1].double().mean(-1).numpy()
                ax.plot(range(len(r)), r, "o:", color=col, alpha=0.6, label=f"{n} (S)")
        ax.set_xlabel("layer")
        ax.set_ylabel("routing rank (entropy), mean over heads")
        ax.set_title("Routing rank by depth at the last checkpoint")
        ax.legend(fontsize=7)
        fig.tight_layout()
        save(fig, "cascade_depth")
        k = len(cascades)
        fig, axes = plt.subplots((k + 1) // 2, 2, figsize=(11, 3.3 * ((k + 1) // 2)),
                                 squeeze=False)
        for a, c in zip(axes.ravel(), cascades.values()):
            c.plot(ax=a)
        for a in axes.ravel()[k:]:
            a.axis("off")
        fig.tight_layout()
        save(fig, "cascade_training")
        fig, axes = plt.subplots((k + 1) // 2, 2, figsize=(11, 3.3 * ((k + 1) // 2)),
                                 squeeze=False)
        for a, c in zip(axes.ravel(), cascades.values()):
            c.plot(ax=a, which="R")
        for a in axes.ravel()[k:]:
            a.axis("off")
        fig.tight_layout()
        save(fig, "cascade_training_R")
    if abls:
        fig, ax = plt.subplots(figsize=(8, 3.8))
        kinds = list(ABLATIONS_SD) + list(ABLATIONS_SOFTMAX)
        width = 0.8 / max(1, len(abls))
        for j, (n, a) in enumerate(abls.items()):
            vals = []
            for kd in kinds:
                r = [x for x in a.rows if x["ablation"] == kd and x["layers"] == "all"]
                vals.append(max(r[0]["rel_delta"], 1e-4) if r else float("nan"))
            ax.bar([i + j * width for i in range(len(kinds))], vals, width, label=n)
        ax.set_yscale("log")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))])
        ax.set_xticklabels([kd.replace("_", "\n") for kd in kinds], fontsize=8)
        ax.set_ylabel("ΔPPL / PPL (all layers; floor 1e-4)")
        ax.set_title("SPEC B.4 ablations")
        ax.legend(fontsize=7)
        fig.tight_layout()
        save(fig, "ablations")
    return paths


def _fmt(x: Any, nd: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{nd}g}" if abs(x) < 1e4 else f"{x:.3e}"
    return str(x)


def study_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables of a study summary (``runs/routing_study/summary.json``): overview,
    routing rank per layer, ablations, the cascade over training, Gaussian baselines."""
    L: list[str] = []
    models = summary["models"]
    L.append("| model | attention | LN | params | step (finished) | val PPL | heads | unstable "
             "| routing fraction | rank R (entropy / PR) / capacity |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for n, e in models.items():
        if "error" in e:
            L.append(f"| {n} | — | — | — | missing: {e['error']} | | | | | |")
            continue
        q = e["qk"]
        cfg = e.get("config", {})
        att = cfg.get("attention", "softmax (BERT)")
        ln = {"ln": "yes", "none": "no"}.get(cfg.get("normalization"), "post-LN")
        ppl = e.get("val_metrics_all_windows", {}).get("val_ppl")
        if ppl is None and "ablation" in e:
            ppl = e["ablation"]["baseline_ppl"]
        stp = f"{e['step']} ({'yes' if e['finished'] else 'no'})" if "step" in e else "—"
        L.append(f"| {n} | {att} | {ln} | {e.get('n_params', '—')} | {stp} | "
                 f"{_fmt(ppl) if ppl else '—'} | {q['n_heads_total']} | {q['unstable_heads']} | "
                 f"{q['routing_fraction_mean']:.3f} | {q['rank_R_mean']:.1f} / "
                 f"{q['pr_R_mean']:.1f} / {q['capacity']} |")
    L.append("")
    n_layers = max((len(e["qk"]["layers"]) for e in models.values() if "qk" in e), default=0)
    L.append("| model | rank of | " + " | ".join(f"L{i}" for i in range(n_layers))
             + " | minimal-rank layers |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "qk" not in e:
            continue
        if "sd" in e:
            r = [x["rank_S"] for x in e["sd"]["layers"]]
            pr = e["sd"]["layers_pr"]
            share = f"{e['sd']['minimal_rank_layer_share']:.0%}"
            L.append(f"| {n} | S (entropy / PR) | " + " | ".join(
                f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + f" | {share} |")
        r = [x["rank_R"] for x in e["qk"]["layers"]]
        pr = e["qk"]["layers_pr"]
        L.append(f"| {n} | R (entropy / PR) | " + " | ".join(
            f"{a:.1f} / {b:.1f}" for a, b in zip(r, pr)) + " | |")
    L.append("")
    kinds = list(ABLATIONS_SD) + list(ABLATIONS_SOFTMAX)
    L.append("| model | PPL (windows) | " + " | ".join(k.replace("_", " ") for k in kinds) + " |")
    L.append("|---|---|" + "---|" * len(kinds))
    for n, e in models.items():
        if "ablation" not in e:
            continue
        a = e["ablation"]
        cells = []
        for k in kinds:
            r = [x for x in a["rows"] if x["ablation"] == k and x["layers"] == "all"]
            cells.append(f"{r[0]['delta_ppl']:+.3g} ({r[0]['rel_delta']:+.1%})" if r else "—")
        L.append(f"| {n} | {a['baseline_ppl']:.3g} ({a['n_windows']}×{a['seq_len']}) | "
                 + " | ".join(cells) + " |")
    L.append("")
    L.append("Per-layer ablations (ΔPPL when only that layer is ablated):")
    L.append("")
    L.append("| model | ablation | " + " | ".join(f"L{i}" for i in range(n_layers)) + " |")
    L.append("|---|---|" + "---|" * n_layers)
    for n, e in models.items():
        if "ablation" not in e:
            continue
        for k in kinds:
            rows = sorted((x for x in e["ablation"]["rows"] if x["ablation"] == k
                           and x["layers"] != "all"), key=lambda x: x["layers"])
            if rows:
                L.append(f"| {n} | {k.replace('_', ' ')} | "
                         + " | ".join(f"{x['delta_ppl']:+.3g}" for x in rows) + " |")
    L.append("")
    L.append("Routing rank per layer over training (entropy effective rank, mean over heads; "
             "S–D models: rank of S / rank of R = W_P S W_Pᵀ; softmax: rank of R; val loss in "
             "nats where the run evaluated):")
    L.append("")
    L.append("| model | step | " + " | ".join(f"L{i}" for i in range(n_layers)) + " | val loss |")
    L.append("|---|---|" + "---|" * n_layers + "---|")
    for n, e in models.items():
        if "cascade_steps" not in e:
            continue
        steps = e["cascade_steps"]
        pick = sorted({0, len(steps) // 4, len(steps) // 2, 3 * len(steps) // 4,
                           len(steps) - 1})
        is_sd = "sd" in e
        for i in pick:
            vl = e["cascade_val_loss"][i]
            if is_sd and "cascade_rank_R_mean" in e:
                cells = [f"{a:.1f} / {b:.1f}" for a, b in zip(e["cascade_rank_mean"][i],
                                                             e["cascade_rank_R_mean"][i])]
            else:
                cells = [f"{x:.1f}" for x in e["cascade_rank_mean"][i]]
            L.append(f"| {n} | {steps[i]} | " + " | ".join(cells) + " | "
                     + (f"{vl:.3f}" if vl > 0 else "") + " |")
    L.append("")
    L.append("| Gaussian W_Q, W_K (d_model, heads, d_head) | routing fraction | rank R (entropy "
             "/ PR) / capacity | unstable heads |")
    L.append("|---|---|---|---|")
    for n, b in summary.get("baselines", {}).items():
        L.append(f"| {n.split('_', 1)[1].replace('_', ', ')} | {b['routing_fraction_mean']:.3f} "
                 f"| {b['rank_R_mean']:.1f} / {b['pr_R_mean']:.1f} / {b['capacity']} | "
                 f"{b['unstable_heads']} of {b['n_heads_total']} |")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tl_spectral.routing")
    sub = ap.add_subparsers(dest="cmd", required=True)
    tb = sub.add_parser("train-bpe", help="train a GPT on Austen + Wikipedia (top-K GPT-2 BPE)")
    tb.add_argument("--config", required=True)
    tb.add_argument("--steps", type=int)
    tb.add_argument("--out-dir")
    tb.add_argument("--no-progress", action="store_true")
    sd = sub.add_parser("study", help="the routing study: geometry, cascade, ablations")
    sd.add_argument("--out", default="runs/routing_study")
    sd.add_argument("--runs-dir", default="runs")
    sd.add_argument("--fig-dir", default="docs/figures")
    sd.add_argument("--windows", type=int, default=64)
    sd.add_argument("--models", nargs="*", help=f"subset of {list(STUDY_RUNS)}")
    sd.add_argument("--no-minilm", action="store_true")
    sd.add_argument("--no-per-layer", action="store_true")
    sd.add_argument("--threads", type=int, default=1)
    sd.add_argument("--fresh", action="store_true", help="do not merge into summary.json")
    tb2 = sub.add_parser("tables", help="markdown tables of a study summary.json")
    tb2.add_argument("summary")
    args = ap.parse_args(argv)
    if args.cmd == "tables":
        print(study_markdown(json.loads(Path(args.summary).read_text())))
    if args.cmd == "study":
        torch.set_num_threads(args.threads)
        summary = run_study(args.out, runs_dir=args.runs_dir, fig_dir=args.fig_dir,
                            n_windows=args.windows, names=args.models,
                            minilm=not args.no_minilm, per_layer=not args.no_per_layer,
                            merge=not args.fresh)
        print(json.dumps({k: v.get("ablation", {}).get("baseline_ppl") if isinstance(v, dict)
                          else None for k, v in summary["models"].items()}))
    if args.cmd == "train-bpe":
        doc = json.loads(Path(args.config).read_text())
        ov: dict[str, Any] = {}
        if args.steps:
            ov["steps"] = args.steps
        if args.out_dir:
            ov["out_dir"] = args.out_dir
        if args.no_progress:
            ov["progress"] = False
        trainer, history = run_bpe_from_config(doc, overrides=ov)
        print(json.dumps({"step": trainer.step, "val_loss": history.final_val_loss,
                          "out_dir": str(trainer.out_dir) if trainer.out_dir else None}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
