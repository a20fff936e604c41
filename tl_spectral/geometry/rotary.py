"""Routing and filtering of rotary-position heads as functions of the offset (SPEC B.1 with RoPE).

With rotary positions the score between a query at position ``i`` and a key at ``j`` is
``score_ij = x_i W_Q R(j − i) W_Kᵀ x_jᵀ / sqrt(d_head)`` (bias terms aside), where the
*offset kernel* ``R(Δ)`` is block-diagonal in the rotary frequency pairs: pair ``f``
(coordinates ``(a_f, b_f)``, angular frequency ``θ_f``) carries the 2×2 block
``[[cos Δθ_f, −sin Δθ_f], [sin Δθ_f, cos Δθ_f]]`` and coordinates past ``rotary_dim`` pass
unchanged (partial rotary, GPT-NeoX / Pythia). The pairing is the model's own:

* ``"half"`` — GPT-NeoX / Llama / Qwen2 / Mistral / Gemma ``rotate_half``: ``(k, k + rotary_dim/2)``;
* ``"adjacent"`` — GPT-J and TransformerLens' native model (and this project's GPT family,
  :class:`~tl_spectral.models.attention.Rotary`): ``(2k, 2k + 1)``.

The kernel in the residual space at offset Δ is ``M(Δ) = W_Q R(Δ) W_Kᵀ``; its filtering and
routing parts ``F(Δ) = (M + Mᵀ)/2``, ``R_skew(Δ) = (M − Mᵀ)/2`` and the routing fraction
``ρ(Δ) = ‖R_skew(Δ)‖²_F / ‖M(Δ)‖²_F`` follow SPEC B.1 exactly; at Δ = 0 (``R = I``) every
number equals :func:`~tl_spectral.geometry.qk.qk_geometry`'s.

No ``d_model × d_model`` matrix is formed, for any Δ:

* **Energies** are trigonometric polynomials in Δ. Split the head coordinates into the
  rotary pairs and, for the pass-through coordinates, pairs with ``θ = 0`` (a zero column
  pads an odd count). Then ``M(Δ) = Σ_f Wq_f (g_f cos Δθ_f · I + g_f sin Δθ_f · J) Wk_fᵀ``
  with ``Wq_f = W_Q[:, pair f]`` ``[d_model, 2]``, ``J = [[0, −1], [1, 0]]`` and ``g_f`` the
  rotary attention scaling (1 unless the model scales cos/sin). With the coefficient vector
  ``u(Δ) = (g_f cos Δθ_f, g_f sin Δθ_f)_f`` ``[2P]``: ``‖M(Δ)‖² = uᵀ H u`` and
  ``tr(M(Δ)²) = uᵀ T u``, where ``H_(x f),(y g) = tr(X_xᵀ (Wq_fᵀWq_g) X_y (Wk_gᵀWk_f))`` and
  ``T_(x f),(y g) = tr(X_x (Wk_fᵀWq_g) X_y (Wk_gᵀWq_f))`` (``X_0 = I``, ``X_1 = J``) come once
  from the ``d_head × d_head`` Grams. ``‖F‖² = (uᵀHu + uᵀTu)/2``, ``‖R_skew‖² = (uᵀHu − uᵀTu)/2``.
  An average over an offset distribution ``w(Δ)`` is ``⟨H ± T, E_w[u uᵀ]⟩ / 2``: exact.
* **Spectra** (effective ranks) at an offset: with the QR factorisation
  ``[W_Q, W_K] = Q [R₁, R₂]`` (once per head), ``M(Δ) = Q (R₁ R(Δ) R₂ᵀ) Qᵀ``, so ``R_skew(Δ)``
  and ``F(Δ)`` have the singular values of the ``k × k`` cores (``k ≤ 2 d_head``), batched
  over offsets.

Public API: :class:`RotarySpec`, :func:`rotary_matrix`, :func:`offset_distribution`,
:func:`rotary_qk_geometry` → :class:`RotaryQKGeometry`; the model-level
:func:`~tl_spectral.geometry.model.model_rotary_geometry`. See ``docs/routing_filtering.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from tl_spectral._deprecation import deprecated_method
from tl_spectral.checks import check_int
from tl_spectral.geometry.common import (
    as_layers,
    check_finite,
    pad_stack,
    per_head_table,
    resolve_layer_names,
    write_csv,
)
from tl_spectral.geometry.qk import entropy_effective_rank, participation_ratio
from tl_spectral.results import Result, register_result

__all__ = [
    "PAIRINGS",
    "RotaryQKGeometry",
    "RotarySpec",
    "default_offsets",
    "offset_distribution",
    "rank_offset_sample",
    "rotary_matrix",
    "rotary_qk_geometry",
]

#: The pairings of rotary coordinates: ``"half"`` (rotate_half: ``(k, k + rotary_dim/2)``,
#: GPT-NeoX, Llama, Qwen2, Mistral, Gemma) and ``"adjacent"`` (``(2k, 2k + 1)``: GPT-J,
#: TransformerLens' native model, the tl_spectral GPT family).
PAIRINGS = ("half", "adjacent")
_DISTRIBUTIONS = ("causal", "uniform")


@dataclasses.dataclass(frozen=True)
class RotarySpec:
    """What a rotary embedding does to one head.

    Fields:
        inv_freq: ``[rotary_dim // 2]`` angular frequencies ``θ_f`` (radians per position),
            float64; ``rotary_dim = 2 · len(inv_freq)``.
        pairing: ``"half"`` or ``"adjacent"`` (:data:`PAIRINGS`).
        attention_scaling: the factor the model multiplies cos and sin by (Hugging Face
            ``rotary_emb.attention_scaling``; 1.0 for plain RoPE): rotary pairs of the
            kernel carry its square.
    """

    inv_freq: torch.Tensor
    pairing: str = "half"
    attention_scaling: float = 1.0

    def __post_init__(self) -> None:
        f = torch.as_tensor(self.inv_freq, dtype=torch.float64).detach().cpu().reshape(-1)
        if f.numel() < 1 or not torch.isfinite(f).all():
            raise ValueError("RotarySpec.inv_freq must be a non-empty finite 1-D tensor")
        object.__setattr__(self, "inv_freq", f)
        if self.pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        s = float(self.attention_scaling)
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"attention_scaling must be a positive number, got {s!r}")
        object.__setattr__(self, "attention_scaling", s)

    @classmethod
    def from_base(cls, rotary_dim: int, base: float = 10000.0, pairing: str = "half",
                  attention_scaling: float = 1.0) -> RotarySpec:
        """Plain RoPE: ``θ_f = base^(−2f / rotary_dim)``, computed like TransformerLens and
        Hugging Face do (float32 ``arange``), then held in float64."""
        check_int("rotary_dim", rotary_dim, minimum=2, even=True,
                  what="a positive even int")
        if not float(base) > 1:
            raise ValueError(f"rotary base must be > 1, got {base!r}")
        inv = 1.0 / (float(base) ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
        return cls(inv, pairing, attention_scaling)

    @property
    def rotary_dim(self) -> int:
        """The rotated dimensions of a head (twice the number of frequencies)."""
        return 2 * int(self.inv_freq.numel())

    def pairs(self, d_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pair decomposition of a ``d_head``-dimensional head.

        Returns ``(a, b, theta, gain)``, each ``[P]``, ``P = ceil(d_head / 2)``: pair ``f``
        rotates coordinates ``(a_f, b_f)`` at angular frequency ``theta_f`` (0 for
        pass-through pairs) with gain ``gain_f`` (``attention_scaling²`` on rotary pairs, 1
        otherwise). Index ``d_head`` stands for a zero padding coordinate (odd pass-through).
        """
        rd, h = self.rotary_dim, self.rotary_dim // 2
        if rd > d_head:
            raise ValueError(f"rotary_dim={rd} exceeds d_head={d_head}")
        k = torch.arange(h)
        if self.pairing == "half":
            a, b = k, k + h
        else:
            a, b = 2 * k, 2 * k + 1
        rest = torch.arange(rd, d_head)
        if rest.numel() % 2:
            rest = torch.cat([rest, torch.tensor([d_head])])
        a = torch.cat([a, rest[0::2]])
        b = torch.cat([b, rest[1::2]])
        n_pass = rest.numel() // 2
        theta = torch.cat([self.inv_freq, torch.zeros(n_pass, dtype=torch.float64)])
        gain = torch.cat([torch.full((h,), self.attention_scaling ** 2, dtype=torch.float64),
                          torch.ones(n_pass, dtype=torch.float64)])
        return a, b, theta, gain


def _offsets_tensor(offsets: Any, name: str = "offsets") -> torch.Tensor:
    t = torch.as_tensor(offsets)
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integer offsets Δ = j − i")
    if t.is_floating_point():
        if not torch.equal(t, t.round()):
            raise ValueError(f"{name} must be integers (Δ = j − i in positions), got {t.tolist()}")
    return t.to(torch.int64)


def rotary_matrix(spec: RotarySpec, d_head: int, delta: Any) -> torch.Tensor:
    """The offset kernel ``R(Δ)`` as dense matrices: ``[..., d_head, d_head]`` float64 for
    integer offsets ``delta`` (any shape). ``score_ij ∝ q_i R(j − i) k_jᵀ`` with q, k the
    un-rotated query and key (row vectors). For tests and small heads; the geometry never
    forms it densely per head pair."""
    d = torch.as_tensor(delta, dtype=torch.float64)
    a, b, theta, gain = spec.pairs(d_head)
    ang = d[..., None] * theta  # [..., P]
    c, s = gain * ang.cos(), gain * ang.sin()  # gain = scaling² (once on q, once on k)
    out = torch.zeros(*d.shape, d_head + 1, d_head + 1, dtype=torch.float64)
    out[..., a, a] = c
    out[..., b, b] = c
    out[..., a, b] = -s
    out[..., b, a] = s
    return out[..., :d_head, :d_head]


def default_offsets(n_ctx: int) -> torch.Tensor:
    """A log-spaced grid of causal offsets: ``Δ = 0, −1, −2, −4, …`` down to ``−(n_ctx − 1)``
    (int64, descending)."""
    if not isinstance(n_ctx, int) or n_ctx < 1:
        raise ValueError(f"n_ctx must be a positive int, got {n_ctx!r}")
    lags = {0, n_ctx - 1}
    k = 1
    while k < n_ctx:
        lags.add(k)
        k *= 2
    return -torch.tensor(sorted(lags), dtype=torch.int64)


def offset_distribution(distribution: Any = "causal", n_ctx: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The offsets ``Δ = j − i`` and their probabilities, ``([n] int64, [n] float64)``.

    distribution:
        ``"causal"`` — Δ of a uniformly drawn (query, key) pair with ``0 <= j <= i < n_ctx``:
        ``P(Δ) ∝ n_ctx − |Δ|`` on ``Δ ∈ {−(n_ctx − 1), …, 0}`` (every causal score of a full
        window counts once);
        ``"uniform"`` — uniform on ``{−(n_ctx − 1), …, 0}``;
        a mapping ``{Δ: weight}`` or a pair ``(offsets, weights)`` (nonnegative, normalised).
    """
    if isinstance(distribution, str):
        if distribution not in _DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {_DISTRIBUTIONS}, a {{offset: weight}} "
                             f"mapping or (offsets, weights); got {distribution!r}")
        check_int("n_ctx", n_ctx, minimum=1,
                  what=f"a positive int: distribution={distribution!r} needs n_ctx",
                  hint="the context length, e.g. n_ctx=1024")
        lag = torch.arange(n_ctx, dtype=torch.int64)
        w = (n_ctx - lag).to(torch.float64) if distribution == "causal" else \
            torch.ones(n_ctx, dtype=torch.float64)
        return -lag, w / w.sum()
    if isinstance(distribution, Mapping):
        offs, w = list(distribution.keys()), list(distribution.values())
    elif isinstance(distribution, (tuple, list)) and len(distribution) == 2:
        offs, w = distribution
    else:
        raise ValueError("distribution must be 'causal', 'uniform', a {offset: weight} mapping "
                         f"or (offsets, weights); got {type(distribution).__name__}")
    o = _offsets_tensor(offs, "distribution offsets")
    w = torch.as_tensor(w, dtype=torch.float64).reshape(-1)
    if w.shape != o.shape or not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("distribution weights must be finite, nonnegative, not all zero and "
                         "one per offset")
    return o, w / w.sum()


# ------------------------------------------------------------------------- the kernel math
_X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, -1.0], [1.0, 0.0]]], dtype=torch.float64)


def _pair_blocks(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """w: [B, d_model, d_head] -> [B, d_model, P, 2] (padding index d_head reads zeros)."""
    w = torch.nn.functional.pad(w, (0, 1))
    return torch.stack([w[..., a], w[..., b]], dim=-1)


def _energy_forms(wq: torch.Tensor, wk: torch.Tensor, a: torch.Tensor, b: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The quadratic forms ``H`` (‖M‖²) and ``T`` (tr M²), each ``[B, 2P, 2P]`` symmetric,
    index ``x·P + f`` (x = 0: the cos coefficient of pair f, x = 1: the sin coefficient)."""
    q, k = _pair_blocks(wq, a, b), _pair_blocks(wk, a, b)  # [B, dm, P, 2]
    gq = torch.einsum("bmfi,bmgj->bfigj", q, q)
    gk = torch.einsum("bmfi,bmgj->bfigj", k, k)
    c = torch.einsum("bmfi,bmgj->bfigj", k, q)  # C[f, ·, g, ·] = Wk_fᵀ Wq_g
    X = _X.to(wq.dtype)
    h = torch.einsum("xpq,bfpgr,yrs,bgsfq->bxfyg", X, gq, X, gk)
    t = torch.einsum("xpq,bfqgr,yrs,bgsfp->bxfyg", X, c, X, c)
    B, _, P = h.shape[:3]
    h, t = h.reshape(B, 2 * P, 2 * P), t.reshape(B, 2 * P, 2 * P)
    return 0.5 * (h + h.mT), 0.5 * (t + t.mT)


def _coefficients(offsets: torch.Tensor, theta: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """u(Δ) = (g cos Δθ, g sin Δθ): [n, 2P] float64."""
    ang = offsets.to(torch.float64)[:, None] * theta[None, :]
    return torch.cat([gain * ang.cos(), gain * ang.sin()], dim=-1)


def _rotate_columns(r1: torch.Tensor, offsets: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    theta: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """``R₁ R(Δ)`` for every offset: r1 [B, k, d] -> [B, n, k, d]."""
    d = r1.shape[-1]
    ang = offsets.to(torch.float64)[:, None] * theta[None, :]  # [n, P]
    c = (gain * ang.cos()).to(r1.dtype)[None, :, None, :]
    s = (gain * ang.sin()).to(r1.dtype)[None, :, None, :]
    r = torch.nn.functional.pad(r1, (0, 1))[:, None]  # [B, 1, k, d+1]
    ra, rb = r[..., a], r[..., b]  # [B, 1, k, P]
    out = r.expand(-1, offsets.numel(), -1, -1).clone()
    out[..., a] = c * ra + s * rb
    out[..., b] = -s * ra + c * rb
    return out[..., :d]


def _spectra(wq: torch.Tensor, wk: torch.Tensor, offsets: torch.Tensor, a, b, theta, gain,
             chunk: int = 64, values: bool = True) -> dict[str, torch.Tensor]:
    """Singular values of the skew / symmetric parts of M(Δ) for every head and offset:
    ``sv_R``, ``sv_F`` [B, n, k] (NaN without ``values``: only the norms are computed) and
    the squared norms ``norm_R_sq``, ``norm_F_sq`` [B, n]."""
    d_head = wq.shape[-1]
    _, r = torch.linalg.qr(torch.cat([wq, wk], dim=-1), mode="r")  # [B, k, 2d]
    r1, r2 = r[..., :d_head], r[..., d_head:]
    out: dict[str, list[torch.Tensor]] = {"sv_R": [], "sv_F": [], "norm_R_sq": [],
                                          "norm_F_sq": []}
    for s0 in range(0, offsets.numel(), chunk):
        off = offsets[s0:s0 + chunk]
        x = _rotate_columns(r1, off, a, b, theta, gain) @ r2[:, None].mT  # [B, n, k, k]
        core_r = 0.5 * (x - x.mT)
        core_f = 0.5 * (x + x.mT)
        if values:
            out["sv_R"].append(torch.linalg.svdvals(core_r))
            out["sv_F"].append(torch.linalg.eigvalsh(core_f).abs()
                               .sort(dim=-1, descending=True).values)
        else:
            out["sv_R"].append(torch.full(core_r.shape[:-1], math.nan, dtype=core_r.dtype))
            out["sv_F"].append(torch.full(core_f.shape[:-1], math.nan, dtype=core_f.dtype))
        out["norm_R_sq"].append(core_r.square().sum((-2, -1)))
        out["norm_F_sq"].append(core_f.square().sum((-2, -1)))
    return {k: torch.cat(v, dim=1) for k, v in out.items()}


#: The work ``rank_offsets="auto"`` spends on averaged ranks at most, in spectra of
#: ``128 × 128`` cores (about 5 ms each on one CPU core: ~10 s).
RANK_BUDGET = 2048
#: The fewest offsets ``rank_offsets="auto"`` samples when the exact average is too costly.
MIN_RANK_OFFSETS = 16


def _core_units(n_heads_total: int, k: int) -> float:
    """Cost of one offset's spectra for every head, in ``128 × 128`` core spectra (LAPACK's
    symmetric / singular-value solvers are cubic in the core size ``k``)."""
    return n_heads_total * (k / 128.0) ** 3


def rank_offset_sample(offsets: torch.Tensor, weights: torch.Tensor, n: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """An ``n``-point equal-mass quantile sample of an offset distribution: sort the support
    by offset, cut its cumulative probability into ``n`` strata of mass ``1/n`` and take the
    offset at each stratum's middle (``(s + ½)/n``), weighted ``1/n`` (offsets drawn more than
    once merge, their weights added). Returns ``(offsets [m], weights [m])``, ``m ≤ n``; the
    support itself when it has at most ``n`` offsets."""
    if n >= offsets.numel():
        return offsets, weights
    order = torch.argsort(offsets)
    o, w = offsets[order], weights[order].to(torch.float64)
    cum = torch.cumsum(w, 0)
    q = (torch.arange(n, dtype=torch.float64) + 0.5) / n * cum[-1]
    idx = torch.searchsorted(cum, q).clamp_(max=o.numel() - 1)
    uniq, counts = torch.unique(idx, return_counts=True)
    return o[uniq], counts.to(torch.float64) / n


def _rank_plan(rank_offsets: Any, d_off: torch.Tensor, d_w: torch.Tensor, units: float
               ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The offsets and weights of the averaged ranks, and whether the average is exact."""
    m = int(d_off.numel())
    if rank_offsets is None:
        return d_off, d_w, True
    if isinstance(rank_offsets, str):
        if rank_offsets != "auto":
            raise ValueError(f"rank_offsets must be 'auto', None (every offset: exact) or a "
                             f"positive int, got {rank_offsets!r}")
        if units * m <= RANK_BUDGET:
            return d_off, d_w, True
        n = max(MIN_RANK_OFFSETS, int(RANK_BUDGET // max(units, 1e-12)))
    else:
        n = check_int("rank_offsets", rank_offsets, minimum=1,
                      what="'auto', None (every offset: exact) or a positive int",
                      hint="e.g. rank_offsets='auto'")
    if n >= m:
        return d_off, d_w, True
    o, w = rank_offset_sample(d_off, d_w, n)
    return o, w, False


def _fraction(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 0.0)


# ------------------------------------------------------------------------- the result
@register_result
@dataclasses.dataclass
class RotaryQKGeometry(Result):
    """Offset-resolved routing/filtering geometry of rotary heads, ``M(Δ) = W_Q R(Δ) W_Kᵀ``.

    Tensors are ``[layer, head, ...]`` (key heads of grouped-query layers repeated to their
    query heads); spectra are zero-padded to the largest ``k = min(2 d_head, d_model)``.

    Fields:
        d_model, d_head (per layer), n_heads, n_kv_heads, layer_names, rotary_dim, pairing,
        inv_freq ``[rotary_dim/2]``, attention_scaling.
        offsets: ``[n]`` int64 offsets Δ = j − i (causal attention sees Δ <= 0) at which
            energies and spectra are reported.
        norm_M_sq, norm_R_sq, norm_F_sq, routing_fraction: ``[layer, head, n]``.
        sv_R, sv_F: ``[layer, head, n, k_max]``; eff_rank_R, pr_R, eff_rank_F, pr_F:
            ``[layer, head, n]`` (entropy effective rank and participation ratio, SPEC B.1).
        distribution: the offset distribution's name (``"causal"``, ``"uniform"`` or
            ``"custom"``); dist_offsets, dist_weights ``[m]``: its support and probabilities.
        mean_norm_M_sq, mean_norm_R_sq, mean_norm_F_sq: ``[layer, head]`` energies averaged
            over the distribution (exact, through the trigonometric form).
        mean_routing_fraction: ``[layer, head]``, ``E_w‖R_skew‖² / E_w‖M‖²`` (*choice*: the
            ratio of averaged energies, i.e. the routing share of the kernel's energy over
            the distribution; the mean of per-offset fractions is ``mean_fraction_of_offsets``).
        mean_fraction_of_offsets: ``[layer, head]``, ``E_w ρ(Δ)``.
        mean_eff_rank_R, mean_eff_rank_F: ``[layer, head]`` distribution means of the
            per-offset entropy effective ranks, or None when not computed (``average_ranks``).
        rank_offsets, rank_weights: ``[m]`` the offsets the rank means were averaged over and
            their weights (None when not computed); ``mean_eff_rank_exact``: True when they
            are the distribution's whole support and probabilities (the exact mean), False
            when they are the equal-mass quantile sample of ``rank_offsets=n`` (an estimate;
            see :func:`rotary_qk_geometry`).
        windows: per layer, the sliding window its averages were restricted to (``|Δ| <
            W``, the distribution renormalised there; None: full attention), or None when
            no windows were given.
        energy_H, energy_T: ``[layer, head, 2P, 2P]`` the quadratic forms with
            ``‖M(Δ)‖² = uᵀHu``, ``tr M(Δ)² = uᵀTu``; pair_theta, pair_gain ``[layer, P]``
            (see :meth:`energies`).
    """

    kind: ClassVar[str] = "rotary_qk_geometry"
    main_plot: ClassVar[str | None] = "plot_routing_vs_offset"
    array_shapes = {
        "inv_freq": "float[_]", "offsets": "int[offset]", "norm_M_sq": "float[layer, head, offset]",
        "norm_R_sq": "float[layer, head, offset]", "norm_F_sq": "float[layer, head, offset]",
        "routing_fraction": "float?[layer, head, offset]", "sv_R": "float[layer, head, offset, k]",
        "sv_F": "float[layer, head, offset, k]", "eff_rank_R": "float?[layer, head, offset]",
        "pr_R": "float?[layer, head, offset]", "eff_rank_F": "float?[layer, head, offset]",
        "pr_F": "float?[layer, head, offset]", "dist_offsets": "int[support]",
        "dist_weights": "float[support]", "mean_norm_M_sq": "float[layer, head]",
        "mean_norm_R_sq": "float[layer, head]", "mean_norm_F_sq": "float[layer, head]",
        "mean_routing_fraction": "float?[layer, head]",
        "mean_fraction_of_offsets": "float?[layer, head]", "energy_H": "float[layer, head, pp, pp]",
        "energy_T": "float[layer, head, pp, pp]", "pair_theta": "float[layer, pair]",
        "pair_gain": "float[layer, pair]", "mean_eff_rank_R": "float?[layer, head]",
        "mean_eff_rank_F": "float?[layer, head]", "rank_offsets": "int[rank_support]",
        "rank_weights": "float[rank_support]",
    }
    array_dims = {"layer": ("layer_names", "d_head"), "head": "n_heads"}

    d_model: int
    d_head: list
    n_heads: int
    n_kv_heads: int
    layer_names: list
    rotary_dim: int
    pairing: str
    inv_freq: torch.Tensor
    attention_scaling: float
    offsets: torch.Tensor
    norm_M_sq: torch.Tensor
    norm_R_sq: torch.Tensor
    norm_F_sq: torch.Tensor
    routing_fraction: torch.Tensor
    sv_R: torch.Tensor
    sv_F: torch.Tensor
    eff_rank_R: torch.Tensor
    pr_R: torch.Tensor
    eff_rank_F: torch.Tensor
    pr_F: torch.Tensor
    distribution: str
    dist_offsets: torch.Tensor
    dist_weights: torch.Tensor
    mean_norm_M_sq: torch.Tensor
    mean_norm_R_sq: torch.Tensor
    mean_norm_F_sq: torch.Tensor
    mean_routing_fraction: torch.Tensor
    mean_fraction_of_offsets: torch.Tensor
    energy_H: torch.Tensor
    energy_T: torch.Tensor
    pair_theta: torch.Tensor
    pair_gain: torch.Tensor
    mean_eff_rank_R: torch.Tensor | None = None
    mean_eff_rank_F: torch.Tensor | None = None
    rank_offsets: torch.Tensor | None = None
    rank_weights: torch.Tensor | None = None
    mean_eff_rank_exact: bool = True
    windows: list | None = None

    @property
    def n_layers(self) -> int:
        """The number of layers."""
        return len(self.layer_names)

    def energies(self, offsets: Any) -> dict[str, torch.Tensor]:
        """``norm_M_sq``, ``norm_R_sq``, ``norm_F_sq``, ``routing_fraction`` at any integer
        offsets ``[n]``, each ``[layer, head, n]``, from the stored trigonometric forms."""
        off = _offsets_tensor(offsets)
        m, t = [], []
        for i in range(self.n_layers):
            u = _coefficients(off, self.pair_theta[i], self.pair_gain[i])
            m.append(torch.einsum("na,hab,nb->hn", u, self.energy_H[i], u))
            t.append(torch.einsum("na,hab,nb->hn", u, self.energy_T[i], u))
        mm, tt = torch.stack(m), torch.stack(t)
        r, f = 0.5 * (mm - tt), 0.5 * (mm + tt)
        return {"norm_M_sq": mm, "norm_R_sq": r, "norm_F_sq": f,
                "routing_fraction": _fraction(r, r + f)}

    rows = deprecated_method("to_rows", "rows")

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per (layer, head, offset): layer, layer_name, head, offset and the
        per-offset energies, fraction and ranks."""
        rows = []
        for li, name in enumerate(self.layer_names):
            for h in range(self.n_heads):
                for n, off in enumerate(self.offsets.tolist()):
                    rows.append({
                        "layer": li, "layer_name": name, "head": h, "offset": int(off),
                        "routing_fraction": float(self.routing_fraction[li, h, n]),
                        "norm_M_sq": float(self.norm_M_sq[li, h, n]),
                        "eff_rank_R": float(self.eff_rank_R[li, h, n]),
                        "pr_R": float(self.pr_R[li, h, n]),
                        "eff_rank_F": float(self.eff_rank_F[li, h, n]),
                    })
        return rows

    def head_table(self) -> dict[str, list]:
        """Per-head distribution averages as columns (layer, layer_name, head, d_head, …):
        what the report writes as ``rotary_heads.csv``."""
        cols = {"mean_routing_fraction": self.mean_routing_fraction,
                "mean_fraction_of_offsets": self.mean_fraction_of_offsets,
                "mean_norm_M_sq": self.mean_norm_M_sq,
                "routing_fraction_at_0": self._at_zero()}
        if self.mean_eff_rank_R is not None:
            cols["mean_eff_rank_R"] = self.mean_eff_rank_R
            cols["mean_eff_rank_F"] = self.mean_eff_rank_F
        return per_head_table(self, cols)

    def _at_zero(self) -> torch.Tensor:
        return self.energies([0])["routing_fraction"][..., 0]

    def to_csv(self, path: Any):
        """Write the per-(layer, head, offset) table as CSV; returns the path."""
        rows = self.to_rows()
        return write_csv({k: [r[k] for r in rows] for k in rows[0]}, path)

    def headline(self) -> dict[str, list]:
        """Per-layer head means: routing fraction at Δ = 0 and averaged over the
        distribution, and its range over the reported offsets."""
        rf = self.routing_fraction.mean(1)  # [layer, n]
        out: dict[str, list] = {
            "layer_name": list(self.layer_names),
            "distribution": [self.distribution] * self.n_layers,
            "routing_fraction_at_0": self._at_zero().mean(1).tolist(),
            "mean_routing_fraction": self.mean_routing_fraction.mean(1).tolist(),
            "min_over_offsets": rf.min(-1).values.tolist(),
            "max_over_offsets": rf.max(-1).values.tolist(),
        }
        if self.mean_eff_rank_R is not None:
            out["mean_eff_rank_R"] = self.mean_eff_rank_R.mean(1).tolist()
        return out

    def plot_routing_vs_offset(self, *, ax: Any = None, lag: bool = True):
        """Head-mean routing fraction against the lag ``i − j = −Δ`` (log axis when ``lag``),
        one line per layer. Returns the Figure."""
        return self._draw("plot_routing_vs_offset", ax=ax, lag=lag)


# ------------------------------------------------------------------------- entry point
def _unless_nan(f: Any, sv: torch.Tensor) -> torch.Tensor:
    """``f(sv)`` (a rank of the spectra ``[..., k]``), NaN where the spectra were not
    computed (NaN: ``spectra=False``) rather than the 0 of an all-zero spectrum."""
    return torch.where(torch.isnan(sv).any(-1), math.nan, f(sv))


def _layer_specs(spec: Any, n_layers: int) -> list[RotarySpec]:
    """One :class:`RotarySpec` per layer from ``spec`` (one for all, or a sequence)."""
    specs = [spec] * n_layers if isinstance(spec, RotarySpec) else list(spec) \
        if isinstance(spec, (list, tuple)) else None
    if specs is None or not all(isinstance(s, RotarySpec) for s in specs):
        raise TypeError(f"spec must be a RotarySpec or a list of them (one per layer), got "
                        f"{type(spec).__name__}; build one with "
                        "RotarySpec.from_base(rotary_dim, base, pairing)")
    if len(specs) != n_layers:
        raise ValueError(f"{len(specs)} rotary specs for {n_layers} layers; pass one per layer")
    if len({(s.pairing, s.rotary_dim) for s in specs}) > 1:
        raise ValueError("the layers' rotary specs differ in pairing or rotary_dim; analyse "
                         "such layers apart")
    return specs


def rotary_qk_geometry(
    W_Q: Any,
    W_K: Any,
    spec: RotarySpec | Sequence[RotarySpec],
    *,
    offsets: Any = None,
    distribution: Any = "causal",
    n_ctx: int | None = None,
    average_ranks: bool = True,
    rank_offsets: int | str | None = "auto",
    layer_names: Sequence[str] | None = None,
    dtype: torch.dtype = torch.float64,
    progress: bool | None = None,
    windows: Sequence[int | None] | None = None,
    spectra: bool = True,
) -> RotaryQKGeometry:
    """Routing/filtering geometry of rotary heads as functions of the offset Δ = j − i.

    ``W_Q``: ``[layer, head, d_model, d_head]`` or a list of ``[head, d_model, d_head_l]``
    (un-rotated, normalization folded as for :func:`~tl_spectral.geometry.qk.qk_geometry`).
    ``W_K``: ``[layer, kv_head, d_model, d_head]`` (grouped-query: each key head serves
    ``head // kv_head`` consecutive query heads).
    ``spec``: the model's :class:`RotarySpec` (frequencies, pairing, scaling), or one per
    layer (e.g. Gemma 3's θ = 10⁴ local and 10⁶ global layers; same pairing and
    rotary_dim). Each layer's frequencies are in ``pair_theta``/``pair_gain``; the
    result's ``inv_freq``/``attention_scaling`` are the first layer's.
    ``offsets``: where energies and spectra are reported (``[n]`` ints); default
    :func:`default_offsets` of ``n_ctx`` (0, −1, −2, −4, …), or ``[0]`` if no n_ctx.
    ``distribution``: the offset distribution for the averages (:func:`offset_distribution`;
    ``"causal"`` by default, needs ``n_ctx``).
    ``n_ctx``: the context length for the named distributions and the default offsets.
    ``average_ranks``: also average the effective ranks over the distribution (two
    ``k × k`` spectra per head and averaged offset, ``k = min(2 d_head, d_model)``).
    ``rank_offsets``: which offsets the rank average uses. ``None``: every offset of the
    distribution's support (the exact mean; ``O(layers·heads·|support|·k³)``: ~18
    CPU-minutes for 12 × 12 heads of d_head 64 over a 2,048 causal window). An int
    ``n``: the equal-mass quantile sample of :func:`rank_offset_sample` (exact when
    the support has at most ``n`` offsets, else an estimate). ``"auto"`` (default):
    exact when that costs at most :data:`RANK_BUDGET` ``128 × 128`` core spectra
    (~10 s on one core: every small model, e.g. 48 heads of d_head 16 over 256
    positions), else the largest sample within it (at least
    :data:`MIN_RANK_OFFSETS`). The result records the offsets and weights used
    (``rank_offsets``, ``rank_weights``) and ``mean_eff_rank_exact``. Energies,
    fractions and their averages are exact whatever this says.
    ``layer_names``: default ``"L0"``, ``"L1"``, …
    ``dtype``: computation dtype (float64).
    ``progress``: a progress bar over the layers; default (None): shown on a terminal or in
    a notebook when the spectra are estimated to take more than a few seconds
    (:func:`tl_spectral.progress.progress_bar`).
    ``windows``: per layer, a causal sliding window ``W`` (None: full attention;
    :func:`~tl_spectral.model_view.layer_windows`). A windowed layer's averages use
    the distribution restricted to the offsets it attends to, ``|Δ| < W``, and
    renormalised (its ranks the same rank rule over that distribution); recorded in
    the result's ``windows``. ``dist_offsets``/``dist_weights``/``rank_offsets``
    are the unrestricted ones.
    ``spectra``: False leaves the singular values at ``offsets`` (``sv_R``, ``sv_F``) and
    their ranks and participation ratios NaN — two ``k × k`` decompositions per head and
    offset not run, for a caller that reads energies and fractions only (the report without
    ``--save-raw``); every other field is the same.

    Returns a :class:`RotaryQKGeometry`. At Δ = 0 the energies, fractions and spectra equal
    ``qk_geometry(W_Q, W_K)``'s (same cores, same operations).
    """
    # Long on purpose: one pass per layer that validates, forms the energy forms and the
    # spectra and (optionally) the averaged ranks; splitting it would thread ten arrays.
    q_layers = as_layers(W_Q, "W_Q", 3, "head, d_model, d_head")
    k_layers = as_layers(W_K, "W_K", 3, "kv_head, d_model, d_head")
    if len(q_layers) != len(k_layers):
        raise ValueError(f"W_Q has {len(q_layers)} layers but W_K has {len(k_layers)}")
    specs = _layer_specs(spec, len(q_layers))
    spec = specs[0]
    names = resolve_layer_names(layer_names, len(q_layers))
    n_heads, n_kv, d_model = q_layers[0].shape[0], k_layers[0].shape[0], q_layers[0].shape[1]
    if offsets is None:
        offsets = default_offsets(n_ctx) if n_ctx is not None else [0]
    off = _offsets_tensor(offsets)
    if isinstance(distribution, str):
        dist_name = distribution
    else:
        dist_name = "custom"
    d_off, d_w = offset_distribution(distribution, n_ctx)
    wins = [None] * len(q_layers) if windows is None else list(windows)
    if len(wins) != len(q_layers):
        raise ValueError(f"{len(wins)} windows for {len(q_layers)} layers; pass one per layer")
    k_core = max(min(2 * int(w.shape[2]), int(d_model)) for w in q_layers)
    units = _core_units(len(q_layers) * int(n_heads), k_core)
    r_off = r_w = None
    r_exact = True
    if average_ranks:
        r_off, r_w, r_exact = _rank_plan(rank_offsets, d_off, d_w, units)
    layer_dist = {}  # window -> (offsets, weights, rank offsets, rank weights)
    for win in {w for w in wins if w is not None}:
        keep = d_off.abs() < int(win)
        if not bool((d_w[keep] > 0).any()):
            raise ValueError(f"window {win}: the distribution has no weight on |Δ| < {win}")
        o_w, w_w = d_off[keep], d_w[keep] / d_w[keep].sum()
        ro, rw, ex = _rank_plan(rank_offsets, o_w, w_w, units) if average_ranks else \
            (None, None, True)
        r_exact = r_exact and ex
        layer_dist[win] = (o_w, w_w, ro, rw)
    n_spectra = off.numel() + (r_off.numel() if r_off is not None else 0)
    if progress is None and units * n_spectra * 5e-3 <= 3.0:  # ~5 ms per 128 × 128 core
        progress = False  # spectrum (both parts) on one core: a short run shows no bar
    layer_iter: Any = enumerate(zip(q_layers, k_layers))
    if progress is not False:
        from tl_spectral.progress import progress_bar

        layer_iter = progress_bar(layer_iter, total=len(q_layers), desc="rotary geometry",
                                  unit="layer", enabled=progress)

    per: list[dict[str, torch.Tensor]] = []
    d_heads: list[int] = []
    for i, (wq, wk) in layer_iter:
        if wq.shape[0] != n_heads or wk.shape[0] != n_kv or wq.shape[1] != d_model \
                or wk.shape[1] != d_model or wq.shape[2] != wk.shape[2]:
            raise ValueError(f"layer {i}: W_Q {tuple(wq.shape)} and W_K {tuple(wk.shape)} do "
                             f"not match layer 0's heads ({n_heads}, {n_kv}) and d_model "
                             f"{d_model}, or differ in d_head")
        if n_heads % n_kv:
            raise ValueError(f"W_Q has {n_heads} heads, W_K {n_kv}: the query head count must "
                             "be a multiple of the key head count")
        check_finite(wq, f"W_Q[{i}]")
        check_finite(wk, f"W_K[{i}]")
        d = int(wq.shape[2])
        a, b, theta, gain = specs[i].pairs(d)
        wq = wq.to(dtype)
        wk = wk.to(dtype).repeat_interleave(n_heads // n_kv, dim=0)
        H, T = _energy_forms(wq, wk, a, b)
        sp = _spectra(wq, wk, off, a, b, theta, gain, values=spectra)
        l_off, l_w, lr_off, lr_w = (d_off, d_w, r_off, r_w) if wins[i] is None \
            else layer_dist[wins[i]]
        u = _coefficients(l_off, theta, gain)  # [m, 2P]
        second = torch.einsum("m,ma,mb->ab", l_w, u, u)  # E_w[u uᵀ]
        mean_m = torch.einsum("hab,ab->h", H, second)
        mean_t = torch.einsum("hab,ab->h", T, second)
        m_curve = torch.einsum("ma,hab,mb->hm", u, H, u)
        t_curve = torch.einsum("ma,hab,mb->hm", u, T, u)
        rec = {"H": H, "T": T, "theta": theta, "gain": gain, **sp,
               "mean_M": mean_m, "mean_R": 0.5 * (mean_m - mean_t),
               "mean_F": 0.5 * (mean_m + mean_t),
               "mean_frac_off": (_fraction(0.5 * (m_curve - t_curve), m_curve) * l_w).sum(-1)}
        if lr_off is not None:
            ds = _spectra(wq, wk, lr_off, a, b, theta, gain)
            rec["mean_rank_R"] = (entropy_effective_rank(ds["sv_R"]) * lr_w).sum(-1)
            rec["mean_rank_F"] = (entropy_effective_rank(ds["sv_F"]) * lr_w).sum(-1)
        per.append(rec)
        d_heads.append(d)

    k_max = max(min(2 * d, d_model) for d in d_heads)
    p_max = max(p["theta"].numel() for p in per)

    def stack(key: str) -> torch.Tensor:
        return torch.stack([p[key] for p in per])

    def pad_form(key: str) -> torch.Tensor:  # [h, 2P, 2P] -> [h, 2p_max, 2p_max]
        outs = []
        for p in per:
            P = p["theta"].numel()
            f = p[key].reshape(-1, 2, P, 2, P)
            f = torch.nn.functional.pad(f, (0, p_max - P, 0, 0, 0, p_max - P))
            outs.append(f.reshape(-1, 2 * p_max, 2 * p_max))
        return torch.stack(outs)

    sv_r = pad_stack([p["sv_R"] for p in per], k_max)
    sv_f = pad_stack([p["sv_F"] for p in per], k_max)
    norm_r, norm_f = stack("norm_R_sq"), stack("norm_F_sq")
    total = norm_r + norm_f
    mean_r, mean_f = stack("mean_R"), stack("mean_F")
    return RotaryQKGeometry(
        d_model=int(d_model), d_head=d_heads, n_heads=int(n_heads), n_kv_heads=int(n_kv),
        layer_names=names, rotary_dim=spec.rotary_dim, pairing=spec.pairing,
        inv_freq=spec.inv_freq.clone(), attention_scaling=spec.attention_scaling,
        offsets=off, norm_M_sq=total, norm_R_sq=norm_r, norm_F_sq=norm_f,
        routing_fraction=_fraction(norm_r, total), sv_R=sv_r, sv_F=sv_f,
        eff_rank_R=_unless_nan(entropy_effective_rank, sv_r), pr_R=_unless_nan(
            participation_ratio, sv_r), eff_rank_F=_unless_nan(entropy_effective_rank, sv_f),
        pr_F=_unless_nan(participation_ratio, sv_f),
        distribution=dist_name, dist_offsets=d_off, dist_weights=d_w,
        mean_norm_M_sq=mean_r + mean_f, mean_norm_R_sq=mean_r, mean_norm_F_sq=mean_f,
        mean_routing_fraction=_fraction(mean_r, mean_r + mean_f),
        mean_fraction_of_offsets=stack("mean_frac_off"),
        energy_H=pad_form("H"), energy_T=pad_form("T"),
        pair_theta=torch.stack([torch.nn.functional.pad(p["theta"], (0, p_max - p["theta"].numel()))
                                for p in per]),
        pair_gain=torch.stack([torch.nn.functional.pad(p["gain"], (0, p_max - p["gain"].numel()))
                               for p in per]),
        mean_eff_rank_R=stack("mean_rank_R") if average_ranks else None,
        mean_eff_rank_F=stack("mean_rank_F") if average_ranks else None,
        rank_offsets=None if r_off is None else r_off.clone(),  # own storage (safetensors)
        rank_weights=None if r_w is None else r_w.clone(), mean_eff_rank_exact=bool(r_exact),
        windows=None if windows is None else [None if w is None else int(w) for w in wins],
    )
