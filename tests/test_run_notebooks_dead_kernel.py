"""Issue 36 item 4: ``python -m demos.run_notebooks`` hung for good when a kernel died (the
blocking KernelManager's ``get_msg(timeout=None)`` blocked nbclient's event loop, so the cell
timeout and the dead-kernel check never ran) and ignored SIGTERM / SIGINT. A dead kernel is
now one failure line within seconds; a signal kills every kernel and stops the run.

Each run is a subprocess with an overall timeout, so a regression fails instead of hanging;
the order of events is fixed by a file the cell writes, never by sleeping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
OVERALL = 240  # seconds: far above the few seconds a run takes, far below a hang


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_dead_kernel_is_one_failure_not_a_hang(tmp_path):
    nb = _notebook(tmp_path / "dies.ipynb", "print(1)", "import os\nos._exit(3)", "print(2)")
    r = subprocess.run([sys.executable, "-m", "demos.run_notebooks", str(nb), "--timeout", "60"],
                       capture_output=True, text=True, timeout=OVERALL, cwd=tmp_path, env=_env())
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith("dies.ipynb: FAILED")]
    assert len(failed) == 1 and "the kernel died while code cell 2 ran" in failed[0], r.stdout
    assert "1 notebook(s) failed" in r.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_kills_the_kernels_and_stops_the_run(tmp_path, sig):
    mark = tmp_path / "kernel.pid"
    first = _notebook(tmp_path / "sleeps.ipynb",
                      "import os, time, pathlib\n"
                      f"pathlib.Path({str(mark)!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(3600)")
    second = _notebook(tmp_path / "never.ipynb",
                       f"import pathlib; pathlib.Path({str(tmp_path / 'ran')!r}).touch()")
    proc = subprocess.Popen([sys.executable, "-m", "demos.run_notebooks", str(first), str(second)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=_env())
    try:
        deadline = time.monotonic() + OVERALL
        while not (mark.exists() and mark.read_text()):  # the cell runs in its kernel
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        kernel = int(mark.read_text())
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=OVERALL)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out + err[-3000:]
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert not (tmp_path / "ran").exists()  # the next notebook never started
    with pytest.raises(ProcessLookupError):
        os.kill(kernel, 0)
