"""Issue 30 items 6–8: the command line never replaces what it did not check — an
``--out`` folder created or replaced while ``analyze`` ran, a foreign ``geometry --out``
folder, a symbolic link — and a killed run's temporary folders are removed by the next run
(only provably its own: the pid in their name and no longer alive)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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


# ------------------------------------------------ real processes (no simulation, no sleeps)
def _analyze(out, *extra):
    """A real ``tl-spectral analyze`` process (the smallest settings of these tests)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen([sys.executable, "-m", "tl_spectral", *BASE, "--out", str(out),
                             *extra], cwd=out.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(p):
    out, err = p.communicate(timeout=600)
    return p.returncode, err


def _complete_report(out, seed):
    from tl_spectral.cli import REPORT_MARKER
    from tl_spectral.results import Result

    assert (out / "index.html").is_file()
    assert f'"seed": {seed}' in (out / REPORT_MARKER).read_text()
    assert Result.load(out / "results" / "attention_stats.safetensors").kind == "attention_stats"


def _refusal(err):
    line = err.strip().splitlines()[-1]
    assert line.startswith("tl-spectral analyze: error: --out "), err
    assert "--overwrite" in line or "changed while this run was writing" in line, line


def test_two_real_analyze_processes_into_one_new_out(tmp_path):
    """Started together into the same --out (absent): whatever the interleaving, exactly one
    writes its whole report (exit 0), the other refuses (exit 2, one line naming --out),
    and the parent holds nothing else (no temporary folder, no lock file)."""
    out = tmp_path / "rep"
    runs = {seed: _analyze(out, "--seed", str(seed)) for seed in (1, 2)}
    done = {seed: _finish(p) for seed, p in runs.items()}
    codes = sorted(rc for rc, _ in done.values())
    assert codes == [0, 2], {s: err[-2000:] for s, (_, err) in done.items()}
    winner = next(s for s, (rc, _) in done.items() if rc == 0)
    loser = next(s for s, (rc, _) in done.items() if rc == 2)
    _refusal(done[loser][1])
    _complete_report(out, winner)
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


_USER = """
import os, sys
out = sys.argv[1]
try:
    os.mkdir(out)
except FileExistsError:
    print("exists")
else:
    with open(os.path.join(out, "mine.txt"), "w") as fh:
        fh.write("keep me")
    print("made")
"""


def test_a_real_process_creates_the_out_folder_during_a_real_run(tmp_path):
    """Another process makes --out, with a file of the user's in it, once the run's
    temporary folder exists (watched for, not slept on). If it got there first the run
    refuses and the user's folder is exactly as they left it; if the run had already swapped
    its report in, the user's mkdir fails and the report is whole. Either way nothing is
    left in the parent."""
    out = tmp_path / "rep"
    run = _analyze(out)
    while not any(p.name.startswith(".rep.tmp-") for p in tmp_path.iterdir()):
        try:  # poll: the run must make its temporary folder before it can end
            run.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"the run ended without a temporary folder: "
                             f"{run.communicate()[1][-2000:]}")
    user = subprocess.run([sys.executable, "-c", _USER, str(out)], capture_output=True,
                          text=True, timeout=300, check=True).stdout.strip()
    rc, err = _finish(run)
    if user == "made":
        assert rc == 2, err[-2000:]
        _refusal(err)
        assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
        assert (out / "mine.txt").read_text() == "keep me"
    else:
        assert user == "exists" and rc == 0, err[-2000:]
        _complete_report(out, 0)
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


_RANK_WORKER = """
import sys
import tl_spectral.probes as probes
mode = sys.argv[1]
def run_probes(*a, **k):  # reached inside the rank's scratch folder (made by the CLI)
    if mode == "block":
        print("ready", flush=True)
        sys.stdin.read()  # until the test closes stdin or kills this process
    raise SystemExit(3)
probes.run_probes = run_probes
from tl_spectral.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _rank_pair(mode, port, tmpdir, out):
    """Two real ``analyze`` workers as torchrun starts them (RANK, WORLD_SIZE, MASTER_*),
    their temporary folder ``tmpdir``; each stops where it would run its probes."""
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TMPDIR": str(tmpdir),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [
                   os.environ.get("PYTHONPATH")])])}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _RANK_WORKER, mode, *BASE, "--out", str(out)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    return procs


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_sigkilled_torchrun_worker_scratch_is_removed_by_the_next_run(tmp_path):
    """Real workers (gloo): rank 1 is SIGKILLed inside its scratch folder, rank 0 stays alive
    in its own. The next run's workers remove the dead one's folder and keep the live one's;
    nothing is left once every worker has ended."""
    import signal

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    first = _rank_pair("block", _free_port(), scratch, tmp_path / "rep")
    for p in first:  # both inside their scratch folders: a real synchronisation point
        line = p.stdout.readline()
        assert line.strip() == "ready", p.communicate()[1][-3000:]
    def ranks():  # the workers' scratch folders (TMPDIR holds others' files too)
        return sorted(n.name for n in scratch.iterdir()
                      if n.name.startswith("tl_spectral-analyze-rank"))

    folders = {int(n.split("-")[2][4:]): n for n in ranks()}
    assert sorted(folders) == [0, 1], folders
    assert folders[1].startswith(f"tl_spectral-analyze-rank1-{first[1].pid}-")
    first[1].send_signal(signal.SIGKILL)
    assert first[1].wait(timeout=60) == -signal.SIGKILL
    assert (scratch / folders[1]).is_dir()  # killed: its folder outlives it
    second = _rank_pair("exit", _free_port(), scratch, tmp_path / "rep")
    for p in second:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 3, err[-3000:]  # both got past the clean-up to their probes
    assert first[0].poll() is None  # rank 0 of the first run is still alive …
    assert ranks() == [folders[0]]  # … and keeps its own
    first[0].communicate(input="", timeout=60)  # ends it: its folder goes with it
    assert first[0].returncode == 3
    assert ranks() == []
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"]  # no report, no temporary --out
