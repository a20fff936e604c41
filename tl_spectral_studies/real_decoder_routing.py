"""The ``routing`` step of the real-decoder study (seed 002, docs/real_decoder.md): the
offset-resolved rotary QK geometry of every head, an i.i.d. Gaussian kernel of the same
shapes rotated by each layer's own rotary embedding, and — on a model with sliding-window
layers beside full ones (Gemma-3) — the budget and rank of each layer type apart.
"""

from __future__ import annotations

from typing import Any

import torch

OFFSETS = (0, -1, -2, -4, -8, -16, -32, -64, -127)


def layer_types(model: Any) -> list[str]:
    """Per layer ``"local"`` (a sliding-window layer) or ``"global"`` (full attention), from
    :func:`tl_spectral.model_view.layer_windows`."""
    from tl_spectral.model_view import layer_windows

    return ["global" if w is None else "local" for w in layer_windows(model)]


def heads_iv(x: torch.Tensor, seed: int, n_resamples: int) -> dict:
    """Percentile bootstrap over heads of the mean of ``x`` (any shape, flattened)."""
    from tl_spectral.analysis.bootstrap import bootstrap

    flat = x.flatten().double()
    iv = bootstrap(lambda idx: flat[idx].mean(), flat.numel(), n_resamples=n_resamples,
                   seed=seed).to_dict()
    return {k: iv[k] for k in ("estimate", "low", "high")}


def thirds(x: torch.Tensor, seed: int, n_resamples: int) -> dict:
    """Last third − first third of the layers of ``x [L, H]``, bootstrap over heads."""
    from tl_spectral.analysis.bootstrap import resample_indices

    L = x.shape[0]
    a, b = x[: L // 3].flatten().double(), x[-(L // 3):].flatten().double()
    ia = resample_indices(a.numel(), n_resamples, seed)
    ib = resample_indices(b.numel(), n_resamples, seed + 1)
    reps = b[ib].mean(1) - a[ia].mean(1)
    return {"estimate": float(b.mean() - a.mean()),
            "low": float(reps.quantile(0.025)), "high": float(reps.quantile(0.975))}


def gaussian_geometry(g: Any, model: Any, n_ctx: int, seed: int) -> Any:
    """The i.i.d. Gaussian kernel of ``g``'s shapes, rotated by each layer's own rotary
    embedding (one spec when every layer has the same; Gemma-3: θ 10⁴ local, 10⁶ global) and
    averaged over each layer's window as ``g`` is."""
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry
    from tl_spectral.model_view import layer_rotary_metadata

    gen = torch.Generator().manual_seed(seed)
    L, H = g.routing_fraction.shape[:2]
    d = g.d_head[0]
    WQ = torch.randn(L, H, g.d_model, d, generator=gen, dtype=torch.float64)
    WK = torch.randn(L, g.n_kv_heads, g.d_model, d, generator=gen, dtype=torch.float64)
    specs: Any = [RotarySpec(m["inv_freq"], m["pairing"], m["attention_scaling"])
                  for m in layer_rotary_metadata(model)]
    if len({tuple(sp.inv_freq.tolist()) + (sp.attention_scaling,) for sp in specs}) == 1:
        specs = RotarySpec(g.inv_freq, g.pairing, g.attention_scaling)
    return rotary_qk_geometry(WQ, WK, specs, offsets=list(OFFSETS), n_ctx=n_ctx,
                              average_ranks=False, windows=g.windows)


def by_type(g: Any, base: Any, types: list[str], seed: int, n_resamples: int) -> dict:
    """The head intervals of the budget and rank per layer type (local / global), with the
    Gaussian kernel's means over the same layers."""
    out = {}
    for t in ("local", "global"):
        idx = [i for i, x in enumerate(types) if x == t]
        if not idx:
            continue
        sel = torch.tensor(idx)

        def iv(x: torch.Tensor) -> dict:
            return heads_iv(x, seed, n_resamples)

        out[t] = {
            "layers": idx, "n_heads": len(idx) * int(g.routing_fraction.shape[1]),
            "routing_fraction_delta0": iv(g.routing_fraction[sel, :, 0]),
            "routing_fraction_causal": iv(g.mean_routing_fraction[sel]),
            "eff_rank_R_delta0": iv(g.eff_rank_R[sel, :, 0]),
            "eff_rank_F_delta0": iv(g.eff_rank_F[sel, :, 0]),
            "gaussian": {"routing_fraction_delta0": float(base.routing_fraction[sel, :, 0].mean()),
                         "routing_fraction_causal": float(base.mean_routing_fraction[sel].mean()),
                         "eff_rank_R_delta0": float(base.eff_rank_R[sel, :, 0].mean())}}
    return out


def routing_numbers(model: Any, n_ctx: int, seed: int = 0, n_resamples: int = 1000) -> dict:
    """Everything ``routing.json`` holds but the model name, timing and provenance: head
    intervals of the routing fraction and ranks, the Gaussian reference, per-layer rows, the
    offset and depth effects and (two layer types) ``by_type``."""
    from tl_spectral.geometry.model import model_rotary_geometry

    g = model_rotary_geometry(model, offsets=list(OFFSETS), n_ctx=n_ctx, average_ranks=False)
    base = gaussian_geometry(g, model, n_ctx, seed)
    L, H = g.routing_fraction.shape[:2]
    rf0 = g.routing_fraction[..., 0]

    def iv(x: torch.Tensor) -> dict:
        return heads_iv(x, seed, n_resamples)

    res: dict[str, Any] = {
        "n_ctx": n_ctx, "offsets": list(OFFSETS), "n_heads_total": L * H,
        "capacity": min(2 * g.d_head[0], g.d_model), "distribution": g.distribution,
        "routing_fraction_delta0": iv(rf0),
        "routing_fraction_causal": iv(g.mean_routing_fraction),
        "eff_rank_R_delta0": iv(g.eff_rank_R[..., 0]),
        "eff_rank_F_delta0": iv(g.eff_rank_F[..., 0]),
        "gaussian": {"routing_fraction_delta0": float(base.routing_fraction[..., 0].mean()),
                     "routing_fraction_causal": float(base.mean_routing_fraction.mean()),
                     "eff_rank_R_delta0": float(base.eff_rank_R[..., 0].mean()),
                     "eff_rank_F_delta0": float(base.eff_rank_F[..., 0].mean())},
        "per_layer": [{"layer": li,
                       "rf_by_offset": g.routing_fraction[li].mean(0).tolist(),
                       "rf_causal": float(g.mean_routing_fraction[li].mean()),
                       "rf_causal_min": float(g.mean_routing_fraction[li].min()),
                       "rf_causal_max": float(g.mean_routing_fraction[li].max()),
                       "rank_R_by_offset": g.eff_rank_R[li].mean(0).tolist(),
                       "rank_F_by_offset": g.eff_rank_F[li].mean(0).tolist()}
                      for li in range(L)],
        "gaussian_rf_by_offset": base.routing_fraction.flatten(0, 1).mean(0).tolist(),
        "offset_effect": iv(g.routing_fraction[..., -1] - rf0),
        "depth_effect_rf": thirds(g.mean_routing_fraction, seed, n_resamples),
        "depth_effect_rank_R": thirds(g.eff_rank_R[..., 0], seed, n_resamples),
    }
    types = layer_types(model)
    if len(set(types)) > 1:  # local / global layers (Gemma-3)
        for row in res["per_layer"]:
            row["type"] = types[row["layer"]]
        res["by_type"] = by_type(g, base, types, seed, n_resamples)
    return res
