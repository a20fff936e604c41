"""The stage-by-stage table at the end of ``tl-spectral analyze``'s log (issue 42 item 5)."""

from __future__ import annotations

from tl_spectral.stages import stage_table


def test_table_rows_shares_and_sums():
    t = {"probe pass": 10.0, "section attention_stats": 2.5, "section scale_pod": 5.0,
         "write": 0.5}
    lines = stage_table(t, before={"load model": 4.0}).splitlines()
    rows = {ln[:40].strip(): ln[40:].split() for ln in lines[1:] if not ln.startswith("-")}
    assert lines[0].split()[:2] == ["stage", "seconds"]
    assert [ln[:40].strip() for ln in lines[1:6]] == [
        "load model", "probe pass", "section attention_stats", "section scale_pod", "write"]
    assert rows["probe pass"] == ["10.00", "1.00"]
    assert rows["section scale_pod"] == ["5.00", "0.50"]
    assert rows["load model"] == ["4.00", "0.40"]
    # the report stages: every phase but the probe pass (the load left out)
    assert rows["report stages (all but the probe pass)"] == ["8.00", "0.80"]
    assert rows["total"] == ["22.00", "2.20"]


def test_table_without_a_probe_pass():
    text = stage_table({"section x": 1.0, "write": 0.25})
    assert "—" in text and "1.25" in text


def test_analyze_prints_the_table_at_the_end_of_its_log(tmp_path, capsys):
    from tl_spectral.cli import main

    out = tmp_path / "rep"
    assert main(["analyze", "--model", "random", "--n-docs", "2", "--length", "32", "--out",
                 str(out), "--sections", "attention_stats"]) == 0
    err = capsys.readouterr().err
    tail = err[err.index("stage "):]
    for row in ("load model", "probe pass", "section attention_stats", "write",
                "report stages (all but the probe pass)", "total"):
        assert row in tail
    quiet = tmp_path / "quiet"
    assert main(["analyze", "--model", "random", "--n-docs", "2", "--length", "32", "--out",
                 str(quiet), "--sections", "attention_stats", "--no-progress"]) == 0
    assert "probe pass" not in capsys.readouterr().err
