"""The claims registry: every claim of the three papers declared once, every model a column.

A :class:`Claim` names its paper and section (seed file, SPEC reference), its words, the
measure it reads (a function over committed results as data), the rule that labels it
(:mod:`tl_spectral_studies.claims.rules`), the model classes it applies to and, where it is
about another class, why it is not comparable. A :class:`Model` is one column: where its
results live and which command wrote them. :func:`records` applies every claim to every
model and returns one :class:`Record` per (claim, model, setting): number, interval, n,
rule, label, provenance.

Adding a model is one entry in :data:`MODELS`; adding a claim is one declaration in a part
module (:mod:`~tl_spectral_studies.claims.seed000`, ``seed002``, ``seed003``). The part
modules and :mod:`~tl_spectral_studies.claims.models` import this one;
:mod:`~tl_spectral_studies.claims.catalog` imports them all and evaluates.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tl_spectral_studies.claims import rules

ROOT = Path(__file__).resolve().parents[2]
STANDARD = "standard"
SD = "sd"
ALL = frozenset({STANDARD, SD})


@dataclass(frozen=True)
class Measurement:
    """What a measure returns for one model: the number as text, the label its rule gives,
    and the interval behind it (``note``: a caveat printed with the number)."""

    number: str
    label: str
    estimate: float | None = None
    interval: tuple[float, float] | None = None
    n: int | None = None
    note: str = ""
    mde: float | None = None
    """The minimum detectable effect at n (:func:`~tl_spectral_studies.claims.rules.mde`)."""
    sensitivity: str = ""
    """The panel's robustness label (:func:`~tl_spectral_studies.claims.rules.sensitivity`);
    empty where no panel was run."""


@dataclass(frozen=True)
class Claim:
    """One claim of one paper, declared once."""

    id: str
    paper: str
    spec: str
    text: str
    rule: str
    measure: Callable[[Results], Measurement | None]
    applies_to: frozenset[str] = ALL
    not_comparable: str = ""
    threshold: tuple[float, str] | None = None
    """A practical threshold and where it comes from, where a sign alone would pass any
    nonzero difference."""
    panel: str = ""
    """The evidence panel's claim id (:mod:`tl_spectral_studies.evidence_summary`) that tests
    this claim with the same measure and rule; "" where the panel has none."""
    panel_cells: tuple[tuple[str, str], ...] = ()
    """``(factor, value)`` pairs selecting this claim's cells of a panel claim that covers
    several (e.g. the hierarchy's ``("criterion, setting", "sufficiency, layer 15")``)."""
    panel_apart: str = ""
    """A panel claim that tests a *different* measure of the same words: quoted in the note,
    never the record's label."""
    no_interval: str = ""
    """Why the record has no single interval (a count over layers, a check), said in its
    note."""
    caveat: str = ""
    """A caveat of the claim's measure whatever sample reads it (e.g. cut-offs that are a
    choice): added to a panel record's note (a study's measurement states its own)."""

    def __post_init__(self) -> None:
        if self.applies_to != ALL and not self.not_comparable:
            raise ValueError(f"claim {self.id}: applies only to {sorted(self.applies_to)}; "
                             "state why it is not comparable elsewhere (not_comparable=...)")


@dataclass(frozen=True)
class Model:
    """One column: a model and where its committed results are.

    ``layout``: which result files the measures read — ``"real_decoder"`` (the files of
    ``tl-spectral study real-decoder``: sinks/faithfulness/routing/scales/interventions.json
    under ``results``) or ``"paper"`` (the char models' and MiniLM's study files:
    contributions/<slug>_summary.json, routing/<name>_heads.csv, scale_pod/...).
    ``results`` None: not yet measured (an empty column, ready for its run)."""

    key: str
    label: str
    attention: str
    layout: str
    results: str | None
    command: str
    setting: str
    slugs: Mapping[str, str] = field(default_factory=dict)
    """Per study, the file stem of this model (paper layout)."""
    evidence: str | None = None
    """The summary of this model's sensitivity panel (``tl-spectral study evidence``),
    relative to the repository; None, or a file not there yet: no panel."""
    depth: str | None = None
    """The depth-thirds result of ``tl-spectral study pod-depth`` for this model, relative
    to the repository; None: not run."""
    framing: Mapping[str, str] = field(default_factory=dict)
    """Per results file (``"interventions"``), its first token and corpus as the column's
    setting states them, where the file itself records none."""


@dataclass(frozen=True)
class Record:
    """One verdict record: (claim, model, setting) → number, interval, n, rule, label."""

    claim: str
    model: str
    setting: str
    text: str
    paper: str
    number: str
    estimate: float | None
    interval: tuple[float, float] | None
    n: int | None
    rule: str
    label: str
    provenance: dict[str, Any]
    note: str = ""
    mde: float | None = None
    sensitivity: str = ""
    cells: int | None = None
    """Panel cells behind the record (None: one run of the study); ``n`` is then per cell."""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval"] = None if self.interval is None else list(self.interval)
        return d


class Results:
    """The committed results of one model, read as data (JSON files by name, cached)."""

    def __init__(self, root: Path, model: Model):
        self.root = Path(root)
        self.model = model
        self.dir = None if model.results is None else self.root / model.results
        self.read: dict[str, None] = {}
        """The files the current measure read, in order (:func:`evaluate` resets it)."""

    def json(self, name: str) -> Any:
        """``<results>/<name>.json`` (None when absent)."""
        d = self._json(name)
        if d is not None:
            self.read.setdefault(name)
        return d

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one object per render
    def _json(self, name: str) -> Any:
        if self.dir is None:
            return None
        p = self.dir / f"{name}.json"
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    def depth(self) -> Any:
        """The model's depth-thirds result (:attr:`Model.depth`; None when absent)."""
        d = self._file(self.model.depth)
        if d is not None:
            self.read.setdefault("pod_depth")
        return d

    def panel(self) -> Any:
        """The model's panel summary (:attr:`Model.evidence`; None when absent)."""
        return self._file(self.model.evidence)

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one object per render
    def _file(self, rel: str | None) -> Any:
        p = None if rel is None else self.root / rel
        return json.loads(p.read_text(encoding="utf-8")) if p and p.is_file() else None

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one object per render
    def panel_commits(self) -> tuple[str, ...]:
        """The commits the panel's job files record (beside the summary)."""
        p = None if self.model.evidence is None else (self.root / self.model.evidence).parent
        found: set[str] = set()
        for f in sorted(p.glob("*/first=*.json")) if p is not None and p.is_dir() else []:
            found |= set(_COMMIT.findall(f.read_text(encoding="utf-8")))
        return tuple(sorted(found))

    def path(self, rel: str) -> Path:
        """A path under the repository's ``docs/results`` (paper layout)."""
        return self.root / "docs" / "results" / rel


_COMMIT = re.compile(r'"commit": "([0-9a-f]{7,40})"')
MODELS: dict[str, Model] = {}
CLAIMS: dict[str, Claim] = {}


def add_model(m: Model) -> Model:
    if m.key in MODELS:
        raise ValueError(f"model {m.key!r} is declared twice")
    if m.attention not in ALL:
        raise ValueError(f"model {m.key}: attention must be one of {sorted(ALL)}")
    MODELS[m.key] = m
    return m


def claim(c: Claim) -> Claim:
    """Declare a claim (once)."""
    if c.id in CLAIMS:
        raise ValueError(f"claim {c.id!r} is declared twice")
    CLAIMS[c.id] = c
    return c


def provenance(res: Results) -> dict[str, Any]:
    """command, commit, seeds of a model's results (what the files themselves record)."""
    m = res.model
    seeds, commits = set(), set()
    if res.dir is not None and res.dir.is_dir():
        for p in sorted(res.dir.glob("*.json")):
            if p.name in ("verdicts.json",):
                continue
            d = json.loads(p.read_text(encoding="utf-8"))
            if isinstance(d, dict):
                if "seed" in d:
                    seeds.add(int(d["seed"]))
                c = (d.get("provenance") or {}).get("commit")
                if c:
                    commits.add(c)
    rel = res.dir.relative_to(res.root).as_posix() if res.dir.is_relative_to(res.root) \
        else res.dir.name
    return {"command": m.command, "results": rel,
            "commit": ", ".join(sorted(commits)) or "not recorded (run before issue 38)",
            "seeds": sorted(seeds)}


def evaluate(c: Claim, res: Results) -> Record:
    """One claim on one model's results: the study's measure, or the model's evidence panel
    where it tests the claim and every cell has run (:func:`~tl_spectral_studies.claims.
    rules.panel_verdict`); a real-decoder record carries its sensitivity either way."""
    m = res.model
    prov = provenance(res) if m.results is not None else {"command": m.command}

    def rec(number: str, label: str, meas: Measurement | None = None, sens: str = "",
            note: str = "") -> Record:
        mde = None if meas is None else meas.mde
        if mde is None and meas is not None and meas.interval is not None:
            mde = rules.mde({"low": meas.interval[0], "high": meas.interval[1]})
        notes = [x for x in ("" if meas is None else meas.note, note) if x]
        return Record(c.id, m.key, m.setting, c.text, f"{c.paper}; SPEC {c.spec}", number,
                      None if meas is None else meas.estimate,
                      None if meas is None else meas.interval,
                      None if meas is None else meas.n, c.rule, label, prov,
                      "; ".join(notes), mde, (meas.sensitivity if meas else "") or sens)

    if m.results is None:
        return rec("—", rules.NOT_YET_MEASURED)
    res.read.clear()
    meas = c.measure(res)
    read = list(res.read)
    if read == ["pod_depth"]:  # a measure of the depth-thirds result alone: its provenance
        prov = _depth_provenance(res)
    pv = panel_of(c, res)
    if m.attention not in c.applies_to:
        return rec("—" if meas is None else meas.number, rules.not_comparable(c.not_comparable),
                   meas, _one_framing(res, read, meas))
    if pv is not None and pv.complete:
        return panel_record(c, res, pv)
    if meas is None:
        return rec("—", rules.NOT_MEASURED, sens="" if pv is None else pv.sensitivity)
    notes = [_apart_note(c, res)]
    if meas.interval is None and m.layout == "real_decoder" and c.no_interval:
        notes.insert(0, f"no interval: {c.no_interval}")
    return rec(meas.number, meas.label, meas,
               pv.sensitivity if pv is not None else _one_framing(res, read, meas),
               "; ".join(x for x in notes if x))


def _depth_provenance(res: Results) -> dict[str, Any]:
    """command, commit, seed of the depth-thirds result (what the file records)."""
    p = (res.depth() or {}).get("provenance") or {}
    return {"command": p.get("command", "tl-spectral study pod-depth"),
            "results": res.model.depth, "commit": p.get("commit") or "not recorded",
            "seeds": [] if p.get("seed") is None else [int(p["seed"])]}


def _one_framing(res: Results, read: list[str], meas: Measurement | None) -> str:
    """:func:`~tl_spectral_studies.claims.rules.one_framing` of a real-decoder record: the
    framing of every results file its measure read ("" for the paper layout)."""
    if res.model.layout != "real_decoder" or meas is None:
        return ""
    if read and all(name == "routing" for name in read):  # the weights alone
        d = res.json("routing") or {}
        return rules.weights_only(f"routing.json, n_ctx {d.get('n_ctx', 'not recorded')}")
    return rules.one_framing("; ".join(framing(res, name) for name in read))


def framing(res: Results, name: str) -> str:
    """First token, corpus and window draw of one results file, as the file records them
    (else as the column's :attr:`Model.framing` states them, else "not recorded")."""
    d = res.depth() if name == "pod_depth" else res.json(name)
    given = res.model.framing.get(name)
    if name == "routing":
        return (f"routing.json: weights only, n_ctx {d.get('n_ctx', 'not recorded')}; no first "
                "token, corpus or draw")
    if name == "pod_depth":
        c = d["config"]
        return (f"pod_depth: first token {c.get('start') or 'none'}, corpus {c['corpus']}, "
                f"window seed {c['window_seed']}")
    if name == "sinks" and "wiki_start" in d.get("settings", {}):
        first = ", ".join(sorted(set(d["settings"]["wiki_start"]["first_tokens"])))
        return f"sinks.json setting wiki_start: first token {first}, window seed {d['seed']}"
    if "first_token" in d and "window_seed" in d:  # what the study records since issue 39
        return (f"{name}.json: first token {d['first_token'] or 'none'}, corpus {d['corpus']}, "
                f"window seed {d['window_seed']}")
    if name == "scales" and "corpus" in d:
        return f"scales.json: {d['corpus']}, seed {d['seed']}"
    what = (f"{given} (the column's setting)" if given else
            "first token and corpus not recorded")
    return f"{name}.json: {what}" + (f", seed {d['seed']}" if "seed" in d else "")


def panel_of(c: Claim, res: Results) -> rules.PanelVerdict | None:
    """:func:`~tl_spectral_studies.claims.rules.panel_verdict` of the cells of the model's
    panel that test ``c`` (:attr:`Claim.panel`, :attr:`Claim.panel_cells`); None without."""
    return _panel(res, c.panel, c.panel_cells) if c.panel else None


def _panel(res: Results, pid: str, select: tuple[tuple[str, str], ...] = ()
           ) -> rules.PanelVerdict | None:
    g = ((res.panel() or {}).get("claims") or {}).get(pid)
    if not g or not g.get("cells"):
        return None
    cells, expected = g["cells"], int(g["cells_expected"])
    for factor, value in select:
        values = {c["factors"].get(factor) for c in cells}
        cells = [{**c, "factors": {k: v for k, v in c["factors"].items() if k != factor}}
                 for c in cells if c["factors"].get(factor) == value]
        expected //= max(1, len(values))
    if not cells:
        return None
    return rules.panel_verdict(cells, expected, bool(g.get("complete")))


def _apart_note(c: Claim, res: Results) -> str:
    """The note naming a panel claim that tests another measure of the same words."""
    pv = _panel(res, c.panel_apart) if c.panel_apart else None
    if pv is None:
        return ""
    g = res.panel()["claims"][c.panel_apart]
    return (f"the evidence panel's {c.panel_apart} is another measure ({g['text']}), kept apart "
            f"from this record: {pv.label} · {pv.sensitivity}, {pv.cells} cells"
            + (f", cell estimates {_g(pv.estimates[0])} to {_g(pv.estimates[1])}"
               if pv.estimates else ""))


def _span(xs: list[int]) -> str:
    """``"3"`` or ``"3 to 5"``: the range of counts over the cells."""
    return str(min(xs)) if min(xs) == max(xs) else f"{min(xs)} to {max(xs)}"


def _g(x: float) -> str:
    return f"{x:.3g}"


def panel_record(c: Claim, res: Results, pv: rules.PanelVerdict) -> Record:
    """The record a complete panel gives (:data:`~tl_spectral_studies.claims.rules.
    PANEL_RULE`), with the panel's provenance."""
    m = res.model
    g = res.panel()
    cells = g["claims"][c.panel]["cells"]
    factors = [f for f in cells[0]["factors"] if f not in dict(c.panel_cells)]
    # the factors the panel crosses (a step run on one corpus and draw names the first token)
    factors = [f for f in factors if len({str(x["factors"][f]) for x in cells}) > 1] or factors
    n = (f"n = {pv.n}" if pv.n == pv.n_max else f"n = {pv.n} to {pv.n_max}") + " per cell"
    parts = [f"evidence panel, {pv.cells} cells ({' × '.join(factors)}), {n}"]
    if pv.estimates is not None:
        parts.append(f"cell estimates {_g(pv.estimates[0])} to {_g(pv.estimates[1])}; "
                     f"cell intervals within [{_g(pv.interval[0])}, {_g(pv.interval[1])}]")
    elif any("count" in c for c in cells):
        k = [int(c["count"]) for c in cells if "count" in c]
        parts.append(f"layers selected per cell: {min(k)} to {max(k)}")
    elif any("holds" in c for c in cells):
        h = [int(c["holds"]) for c in cells if "holds" in c]
        r = [int(c["reversed"]) for c in cells if "reversed" in c]
        L = max(int(c["layers"]) for c in cells if "layers" in c)
        parts.append(f"per cell the claim holds in {_span(h)} of {L} layers and is reversed "
                     f"in {_span(r)} (each layer by its own interval)")
    elif any("steps" in c for c in cells):
        parts.append("each cell's label from its steps, each step with its own interval "
                     "(in the summary)")
    else:
        parts.append("the cells hold labels only (no interval in the summary)")
    parts.append(", ".join(f"{w} in {k}" for w, k in pv.counts))
    steps = any("steps" in x for x in cells)
    note = ("interval: the lowest cell low to the highest cell high (an envelope, not one "
            "95% interval); MDE: the largest cell MDE; n: per cell" if pv.interval else
            "no interval for the claim: every step of every cell has its own; MDE: the largest "
            "step MDE over the cells; n: per cell" if pv.mde is not None and steps else
            "no interval for the claim: a count over layers, each layer by its own interval; "
            "MDE: the largest per-layer MDE over the cells; n: per cell" if pv.mde is not None
            else
            f"no interval: {c.no_interval} (per cell)" if c.no_interval else
            "no interval: the panel's cells carry labels only")
    if c.caveat:
        note += f"; {c.caveat}"
    prov = {"command": f"tl-spectral study evidence --model {g.get('model', m.key)} "
                       "--data-dir ../shared/data --out docs/results/real_decoder/evidence",
            "results": m.evidence,
            "commit": ", ".join(res.panel_commits()) or "not recorded",
            "seeds": []}
    return Record(c.id, m.key, m.setting, c.text, f"{c.paper}; SPEC {c.spec}",
                  "; ".join(parts), None, pv.interval, pv.n,
                  f"{c.rule}; in every cell of the evidence panel, then the panel rule",
                  pv.label, prov, note,
                  pv.mde, pv.sensitivity, pv.cells)


def by_key(recs: list[Record]) -> dict[tuple[str, str], Record]:
    """(claim id, model key) → record."""
    return {(r.claim, r.model): r for r in recs}
