"""The real-decoder columns of the paper docs' claim tables (issue 26; every model a column
since issue 38): one column per model of the claims registry with the real-decoder layout
and results (:data:`tl_spectral_studies.claims.registry.MODELS`), SmolLM2-135M first.

The real-decoder study (:mod:`tl_spectral_studies.real_decoder`, docs/real_decoder.md) writes
its per-claim verdicts as data, ``docs/results/real_decoder/verdicts.json`` (records ``{id,
claim, number, interval, label, rule}``). Each paper doc's generator maps every row of its
claim table to the verdict ids that answer it (an explicit ``SMOL_IDS`` next to the
generator; ``None`` = no SmolLM2 measurement) and :func:`add_column` appends one column whose
cells are the records verbatim: ``id`` (the study's own claim): number [95% CI] — label. An id
already shown in an earlier row of the same table reads "as above". A row the mapping does not
know is an error, so a new claim row needs an explicit decision.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HEADER = "SmolLM2-135M ([docs/real_decoder.md](real_decoder.md)): number [95% CI] — verdict"
NOT_MEASURED = "not measured"
SETTING = ("SmolLM2-135M column: SmolLM2-135M-Instruct, Q4_1 weights dequantized to float32, "
           "instruction-tuned, Llama family (RMSNorm, SwiGLU, rotary positions, grouped-query "
           "attention), 135M parameters (30 layers × 9 heads); samples: 8 windows of 128 "
           "tokens for sinks and interventions, 6 of 32 for faithfulness (Wikipedia excerpt "
           "and Austen), N = 150 windows of 128 for the scale POD, all 270 heads for the "
           "weight geometry (see docs/real_decoder.md, linked in the column header). Each cell "
           "is a record of "
           "docs/results/real_decoder/verdicts.json verbatim — its id, the study's own claim "
           "(worded as that study tests it, which can differ from this row's), the number with "
           "its interval and the study's label under the study's rule, then after \" · \" "
           "its sensitivity (\"one framing\": one run, not tested across first token, "
           "corpus and draw; \"robust (K cells)\" or \"depends on …\": the evidence panel's "
           "record, which replaces the study's once every cell has run; docs/claims.md); "
           "\"not measured\": the study has no measurement for this row.")

IdsFor = Callable[[Sequence[str]], "tuple[str, ...] | None"]


def verdicts_path(results_dir: str | Path) -> Path:
    """The verdicts file beside a study's results folder: ``<results>/../real_decoder/``."""
    return Path(results_dir).parent / "real_decoder" / "verdicts.json"


def load(path: str | Path) -> dict[str, dict[str, Any]] | None:
    """``id -> record`` of a verdicts.json; None when the file does not exist (no column)."""
    p = Path(path)
    if not p.is_file():
        return None
    data = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a list of verdict records, got {type(data).__name__}; "
                         "regenerate it with `tl-spectral study real-decoder --tables-only`")
    out: dict[str, dict[str, Any]] = {}
    for r in data:
        missing = {"id", "claim", "number", "label"} - set(r)
        if missing:
            raise ValueError(f"{p}: record {r.get('id', r)!r} lacks {sorted(missing)}")
        if r["id"] in out:
            raise ValueError(f"{p}: verdict id {r['id']!r} appears twice")
        out[r["id"]] = r
    return out


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def record_text(r: Mapping[str, Any]) -> str:
    """One record as a cell: ``id`` (claim): number — label · sensitivity in short
    (:func:`~tl_spectral_studies.claims.render.sensitivity_short`; and its note, if any)."""
    from tl_spectral_studies.claims.render import sensitivity_short

    label = sensitivity_short(r["label"], r.get("sensitivity") or "", r.get("cells"))
    if r["number"] == "—":
        return f"`{r['id']}`: {_esc(label)}"
    note = f" ({_esc(r['note'])})" if r.get("note") else ""
    return f"`{r['id']}` ({_esc(r['claim'])}): {_esc(r['number'])} — {_esc(label)}{note}"


def cell(records: Mapping[str, Mapping[str, Any]], ids: Sequence[str] | None,
         seen: set[str]) -> str:
    """The SmolLM2 cell of one row; ``seen`` collects the ids already shown in the table."""
    if not ids:
        return NOT_MEASURED
    parts = []
    for i in ids:
        if i not in records:
            raise KeyError(f"SmolLM2 verdict id {i!r} is not in verdicts.json (ids there: "
                           f"{', '.join(records)}); fix the doc's SMOL_IDS mapping")
        parts.append(f"`{i}`: as above" if i in seen else record_text(records[i]))
        seen.add(i)
    return "<br>".join(parts)


def row_cells(line: str) -> list[str]:
    """The cells of one markdown table row ``| a | b |``."""
    return line.strip()[2:-2].split(" | ")


def add_column(md: str, ids_for: IdsFor,
               records: Mapping[str, Mapping[str, Any]] | None, *, header: str = HEADER,
               setting: str = SETTING) -> str:
    """``md`` (a block opening with a claim table) with one model column appended to that
    table and its ``setting`` right under it; unchanged when ``records`` is None."""
    if records is None:
        return md
    lines = md.split("\n")
    n = next((i for i, ln in enumerate(lines) if not ln.startswith("|")), len(lines))
    if n < 2:
        raise ValueError("add_column: the block does not open with a markdown table")
    seen: set[str] = set()
    out = [lines[0] + f" {header} |", lines[1] + "---|"]
    for ln in lines[2:n]:
        out.append(ln + f" {cell(records, ids_for(row_cells(ln)), seen)} |")
    return "\n".join(out + ["", setting] + lines[n:])


def add_columns(md: str, ids_for: IdsFor, results_dir: str | Path,
                smol_verdicts: str | Path | None = None) -> str:
    """Every real-decoder model column of the claims registry appended to the claim table
    of ``md``: SmolLM2 from ``smol_verdicts`` when given (else its records), every other
    measured model from its records; a model not yet measured has no column here (it is a
    column of the claims matrix, docs/claims.md)."""
    from tl_spectral_studies.claims import catalog

    root = Path(results_dir).resolve().parents[2]
    recs = None
    for m in _column_models():
        if m.key == "smollm2-135m" and smol_verdicts is not None:
            rs = load(smol_verdicts)
        else:
            if recs is None:
                recs = catalog.records(root)
            rs = {r.claim: _as_dict(r) for r in recs if r.model == m.key}
        if m.key == "smollm2-135m":
            md = add_column(md, ids_for, rs)
        else:
            md = add_column(md, ids_for, rs, header=f"{m.label}: number [95% CI] — verdict",
                      setting=f"{m.label} column: {m.setting}; `{m.command}`.")
    return md


def _column_models() -> list[Any]:
    from tl_spectral_studies.claims.catalog import MODELS

    return [m for m in MODELS.values() if m.layout == "real_decoder" and m.results]


def _as_dict(r: Any) -> dict[str, Any]:
    from tl_spectral_studies.claims.render import record_dict

    return record_dict(r)



def ids_from(mapping: Mapping[str, Any], doc: str) -> IdsFor:
    """A row -> ids function from ``{claim cell: ids}`` (ids: a tuple, None, or a callable of
    the row's cells); a claim the mapping lacks raises."""

    def ids_for(cells: Sequence[str]) -> tuple[str, ...] | None:
        if cells[0] not in mapping:
            raise KeyError(f"{doc}: claim row {cells[0]!r} has no SmolLM2 mapping; add it to "
                           "SMOL_IDS (None when SmolLM2 has no measurement for it)")
        v = mapping[cells[0]]
        return v(cells) if callable(v) else v

    return ids_for


def records_for(results_dir: str | Path, smol_verdicts: str | Path | None = None,
                model: str = "smollm2-135m") -> dict[str, dict[str, Any]] | None:
    """``id -> record`` of one model column (SmolLM2: ``smol_verdicts`` when given)."""
    if model == "smollm2-135m" and smol_verdicts is not None:
        return load(smol_verdicts)
    from tl_spectral_studies.claims import catalog

    recs = [r for r in catalog.records(Path(results_dir).resolve().parents[2])
            if r.model == model]
    return {r.claim: _as_dict(r) for r in recs} or None
