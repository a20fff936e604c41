"""The stage-by-stage table at the end of ``tl-spectral analyze``'s log (issue 42 item 5)."""

from __future__ import annotations

from tl_spectral.stages import stage_sums, stage_table


def test_table_rows_shares_and_sums():
    t = {"probe pass": 10.0, "pass sanity_perplexity": 3.0, "derive scale_pod": 1.5,
         "section attention_stats": 2.5, "section scale_pod": 5.0, "write": 0.5,
         "save state": 0.5}
    lines = stage_table(t, before={"load model": 4.0}).splitlines()
    w = lines[0].index("seconds") - 3  # the stage column's width
    rows = {ln[:w].strip(): ln[w:].split() for ln in lines[1:] if not ln.startswith("-")}
    assert lines[0].split()[:2] == ["stage", "seconds"]
    assert [ln[:w].strip() for ln in lines[1:9]] == [
        "load model", "probe pass", "pass sanity_perplexity", "derive scale_pod",
        "section attention_stats", "section scale_pod", "write", "save state"]
    assert rows["probe pass"] == ["10.00", "1.00"]
    assert rows["section scale_pod"] == ["5.00", "0.50"]
    assert rows["load model"] == ["4.00", "0.40"]
    # the model passes, the rendering (the rest), the report stages: every phase but the
    # probe pass (the load left out)
    assert rows["model passes (pass …)"] == ["3.00", "0.30"]
    assert rows["rendering (derive, sections, write, state)"] == ["10.00", "1.00"]
    assert rows["report stages (all but the probe pass)"] == ["13.00", "1.30"]
    assert rows["total"] == ["27.00", "2.70"]
    assert stage_sums(t) == {"stages": 13.0, "passes": 3.0, "render": 10.0}


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
                "model passes", "rendering", "report stages (all but the probe pass)",
                "total"):
        assert row in tail
    quiet = tmp_path / "quiet"
    assert main(["analyze", "--model", "random", "--n-docs", "2", "--length", "32", "--out",
                 str(quiet), "--sections", "attention_stats", "--no-progress"]) == 0
    assert "probe pass" not in capsys.readouterr().err
