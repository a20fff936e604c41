"""SPEC B.4 ablations of the project's GPT models: filtering collapse, routing removal and
filtering removal on S–D layers; symmetric / skew part removal on softmax layers; the table of
their ΔPPL on validation windows (:func:`ablation_table`); rank truncation of the routing or
filtering part to its top-r singular directions (:func:`truncate_rank`) and its ΔPPL against
r (:func:`rank_truncation_curve`)."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tl_spectral._deprecation import renamed_arguments
from tl_spectral.checks import check_int
from tl_spectral.data.inputs import as_token_tensor
from tl_spectral.interventions.surgery import perplexity
from tl_spectral.models.gpt import GPT
from tl_spectral.results import Result, register_result

__all__ = ["ABLATIONS_SD", "ABLATIONS_SOFTMAX", "AblationResult", "KernelPartAttention",
           "RankTruncationCurve", "TruncatedKernelAttention", "ablate", "ablation_table",
           "perplexity", "rank_truncation_curve", "svd_truncate", "truncate_rank"]


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
        return self._draw("plot", ax=ax)


def _scored(model: Any, windows: torch.Tensor, base: dict[str, float], batch_size: int
            ) -> dict[str, float]:
    """``loss``, ``ppl``, ``delta_ppl`` and ``rel_delta`` of a changed model against the
    baseline ``base`` (a :func:`perplexity` result) on the same windows."""
    r = perplexity(model, windows, batch_size=batch_size)
    d = r["ppl"] - base["ppl"]
    return {"loss": r["loss"], "ppl": r["ppl"], "delta_ppl": d, "rel_delta": d / base["ppl"]}


@renamed_arguments(windows="tokens")
def ablation_table(model: Any, tokens: torch.Tensor, *, kinds: Sequence[str] | None = None,
                   per_layer: bool = True, batch_size: int = 16, name: str = "model"
                   ) -> AblationResult:
    """Run the SPEC B.4 ablations of a native GPT on validation ``tokens``
    ``[n, seq_len + 1]``: each ablation on all layers of its kind at once, and (``per_layer``)
    on each such layer alone. ``kinds`` default: every ablation that applies to the model's
    attention kinds. ``tokens``: a tensor, lists of ids or ``DocumentWindows`` (``windows=`` is
    its deprecated name)."""
    windows = as_token_tensor(tokens, "tokens", min_len=2)
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
            rows.append({"ablation": k, "layers": t, **_scored(
                ablate(model, k, None if t == "all" else [t]), windows, base, batch_size)})
    att = "+".join(sorted(kinds_present))
    return AblationResult(model_name=name, attention=att, baseline_loss=base["loss"],
                          baseline_ppl=base["ppl"], n_windows=int(windows.shape[0]),
                          seq_len=int(windows.shape[1] - 1), rows=rows)


# ------------------------------------------------------------------ rank truncation
TRUNCATION_PARTS = ("routing", "filtering")
"""What :func:`truncate_rank` truncates: softmax heads: ``"routing"`` = the skew part
``R = ½(M − Mᵀ)`` of ``M = W_Q W_Kᵀ``, ``"filtering"`` = the symmetric part
``F = ½(M + Mᵀ)``; S–D heads: ``"routing"`` = S, ``"filtering"`` = D."""


def svd_truncate(m: torch.Tensor, r: int) -> torch.Tensor:
    """Best rank-``r`` approximation of each matrix of ``m`` ``[..., n, n]`` (Eckart–Young:
    the top-``r`` singular triplets, ``U_r Σ_r V_rᵀ``), computed in float64 and returned
    in ``m``'s dtype. ``r >= n`` returns ``m`` unchanged."""
    check_int("rank r", r, minimum=0, hint="e.g. r=0 (the part removed) or r=2")
    if r >= min(m.shape[-2:]):
        return m.clone()
    u, sv, vh = torch.linalg.svd(m.double(), full_matrices=False)
    return ((u[..., :, :r] * sv[..., None, :r]) @ vh[..., :r, :]).to(m.dtype)


class TruncatedKernelAttention(nn.Module):
    """Softmax attention whose bilinear score uses ``M' = F + R`` with one part of
    ``M = W_Q W_Kᵀ`` (per head, ``[d_model, d_model]``) replaced by its best rank-``r``
    approximation (:func:`svd_truncate`): ``part="filtering"`` truncates the symmetric part
    F, ``part="routing"`` the skew part R. Bias terms as :class:`KernelPartAttention`
    (kept). ``r >= d_model`` gives back ``M`` (up to float rounding). The kernels are fixed
    at construction (``self.kernels``: ``[head, d_model, d_model]``).
    forward(x [b, p, d_model]) -> [b, p, d_model]."""

    def __init__(self, base: nn.Module, part: str, r: int):
        super().__init__()
        if part not in TRUNCATION_PARTS:
            raise ValueError(f"part must be one of {TRUNCATION_PARTS}, got {part!r}")
        if not hasattr(base, "qkv"):
            raise TypeError(f"TruncatedKernelAttention wraps softmax attention, got "
                            f"{type(base).__name__}")
        self.base, self.part, self.r = base, part, r
        self.n_heads, self.d_head = base.n_heads, base.d_head
        with torch.no_grad():
            w = base.weights()
            m = (w["W_Q"].double() @ w["W_K"].double().transpose(-1, -2))  # [h, dm, dm]
            sym, skew = 0.5 * (m + m.transpose(-1, -2)), 0.5 * (m - m.transpose(-1, -2))
            if part == "filtering":
                sym = svd_truncate(sym, r)
            else:
                skew = svd_truncate(skew, r)
            self.register_buffer("kernels", (sym + skew).to(w["W_Q"].dtype),
                                 persistent=False)

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        w = self.base.weights()
        _b, p, _ = x.shape
        q0 = torch.einsum("bpm,hmd->bhpd", x, w["W_Q"])
        k0 = torch.einsum("bpm,hmd->bhpd", x, w["W_K"])
        v = torch.einsum("bpm,hmd->bhpd", x, w["W_V"]) + w["b_V"][None, :, None, :]
        bil = torch.einsum("bpm,hmn,bqn->bhpq", x, self.kernels, x)
        bias = ((q0 * w["b_K"][None, :, None, :]).sum(-1)[..., :, None]
                + (k0 * w["b_Q"][None, :, None, :]).sum(-1)[..., None, :]
                + (w["b_Q"] * w["b_K"]).sum(-1)[None, :, None, None])
        scores = (bil + bias) / math.sqrt(self.d_head)
        mask = torch.ones(p, p, dtype=torch.bool, device=x.device).triu(1)
        pattern = scores.masked_fill(mask, float("-inf")).softmax(-1)
        z = pattern @ v
        out = torch.einsum("bhpd,hdm->bpm", z, w["W_O"]) + w["b_O"]
        return (out, pattern) if return_pattern else out


def truncate_rank(model: Any, part: str, r: int, layers: Sequence[int] | None = None) -> Any:
    """A copy of a native GPT whose attention keeps only the top-``r`` singular directions
    of its routing or filtering part in ``layers`` (default: every softmax and S–D layer);
    the other part and everything else are untouched. The input model is unchanged.

    Softmax layers: :class:`TruncatedKernelAttention` (``part="routing"``: the skew part of
    ``W_Q W_Kᵀ``; ``"filtering"``: the symmetric part; both ``[d_model, d_model]``).
    S–D layers (``filtering="diag"``, ``routing="skew"``): ``"routing"``: S ← its best
    rank-r approximation ``S_r`` (stored as ``A ← −S_r/2``, so ``Aᵀ − A = S_r``);
    ``"filtering"``: D keeps its ``r`` largest diagonal entries (ties: the lower index), the
    others become 0 (``δ ← −1e4``). The singular values of a skew matrix come in equal pairs
    (one per rotation plane), so ``r`` must be even for routing (an odd r would cut a plane
    in half, and the truncation would not be unique).
    """
    if not _is_native_gpt(model):
        raise TypeError(f"truncate_rank needs a native tl_spectral GPT, got "
                        f"{type(model).__name__}")
    if part not in TRUNCATION_PARTS:
        raise ValueError(f"part must be one of {TRUNCATION_PARTS}, got {part!r}")
    check_int("rank r", r, minimum=0, hint="e.g. r=0 (the part removed) or r=2")
    if part == "routing" and r % 2:
        raise ValueError(f"r={r}: the routing part is skew-symmetric, its singular values "
                         "come in equal pairs (rotation planes); pass an even r")
    cands = [i for i in range(model.cfg.n_layers)
             if model.cfg.layer_attention(i) in ("softmax", "sd")]
    layers = cands if layers is None else [int(i) for i in layers]
    wrong = [i for i in layers if i not in cands]
    if wrong or not layers:
        raise ValueError(f"truncate_rank applies to softmax and S–D layers {cands}; got "
                         f"layers {list(layers)}")
    m = copy.deepcopy(model).eval()
    with torch.no_grad():
        for i in layers:
            att = m.blocks[i].attn
            if model.cfg.layer_attention(i) == "softmax":
                m.blocks[i].attn = TruncatedKernelAttention(att, part, r)
                continue
            if part == "routing":
                if att.routing != "skew":
                    raise ValueError(f"layer {i} has no routing part (routing="
                                     f"{att.routing!r})")
                att.A.copy_(-0.5 * svd_truncate(att.S(), r))
            else:
                if att.filtering != "diag":
                    raise ValueError(f"layer {i}: filtering truncation needs filtering='diag',"
                                     f" got {att.filtering!r}")
                d = F.softplus(att.delta)  # [h, d_head]
                order = torch.sort(-d, dim=-1, stable=True).indices
                drop = order[:, r:]
                att.delta.scatter_(-1, drop, torch.full_like(drop, -1e4, dtype=d.dtype))
    return m


@register_result
@dataclasses.dataclass
class RankTruncationCurve(Result):
    """ΔPPL of :func:`truncate_rank` against the rank r, for the routing and filtering parts.

    rows: one dict per (part, r): ``part``, ``r``, ``loss``, ``ppl``, ``delta_ppl``
    (ppl − baseline), ``rel_delta`` (ΔPPL / baseline). ``full_rank``: the rank from which
    on truncation is the identity (min(d_model, 2·d_head) for softmax heads, whose parts
    have rank <= 2·d_head; d_head for S–D heads).
    """

    kind: ClassVar[str] = "rank_truncation"

    model_name: str
    attention: str
    baseline_loss: float
    baseline_ppl: float
    n_windows: int
    seq_len: int
    full_rank: int
    rows: list

    def to_rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows]

    def curve(self, part: str) -> tuple[list[int], list[float]]:
        """(ranks, relative ΔPPL) of one part, by increasing r."""
        rows = sorted((r for r in self.rows if r["part"] == part), key=lambda r: r["r"])
        return [r["r"] for r in rows], [r["rel_delta"] for r in rows]

    def plot(self, ax: Any = None):
        """Relative ΔPPL against r (log-log) for routing and filtering. Returns a Figure."""
        return self._draw("plot", ax=ax)


@renamed_arguments(windows="tokens")
def rank_truncation_curve(model: Any, tokens: torch.Tensor, *,
                          ranks: Sequence[int] | None = None,
                          parts: Sequence[str] = TRUNCATION_PARTS,
                          layers: Sequence[int] | None = None, batch_size: int = 16,
                          name: str = "model") -> RankTruncationCurve:
    """ΔPPL on ``tokens`` ``[n, seq_len + 1]`` of :func:`truncate_rank` for each part and
    rank (all layers at once, or ``layers``). ``ranks`` default: 1, 2, 4, … up to the full
    rank (min(d_model, 2·d_head) for softmax heads, d_head for S–D heads); odd ranks are
    skipped for the routing part (its singular values come in pairs). ``windows=``: the
    deprecated name of ``tokens``."""
    windows = as_token_tensor(tokens, "tokens", min_len=2)
    kinds = {model.cfg.layer_attention(i) for i in range(model.cfg.n_layers)}
    dh = max(model.cfg.d_heads)
    # rank W_Q W_Kᵀ <= d_head, so each of its parts has rank <= 2·d_head
    full = dh if kinds <= {"sd"} else min(int(model.cfg.d_model), 2 * dh)
    if ranks is None:
        ranks = [2 ** k for k in range(int(math.log2(full)) + 1)]
    base = perplexity(model, windows, batch_size=batch_size)
    rows = []
    for part in parts:
        for r in ranks:
            if part == "routing" and r % 2:
                continue
            rows.append({"part": part, "r": int(r), **_scored(
                truncate_rank(model, part, int(r), layers), windows, base, batch_size)})
    return RankTruncationCurve(model_name=name, attention="+".join(sorted(kinds)),
                               baseline_loss=base["loss"], baseline_ppl=base["ppl"],
                               n_windows=int(windows.shape[0]),
                               seq_len=int(windows.shape[1] - 1), full_rank=full, rows=rows)
