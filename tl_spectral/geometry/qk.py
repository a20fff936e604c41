"""Weight geometry of attention heads: routing vs filtering (SPEC part B.1, B.3, B.7).

Everything here works on weight tensors only (no model, no TransformerLens).

For one head with query/key weights ``W_Q, W_K ∈ R^{d_model × d_head}`` the interaction
kernel in the residual space is ``M = W_Q W_Kᵀ`` (``score_ij = x_i M x_jᵀ / sqrt(d_head)``
up to bias terms). It splits orthogonally (Frobenius inner product) into

* filtering ``F = (M + Mᵀ)/2`` (symmetric: mutual relevance, gain control) and
* routing ``R = (M − Mᵀ)/2`` (skew-symmetric: directed, conservative transport),

so ``‖M‖²_F = ‖F‖²_F + ‖R‖²_F``. No ``d_model × d_model`` matrix is ever formed: with
``A = [W_Q, W_K] ∈ R^{d_model × 2 d_head}`` and its QR factorisation ``A = Q [R₁, R₂]``
(so ``W_Q = Q R₁``, ``W_K = Q R₂``), ``M = Q X Qᵀ`` with the small core ``X = R₁ R₂ᵀ``
(``k × k``, ``k = min(2 d_head, d_model)``), hence ``R = Q (X − Xᵀ)/2 Qᵀ`` and
``F = Q (X + Xᵀ)/2 Qᵀ`` have the singular values of the cores. This is the same as
``R = ½ [W_Q, W_K][W_K, −W_Q]ᵀ`` and ``F = ½ [W_Q, W_K][W_K, W_Q]ᵀ``.
The nonzero eigenvalues of ``M`` are those of ``W_Kᵀ W_Q`` (``d_head × d_head``).

Public API: :func:`qk_geometry` → :class:`QKGeometry`; :func:`sd_geometry` →
:class:`SDGeometry`; :func:`recover_sd_from_qk`; the spectral helpers
:func:`entropy_effective_rank` and :func:`participation_ratio`.
See ``docs/routing_filtering.md`` for formulas and choices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from tl_spectral._deprecation import deprecated_method
from tl_spectral.geometry.common import (
    as_layers,
    check_finite,
    pad_stack,
    per_head_table,
    resolve_layer_names,
    table_rows,
    write_csv,
)
from tl_spectral.results import Result, register_result

__all__ = [
    "DEFAULT_ZERO_RTOL",
    "QKGeometry",
    "SDGeometry",
    "entropy_effective_rank",
    "participation_ratio",
    "qk_geometry",
    "recover_sd_from_qk",
    "sd_geometry",
]

#: Default relative tolerance (float64 computation) below which an eigenvalue counts as
#: zero (``|λ| ≤ zero_rtol · max_k |λ_k|``) and a real part counts as nonpositive
#: (``Re λ ≤ zero_rtol · max_k |λ_k|``).
DEFAULT_ZERO_RTOL = 1e-8


# ----------------------------------------------------------------------------- helpers
def entropy_effective_rank(sv: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Entropy effective rank (Roy & Vetterli 2007) of nonnegative singular values.

    ``exp(−Σ_k p_k log p_k)`` with ``p = σ / Σσ`` and ``0 log 0 = 0``.

    ``sv``: singular values, e.g. ``[..., k]`` (zeros used as padding are harmless).
    ``dim``: the dimension holding the singular values.

    Returns ``sv`` with ``dim`` removed. All-zero spectra get rank 0 (not NaN).
    """
    sv = sv.clamp_min(0)
    total = sv.sum(dim, keepdim=True)
    p = sv / total.clamp_min(torch.finfo(sv.dtype).tiny)
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(sv.dtype).tiny)), 0.0)
    rank = torch.exp(-plogp.sum(dim))
    return torch.where(total.squeeze(dim) > 0, rank, torch.zeros_like(rank))


def participation_ratio(sv: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Participation ratio ``(Σσ)² / Σσ²`` of nonnegative singular values.

    ``sv``: singular values ``[..., k]``.
    ``dim``: the dimension holding the singular values.

    Returns ``sv`` with ``dim`` removed; all-zero spectra give 0.
    """
    sv = sv.clamp_min(0)
    s1 = sv.sum(dim)
    s2 = sv.square().sum(dim)
    return torch.where(s2 > 0, s1.square() / s2.clamp_min(torch.finfo(sv.dtype).tiny), 0.0)


def _eig_summary(
    eig: torch.Tensor, zero_rtol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort eigenvalues ``[B, e]`` by descending modulus; classify them.

    Returns ``(eig_sorted, nonzero [B, e], positive [B, e], share [B], max_real [B])``.
    ``max_real`` is the largest real part among nonzero eigenvalues (0 if there are none).
    """
    mag = eig.abs()
    order = torch.argsort(mag, dim=-1, descending=True, stable=True)
    eig = torch.gather(eig, -1, order)
    mag = torch.gather(mag, -1, order)
    scale = mag.amax(-1, keepdim=True) if mag.shape[-1] else mag.sum(-1, keepdim=True)
    tol = zero_rtol * scale
    nonzero = (mag > tol) & (scale > 0)
    positive = nonzero & (eig.real > tol)
    n_nz = nonzero.sum(-1)
    share = positive.sum(-1).to(mag.dtype) / n_nz.clamp_min(1).to(mag.dtype)
    real = torch.where(nonzero, eig.real, torch.full_like(eig.real, -math.inf))
    max_real = real.amax(-1) if real.shape[-1] else real.sum(-1)
    max_real = torch.where(n_nz > 0, max_real, torch.zeros_like(max_real))
    return eig, nonzero, positive, share, max_real


def _head_spectra(wq: torch.Tensor, wk: torch.Tensor, zero_rtol: float) -> dict[str, torch.Tensor]:
    """Factored spectra of a batch of heads.

    ``wq``: ``[batch, d_model, d_head]``.
    ``wk``: ``[batch, d_model, d_head]``.
    ``zero_rtol``: relative tolerance below which a singular value or eigenvalue is zero.

    Steps:
        1. ``A = [W_Q, W_K]``; ``A = Q [R₁, R₂]`` (QR, only the triangular factor is kept).
        2. core ``X = R₁ R₂ᵀ`` ``[k, k]``, ``k = min(2 d_head, d_model)``; ``M = Q X Qᵀ``.
        3. ``σ(R) = svdvals((X − Xᵀ)/2)``, ``σ(F) = |eigvalsh((X + Xᵀ)/2)|`` (sorted).
        4. ``‖M‖²_F = tr((W_QᵀW_Q)(W_KᵀW_K))``.
        5. eigenvalues of ``W_Kᵀ W_Q`` (``d_head ≤ d_model``) or of ``X`` (otherwise).
    """
    d_model, d_head = wq.shape[-2], wq.shape[-1]
    a = torch.cat([wq, wk], dim=-1)
    _, r = torch.linalg.qr(a, mode="r")  # [B, k, 2d]
    r1, r2 = r[..., :d_head], r[..., d_head:]
    x = r1 @ r2.mT  # [B, k, k]
    core_r = 0.5 * (x - x.mT)
    core_f = 0.5 * (x + x.mT)
    sv_r = torch.linalg.svdvals(core_r)
    # F's core is symmetric: its singular values are |eigenvalues| (eigvalsh is cheaper)
    sv_f = torch.linalg.eigvalsh(core_f).abs().sort(dim=-1, descending=True).values
    norm_r = core_r.square().sum((-2, -1))
    norm_f = core_f.square().sum((-2, -1))
    gq = wq.mT @ wq
    gk = wk.mT @ wk
    norm_m = (gq * gk).sum((-2, -1))  # tr(G_Q G_K), both symmetric
    p = wk.mT @ wq if d_head <= d_model else x
    eig = torch.linalg.eigvals(p)
    eig, nonzero, positive, share, max_real = _eig_summary(eig, zero_rtol)
    return {
        "sv_R": sv_r,
        "sv_F": sv_f,
        "norm_R_sq": norm_r,
        "norm_F_sq": norm_f,
        "norm_M_sq": norm_m,
        "eig": eig,
        "eig_nonzero": nonzero,
        "eig_positive": positive,
        "positive_share": share,
        "max_real_eig": max_real,
    }


# ----------------------------------------------------------------------------- rows


def _layer_summary(
    res: Any,
    means: dict[str, torch.Tensor],
    spreads: dict[str, torch.Tensor],
    extra: dict[str, list],
) -> dict[str, list]:
    out: dict[str, list] = {
        "layer": list(range(len(res.layer_names))),
        "layer_name": list(res.layer_names),
        "d_head": [int(d) for d in res.d_head],
    }
    out.update(extra)
    for name, t in means.items():
        out[f"mean_{name}"] = t.to(torch.float64).mean(1).tolist()
    for name, t in spreads.items():
        out[f"std_{name}"] = t.to(torch.float64).std(1, correction=0).tolist()
    return out


# ----------------------------------------------------------------------------- QK
@register_result
@dataclasses.dataclass
class QKGeometry(Result):
    """Routing/filtering geometry of every head's ``M = W_Q W_Kᵀ`` (SPEC B.1).

    Tensors are ``[layer, head, ...]``; where ``d_head`` differs across layers the last
    dimension is zero-padded to the largest layer's size and ``*_valid`` masks say which
    entries are real. Spectra are sorted in descending order (eigenvalues by modulus).

    Fields:
        d_model, d_head (per layer), n_heads, n_kv_heads, layer_names, zero_rtol.
        routing_capacity: ``[layer]`` int, ``min(2 d_head, d_model)``.
        norm_M_sq, norm_R_sq, norm_F_sq: ``[layer, head]`` squared Frobenius norms.
        routing_fraction, filtering_fraction: ``[layer, head]``; ``‖R‖²/‖M‖²``, ``‖F‖²/‖M‖²``.
        sv_R, sv_F: ``[layer, head, k_max]`` singular values of R and F (top ``k`` = all
            nonzero ones; ``k = routing_capacity``); ``sv_valid`` ``[layer, head, k_max]``.
        eff_rank_R, pr_R, rotation_planes, eff_rank_F, pr_F: ``[layer, head]``.
        eig_real, eig_imag: ``[layer, head, e_max]`` eigenvalues of M that can be nonzero
            (those of ``W_Kᵀ W_Q``; ``e = min(d_head, d_model)``); ``eig_valid`` pad mask;
            ``eig_nonzero`` (``|λ| > zero_rtol·max|λ|``) and ``eig_positive``
            (nonzero and ``Re λ > zero_rtol·max|λ|``).
        positive_share, max_real_eig, unstable: ``[layer, head]``.
        key_bias_norm, query_bias_norm: ``[layer, head]`` or None (see ``qk_geometry``).
    """

    kind: ClassVar[str] = "qk_geometry"
    main_plot: ClassVar[str | None] = "plot_budget"
    array_shapes = {
        "routing_capacity": "int[layer]", "norm_M_sq": "float[layer, head]",
        "norm_R_sq": "float[layer, head]", "norm_F_sq": "float[layer, head]",
        "routing_fraction": "float?[layer, head]", "filtering_fraction": "float?[layer, head]",
        "sv_R": "float[layer, head, k]", "sv_F": "float[layer, head, k]",
        "sv_valid": "bool[layer, head, k]", "eff_rank_R": "float?[layer, head]",
        "pr_R": "float?[layer, head]", "rotation_planes": "float?[layer, head]",
        "eff_rank_F": "float?[layer, head]", "pr_F": "float?[layer, head]",
        "eig_real": "float[layer, head, e]", "eig_imag": "float[layer, head, e]",
        "eig_valid": "bool[layer, head, e]", "eig_nonzero": "bool[layer, head, e]",
        "eig_positive": "bool[layer, head, e]", "positive_share": "float?[layer, head]",
        "max_real_eig": "float?[layer, head]", "unstable": "bool[layer, head]",
        "key_bias_norm": "float[layer, head]", "query_bias_norm": "float[layer, head]",
    }
    array_dims = {"layer": ("layer_names", "d_head"), "head": "n_heads"}

    d_model: int
    d_head: list
    n_heads: int
    n_kv_heads: int
    layer_names: list
    zero_rtol: float
    routing_capacity: torch.Tensor
    norm_M_sq: torch.Tensor
    norm_R_sq: torch.Tensor
    norm_F_sq: torch.Tensor
    routing_fraction: torch.Tensor
    filtering_fraction: torch.Tensor
    sv_R: torch.Tensor
    sv_F: torch.Tensor
    sv_valid: torch.Tensor
    eff_rank_R: torch.Tensor
    pr_R: torch.Tensor
    rotation_planes: torch.Tensor
    eff_rank_F: torch.Tensor
    pr_F: torch.Tensor
    eig_real: torch.Tensor
    eig_imag: torch.Tensor
    eig_valid: torch.Tensor
    eig_nonzero: torch.Tensor
    eig_positive: torch.Tensor
    positive_share: torch.Tensor
    max_real_eig: torch.Tensor
    unstable: torch.Tensor
    key_bias_norm: torch.Tensor | None = None
    query_bias_norm: torch.Tensor | None = None

    @property
    def n_layers(self) -> int:
        """The number of layers."""
        return len(self.layer_names)

    @property
    def eigenvalues(self) -> torch.Tensor:
        """Complex eigenvalues ``[layer, head, e_max]`` (padding entries are 0)."""
        return torch.complex(self.eig_real, self.eig_imag)

    def _columns(self) -> dict[str, torch.Tensor]:
        cap = self.routing_capacity[:, None].expand(-1, self.n_heads).to(torch.float64)
        cols = {
            "routing_fraction": self.routing_fraction,
            "filtering_fraction": self.filtering_fraction,
            "norm_M_sq": self.norm_M_sq,
            "eff_rank_R": self.eff_rank_R,
            "pr_R": self.pr_R,
            "rotation_planes": self.rotation_planes,
            "eff_rank_F": self.eff_rank_F,
            "pr_F": self.pr_F,
            "routing_capacity": cap,
            "n_nonzero_eig": self.eig_nonzero.sum(-1).to(torch.float64),
            "positive_share": self.positive_share,
            "max_real_eig": self.max_real_eig,
            "unstable": self.unstable,
        }
        if self.key_bias_norm is not None:
            cols["key_bias_norm"] = self.key_bias_norm
        if self.query_bias_norm is not None:
            cols["query_bias_norm"] = self.query_bias_norm
        return cols

    def to_dict(self) -> dict[str, list]:
        """Per-head table as columns: ``{column: [value per (layer, head) row]}``.

        Rows run over layers, then heads. Columns: layer, layer_name, head, d_head and the
        scalar fields (fractions, norms, ranks, eigenvalue statistics). Use ``to_rows`` for
        a list of row dicts (``pandas.DataFrame(g.to_dict())`` also works).
        """
        return per_head_table(self, self._columns())

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict[str, Any]]:
        """The per-head table as a list of ``{column: scalar}`` rows."""
        return table_rows(self.to_dict())

    def to_csv(self, path: str | Path) -> Path:
        """Write the per-head table (``to_dict``) as CSV; returns the path."""
        return write_csv(self.to_dict(), path)

    def headline(self) -> dict[str, list]:
        """Per-layer means (and spreads of the ranks) over heads, as columns."""
        return _layer_summary(
            self,
            means={
                "routing_fraction": self.routing_fraction,
                "eff_rank_R": self.eff_rank_R,
                "pr_R": self.pr_R,
                "rotation_planes": self.rotation_planes,
                "eff_rank_F": self.eff_rank_F,
                "positive_share": self.positive_share,
                "unstable": self.unstable,
            },
            spreads={"eff_rank_R": self.eff_rank_R, "routing_fraction": self.routing_fraction},
            extra={"routing_capacity": [int(c) for c in self.routing_capacity]},
        )

    # figures: drawn by the plotting leaf (viz/geometry_plots.py) through Result._draw
    def plot_budget(self, **kwargs: Any):
        """Routing fraction per layer (box + scatter over heads). Returns a Figure."""
        return self._draw("plot_budget", **kwargs)

    def plot_routing_rank(self, **kwargs: Any):
        """Routing effective rank vs layer (mean ± std over heads). Returns a Figure."""
        return self._draw("plot_routing_rank", **kwargs)

    def plot_eigenvalues(self, **kwargs: Any):
        """Nonzero eigenvalues of M in the complex plane, coloured by layer."""
        return self._draw("plot_eigenvalues", **kwargs)


def _bias_layers(
    b: Any, name: str, n_layers: int, n_heads: list[int], d_head: list[int], expect: str
) -> list[torch.Tensor]:
    layers = as_layers(b, name, 2, "head, d_head")
    if len(layers) != n_layers:
        raise ValueError(f"{name} has {len(layers)} layers but the weights have {n_layers}")
    for i, bl in enumerate(layers):
        if tuple(bl.shape) != (n_heads[i], d_head[i]):
            raise ValueError(
                f"{name}[{i}] has shape {tuple(bl.shape)}; expected [{expect}] = "
                f"{(n_heads[i], d_head[i])}"
            )
    return layers


def _is_factored(x: Any) -> bool:
    """A TransformerLens ``FactoredMatrix`` (``A @ B``), recognised without importing TL."""
    return type(x).__name__ == "FactoredMatrix" and hasattr(x, "A") and hasattr(x, "B")


def _factors_of(fm: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_Q ``[layer, head, d_model, d_head]``, W_K) of a QK ``FactoredMatrix`` ``A @ B`` with
    ``A = W_Q`` and ``B = W_Kᵀ`` (TransformerLens' ``model.QK``, ``[layer, head, ...]``,
    ``[head, ...]`` or one matrix)."""
    A, B = fm.A.detach(), fm.B.detach()
    wk = B.transpose(-1, -2)
    while A.ndim < 4:
        A, wk = A.unsqueeze(0), wk.unsqueeze(0)
    return A, wk


def qk_geometry(
    W_Q: Any,
    W_K: Any = None,
    *,
    b_Q: Any = None,
    b_K: Any = None,
    layer_names: Sequence[str] | None = None,
    zero_rtol: float = DEFAULT_ZERO_RTOL,
    dtype: torch.dtype = torch.float64,
) -> QKGeometry:
    """Routing/filtering geometry of each head's kernel ``M = W_Q W_Kᵀ`` from its factors.

    ``W_Q``: ``[layer, head, d_model, d_head]``, or a list with one ``[head, d_model, d_head_l]``
    tensor per layer (``d_head`` may then differ across layers). Or the kernel itself
    as a TransformerLens ``FactoredMatrix`` (``model.QK``: ``A = W_Q``, ``B = W_Kᵀ``;
    ``[layer, head, …]``, ``[head, …]`` or one head), with ``W_K`` left out.
    ``W_K``: ``[layer, kv_head, d_model, d_head]`` (or a per-layer list). Grouped-query
    attention: if ``kv_head < head`` each key head is repeated for its group of
    ``head // kv_head`` consecutive query heads (``repeat_interleave``, HF/Llama order).
    ``b_Q``: optional query bias ``[layer, head, d_head]`` (or list of ``[head, d_head]``).
    ``b_K``: optional key bias ``[layer, kv_head, d_head]``.
    *Choice*: the kernel geometry uses only the bilinear term ``x_i M x_jᵀ``; biases
    add linear terms that are reported separately: ``key_bias_norm = ‖W_K b_Qᵀ‖``
    (the key-dependent term ``b_Q W_Kᵀ x_jᵀ``, the only bias term that changes a
    softmax pattern) and ``query_bias_norm = ‖W_Q b_Kᵀ‖`` (the query-dependent term,
    constant along each softmax row, so pattern-invariant). A missing bias counts
    as zero; with no bias at all both fields are None.
    ``layer_names``: one name per layer (default ``"L0"``, ``"L1"``, …).
    ``zero_rtol``: an eigenvalue is nonzero iff ``|λ| > zero_rtol · max_k |λ_k|`` (per head);
    it counts as positive iff also ``Re λ > zero_rtol · max_k |λ_k|``.
    ``dtype``: computation dtype (float64 by default; the factored work is small).

    Returns :class:`QKGeometry`. A head with ``M = 0`` gets fractions 0 and 0 and ranks 0.

    Fold LayerNorm weights into ``W_Q``/``W_K`` first (TransformerLens' ``fold_ln``) for the
    geometry of the kernel the residual stream actually sees.
    """
    # Long on purpose: the checks of every input form (dense, factored, per-layer lists, GQA)
    # are the bulk; the work is one batched pass per d_head group below them.
    if _is_factored(W_Q):
        if W_K is not None:
            raise ValueError("qk_geometry got a FactoredMatrix for W_Q and also W_K; pass the "
                             "FactoredMatrix (model.QK) alone, or the two factors")
        W_Q, W_K = _factors_of(W_Q)
    elif W_K is None:
        raise ValueError("qk_geometry needs W_K (or pass a FactoredMatrix such as model.QK "
                         "as its only argument)")
    q_layers = as_layers(W_Q, "W_Q", 3, "head, d_model, d_head")
    k_layers = as_layers(W_K, "W_K", 3, "kv_head, d_model, d_head")
    if len(q_layers) != len(k_layers):
        raise ValueError(
            f"W_Q has {len(q_layers)} layers but W_K has {len(k_layers)}; pass the same layers"
        )
    n_layers = len(q_layers)
    names = resolve_layer_names(layer_names, n_layers)
    n_heads = q_layers[0].shape[0]
    n_kv = k_layers[0].shape[0]
    inputs = (
        f" [inputs: W_Q {tuple(W_Q.shape)}, W_K {tuple(W_K.shape)}]"
        if isinstance(W_Q, torch.Tensor) and isinstance(W_K, torch.Tensor)
        else ""
    )
    d_model = q_layers[0].shape[1]
    d_heads: list[int] = []
    wqs, wks = [], []
    for i, (wq, wk) in enumerate(zip(q_layers, k_layers)):
        if wq.shape[0] != n_heads or wk.shape[0] != n_kv:
            raise ValueError(
                f"layer {i}: W_Q has {wq.shape[0]} heads and W_K {wk.shape[0]}, but layer 0 has "
                f"{n_heads} and {n_kv}; every layer needs the same head counts" + inputs
            )
        if wq.shape[1] != d_model or wk.shape[1] != d_model:
            raise ValueError(
                f"layer {i}: W_Q {tuple(wq.shape)} and W_K {tuple(wk.shape)} must share "
                f"d_model = {d_model} (dim -2 of [head, d_model, d_head])" + inputs
            )
        if wq.shape[2] != wk.shape[2]:
            raise ValueError(
                f"layer {i}: W_Q {tuple(wq.shape)} and W_K {tuple(wk.shape)} have different "
                "d_head (last dim); pass query and key weights of the same head size" + inputs
            )
        if n_heads % wk.shape[0] != 0:
            raise ValueError(
                f"layer {i}: W_Q has {n_heads} heads, W_K {wk.shape[0]}: for grouped-query "
                "attention the query head count must be a multiple of the key head count; pass "
                f"W_K with a divisor of {n_heads} heads" + inputs
            )
        check_finite(wq, f"W_Q[{i}]")
        check_finite(wk, f"W_K[{i}]")
        group = n_heads // wk.shape[0]
        wk = wk.repeat_interleave(group, dim=0) if group > 1 else wk
        wqs.append(wq.to(dtype))
        wks.append(wk.to(dtype))
        d_heads.append(int(wq.shape[2]))

    # batch layers that share d_head
    per_layer: list[dict[str, torch.Tensor]] = [None] * n_layers  # type: ignore[list-item]
    for d in sorted(set(d_heads)):
        idx = [i for i, di in enumerate(d_heads) if di == d]

        def batch(ws: list[torch.Tensor], idx: list[int] = idx) -> torch.Tensor:
            return ws[idx[0]] if len(idx) == 1 else torch.cat([ws[i] for i in idx])

        out = _head_spectra(batch(wqs), batch(wks), zero_rtol)
        for j, i in enumerate(idx):
            per_layer[i] = {k: v[j * n_heads : (j + 1) * n_heads] for k, v in out.items()}

    caps = [min(2 * d, d_model) for d in d_heads]
    n_eigs = [min(d, d_model) for d in d_heads]
    k_max, e_max = max(caps), max(n_eigs)

    def stack(key: str) -> torch.Tensor:
        return torch.stack([p[key] for p in per_layer])

    sv_r = pad_stack([p["sv_R"] for p in per_layer], k_max)
    sv_f = pad_stack([p["sv_F"] for p in per_layer], k_max)
    sv_valid = torch.stack([(torch.arange(k_max) < c).expand(n_heads, -1) for c in caps])
    eig = pad_stack([p["eig"] for p in per_layer], e_max)
    eig_valid = torch.stack([(torch.arange(e_max) < e).expand(n_heads, -1) for e in n_eigs])
    eig_nonzero = pad_stack([p["eig_nonzero"] for p in per_layer], e_max, False)
    eig_positive = pad_stack([p["eig_positive"] for p in per_layer], e_max, False)

    norm_r, norm_f, norm_m = stack("norm_R_sq"), stack("norm_F_sq"), stack("norm_M_sq")
    total = norm_r + norm_f  # = ‖M‖²_F (orthogonal split); used so fractions sum to 1
    safe = total.clamp_min(torch.finfo(dtype).tiny)
    routing_fraction = torch.where(total > 0, norm_r / safe, 0.0)
    filtering_fraction = torch.where(total > 0, norm_f / safe, 0.0)
    eff_r = entropy_effective_rank(sv_r)
    positive_share = stack("positive_share")

    key_bias_norm = query_bias_norm = None
    if b_Q is not None or b_K is not None:
        kv_heads = [k.shape[0] for k in k_layers]
        bq = (
            _bias_layers(b_Q, "b_Q", n_layers, [n_heads] * n_layers, d_heads, "head, d_head")
            if b_Q is not None
            else [torch.zeros(n_heads, d, dtype=dtype) for d in d_heads]
        )
        bk = (
            _bias_layers(b_K, "b_K", n_layers, kv_heads, d_heads, "kv_head, d_head")
            if b_K is not None
            else [torch.zeros(h, d, dtype=dtype) for h, d in zip(kv_heads, d_heads)]
        )
        kb, qb = [], []
        for i in range(n_layers):
            check_finite(bq[i], f"b_Q[{i}]")
            check_finite(bk[i], f"b_K[{i}]")
            bqi = bq[i].to(dtype)
            bki = bk[i].to(dtype).repeat_interleave(n_heads // kv_heads[i], dim=0)
            kb.append(torch.linalg.vector_norm(wks[i] @ bqi[..., None], dim=(-2, -1)))
            qb.append(torch.linalg.vector_norm(wqs[i] @ bki[..., None], dim=(-2, -1)))
        key_bias_norm, query_bias_norm = torch.stack(kb), torch.stack(qb)

    return QKGeometry(
        d_model=int(d_model),
        d_head=d_heads,
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv),
        layer_names=names,
        zero_rtol=float(zero_rtol),
        routing_capacity=torch.tensor(caps, dtype=torch.int64),
        norm_M_sq=norm_m,
        norm_R_sq=norm_r,
        norm_F_sq=norm_f,
        routing_fraction=routing_fraction,
        filtering_fraction=filtering_fraction,
        sv_R=sv_r,
        sv_F=sv_f,
        sv_valid=sv_valid.contiguous(),
        eff_rank_R=eff_r,
        pr_R=participation_ratio(sv_r),
        rotation_planes=eff_r / 2,
        eff_rank_F=entropy_effective_rank(sv_f),
        pr_F=participation_ratio(sv_f),
        eig_real=eig.real.contiguous(),
        eig_imag=eig.imag.contiguous(),
        eig_valid=eig_valid.contiguous(),
        eig_nonzero=eig_nonzero,
        eig_positive=eig_positive,
        positive_share=positive_share,
        max_real_eig=stack("max_real_eig"),
        unstable=eig_positive.any(-1),
        key_bias_norm=key_bias_norm,
        query_bias_norm=query_bias_norm,
    )


# ----------------------------------------------------------------------------- S–D
@register_result
@dataclasses.dataclass
class SDGeometry(Result):
    """Geometry of S–D heads (SPEC B.2, B.3): routing rank of S and stability of S − D.

    Tensors are ``[layer, head, ...]``, the last dim zero-padded to the largest ``d_head``
    with ``valid`` ``[layer, head, d_max]`` marking real entries.

    Fields:
        d_head (per layer), n_heads, layer_names, zero_rtol.
        sv_S: ``[layer, head, d_max]`` singular values of S (descending; they come in pairs).
        eff_rank_S (entropy), pr_S (participation ratio), rotation_planes (= eff_rank_S / 2):
            ``[layer, head]`` — the spectral cascade.
        norm_S_sq, norm_D_sq, routing_fraction (``‖S‖²/(‖S‖²+‖D‖²)`` = ``‖S‖²/‖S−D‖²``):
            ``[layer, head]``.
        eig_real, eig_imag: ``[layer, head, d_max]`` eigenvalues of ``S − D`` (by modulus).
        max_real_eig: ``[layer, head]`` largest real part; ``stable``: ``[layer, head]``,
            ``max Re λ ≤ zero_rtol · max|λ|`` (true for every skew S and PSD D).
    """

    kind: ClassVar[str] = "sd_geometry"
    main_plot: ClassVar[str | None] = "plot_routing_rank"
    array_shapes = {
        "sv_S": "float[layer, head, d]", "valid": "bool[layer, head, d]",
        "eff_rank_S": "float?[layer, head]", "pr_S": "float?[layer, head]",
        "rotation_planes": "float?[layer, head]", "norm_S_sq": "float[layer, head]",
        "norm_D_sq": "float[layer, head]", "routing_fraction": "float?[layer, head]",
        "eig_real": "float[layer, head, d]", "eig_imag": "float[layer, head, d]",
        "max_real_eig": "float?[layer, head]", "stable": "bool[layer, head]",
    }
    array_dims = {"layer": ("layer_names", "d_head"), "head": "n_heads"}

    d_head: list
    n_heads: int
    layer_names: list
    zero_rtol: float
    sv_S: torch.Tensor
    valid: torch.Tensor
    eff_rank_S: torch.Tensor
    pr_S: torch.Tensor
    rotation_planes: torch.Tensor
    norm_S_sq: torch.Tensor
    norm_D_sq: torch.Tensor
    routing_fraction: torch.Tensor
    eig_real: torch.Tensor
    eig_imag: torch.Tensor
    max_real_eig: torch.Tensor
    stable: torch.Tensor

    @property
    def n_layers(self) -> int:
        """The number of layers."""
        return len(self.layer_names)

    @property
    def eigenvalues(self) -> torch.Tensor:
        """Complex eigenvalues of ``S − D`` ``[layer, head, d_max]`` (padding entries 0)."""
        return torch.complex(self.eig_real, self.eig_imag)

    @property
    def all_stable(self) -> bool:
        """True iff every head satisfies ``max Re λ(S − D) ≤ 0`` (within ``zero_rtol``)."""
        return bool(self.stable.all())

    def _columns(self) -> dict[str, torch.Tensor]:
        return {
            "eff_rank_S": self.eff_rank_S,
            "pr_S": self.pr_S,
            "rotation_planes": self.rotation_planes,
            "routing_fraction": self.routing_fraction,
            "norm_S_sq": self.norm_S_sq,
            "norm_D_sq": self.norm_D_sq,
            "max_real_eig": self.max_real_eig,
            "stable": self.stable,
        }

    def to_dict(self) -> dict[str, list]:
        """Per-head table as columns (rows over layers, then heads)."""
        return per_head_table(self, self._columns())

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict[str, Any]]:
        """The per-head table as a list of row dicts."""
        return table_rows(self.to_dict())

    def to_csv(self, path: str | Path) -> Path:
        """Write the per-head table as CSV; returns the path."""
        return write_csv(self.to_dict(), path)

    def headline(self) -> dict[str, list]:
        """Per-layer means and spreads over heads, as columns."""
        d_eff = [float(d) for d in self.d_head]
        return _layer_summary(
            self,
            means={
                "eff_rank_S": self.eff_rank_S,
                "pr_S": self.pr_S,
                "rotation_planes": self.rotation_planes,
                "routing_fraction": self.routing_fraction,
                "max_real_eig": self.max_real_eig,
                "stable": self.stable,
            },
            spreads={"eff_rank_S": self.eff_rank_S},
            extra={"routing_capacity": [int(d) for d in d_eff]},
        )

    def plot_budget(self, **kwargs: Any):
        """Routing fraction ``‖S‖²/‖S − D‖²`` per layer (box + scatter over heads)."""
        return self._draw("plot_budget", **kwargs)

    def plot_routing_rank(self, **kwargs: Any):
        """The spectral cascade: effective rank of S vs layer (mean ± std over heads)."""
        return self._draw("plot_routing_rank", **kwargs)

    def plot_eigenvalues(self, **kwargs: Any):
        """Eigenvalues of ``S − D`` in the complex plane, coloured by layer."""
        return self._draw("plot_eigenvalues", **kwargs)


def sd_geometry(
    S: Any,
    D: Any,
    *,
    layer_names: Sequence[str] | None = None,
    zero_rtol: float = DEFAULT_ZERO_RTOL,
    skew_rtol: float = 1e-5,
    dtype: torch.dtype = torch.float64,
) -> SDGeometry:
    """Routing rank of S and eigenvalues of ``S − D`` for S–D attention heads.

    ``S``: ``[layer, head, d_head, d_head]`` skew-symmetric routing matrices (or a list of
    per-layer ``[head, d_head_l, d_head_l]``). ``‖S + Sᵀ‖ ≤ skew_rtol·‖S‖`` is
    required; pass ``(S - S.mT) / 2`` to analyse only the skew part of a general matrix.
    ``D``: filtering, same shape as S (symmetric, e.g. ``diag(softplus(δ))``), or its
    diagonal ``[layer, head, d_head]``.
    ``layer_names``: one name per layer.
    ``zero_rtol``: relative tolerance of the stability check ``max Re λ ≤ zero_rtol·max|λ|``.
    ``skew_rtol``: relative tolerance of the skew (S) and symmetry (D) checks.
    ``dtype``: computation dtype.

    Returns :class:`SDGeometry`.
    """
    # Long on purpose: the checks of every input form (per-layer lists, a diagonal D,
    # shapes, skew / symmetry) inside the one per-layer loop of spectra, then the stacking.
    s_layers = as_layers(S, "S", 3, "head, d_head, d_head")
    d_raw = D
    if (
        isinstance(D, torch.Tensor)
        and D.ndim == 3
        or (isinstance(D, (list, tuple)) and len(D) and torch.as_tensor(D[0]).ndim == 2)
    ):
        d_layers = [
            torch.diag_embed(torch.as_tensor(d)) for d in as_layers(d_raw, "D", 2, "head, d_head")
        ]
    else:
        d_layers = as_layers(D, "D", 3, "head, d_head, d_head")
    if len(s_layers) != len(d_layers):
        raise ValueError(f"S has {len(s_layers)} layers but D has {len(d_layers)}")
    n_layers = len(s_layers)
    names = resolve_layer_names(layer_names, n_layers)
    n_heads = s_layers[0].shape[0]
    d_heads, per_layer = [], []
    for i, (s, d) in enumerate(zip(s_layers, d_layers)):
        if s.shape[0] != n_heads or s.shape[1] != s.shape[2] or tuple(d.shape) != tuple(s.shape):
            raise ValueError(
                f"layer {i}: S has shape {tuple(s.shape)} and D {tuple(d.shape)}; pass square "
                f"[head, d_head, d_head] matrices of equal shape with {n_heads} heads in every "
                "layer (D may also be its diagonal [head, d_head])"
            )
        check_finite(s, f"S[{i}]")
        check_finite(d, f"D[{i}]")
        s, d = s.to(dtype), d.to(dtype)
        for name, m, sign, what in (("S", s, 1.0, "skew-symmetric"), ("D", d, -1.0, "symmetric")):
            err = torch.linalg.matrix_norm(m + sign * m.mT).amax()
            ref = torch.linalg.matrix_norm(m).amax()
            if err > skew_rtol * ref:
                fix = "(S - S.mT) / 2" if name == "S" else "(D + D.mT) / 2"
                raise ValueError(
                    f"layer {i}: {name} is not {what} (relative error {float(err / ref):.2e} > "
                    f"skew_rtol={skew_rtol}); pass {fix} or check the parametrisation"
                )
        sv = torch.linalg.svdvals(s)
        eig = torch.linalg.eigvals(s - d)
        eig, _, _, _, _ = _eig_summary(eig, zero_rtol)
        mag = eig.abs().amax(-1)
        max_real = eig.real.amax(-1)
        ns, nd = s.square().sum((-2, -1)), d.square().sum((-2, -1))
        tot = ns + nd
        per_layer.append(
            {
                "sv": sv,
                "eig": eig,
                "max_real": max_real,
                "stable": max_real <= zero_rtol * mag,
                "ns": ns,
                "nd": nd,
                "frac": torch.where(tot > 0, ns / tot.clamp_min(torch.finfo(dtype).tiny), 0.0),
            }
        )
        d_heads.append(int(s.shape[-1]))
    d_max = max(d_heads)
    sv = pad_stack([p["sv"] for p in per_layer], d_max)
    eig = pad_stack([p["eig"] for p in per_layer], d_max)
    valid = torch.stack([(torch.arange(d_max) < d).expand(n_heads, -1) for d in d_heads])
    eff = entropy_effective_rank(sv)

    def stack(key: str) -> torch.Tensor:
        return torch.stack([p[key] for p in per_layer])

    return SDGeometry(
        d_head=d_heads,
        n_heads=int(n_heads),
        layer_names=names,
        zero_rtol=float(zero_rtol),
        sv_S=sv,
        valid=valid.contiguous(),
        eff_rank_S=eff,
        pr_S=participation_ratio(sv),
        rotation_planes=eff / 2,
        norm_S_sq=stack("ns"),
        norm_D_sq=stack("nd"),
        routing_fraction=stack("frac"),
        eig_real=eig.real.contiguous(),
        eig_imag=eig.imag.contiguous(),
        max_real_eig=stack("max_real"),
        stable=stack("stable"),
    )


def recover_sd_from_qk(
    W_Q: Any,
    W_K: Any,
    *,
    scale: float | torch.Tensor | Sequence[float] = 1.0,
    rtol: float = 1e-4,
    dtype: torch.dtype = torch.float64,
) -> tuple[Any, Any]:
    """Recover ``S`` and ``D`` from a converted S–D model (``W_Q = scale·W_P (S − D)``, ``W_K = W_P``).

    Steps: 1. ``L = pinv(W_K) W_Q / scale`` (least squares; the minimum-norm solution when
    ``W_P`` is rank-deficient, e.g. zero-padded heads). 2. ``S = (L − Lᵀ)/2``,
    ``D = −(L + Lᵀ)/2``. 3. Check ``‖W_K L·scale − W_Q‖ ≤ rtol·‖W_Q‖`` (else ``W_Q`` is not
    ``W_K`` times any square matrix: not a converted S–D model).

    ``W_Q``: ``[layer, head, d_model, d_head]`` tensor, or a per-layer list of
    ``[head, d_model, d_head_l]`` (same head count; no grouped-query).
    ``W_K``: the same shape as ``W_Q``.
    ``scale``: the factor the converter multiplied into ``W_Q`` (e.g. to keep the
    ``1/sqrt(d_head)`` score scale right after zero-padding); a float, or one value
    per layer.
    ``rtol``: relative residual above which a ``ValueError`` is raised.
    ``dtype``: computation dtype.

    Returns ``(S, D)``: ``[layer, head, d_head, d_head]`` tensors (lists if the inputs were
    lists), S skew-symmetric and D symmetric (diagonal for a true S–D model).
    """
    was_list = not isinstance(W_Q, torch.Tensor)
    q_layers = as_layers(W_Q, "W_Q", 3, "head, d_model, d_head")
    k_layers = as_layers(W_K, "W_K", 3, "head, d_model, d_head")
    if len(q_layers) != len(k_layers):
        raise ValueError(f"W_Q has {len(q_layers)} layers but W_K has {len(k_layers)}")
    scales = torch.as_tensor(scale, dtype=dtype).flatten()
    if scales.numel() == 1:
        scales = scales.expand(len(q_layers))
    if scales.numel() != len(q_layers):
        raise ValueError(
            f"scale has {scales.numel()} values for {len(q_layers)} layers; pass a float or "
            "one value per layer"
        )
    s_out, d_out = [], []
    for i, (wq, wk) in enumerate(zip(q_layers, k_layers)):
        if tuple(wq.shape) != tuple(wk.shape):
            raise ValueError(
                f"layer {i}: W_Q {tuple(wq.shape)} and W_K {tuple(wk.shape)} differ; a converted "
                "S–D layer has W_Q = W_P (S − D) and W_K = W_P of the same [head, d_model, d_head]"
            )
        check_finite(wq, f"W_Q[{i}]")
        check_finite(wk, f"W_K[{i}]")
        wq, wk = wq.to(dtype), wk.to(dtype)
        lmat = torch.linalg.pinv(wk) @ wq / scales[i]
        resid = torch.linalg.matrix_norm(wk @ lmat * scales[i] - wq)
        ref = torch.linalg.matrix_norm(wq).clamp_min(torch.finfo(dtype).tiny)
        worst = float((resid / ref).amax())
        if worst > rtol:
            raise ValueError(
                f"layer {i}: W_Q is not W_K @ (S − D) (relative residual {worst:.2e} > "
                f"rtol={rtol}); recover_sd_from_qk expects a model converted from S–D attention "
                "(W_Q = W_P (S − D), W_K = W_P)"
            )
        s_out.append(0.5 * (lmat - lmat.mT))
        d_out.append(-0.5 * (lmat + lmat.mT))
    if was_list:
        return s_out, d_out
    return torch.stack(s_out), torch.stack(d_out)
