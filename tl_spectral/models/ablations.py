"""SPEC B.4 ablations of the project's GPT models: filtering collapse, routing removal and
filtering removal on S–D layers; symmetric / skew part removal on softmax layers; the table of
their ΔPPL on validation windows (:func:`ablation_table`)."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tl_spectral.data.inputs import as_token_tensor
from tl_spectral.models.gpt import GPT
from tl_spectral.models.surgery import perplexity
from tl_spectral.results import Result, register_result

__all__ = ["ABLATIONS_SD", "ABLATIONS_SOFTMAX", "AblationResult", "KernelPartAttention",
           "ablate", "ablation_table", "perplexity"]


def _is_native_gpt(model: Any) -> bool:
    return isinstance(model, GPT)


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
    if not cands:
        kinds = sorted({model.cfg.layer_attention(i) for i in range(model.cfg.n_layers)})
        fits = [k for k in (ABLATIONS_SD if "sd" in kinds else ()) + (
            ABLATIONS_SOFTMAX if "softmax" in kinds else ())]
        raise ValueError(f"ablation {kind!r} needs {want!r} attention layers and this model "
                         f"has none (its layers are {kinds}); ablations that apply: "
                         f"{fits or 'none'}")
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
    attention kinds. ``windows``: a tensor, lists of ids or ``DocumentWindows``."""
    windows = as_token_tensor(windows, "windows", min_len=2)
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
