"""The built wheel works anywhere: installed without -e into a folder of its own, run from a
temporary directory outside the repository (no checkout, no ../shared, no docs/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd, cwd, env, timeout=900):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    dist, site, work = tmp_path / "dist", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # built from a copy: an in-place build writes build/ and *.egg-info into the checkout
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", "build", "dist", "*.egg-info", "tl_spectral_report",
        "docs", "demos", "runs", "out", ".hypothesis", ".pytest_cache", ".ruff_cache"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(dist), str(src)], cwd=tmp_path, env=env)
    wheels = list(dist.glob("tl_spectral-*.whl"))
    assert len(wheels) == 1
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
          str(wheels[0])], cwd=tmp_path, env=env)
    env["PYTHONPATH"] = str(site)
    r = _run([sys.executable, "-c", "import tl_spectral, tl_spectral_studies.contributions as c; "
              "print(tl_spectral.__file__); print(c.__file__)"], cwd=work, env=env)
    for line in r.stdout.split():
        assert Path(line).resolve().is_relative_to(site.resolve()), line
    # the main command on the bundled defaults
    _run([sys.executable, "-m", "tl_spectral", "analyze", "--n-docs", "8", "--length", "64",
          "--out", "report", "--no-progress"], cwd=work, env=env)
    index = (work / "report" / "index.html").read_text()
    assert "Attention statistics" in index and "Scale-selective POD" in index
    assert (work / "report" / ".tl_spectral_report.json").is_file()
    assert (work / "report" / "results" / "attention_stats.safetensors").is_file()
    # a study, quick
    _run([sys.executable, "-m", "tl_spectral", "study", "contributions", "--quick", "--out",
          "study"], cwd=work, env=env)
    summary = work / "study" / "char_shakespeare_summary.json"
    assert summary.is_file() and "| attention |" in summary.read_text()
    assert list((work / "study" / "figures").glob("contributions_char_shakespeare_*.png"))
    assert not (work / "runs").exists() and not (work / "docs").exists()
