"""Command line: ``tl-spectral analyze | render | tokenize | train | study NAME | geometry |
--version``.

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

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from argparse import BooleanOptionalAction
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from tl_spectral.cli_inputs import (  # noqa: F401 - the CLI's names for them
    corpus_windows as _windows,
)
from tl_spectral.cli_inputs import display_name as _display_name
from tl_spectral.cli_inputs import encoder_windows as _encoder_windows
from tl_spectral.cli_inputs import open_token_file
from tl_spectral.cli_inputs import same_model as _same_model  # noqa: F401
from tl_spectral.files import current_umask
from tl_spectral.outdirs import (  # noqa: F401 - the CLI's names for them
    DirLock as _DirLock,
)
from tl_spectral.outdirs import (
    check_out_dir,
    out_path,
)
from tl_spectral.outdirs import (
    out_leftover_patterns as _out_leftover_patterns,
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
ANALYZE = "tl-spectral analyze"


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


#: The shortest ``--length``: the scale POD (and the wavelets' default scales) need T ≥ 4.
MIN_LENGTH = 4


def _int_in(name: str, value: int, lo: int, hi: int, prog: str = ANALYZE) -> None:
    if not lo <= value <= hi:
        why = " (the scale POD needs at least 4 tokens per window)" if (
            name == "length" and value < MIN_LENGTH) else ""
        raise UsageError(f"{prog}: --{name} {value} is out of range; pass an integer in "
                         f"[{lo}, {hi:,}]{why}")


# ------------------------------------------------------------------------------- analyze
def analyze(argv: Optional[list[str]] = None) -> int:
    """``tl-spectral analyze``: the probes on a model and corpus, an offline HTML report.

    Named steps: parse; validate every argument against each other and against the model's
    metadata (its context, direction and start-token convention: no weights load until all
    of it passed); start (process group, seed, clock, the windows known without the model);
    load the model and cut the rest of the windows; under torchrun, each rank's shard of the
    probe pass; rank 0 then writes the report into a fresh folder swapped into --out."""
    job = _validate(_parse(argv))
    run = _start(job)
    prep = _prepare(job, run)
    shards = _probe_shards(job, run, prep) if job.dist_env is not None else None
    if not job.rank0:  # rendering runs on rank 0 alone
        return 0
    _write(job, lambda tmp: _report(job, run, prep, tmp, shards))
    print((job.out / "index.html").resolve())
    return 0


def _parse(argv: Optional[list[str]]) -> Any:
    """``tl-spectral analyze``'s arguments, parsed (types only; :func:`_validate` checks them)."""
    from tl_spectral.models.zoo import available
    from tl_spectral.viz.sections import section_keys

    ap = ArgumentParser(
        prog=ANALYZE,
        description="Run tl_spectral's probes on a model and corpus; write an offline HTML report.",
    )
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
    ap.add_argument("--n-docs", type=int, default=None,
                    help=f"number of document windows (default {DEFAULT_DOCS}; "
                         f"{DEFAULT_DOCS_GGUF} for a GGUF decoder: smollm2-135m, gemma3-270m "
                         "or a .gguf file)")
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
                    help=f"comma-separated section keys ({', '.join(section_keys())}) or 'all'")
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
    return ap.parse_args(argv)


@dataclass(frozen=True)
class AnalyzeJob:
    """``tl-spectral analyze`` after every check (:func:`_validate`), before the model's
    weights load.

    args: the parsed arguments (``--corpus`` filled in with its default); kind, target:
    :func:`resolve_model`'s; info: the model's metadata (:func:`~tl_spectral.models.loading.
    model_info`); bos: whether windows start with the model's start token (None: its
    metadata does not say; the loaded model's default does); sections, fields: the checked
    ``--sections`` and ``--fields``; token_file: the ``--tokens`` file or None; out, out_id:
    ``--out`` and its identity (rank 0: the swap replaces only that folder); dist_env:
    torchrun's ``(rank, world, local_rank)`` or None."""

    args: Any
    kind: str
    target: str
    info: Any
    bos: Optional[bool]
    sections: tuple[str, ...]
    fields: tuple[str, ...]
    token_file: Any
    out: Path
    out_id: Any
    dist_env: Optional[tuple[int, int, int]]

    @property
    def rank0(self) -> bool:
        return self.dist_env is None or self.dist_env[0] == 0

    @property
    def progress(self) -> bool:
        """Status lines and progress bars: on unless --no-progress, on rank 0 only."""
        return not self.args.no_progress and self.rank0

    @property
    def corpus_name(self) -> str:
        return self.args.corpus if self.token_file is None else str(self.args.tokens)


#: windows of a report by default: 64 (the character models, Hugging Face folders, random);
#: 16 for a GGUF decoder (a real model of 100-300 M parameters: a 16-window report takes
#: about the time of 64 windows of a character model)
DEFAULT_DOCS, DEFAULT_DOCS_GGUF = 64, 16


def default_docs(model: str) -> int:
    """The default ``--n-docs`` of ``--model``: ``DEFAULT_DOCS_GGUF`` for a GGUF zoo entry or
    a ``.gguf`` file, else ``DEFAULT_DOCS``."""
    from tl_spectral.models.gguf import ENTRIES

    gguf = model in ENTRIES or str(model).lower().endswith(".gguf")
    return DEFAULT_DOCS_GGUF if gguf else DEFAULT_DOCS


def _validate(args: Any) -> AnalyzeJob:
    """Every check of ``tl-spectral analyze``, in order, before any weights load: the numbers'
    ranges, --corpus/--tokens, --sections, --fields, --model, the token file or corpus,
    --out (rank 0), then --length, --bos and --tokens against the model's metadata.
    Raises :class:`UsageError`; afterwards dead leftovers beside --out are removed."""
    if args.n_docs is None:
        args.n_docs = default_docs(args.model)
    _int_in("n-docs", args.n_docs, 1, MAX_DOCS)
    _int_in("length", args.length, MIN_LENGTH, 1 << 20)
    _int_in("batch-size", args.batch_size, 1, 1 << 16)
    _int_in("faithfulness-docs", args.faithfulness_docs, 0, args.n_docs)
    _int_in("seed", args.seed, 0, MAX_SEED)
    if args.stream_rank is not None:
        _int_in("stream-rank", args.stream_rank, 1, 1 << 16)
    if args.tokens is not None and args.corpus is not None:
        raise UsageError(f"{ANALYZE}: pass either --corpus or --tokens, not both")
    if args.corpus is None:
        args.corpus = "shakespeare"
    sections = _sections(args.sections)
    fields = _scale_pod_fields(args.fields, sections)
    kind, target = resolve_model(args.model)
    token_file = None
    if args.tokens is not None:
        token_file = open_token_file(args.tokens, args.model, model_ok=args.tokens_model_ok)
    else:
        check_corpus(args.corpus)
    dist_env = torchrun_env()
    out = out_path(args.out)
    rank0 = dist_env is None or dist_env[0] == 0
    if rank0:
        check_out_dir(out, args.overwrite)
    from tl_spectral.models.loading import model_info

    info = model_info(args.model)
    bos = _check_model(args, kind, info)
    out_id = None
    if rank0:
        out_id = _identity(out)  # the swap at the end replaces only this folder
        _remove_dead_leftovers(out.parent, _out_leftover_patterns(out))
    return AnalyzeJob(args, kind, target, info, bos, tuple(sections), tuple(fields),
                      token_file, out, out_id, dist_env)


def _sections(value: str) -> list[str]:
    """The ``--sections`` list, checked against the registry of sections."""
    from tl_spectral.viz.sections import section_keys

    keys = section_keys()  # the one registry: each section module registers itself
    if value == "all":
        return list(keys)
    sections = [s.strip() for s in value.split(",") if s.strip()]
    bad = [s for s in sections if s not in keys]
    if bad or not sections:
        raise UsageError(f"unknown sections {bad or [value]}; known: {', '.join(keys)} "
                         "(or 'all')")
    return sections


def _check_model(args: Any, kind: str, info: Any) -> Optional[bool]:
    """The checks that need the model: --length within its context, --bos and --tokens
    against its direction and start-token convention. ``info``: its metadata
    (:class:`~tl_spectral.models.loading.ModelInfo`) before the load; the same checks run
    again on the loaded model (the first time for what its metadata did not say). Returns
    whether windows start with its start token (None: not known before the load)."""
    name, tokens = args.model, getattr(args, "tokens", None)
    if info.n_ctx is not None and args.length > info.n_ctx:
        raise UsageError(f"--length {args.length} is longer than {name}'s context of "
                         f"{info.n_ctx}; pass --length {info.n_ctx} or less")
    if info.bos_fixed and args.bos is not None and args.bos != info.prepend_bos:
        raise UsageError(f"--{'' if args.bos else 'no-'}bos: {name} was trained "
                         f"{'with' if info.prepend_bos else 'without'} a start token and its "
                         "windows follow its training; leave --bos out")
    if info.causal is False and args.bos:
        raise UsageError(f"--bos: {name} is bidirectional; its windows are framed by its own "
                         "special tokens; leave --bos out")
    if info.causal is False and tokens is not None:
        raise UsageError(f"--tokens: {name} is bidirectional; its windows are framed by its "
                         "special tokens from the text, pass --corpus instead")
    bos = _wants_bos(args, kind, info)
    if bos and tokens is not None:  # the one refusal of start-token windows from a token file
        raise UsageError(f"--tokens: {name}'s windows start with its start token and "
                         "token-file windows are not framed with one yet; pass --corpus"
                         + ("" if info.bos_fixed else
                            ", or --no-bos to analyse token-file windows without it"))
    return bos


def _wants_bos(args: Any, kind: str, info: Any) -> Optional[bool]:
    """Whether windows start with the model's start token: the character models follow
    their training; 'random' and encoders never; else ``--bos``/``--no-bos``, else the zoo
    or GGUF model's convention (None: unknown until it loads), else off."""
    if info.bos_fixed:
        return info.prepend_bos
    if kind == "random" or info.causal is False:  # 'random': its character tokenizer has none
        return False
    if args.bos is not None:
        return args.bos
    return info.prepend_bos if kind in ("zoo", "gguf") else False


def _start_token_id(args: Any, tokenizer: Any, bos: Optional[bool]) -> Optional[int]:
    """The start-token id that windows of a Hugging Face tokenizer begin with (None: none;
    a character tokenizer puts its own in, fixed by training)."""
    if hasattr(tokenizer, "bos_id") or not bos:
        return None
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        raise UsageError(f"--bos: {args.model}'s tokenizer has no start token (bos_token_id); "
                         "pass --no-bos")
    return int(bos_id)


def _start_token(args: Any, kind: str, target: str, model: Any, tokenizer: Any,
                 causal: bool) -> Optional[int]:
    """The start-token id windows of a loaded model begin with (None: none): the checks of
    :func:`_check_model` on the loaded model, then :func:`_start_token_id`."""
    from tl_spectral.models.loading import ModelInfo

    info = dataclasses.replace(ModelInfo.of_loaded(model), causal=causal,
                               bos_fixed=hasattr(tokenizer, "bos_id"))
    return _start_token_id(args, tokenizer, _check_model(args, kind, info))


@dataclass
class _Run:
    """A run of ``tl-spectral analyze`` once started: its clock, and the corpus text and the
    windows read before the model loads (a token file's; a character model's)."""

    progress: bool
    t0: float
    text: str = ""
    windows: Any = None
    framing: str = ""

    def status(self, msg: str) -> None:
        if self.progress:
            print(f"[{time.perf_counter() - self.t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def _start(job: AnalyzeJob) -> _Run:
    """Join the process group (torchrun), seed torch, start the clock; read the corpus and
    cut the windows that need no model (a token file's; a character model's, whose tokenizer
    is its checkpoint's)."""
    import torch

    args = job.args
    if job.dist_env is not None:
        _init_process_group(*job.dist_env)
    run = _Run(progress=job.progress, t0=time.perf_counter())
    torch.manual_seed(args.seed)
    run.text = load_corpus(args.corpus) if job.token_file is None else ""
    run.framing = "disjoint windows of the corpus" if not args.overlap else \
        "windows at random offsets"
    if job.token_file is not None:
        try:
            run.windows = job.token_file.windows(args.n_docs, args.length, seed=args.seed,
                                                 overlap=args.overlap)
        except ValueError as e:
            hint = "" if args.overlap else "; or pass --overlap to draw overlapping windows"
            raise UsageError(f"--tokens {args.tokens}: {e}{hint}") from None
        run.framing = "disjoint windows of the token file" if not args.overlap else \
            "windows of the token file at random offsets"
    elif job.info.bos_fixed:  # a character checkpoint: its tokenizer without its weights
        from tl_spectral.models import zoo

        run.windows = _windows(run.text, zoo.char_tokenizer(zoo.checkpoint_info(job.target)),
                               args)
        if getattr(run.windows, "bos_id", None) is not None:
            run.framing += ", each after the model's start token"
    return run


@dataclass
class _Prepared:
    """What the report runs on: the model's view, the windows, the sections and options."""

    view: Any
    tokens: Any
    mask: Any
    tokenizer: Any
    name: str
    secs: list
    options: Any
    stages: dict

    def context(self, out_dir: Path, results_dir: Path, t0: float) -> Any:
        from tl_spectral.viz.sections import ReportContext

        return ReportContext(view=self.view, tokens=self.tokens, tokenizer=self.tokenizer,
                             out_dir=out_dir, results_dir=results_dir, mask=self.mask,
                             model_name=self.name, options=self.options, t0=t0)


def _prepare(job: AnalyzeJob, run: _Run) -> _Prepared:
    """Load the model, re-check it, cut the windows that need it, pick the sections and the
    report's options."""
    from tl_spectral.viz.context import ReportOptions
    from tl_spectral.viz.sections import SECTIONS

    args = job.args
    run.status(f"loading {args.model}")
    t_load = time.perf_counter()
    model, tokenizer = load_named_model(args.model)
    stages = {"load model": time.perf_counter() - t_load}  # the stage table's first row
    _check_finite_weights(model, args.model)
    if job.dist_env is not None:
        import torch

        if torch.cuda.is_available():
            model = model.to(f"cuda:{job.dist_env[2]}")
    view, tokens, mask, framing = _model_windows(job, run, model, tokenizer)
    secs = [s for s in (f() for f in SECTIONS) if s.key in job.sections]
    options = ReportOptions(meta={"corpus": job.corpus_name, "seed": args.seed},
                            faithfulness_docs=args.faithfulness_docs, windows=framing,
                            save_raw=args.save_raw, progress=job.progress,
                            stream_rank=args.stream_rank, fields=list(job.fields),
                            figure_format=args.figure_format, baseline=args.baseline)
    return _Prepared(view, tokens, mask, tokenizer, _display_name(args.model, job.kind), secs,
                     options, stages)


def _model_windows(job: AnalyzeJob, run: _Run, model: Any, tokenizer: Any):
    """The loaded model checked again (for what its metadata did not say) and the windows:
    ``(view, tokens, mask, framing)``."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.models.loading import ModelInfo

    args = job.args
    view = ModelView(model)
    loaded = dataclasses.replace(ModelInfo.of_loaded(view), bos_fixed=job.info.bos_fixed)
    # the checks of _validate again, on the loaded model: they run here first only for what
    # its metadata could not say without loading it (a GGUF file whose cache is not built:
    # its context; its start token when the file's header does not say; a folder whose
    # config TransformerLens' mapping does not read); elsewhere they agree
    bos = _check_model(args, job.kind, loaded)
    bos = job.bos if job.bos is not None else bos
    if not view.causal:
        run.status("cutting sentence-aligned windows framed by the model's special tokens")
        return (view, *_encoder_windows(run.text, tokenizer, args))
    windows = run.windows
    if windows is None:
        windows = _windows(run.text, tokenizer, args,
                           bos_id=_start_token_id(args, tokenizer, bos))
    if job.token_file is not None:  # token-file windows stay lazy: read batch by batch
        return view, windows, None, run.framing
    import torch

    # every token of a window is real text: an explicit mask, so that a pad id in the
    # corpus (a char tokenizer's <unk>, a BOS/EOS id used as pad) is never taken for
    # padding by the runner's inference (issue 30 item 2)
    mask = torch.ones(tuple(windows.tokens.shape), dtype=torch.bool)
    return view, windows.tokens, mask, run.framing


def _probe_shards(job: AnalyzeJob, run: _Run, prep: _Prepared) -> tuple[dict, float]:
    """torchrun: every rank runs the report's probe pass (:func:`~tl_spectral.viz.sections.
    plan_report`, :func:`~tl_spectral.viz.sections.run_probe_pass`) on its shard of the
    windows and the probe states reduce across the ranks; then the process group ends.
    Returns the results and the pass's seconds."""
    import torch.distributed as dist

    from tl_spectral.viz.sections import plan_report, run_probe_pass

    rank, world, _ = job.dist_env
    # a killed rank's scratch folder is removed by the next run (its pid is dead)
    _remove_dead_leftovers(Path(tempfile.gettempdir()), [RANK_SCRATCH_PATTERN])
    with tempfile.TemporaryDirectory(
            prefix=f"tl_spectral-analyze-rank{rank}-{os.getpid()}-") as scratch:
        ctx = prep.context(Path(scratch), Path(scratch), run.t0)
        run.status(f"probes: rank {rank} of {world} runs its shard of {len(prep.tokens)} "
                   "windows")
        results = run_probe_pass(ctx, plan_report(ctx, prep.secs),
                                 batch_size=job.args.batch_size, progress=job.progress)
    dist.destroy_process_group()  # rendering runs on rank 0 alone, in one process
    return results, ctx.timings.get("probe pass", 0.0)


def _report(job: AnalyzeJob, run: _Run, prep: _Prepared, folder: Path,
            shards: Optional[tuple[dict, float]]) -> None:
    """Build the report into ``folder``: the plan, the probe pass (unless the ranks ran it),
    the model passes, the sections; then the stage table on stderr."""
    from tl_spectral.viz.sections import build_report

    ctx = prep.context(folder, folder / "results", run.t0)
    results = None
    if shards is not None:  # the pass ran across the processes
        results, ctx.timings["probe pass"] = shards
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    build_report(ctx, prep.secs, batch_size=job.args.batch_size, progress=job.progress,
                 results=results)
    if job.progress:  # each stage's seconds and share of the probe pass
        from tl_spectral.stages import stage_table

        print(stage_table(ctx.timings, before=prep.stages), file=sys.stderr, flush=True)


def _write(job: AnalyzeJob, fill: Callable[[Path], None]) -> None:
    """``fill(folder)`` writes the report into a fresh sibling folder of --out, which is then
    swapped in: an earlier report is replaced whole (no stale files) and nothing is lost if
    the run fails half-way."""
    args, out = job.args, job.out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_out_dir(out)
    try:
        fill(tmp)
        (tmp / REPORT_MARKER).write_text(json.dumps({
            "tool": ANALYZE, "model": args.model, "corpus": job.corpus_name,
            "n_docs": args.n_docs, "length": args.length, "seed": args.seed,
            "processes": 1 if job.dist_env is None else job.dist_env[1]}) + "\n")
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes 0700; a report is the user's folder
        _swap_in(tmp, out, job.out_id)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        return zoo.char_tokenizer(zoo.checkpoint_info(target))
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
from tl_spectral.cli_render import render  # noqa: E402 - tl-spectral render

COMMANDS = {"analyze": analyze, "render": render, "tokenize": tokenize, "train": train,
            "study": study, "geometry": geometry}

USAGE = """usage: tl-spectral {analyze,render,tokenize,train,study,geometry} [options] | --version

  analyze    run the probes on a model and corpus, write an offline HTML report
  render     render a report folder again from its saved results, without the model
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
