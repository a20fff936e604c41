"""Issue 30 items 6–8: the command line never replaces what it did not check — an
``--out`` folder created or replaced while ``analyze`` ran, a foreign ``geometry --out``
folder, a symbolic link — and a killed run's temporary folders are removed by the next run
(only provably its own: the pid in their name and no longer alive)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BASE = ["analyze", "--model", "random", "--n-docs", "2", "--length", "16", "--no-progress",
        "--sections", "attention_stats"]


def _fake_build_report(ctx, *a, **k):
    """A stand-in for the report (these tests are about the folders, not the probes)."""
    (ctx.out_dir / "index.html").write_text("<p>report</p>")


def _hook_build_report(monkeypatch, after, *, real_report=False):
    """Run ``after()`` once, after the report is built and before it is swapped in."""
    import tl_spectral.viz.sections as sections

    real = sections.build_report if real_report else _fake_build_report
    calls = []

    def build(*a, **k):
        r = real(*a, **k)
        if not calls:
            calls.append(1)
            after()
        return r

    monkeypatch.setattr(sections, "build_report", build)
    return calls


def test_a_folder_created_during_analyze_is_not_replaced(tmp_path, monkeypatch, capsys):
    from tl_spectral.cli import main

    out = tmp_path / "rep"

    def user_makes_it():
        out.mkdir()
        (out / "mine.txt").write_text("keep me")

    calls = _hook_build_report(monkeypatch, user_makes_it)
    assert main([*BASE, "--out", str(out)]) == 2
    assert calls
    assert "changed while this run was writing" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep")]  # no temp left


def test_an_empty_folder_filled_during_analyze_is_not_replaced(tmp_path, monkeypatch):
    from tl_spectral.cli import main

    out = tmp_path / "rep"
    out.mkdir()  # empty: accepted at the start
    _hook_build_report(monkeypatch, lambda: (out / "mine.txt").write_text("keep me"),
                       real_report=True)
    assert main([*BASE, "--out", str(out)]) == 2
    assert (out / "mine.txt").read_text() == "keep me"


def test_concurrent_analyze_into_one_out(tmp_path, monkeypatch, capsys):
    """Run B starts and finishes inside run A (into the same --out, both see it absent at
    their start): B's report stays, A refuses to replace it."""
    from tl_spectral.cli import REPORT_MARKER, main

    out = tmp_path / "rep"
    codes = []
    _hook_build_report(monkeypatch, lambda: codes.append(
        main([*BASE, "--seed", "1", "--out", str(out)])))
    assert main([*BASE, "--out", str(out)]) == 2
    assert codes == [0]
    assert '"seed": 1' in (out / REPORT_MARKER).read_text()  # B's report, whole
    assert not [p for p in tmp_path.iterdir() if p.name != "rep"]


def test_overwrite_replaces_only_the_report_checked_at_the_start(tmp_path, monkeypatch):
    import tl_spectral.viz.sections as sections
    from tl_spectral.cli import REPORT_MARKER, main

    monkeypatch.setattr(sections, "build_report", _fake_build_report)
    out = tmp_path / "rep"
    assert main([*BASE, "--out", str(out)]) == 0
    # another run replaces the report while ours (--overwrite) runs: ours refuses
    _hook_build_report(monkeypatch, lambda: main([*BASE, "--seed", "3", "--out", str(out),
                                                  "--overwrite"]))
    assert main([*BASE, "--out", str(out), "--overwrite"]) == 2
    assert '"seed": 3' in (out / REPORT_MARKER).read_text()
    monkeypatch.setattr(sections, "build_report", _fake_build_report)
    assert main([*BASE, "--out", str(out), "--overwrite"]) == 0  # unchanged: replaced
    assert '"seed": 0' in (out / REPORT_MARKER).read_text()


def test_out_symlink_and_current_folder_are_refused(tmp_path, monkeypatch, capsys):
    from tl_spectral.cli import main

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    for argv, msg in ((["--out", "link", "--overwrite"], "symbolic link"),
                      (["--out", "."], "current folder"),
                      (["--out", str(tmp_path.parent)], "current folder")):
        assert main([*BASE, *argv]) == 2
        assert msg in capsys.readouterr().err
        assert main(["geometry", "--model", "random", *argv]) == 2
        assert msg in capsys.readouterr().err
    assert (tmp_path / "link").is_symlink() and not any(real.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_geometry_out_refuses_a_foreign_folder_then_replaces_its_own(tmp_path, capsys):
    from tl_spectral.cli import GEOMETRY_MARKER, main

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "heads.csv").write_text("mine")
    assert main(["geometry", "--model", "random", "--out", str(theirs)]) == 2
    assert "not a tl_spectral geometry folder" in capsys.readouterr().err
    assert (theirs / "heads.csv").read_text() == "mine"
    out = tmp_path / "g"
    assert main(["geometry", "--model", "random", "--out", str(out)]) == 0
    assert (out / GEOMETRY_MARKER).is_file() and (out / "geometry.png").stat().st_size
    assert main(["geometry", "--model", "random", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    (out / "stale.txt").write_text("old")
    assert main(["geometry", "--model", "random", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g", "theirs"]


_KILLED = """
import os, signal, sys
import tl_spectral.viz.sections as s
def build(ctx, *a, **k):
    (ctx.out_dir / "index.html").write_text("half")
    os.kill(os.getpid(), signal.SIGKILL)
s.build_report = build
from tl_spectral.cli import main
main(sys.argv[1:])
"""


def test_sigkill_leftovers_are_removed_by_the_next_run(tmp_path, monkeypatch):
    import tl_spectral.viz.sections as sections
    from tl_spectral.cli import main

    monkeypatch.setattr(sections, "build_report", _fake_build_report)
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, "-c", _KILLED, *BASE, "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".rep.tmp-")]
    assert len(left) == 1 and (left[0] / "index.html").is_file()
    # a live process's temporary folder (ours) and a foreign look-alike are kept
    alive = tmp_path / f".rep.tmp-{os.getpid()}-abc"
    alive.mkdir()
    foreign = tmp_path / ".rep.tmp-xyz"
    foreign.mkdir()
    assert main([*BASE, "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["rep", alive.name, foreign.name])


def test_dead_rank_scratch_folders_are_recognised(tmp_path):
    from tl_spectral.cli import RANK_SCRATCH_PATTERN, _remove_dead_leftovers

    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    dead = int(p.stdout)
    (tmp_path / f"tl_spectral-analyze-rank1-{dead}-k3j_x").mkdir()
    (tmp_path / f"tl_spectral-analyze-rank0-{os.getpid()}-abc").mkdir()
    (tmp_path / "tl_spectral-analyze-rank0-notapid-abc").mkdir()
    gone = _remove_dead_leftovers(tmp_path, [RANK_SCRATCH_PATTERN])
    assert [g.name for g in gone] == [f"tl_spectral-analyze-rank1-{dead}-k3j_x"]
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.parametrize("seed", [str(2**70), "-1"])
def test_seed_out_of_range_is_a_clear_error(seed, capsys):
    from tl_spectral.cli import main

    assert main([*BASE, "--seed", seed]) == 2
    err = capsys.readouterr().err
    assert f"--seed {seed} is out of range" in err and "\n" not in err.strip()


@pytest.mark.parametrize("cmd", [["study", "scale-pod"],
                                 ["study", "surgery", "train-alloc"]])
def test_study_seed_out_of_range_is_a_clear_error(cmd, capsys):
    from tl_spectral.cli import _study_entry_points, main

    if cmd[1] not in _study_entry_points():
        pytest.skip(f"study {cmd[1]} not installed")
    assert main([*cmd, "--seed", str(2**70)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--seed" in err and "out of range" in err and len(err.splitlines()) == 1, err
