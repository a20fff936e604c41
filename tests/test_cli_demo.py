"""The CLI report and the quickstart demo, end to end (small sizes)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_analyze_random_model_offline_report(tmp_path):
    from tl_spectral.cli import main

    out = tmp_path / "rep"
    rc = main(["analyze", "--model", "random", "--n-docs", "4", "--length", "64", "--out",
               str(out), "--no-progress", "--sections", "attention_stats"])
    assert rc == 0
    index = (out / "index.html").read_text()
    assert "Attention statistics" in index and "data:image/png;base64," in index
    views = list((out / "views").glob("*.html"))
    assert views, "circuitsvis view missing"
    v = views[0].read_text()
    assert "CircuitsVis" in v and "unpkg.com" not in v and "cdn." not in v.lower()[:5000]
    assert (out / "results" / "attention_stats.safetensors").exists()


def test_analyze_errors(tmp_path):
    from tl_spectral.cli import main

    with pytest.raises(SystemExit, match="context"):
        main(["analyze", "--model", "random", "--length", "999", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown sections"):
        main(["analyze", "--model", "random", "--n-docs", "2", "--length", "32",
              "--sections", "nope", "--out", str(tmp_path)])
    with pytest.raises(FileNotFoundError):
        main(["analyze", "--model", "random", "--corpus", str(tmp_path / "missing.txt"),
              "--out", str(tmp_path)])


def test_cli_help_runs():
    r = subprocess.run([sys.executable, "-m", "tl_spectral.cli", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "analyze" in r.stdout


def test_quickstart_demo_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKSTART_N_DOCS", "8")
    monkeypatch.setattr(sys, "argv", ["quickstart.py", str(tmp_path)])
    runpy.run_path(str(ROOT / "demos" / "quickstart.py"), run_name="__main__")
    assert (tmp_path / "attention_stats.png").exists()
    assert (tmp_path / "attention_stats.safetensors").exists()


def test_analyze_scale_pod_section(tmp_path):
    from tl_spectral.cli import main
    from tl_spectral.results import Result

    out = tmp_path / "rep"
    assert main(["analyze", "--model", "random", "--n-docs", "4", "--length", "32", "--out",
                 str(out), "--no-progress", "--sections", "scale_pod"]) == 0
    index = (out / "index.html").read_text()
    assert "Scale-selective POD" in index and "head allocation" in index
    pod = Result.load(out / "results" / "scale_pod.safetensors")
    assert pod.n_layers == 6 and sum(r["recommended"] for r in pod.allocation) == 48
