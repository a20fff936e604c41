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
from argparse import BooleanOptionalAction
from pathlib import Path
from typing import Any, Optional

from tl_spectral.files import current_umask
from tl_spectral.outdirs import (  # noqa: F401 - the CLI's names for them
    DirLock as _DirLock,
)
from tl_spectral.outdirs import (
    out_leftover_patterns as _out_leftover_patterns,
)
from tl_spectral.outdirs import (
    out_path,
)
from tl_spectral.outdirs import (
    path_identity as _identity,
)
from tl_spectral.outdirs import (
    remove_dead_leftovers as _remove_dead_leftovers,
)
from tl_spectral.outdirs import (
    swap_in as _swap_in,
)
from tl_spectral.outdirs import (
    tmp_out_dir as _tmp_out_dir,
)
from tl_spectral.usage import ArgumentParser, UsageError, disk_full, disk_full_message
from tl_spectral.usage import one_line as _one_line

# OpenMP threads that spin while they wait turn small batched linear algebra (the rotary
# geometry's per-head eigenvalues) 30-1000x slower when another process holds a core (seen on
# a 2-core machine: 250 s instead of 1.6 s). Passive waiting costs little on a quiet machine.
# Read by the OpenMP runtime when torch loads, which the command line does later.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_MODEL = "char-shakespeare"
from tl_spectral.outdirs import REPORT_MARKER  # noqa: E402,F401 - the report's marker file

#: The file that marks a folder written by ``tl-spectral geometry --out``.
GEOMETRY_MARKER = ".tl_spectral_geometry.json"
MAX_DOCS = 1_000_000
#: --seed: what torch.manual_seed and the window draws take.
MAX_SEED = 2**63 - 1
#: the per-rank scratch folders of ``torchrun ... analyze`` (in the temp folder).
RANK_SCRATCH_PATTERN = r"tl_spectral-analyze-rank\d+-(?P<pid>\d+)-[A-Za-z0-9_]+"


# ------------------------------------------------------------------------- models, corpora
def _check_finite_weights(model: Any, name: str) -> None:
    """Every parameter of the user's model is finite (else UsageError naming the first
    that is not: the model is damaged, not the program)."""
    import torch

    for pname, p in model.named_parameters():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            bad = int((~torch.isfinite(p)).sum())
            raise UsageError(f"--model {name}: weight {pname} holds {bad} NaN/inf value(s); "
                             "the model is damaged (or diverged in training): pass a model "
                             "with finite weights")


def check_corpus(corpus: str) -> None:
    """See :func:`tl_spectral.data.corpora.check_corpus` (kept here; imported on use, so the
    command line starts without torch)."""
    from tl_spectral.data.corpora import check_corpus as _f

    return _f(corpus)


def load_corpus(corpus: str) -> str:
    """See :func:`tl_spectral.data.corpora.load_corpus` (kept here for the studies)."""
    from tl_spectral.data.corpora import load_corpus as _f

    return _f(corpus)


def random_reference_model(seed: int = 0):
    """See :func:`tl_spectral.models.loading.random_reference_model` (re-exported here)."""
    from tl_spectral.models.loading import random_reference_model as _f

    return _f(seed)


def resolve_model(name: str) -> tuple[str, str]:
    """See :func:`tl_spectral.models.loading.resolve_model` (re-exported here)."""
    from tl_spectral.models.loading import resolve_model as _f

    return _f(name)


def load_model(name: str) -> tuple[Any, Any]:
    """Deprecated: use ``tls.load_model(name)`` (:func:`tl_spectral.models.loading.load_model`)."""
    from tl_spectral._deprecation import warn_deprecated

    warn_deprecated("tl_spectral.cli.load_model", "tl_spectral.load_model")
    return load_named_model(name)


def load_named_model(name: str) -> tuple[Any, Any]:
    """A model and its tokenizer by ``--model`` name:
    :func:`tl_spectral.models.loading.load_named_model` (imported when called: the command
    line starts without torch); a package the model needs that is not installed is a
    :class:`UsageError` naming it."""
    from tl_spectral.models.loading import load_named_model as _f

    try:
        return _f(name)
    except ImportError as e:  # a package the model needs is not installed: say which
        raise UsageError(_one_line(e)) from None


def check_out_dir(out: Path, overwrite: bool, *, marker: str = REPORT_MARKER,
                  what: str = "report") -> None:
    """``--out``: a folder we may write a report into. A file, an unwritable place, or a
    non-empty folder that is not a tl_spectral report are refused; an earlier report only
    with ``overwrite``. (``marker``/``what``: the file that marks, and the name of, another
    kind of output folder, e.g. ``tl-spectral geometry``'s).
    """
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link; pass the folder it points to "
                         f"({out.resolve()}) or a new folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder for the {what}")
    if out.is_dir() and any(out.iterdir()):
        if not (out / marker).is_file():
            raise UsageError(f"--out {out} is a non-empty folder that is not a tl_spectral "
                             f"{what}; pass an empty or new folder")
        if not overwrite:
            raise UsageError(f"--out {out} holds an earlier {what}; pass --overwrite to "
                             "replace it whole, or choose another folder")
    base = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not base.is_dir():
        raise UsageError(f"--out {out}: {base} is a file, not a folder; pass a folder")
    try:  # a real probe: permission bits say little when running as root
        tempfile.TemporaryDirectory(dir=base).cleanup()
    except OSError as e:
        raise UsageError(f"--out {out}: {base} is not writable ({e.strerror}); pass a folder "
                         "you can write to") from None


#: The shortest ``--length``: the scale POD (and the wavelets' default scales) need T ≥ 4.
MIN_LENGTH = 4


def _int_in(ap: ArgumentParser, name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        why = " (the scale POD needs at least 4 tokens per window)" if (
            name == "length" and value < MIN_LENGTH) else ""
        raise UsageError(f"{ap.prog}: --{name} {value} is out of range; pass an integer in "
                         f"[{lo}, {hi:,}]{why}")


# ------------------------------------------------------------------------------- analyze
def analyze(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral analyze``: the probes on a model and corpus, an offline HTML report."""
    # Long on purpose: a command, read top to bottom: every argument checked before the model
    # loads, then the run; each step is a helper.
    ap = ArgumentParser(
        prog="tl-spectral analyze",
        description="Run tl_spectral's probes on a model and corpus; write an offline HTML report.",
    )
    from tl_spectral.models.zoo import available
    from tl_spectral.viz.sections import section_keys as _keys

    section_keys = _keys()  # the one registry: each section module registers itself
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help=f"zoo name ({', '.join(available())}; default {DEFAULT_MODEL}), "
                         "'random', or the path of a local Hugging Face folder (./name)")
    ap.add_argument("--corpus", default=None,
                    help="'shakespeare' (bundled; the default) or the path of a UTF-8 text file")
    ap.add_argument("--tokens", default=None,
                    help="a token file (tl-spectral tokenize) to read windows from lazily, "
                         "batch by batch, instead of --corpus")
    ap.add_argument("--tokens-model-ok", action="store_true",
                    help="use a --tokens file that records no model (written by "
                         "write_token_file without model=) with --model: you vouch that its "
                         "ids are --model's tokenizer's")
    ap.add_argument("--stream-rank", type=int, default=None,
                    help="scale POD with constant-memory statistics of rank cap K (two passes; "
                         "H* above K reads '> K'); default: keep every window's field")
    ap.add_argument("--n-docs", type=int, default=64, help="number of document windows")
    ap.add_argument("--length", type=int, default=256,
                    help="tokens per window (at most the model's context)")
    ap.add_argument("--overlap", action="store_true",
                    help="draw windows at random offsets (they may overlap) instead of "
                         "disjoint ones, for corpora too short for --n-docs × --length")
    ap.add_argument("--bos", action=BooleanOptionalAction, default=None,
                    help="put the model's start token in front of every window, as "
                         "TransformerLens' prepend_bos does (default: the zoo model's "
                         "convention: on for smollm2-135m, off for Hugging Face folders and "
                         "'random'; the character models follow their training)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sections", default="all",
                    help=f"comma-separated section keys ({', '.join(section_keys)}) or 'all'")
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
    _int_in(ap, "length", args.length, MIN_LENGTH, 1 << 20)
    _int_in(ap, "batch-size", args.batch_size, 1, 1 << 16)
    _int_in(ap, "faithfulness-docs", args.faithfulness_docs, 0, args.n_docs)
    _int_in(ap, "seed", args.seed, 0, MAX_SEED)
    if args.stream_rank is not None:
        _int_in(ap, "stream-rank", args.stream_rank, 1, 1 << 16)
    if args.tokens is not None and args.corpus is not None:
        raise UsageError("tl-spectral analyze: pass either --corpus or --tokens, not both")
    if args.corpus is None:
        args.corpus = "shakespeare"
    sections = list(section_keys)
    if args.sections != "all":
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        bad = [s for s in sections if s not in section_keys]
        if bad or not sections:
            raise UsageError(f"unknown sections {bad or [args.sections]}; known: "
                             f"{', '.join(section_keys)} (or 'all')")
    fields = _scale_pod_fields(args.fields, sections)
    kind, target = resolve_model(args.model)
    token_file = None
    if args.tokens is not None:
        token_file = open_token_file(args.tokens, args.model,
                                     model_ok=args.tokens_model_ok)
    else:
        check_corpus(args.corpus)
    dist_env = torchrun_env()
    rank0 = dist_env is None or dist_env[0] == 0
    out = out_path(args.out)
    out_id = None
    if rank0:
        check_out_dir(out, args.overwrite)
        out_id = _identity(out)  # the swap at the end replaces only this folder
        _remove_dead_leftovers(out.parent, _out_leftover_patterns(out))

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
            if args.bos is not None and args.bos != (tokenizer.bos_id is not None):
                raise UsageError(f"--{'' if args.bos else 'no-'}bos: {target} was trained "
                                 f"{'with' if tokenizer.bos_id is not None else 'without'} a "
                                 "start token and its windows follow its training; leave "
                                 "--bos out")
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
    t_load = time.perf_counter()
    model, tokenizer = load_named_model(args.model)
    stages = {"load model": time.perf_counter() - t_load}  # the stage table's first row
    _check_finite_weights(model, args.model)
    if dist_env is not None and torch.cuda.is_available():
        model = model.to(f"cuda:{dist_env[2]}")

    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.context import ReportOptions
    from tl_spectral.viz.sections import SECTIONS, ReportContext, build_report

    view = ModelView(model)
    if args.length > view.n_ctx:
        raise UsageError(f"--length {args.length} is longer than the model's context of "
                         f"{view.n_ctx}; pass --length {view.n_ctx} or less")
    framing = "disjoint windows of the corpus" if not args.overlap else "windows at random offsets"
    bos_id = _start_token(args, kind, target, model, tokenizer, view.causal)
    if bos_id is not None and token_file is not None:
        raise UsageError(f"--tokens: {args.model}'s windows start with its start token and "
                         "token-file windows are not framed with one yet; pass --corpus, or "
                         "--no-bos to analyse token-file windows without it")
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
            windows = _windows(text, tokenizer, args, bos_id=bos_id)
        # token-file windows stay lazy: the runner reads them batch by batch
        tokens = windows if token_file is not None else windows.tokens
        if token_file is None:
            # every token of a window is real text: an explicit mask, so that a pad id in
            # the corpus (a char tokenizer's <unk>, a BOS/EOS id used as pad) is never taken
            # for padding by the runner's inference (issue 30 item 2)
            import torch

            mask = torch.ones(tuple(tokens.shape), dtype=torch.bool)
    name = _display_name(args.model, kind)
    secs = [f() for f in SECTIONS]
    secs = [s for s in secs if s.key in sections]
    corpus_name = args.corpus if token_file is None else str(args.tokens)
    if token_file is not None:
        framing = "disjoint windows of the token file" if not args.overlap else \
            "windows of the token file at random offsets"
    options = ReportOptions(meta={"corpus": corpus_name, "seed": args.seed},
                            faithfulness_docs=args.faithfulness_docs, windows=framing,
                            save_raw=args.save_raw, progress=not args.no_progress,
                            stream_rank=args.stream_rank, fields=fields,
                            figure_format=args.figure_format, baseline=args.baseline)
    results, probe_pass_s = None, 0.0
    if dist_env is not None:  # every rank runs its shard; the states reduce across ranks
        import torch.distributed as dist

        from tl_spectral.probes import run_probes

        # a killed rank's scratch folder is removed by the next run (its pid is dead)
        _remove_dead_leftovers(Path(tempfile.gettempdir()), [RANK_SCRATCH_PATTERN])
        with tempfile.TemporaryDirectory(
                prefix=f"tl_spectral-analyze-rank{dist_env[0]}-{os.getpid()}-") as scratch:
            pctx = ReportContext(view=view, tokens=tokens, tokenizer=tokenizer,
                                 out_dir=Path(scratch), results_dir=Path(scratch), mask=mask,
                                 model_name=name, options=options)
            probes = [p for s in secs for p in s.probes(pctx)]
            status(f"probes: rank {dist_env[0]} of {dist_env[1]} runs its shard of "
                   f"{len(tokens)} windows")
            t_pass = time.perf_counter()
            results = run_probes(view, tokens, probes, batch_size=args.batch_size,
                                 progress=not args.no_progress, attention_mask=mask)
            probe_pass_s = time.perf_counter() - t_pass
        dist.destroy_process_group()  # rendering runs on rank 0 alone, in one process
        if not rank0:
            return 0
    # write into a fresh sibling folder, then swap it in: an earlier report is replaced
    # whole (no stale files) and nothing is lost if this run fails half-way
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_out_dir(out)
    try:
        ctx = ReportContext(
            view=view, tokens=tokens, tokenizer=tokenizer, out_dir=tmp,
            results_dir=tmp / "results", mask=mask, model_name=name, options=options,
        )
        ctx._t0 = t0
        if results is not None:  # the pass ran above, across the processes
            ctx.timings["probe pass"] = probe_pass_s
        ctx.results_dir.mkdir(parents=True, exist_ok=True)
        build_report(ctx, secs, batch_size=args.batch_size, progress=not args.no_progress,
                     results=results)
        if not args.no_progress:  # each stage's seconds and share of the probe pass
            from tl_spectral.stages import stage_table

            print(stage_table(ctx.timings, before=stages), file=sys.stderr, flush=True)
        (tmp / REPORT_MARKER).write_text(json.dumps({
            "tool": "tl-spectral analyze", "model": args.model, "corpus": corpus_name,
            "n_docs": args.n_docs, "length": args.length, "seed": args.seed,
            "processes": 1 if dist_env is None else dist_env[1]}) + "\n")
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a report is the user's folder
        _swap_in(tmp, out, out_id)
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


def _start_token(args, kind: str, target: str, model, tokenizer, causal: bool):
    """The start-token id windows of a Hugging Face tokenizer begin with (None: none):
    ``--bos``/``--no-bos``, else the zoo model's ``default_prepend_bos`` (smollm2-135m); the
    character models' start token comes from their own tokenizer instead."""
    if hasattr(tokenizer, "bos_id"):  # CharTokenizer: fixed by training (checked earlier)
        return None
    if not causal:
        if args.bos:
            raise UsageError(f"--bos: {args.model} is bidirectional; its windows are framed "
                             "by its own special tokens; leave --bos out")
        return None
    want = args.bos
    if want is None:
        want = kind in ("zoo", "gguf") and bool(getattr(model.cfg, "default_prepend_bos",
                                                         False))
    if not want:
        return None
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise UsageError(f"--bos: {args.model}'s tokenizer has no start token (bos_token_id); "
                         "pass --no-bos")
    return int(bos)


def _windows(text: str, tokenizer, args, bos_id=None):
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
    if tf.model and not _same_model(tf.model, model):
        raise UsageError(f"--tokens {path} was tokenized for --model {tf.model}, not {model}; "
                         f"pass --model {tf.model} or tokenize again with --model {model}")
    return tf


def _same_model(recorded: str, model: str) -> bool:
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


def _display_name(model: str, kind: str) -> str:
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


# ------------------------------------------------------------------------------ tokenize
def tokenizer_for(name: str):
    """The tokenizer of ``--model`` without loading its weights where that is possible (the
    shipped char models, 'random', a Hugging Face folder)."""
    kind, target = resolve_model(name)
    from tl_spectral.data import CharTokenizer, tiny_shakespeare

    if kind == "random":
        return CharTokenizer.from_text(tiny_shakespeare())
    from tl_spectral.models import gguf, zoo

    if kind == "zoo" and target in zoo.SHIPPED:
        return zoo._char_tokenizer(zoo.checkpoint_info(target))
    if kind == "gguf" or target in gguf.ENTRIES:
        try:
            return gguf.tokenizer(target)
        except ImportError as e:
            raise UsageError(_one_line(e)) from None
    if kind == "zoo":
        return load_named_model(name)[1]
    from transformers import AutoTokenizer

    from tl_spectral.models.hub import hub_offline

    with hub_offline():
        return AutoTokenizer.from_pretrained(target)


def tokenize(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral tokenize``: a corpus into a token file read lazily by ``analyze``."""
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
    if out.is_symlink():
        raise UsageError(f"tl-spectral tokenize: -o {out} is a symbolic link; pass the file "
                         f"it points to ({out.resolve()}) or a new file")
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
    # a local folder is recorded as its absolute path: analyze --tokens finds it from
    # any working folder, however --model spells it there
    kind, target = resolve_model(args.model)
    recorded = str(Path(target).resolve()) if kind in ("hf", "gguf") else args.model
    path = write_token_file(out, docs(), model=recorded, vocab_size=vocab,
                            overwrite=args.overwrite)
    from tl_spectral.data.tokenfile import TokenFile

    tf = TokenFile(path)
    print(f"{path.resolve()}: {tf.n_tokens:,} tokens in {tf.n_docs} document(s) for "
          f"--model {args.model}")
    return 0


# --------------------------------------------------------------------------------- train
def train(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral train``: train a model of the project's GPT family."""
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
            gcfg = GPTConfig.from_dict(mdoc)
            tcfg = TrainConfig.from_dict(dict(doc.get("train", {})))
            if tcfg.seq_len is not None and tcfg.seq_len > gcfg.n_ctx:
                raise ValueError(f"train.seq_len={tcfg.seq_len} exceeds the model's n_ctx="
                                 f"{gcfg.n_ctx}; pass {gcfg.n_ctx} or less (or null)")
            if "--device" not in argv and not any(a.startswith("--device=") for a in argv):
                tcfg.check_device()
        except (TypeError, ValueError, KeyError) as e:
            raise UsageError(f"tl-spectral train: {p}: {e}") from None
    if known.steps is not None and known.steps < 1:
        raise UsageError(f"tl-spectral train: --steps {known.steps} is out of range; pass a "
                         "positive number of optimizer steps")
    from tl_spectral.models.train import train_cli

    return int(train_cli(argv) or 0)


# ----------------------------------------------------------------------------- geometry
def geometry(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral geometry``: the QK weight geometry table of a model."""
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
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an earlier geometry folder in --out (whole)")
    args = ap.parse_args(argv)
    kind, target = resolve_model(args.model)
    out = out_path(args.out) if args.out else None
    out_id = None
    if out is not None:  # the same rules as analyze --out, checked before computing
        check_out_dir(out, args.overwrite, marker=GEOMETRY_MARKER, what="geometry folder")
        out_id = _identity(out)
        _remove_dead_leftovers(out.parent, _out_leftover_patterns(out))

    from tl_spectral.geometry.model import (
        UnreadableHeadsError,
        geometry_layer_table,
        model_qk_geometry,
    )
    from tl_spectral.models import zoo

    if kind == "zoo" and target in zoo.SHIPPED:
        model, _ = zoo.load_native(target)  # native weights: S–D layers stay readable
    else:
        model, _ = load_named_model(args.model)
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

        # written into a fresh sibling folder, swapped in whole (as analyze --out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_out_dir(out)
        try:
            geo.to_csv(tmp / "heads.csv")
            with open(tmp / "layers.csv", "w", encoding="utf-8") as f:
                f.write(",".join(keys) + "\n")
                for r in rows:
                    f.write(",".join(str(r[k]) for k in keys) + "\n")
            fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
            geo.plot_budget(ax=axes[0])
            geo.plot_routing_rank(ax=axes[1], show_capacity=True)
            geo.plot_eigenvalues(ax=axes[2])
            fig.suptitle(args.model, fontsize=10)
            fig.tight_layout()
            fig.savefig(tmp / "geometry.png", dpi=100)
            plt.close(fig)
            (tmp / GEOMETRY_MARKER).write_text(json.dumps({
                "tool": "tl-spectral geometry", "model": args.model,
                "fold_ln": not args.no_fold_ln}) + "\n")
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700
            _swap_in(tmp, out, out_id, marker=GEOMETRY_MARKER)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(out)
    return 0


# -------------------------------------------------------------------------------- study
STUDY_GROUP = "tl_spectral.studies"


def _study_entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=STUDY_GROUP)}


def study(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral study NAME``: run a study of the ``tl_spectral.studies`` entry points."""
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
    """The ``tl-spectral`` command: dispatch to a subcommand; user errors are one line."""
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
        if not isinstance(e, UsageError) and disk_full(e):
            print(f"tl-spectral {cmd}: error: {disk_full_message(e)}", file=sys.stderr)
            return 2
        msg = _one_line(e)
        if not isinstance(e, UsageError) and "weights_only" in msg:
            msg = _NO_UNPICKLE
        print(msg if msg.startswith("tl-spectral") else f"tl-spectral {cmd}: error: {msg}",
              file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an internal error: one line, --debug for more
        if debug:
            raise
        import pickle

        if disk_full(e):  # the user's environment, not a bug (SafetensorError, torch …)
            print(f"tl-spectral {cmd}: error: {disk_full_message(e)}", file=sys.stderr)
            return 2
        if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e):
            # never pass on torch's advice to unpickle with weights_only=False
            print(f"tl-spectral {cmd}: error: {_NO_UNPICKLE}", file=sys.stderr)
            return 2
        print(f"tl-spectral {cmd}: internal error ({type(e).__name__}): {_one_line(e)} "
              "(run again with --debug for the traceback)", file=sys.stderr)
        return 1


_NO_UNPICKLE = ("a weights file could not be read without unpickling it, which tl-spectral "
                "never does; pass a model folder with safetensors weights (model.safetensors)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
