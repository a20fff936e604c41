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

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one object per render
    def json(self, name: str) -> Any:
        """``<results>/<name>.json`` (None when absent)."""
        if self.dir is None:
            return None
        p = self.dir / f"{name}.json"
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    def path(self, rel: str) -> Path:
        """A path under the repository's ``docs/results`` (paper layout)."""
        return self.root / "docs" / "results" / rel


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
    """One claim on one model's results."""
    m = res.model
    prov = provenance(res) if m.results is not None else {"command": m.command}

    def rec(number: str, label: str, meas: Measurement | None = None) -> Record:
        return Record(c.id, m.key, m.setting, c.text, f"{c.paper}; SPEC {c.spec}", number,
                      None if meas is None else meas.estimate,
                      None if meas is None else meas.interval,
                      None if meas is None else meas.n, c.rule, label, prov,
                      "" if meas is None else meas.note)

    if m.results is None:
        return rec("—", rules.NOT_YET_MEASURED)
    meas = c.measure(res)
    if m.attention not in c.applies_to:
        num = "—" if meas is None else meas.number
        return rec(num, rules.not_comparable(c.not_comparable), meas)
    if meas is None:
        return rec("—", rules.NOT_MEASURED)
    return rec(meas.number, meas.label, meas)


def by_key(recs: list[Record]) -> dict[tuple[str, str], Record]:
    """(claim id, model key) → record."""
    return {(r.claim, r.model): r for r in recs}
