"""What ``tl-spectral analyze`` reads besides the model: the token file (``--tokens``), the
windows it cuts from a corpus (a decoder's, or a bidirectional encoder's framed by its own
special tokens), and the model's name for titles. Imported by :mod:`tl_spectral.cli`, which
re-exports these names."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from tl_spectral.usage import UsageError
from tl_spectral.usage import one_line as _one_line

__all__ = ["open_token_file"]


def corpus_windows(text: str, tokenizer, args, bos_id=None):
    from tl_spectral.data import CharTokenizer, document_windows

    # a char model's alphabet is small: common Unicode punctuation is normalised to ASCII and
    # what is still unknown is dropped, with a one-line note of what was dropped
    unknown = "drop" if isinstance(tokenizer, CharTokenizer) else None
    try:
        # a model trained with a start token sees it in front of every window
        w = document_windows(text, tokenizer, args.n_docs, args.length, seed=args.seed,
                             overlap=args.overlap, unknown=unknown,
                             bos_id=getattr(tokenizer, "bos_id", bos_id))
    except ValueError as e:
        hint = "" if args.overlap else "; or pass --overlap to draw overlapping windows"
        raise UsageError(f"--corpus {args.corpus}: {e}{hint}") from None
    report = getattr(w, "encode_report", None)
    if report is not None and report.changed:
        print(f"note: {report.note()}", file=sys.stderr)
    return w


def open_token_file(path: str, model: str, *, model_ok: bool = False):
    """``--tokens``: a readable token file written for ``model`` (else UsageError). A file
    that records no model (``write_token_file`` without ``model=``) could hold any
    tokenizer's ids: refused unless ``model_ok`` (``--tokens-model-ok``)."""
    from tl_spectral.data.tokenfile import TokenFile

    try:
        tf = TokenFile(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokens {path}: {_one_line(e)}") from None
    if not tf.model and not model_ok:
        raise UsageError(
            f"--tokens {path} records no model (written by write_token_file without model=), "
            f"so its ids may be another tokenizer's: tokenize again with `tl-spectral "
            f"tokenize ... --model {model}`, or pass --tokens-model-ok if they are {model}'s")
    if tf.model and not same_model(tf.model, model):
        raise UsageError(f"--tokens {path} was tokenized for --model {tf.model}, not {model}; "
                         f"pass --model {tf.model} or tokenize again with --model {model}")
    return tf


def same_model(recorded: str, model: str) -> bool:
    """Whether a token file's ``model`` names ``--model``: the same string, or, for local
    folders, the same folder however it is written (``../m`` and ``/abs/m``)."""
    if recorded == model:
        return True
    looks = [("/" in m or m.startswith(".") or os.sep in m or m.lower().endswith(".gguf"))
             for m in (recorded, model)]
    if not all(looks):
        return False
    try:
        return Path(recorded).resolve() == Path(model).resolve()
    except OSError:
        return False


def display_name(model: str, kind: str) -> str:
    """The model's name for titles: the zoo name; for a local Hugging Face folder the model's
    own name from its config.json (``_name_or_path`` when it is a hub name, not a path; else
    the folder's name with the architecture, e.g. "smol (LlamaForCausalLM)"), or the folder's
    last component when the config says nothing."""
    if kind == "gguf":
        return Path(model).name
    if kind != "hf":
        return model
    folder = Path(model).resolve()
    name = folder.name or model
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return name
    hub = str(cfg.get("_name_or_path") or "")
    if hub and not Path(hub).is_absolute() and not hub.startswith(".") and \
            not Path(hub).exists() and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", hub):
        return hub
    arch = cfg.get("architectures") or []
    if arch and isinstance(arch[0], str):
        return f"{name} ({arch[0]})"
    return name


_SENTENCE_END = re.compile(r"(?:[.!?;:]\s+|\n\s*)")


def encoder_windows(text: str, tokenizer, args):
    """Windows for a bidirectional model: ``[CLS] … [SEP]`` (the model's own special
    tokens) around ``length − 2`` tokens of running text that start at a sentence or line
    start, so position 0 is ``[CLS]`` as in the model's training. Disjoint windows (or, with
    ``--overlap``, any sentence starts), drawn with ``--seed``. Returns (tokens, mask, text
    describing the framing)."""
    import random

    import torch

    cls_id = getattr(tokenizer, "cls_token_id", None)
    sep_id = getattr(tokenizer, "sep_token_id", None)
    if cls_id is None:
        cls_id = getattr(tokenizer, "bos_token_id", None)
    if sep_id is None:
        sep_id = getattr(tokenizer, "eos_token_id", None)
    body = args.length - (cls_id is not None) - (sep_id is not None)
    if body < 1:
        raise UsageError(f"--length {args.length} is too short for an encoder window; pass 3 "
                         "or more")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                    verbose=False)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    starts_chars = {0} | {m.end() for m in _SENTENCE_END.finditer(text)}
    cand = [i for i, (a, _) in enumerate(offsets) if a in starts_chars and i + body <= len(ids)]
    rng = random.Random(args.seed)
    rng.shuffle(cand)
    chosen: list[int] = []
    if args.overlap:
        chosen = cand[: args.n_docs]
    else:
        taken: list[tuple[int, int]] = []
        import bisect

        for c in cand:
            j = bisect.bisect_left(taken, (c, c))
            if j > 0 and taken[j - 1][1] > c:
                continue
            if j < len(taken) and taken[j][0] < c + body:
                continue
            taken.insert(j, (c, c + body))
            chosen.append(c)
            if len(chosen) == args.n_docs:
                break
    if len(chosen) < args.n_docs:
        hint = "" if args.overlap else "; or pass --overlap to let windows overlap"
        raise UsageError(f"--corpus {args.corpus}: only {len(chosen)} sentence-aligned windows "
                         f"of {args.length} tokens fit; pass a smaller --n-docs or --length"
                         f"{hint}")
    chosen.sort()
    rows = []
    for c in chosen:
        row = ([cls_id] if cls_id is not None else []) + list(ids[c:c + body])
        rows.append(row + ([sep_id] if sep_id is not None else []))
    tokens = torch.tensor(rows, dtype=torch.long)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    cls_s = getattr(tokenizer, "cls_token", None) or "first special token"
    sep_s = getattr(tokenizer, "sep_token", None) or "last special token"
    framing = (f"sentence-aligned windows framed as {cls_s} … {sep_s}; position 0 is {cls_s}"
               if cls_id is not None else "sentence-aligned windows")
    return tokens, mask, framing
