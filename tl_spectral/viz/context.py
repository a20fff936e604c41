"""What a report section sees (:class:`ReportContext`) and the section protocol
(:class:`ReportSection`) and the one registry of sections (:data:`SECTIONS`, filled by
:func:`register_section` in each section module). Every section module imports these from
here; ``sections.py`` imports every section module once."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from tl_spectral.model_view import ModelView

if TYPE_CHECKING:
    from tl_spectral.probes import Probe
    from tl_spectral.viz.report import Report


@dataclass(frozen=True)
class ReportOptions:
    """The report's settings: each field is set by ``tl-spectral analyze`` and read by the
    report (a section or the page header). A plain dict of these names is accepted wherever
    a ``ReportOptions`` is (unknown names are refused); read access by name
    (``options["fields"]``, ``options.get(...)``) works as on the dict it replaces.

    Attributes:
        meta: extra header lines of the page (``corpus``, ``seed``).
        windows: how the windows were cut, shown in the header.
        save_raw: keep raw per-query maps in ``results/`` (``--save-raw``).
        progress: one-line status messages on stderr (None: ``build_report`` decides).
        faithfulness_docs: faithfulness curves on that many documents (0: none).
        stream_rank: constant-memory scale POD of that rank cap (None: exact).
        fields: the per-pair fields the scale_pod section analyses (None: attention).
        figure_format: the report's figures as ``"png"`` or ``"svg"`` (``--figure-format``).
        baseline: ``"random"``: reference columns from the same configuration re-initialised
            (``--baseline random``); None: none.
    """

    meta: dict = field(default_factory=dict)
    windows: Optional[str] = None
    save_raw: bool = False
    progress: Optional[bool] = None
    faithfulness_docs: int = 0
    stream_rank: Optional[int] = None
    fields: Optional[list] = None
    figure_format: str = "png"
    baseline: Optional[str] = None

    @classmethod
    def of(cls, value: Any) -> ReportOptions:
        """``value`` as ReportOptions: one already, None (defaults), or a mapping of names."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"report options must be a ReportOptions or a dict (got "
                             f"{type(value).__name__})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown report options {unknown}; known: {sorted(known)}")
        return cls(**value)

    def __getitem__(self, name: str) -> Any:
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name, None) if isinstance(name, str) else None
        return default if value is None else value


#: positions kept of per-position maps (mean patterns, kept contribution maps) without
#: ``save_raw``: what the report's figures and views show
SHOWN_POSITIONS = 64

#: documents shown by the interactive views (a document selector)
VIEW_DOCS = 3


#: above this many heads (layers × heads) the views show 2 documents (the page's size)
VIEW_HEADS_FOR_3_DOCS = 150


def view_documents(ctx: "ReportContext") -> list[int]:
    """The documents the interactive views show: 3, or 2 on models with more than
    ``VIEW_HEADS_FOR_3_DOCS`` heads in all (every layer's views are in the page)."""
    n = VIEW_DOCS if ctx.view.n_layers * ctx.view.n_heads <= VIEW_HEADS_FOR_3_DOCS else 2
    return list(range(min(n, int(ctx.tokens.shape[0]))))


@dataclass
class ReportContext:
    """What a section may read: the model view, the corpus, the tokenizer and the paths.

    ``mask``: optional ``[n_docs, pos]`` bool mask of real tokens (right padding);
    ``model_name``: the name shown in titles (default: the view's name).
    ``options``: the :class:`ReportOptions` (a dict of its names is converted)."""

    view: ModelView
    tokens: Any  # [n_docs, pos] int64
    tokenizer: Any
    out_dir: Path
    results_dir: Path
    options: ReportOptions = field(default_factory=ReportOptions)
    mask: Any = None
    model_name: Optional[str] = None
    #: seconds per phase (the probe pass, each section, the writing), written to report.json
    timings: dict = field(default_factory=dict, repr=False)
    #: the sanity findings' numbers (e.g. the share of heads at the uniform bound)
    sanity: dict = field(default_factory=dict, repr=False)
    #: the ``--baseline random`` twin and its results, computed once per run
    baseline_cache: dict = field(default_factory=dict, repr=False)
    #: the probe pass's results while the model passes run (a pass may read what a
    #: section's probe took in the probe pass; set and cleared by ``run_model_passes``)
    probe_results: dict = field(default_factory=dict, repr=False)
    #: {(layer, head): [role, …]}: what the sections found each head doing; the report
    #: names every such head ONCE, with all its roles (:func:`head_roles_finding`)
    head_roles: dict = field(default_factory=dict, repr=False)
    #: when the run started (``time.perf_counter()``): status lines show the seconds since
    #: (``tl-spectral analyze`` passes its own start, so the times run on from loading)
    t0: float = field(default_factory=time.perf_counter, repr=False)
    #: {token ids: display strings} of every ``token_strings`` call (saved for re-rendering)
    token_record: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.options = ReportOptions.of(self.options)

    @property
    def name(self) -> str:
        return self.model_name or self.view.name

    @property
    def save_raw(self) -> bool:
        return bool(self.options.save_raw)

    def doc_length(self, doc: int) -> int:
        """Number of real tokens of document ``doc``."""
        if self.mask is None:
            return int(self.tokens.shape[1])
        return int(self.mask[doc].sum())

    def status(self, message: str) -> None:
        """A one-line status on stderr (with the elapsed time) when progress is on."""
        if self.options.progress:
            print(f"[{time.perf_counter() - self.t0:6.1f} s] {message}", file=sys.stderr,
                  flush=True)

    def add_head_role(self, layer: int, head: int, role: str) -> None:
        """Record ``role`` (a phrase with its number) of head ``(layer, head)``."""
        self.head_roles.setdefault((int(layer), int(head)), []).append(role)

    def token_strings(self, ids) -> list[str]:
        """One display string per token, decoded the tokenizer's way (:func:`token_strings`);
        every answer is recorded in ``token_record`` (what a re-render replays: a
        :class:`TokenRecord` in place of the tokenizer answers from it)."""
        key = tuple(int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids))
        if isinstance(self.tokenizer, TokenRecord):
            out = self.tokenizer.strings(key)
        else:
            out = token_strings(self.tokenizer, ids)
        self.token_record[key] = list(out)
        return out


@dataclass(frozen=True)
class ModelPass:
    """A computation on the model that a section needs besides the probe pass — a forward
    pass with hooks of its own (perplexity, induction on repeated tokens, faithfulness
    ablations, the random-weight twin, the linearization curve) or a read of the weights
    (QK geometry). Sections declare them (``ReportSection.passes``); the report's plan runs
    them, once per ``key``, after the probe pass, with a progress line and a row in the stage
    table each (``pass <key>``); their results join the probe results under ``key`` and the
    sections only render.

    Attributes:
        key: the result's name in ``results`` (two sections declaring one key share the run).
        title: what the progress line says while it runs.
        run: ``run(ctx) -> result``; the only code of a section that touches the model.
    """

    key: str
    title: str
    run: Callable[["ReportContext"], Any]


class ReportSection:
    """A section: the probes it needs (run together with every other section's), the model
    passes it needs besides them (:class:`ModelPass`), and a render that reads results only."""

    key: str = "section"
    title: str = "Section"
    #: definitions of the columns its tables add (header tooltips and the report's glossary),
    #: beside :data:`tl_spectral.viz.glossary.GLOSSARY`, which wins for a column both define
    glossary: dict[str, str] = {}

    def probes(self, ctx: ReportContext) -> list[Probe]:
        return []

    def passes(self, ctx: ReportContext) -> list[ModelPass]:
        return []

    def derive(self, results: dict[str, Any], ctx: ReportContext) -> dict[str, Any]:
        """Small results computed from big ones (no model): run by the plan after the model
        passes; they join ``results`` and are what ``render`` reads instead of the big ones,
        so that a report re-renders from its saved ``results/``. Values: Results, plain
        JSON values, or flat dicts of tensors and plain values. Default: none."""
        return {}

    def render(self, report: Report, results: dict[str, Any], ctx: ReportContext) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class ModelDescription:
    """What a report's renders read of its model (``ctx.view``), without the model: saved
    with the report's results (``results/report_state.json``) and standing in for the
    :class:`~tl_spectral.model_view.ModelView` when a report is re-rendered.

    ``layer_types``: the layers' kinds (``"local"``/``"global"``) when the model mixes them,
    else None; ``sliding_window``: the local layers' window (None: not said);
    ``rmsnorm_uses_offset``: RMSNorm's gain is ``1 + w`` (Gemma). :func:`~tl_spectral.viz.
    layer_plots.layer_kinds`, ``kinds_note`` and the routing section's ``norm_folded`` read
    them as they read a model's configuration."""

    name: str
    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    n_ctx: int
    causal: bool
    positional: str
    normalization: Optional[str]
    pre_ln: bool
    layer_types: Optional[list] = None
    sliding_window: Optional[int] = None
    rmsnorm_uses_offset: bool = False

    @classmethod
    def of(cls, view: Any) -> ModelDescription:
        """The description of a ModelView (a description is returned as it is)."""
        if isinstance(view, cls):
            return view
        from tl_spectral.viz.layer_plots import layer_kinds, sliding_window

        cfg = getattr(getattr(view, "model", None), "cfg", None)
        return cls(name=str(view.name), n_layers=int(view.n_layers), n_heads=int(view.n_heads),
                   d_head=int(view.d_head), d_model=int(view.d_model),
                   d_vocab=int(getattr(view, "d_vocab", -1)), n_ctx=int(view.n_ctx),
                   causal=bool(view.causal), positional=str(view.positional),
                   normalization=getattr(view, "normalization", None),
                   pre_ln=bool(getattr(view, "pre_ln", True)), layer_types=layer_kinds(view),
                   sliding_window=sliding_window(view),
                   rmsnorm_uses_offset=bool(getattr(cfg, "rmsnorm_uses_offset", False)))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class TokenRecord:
    """The display strings a run's ``ctx.token_strings`` returned, by token ids: the
    tokenizer of a re-rendered report (:meth:`ReportContext.token_strings` answers from it)."""

    def __init__(self, record: Mapping[tuple, list]):
        self.record = {tuple(k): list(v) for k, v in record.items()}

    def strings(self, ids: tuple) -> list[str]:
        if ids not in self.record:
            raise ValueError(f"the report's saved state has no token strings for the ids "
                             f"{list(ids)[:8]}…: re-render with the code that wrote it, or "
                             "run tl-spectral analyze again")
        return list(self.record[ids])


#: The report's sections, in report order (``order``, then registration): filled by
#: :func:`register_section`; the CLI's ``--sections`` reads its keys from here.
SECTIONS: list[Callable[[], Any]] = []


def register_section(cls: type) -> type:
    """Class decorator: add a report section (``key``, ``title``, ``order``, ``probes``,
    ``render``, optionally ``glossary``) to :data:`SECTIONS`, in ``order`` (lower first;
    default 100).

    Registering the same key again (a module reloaded) replaces the earlier class; two
    different sections with one key are refused."""
    key = getattr(cls, "key", None)
    if not isinstance(key, str) or not key:
        raise ValueError(f"{cls.__qualname__}: a report section needs a string 'key'")
    for i, old in enumerate(SECTIONS):
        if old.key == key:
            if (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(f"report section key {key!r} is already registered by "
                                 f"{old.__module__}.{old.__qualname__}")
            del SECTIONS[i]
            break
    order = getattr(cls, "order", 100)
    at = next((i for i, s in enumerate(SECTIONS) if getattr(s, "order", 100) > order),
              len(SECTIONS))
    SECTIONS.insert(at, cls)
    return cls


#: shown for a token that only carries part of a character's bytes (the character appears
#: on the token that completes it)
PARTIAL = "·"


def _decode(tok: Any, ids: list[int]) -> str:
    try:
        return tok.decode(ids, clean_up_tokenization_spaces=False)
    except TypeError:
        return tok.decode(ids)


def _tokenizer_of(obj: Any) -> Any:
    """The tokenizer of a TransformerLens model, a ModelView, or the tokenizer itself."""
    if hasattr(obj, "decode"):
        return obj
    for owner in (obj, getattr(obj, "model", None)):
        tok = getattr(owner, "tokenizer", None)
        if tok is not None and hasattr(tok, "decode"):
            return tok
    raise ValueError(f"token_strings needs a tokenizer or a model that has one (.tokenizer); "
                     f"got {type(obj).__name__} without one: pass the tokenizer itself")


def token_strings(model: Any, tokens: Any, *, visible_whitespace: bool = True) -> list[str]:
    """Display strings of a token sequence, decoded the tokenizer's way — the labels of the
    report, the views and the notebooks (``tls.token_strings(model, tokens)``).

    model: a tokenizer, or a TransformerLens model / :class:`~tl_spectral.ModelView` whose
    ``.tokenizer`` decodes; tokens: one sequence of ids (list or 1-D tensor).

    Token k shows what decoding ``tokens[:k + 1]`` adds to the text of ``tokens[:k]``, so
    word pieces join (BERT's ``##`` pieces, no spaces inside a word), byte-level BPE spaces
    show as spaces (``'Ġgood'`` reads ``' good'``), and a character split over several byte
    tokens appears whole on the token that completes it (the tokens before it show ``·``).
    Falls back to decoding each token alone where the running text is not a prefix of the
    next (a tokenizer whose decode rewrites earlier text). Newlines show as ``\\n``, tabs as
    ``\\t``; with ``visible_whitespace`` a token of spaces only shows ``␣`` per space (a
    blank label would be invisible)."""
    tok = _tokenizer_of(model)
    raw = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
    if any(isinstance(i, (list, tuple)) for i in raw):
        raise ValueError("token_strings takes ONE sequence of ids; pass tokens[i] for "
                         "sequence i of a batch")
    ids = [int(i) for i in raw]
    out: list[str] = []
    done = ""
    for k, i in enumerate(ids):
        try:
            text = _decode(tok, ids[:k + 1])
            stable = text.rstrip("\ufffd") if k + 1 < len(ids) else text
            if stable.startswith(done):
                piece = stable[len(done):]
                done = stable
                if not piece:
                    piece = PARTIAL
            else:
                piece = _decode(tok, [i])
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: show the id
            piece = str(i)
        out.append(_shown(piece, visible_whitespace))
    return out


def _shown(piece: str, visible: bool) -> str:
    """Newlines, tabs and carriage returns escaped; a whitespace-only piece made visible."""
    if visible and piece and not piece.strip(" "):
        return "␣" * len(piece)
    for ch, rep in (("\n", "\\n"), ("\t", "\\t"), ("\r", "\\r")):
        piece = piece.replace(ch, rep)
    return piece
