"""Progress bars: tqdm.auto with ipywidgets, plain text tqdm without (no TqdmWarning)."""

from __future__ import annotations

import importlib.util
import io
import sys
import types
import warnings

import tqdm.std

from tl_spectral import progress


def test_text_bar_without_ipywidgets(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    # pretend to be inside a Jupyter kernel: tqdm.auto would warn here without ipywidgets
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("zmqshell"))
    assert progress.tqdm_class() is tqdm.std.tqdm
    buf = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(progress.progress_bar(range(3), file=buf, desc="x")) == [0, 1, 2]
    assert "3/3" in buf.getvalue()


def test_auto_bar_with_ipywidgets(monkeypatch):
    monkeypatch.setattr(progress, "_has_ipywidgets", lambda: True)
    import tqdm.auto

    assert progress.tqdm_class() is tqdm.auto.tqdm


def test_quiet_tqdm_auto_in_a_kernel_without_ipywidgets(tmp_path):
    """A fresh interpreter that looks like a kernel: importing tl_spectral, then tqdm.auto
    (as TransformerLens does), warns nothing."""
    import subprocess

    code = ("import sys, types, warnings, importlib.util\n"
            "sys.modules['ipykernel'] = types.ModuleType('ipykernel')\n"
            "sys.modules['ipykernel.zmqshell'] = types.ModuleType('ipykernel.zmqshell')\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'ipywidgets' else real(n, *a)\n"
            "warnings.simplefilter('error')\n"
            "import tl_spectral\n"
            "import tqdm.auto\n"
            "print(tqdm.auto.tqdm.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in ("tqdm.std", "tqdm.asyncio")  # the text bar
