"""Head allocation, validated (issue 17 item 2): does the scale-POD allocation help?

The scale-POD study recommends heads per layer (proportional to H*, at least one, summing to
the uniform budget; ``docs/results/scale_pod/scale_pod_char-shakespeare_N1000.json``:
6, 4, 7, 6, 10, 15 heads of d_head 16 against 8 per layer). ``configs/char-shakespeare-alloc.json``
trains that allocation with the recipe of ``configs/char-shakespeare.json`` (the uniform
model, shipped as the zoo model ``char-shakespeare`` for seed 0); both have the same number of
attention parameters (48 heads of d_head 16 in all; tested).

This module scores the trained models on **every** validation window of the text (the last
10%: 256 + 1 characters at stride 256, the trainer's final evaluation) and compares them:

- per seed, the paired difference of validation PPL, allocation − uniform, with a 95%
  percentile bootstrap over windows (the same resampled windows for both models);
- the seed-to-seed change of each model (the noise a one-seed comparison cannot see);
- a verdict: "helps" / "hurts" only when every seed's interval excludes 0 on the same side
  **and** every seed's difference exceeds the uniform model's seed-to-seed change; otherwise
  "not distinguishable at this size".

``tl-spectral study head-allocation --run uniform:0=zoo:char-shakespeare --run
uniform:1=runs/char-shakespeare-s1 --run alloc:0=runs/char-shakespeare-alloc --run
alloc:1=runs/char-shakespeare-alloc-s1 --results docs/results/head_allocation``
"""

from __future__ import annotations

import json
import math
from argparse import ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral_studies._common import StudyUsageError, fmt_interval

SEQ_LEN = 256
RULE = ("'helps' or 'hurts' needs every seed's paired interval on the same side of 0 and every "
        "seed's difference larger than the uniform model's seed-to-seed change")


def parse_run(spec: str) -> tuple[str, int, str]:
    """``"which:seed=source"`` -> ``(which, seed, source)``; source is ``zoo:NAME`` or a run
    folder (its ``final/``, else its latest checkpoint)."""
    try:
        head, source = spec.split("=", 1)
        which, seed = head.split(":", 1)
        return which.strip(), int(seed), source.strip()
    except ValueError:
        raise StudyUsageError(f"--run {spec!r}: expected WHICH:SEED=SOURCE, e.g. "
                              "alloc:0=runs/char-shakespeare-alloc or "
                              "uniform:0=zoo:char-shakespeare") from None


def load_source(source: str) -> tuple[Any, dict[str, Any]]:
    """(native GPT, info) from ``zoo:NAME`` or a training run folder."""
    from tl_spectral.geometry.cascade import latest_model_dir
    from tl_spectral.models import zoo
    from tl_spectral.models.gpt import load_checkpoint

    if source.startswith("zoo:"):
        name = source[4:]
        model = zoo.load_native(name)[0]
        meta = zoo.checkpoint_info(name)
        return model, {"source": source, "steps": meta.get("metrics", {}).get("steps"),
                       "final": True, "val_loss_reported": meta.get("metrics", {}).get("val_loss")}
    d, step, final = latest_model_dir(source)
    cfg = json.loads((Path(d) / "config.json").read_text())
    return load_checkpoint(d), {"source": f"runs/{Path(source).name}", "steps": step,
                           "final": bool(final),
                           "val_loss_reported": cfg.get("metrics", {}).get("val_loss")}


def validation_windows_all(text: str | None = None) -> tuple[torch.Tensor, Any]:
    """Every validation window of Tiny Shakespeare (the trainer's final evaluation):
    ``[n, 257]`` ids at stride 256 of the last 10% of the text, with the char tokenizer of the
    whole text."""
    from tl_spectral.data import CharTokenizer, tiny_shakespeare, train_val_split

    text = tiny_shakespeare() if text is None else text
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(train_val_split(text)[1]))
    n = (ids.numel() - 1) // SEQ_LEN
    return torch.stack([ids[i * SEQ_LEN: i * SEQ_LEN + SEQ_LEN + 1] for i in range(n)]), tok


def paired_ppl_difference(a: torch.Tensor, b: torch.Tensor, *, n_resamples: int = 1000,
                          seed: int = 0) -> dict[str, float]:
    """PPL(a) − PPL(b) from per-window mean losses of equal-length windows (PPL = exp of the
    mean loss), with a 95% percentile bootstrap over windows, paired (the same resampled
    windows for both): :func:`tl_spectral_studies.sd_runs.paired_delta_ppl` with ``b`` as
    the base."""
    from tl_spectral_studies.sd_runs import paired_delta_ppl

    return paired_delta_ppl(b, a, n_resamples=n_resamples, seed=seed)["delta_ppl"]


def verdict(summary: dict[str, Any]) -> str:
    """One sentence from the per-seed paired intervals and the uniform seed spread."""
    diffs = summary["paired"]
    if not diffs:
        return "no seed has both models yet"
    signs = {("+" if d["low"] > 0 else "-" if d["high"] < 0 else "0") for d in diffs.values()}
    spread = summary.get("uniform_seed_change")
    if len(diffs) < 2 or spread is None:
        return ("not distinguishable at this size (one seed: no seed-to-seed change to "
                "compare with)")
    big = all(abs(d["estimate"]) > spread for d in diffs.values())
    if signs == {"-"} and big:
        return "the allocation helps (lower PPL in every seed, beyond the seed-to-seed change)"
    if signs == {"+"} and big:
        return "the allocation hurts (higher PPL in every seed, beyond the seed-to-seed change)"
    return f"not distinguishable at this size ({RULE})"


def run_study(specs: Sequence[str], results_dir: str | Path, *, n_resamples: int = 1000,
              overwrite: bool = False, windows: torch.Tensor | None = None) -> dict[str, Any]:
    """Score every ``which:seed=source`` model on every validation window; write
    ``results_dir/summary.json`` (per model: PPL, heads per layer, parameter counts, steps;
    per seed: the paired allocation − uniform PPL difference with its interval; the
    seed-to-seed PPL change of each model; the verdict)."""
    from tl_spectral.interventions.surgery import attention_param_count, window_losses

    out = Path(results_dir) / "summary.json"
    if out.exists() and not overwrite:
        raise StudyUsageError(f"{out} exists; pass --overwrite to replace it")
    runs = [parse_run(s) for s in specs]
    if windows is None:
        windows, _ = validation_windows_all()
    models: dict[str, dict[str, Any]] = {}
    losses: dict[tuple[str, int], torch.Tensor] = {}
    for which, seed, source in runs:
        torch.set_num_threads(1)
        model, info = load_source(source)
        lw = window_losses(model, windows)
        losses[(which, seed)] = lw
        loss = float(lw.mean())
        models[f"{which}:{seed}"] = {
            "which": which, "seed": seed, **info, "val_loss": loss, "val_ppl": math.exp(loss),
            "heads_per_layer": model.cfg.heads_per_layer, "d_head": model.cfg.d_heads,
            "attention_params": attention_param_count(model.cfg),
            "total_params": int(sum(p.numel() for p in model.parameters()))}
    paired = {}
    for (which, seed), lw in losses.items():
        if which == "alloc" and ("uniform", seed) in losses:
            paired[str(seed)] = paired_ppl_difference(lw, losses[("uniform", seed)],
                                                      n_resamples=n_resamples)
    change = {}
    for which in sorted({w for w, _ in losses}):
        seeds = sorted(s for w, s in losses if w == which)
        if len(seeds) >= 2:
            ppl = [models[f"{which}:{s}"]["val_ppl"] for s in seeds]
            change[which] = max(ppl) - min(ppl)
    s = {"models": models, "paired": paired, "seed_change": change,
         "uniform_seed_change": change.get("uniform"),
         "n_windows": int(windows.shape[0]), "seq_len": int(windows.shape[1] - 1),
         "intervals": f"95% percentile bootstrap over the {int(windows.shape[0])} validation "
                      f"windows, paired, {n_resamples} resamples, seed 0",
         "command": "tl-spectral study head-allocation " + " ".join(f"--run {x}" for x in specs)
                    + " --results DIR"}
    s["verdict"] = verdict(s)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return s


def _run(model: dict[str, Any]) -> str:
    """The training run's folder name (``runs/NAME`` -> ``NAME``): docs name runs, they do not
    read them."""
    return model["source"].removeprefix("runs/")


def markdown(results_dir: str | Path) -> str:
    """The head-allocation table of docs/scale_pod.md from ``summary.json``."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    L = ["| model | seed | heads per layer | attention params | steps | validation PPL |",
         "|---|---|---|---|---|---|"]
    for m in s["models"].values():
        src = m["source"] if m["source"].startswith("zoo:") else "training run " + _run(m)
        L.append(f"| {m['which']} ({src}) | {m['seed']} | "
                 f"{', '.join(str(h) for h in m['heads_per_layer'])} | "
                 f"{m['attention_params']:,} | {m['steps']}{'' if m['final'] else ' (not final)'} | "
                 f"{m['val_ppl']:.4f} |")
    L.append("")
    L.append("| seed | PPL allocation − uniform [95% CI] |")
    L.append("|---|---|")
    for seed, d in s["paired"].items():
        L.append(f"| {seed} | {fmt_interval(d, '{:+.4f}')} |")
    if s["seed_change"]:
        L.append("")
        L.append("Seed-to-seed PPL change (max − min over seeds): "
                 + ", ".join(f"{w} {v:.4f}" for w, v in s["seed_change"].items()) + ".")
    L.append("")
    L.append(f"Verdict: {verdict(s)}. Intervals: {s['intervals']}.")
    runs = [_run(m) for m in s["models"].values() if not m["source"].startswith("zoo:")]
    if runs:
        L.append("")
        L.append(f"Re-checking: {', '.join(runs)} are training runs, not shipped; retrain them "
                 "with the commands of docs/models.md (\"Compute plan\"), then "
                 f"`{s['command']}`.")
    return "\n".join(L) + "\n"


def short_verdict(results_dir: str | Path) -> str:
    """The verdict with the per-seed differences, for the claim table's note."""
    s = json.loads((Path(results_dir) / "summary.json").read_text())
    per = "; ".join(f"seed {k}: {fmt_interval(d, '{:+.4f}')}" for k, d in s["paired"].items())
    return f"{verdict(s)} (PPL allocation − uniform, {per})"


def main(argv: Sequence[str], prog: str = "tl-spectral study head-allocation") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True,
                    help="WHICH:SEED=SOURCE with WHICH 'alloc' or 'uniform' and SOURCE "
                         "zoo:NAME or a training run folder (repeat)")
    ap.add_argument("--results", required=True, help="folder for summary.json")
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--overwrite", action="store_true", help="replace an existing summary.json")
    args = ap.parse_args(list(argv))
    run_study(args.run, args.results, n_resamples=args.n_resamples, overwrite=args.overwrite)
    print(markdown(args.results))
    return 0
