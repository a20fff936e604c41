"""Sink analysis of the start-token model (issue 17 item 3) beside the model without one.

    python -m tl_spectral_studies.sink_bos --model-dir DIR [--label NAME] [--n-docs 32]
        [--out docs/results/sink_bos/sink_bos.json]

DIR: a checkpoint folder of ``tl-spectral train`` (``runs/char-shakespeare-bos/final`` or
``.../checkpoints/step_XXXXXXX``) or a zoo checkpoint folder. Windows: ``n_docs`` disjoint
windows of the validation text (last 10% of the bundled Tiny Shakespeare, seed 0), each
``[BOS] + 255`` characters for the start-token model and 256 characters for the reference
``char-shakespeare`` (the same text positions). Per model: the mean attention on token 0
per layer and head over queries i >= 1 with a 95% bootstrap interval over documents
(1000 resamples, seed 0), the SinkProbe summary per layer (sink rate, anti-alignment
cos(ṽ_0, s̄), ρ*, ...) and the zero-the-sink intervention (ΔPPL per layer and all layers).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch


def _windows(tok, n_docs: int, length: int):
    from tl_spectral.data import document_windows, tiny_shakespeare, train_val_split

    _, val = train_val_split(tiny_shakespeare(), 0.1)
    return document_windows(val, tok, n_docs, length, seed=0,
                            bos_id=getattr(tok, "bos_id", None))


@torch.no_grad()
def alpha_on_first(gpt, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over queries i >= 1 of α_i0 per document, layer and head: [doc, layer, head]."""
    gpt.eval()
    out = []
    for s in range(0, tokens.shape[0], 8):
        _, pats = gpt(tokens[s:s + 8], return_patterns=True)
        out.append(torch.stack([p[:, :, 1:, 0].mean(-1) for p in pats], 1))
    return torch.cat(out).double()


def analyse(gpt, tok, label: str, n_docs: int) -> dict:
    from tl_spectral.analysis.bootstrap import mean_interval
    from tl_spectral.models.convert import to_transformer_lens
    from tl_spectral.probes import SinkProbe, run_probes
    from tl_spectral.probes.sinks import zero_sink_value

    n_ctx = gpt.cfg.n_ctx
    w = _windows(tok, n_docs, n_ctx)
    tokens = w.tokens
    a0 = alpha_on_first(gpt, tokens)
    iv = mean_interval(a0, n_resamples=1000, seed=0)
    layer_iv = mean_interval(a0.mean(-1), n_resamples=1000, seed=0)
    tl = to_transformer_lens(gpt)
    sinks = run_probes(tl, tokens, [SinkProbe()], batch_size=8, progress=False)["sinks"]
    zs = zero_sink_value(tl, tokens, batch_size=8)
    return {
        "model": label, "bos_id": getattr(tok, "bos_id", None), "n_docs": int(tokens.shape[0]),
        "window": f"{'[BOS] + ' if w.bos_id is not None else ''}"
                  f"{tokens.shape[1] - (w.bos_id is not None)} chars of the validation text",
        "alpha_on_token0_layer": {"estimate": layer_iv.estimate.tolist(),
                                  "low": layer_iv.low.tolist(), "high": layer_iv.high.tolist()},
        "alpha_on_token0_head": {"estimate": iv.estimate.tolist(), "low": iv.low.tolist(),
                                 "high": iv.high.tolist()},
        "sink_rows": sinks.to_rows(),
        "zero_the_sink": {"clean_ppl": float(zs.clean), "rows": zs.to_rows()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    from tl_spectral.data import CharTokenizer
    from tl_spectral.models import zoo
    from tl_spectral.models.gpt import load_checkpoint, read_checkpoint_config

    ap = argparse.ArgumentParser(prog="python -m tl_spectral_studies.sink_bos",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--label", default="char-shakespeare-bos")
    ap.add_argument("--n-docs", type=int, default=32)
    ap.add_argument("--out", default="docs/results/sink_bos/sink_bos.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    d = Path(args.model_dir)
    info = read_checkpoint_config(d)
    tok = CharTokenizer.from_json(json.dumps(info["tokenizer"]))
    if tok.bos_id is None:
        raise SystemExit(f"{d}: its tokenizer has no start token; pass the BOS model's folder")
    gpt = load_checkpoint(d).eval()
    ref, ref_tok = zoo.load_native("char-shakespeare")
    doc = {"command": f"python -m tl_spectral_studies.sink_bos --model-dir {args.model_dir} "
                      f"--label {args.label} --n-docs {args.n_docs}",
           "checkpoint_step": info.get("step"),
           "interval": "95% percentile bootstrap over documents, 1000 resamples, seed 0",
           "models": [analyse(gpt, tok, args.label, args.n_docs),
                      analyse(ref, ref_tok, "char-shakespeare (no start token)",
                              args.n_docs)]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for m in doc["models"]:
        print(m["model"], [round(x, 3) for x in m["alpha_on_token0_layer"]["estimate"]],
              m["zero_the_sink"]["rows"][-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
