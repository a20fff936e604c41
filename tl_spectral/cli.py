"""Command line: ``tl-spectral analyze | tokenize | train | study NAME | geometry | --version``.

Every user error is one line on stderr with exit status 2 (``--debug`` anywhere on the
command line shows the traceback instead). Arguments are validated before a model loads.

Several processes: ``torchrun --nproc_per_node P -m tl_spectral analyze ...`` (or
``tl-spectral analyze`` started by torchrun) joins the process group torchrun describes
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): NCCL with one GPU
per process when CUDA is available, else gloo. Each rank runs the probes on its contiguous
shard of the windows, the probe states are reduced across ranks, and rank 0 alone renders
and writes the report.
The studies (``tl-spectral study NAME``) live in a separate package that registers itself
under the ``tl_spectral.studies`` entry points; the library never imports it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from tl_spectral.usage import ArgumentParser, UsageError

DEFAULT_MODEL = "char-shakespeare"
#: Report sections, in report order (``--sections``); tests keep it equal to viz.sections.
SECTION_KEYS = ("attention_stats", "head_scores", "scale_pod", "routing_filtering",
                "contributions", "surgery")
#: The file that marks a folder as a report written by ``tl-spectral analyze``.
REPORT_MARKER = ".tl_spectral_report.json"
MAX_DOCS = 1_000_000


# ------------------------------------------------------------------------- models, corpora
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


def resolve_model(name: str) -> tuple[str, str]:
    """(kind, target) for ``--model``: ("zoo", name), ("random", "random") or ("hf", folder).

    A bare name is looked up in the zoo first (a local folder of the same name does not
    shadow it); a local Hugging Face folder is given as a path (with a ``/`` or starting
    with ``.``), holding ``config.json``. Raises :class:`UsageError` otherwise."""
    from tl_spectral.models import zoo

    if name == "random":
        return "random", name
    if name in zoo.available():
        return "zoo", name
    looks_like_path = "/" in name or name.startswith(".") or os.sep in name
    p = Path(name)
    if looks_like_path and p.is_dir() and (p / "config.json").is_file():
        return "hf", str(p)
    if looks_like_path and p.exists():
        raise UsageError(f"--model {name}: no config.json in that folder; pass a Hugging Face "
                         "model folder (save_pretrained output)")
    hint = f" (for the local folder, pass ./{name})" if p.is_dir() else ""
    raise UsageError(f"unknown model {name!r}{hint}; pass a zoo name "
                     f"({', '.join(zoo.available())}), 'random', or the path of a local Hugging "
                     "Face folder")


def load_model(name: str) -> tuple[Any, Any]:
    """A TransformerLens model and its tokenizer from a zoo name, "random" or an HF folder
    (see :func:`resolve_model`)."""
    kind, target = resolve_model(name)
    if kind == "random":
        return random_reference_model()
    if kind == "hf":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformer_lens.model_bridge import TransformerBridge

        model = TransformerBridge.boot_transformers(target, device="cpu")
        return model, model.tokenizer
    from tl_spectral.models import zoo

    return zoo.load(target)


def check_corpus(corpus: str) -> None:
    """``--corpus``: 'shakespeare' or an existing, non-empty UTF-8 file (else UsageError
    naming the file and, for bad UTF-8, the byte offset)."""
    if corpus in ("shakespeare", "tiny-shakespeare"):
        return
    p = Path(corpus)
    if not p.exists():
        raise UsageError(f"--corpus {corpus}: no such file; pass 'shakespeare' (bundled) or "
                         "the path of a UTF-8 text file")
    if not p.is_file():
        raise UsageError(f"--corpus {corpus} is not a file; pass a UTF-8 text file")
    raw = p.read_bytes()
    if not raw.strip():
        raise UsageError(f"--corpus {corpus} is empty; pass a UTF-8 text file with text in it")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--corpus {corpus} is not UTF-8 text: byte 0x{raw[e.start]:02x} at "
                         f"byte offset {e.start} ({e.reason}); convert it to UTF-8 (e.g. iconv "
                         "-f latin1 -t utf-8)") from None


def load_corpus(corpus: str) -> str:
    """The text of ``--corpus`` ('shakespeare' = the bundled Tiny Shakespeare)."""
    from tl_spectral.data import tiny_shakespeare

    check_corpus(corpus)
    if corpus in ("shakespeare", "tiny-shakespeare"):
        return tiny_shakespeare()
    return Path(corpus).read_text(encoding="utf-8")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """``--out``: a folder we may write a report into. A file, an unwritable place, or a
    non-empty folder that is not a tl_spectral report are refused; an earlier report only
    with ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder for the report")
    if out.is_dir() and any(out.iterdir()):
        if not (out / REPORT_MARKER).is_file():
            raise UsageError(f"--out {out} is a non-empty folder that is not a tl_spectral "
                             "report; pass an empty or new folder")
        if not overwrite:
            raise UsageError(f"--out {out} holds an earlier report; pass --overwrite to "
                             "replace it whole, or choose another folder")
    base = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not base.is_dir():
        raise UsageError(f"--out {out}: {base} is a file, not a folder; pass a folder")
    try:  # a real probe: permission bits say little when running as root
        tempfile.TemporaryDirectory(dir=base).cleanup()
    except OSError as e:
        raise UsageError(f"--out {out}: {base} is not writable ({e.strerror}); pass a folder "
                         "you can write to") from None


def _int_in(ap: ArgumentParser, name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise UsageError(f"{ap.prog}: --{name} {value} is out of range; pass an integer in "
                         f"[{lo}, {hi:,}]")


# ------------------------------------------------------------------------------- analyze
def analyze(argv: Optional[list[str]] = None) -> int:
    ap = ArgumentParser(
        prog="tl-spectral analyze",
        description="Run tl_spectral's probes on a model and corpus; write an offline HTML report.",
    )
    from tl_spectral.models.zoo import available

    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"zoo name ({', '.join(available())}; default {DEFAULT_MODEL}), "
                         "'random', or the path of a local Hugging Face folder (./name)")
    ap.add_argument("--corpus", default=None,
                    help="'shakespeare' (bundled; the default) or the path of a UTF-8 text file")
    ap.add_argument("--tokens", default=None,
                    help="a token file (tl-spectral tokenize) to read windows from lazily, "
                         "batch by batch, instead of --corpus")
    ap.add_argument("--stream-rank", type=int, default=None,
                    help="scale POD with constant-memory statistics of rank cap K (two passes; "
                         "H* above K reads '> K'); default: keep every window's field")
    ap.add_argument("--n-docs", type=int, default=64, help="number of document windows")
    ap.add_argument("--length", type=int, default=256,
                    help="tokens per window (at most the model's context)")
    ap.add_argument("--overlap", action="store_true",
                    help="draw windows at random offsets (they may overlap) instead of "
                         "disjoint ones, for corpora too short for --n-docs × --length")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sections", default="all",
                    help=f"comma-separated section keys ({', '.join(SECTION_KEYS)}) or 'all'")
    ap.add_argument("--fields", default="attention",
                    help="comma-separated per-pair fields whose scale POD the scale_pod section "
                         "reports (attention, contribution, contribution_intra, value_weighted, "
                         "value_weighted_raw; default attention), all from the same pass")
    ap.add_argument("--faithfulness-docs", type=int, default=0,
                    help="also compute faithfulness curves on that many documents (slow)")
    ap.add_argument("--out", default="tl_spectral_report", help="output folder")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier report in --out (whole: no stale files)")
    ap.add_argument("--save-raw", action="store_true",
                    help="keep raw per-query maps in results/ (whole mean patterns, every "
                         "layer's contribution maps, POD modes); default: what the report "
                         "and a reload need")
    ap.add_argument("--baseline", default="none", choices=("none", "random"),
                    help="random: also run the same configuration re-initialised on the same "
                         "windows and add its H*, T_spec and scale shares beside the model's "
                         "(about one more probe pass and scale POD)")
    ap.add_argument("--figure-format", default="png", choices=("png", "svg"),
                    help="how figures are embedded: png (default) or svg (vector, larger)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    # --- every argument is checked before the model loads
    _int_in(ap, "n-docs", args.n_docs, 1, MAX_DOCS)
    _int_in(ap, "length", args.length, 2, 1 << 20)
    _int_in(ap, "batch-size", args.batch_size, 1, 1 << 16)
    _int_in(ap, "faithfulness-docs", args.faithfulness_docs, 0, args.n_docs)
    if args.stream_rank is not None:
        _int_in(ap, "stream-rank", args.stream_rank, 1, 1 << 16)
    if args.tokens is not None and args.corpus is not None:
        raise UsageError("tl-spectral analyze: pass either --corpus or --tokens, not both")
    if args.corpus is None:
        args.corpus = "shakespeare"
    sections = list(SECTION_KEYS)
    if args.sections != "all":
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        bad = [s for s in sections if s not in SECTION_KEYS]
        if bad or not sections:
            raise UsageError(f"unknown sections {bad or [args.sections]}; known: "
                             f"{', '.join(SECTION_KEYS)} (or 'all')")
    fields = _scale_pod_fields(args.fields, sections)
    kind, target = resolve_model(args.model)
    token_file = None
    if args.tokens is not None:
        token_file = open_token_file(args.tokens, args.model)
    else:
        check_corpus(args.corpus)
    dist_env = torchrun_env()
    rank0 = dist_env is None or dist_env[0] == 0
    out = Path(args.out)
    if rank0:
        check_out_dir(out, args.overwrite)

    import time

    import torch

    if dist_env is not None:
        _init_process_group(*dist_env)
        if not rank0:
            args.no_progress = True

    t0 = time.perf_counter()

    def status(msg: str) -> None:
        if not args.no_progress:
            print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)

    torch.manual_seed(args.seed)
    text = load_corpus(args.corpus) if token_file is None else ""
    tokenizer = None
    if kind == "zoo":  # the char models' tokenizer and context, before their weights
        from tl_spectral.models import zoo

        if target in zoo.SHIPPED:
            info = zoo.checkpoint_info(target)
            n_ctx = int(info["model"]["n_ctx"])
            if args.length > n_ctx:
                raise UsageError(f"--length {args.length} is longer than {target}'s context of "
                                 f"{n_ctx}; pass --length {n_ctx} or less")
            tokenizer = zoo._char_tokenizer(info)
    windows = None
    if token_file is not None:
        if getattr(tokenizer, "bos_id", None) is not None:
            raise UsageError(f"--tokens: {args.model} was trained with a start token and "
                             "token-file windows are not framed with one yet; pass --corpus")
        try:
            windows = token_file.windows(args.n_docs, args.length, seed=args.seed,
                                         overlap=args.overlap)
        except ValueError as e:
            hint = "" if args.overlap else "; or pass --overlap to draw overlapping windows"
            raise UsageError(f"--tokens {args.tokens}: {e}{hint}") from None
    elif tokenizer is not None:
        windows = _windows(text, tokenizer, args)
    status(f"loading {args.model}")
    model, tokenizer = load_model(args.model)
    if dist_env is not None and torch.cuda.is_available():
        model = model.to(f"cuda:{dist_env[2]}")

    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.sections import SECTIONS, ReportContext, build_report

    view = ModelView(model)
    if args.length > view.n_ctx:
        raise UsageError(f"--length {args.length} is longer than the model's context of "
                         f"{view.n_ctx}; pass --length {view.n_ctx} or less")
    framing = "disjoint windows of the corpus" if not args.overlap else "windows at random offsets"
    if token_file is not None and getattr(tokenizer, "bos_id", None) is not None:
        raise UsageError(f"--tokens: {args.model} was trained with a start token and token-file "
                         "windows are not framed with one yet; pass --corpus instead")
    if windows is not None and getattr(windows, "bos_id", None) is not None:
        framing += ", each after the model's start token"
    mask = None
    if not view.causal and token_file is not None:
        raise UsageError(f"--tokens: {args.model} is bidirectional; its windows are framed "
                         "by its special tokens from the text, pass --corpus instead")
    if not view.causal:
        status("cutting sentence-aligned windows framed by the model's special tokens")
        tokens, mask, framing = _encoder_windows(text, tokenizer, args)
    else:
        if windows is None:
            windows = _windows(text, tokenizer, args)
        # token-file windows stay lazy: the runner reads them batch by batch
        tokens = windows if token_file is not None else windows.tokens
    name = _display_name(args.model, kind)
    secs = [f() for f in SECTIONS]
    secs = [s for s in secs if s.key in sections]
    corpus_name = args.corpus if token_file is None else str(args.tokens)
    if token_file is not None:
        framing = "disjoint windows of the token file" if not args.overlap else \
            "windows of the token file at random offsets"
    options = {"meta": {"corpus": corpus_name, "seed": args.seed},
               "faithfulness_docs": args.faithfulness_docs, "windows": framing,
               "save_raw": args.save_raw, "progress": not args.no_progress,
               "stream_rank": args.stream_rank, "fields": fields,
               "figure_format": args.figure_format, "baseline": args.baseline}
    results = None
    if dist_env is not None:  # every rank runs its shard; the states reduce across ranks
        import torch.distributed as dist

        from tl_spectral.probes import run_probes

        with tempfile.TemporaryDirectory() as scratch:
            pctx = ReportContext(view=view, tokens=tokens, tokenizer=tokenizer,
                                 out_dir=Path(scratch), results_dir=Path(scratch), mask=mask,
                                 model_name=name, options=dict(options))
            probes = [p for s in secs for p in s.probes(pctx)]
            status(f"probes: rank {dist_env[0]} of {dist_env[1]} runs its shard of "
                   f"{len(tokens)} windows")
            results = run_probes(view, tokens, probes, batch_size=args.batch_size,
                                 progress=not args.no_progress, attention_mask=mask)
        dist.destroy_process_group()  # rendering runs on rank 0 alone, in one process
        if not rank0:
            return 0
    # write into a fresh sibling folder, then swap it in: an earlier report is replaced
    # whole (no stale files) and nothing is lost if this run fails half-way
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        ctx = ReportContext(
            view=view, tokens=tokens, tokenizer=tokenizer, out_dir=tmp,
            results_dir=tmp / "results", mask=mask, model_name=name, options=options,
        )
        ctx._t0 = t0
        ctx.results_dir.mkdir(parents=True, exist_ok=True)
        build_report(ctx, secs, batch_size=args.batch_size, progress=not args.no_progress,
                     results=results)
        (tmp / REPORT_MARKER).write_text(json.dumps({
            "tool": "tl-spectral analyze", "model": args.model, "corpus": corpus_name,
            "n_docs": args.n_docs, "length": args.length, "seed": args.seed,
            "processes": 1 if dist_env is None else dist_env[1]}) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a report is the user's folder
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print((out / "index.html").resolve())
    return 0


def _scale_pod_fields(value: str, sections: list[str]) -> list[str]:
    """The ``--fields`` list, checked: known kinds, none twice, and the scale_pod section on."""
    from tl_spectral.probes.pair_fields import FIELD_KINDS

    fields = [f.strip() for f in value.split(",") if f.strip()]
    bad = [f for f in fields if f not in FIELD_KINDS]
    if bad or not fields:
        raise UsageError(f"--fields: unknown field(s) {bad or [value]}; pass comma-separated "
                         f"fields of {', '.join(FIELD_KINDS)}")
    if len(set(fields)) != len(fields):
        raise UsageError(f"--fields {value!r} names a field twice; pass each once")
    if fields != ["attention"] and "scale_pod" not in sections:
        raise UsageError("--fields is reported by the scale_pod section, which --sections "
                         "leaves out; add scale_pod to --sections")
    return fields


def _windows(text: str, tokenizer, args):
    from tl_spectral.data import CharTokenizer, document_windows

    # a char model's alphabet is small: common Unicode punctuation is normalised to ASCII and
    # what is still unknown is dropped, with a one-line note of what was dropped
    unknown = "drop" if isinstance(tokenizer, CharTokenizer) else None
    try:
        # a model trained with a start token sees it in front of every window
        w = document_windows(text, tokenizer, args.n_docs, args.length, seed=args.seed,
                             overlap=args.overlap, unknown=unknown,
                             bos_id=getattr(tokenizer, "bos_id", None))
    except ValueError as e:
        hint = "" if args.overlap else "; or pass --overlap to draw overlapping windows"
        raise UsageError(f"--corpus {args.corpus}: {e}{hint}") from None
    report = getattr(w, "encode_report", None)
    if report is not None and report.changed:
        print(f"note: {report.note()}", file=sys.stderr)
    return w


def torchrun_env() -> Optional[tuple[int, int, int]]:
    """``(rank, world_size, local_rank)`` when started by torchrun with more than one
    process (its ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), else None."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UsageError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer; start "
                         "several processes with torchrun --nproc_per_node P") from None
    if world <= 1:
        return None
    if "RANK" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise UsageError("WORLD_SIZE is set but RANK or MASTER_ADDR is not; start several "
                         "processes with torchrun --nproc_per_node P -m tl_spectral analyze ...")
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0"))


def _init_process_group(rank: int, world: int, local_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)


def open_token_file(path: str, model: str):
    """``--tokens``: a readable token file written for ``model`` (else UsageError)."""
    from tl_spectral.data.tokenfile import TokenFile

    try:
        tf = TokenFile(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--tokens {path}: {_one_line(e)}") from None
    if tf.model and tf.model != model:
        raise UsageError(f"--tokens {path} was tokenized for --model {tf.model}, not {model}; "
                         f"pass --model {tf.model} or tokenize again with --model {model}")
    return tf


def _display_name(model: str, kind: str) -> str:
    """The model's name for titles: the zoo name; for a local Hugging Face folder the model's
    own name from its config.json (``_name_or_path`` when it is a hub name, not a path; else
    the folder's name with the architecture, e.g. "smol (LlamaForCausalLM)"), or the folder's
    last component when the config says nothing."""
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


def _encoder_windows(text: str, tokenizer, args):
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap_in(new: Path, out: Path) -> None:
    """Replace ``out`` (an earlier report, or absent/empty) by the folder ``new``."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(new, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------ tokenize
def tokenizer_for(name: str):
    """The tokenizer of ``--model`` without loading its weights where that is possible (the
    shipped char models, 'random', a Hugging Face folder)."""
    kind, target = resolve_model(name)
    from tl_spectral.data import CharTokenizer, tiny_shakespeare

    if kind == "random":
        return CharTokenizer.from_text(tiny_shakespeare())
    if kind == "zoo":
        from tl_spectral.models import zoo

        if target in zoo.SHIPPED:
            return zoo._char_tokenizer(zoo.checkpoint_info(target))
        return load_model(name)[1]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target)


def tokenize(argv: Optional[list[str]] = None) -> int:
    ap = ArgumentParser(
        prog="tl-spectral tokenize",
        description="Tokenize text into a token file (memory-mapped ids with document "
                    "offsets) that analyze --tokens reads window by window.",
    )
    ap.add_argument("text", nargs="+", metavar="TEXT",
                    help="'shakespeare' (bundled) or UTF-8 text files; each is one document")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="whose tokenizer: a zoo name, 'random', or a local Hugging Face folder")
    ap.add_argument("-o", "--out", required=True, help="the token file to write")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_file():
        raise UsageError(f"tl-spectral tokenize: -o {out} is a folder; pass a file path")
    if out.exists() and not args.overwrite:
        raise UsageError(f"tl-spectral tokenize: -o {out} exists; pass --overwrite to replace "
                         "it, or choose another file")
    if not out.parent.exists():
        raise UsageError(f"tl-spectral tokenize: -o {out}: no folder {out.parent}; create it "
                         "first")
    for t in args.text:
        check_corpus(t)
    resolve_model(args.model)
    tok = tokenizer_for(args.model)

    from tl_spectral.data import CharTokenizer
    from tl_spectral.data.tokenfile import write_token_file
    from tl_spectral.data.windows import encode

    unknown = "drop" if isinstance(tok, CharTokenizer) else None

    def docs():
        for t in args.text:
            ids = encode(tok, load_corpus(t), unknown)
            report = getattr(tok, "last_report", None)
            if report is not None and report.changed:
                print(f"note: {t}: {report.note()}", file=sys.stderr)
            yield ids

    vocab = getattr(tok, "vocab_size", None)
    if not isinstance(vocab, int) and hasattr(tok, "__len__"):
        vocab = len(tok)
    if hasattr(tok, "__len__") and not isinstance(tok, CharTokenizer):
        vocab = max(int(vocab or 0), len(tok))
    path = write_token_file(out, docs(), model=args.model, vocab_size=vocab,
                            overwrite=args.overwrite)
    from tl_spectral.data.tokenfile import TokenFile

    tf = TokenFile(path)
    print(f"{path.resolve()}: {tf.n_tokens:,} tokens in {tf.n_docs} document(s) for "
          f"--model {args.model}")
    return 0


# --------------------------------------------------------------------------------- train
def train(argv: Optional[list[str]] = None) -> int:
    argv = list(argv or [])
    ap = ArgumentParser(prog="tl-spectral train", add_help=False)
    ap.add_argument("--config")
    ap.add_argument("--steps", type=int)
    known, _ = ap.parse_known_args(argv)
    if known.config is not None and "-h" not in argv and "--help" not in argv:
        p = Path(known.config)
        if not p.is_file():
            raise UsageError(f"tl-spectral train: no config file at {p}; pass --config FILE "
                             "(a JSON file with model/data/train sections, e.g. configs/"
                             "char-shakespeare.json)")
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"tl-spectral train: {p} is not valid JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
            raise UsageError(f"tl-spectral train: {p} has no 'model' section; a config holds "
                             '{"model": {...}, "data": {...}, "train": {...}}')
        from tl_spectral.models.gpt import GPTConfig
        from tl_spectral.models.train import TrainConfig

        try:
            mdoc = {k: v for k, v in doc["model"].items() if v != "auto"}
            if "vocab_size" not in mdoc:
                mdoc["vocab_size"] = 2
            GPTConfig.from_dict(mdoc)
            TrainConfig.from_dict(dict(doc.get("train", {})))
        except (TypeError, ValueError, KeyError) as e:
            raise UsageError(f"tl-spectral train: {p}: {e}") from None
    if known.steps is not None and known.steps < 1:
        raise UsageError(f"tl-spectral train: --steps {known.steps} is out of range; pass a "
                         "positive number of optimizer steps")
    from tl_spectral.models.train import train_cli

    return int(train_cli(argv) or 0)


# ----------------------------------------------------------------------------- geometry
def geometry(argv: Optional[list[str]] = None) -> int:
    ap = ArgumentParser(prog="tl-spectral geometry",
                        description="Per-head routing/filtering geometry of a model's QK "
                                    "weights (SPEC B.1): a table, a CSV and a figure.")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="zoo name, 'random', or the path of a local Hugging Face folder")
    ap.add_argument("--out", default=None,
                    help="folder for heads.csv, layers.csv and geometry.png (default: print only)")
    ap.add_argument("--no-fold-ln", action="store_true", help="do not fold the normalization")
    ap.add_argument("--allow-rotary", action="store_true",
                    help="analyse rotary models anyway (the kernel at offset 0)")
    args = ap.parse_args(argv)
    kind, target = resolve_model(args.model)
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder")

    from tl_spectral.geometry.model import (
        UnreadableHeadsError,
        geometry_layer_table,
        model_qk_geometry,
    )
    from tl_spectral.models import zoo

    if kind == "zoo" and target in zoo.SHIPPED:
        model, _ = zoo.load_native(target)  # native weights: S–D layers stay readable
    else:
        model, _ = load_model(args.model)
    try:
        geo = model_qk_geometry(model, fold_ln=not args.no_fold_ln,
                                allow_rotary=args.allow_rotary)
    except UnreadableHeadsError as e:
        raise UsageError(f"tl-spectral geometry --model {args.model}: {e}") from None
    rows = geometry_layer_table(geo)
    keys = list(rows[0])
    print(f"# {args.model}: QK geometry per layer (means over heads)")
    print(",".join(keys))
    for r in rows:
        print(",".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    if out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out.mkdir(parents=True, exist_ok=True)
        geo.to_csv(out / "heads.csv")
        with open(out / "layers.csv", "w", encoding="utf-8") as f:
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join(str(r[k]) for k in keys) + "\n")
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
        geo.plot_budget(ax=axes[0])
        geo.plot_routing_rank(ax=axes[1], show_capacity=True)
        geo.plot_eigenvalues(ax=axes[2])
        fig.suptitle(args.model, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "geometry.png", dpi=100)
        plt.close(fig)
        print(out.resolve())
    return 0


# -------------------------------------------------------------------------------- study
STUDY_GROUP = "tl_spectral.studies"


def _study_entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=STUDY_GROUP)}


def study(argv: Optional[list[str]] = None) -> int:
    argv = list(argv or [])
    eps = _study_entry_points()
    names = sorted(eps)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: tl-spectral study NAME [--quick] [--out DIR] [options]\n\n"
              "The paper reproductions; NAME is one of: " + ", ".join(names or ["(none)"])
              + "\n'tl-spectral study NAME --help' for the options of each.")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in eps:
        if not eps:
            raise UsageError("no studies are installed (the tl_spectral_studies package "
                             "ships with tl-spectral; reinstall it)")
        raise UsageError(f"unknown study {name!r}; use one of {', '.join(names)}")
    module = eps[name].load()
    return int(module.main(rest, prog=f"tl-spectral study {name}") or 0)


# --------------------------------------------------------------------------------- main
COMMANDS = {"analyze": analyze, "tokenize": tokenize, "train": train, "study": study,
            "geometry": geometry}

USAGE = """usage: tl-spectral {analyze,tokenize,train,study,geometry} [options] | --version

  analyze    run the probes on a model and corpus, write an offline HTML report
  tokenize   tokenize text into a token file that analyze --tokens reads lazily
  train      train a model of the project's GPT family from a JSON config
  study      the paper reproductions: study NAME (routing, surgery, scale-pod, contributions)
  geometry   per-head routing/filtering table of a model's QK weights (CSV + figure)

'tl-spectral <command> --help' for the options of each; --debug shows tracebacks."""


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] in ("--version", "-V"):
        from tl_spectral import __version__

        print(f"tl-spectral {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"tl-spectral: unknown command {cmd!r}; use one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        return COMMANDS[cmd](rest)
    except KeyboardInterrupt:
        print("tl-spectral: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ValueError, OSError) as e:
        if debug:
            raise
        msg = _one_line(e)
        print(msg if msg.startswith("tl-spectral") else f"tl-spectral {cmd}: error: {msg}",
              file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an internal error: one line, --debug for more
        if debug:
            raise
        print(f"tl-spectral {cmd}: internal error ({type(e).__name__}): {_one_line(e)} "
              "(run again with --debug for the traceback)", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError) and e.filename and str(e.filename) not in msg:
        msg = f"{msg}: {e.filename}"
    return " ".join(msg.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
