"""Attention kinds of the tl_spectral GPT family, selected by name from a registry.

Every kind is an ``nn.Module`` built as ``cls(d_model, n_heads, d_head, n_ctx, **options)``
with ``forward(x, *, return_pattern=False)``:

- ``x``: ``[batch, pos, d_model]`` (``pos <= n_ctx``), causal self-attention;
- returns ``[batch, pos, d_model]``, or ``(out, pattern)`` with ``pattern``
  ``[batch, head, query, key]`` (rows sum to 1 over keys) when ``return_pattern=True``.

Kinds:

- ``"softmax"``: standard causal multi-head attention. In training mode it uses
  ``torch.nn.functional.scaled_dot_product_attention`` (fast); in eval mode, or with
  ``return_pattern=True``, the explicit path (scores, mask, softmax, pattern @ v), which is
  the arithmetic TransformerLens performs, so converted models agree to float32 round-off
  of the same operations rather than of two different kernels.
- ``"sd"``: S–D attention (SPEC B.2): per head ``p = x W_P + b_P`` and
  ``score_ij = p_i (S − D) p_jᵀ / sqrt(d_head)`` with ``S = Aᵀ − A`` (skew-symmetric) and
  ``D = diag(softplus(δ))``; variants ``filtering = "diag" | "scalar" | "none"`` and
  ``routing = "skew" | "none"``.
- ``"linear"``: causal ELU+1 linear attention (SPEC B.5) on the same q/k/v/o parameters as
  ``"softmax"`` (so a softmax layer's state dict loads into it unchanged):
  ``α_ij ∝ φ(q_i)·φ(k_j)`` over ``j <= i`` with ``φ(x) = elu(x) + 1``.

Rotary positions (RoPE, a GPT built with ``positional="rotary"``): ``"softmax"`` and ``"sd"``
accept a keyword ``rotary=`` :class:`Rotary` module that rotates the query and the key of every
head after their projections (for ``"sd"``: after the ``S − D`` kernel, see
:class:`SDAttention`); ``"linear"`` refuses it.

Register a new kind with :func:`register_attention`; its constructor must accept the four
positional arguments above and keyword options only (plus ``rotary=`` if it supports rotary
positions; :func:`make_attention` passes ``rotary`` only when it is not None).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_KINDS: dict[str, type[nn.Module]] = {}


def register_attention(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: register an attention kind under ``name``."""

    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        if name in ATTENTION_KINDS:
            raise ValueError(f"attention kind {name!r} is already registered")
        cls.kind = name  # type: ignore[attr-defined]
        ATTENTION_KINDS[name] = cls
        return cls

    return deco


def make_attention(
    kind: str, d_model: int, n_heads: int, d_head: int, n_ctx: int, *,
    rotary: Rotary | None = None, **options
) -> nn.Module:
    """Build an attention module of the registered ``kind`` (with rotary positions when
    ``rotary`` is a :class:`Rotary`)."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(
            f"unknown attention kind {kind!r}; known kinds: {sorted(ATTENTION_KINDS)}"
        )
    if rotary is not None:
        options["rotary"] = rotary
    return ATTENTION_KINDS[kind](d_model, n_heads, d_head, n_ctx, **options)


def rotary_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """The RoPE angular frequencies ``θ_k = base^(−2k / rotary_dim)``, k < rotary_dim/2:
    ``[rotary_dim // 2]`` float32, computed exactly as TransformerLens' native model does."""
    return 1.0 / (float(base) ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))


class Rotary(nn.Module):
    """Rotary position embedding (RoPE) with *adjacent* pairing, TransformerLens' native
    convention: coordinates ``(2k, 2k+1)``, ``k < rotary_dim/2``, of a query or key at
    position ``t`` rotate together by the angle ``t·θ_k`` (:func:`rotary_inv_freq`):
    ``(a, b) -> (a cos − b sin, a sin + b cos)``; coordinates ``>= rotary_dim`` pass
    unchanged (partial rotary). Then ``rot(q_i)·rot(k_j) = q_i R(j − i) k_jᵀ`` with the
    offset kernel of :func:`tl_spectral.geometry.rotary.rotary_matrix`.

    The cos/sin tables ``[n_ctx, rotary_dim]`` are non-persistent buffers (never saved).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, rotary_dim: int, n_ctx: int, base: float = 10000.0):
        super().__init__()
        if not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even int, got {rotary_dim!r}")
        if not (isinstance(base, (int, float)) and base > 1):
            raise ValueError(f"rotary base must be a number > 1, got {base!r}")
        self.rotary_dim, self.n_ctx, self.base = rotary_dim, n_ctx, float(base)
        freqs = torch.outer(torch.arange(n_ctx).float(), rotary_inv_freq(rotary_dim, base))
        self.register_buffer("cos", freqs.cos().repeat_interleave(2, dim=-1), persistent=False)
        self.register_buffer("sin", freqs.sin().repeat_interleave(2, dim=-1), persistent=False)

    @staticmethod
    def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
        """(x_{2k}, x_{2k+1}) -> (−x_{2k+1}, x_{2k})."""
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[..., pos, d]`` (``d >= rotary_dim``, positions 0..pos−1) -> same shape."""
        p, rd = x.shape[-2], self.rotary_dim
        if x.shape[-1] < rd:
            raise ValueError(f"rotary_dim={rd} exceeds the head dimension {x.shape[-1]}")
        cos, sin = self.cos[:p].to(x.dtype), self.sin[:p].to(x.dtype)
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        x_rot = x_rot * cos + self._rotate_pairs(x_rot) * sin
        return torch.cat([x_rot, x_pass], dim=-1) if x_pass.shape[-1] else x_rot

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, n_ctx={self.n_ctx}, base={self.base}"


def _check_rotary(rotary: Rotary | None, d_head: int, n_ctx: int) -> None:
    if rotary is None:
        return
    if not isinstance(rotary, Rotary):
        raise TypeError(f"rotary must be a Rotary module or None, got {type(rotary).__name__}")
    if rotary.rotary_dim > d_head or rotary.n_ctx < n_ctx:
        raise ValueError(f"Rotary(rotary_dim={rotary.rotary_dim}, n_ctx={rotary.n_ctx}) does "
                         f"not fit heads of d_head={d_head} over n_ctx={n_ctx}")


def _check_dims(d_model: int, n_heads: int, d_head: int, n_ctx: int) -> None:
    for name, v in (("d_model", d_model), ("n_heads", n_heads), ("d_head", d_head),
                    ("n_ctx", n_ctx)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _causal_mask(n: int, device: torch.device) -> torch.Tensor:
    """``[n, n]`` bool, True above the diagonal (the future keys a query must not see)."""
    return torch.triu(torch.ones(n, n, dtype=torch.bool, device=device), diagonal=1)


def _check_input(x: torch.Tensor, d_model: int, n_ctx: int) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"attention input must be [batch, pos, d_model={d_model}], got {tuple(x.shape)}"
        )
    if x.shape[1] > n_ctx:
        raise ValueError(f"sequence length {x.shape[1]} exceeds n_ctx={n_ctx}")


class _QKVAttention(nn.Module):
    """Shared parameters of softmax and linear attention.

    ``qkv``: Linear(d_model -> 3·n_heads·d_head), columns ordered [q | k | v], each block
    head-major (``[head, d_head]``); ``out``: Linear(n_heads·d_head -> d_model).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, n_ctx: int,
                 rotary: Rotary | None = None):
        super().__init__()
        _check_dims(d_model, n_heads, d_head, n_ctx)
        _check_rotary(rotary, d_head, n_ctx)
        self.d_model, self.n_heads, self.d_head, self.n_ctx = d_model, n_heads, d_head, n_ctx
        self.rotary = rotary
        self.qkv = nn.Linear(d_model, 3 * n_heads * d_head, bias=True)
        self.out = nn.Linear(n_heads * d_head, d_model, bias=True)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [b, p, d_model] -> q, k, v each [b, head, p, d_head] (q, k rotated when the
        layer has rotary positions)."""
        b, p, _ = x.shape
        qkv = self.qkv(x).view(b, p, 3, self.n_heads, self.d_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k, v

    def _merge(self, z: torch.Tensor) -> torch.Tensor:
        """z: [b, head, p, d_head] -> [b, p, d_model] through W_O."""
        b, h, p, d = z.shape
        return self.out(z.transpose(1, 2).reshape(b, p, h * d))

    # TransformerLens-style per-head views (copies), used by the converter and analyses.
    def weights(self) -> dict[str, torch.Tensor]:
        """W_Q, W_K, W_V: [head, d_model, d_head]; b_Q, b_K, b_V: [head, d_head];
        W_O: [head, d_head, d_model]; b_O: [d_model]."""
        h, d, dm = self.n_heads, self.d_head, self.d_model
        w = self.qkv.weight.detach().view(3, h, d, dm).transpose(-1, -2)
        b = self.qkv.bias.detach().view(3, h, d)
        w_o = self.out.weight.detach().view(dm, h, d).permute(1, 2, 0)
        return {"W_Q": w[0], "W_K": w[1], "W_V": w[2], "b_Q": b[0], "b_K": b[1],
                "b_V": b[2], "W_O": w_o, "b_O": self.out.bias.detach()}


@register_attention("softmax")
class SoftmaxAttention(_QKVAttention):
    """Standard causal softmax attention, scale ``1/sqrt(d_head)``. No options (``rotary``:
    an optional :class:`Rotary` applied to q and k)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, n_ctx: int, *,
                 rotary: Rotary | None = None, **options):
        if options:
            raise ValueError(f"softmax attention takes no options, got {sorted(options)}")
        super().__init__(d_model, n_heads, d_head, n_ctx, rotary)

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        """x: [batch, pos, d_model] -> [batch, pos, d_model] (and pattern [b, head, q, k])."""
        _check_input(x, self.d_model, self.n_ctx)
        q, k, v = self._split(x)
        if self.training and not return_pattern:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self._merge(z)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        scores = scores.masked_fill(_causal_mask(x.shape[1], x.device), float("-inf"))
        pattern = scores.softmax(dim=-1)
        out = self._merge(pattern @ v)
        return (out, pattern) if return_pattern else out


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``φ(x) = elu(x) + 1`` (positive everywhere), elementwise."""
    return F.elu(x).add_(1.0)  # elu's backward reads its input, so the in-place add is safe


def linear_attention_pattern(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True
                             ) -> torch.Tensor:
    """The attention pattern of ELU+1 linear attention, ``α_ij ∝ φ(q_i)·φ(k_j)``.

    q, k: ``[..., pos, d]`` (e.g. ``[batch, head, pos, d_head]``) -> ``[..., query, key]``,
    rows summing to 1 over ``j <= i`` (``causal``) or over every ``j``. O(pos²) memory:
    the analysis view of :func:`causal_linear_attention`.
    """
    w = elu_feature_map(q) @ elu_feature_map(k).transpose(-1, -2)
    if causal:
        w = w.masked_fill(_causal_mask(q.shape[-2], q.device), 0.0)
    return w / w.sum(dim=-1, keepdim=True)


def _exclusive_prefix(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``Σ_{m < n} x[..., m, ...]`` along ``dim`` (an exclusive prefix sum over chunks).

    For up to :data:`_PREFIX_MATMUL_MAX` chunks it is one product with the strictly lower
    triangular ``[n, n]`` matrix of ones (a BLAS call, several times faster on CPU than a
    ``cumsum`` along a non-innermost dimension); beyond that an inclusive ``cumsum`` minus
    the chunk itself, which keeps the cost linear in the number of chunks.
    """
    n = x.shape[dim]
    if n > _PREFIX_MATMUL_MAX:
        return x.cumsum(dim=dim) - x
    dim = dim % x.dim()
    lead, rest = x.shape[:dim].numel(), x.shape[dim + 1:].numel()
    lower = torch.ones(n, n, dtype=x.dtype, device=x.device).tril_(-1)
    out = lower @ x.reshape(lead, n, rest)  # out[b, n', r] = Σ_{m < n'} x[b, m, r]
    return out.reshape(x.shape)


_PREFIX_MATMUL_MAX = 128


def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                            chunk_size: int = 64) -> torch.Tensor:
    """Causal ELU+1 linear attention in O(pos) memory (SPEC B.5), chunked prefix sums.

    ``o_i = Σ_{j<=i} (φ(q_i)·φ(k_j)) v_j / Σ_{j<=i} φ(q_i)·φ(k_j)``.

    q, k: ``[..., pos, d]``; v: ``[..., pos, d_v]`` -> ``[..., pos, d_v]``.

    Steps: 1. φ(q), φ(k); pad pos to a multiple of ``chunk_size`` C (padded keys have
    φ(k) = 0, so they add nothing; padded queries φ(q) = 1, so no 0/0 reaches the
    gradient) and split into n = pos/C chunks.
    2. within each chunk, the masked C×C product (quadratic in C only).
    3. across chunks, the states ``Σ_{j in earlier chunks} φ(k_j) v_jᵀ`` ``[d, d_v]`` and
    ``Σ φ(k_j)`` ``[d]`` by an exclusive prefix sum over chunks (:func:`_exclusive_prefix`).
    Memory O(pos·(C + d·d_v / C)); time O(pos·C·d + pos·d·d_v) (plus, for at most
    128 chunks, the ``n²·d·d_v`` triangular product that replaces the scan).
    """
    if q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"q, k must be [..., pos, d] of equal shape and v [..., pos, d_v]; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    *lead, p, d = q.shape
    dv = v.shape[-1]
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    c = min(chunk_size, p)
    n = -(-p // c)
    pad = n * c - p
    if pad:
        fq = F.pad(fq, (0, 0, 0, pad), value=1.0)  # padded queries: a positive denominator
        fk = F.pad(fk, (0, 0, 0, pad))  # φ(k) = 0 on padded keys: no contribution
        v = F.pad(v, (0, 0, 0, pad))
    fq = fq.reshape(*lead, n, c, d)
    fk = fk.reshape(*lead, n, c, d)
    v = v.reshape(*lead, n, c, dv)
    w = (fq @ fk.transpose(-1, -2)).tril_()            # [..., n, C, C], j <= i in the chunk
    kv_prev = _exclusive_prefix(fk.transpose(-1, -2) @ v, dim=-3)  # [..., n, d, d_v]
    ks_prev = _exclusive_prefix(fk.sum(-2), dim=-2)    # [..., n, d]
    num = (w @ v).add_(fq @ kv_prev)                   # [..., n, C, d_v]
    den = w.sum(-1).add_((fq @ ks_prev.unsqueeze(-1)).squeeze(-1))  # [..., n, C]
    out = (num / den.unsqueeze(-1)).reshape(*lead, n * c, dv)
    return out[..., :p, :] if pad else out


@register_attention("linear")
class LinearAttention(_QKVAttention):
    """Causal ELU+1 linear attention (SPEC B.5), same parameters as ``"softmax"``.

    ``o_i = Σ_{j<=i} (φ(q_i)·φ(k_j)) v_j / Σ_{j<=i} φ(q_i)·φ(k_j)``, ``φ = elu + 1``, then W_O.
    The forward pass is O(pos) in memory (:func:`causal_linear_attention`, chunks of
    ``chunk_size`` positions); ``return_pattern=True`` takes the explicit ``[query, key]``
    pattern path (:func:`linear_attention_pattern`, O(pos²)) and returns the same output.
    """

    chunk_size: int = 64

    def __init__(self, d_model: int, n_heads: int, d_head: int, n_ctx: int, *,
                 rotary: Rotary | None = None, **options):
        if options:
            raise ValueError(f"linear attention takes no options, got {sorted(options)}")
        if rotary is not None:
            raise ValueError("linear attention does not support rotary positions; use "
                             "'softmax' or 'sd' layers in a positional='rotary' model")
        super().__init__(d_model, n_heads, d_head, n_ctx)

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        """x: [batch, pos, d_model] -> [batch, pos, d_model] (and pattern [b, head, q, k])."""
        _check_input(x, self.d_model, self.n_ctx)
        q, k, v = self._split(x)
        if not return_pattern:
            return self._merge(causal_linear_attention(q, k, v, chunk_size=self.chunk_size))
        pattern = linear_attention_pattern(q, k)
        return self._merge(pattern @ v), pattern


_FILTERING = ("diag", "scalar", "none")
_ROUTING = ("skew", "none")


@register_attention("sd")
class SDAttention(nn.Module):
    """S–D attention (SPEC B.2).

    Parameters: ``proj`` (W_P, b_P: Linear d_model -> n_heads·d_head, head-major),
    ``v`` (W_V, b_V), ``out`` (W_O, b_O), ``A`` ``[head, d_head, d_head]`` (routing
    ``"skew"``), ``delta`` ``[head, d_head]`` (filtering ``"diag"``) or ``[head, 1]``
    (``"scalar"``, D = softplus(δ)·I).

    Options: ``filtering`` ("diag" | "scalar" | "none"), ``routing`` ("skew" | "none"),
    ``a_init_std`` (std of A's entries, default ``1/sqrt(d_head)``), ``delta_init``
    (initial δ, default 0.0 so D starts at softplus(0)·I = 0.693·I).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        n_ctx: int,
        *,
        filtering: str = "diag",
        routing: str = "skew",
        a_init_std: float | None = None,
        delta_init: float = 0.0,
        rotary: Rotary | None = None,
    ):
        super().__init__()
        _check_dims(d_model, n_heads, d_head, n_ctx)
        _check_rotary(rotary, d_head, n_ctx)
        self.rotary = rotary
        if filtering not in _FILTERING:
            raise ValueError(f"filtering must be one of {_FILTERING}, got {filtering!r}")
        if routing not in _ROUTING:
            raise ValueError(f"routing must be one of {_ROUTING}, got {routing!r}")
        if filtering == "none" and routing == "none":
            raise ValueError(
                "filtering='none' with routing='none' makes every score zero; keep at least one"
            )
        self.d_model, self.n_heads, self.d_head, self.n_ctx = d_model, n_heads, d_head, n_ctx
        self.filtering, self.routing = filtering, routing
        self.a_init_std = float(a_init_std if a_init_std is not None else d_head**-0.5)
        self.delta_init = float(delta_init)
        self.proj = nn.Linear(d_model, n_heads * d_head, bias=True)
        self.v = nn.Linear(d_model, n_heads * d_head, bias=True)
        self.out = nn.Linear(n_heads * d_head, d_model, bias=True)
        if routing == "skew":
            self.A = nn.Parameter(torch.empty(n_heads, d_head, d_head))
        if filtering != "none":
            self.delta = nn.Parameter(
                torch.empty(n_heads, d_head if filtering == "diag" else 1)
            )
        self.reset_sd_parameters()

    def reset_sd_parameters(self) -> None:
        """Initialise A ~ N(0, a_init_std²) and δ = delta_init."""
        with torch.no_grad():
            if self.routing == "skew":
                self.A.normal_(0.0, self.a_init_std)
            if self.filtering != "none":
                self.delta.fill_(self.delta_init)

    def S(self) -> torch.Tensor:
        """Routing matrices ``S = Aᵀ − A``: [head, d_head, d_head] (zeros for routing='none')."""
        if self.routing == "none":
            return self.proj.weight.new_zeros(self.n_heads, self.d_head, self.d_head)
        return self.A.transpose(-1, -2) - self.A

    def D(self) -> torch.Tensor:
        """Filtering matrices ``D = diag(softplus(δ))``: [head, d_head, d_head]."""
        h, d = self.n_heads, self.d_head
        if self.filtering == "none":
            return self.proj.weight.new_zeros(h, d, d)
        diag = F.softplus(self.delta).expand(h, d)
        return torch.diag_embed(diag)

    def kernel(self) -> torch.Tensor:
        """``S − D``: [head, d_head, d_head]."""
        return self.S() - self.D()

    def forward(self, x: torch.Tensor, *, return_pattern: bool = False):
        """x: [batch, pos, d_model] -> [batch, pos, d_model] (and pattern [b, head, q, k]).

        ``q_i = p_i (S − D)``, ``k_j = p_j``, so ``q_i·k_j = p_i (S − D) p_jᵀ``.
        """
        _check_input(x, self.d_model, self.n_ctx)
        b, p, _ = x.shape
        h, d = self.n_heads, self.d_head
        pp = self.proj(x).view(b, p, h, d).transpose(1, 2)  # [b, h, p, d]
        v = self.v(x).view(b, p, h, d).transpose(1, 2)
        if self.training:
            q = torch.einsum("bhpd,hde->bhpe", pp, self.kernel())
        else:  # the folded query of SPEC B.7, as TransformerLens computes it
            w_q, b_q = self._folded_query()
            q = F.linear(x, w_q, b_q).view(b, p, h, d).transpose(1, 2)
        if self.rotary is not None:
            q, pp = self.rotary(q), self.rotary(pp)
        if self.training and not return_pattern:
            z = F.scaled_dot_product_attention(q, pp, v, is_causal=True)
            pattern = None
        else:
            scores = q @ pp.transpose(-1, -2) / math.sqrt(d)
            scores = scores.masked_fill(_causal_mask(p, x.device), float("-inf"))
            pattern = scores.softmax(dim=-1)
            z = pattern @ v
        out = self.out(z.transpose(1, 2).reshape(b, p, h * d))
        return (out, pattern) if return_pattern else out

    def _folded_query(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Linear-layout folded query: weight [head·d_head, d_model] = (W_P (S − D))ᵀ per
        head, bias [head·d_head] = b_P (S − D)."""
        h, d, dm = self.n_heads, self.d_head, self.d_model
        kern = self.kernel()
        w_p = self.proj.weight.view(h, d, dm).transpose(-1, -2)  # [h, dm, d]
        w_q = (w_p @ kern).permute(0, 2, 1).reshape(h * d, dm)
        b_q = torch.einsum("hd,hde->he", self.proj.bias.view(h, d), kern).reshape(h * d)
        return w_q, b_q

    def weights(self) -> dict[str, torch.Tensor]:
        """Equivalent standard-attention weights (SPEC B.7): W_Q = W_P (S − D), W_K = W_P,
        b_Q = b_P (S − D), b_K = b_P. Shapes as :meth:`SoftmaxAttention.weights`."""
        h, d, dm = self.n_heads, self.d_head, self.d_model
        with torch.no_grad():
            w_q, b_q = self._folded_query()
            w_p = self.proj.weight.view(h, d, dm).transpose(-1, -2)  # [h, dm, d]
            b_p = self.proj.bias.view(h, d)
            w_v = self.v.weight.view(h, d, dm).transpose(-1, -2)
            w_o = self.out.weight.view(dm, h, d).permute(1, 2, 0)
            return {
                "W_Q": w_q.view(h, d, dm).transpose(-1, -2).clone(),
                "W_K": w_p.clone(),
                "W_V": w_v.clone(),
                "b_Q": b_q.view(h, d).clone(),
                "b_K": b_p.clone(),
                "b_V": self.v.bias.view(h, d).clone(),
                "W_O": w_o.clone(),
                "b_O": self.out.bias.detach().clone(),
            }
