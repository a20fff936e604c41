"""The reproduction docs' tables are generated from the committed results
(docs/results/<study>/) and are unchanged: every ``<!-- generated: KEY -->`` block of
docs/{contributions,scale_pod,surgery,routing_filtering}.md equals what the study's
``tables()`` makes of the committed files, every block the results produce is in its doc,
each doc opens with its verdict table, and every verdict row carries an interval or says
why none applies."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tl_spectral_studies._common import generated_blocks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOCS = {"contributions": "contributions.md", "scale_pod": "scale_pod.md",
        "surgery": "surgery.md", "routing": "routing_filtering.md"}


def test_every_generated_block_matches_the_committed_results():
    from tl_spectral_studies.doc_tables import differences

    diff = differences()
    assert not diff, "\n".join(diff) + "\n(run: python -m tl_spectral_studies.doc_tables)"


def test_surgery_summary_regenerates_from_committed_results():
    from tl_spectral_studies.surgery import markdown

    committed = (RESULTS / "surgery" / "summary.md").read_text(encoding="utf-8")
    assert markdown(RESULTS / "surgery") == committed


def test_a_changed_number_is_caught(tmp_path):
    """The comparison can fail: one changed energy share no longer matches the doc."""
    from tl_spectral_studies.scale_pod import tables

    res = tmp_path / "scale_pod"
    shutil.copytree(RESULTS / "scale_pod", res)
    p = res / "scale_pod_char-shakespeare_N150.json"
    s = json.loads(p.read_text())
    s["table"][0]["E_fine"] += 0.05
    p.write_text(json.dumps(s))
    doc = generated_blocks((ROOT / "docs" / "scale_pod.md").read_text(encoding="utf-8"))
    key = "scale_pod/char-shakespeare_N150/table"
    assert tables(res)[key] != doc[key]
    assert tables(RESULTS / "scale_pod")[key] == doc[key]


@pytest.mark.parametrize("study", sorted(DOCS))
def test_each_doc_opens_with_its_verdict_table(study):
    text = (ROOT / "docs" / DOCS[study]).read_text(encoding="utf-8")
    first_row = next(i for i, ln in enumerate(text.splitlines()) if ln.startswith("|"))
    opening = text.splitlines()[first_row - 1]
    assert opening == f"<!-- generated: {study}/verdict -->", \
        f"the first table of docs/{DOCS[study]} is not its generated verdict table"


REASONS = ("[", "no interval", "none", "needs rerun", "needs retraining", "not a test",
           "not comparable", "a count", "theorem", "not tested, because", "not implemented",
           "out of scope", "descriptive", "does not apply")


@pytest.mark.parametrize("study", sorted(DOCS))
def test_every_verdict_row_has_an_interval_or_says_why_not(study):
    text = (ROOT / "docs" / DOCS[study]).read_text(encoding="utf-8")
    rows = [ln for ln in generated_blocks(text)[f"{study}/verdict"].splitlines()
            if ln.startswith("| ") and not ln.startswith("| paper's claim")]
    assert rows
    bad = [r for r in rows if not any(k in r for k in REASONS)]
    assert not bad, bad


def test_no_doc_table_reads_a_run_folder():
    """`runs/` appears in a doc table only inside a command (a retraining recipe), never as
    the source of a number."""
    for name in DOCS.values():
        for ln in (ROOT / "docs" / name).read_text(encoding="utf-8").splitlines():
            if ln.startswith("|") and "runs/" in ln:
                spans = re.findall(r"`[^`]*`", ln)
                outside = re.sub(r"`[^`]*`", "", ln)
                assert "runs/" not in outside and all(
                    "tl-spectral" in sp for sp in spans if "runs/" in sp), (name, ln)


def test_field_pod_doc_tables_regenerate_from_committed_results():
    """The "Scale POD of contribution fields" tables and verdicts of docs/scale_pod.md are the
    committed field-pod results' (`tl-spectral study scale-pod --fields ...`), verbatim; the
    attention rows agree with the scale-pod study's own N = 150 runs (same windows)."""
    from tl_spectral_studies.field_pod import markdown, table_markdown, verdict

    doc = (ROOT / "docs" / "scale_pod.md").read_text(encoding="utf-8")
    runs = sorted((RESULTS / "field_pod").glob("field_pod_*.json"))
    assert [p.name for p in runs] == ["field_pod_char-shakespeare_N150.json",
                                      "field_pod_minilm_N150.json"]
    for p in runs:
        s = json.loads(p.read_text())
        assert table_markdown(s) in doc, f"docs/scale_pod.md lacks the table of {p.name}"
        assert verdict(s) in doc, f"docs/scale_pod.md lacks the verdict of {p.name}"
        ref = json.loads((RESULTS / "scale_pod" / f"scale_pod_{s['model']}_N150.json").read_text())
        for mine, theirs in zip(s["per_field"]["attention"], ref["table"], strict=True):
            assert mine["dominant_scales"] == theirs["dominant_scales"]
            for k in ("E_fine", "E_medium", "E_coarse", "T_spec"):
                assert abs(mine[k]["estimate"] - theirs[k]) < 1e-6, (p.name, k)
            assert mine["H_star_str"] == theirs["H_star"]
    assert markdown(RESULTS / "field_pod").count("| layer | field |") == 2
    # and a changed number is caught
    s = json.loads(runs[0].read_text())
    s["per_field"]["contribution"][0]["E_fine"]["estimate"] += 0.05
    assert table_markdown(s) not in doc


@pytest.mark.parametrize("study", sorted(DOCS))
def test_every_verdict_line_is_generated(study):
    """One source for the verdicts: a line that opens with "Verdict" (or "**Verdict") in a
    reproduction doc lies inside a generated block, so the claim table's generator wrote it
    from the same rows — prose outside the blocks reads the numbers but carries no verdict."""
    from tl_spectral_studies._common import _GEN_RE

    text = _GEN_RE.sub("", (ROOT / "docs" / DOCS[study]).read_text(encoding="utf-8"))
    bad = [ln for ln in text.splitlines() if re.match(r"\**Verdict", ln.strip())]
    assert not bad, bad


def test_routing_section_verdict_lines_are_the_claim_rows():
    """The sections' verdict lines of docs/routing_filtering.md carry the claim table's labels
    (one source), and a changed number changes both."""
    from tl_spectral_studies.routing import claim_rows, tables

    t = tables(RESULTS / "routing")
    for r in claim_rows(RESULTS / "routing"):
        if f"routing/verdict_line/{r.key}" in t:
            assert r.label in t[f"routing/verdict_line/{r.key}"]
            assert f"| {r.label} |" in t["routing/verdict"]


def test_routing_labels_follow_the_numbers():
    """Computed labels: a removal under +100% is not catastrophic; truncation reversed."""
    from tl_spectral_studies.routing import truncation_label
    from tl_spectral_studies.verdicts import (
        holm,
        layer0_minimum,
        removal_class,
        side,
        t_interval,
    )

    assert removal_class(0.53) == "costly" and removal_class(4.1) == "catastrophic"
    assert removal_class(0.05) == "cheap"
    p = [{"r": 2, "low": 0.2, "high": 0.3}, {"r": 16, "low": -0.014, "high": -0.004}]
    assert truncation_label(p).startswith("reproduced at low rank")
    p[1] = {"r": 16, "low": 0.001, "high": 0.01}
    assert truncation_label(p).startswith("reproduced:")
    assert truncation_label(p, sd=True).startswith("**not reproduced**")
    iv = t_interval([1.0, 2.0, 3.0])
    assert abs(iv["high"] - 2.0 - 4.302653 / 3 ** 0.5) < 1e-5
    assert side(iv, 5.0) == "reproduced" and side(iv, 2.0) == "not distinguishable at this size"
    assert side(iv, -1.0).startswith("**not reproduced**")
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]
    assert holm([0.01, 0.02, 0.03]) == [True, True, True]
    low = [2.0, 2.1, 2.2, 2.05, 2.15, 2.1, 2.0, 2.2]
    assert layer0_minimum([low, [5 + x for x in low], [9 + x for x in low]]) == (
        "layer 0 is the minimum")
    assert layer0_minimum([low, [x + 0.05 for x in low]]).startswith("layer 0 is the lowest")
    assert layer0_minimum([low, [x - 1 for x in low]]) == "no layer-0 minimum"


def test_sd_side_of_the_inversion_needs_free_filtering():
    from tl_spectral_studies.routing import sd_truncation_label

    m = {"full_rank": 16, "paired": [{"r": 2, "low": -0.3, "high": -0.2}],
         "rows": [{"part": "filtering", "r": 1, "rel_delta_ppl": 0.17, "rel_delta_low": 0.15,
                   "rel_delta_high": 0.2}]}
    assert sd_truncation_label(m).startswith("partly: reproduced: routing costs more at r = 2")
    m["rows"][0].update(rel_delta_ppl=0.002, rel_delta_low=-0.001, rel_delta_high=0.005)
    assert sd_truncation_label(m).endswith(": free")


def test_overlapping_windows_carry_no_verdict():
    """The N = 1,000 columns of the scale-pod claim table (stride 64 < 256) are descriptive;
    the same run with disjoint windows (a changed stride) gets its verdicts back."""
    from tl_spectral_studies.scale_pod import _runs, overlapping, verdict_markdown

    runs = _runs(RESULTS / "scale_pod")
    key = ("char-shakespeare_val_s64", 1000)
    assert overlapping(runs[key]) and not overlapping(runs[("char-shakespeare", 150)])
    table = verdict_markdown(runs)
    first = next(ln for ln in table.splitlines() if ln.startswith("| layers 1–2"))
    cells = first.split(" | ")
    assert "descriptive (overlapping windows" in cells[2] and "reproduced" in cells[1]
    runs[key] = {**runs[key], "stride": 256}
    first = next(ln for ln in verdict_markdown(runs).splitlines() if ln.startswith("| layers 1–2"))
    assert "descriptive" not in first.split(" | ")[4]
    assert "energy-gated" in table and "interpretable POD modes" in table


def test_real_decoder_tables_give_each_models_evidence_cells(tmp_path):
    """Each model's panel summary becomes its own generated block (SmolLM2's and Gemma-3's),
    and a model without a summary gets none."""
    from tl_spectral_studies import real_decoder_tables as rdt

    cell = {"factors": {"first token": "<bos>", "corpus": "austen", "draw": 0}, "n": 32,
            "label": "not reproduced", "estimate": 0.817, "low": 0.813, "high": 0.82,
            "mde": 0.005}
    summary = {"model": "gemma3-270m", "claims": {"C.little": {
        "sensitivity": "robust", "complete": False, "cells_expected": 12, "cells": [cell]}}}
    p = tmp_path / "evidence" / "gemma3-270m" / "summary.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(summary))
    out = rdt.tables(tmp_path)
    block = out["real_decoder/gemma3-270m/evidence_cells"]
    assert "| `C.little` | `<bos>` | austen | 0 | — | 32 | 0.817 [0.813, 0.820] | 0.005 |" \
        in block and "so far robust (1 of 12 cells)" in block
    assert "real_decoder/evidence_cells" not in out
