"""Lag coordinates of per-pair fields (SPEC A.3, A.5): the inputs of scale POD.

``lag_fields`` turns ``[..., T, T]`` fields into ``[..., T, n_lags]`` lag profiles;
``gaussian_lag_window`` is a band's window; ``stack_fields`` and ``check_lags`` check the
inputs every scale-POD path (per layer, per head, streamed) shares.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["check_lags", "gaussian_lag_window", "lag_fields", "stack_fields"]


def lag_fields(
    A: Float[Tensor, "... T T"],
    *,
    causal: bool = True,
    max_lag: int | None = None,
    window: int | None = None,
) -> tuple[Float[Tensor, "... T n_lags"], Tensor]:
    """Lag coordinates of fields ``A[..., i, j]`` (SPEC A.3).

    Causal: ``tau = i - j`` in ``[0, max_lag]`` (default ``T - 1``), ``F[..., i, tau] =
    A[..., i, i - tau]``, zero where ``tau > i``. Bidirectional: ``tau = j - i`` in
    ``[-max_lag, max_lag]``, ``F[..., i, tau] = A[..., i, i + tau]``, zero outside
    ``0 <= i + tau < T``. ``window``: a causal sliding-window layer's width ``W``
    (:func:`~tl_spectral.model_view.layer_windows`): ``F`` is also zero at ``tau >= W``,
    where the layer attends to nothing (its attention fields are exactly 0 there; fields
    derived from other maps are cut to the keys the layer can see). Returns
    ``(F [..., T, n_lags], lags [n_lags] int64)``.
    """
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must be [..., T, T] (got {tuple(A.shape)})")
    T = int(A.shape[-1])
    L = T - 1 if max_lag is None else int(max_lag)
    if not 0 <= L <= T - 1:
        raise ValueError(f"max_lag must lie in [0, T-1] = [0, {T - 1}] (got {max_lag})")
    lags = torch.arange(0, L + 1) if causal else torch.arange(-L, L + 1)
    i = torch.arange(T)[:, None]
    j = i - lags[None, :] if causal else i + lags[None, :]  # [T, n_lags]
    valid = (j >= 0) & (j < T)
    if causal and window is not None:
        if int(window) < 1:
            raise ValueError(f"window must be a positive int or None (got {window})")
        valid = valid & (lags[None, :] < int(window))
    idx = j.clamp(0, T - 1).expand(*A.shape[:-2], T, lags.numel())
    F = torch.gather(A, -1, idx) * valid.to(A.dtype)
    return F, lags


def gaussian_lag_window(lags: Tensor, scale: float, *, absolute: bool = False) -> Tensor:
    """``G(tau) = exp(-(tau - a)^2 / (2 sigma^2))``, ``sigma = a / 2`` (SPEC A.5): ``[n_lags]``
    float64. ``absolute=True`` uses ``|tau|`` (both directions of a bidirectional field)."""
    if not scale > 0:
        raise ValueError(f"scale must be positive (got {scale})")
    tau = lags.to(torch.float64)
    if absolute:
        tau = tau.abs()
    sigma = scale / 2.0
    return torch.exp(-((tau - scale) ** 2) / (2.0 * sigma**2))


def stack_fields(F) -> Tensor:
    """``F`` as one ``[N, T, n_lags]`` tensor (a tensor, or a list of ``[T, n_lags]``
    documents of equal length), checked."""
    if isinstance(F, Tensor):
        if F.ndim != 3:
            raise ValueError(
                f"F must be [N documents, T queries, n_lags] (got shape {tuple(F.shape)}); "
                "convert [N, T, T] fields with lag_fields()"
            )
        return F
    items = list(F)
    if not items:
        raise ValueError("no documents given; pass F [N, T, n_lags] with N >= 2")
    shapes = {tuple(x.shape) for x in items}
    if len(shapes) > 1:
        raise ValueError(
            f"fields of unequal length: documents have shapes {sorted(shapes)}; every document "
            "must be a window of exactly T tokens (cut equal windows, e.g. "
            "tl_spectral.data.windows)"
        )
    if items[0].ndim != 2:
        raise ValueError(f"each document field must be [T, n_lags] (got {tuple(items[0].shape)})")
    return torch.stack(items)


def check_lags(lags: Tensor | None, n_lags: int) -> Tensor:
    """The lag grid of ``n_lags`` lags as consecutive int64 (default ``0..n_lags-1``),
    checked."""
    if lags is None:
        return torch.arange(n_lags)
    lags = torch.as_tensor(lags)
    if lags.ndim != 1 or lags.numel() != n_lags:
        raise ValueError(f"lags must be 1-D with {n_lags} entries (the last axis of F)")
    if lags.is_floating_point():
        if not torch.equal(lags, lags.round()):
            raise ValueError("lags must be integers")
        lags = lags.round()
    lags = lags.to(torch.int64)
    if n_lags > 1 and not torch.all(lags[1:] - lags[:-1] == 1):
        raise ValueError(
            "lags must be consecutive increasing integers (e.g. 0..T-1 causal, "
            "-(T-1)..T-1 bidirectional)"
        )
    return lags
