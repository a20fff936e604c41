"""Gemma-3's natural experiment, question (b): routing and filtering of the local
(θ = 10⁴) against the global (θ = 10⁶) heads, from the weights, with the stated rule
:data:`RULE` (a bootstrap interval over heads and the exact layer-level permutation test).
Part of :mod:`tl_spectral_studies.gemma_window`, which re-exports every name."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

N_RESAMPLES = 1000
N_PERMUTATIONS = 10_000
RULE = ("local and global differ when the 95% percentile bootstrap interval of "
        "mean(global heads) − mean(local heads) (heads resampled within each group, "
        f"{2 * N_RESAMPLES} resamples) excludes 0 AND the exact layer-level permutation test "
        "(every choice of the global layers among all layers, on layer means; two-sided) "
        "gives p < 0.05; the head-level permutation p (random relabelings of the heads) is "
        "reported beside it but heads of one layer share a key head and are not independent. "
        "The difference is beyond the untrained kernel when that interval also excludes the "
        "Gaussian kernels' difference.")
"""The stated rule of (b), recorded in routing.json."""


def layer_kinds(windows: Sequence[int | None], layers: Sequence[int]) -> list[str]:
    """``"local"`` (a sliding window) or ``"global"`` per layer of ``layers``."""
    return ["global" if windows[li] is None else "local" for li in layers]


def routing_offsets(n_ctx: int, W: int) -> list[int]:
    """Δ = j − i reported: 0, −1, −8, −64, the local window's edge −(W − 1) and the context's
    −(n_ctx − 1) (those inside the context, once each)."""
    out: list[int] = []
    for d in (0, -1, -8, -64, -(W - 1), -(n_ctx - 1)):
        if -(n_ctx - 1) <= d <= 0 and d not in out:
            out.append(d)
    return out


def head_statistics(g: Any) -> dict[str, torch.Tensor]:
    """Per head ``[layer, head]`` statistics of a :class:`RotaryQKGeometry`: the routing
    fraction at Δ = 0 and averaged over the causal offsets the layer attends to, the
    entropy ranks of R and F at Δ = 0, and the routing fraction at every reported
    offset (``rf_at_<Δ>``)."""
    out = {"rf_delta0": g.routing_fraction[..., 0], "rf_causal": g.mean_routing_fraction,
           "rank_R_delta0": g.eff_rank_R[..., 0], "rank_F_delta0": g.eff_rank_F[..., 0]}
    for k, d in enumerate(g.offsets.tolist()):
        if d != 0:
            out[f"rf_at_{d}"] = g.routing_fraction[..., k]
    return {k: v.double() for k, v in out.items()}


def group_difference(x: torch.Tensor, is_global: torch.Tensor, *, seed: int = 0
                     ) -> dict[str, Any]:
    """``x [layer, head]``, ``is_global [layer]``: mean(global heads) − mean(local heads)
    with the stratified percentile bootstrap over heads, the head-level permutation p
    (:data:`N_PERMUTATIONS` random relabelings of the heads, two-sided) and the exact
    layer-level permutation p (every choice of as many global layers, on layer means)."""
    L, H = x.shape
    flat = x.flatten()
    lab = is_global[:, None].expand(L, H).flatten()
    a, b = flat[lab], flat[~lab]
    obs = float(a.mean() - b.mean())
    g = torch.Generator().manual_seed(int(seed))
    n_boot = 2 * N_RESAMPLES
    ra = a[torch.randint(0, a.numel(), (n_boot, a.numel()), generator=g)].mean(1)
    rb = b[torch.randint(0, b.numel(), (n_boot, b.numel()), generator=g)].mean(1)
    reps = ra - rb
    perm = torch.stack([torch.randperm(flat.numel(), generator=g)
                        for _ in range(N_PERMUTATIONS)])
    pl = lab[perm]  # the labels relabeled, the values in place
    d_perm = (flat * pl).sum(1) / a.numel() - (flat * ~pl).sum(1) / b.numel()
    p_heads = (1 + int((d_perm.abs() >= abs(obs) - 1e-12).sum())) / (1 + N_PERMUTATIONS)
    lp = layer_permutation(x.mean(1).tolist(), is_global.tolist())
    return {"global_mean": float(a.mean()), "local_mean": float(b.mean()),
            "n_global": int(a.numel()), "n_local": int(b.numel()),
            "difference": {"estimate": obs, "low": float(reps.quantile(0.025)),
                           "high": float(reps.quantile(0.975))},
            "p_heads": p_heads, "p_layers": lp["p"], "n_layer_splits": lp["n_splits"]}


def layer_permutation(values: Sequence[float], is_global: Sequence[bool]) -> dict[str, Any]:
    """The exact two-sided permutation test of mean(global) − mean(local) over layers: every
    choice of as many "global" layers among all of them; ``p`` = the share of choices whose
    |difference| is at least the observed one (the observed choice included)."""
    v = [float(x) for x in values]
    L, g = len(v), [i for i, b in enumerate(is_global) if b]
    if not 0 < len(g) < L:
        raise ValueError(f"need both global and local layers, got {len(g)} global of {L}")

    def diff(c: Sequence[int]) -> float:
        rest = [v[i] for i in range(L) if i not in c]
        return sum(v[i] for i in c) / len(c) - sum(rest) / len(rest)

    obs = diff(g)
    ds = [diff(c) for c in itertools.combinations(range(L), len(g))]
    return {"difference": obs, "p": sum(abs(d) >= abs(obs) - 1e-12 for d in ds) / len(ds),
            "n_splits": len(ds)}


def verdict(trained: dict[str, Any], gaussian: dict[str, Any]) -> str:
    """The label of :data:`RULE` for one statistic."""
    d = trained["difference"]
    differ = (d["low"] > 0 or d["high"] < 0) and trained["p_layers"] < 0.05
    if not differ:
        return "not distinguishable"
    g = gaussian["difference"]["estimate"]
    beyond = not (d["low"] <= g <= d["high"])
    return "differ" + ("" if beyond else " (as the untrained Gaussian kernels do)")


def gaussian_geometry(g: Any, view: Any, offsets: Sequence[int], n_ctx: int, seed: int) -> Any:
    """i.i.d. Gaussian ``W_Q``, ``W_K`` of ``g``'s shapes, as many key heads as the model
    has (Gemma-3-270M: one, read by its four query heads), each layer rotated by the model's
    own rotary embedding and averaged over its own window (the untrained reference)."""
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry
    from tl_spectral.model_view import layer_rotary_metadata, layer_windows

    gen = torch.Generator().manual_seed(int(seed))
    L, H = g.routing_fraction.shape[:2]
    d = int(g.d_head[0])
    WQ = torch.randn(L, H, g.d_model, d, generator=gen, dtype=torch.float64)
    WK = torch.randn(L, int(view.n_kv_heads), g.d_model, d, generator=gen, dtype=torch.float64)
    specs = [RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
             for m in layer_rotary_metadata(view)]
    return rotary_qk_geometry(WQ, WK, specs, offsets=list(offsets), n_ctx=n_ctx,
                              average_ranks=False, windows=layer_windows(view), progress=False)


def routing(model: Any, *, n_ctx: int, seed: int = 0) -> dict[str, Any]:
    """(b): per head the statistics of :func:`head_statistics` of the model and of Gaussian
    kernels, local against global under :data:`RULE`."""
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.model_view import ModelView, layer_windows

    view = model if isinstance(model, ModelView) else ModelView(model)
    windows = layer_windows(view)
    W = max(w for w in windows if w is not None)
    offs = routing_offsets(n_ctx, W)
    g = model_rotary_geometry(view, offsets=offs, n_ctx=n_ctx, average_ranks=False,
                              progress=False)
    base = gaussian_geometry(g, view, offs, n_ctx, seed)
    is_global = torch.tensor([w is None for w in windows])
    st, sb = head_statistics(g), head_statistics(base)
    summary = {}
    for k in st:
        tr = group_difference(st[k], is_global, seed=seed)
        ga = group_difference(sb[k], is_global, seed=seed)
        summary[k] = {"trained": tr, "gaussian": ga, "verdict": verdict(tr, ga)}
    # the rotary base of each layer from its second pair's frequency θ_1 = base^(−2/dim)
    base_of = [float(g.pair_theta[li][1]) ** (-g.rotary_dim / 2) for li in range(len(windows))]
    return {"offsets": offs, "n_ctx": n_ctx, "layer_windows": windows,
            "kinds": layer_kinds(windows, range(len(windows))), "n_heads": int(g.n_heads),
            "n_kv_heads": int(view.n_kv_heads), "d_head": int(g.d_head[0]),
            "d_model": int(g.d_model), "capacity": min(2 * int(g.d_head[0]), int(g.d_model)),
            "rope_base": base_of, "rule": RULE, "summary": summary,
            "per_head": {k: v.tolist() for k, v in st.items()},
            "gaussian_per_layer": {k: v.mean(1).tolist() for k, v in sb.items()}}


# ----------------------------------------------------------------------------- runner
