"""Faithfulness with a global (layer-level) ranking on a zoo model (issue 17 item 4).

    python -m tl_spectral_studies.faithfulness_scope [--model char-shakespeare] [--n-docs 32]
        [--scope layer] [--level token] [--out FILE.json]

Default output: docs/results/faithfulness_scope/<model>_<scope>_<level>_N<n-docs>.json.

Windows: ``n_docs`` disjoint 256-character windows of the validation text (last 10% of the
bundled Tiny Shakespeare, seed 0). Measures: attention, value_weighted, output_normalized,
contribution (inter mode) and random. Writes the areas with 95% bootstrap intervals over
documents (1000 resamples, seed 0) and the paired differences of the paper's adjacent
measures (attention − value_weighted, value_weighted − output_normalized,
output_normalized − contribution) for both settings (all layers, layer 3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

MEASURES = ["attention", "value_weighted", "output_normalized", "contribution", "random"]


def main(argv: Sequence[str] | None = None) -> int:
    from tl_spectral.data import document_windows, tiny_shakespeare, train_val_split
    from tl_spectral.models import zoo
    from tl_spectral.probes.faithfulness import faithfulness

    ap = argparse.ArgumentParser(prog="python -m tl_spectral_studies.faithfulness_scope",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="char-shakespeare")
    ap.add_argument("--n-docs", type=int, default=32)
    ap.add_argument("--scope", default="layer")
    ap.add_argument("--level", default="token")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = zoo.load(args.model)
    _, val = train_val_split(tiny_shakespeare())
    w = document_windows(val, tok, args.n_docs, 256, seed=0,
                         bos_id=getattr(tok, "bos_id", None)).tokens
    t0 = time.perf_counter()
    res = faithfulness(model, w, measures=MEASURES, scope=args.scope, level=args.level,
                       layer=3)
    secs = time.perf_counter() - t0
    iv = res.area_intervals()
    out = {"command": f"python -m tl_spectral_studies.faithfulness_scope --model {args.model} --n-docs "
                      f"{args.n_docs} --scope {args.scope} --level {args.level}",
           "model": args.model, "scope": args.scope, "level": args.level, "mode": res.mode,
           "n_docs": res.n_docs, "n_tokens": res.n_tokens, "clean_ppl": res.clean,
           "fractions": res.fractions, "settings": res.settings, "measures": res.measures,
           "aliases": res.aliases, "seconds": round(secs, 1),
           "interval": "95% percentile bootstrap over documents, 1000 resamples, seed 0",
           "comprehensiveness_area": iv["comprehensiveness_area"].to_dict(),
           "sufficiency_area": iv["sufficiency_area"].to_dict(), "paired": []}
    pairs = [("attention", "value_weighted"), ("value_weighted", "output_normalized"),
             ("output_normalized", "contribution")]
    for si, sname in enumerate(res.settings):
        for a, b in pairs:
            d = res.area_difference(a, b, setting=si)
            out["paired"].append({"setting": sname, "a": a, "b": b, **{
                f"{crit}_a_minus_b": {"estimate": v.estimate, "low": v.low, "high": v.high}
                for crit, v in d.items()}})
    path = Path(args.out or f"docs/results/faithfulness_scope/"
                           f"{args.model.replace('-', '_')}_{args.scope}_{args.level}"
                           f"_N{args.n_docs}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(path, round(secs, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
