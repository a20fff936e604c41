"""One renderer for the verdict records: the claims matrix (every claim × every model), the
records as data (``verdicts.json`` per model column, ``docs/results/claims/records.json``),
the model columns of the paper docs' claim tables, and the prose quoted from records.

Prose that is not generated is *checked*: a span ``<!-- check: CLAIM MODEL -->`` …
``<!-- /check -->`` in a doc may quote only numbers and layer lists its record holds
(:func:`check_prose`), so a sentence cannot drift from its table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tl_spectral_studies.claims import catalog, registry, rules
from tl_spectral_studies.claims.registry import Record

CHECK_RE = re.compile(r"<!--\s*check:\s+(\S+)\s+(\S+)\s*-->(.*?)<!--\s*/check\s*-->", re.S)
"""A checked prose span; the markers may wrap across lines (whitespace of any kind)."""
_OPEN_RE = re.compile(r"<!--\s*check:")
_CLOSE_RE = re.compile(r"<!--\s*/check\s*-->")


def record_dict(r: Record) -> dict[str, Any]:
    """A record in the ``verdicts.json`` shape (``id``/``claim`` kept for the doc columns)."""
    return {"id": r.claim, "claim": r.text, "paper": r.paper, "model": r.model,
            "setting": r.setting, "number": r.number,
            "interval": None if r.interval is None else list(r.interval), "n": r.n,
            "label": r.label, "rule": r.rule, "note": r.note, "provenance": r.provenance,
            "mde": r.mde, "sensitivity": r.sensitivity, "cells": r.cells}


def model_records(recs: Iterable[Record], model: str) -> list[dict[str, Any]]:
    """The measured records of one model (its ``verdicts.json``)."""
    return [record_dict(r) for r in recs if r.model == model
            and rules.base(r.label) not in (rules.NOT_MEASURED, rules.NOT_YET_MEASURED)]


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def sensitivity_short(label: str, sensitivity: str, cells: int | None = None) -> str:
    """The label with its sensitivity in short after " · " (a real-decoder cell): "robust (18
    cells)", "one framing", "… so far (k of K cells)"; nothing where the label already says
    it ("depends on …") or is no verdict ("not comparable")."""
    if not sensitivity or rules.base(label) == rules.NOT_COMPARABLE \
            or label.startswith(sensitivity):
        return label
    if sensitivity.startswith(f"{rules.NOT_TESTED}: one framing"):
        short = "one framing"
    elif sensitivity.startswith(rules.WEIGHTS_ONLY):
        short = "weights only"
    elif sensitivity == rules.ROBUST and cells:
        short = f"{rules.ROBUST} ({cells} cells)"
    else:
        short = sensitivity
    return f"{label} · {short}"


def _cell(r: Record, model: registry.Model | None = None) -> str:
    """A matrix cell: the label (a "not comparable" reason is under the table), with the
    sensitivity in short for a real decoder (:func:`sensitivity_short`)."""
    if rules.base(r.label) == rules.NOT_COMPARABLE:
        return rules.NOT_COMPARABLE
    label = rules.display(r.label)
    if model is not None and model.layout == "real_decoder":
        label = sensitivity_short(label, r.sensitivity, r.cells)
    return _esc(label)


def matrix_markdown(recs: Sequence[Record], models: dict[str, registry.Model] | None = None
                    ) -> str:
    """The claims matrix: one row per claim, one column per model, each cell its label."""
    models = registry.MODELS if models is None else models
    by = registry.by_key(list(recs))
    head = "| claim | paper; SPEC | " + " | ".join(m.label for m in models.values()) + " |"
    out = [head, "|" + "---|" * (2 + len(models))]
    for c in catalog.all_claims().values():
        cells = [_cell(by[(c.id, k)], m) if (c.id, k) in by else "—"
                 for k, m in models.items()]
        out.append(f"| `{c.id}`: {_esc(c.text)} | {c.paper}; {c.spec} | " + " | ".join(cells)
                   + " |")
    out += ["", "Rules (one per claim, from `tl_spectral_studies.claims`):", ""]
    for c in catalog.all_claims().values():
        thr = f" Practical threshold {c.threshold[0]}: {c.threshold[1]}." if c.threshold else ""
        nc = f" Not comparable on other attention: {c.not_comparable}." if c.not_comparable \
            else ""
        out.append(f"- `{c.id}`: {_esc(c.rule)}.{thr}{nc}")
    out += ["", "Evidence of the real-decoder records (from `tl_spectral_studies.claims.rules`; "
            "a cell shows the label · its sensitivity in short: \"robust (18 cells)\", \"one "
            "framing\", \"… so far (k of K cells)\"):", "",
            f"- panel: {_esc(rules.PANEL_RULE)}.",
            f"- sensitivity: {_esc(rules.SENSITIVITY_RULE)}.",
            f"- one framing: {_esc(rules.ONE_FRAMING_RULE)}.",
            f"- weights only: {_esc(rules.WEIGHTS_ONLY_RULE)}.",
            f"- MDE: {_esc(rules.MDE_RULE)}.",
            "", "Columns (setting; provenance):", ""]
    for m in models.values():
        extra = "".join(f"; {what} `{p}`" for what, p in (("evidence panel", m.evidence),
                                                            ("depth thirds", m.depth)) if p)
        out.append(f"- {m.label}: {m.setting}; `{m.command}`{extra}"
                   + ("" if m.results else " — **not yet measured**"))
    return "\n".join(out)


def records_json(recs: Sequence[Record]) -> str:
    """``docs/results/claims/records.json``: every record, every model."""
    return json.dumps([record_dict(r) for r in recs], indent=1, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------ prose
_RANGE = re.compile(r"(\d+)\s*[–-]\s*(\d+)")


def layer_set(text: str) -> set[int]:
    """``"12–14, 16–19, 21 and 22"`` → {12, 13, 14, 16, …, 22}."""
    out: set[int] = set()
    for part in re.split(r",|\band\b", text):
        part = part.strip()
        m = _RANGE.fullmatch(part)
        if m:
            out |= set(range(int(m[1]), int(m[2]) + 1))
        elif part.isdigit():
            out.add(int(part))
    return out


_LAYERS = re.compile(r"layers? ((?:\d+(?:\s*[–-]\s*\d+)?)(?:(?:,\s*|\s+and\s+)\d+(?:\s*[–-]\s*"
                     r"\d+)?)*)")
_NUM = re.compile(r"[+−-]?\d+(?:\.\d+)?")


def _numbers(text: str) -> list[str]:
    return [x.replace("−", "-") for x in _NUM.findall(text)]


def _matches(x: str, pool: Sequence[float]) -> bool:
    """``x`` as written (its decimals) equals some pool value, or a pool value × 100."""
    d = len(x.split(".")[1]) if "." in x else 0
    v = float(x)
    tol = 0.5 * 10 ** -d + 1e-9
    return any(abs(abs(v) - abs(y)) <= tol or abs(abs(v) - abs(100 * y)) <= tol for y in pool)


def check_span(span: str, rec: Record) -> list[str]:
    """Problems of one checked prose span against its record: a layer list the record does
    not hold, a number it does not hold, or the record's label missing."""
    src = rec.number + " " + rec.label
    lists = [layer_set(m) for m in _LAYERS.findall(src)] + [
        layer_set(m) for m in re.findall(r"\(([\d–, ]+)\)", src)]
    out = []
    for m in _LAYERS.finditer(span):
        s = layer_set(m[1])
        if len(s) > 1 and s not in lists:
            out.append(f"layer list '{m[0]}' is not in the record ({rec.number})")
    spans_layers = " ".join(m[0] for m in _LAYERS.finditer(span))
    pool = [float(x) for x in _numbers(src)]
    for x in _numbers(span.replace(spans_layers, " ") if spans_layers else span):
        if "." not in x and abs(float(x)) <= 30:
            continue  # small integers: counts and layer ids, checked as lists above
        if not _matches(x, pool):
            out.append(f"number {x} is not in the record ({rec.number})")
    if rules.base(rec.label) not in span and "label" not in span:
        out.append(f"the record's label '{rules.base(rec.label)}' is not in the sentence")
    return out


def check_prose(text: str, recs: Sequence[Record], doc: str = "") -> list[str]:
    """Every ``<!-- check: CLAIM MODEL -->`` span of ``text`` against its record."""
    by = registry.by_key(list(recs))
    out = []
    spans = list(CHECK_RE.finditer(text))
    n_open, n_close = len(_OPEN_RE.findall(text)), len(_CLOSE_RE.findall(text))
    if not n_open == n_close == len(spans):  # a marker the pattern cannot read: never unchecked
        out.append(f"{doc}: {n_open} check markers and {n_close} closing markers, but "
                   f"{len(spans)} checked spans read: write each as <!-- check: CLAIM MODEL "
                   "-->…<!-- /check -->")
    for m in spans:
        key = (m[1], m[2])
        if key not in by:
            out.append(f"{doc}: checked prose names no record {m[1]} for {m[2]}")
            continue
        out += [f"{doc}: {m[1]} ({m[2]}): {p}" for p in check_span(m[3], by[key])]
    return out


def in_short(recs: Sequence[Record], model: str = "smollm2-135m") -> str:
    """The "In short" bullets of a real-decoder doc, every number and label from records."""
    by = {r.claim: r for r in recs if r.model == model}

    def say(cid: str) -> str:
        r = by[cid]
        sens = sensitivity_short(r.label, r.sensitivity, r.cells)[len(r.label):]
        return f"{r.number} — **{r.label}**{sens}"

    return "\n".join([
        f"* **Issue 26's puzzle** (`C.puzzle`): {say('C.puzzle')}.",
        f"* **Sinks** (seed 003): {say('C.sink')}. Contribution per attention (`C.little`): "
        f"{say('C.little')}. Value norm and direction (`C.split`): {say('C.split')}. "
        f"ρ* (`C.rho`): {say('C.rho')}. Zeroing the sink (`C.zero_ppl`): {say('C.zero_ppl')}; "
        f"‖o‖ (`C.norm`): {say('C.norm')}; the cone, cos(o, s̄) (`C.cone`): {say('C.cone')}. "
        f"Anti-alignment (`C.anti`): {say('C.anti')}. Tail tokens (`C.tail`): {say('C.tail')}.",
        f"* **Routing/filtering** (seed 002): budget (`B.budget.routing_fraction_delta0`): "
        f"{say('B.budget.routing_fraction_delta0')}; rank (`B.rank`): {say('B.rank')}; "
        f"linearization (`B.collapse3`): {say('B.collapse3')}; the inversion (`B.inversion`): "
        f"{say('B.inversion')}; one layer at a time (`B.inversion.layer`): "
        f"{say('B.inversion.layer')}.",
        f"* **Scales** (seed 000): bands (`A.bands`): {say('A.bands')}; H* (`A.hstar`): "
        f"{say('A.hstar')}.",
    ])


def write_results(root: Path, recs: Sequence[Record]) -> list[Path]:
    """Write ``verdicts.json`` of every measured real-decoder column and records.json."""
    out = []
    for m in registry.MODELS.values():
        if m.layout == "real_decoder" and m.results:
            p = root / m.results / "verdicts.json"
            p.write_text(json.dumps(model_records(recs, m.key), indent=1, ensure_ascii=False)
                         + "\n", encoding="utf-8")
            out.append(p)
    p = root / "docs" / "results" / "claims" / "records.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(records_json(recs), encoding="utf-8")
    return out + [p]


def result_differences(root: Path, recs: Sequence[Record]) -> list[str]:
    """Records files that differ from what the committed results give."""
    out = []
    for m in registry.MODELS.values():
        if m.layout == "real_decoder" and m.results:
            p = root / m.results / "verdicts.json"
            want = json.loads(json.dumps(model_records(recs, m.key), ensure_ascii=False))
            if not p.is_file() or json.loads(p.read_text(encoding="utf-8")) != want:
                out.append(f"{p.relative_to(root)}: differs from its records (regenerate)")
    p = root / "docs" / "results" / "claims" / "records.json"
    if not p.is_file() or p.read_text(encoding="utf-8") != records_json(recs):
        out.append(f"{p.relative_to(root)}: differs from its records (regenerate)")
    return out
