"""Rotary models of the routing study: the offset-resolved routing of a rotary GPT
checkpoint and the routing rank over training of a rotary S–D run (experiments that write
results; their doc blocks are rendered here too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tl_spectral.geometry.cascade import (
    cascade_over_training,
)
from tl_spectral.geometry.model import (
    model_qk_geometry,
    model_sd_geometry,
)
from tl_spectral_studies._common import (
    StudyUsageError,
    add_caption,
    fmt_interval,
)
from tl_spectral_studies._runs import HEADS_INTERVALS
from tl_spectral_studies._runs import head_interval as _head_interval

# ------------------------------------------------------------------- rotary models
ROTARY_LAGS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 255)


def rotary_study(model_dir: str | Path, results_dir: str | Path, *,
                 fig_path: str | Path | None = None, reference: str | None = "char-shakespeare",
                 overwrite: bool = False) -> dict[str, Any]:
    """Offset-resolved routing/filtering of a rotary GPT checkpoint (docs/routing_filtering.md,
    "Rotary positions").

    Reads ``model_dir`` (a ``save_model`` folder or a trainer checkpoint ``step_*``), computes
    :func:`~tl_spectral.geometry.model.model_rotary_geometry` (LayerNorm folded) at the lags
    :data:`ROTARY_LAGS` (offset Δ = −lag) and over the causal offset distribution of its
    context, and the dense head-mean curve ρ(Δ) for every lag ``0..n_ctx−1`` (trigonometric
    form). ``reference``: a zoo model with learned positions whose offset-free routing
    fraction is listed beside it. Writes ``results_dir/summary.json`` and
    ``results_dir/rotary_qk.safetensors``; the figure to ``fig_path`` when given. Existing
    outputs are refused (``FileExistsError``) unless ``overwrite``. Returns the summary.

    Longer than 80 lines on purpose: the experiment's steps in order on one loaded checkpoint."""
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.models.gpt import load_checkpoint

    model_dir, out = Path(model_dir), Path(results_dir)
    targets = [out / "summary.json", out / "rotary_qk.safetensors"]
    if fig_path is not None:
        targets.append(Path(fig_path))
    there = [str(t) for t in targets if t.exists()]
    if there and not overwrite:
        raise FileExistsError(f"{', '.join(there)} exist(s); pass overwrite=True (--overwrite) "
                              "to replace them, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    model = load_checkpoint(model_dir).eval()
    doc = json.loads((model_dir / "config.json").read_text())
    n_ctx = model.cfg.n_ctx
    lags = [lag for lag in ROTARY_LAGS if lag < n_ctx]
    geo = model_rotary_geometry(model, offsets=[-lag for lag in lags])
    geo.save(out / "rotary_qk", overwrite=overwrite)
    dense = geo.energies([-lag for lag in range(n_ctx)])["routing_fraction"]  # [L, H, n_ctx]
    layers = {}
    for i, name in enumerate(geo.layer_names):
        rf = geo.routing_fraction[i]  # [H, n]
        layers[name] = {
            "routing_fraction_mean": rf.mean(0).tolist(),
            "routing_fraction_min": rf.min(0).values.tolist(),
            "routing_fraction_max": rf.max(0).values.tolist(),
            "eff_rank_R_mean": geo.eff_rank_R[i].mean(0).tolist(),
            "mean_routing_fraction": float(geo.mean_routing_fraction[i].mean()),
            "mean_routing_fraction_min": float(geo.mean_routing_fraction[i].min()),
            "mean_routing_fraction_max": float(geo.mean_routing_fraction[i].max()),
            "mean_eff_rank_R": float(geo.mean_eff_rank_R[i].mean()),
            "dense_curve_mean": dense[i].mean(0).tolist(),
        }
    summary: dict[str, Any] = {
        "model_dir": model_dir.name, "step": doc.get("step"),
        "name": Path(str((doc.get("train") or {}).get("out_dir") or model_dir.name)).name,
        "config": {k: doc["model"][k] for k in ("n_layers", "n_heads", "d_model", "d_head",
                                                "n_ctx", "attention", "positional",
                                                "rotary_dim", "rotary_base")},
        "pairing": geo.pairing, "distribution": geo.distribution, "lags": lags,
        "layers": layers,
    }
    # the no-structure reference: i.i.d. Gaussian W_Q, W_K of the same shapes, same rotation
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    gen = torch.Generator().manual_seed(0)
    shape = (len(geo.layer_names), geo.n_heads, geo.d_model, geo.d_head[0])
    base = rotary_qk_geometry(torch.randn(shape, generator=gen, dtype=torch.float64),
                              torch.randn(shape, generator=gen, dtype=torch.float64),
                              RotarySpec(geo.inv_freq, geo.pairing, geo.attention_scaling),
                              offsets=[-lag for lag in lags], n_ctx=n_ctx, average_ranks=False)
    rf = base.routing_fraction.flatten(0, 1)  # [layers·heads, n]
    summary["baseline"] = {
        "what": f"i.i.d. Gaussian W_Q, W_K {list(shape)}, seed 0",
        "routing_fraction_mean": rf.mean(0).tolist(),
        "routing_fraction_min": rf.min(0).values.tolist(),
        "routing_fraction_max": rf.max(0).values.tolist(),
        "mean_routing_fraction": float(base.mean_routing_fraction.mean()),
        "mean_routing_fraction_min": float(base.mean_routing_fraction.min()),
        "mean_routing_fraction_max": float(base.mean_routing_fraction.max()),
    }
    if isinstance(doc.get("metrics"), dict):  # a final / shipped checkpoint
        summary["metrics"] = {k: doc["metrics"][k] for k in ("val_loss", "val_ppl", "steps")
                              if k in doc["metrics"]}
    state = model_dir / "trainer_state.json"
    if state.is_file():  # a trainer checkpoint: its validation history
        evals = json.loads(state.read_text()).get("history", {}).get("evals", [])
        summary["evals"] = [{"step": int(e["step"]), "val_loss": float(e["val_loss"])}
                            for e in evals if "val_loss" in e]
    if reference:
        from tl_spectral.models import zoo

        ref, _ = zoo.load_native(reference)
        rg = model_qk_geometry(ref)
        summary["reference"] = {"name": reference, "routing_fraction": [
            float(rg.routing_fraction[i].mean()) for i in range(rg.n_layers)]}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if fig_path is not None:
        fig = rotary_figure(summary)
        Path(fig_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(fig_path, dpi=100, bbox_inches="tight")
        import matplotlib.pyplot as plt

        plt.close(fig)
    return summary


def rotary_figure(summary: dict[str, Any]):
    """Head-mean routing fraction against the lag, one line per layer (dense curve), with
    the spread over heads at the reported lags. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    lags = summary["lags"]
    for name, row in summary["layers"].items():
        curve = row["dense_curve_mean"]
        (line,) = ax.plot([x + 1 for x in range(len(curve))], curve, lw=1.2, label=name)
        ax.fill_between([x + 1 for x in lags], row["routing_fraction_min"],
                        row["routing_fraction_max"], color=line.get_color(), alpha=0.08)
    ax.set_xscale("log")
    ax.set_xlabel("lag i − j + 1 (log)")
    ax.set_ylabel("routing fraction ‖R(Δ)‖² / ‖M(Δ)‖²")
    ax.axhline(0.5, color="0.6", lw=0.8, ls="--")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(f"{summary['name']} (step {summary['step']}): routing vs offset, "
                 "head mean (band: min–max over heads)", fontsize=8)
    add_caption(fig, "M(Δ) = W_Q R(Δ) W_Kᵀ, LayerNorm folded; Δ = j − i = −lag; "
                "tl_spectral_studies.routing.rotary_study")
    fig.tight_layout()
    return fig


def rotary_markdown(results_dir: str | Path) -> str:
    """The tables of the rotary section of docs/routing_filtering.md from
    ``results_dir/summary.json``."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    show = [lag for lag in (0, 1, 2, 4, 8, 16, 32, 64, 128, 255) if lag in s["lags"]]
    idx = [s["lags"].index(lag) for lag in show]
    L = ["| layer | " + " | ".join(f"lag {lag}" for lag in show)
         + " | causal mean (min–max over heads) | rank R, causal mean |",
         "|---|" + "---|" * len(show) + "---|---|"]
    for name, row in s["layers"].items():
        cells = [f"{row['routing_fraction_mean'][i]:.3f}" for i in idx]
        L.append(f"| {name} | " + " | ".join(cells)
                 + f" | {row['mean_routing_fraction']:.3f} ({row['mean_routing_fraction_min']:.3f}"
                 f"–{row['mean_routing_fraction_max']:.3f}) | {row['mean_eff_rank_R']:.1f} |")
    if "baseline" in s:
        b = s["baseline"]
        cells = [f"{b['routing_fraction_mean'][i]:.3f}" for i in idx]
        L.append("| Gaussian (all heads) | " + " | ".join(cells)
                 + f" | {b['mean_routing_fraction']:.3f} ({b['mean_routing_fraction_min']:.3f}"
                 f"–{b['mean_routing_fraction_max']:.3f}) | |")
    if s.get("evals"):
        L.append("")
        L.append("| step | " + " | ".join(str(e["step"]) for e in s["evals"]) + " |")
        L.append("|---|" + "---|" * len(s["evals"]))
        L.append(f"| {s['name']} val loss | "
                 + " | ".join(f"{e['val_loss']:.3f}" for e in s["evals"]) + " |")
    if s.get("metrics", {}).get("val_loss") is not None:
        m = s["metrics"]
        L.append("")
        L.append(f"{s['name']}: validation loss {m['val_loss']:.3f} nats/char (PPL "
                 f"{m.get('val_ppl', float('nan')):.3f}) after {m.get('steps', s['step'])} steps.")
    if "reference" in s:
        ref = s["reference"]
        L.append("")
        L.append(f"| layer | {s['name']} (rotary, step {s['step']}), lag 0 | {ref['name']} "
                 "(learned positions) |")
        L.append("|---|---|---|")
        for i, (name, row) in enumerate(s["layers"].items()):
            L.append(f"| {name} | {row['routing_fraction_mean'][0]:.3f} | "
                     f"{ref['routing_fraction'][i]:.3f} |")
    return "\n".join(L) + "\n"


def rotary_cascade_study(run_dir: str | Path, results_dir: str | Path, *,
                         reference: str = "sd-char-shakespeare-noln",
                         overwrite: bool = False) -> dict[str, Any]:
    """Does the S–D cascade survive rotary positions? The routing rank per layer over every
    checkpoint of a rotary S–D run (R at offset 0, S before the rotation) beside the shipped
    learned-position S–D model of the same recipe (``reference``), with intervals over heads
    (1,000 bootstrap resamples of the heads, seed 0). Writes ``results_dir/summary.json``."""
    from tl_spectral.geometry.model import model_qk_geometry
    from tl_spectral.models import zoo

    results_dir = Path(results_dir)
    out = results_dir / "summary.json"
    if out.exists() and not overwrite:
        raise StudyUsageError(f"{out} exists; pass --overwrite to replace it")
    c = cascade_over_training(run_dir)
    ref = zoo.load_native(reference)[0]
    ref_R = model_qk_geometry(ref, biases=False).eff_rank_R
    ref_S = model_sd_geometry(ref).eff_rank_S
    L = int(c.rank_R.shape[1])
    s: dict[str, Any] = {
        "name": c.run_name, "reference": reference, "steps": c.steps.tolist(),
        "val_loss": c.val_loss.tolist(),
        "rank_R_mean": c.rank_R.double().mean(-1).tolist(),
        "rank_S_mean": c.rank_S.double().mean(-1).tolist() if c.rank_S is not None else None,
        "final": {
            "rotary_R": [_head_interval(c.rank_R[-1, i]) for i in range(L)],
            "rotary_S": [_head_interval(c.rank_S[-1, i]) for i in range(L)]
            if c.rank_S is not None else None,
            "learned_R": [_head_interval(ref_R[i]) for i in range(L)],
            "learned_S": [_head_interval(ref_S[i]) for i in range(L)],
        },
        "reference_val_loss": zoo.checkpoint_info(reference)["metrics"]["val_loss"],
        "intervals": HEADS_INTERVALS,
        "command": f"tl-spectral study routing rotary-cascade --run-dir {Path(run_dir).name} "
                   f"--results DIR",
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return s


def rotary_cascade_verdict(s: dict[str, Any]) -> str:
    """One sentence from the head means: is layer 0 the minimum of the effective routing rank,
    with rotary and with learned positions? Descriptive: the summary holds percentile
    intervals over 8 heads, which under-cover, and no per-head values to test."""
    from tl_spectral_studies.verdicts import layer0_minimum_descriptive

    return "; ".join(f"{label}: " + layer0_minimum_descriptive(
        [r["estimate"] for r in s["final"][key]])
        for key, label in (("rotary_R", "rotary"), ("learned_R", "learned positions"))) + "."


def rotary_cascade_markdown(results_dir: str | Path) -> str:
    """The rotary S–D cascade table of docs/routing_filtering.md from ``summary.json``."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    f = s["final"]
    L = [f"| layer | R rank, {s['name']} (rotary) | R rank, {s['reference']} (learned) | "
         "S rank, rotary | S rank, learned |", "|---|---|---|---|---|"]
    for i in range(len(f["rotary_R"])):
        L.append(f"| {i} | {fmt_interval(f['rotary_R'][i], '{:.2f}')} | {fmt_interval(f['learned_R'][i], '{:.2f}')} | "
                 f"{fmt_interval(f['rotary_S'][i], '{:.2f}') if f['rotary_S'] else '—'} | "
                 f"{fmt_interval(f['learned_S'][i], '{:.2f}')} |")
    L.append("")
    L.append("| step | " + " | ".join(str(x) for x in s["steps"]) + " |")
    L.append("|---|" + "---|" * len(s["steps"]))
    L.append("| layer 0, R rank (rotary) | "
             + " | ".join(f"{r[0]:.2f}" for r in s["rank_R_mean"]) + " |")
    L.append("| min over layers 1–5 | "
             + " | ".join(f"{min(r[1:]):.2f}" for r in s["rank_R_mean"]) + " |")
    L.append("")
    vl = [v for v in s["val_loss"] if v >= 0]
    if vl and s.get("reference_val_loss") is not None:
        L.append(f"Validation loss after {s['steps'][-1]} steps: {vl[-1]:.3f} nats/char "
                 f"(rotary) vs {s['reference_val_loss']:.3f} ({s['reference']}, learned "
                 "positions), all validation windows.")
        L.append("")
    L.append(f"Verdict: {rotary_cascade_verdict(s)} Intervals: {s['intervals']}.")
    return "\n".join(L) + "\n"


