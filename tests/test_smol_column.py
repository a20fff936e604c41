"""The SmolLM2-135M column of the four paper docs' claim tables (issue 26): every cell is the
docs/results/real_decoder/verdicts.json record its row maps to (each doc's ``SMOL_IDS``),
verbatim, and the generators read the verdicts file they are given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tl_spectral_studies import contributions, routing, scale_pod, smol_column, surgery
from tl_spectral_studies._common import generated_blocks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
VERDICTS = RESULTS / "real_decoder" / "verdicts.json"
# doc, its study folder, its generator module, the row -> ids function of that module
DOCS = {
    "contributions": ("contributions.md", contributions,
                      smol_column.ids_from(contributions.SMOL_IDS, "contributions")),
    "routing": ("routing_filtering.md", routing,
                smol_column.ids_from(routing.SMOL_IDS, "routing")),
    "scale_pod": ("scale_pod.md", scale_pod, scale_pod._smol_ids),
    "surgery": ("surgery.md", surgery, smol_column.ids_from(surgery.SMOL_IDS, "surgery")),
}


def _table(block: str) -> tuple[str, list[list[str]]]:
    lines = [ln for ln in block.split("\n\n")[0].splitlines() if ln.startswith("|")]
    return lines[0], [smol_column.row_cells(ln) for ln in lines[2:]]


def _smol_index(header: str) -> int:
    """The index of the SmolLM2 column in a claim table's header row (followed by nothing
    or by the Gemma-3 column of the claims registry)."""
    cells = smol_column.row_cells(header)
    assert smol_column.HEADER in cells, header
    k = cells.index(smol_column.HEADER)
    assert all(c.startswith("Gemma-3-270M") for c in cells[k + 1:]), header
    return k


@pytest.mark.parametrize("study", sorted(DOCS))
def test_every_smollm2_cell_is_its_verdict_record(study):
    """(a) In the committed doc, the last cell of every claim row is, for each id the row maps
    to, that record's id, claim, number (with its interval) and label verbatim — or "as above"
    for an id shown in an earlier row — and "not measured" for a row mapped to none."""
    doc, _, ids_for = DOCS[study]
    recs = {r["id"]: r for r in json.loads(VERDICTS.read_text(encoding="utf-8"))}
    block = generated_blocks((ROOT / "docs" / doc).read_text(encoding="utf-8"))[
        f"{study}/verdict"]
    header, rows = _table(block)
    k = _smol_index(header)  # the SmolLM2 column (a Gemma-3 column may follow it)
    assert block.count("](real_decoder.md)") == 1 and smol_column.SETTING in block
    seen, measured = set(), 0
    for cells in rows:
        ids, got = ids_for(cells[:k]), cells[k]
        if not ids:
            assert got == "not measured", cells[0]
            continue
        parts = got.split("<br>")
        assert len(parts) == len(ids), cells[0]
        for i, part in zip(ids, parts):
            r = recs[i]
            if i in seen:
                assert part == f"`{i}`: as above"
            else:
                assert part == smol_column.record_text(r)
                assert part.startswith(f"`{i}` ({r['claim']}): {r['number']} — {r['label']}")
                if r["interval"] is not None:  # the interval is shown, as the study rounds it
                    assert "[" in r["number"] and "]" in r["number"]
                measured += 1
            seen.add(i)
    assert measured >= 3 if study != "surgery" else measured == 2


@pytest.mark.parametrize("study", sorted(DOCS))
def test_a_changed_record_changes_its_cell(study, tmp_path):
    """(b) The generator reads the verdicts file it is given: a changed label and number in a
    copy change the rendered cell."""
    doc, mod, ids_for = DOCS[study]
    recs = json.loads(VERDICTS.read_text(encoding="utf-8"))
    block = generated_blocks((ROOT / "docs" / doc).read_text(encoding="utf-8"))[
        f"{study}/verdict"]
    header, rows = _table(block)
    k = _smol_index(header)
    vid = next(ids_for(c[:k])[0] for c in rows if ids_for(c[:k]))
    for r in recs:
        if r["id"] == vid:
            r["label"], r["number"] = "CHANGED label", "CHANGED 9.99 [9.9, 10.1]"
    p = tmp_path / "verdicts.json"
    p.write_text(json.dumps(recs), encoding="utf-8")
    new = mod.tables(RESULTS / study, smol_verdicts=p)[f"{study}/verdict"]
    want = f"`{vid}` ({next(r['claim'] for r in recs if r['id'] == vid)}): CHANGED 9.99 " \
           "[9.9, 10.1] — CHANGED label"
    assert want in new and want not in block


def test_unmapped_rows_and_unknown_ids_are_refused():
    """A claim row without a mapping and an id missing from the file are errors naming what to
    fix; a missing verdicts file leaves the table without the column."""
    with pytest.raises(KeyError, match="no SmolLM2 mapping"):
        smol_column.ids_from({}, "x.md")(["a new claim", "m"])
    with pytest.raises(KeyError, match="fix the doc's SMOL_IDS"):
        smol_column.cell({}, ("C.nope",), set())
    md = "| a | b |\n|---|---|\n| x | y |"
    assert smol_column.add_column(md, lambda c: None, None) == md
    assert smol_column.load(Path("/nonexistent/verdicts.json")) is None
    out = smol_column.add_column(md, lambda c: None, {})
    assert out.splitlines()[2] == "| x | y | not measured |"
