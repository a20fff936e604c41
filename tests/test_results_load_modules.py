"""Issue 36 item 2: ``Result.load`` imports only modules that define result kinds.

A file's header names the module of its kind; before the fix any ``tl_spectral.…`` name
passed, so a header naming ``tl_spectral.__main__`` made ``load`` run the command line
(and ``sys.exit(2)`` in the caller)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tl_spectral
from tl_spectral.results import _REGISTRY, _RESULT_MODULES, _loadable

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, sys
import torch
from safetensors.torch import save_file
from tl_spectral.results import Result
module, path = sys.argv[1], sys.argv[2]
header = {"format": "tl_spectral.result/1", "kind": "made_up_kind", "module": module,
          "fields": {}}
save_file({"x": torch.zeros(1)}, path, metadata={"tl_spectral": json.dumps(header)})
try:
    Result.load(path)
except ValueError as exc:
    print("REFUSED", json.dumps(str(exc)))
print("IMPORTED", json.dumps(sorted(m for m in ("tl_spectral.__main__", "tl_spectral.cli")
                                    if m in sys.modules)))
"""


@pytest.mark.parametrize("module", ["tl_spectral.__main__", "tl_spectral.cli"])
def test_a_header_naming_the_command_line_is_refused_and_nothing_runs(tmp_path, module):
    """Run in a fresh process: the module must not even be imported, the caller must not
    exit, and the refusal is one line naming the module."""
    r = subprocess.run([sys.executable, "-c", _PROBE, module, str(tmp_path / "r.safetensors")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert "REFUSED" in lines, r.stdout
    message = json.loads(lines["REFUSED"])
    assert "\n" not in message and module in message and "never imported" in message
    assert json.loads(lines["IMPORTED"]) == []


def test_the_allow_list_is_the_registry_s_library_modules():
    """Every module that registers a library result kind is loadable (the allow-list, or a
    module of tl_spectral.probes: a new probe module needs no line), once every module of
    the package is imported; no line of the allow-list is stale, and nothing else of the
    package is loadable."""
    for info in pkgutil.walk_packages(tl_spectral.__path__, "tl_spectral."):
        if info.name not in ("tl_spectral.__main__", "tl_spectral.models.surgery",
                             "tl_spectral.models.ablations"):  # the last two: old paths
            importlib.import_module(info.name)
    library = {cls.__module__ for cls in _REGISTRY.values()
               if cls.__module__.startswith("tl_spectral.")} - {"tl_spectral.results"}
    assert {m for m in library if not _loadable(m)} == set()
    assert _RESULT_MODULES <= library
    assert not {"tl_spectral.__main__", "tl_spectral.cli"} & _RESULT_MODULES
    others = {info.name for info in pkgutil.walk_packages(tl_spectral.__path__, "tl_spectral.")
              if not info.name.startswith("tl_spectral.probes.")}
    assert {m for m in others if _loadable(m)} == _RESULT_MODULES - {
        m for m in _RESULT_MODULES if m.startswith("tl_spectral.probes.")}


def test_a_file_naming_a_moved_module_loads_from_the_new_one_without_a_warning():
    """Files written before the interventions left models/ name ``tl_spectral.models.surgery``
    or ``.ablations``: they load through the new module, silently (a file is not the user's
    code), and the deprecated old path is never imported."""
    code = ("import sys, warnings\n"
            "from pathlib import Path\n"
            "warnings.simplefilter('error')\n"
            "from tl_spectral.results import _result_class\n"
            "a = _result_class('linearization_curve', 'tl_spectral.models.surgery', Path('f'))\n"
            "b = _result_class('routing_ablation', 'tl_spectral.models.ablations', Path('f'))\n"
            "print(a.__module__, b.__module__, sorted(m for m in sys.modules\n"
            "      if m in ('tl_spectral.models.surgery', 'tl_spectral.models.ablations')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["tl_spectral.interventions.surgery",
                                "tl_spectral.interventions.ablations", "[]"]
