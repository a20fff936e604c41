"""ΔPPL against the kept rank r of the routing / filtering part, shipped models (issue 17.7).

    python -m tl_spectral_studies.rank_truncation [--models char-shakespeare sd-char-shakespeare]
        [--n-windows 32] [--out docs/results/surgery/rank_truncation.json]

For each model: disjoint windows of n_ctx+1 characters from the *validation* text (the last
10% of the bundled Tiny Shakespeare, the models' own split; seed 0), the per-window NLL of
the model and of ``truncate_rank(model, part, r)`` (all layers at once) for r = 1, 2, 4, …
up to the full rank (routing: even r only), and the relative ΔPPL with a 95% percentile
bootstrap interval over windows (1000 resamples, seed 0); at every r both parts were cut
to, the paired difference rel ΔPPL(filtering) − rel ΔPPL(routing) over the same resampled
windows (> 0: filtering needs more rank). Writes one JSON file (per-window NLL included).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from tl_spectral.analysis.bootstrap import bootstrap
from tl_spectral.data import document_windows, tiny_shakespeare, train_val_split
from tl_spectral.interventions.ablations import truncate_rank
from tl_spectral.models import zoo


@torch.no_grad()
def window_nll(model, windows: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """Summed next-token NLL per window [n] (float64)."""
    model.eval()
    out = []
    for s in range(0, windows.shape[0], batch_size):
        w = windows[s:s + batch_size]
        logits = model(w[:, :-1]).float()
        nll = F.cross_entropy(logits.transpose(1, 2), w[:, 1:], reduction="none")
        out.append(nll.sum(1).double())
    return torch.cat(out)


def run(name: str, n_windows: int) -> dict:
    model, tok = zoo.load_native(name)
    n_ctx = model.cfg.n_ctx
    _, val = train_val_split(tiny_shakespeare(), 0.1)
    w = document_windows(val, tok, n_windows, n_ctx + 1, seed=0,
                         bos_id=getattr(tok, "bos_id", None)).tokens
    n_tgt = w.shape[1] - 1
    base = window_nll(model, w)
    dh = model.cfg.d_head if isinstance(model.cfg.d_head, int) else max(model.cfg.d_head)
    sd = model.cfg.layer_attention(0) == "sd"
    full = dh if sd else min(model.cfg.d_model, 2 * dh)
    ranks = [2 ** k for k in range(int(math.log2(full)) + 1)]
    rows = []
    nlls: dict[tuple[str, int], torch.Tensor] = {}
    for part in ("routing", "filtering"):
        for r in ranks:
            if part == "routing" and r % 2:
                continue
            t0 = time.perf_counter()
            nll = window_nll(truncate_rank(model, part, r), w)
            nlls[part, r] = nll

            def rel(idx: torch.Tensor, nll=nll) -> float:
                return math.exp((nll[idx].sum() - base[idx].sum()) / (len(idx) * n_tgt)) - 1

            iv = bootstrap(rel, len(w), n_resamples=1000, seed=0)
            rows.append({"part": part, "r": r,
                         "ppl": math.exp(float(nll.sum()) / (len(w) * n_tgt)),
                         "rel_delta_ppl": iv.estimate, "rel_delta_low": iv.low,
                         "rel_delta_high": iv.high,
                         "seconds": round(time.perf_counter() - t0, 1),
                         "window_nll": [round(float(x), 4) for x in nll]})
            print(json.dumps({"model": name, **{k: v for k, v in rows[-1].items()
                                                if k != "window_nll"}}), flush=True)
    paired = []
    for r in ranks:
        if ("routing", r) not in nlls or ("filtering", r) not in nlls:
            continue
        fa, ro = nlls["filtering", r], nlls["routing", r]

        def diff(idx: torch.Tensor, fa=fa, ro=ro) -> float:
            n = len(idx) * n_tgt
            b = base[idx].sum()
            return math.exp((fa[idx].sum() - b) / n) - math.exp((ro[idx].sum() - b) / n)

        iv = bootstrap(diff, len(w), n_resamples=1000, seed=0)
        paired.append({"r": r, "filtering_minus_routing": iv.estimate, "low": iv.low,
                       "high": iv.high})
    return {"model": name, "attention": "sd" if sd else "softmax",
            "baseline_ppl": math.exp(float(base.sum()) / (len(w) * n_tgt)),
            "full_rank": full, "n_windows": len(w), "window_targets": n_tgt,
            "windows": f"{len(w)} disjoint windows of {n_ctx + 1} chars of the validation "
                       "text (last 10% of tiny_shakespeare), seed 0",
            "interval": "95% percentile bootstrap over windows, 1000 resamples, seed 0",
            "baseline_window_nll": [round(float(x), 4) for x in base],
            "rows": rows, "paired": paired}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tl_spectral_studies.rank_truncation",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["char-shakespeare", "char-shakespeare-noln",
                                                    "sd-char-shakespeare"])
    ap.add_argument("--n-windows", type=int, default=32)
    ap.add_argument("--out", default="docs/results/surgery/rank_truncation.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    doc = {"command": "python -m tl_spectral_studies.rank_truncation " + " ".join(
               ["--models", *args.models, "--n-windows", str(args.n_windows)]),
           "models": [run(m, args.n_windows) for m in args.models]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
