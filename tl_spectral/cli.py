"""Command line: ``tl-spectral analyze`` (HTML report) and ``tl-spectral train``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

DEFAULT_MODEL = "char-shakespeare"


def random_reference_model(seed: int = 0):
    """A seeded random TransformerBridge of the char-shakespeare size (6L, 8H, d 128, ctx 256)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    from tl_spectral.data import CharTokenizer, tiny_shakespeare

    tok = CharTokenizer.from_text(tiny_shakespeare())
    cfg = TransformerBridgeConfig(
        d_model=128, d_head=16, n_layers=6, n_ctx=256, n_heads=8, d_vocab=tok.vocab_size,
        act_fn="gelu", normalization_type="LN", seed=seed, model_name="random-6L",
    )
    return TransformerBridge.boot_native(cfg, model_name="random-6L"), tok


def load_model(name: str) -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer from a zoo name, "random" or an HF folder."""
    if name == "random":
        return random_reference_model()
    p = Path(name)
    if p.is_dir() and (p / "config.json").exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(str(p), device="cpu")
        return model, model.tokenizer
    try:
        from tl_spectral import zoo
    except ImportError:  # the zoo arrives with the reference models
        zoo = None
    if zoo is not None:
        return zoo.load(name)
    if name == DEFAULT_MODEL:
        print("note: the trained reference model is not available; using a seeded random one",
              file=sys.stderr)
        return random_reference_model()
    raise SystemExit(
        f"unknown model {name!r}: pass 'random', a zoo name, or a local Hugging Face folder"
    )


def load_corpus(corpus: str) -> str:
    from tl_spectral.data import load_text, tiny_shakespeare

    if corpus in ("shakespeare", "tiny-shakespeare"):
        return tiny_shakespeare()
    return load_text(corpus, min_chars=100)


def analyze(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="tl-spectral analyze",
        description="Run tl_spectral's probes on a model and corpus; write an offline HTML report.",
    )
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"zoo name (default {DEFAULT_MODEL}; also char-shakespeare-noln, minilm), "
                         "'random', or a local Hugging Face folder")
    ap.add_argument("--corpus", default="shakespeare",
                    help="'shakespeare' (bundled) or the path of a UTF-8 text file")
    ap.add_argument("--n-docs", type=int, default=64, help="number of document windows")
    ap.add_argument("--length", type=int, default=256,
                    help="tokens per window (at most the model's context)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sections", default="all",
                    help="comma-separated section keys, or 'all'")
    ap.add_argument("--out", default="tl_spectral_report", help="output folder")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from tl_spectral.data import document_windows
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.sections import SECTIONS, ReportContext, build_report

    torch.manual_seed(args.seed)
    model, tokenizer = load_model(args.model)
    view = ModelView(model)
    length = args.length
    if length > view.n_ctx:
        raise SystemExit(
            f"--length {length} is longer than the model's context of {view.n_ctx}; "
            f"pass --length {view.n_ctx} or less"
        )
    text = load_corpus(args.corpus)
    windows = document_windows(text, tokenizer, args.n_docs, length, seed=args.seed)
    secs = [f() for f in SECTIONS]
    if args.sections != "all":
        wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
        known = {s.key for s in secs}
        bad = [w for w in wanted if w not in known]
        if bad:
            raise SystemExit(f"unknown sections {bad}; known: {sorted(known)}")
        secs = [s for s in secs if s.key in wanted]
    out = Path(args.out)
    ctx = ReportContext(
        view=view, tokens=windows.tokens, tokenizer=tokenizer, out_dir=out,
        results_dir=out / "results",
        options={"meta": {"corpus": args.corpus, "seed": args.seed}},
    )
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    index = build_report(ctx, secs, batch_size=args.batch_size, progress=not args.no_progress)
    print(index.resolve())
    return 0


def train(argv: Optional[list[str]] = None) -> int:
    from tl_spectral.models.train import train_cli

    return int(train_cli(list(argv or [])) or 0)


COMMANDS = {"analyze": analyze, "train": train}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: tl-spectral {analyze,train} [options]\n\n"
              "  analyze   run the probes on a model and corpus, write an offline HTML report\n"
              "  train     train a model of the project's GPT family from a JSON config\n\n"
              "'tl-spectral <command> --help' for the options of each.")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}; use one of {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
