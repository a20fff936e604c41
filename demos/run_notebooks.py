"""Execute the demo notebooks in a real Jupyter kernel; regenerate or check their outputs.

    python -m demos.run_notebooks                 # run every notebook, compare with the committed outputs
    python -m demos.run_notebooks --write         # run every notebook, write the outputs into it
    python -m demos.run_notebooks quickstart      # only demos/quickstart.ipynb (names or paths)
    python -m demos.run_notebooks --thumbnails    # only redraw docs/figures/notebook_*.png
    python -m demos.run_notebooks --write -j 2    # two notebooks at a time

A notebook whose cell fails is reported (the cell and its traceback) and left unchanged; the
others still run; the exit status is then 1. A kernel that dies (a cell calling ``os._exit``,
killed for memory) is one failure line within seconds, and so is a cell over the time limit
(``--timeout``). SIGINT / SIGTERM stop the run: every kernel is killed, exit status 130 / 143.

``--write`` also redraws the README's thumbnails, ``docs/figures/notebook_<name>.png``: the
image of the cell tagged ``thumbnail`` (else the first image; a wide row of panels cropped to
its left part), scaled to 360 pixels wide.

The kernel is the Python running this script (``sys.executable -m ipykernel_launcher``, from a
kernel spec written to a temporary folder: nothing is installed into the user's Jupyter), with
the repository on ``PYTHONPATH``, offline (``HF_HUB_OFFLINE``), one thread per op (so numbers
repeat) and matplotlib's inline backend. Each notebook runs in a temporary working folder
(whatever it saves goes there). Without ``--write`` the exit status is 1 when an output differs
from the committed one, and the differing cells are named. The comparison is on *normalized*
outputs (:func:`normalize_outputs`): stderr (progress bars, timings) dropped, memory
addresses, view ids, temporary paths and the circuitsvis bundle masked, images compared by
presence, numbers within a relative 1e-3 (:func:`same_output`). Writing keeps nothing of the machine in the file (no timings, no paths).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

DEMOS = Path(__file__).resolve().parent
ROOT = DEMOS.parent
FIGURES = ROOT / "docs" / "figures"
THUMB_WIDTH = 360
KERNEL = "tl-spectral-demos"
#: per-notebook execution limit (seconds per cell)
CELL_TIMEOUT = 600


def notebooks(names: list[str] | None = None) -> list[Path]:
    """The demo notebooks (all, or those named: ``quickstart``, ``demos/quickstart.ipynb``)."""
    if not names:
        return sorted(DEMOS.glob("*.ipynb"))
    out = []
    for n in names:
        p = Path(n)
        if not p.suffix:
            p = DEMOS / f"{n}.ipynb"
        if not p.exists():
            known = ", ".join(q.stem for q in sorted(DEMOS.glob("*.ipynb")))
            raise SystemExit(f"no notebook {n!r}; known: {known}")
        out.append(p.resolve())
    return out


def _kernel_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                       if p and Path(p).resolve() != ROOT])
    return {"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false"}


#: kernel managers of the notebooks running now (a signal kills their kernels); mutated only
#: under the lock, never rebound
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()
#: set by SIGINT / SIGTERM: no new notebook or cell starts
_STOP = threading.Event()
#: set while main() handles SIGINT / SIGTERM; the signals received (mutated, never rebound)
_HANDLING = threading.Event()
_SIGNALS: list[int] = []


def _on_signal(signum: int, frame: Any = None) -> None:
    """SIGINT / SIGTERM: note it, stop starting anything, kill every kernel. No exception
    from here (it could land inside nbclient's event loop): the running cells end with their
    killed kernels and :func:`execute` then raises KeyboardInterrupt."""
    _SIGNALS.append(int(signum))
    _STOP.set()
    kill_all_kernels()


def _take_signals(**_: Any) -> None:
    """nbclient's ``on_notebook_start`` hook. In the main thread nbclient routes SIGINT /
    SIGTERM to a handler of its event loop that kills this kernel and lets the run go on
    with the next notebook; route them to :func:`_on_signal` instead."""
    if _HANDLING.is_set() and threading.current_thread() is threading.main_thread():
        import asyncio

        loop = asyncio.get_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, sig)


def _restore_handlers() -> None:
    """After nbclient removed its loop's handlers (leaving the defaults): ours again."""
    if _HANDLING.is_set() and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _on_signal)


class KernelDied(RuntimeError):
    """The notebook's kernel died while a cell ran (``os._exit``, out of memory, a signal)."""


def _kill_kernel(km) -> None:
    """Kill ``km``'s kernel process now, if it runs (no shutdown request: it may be dead or
    busy) and free its ports and connection file."""
    proc = getattr(getattr(km, "provisioner", None), "process", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - a zombie is reaped by the OS
            pass
    try:
        km.cleanup_connection_file()  # synchronous (cleanup_resources is a coroutine here)
    except Exception:  # noqa: BLE001 - a file already gone
        pass


def _next_cell(running: list, number: int) -> None:
    """nbclient's hook before each cell: note its number; stop if a signal came."""
    if _STOP.is_set():
        raise KeyboardInterrupt("stopped by a signal")
    running.append(str(number))


def kill_all_kernels() -> None:
    """Kill the kernels of every notebook running now (SIGINT / SIGTERM)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for km in live:
        _kill_kernel(km)


def kernel_manager(spec_dir: Path):
    """An AsyncKernelManager whose kernel is ``sys.executable -m ipykernel_launcher``.

    Asynchronous on purpose: with the blocking manager nbclient waits for the kernel's
    messages with ``get_msg(timeout=None)``, which blocks its event loop, so the cell timeout
    and the dead-kernel check never ran and a dead kernel hung the run for good."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    kdir = spec_dir / KERNEL
    kdir.mkdir(parents=True, exist_ok=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tl_spectral demos", "language": "python", "env": _kernel_env(),
    }))
    ksm = KernelSpecManager(kernel_dirs=[str(spec_dir)])
    return AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)


def execute(path: Path, *, timeout: int = CELL_TIMEOUT):
    """Run the notebook at ``path`` top to bottom in a fresh kernel; returns the executed
    ``NotebookNode`` (the file is not touched). A cell error raises nbclient's
    ``CellExecutionError`` naming the cell; a dead kernel raises :class:`KernelDied` and a
    cell over ``timeout`` seconds nbclient's ``CellTimeoutError``, both as soon as nbclient
    notices (it checks the kernel every second)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="tls-nb-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        km = kernel_manager(Path(tmp) / "kernels")
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        running = ["?"]  # the code cell running now, for the dead-kernel message
        client = NotebookClient(nb, km=km, kernel_name=KERNEL, timeout=timeout,
                                allow_errors=False, record_timing=False,
                                resources={"metadata": {"path": str(work)}},
                                on_cell_execute=lambda cell, cell_index: _next_cell(
                                    running, code.index(cell_index) + 1),
                                on_notebook_start=_take_signals)
        with _LIVE_LOCK:
            if _STOP.is_set():
                raise KeyboardInterrupt("stopped before the notebook started")
            _LIVE.add(km)
        try:
            client.execute()
        except DeadKernelError:
            if _STOP.is_set():  # killed by SIGINT / SIGTERM: the whole run stops
                raise KeyboardInterrupt("stopped by a signal") from None
            raise KernelDied(f"{path.name}: the kernel died while code cell {running[-1]} "
                             "ran (os._exit, out of memory or a signal); no output of the "
                             "run is kept") from None
        finally:  # nbclient leaves a kernel it did not create running: stop it here
            with _LIVE_LOCK:
                _LIVE.discard(km)
            _kill_kernel(km)
            _restore_handlers()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(o) for o in coalesce_streams(cell.outputs)]
    return nb


# ------------------------------------------------------------------ normalized outputs
_NUM = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][+-]?\d+)?")
_SUBS = [
    (re.compile(r"<script>[^<]{0,200}var CircuitsVis=.*?</script>", re.S),
     "<script>BUNDLE</script>"),
    (re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+"), "data:image/png;base64,PNG"),
    (re.compile(r"tls-cv-[0-9a-f]+-\d+"), "tls-cv-ID"),
    (re.compile(r"circuits-vis-[0-9a-f-]+"), "circuits-vis-ID"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0xADDR"),
    (re.compile(r"/tmp/[^\s'\"<]*"), "/tmp/PATH"),
]


def _norm_text(text: str) -> str:
    for pat, rep in _SUBS:
        text = pat.sub(rep, text)
    return text


#: numbers compare within this relative tolerance (last-digit differences of another CPU)
REL_TOL = 1e-3


def same_output(u: str, v: str) -> bool:
    """Two normalized outputs agree: the same text around the numbers (whitespace runs
    collapsed: column widths follow the digits) and every number within ``REL_TOL``."""
    if u == v:
        return True
    nu, nv = _NUM.findall(u), _NUM.findall(v)
    if len(nu) != len(nv):
        return False
    skel = [" ".join(_NUM.sub("#", w).split()) for w in (u, v)]
    return skel[0] == skel[1] and all(
        math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-6) for a, b in zip(nu, nv))


def normalize_output(out: dict[str, Any]) -> list[str]:
    """The comparable text of one output (stderr dropped: progress bars and warnings are
    checked by the tests, not compared)."""
    kind = out.get("output_type")
    if kind == "stream":
        return [] if out.get("name") == "stderr" else ["stdout: " + _norm_text(out["text"])]
    if kind == "error":
        return [f"error: {out.get('ename')}: {out.get('evalue')}"]
    data = out.get("data", {})
    parts = []
    for mime in sorted(data):
        if mime.startswith("image/"):
            parts.append(f"{mime}: present")
        elif mime in ("text/html", "text/plain", "text/markdown"):
            v = data[mime]
            parts.append(f"{mime}: " + _norm_text(v if isinstance(v, str) else "".join(v)))
    return parts


def coalesce_streams(outputs: list) -> list:
    """Adjacent outputs of one stream (stdout, stderr) merged into one: how the kernel chunks
    a cell's prints depends on timing, what the reader sees does not."""
    merged: list = []
    for o in outputs:
        if (o.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == o.get("name")):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + o["text"]}
        else:
            merged.append(o)
    return merged


def normalize_outputs(nb) -> list[list[str]]:
    """Per code cell, the normalized text of its outputs."""
    return [[p for o in coalesce_streams(c.get("outputs", [])) for p in normalize_output(o)]
            for c in nb.cells if c.cell_type == "code"]


def differences(committed, fresh) -> list[str]:
    """One line per code cell whose normalized outputs differ (cell number and first line)."""
    a, b = normalize_outputs(committed), normalize_outputs(fresh)
    code = [c for c in fresh.cells if c.cell_type == "code"]
    msgs = []
    if len(a) != len(b):
        msgs.append(f"{len(a)} code cells committed, {len(b)} in the notebook now")
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x) != len(y) or not all(map(same_output, x, y)):
            first = (code[i].source.strip().splitlines() or [""])[0][:70]
            detail = next((f"committed {u[:120]!r} vs fresh {v[:120]!r}"
                           for u, v in zip(x, y) if not same_output(u, v)),
                          f"{len(x)} outputs committed, {len(y)} fresh")
            msgs.append(f"code cell {i + 1} ({first!r}): {detail}")
    return msgs


def thumbnail(nb, name: str) -> Path | None:
    """Write ``docs/figures/notebook_<name>.png`` from the notebook's tagged (else first)
    image output; returns the path (None when the notebook shows no image)."""
    import base64
    import io

    from PIL import Image

    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "thumbnail" in c.metadata.get("tags", [])]
    for cell in tagged + code:
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                img = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
                if img.width > 2.2 * img.height:  # a row of panels: crop to the first ones
                    img = img.crop((0, 0, round(1.5 * img.height), img.height))
                h = round(img.height * THUMB_WIDTH / img.width)
                img = img.resize((THUMB_WIDTH, h), Image.LANCZOS)
                path = FIGURES / f"notebook_{name}.png"
                img = img.convert("P", palette=Image.ADAPTIVE, colors=128)  # a third the size
                img.save(path, optimize=True)
                return path
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="notebooks (stem or path); default: all in demos/")
    ap.add_argument("--write", action="store_true",
                    help="write the fresh outputs into the notebooks (else: compare)")
    ap.add_argument("-j", "--jobs", type=int, default=1,
                    help="notebooks run at the same time (one kernel each; default 1)")
    ap.add_argument("--thumbnails", action="store_true",
                    help="only redraw docs/figures/notebook_*.png from the committed outputs")
    ap.add_argument("--timeout", type=int, default=CELL_TIMEOUT,
                    help=f"seconds one cell may run (default {CELL_TIMEOUT})")
    args = ap.parse_args(argv)
    if args.timeout < 1 or args.jobs < 1:
        ap.error("--timeout and -j/--jobs must be at least 1")
    import nbformat

    if args.thumbnails:
        for path in notebooks(args.names):
            print(path.name, "->", thumbnail(nbformat.read(path, as_version=4), path.stem))
        return 0

    with _signals_stop():
        try:
            return _run_all(args, notebooks(args.names), nbformat)
        except KeyboardInterrupt:
            kill_all_kernels()
            code = 128 + (_SIGNALS[-1] if _SIGNALS else signal.SIGINT)
            print(f"stopped by {signal.Signals(code - 128).name}: every kernel killed, no "
                  "notebook written after the signal", file=sys.stderr, flush=True)
            return code


class _signals_stop:
    """Context: SIGINT / SIGTERM go to :func:`_on_signal` (kill every kernel, start nothing
    more); the old handlers come back after."""

    def __init__(self):
        self.old: dict = {}

    def __enter__(self):
        _STOP.clear()
        del _SIGNALS[:]
        if threading.current_thread() is threading.main_thread():
            _HANDLING.set()
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, _on_signal)
        return self

    def __exit__(self, *exc):
        _HANDLING.clear()
        for sig, old in self.old.items():
            signal.signal(sig, old)
        return False


def _run_all(args, paths: list[Path], nbformat) -> int:
    """Run (and write or compare) ``paths``; the exit status."""
    def run(path: Path):
        t0 = time.perf_counter()
        try:
            return execute(path, timeout=args.timeout), time.perf_counter() - t0
        except Exception as exc:  # a cell error: report it, keep the committed file
            return exc, time.perf_counter() - t0

    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(args.jobs)
        try:
            runs = list(pool.map(run, paths))
        finally:  # on a signal: queued notebooks never start, running ones lost their kernel
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        runs = map(run, paths)
    stale = failed = 0
    for path, (fresh, took) in zip(paths, runs):
        if _STOP.is_set():
            raise KeyboardInterrupt("stopped by a signal")
        if isinstance(fresh, KernelDied):
            failed += 1
            print(f"{path.name}: FAILED after {took:.0f} s: {fresh}", flush=True)
            continue
        if isinstance(fresh, Exception):
            failed += 1
            lines = re.sub(r"\x1b\[[0-9;]*m", "", str(fresh)).strip().splitlines()
            print(f"{path.name}: FAILED after {took:.0f} s (the file is unchanged)")
            print("\n".join("  " + ln for ln in lines[-25:]))
            continue
        size = len(nbformat.writes(fresh).encode())
        if args.write:
            nbformat.write(fresh, path)
            thumb = thumbnail(fresh, path.stem)
            print(f"{path.name}: written ({took:.0f} s, {size / 1e6:.2f} MB)"
                  + (f", {thumb.relative_to(ROOT)}" if thumb else ""), flush=True)
            continue
        diff = differences(nbformat.read(path, as_version=4), fresh)
        stale += bool(diff)
        print(f"{path.name}: {'STALE' if diff else 'up to date'} ({took:.0f} s, "
              f"{size / 1e6:.2f} MB)", flush=True)
        for line in diff:
            print("  " + line)
    if stale:
        print(f"{stale} notebook(s) stale: regenerate with `python -m demos.run_notebooks "
              "--write`")
    if failed:
        print(f"{failed} notebook(s) failed")
    return 1 if stale or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
