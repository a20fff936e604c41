"""Tests never read or write the checkout or the user's home (conftest's ``_hermetic``).

The defect this guards: a test that ran ``analyze`` with the default ``--out`` in the
working directory met the report the README's first command had just written there, and
failed; run in the other order it would have written into the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from conftest import REPO

_SEEN: list[Path] = []


def _inside(p: Path, root: Path) -> bool:
    return p.resolve().is_relative_to(root.resolve())


def test_each_test_runs_in_an_empty_folder_of_its_own():
    cwd = Path.cwd()
    assert not _inside(cwd, REPO), f"test working directory {cwd} is inside the checkout"
    assert list(cwd.iterdir()) == []
    _SEEN.append(cwd)


def test_the_next_test_gets_another_folder():
    assert _SEEN and Path.cwd() != _SEEN[0]


def test_home_and_tool_caches_are_temporary():
    home = Path(os.environ["HOME"])
    assert home == Path.home() and not _inside(home, REPO)
    assert "pytest" in str(home) or "tmp" in str(home)
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR",
                "HYPOTHESIS_STORAGE_DIRECTORY"):
        assert not _inside(Path(os.environ[var]), REPO), var
        assert not Path(os.environ[var]).resolve().is_relative_to(Path("/root").resolve()) \
            or "pytest" in os.environ[var] or "tests_home" in os.environ[var], var


def test_the_default_report_folder_lands_in_the_tests_folder():
    from tl_spectral.cli import main

    users = REPO / "tl_spectral_report"
    stamp = {f: f.stat().st_mtime_ns for f in users.rglob("*")} if users.is_dir() else {}
    assert main(["analyze", "--model", "random", "--n-docs", "2", "--length", "16",
                 "--no-progress"]) == 0
    assert (Path.cwd() / "tl_spectral_report" / "index.html").is_file()
    # the report of the README's first command, if the checkout holds one, is untouched
    assert ({f: f.stat().st_mtime_ns for f in users.rglob("*")} if users.is_dir() else {}) \
        == stamp
