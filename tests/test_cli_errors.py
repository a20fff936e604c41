"""Every user error of the command line, through the real console script: exit status 2,
one line on stderr, no traceback, and nothing loaded or written before the check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("tl-spectral")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "tl_spectral"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([*exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)


def _cases(tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "empty.txt").write_text("")
    (tmp / "latin1.txt").write_bytes(b"plain text then caf\xe9 and more")
    (tmp / "short.txt").write_text("To be or not to be. " * 20)
    (tmp / "afile").write_text("x")
    (tmp / "bad.json").write_text("{not json")
    (tmp / "nomodel.json").write_text(json.dumps({"train": {"steps": 3}}))
    (tmp / "badmodel.json").write_text(json.dumps({"model": {"n_layers": -1, "d_model": 8}}))
    ok = {"model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 16,
                    "d_head": 8, "n_ctx": 32, "d_mlp": 32},
          "train": {"steps": 2, "warmup_steps": 0}}
    (tmp / "ok.json").write_text(json.dumps(ok))
    (tmp / "theirs").mkdir()
    (tmp / "theirs" / "notes.txt").write_text("keep me")
    return [
        (["analyze", "--model", "no-such-model"], "unknown model"),
        (["analyze", "--corpus", str(tmp / "missing.txt")], "missing.txt"),
        (["analyze", "--corpus", str(tmp / "empty.txt")], "empty"),
        (["analyze", "--corpus", str(tmp / "latin1.txt")], "byte offset 19"),
        (["analyze", "--n-docs", "0"], "--n-docs 0"),
        (["analyze", "--n-docs", "-3"], "--n-docs -3"),
        (["analyze", "--length", "1"], "--length 1"),
        (["analyze", "--batch-size", "0"], "--batch-size 0"),
        (["analyze", "--n-docs", "abc"], "invalid int value"),
        (["analyze", "--corpus", str(tmp / "short.txt"), "--n-docs", "64", "--length", "256"],
         "--overlap"),
        (["analyze", "--length", "4096"], "context"),
        (["analyze", "--sections", "nope"], "attention_stats"),
        (["analyze", "--out", str(tmp / "afile")], "is a file"),
        (["analyze", "--out", str(tmp / "theirs")], "not a tl_spectral report"),
        (["analyze", "--out", "/proc/tl_spectral_report"], "not writable"),
        (["analyze", "--out", str(tmp / "afile" / "sub")], "not a folder"),
        (["analyze", "--no-such-flag"], "unrecognized arguments"),
        (["train", "--config", str(tmp / "missing.json")], "no config file"),
        (["train", "--config", str(tmp / "bad.json")], "not valid JSON"),
        (["train", "--config", str(tmp / "nomodel.json")], "no 'model' section"),
        (["train", "--config", str(tmp / "badmodel.json")], "badmodel.json"),
        (["train", "--config", str(tmp / "ok.json"), "--steps", "0"], "--steps 0"),
        (["train", "--config", str(tmp / "ok.json"), "--steps", "-5"], "--steps -5"),
        (["study", "no-such-study"], "unknown study"),
        (["study", "contributions", "--model", "minilm"], "--data-dir"),
        (["geometry", "--model", "no-such-model"], "unknown model"),
        (["frobnicate"], "unknown command"),
    ]


def test_user_errors_are_one_line_exit_2(tmp_path):
    failures = []
    for argv, needle in _cases(tmp_path):
        r = run_cli(*argv, cwd=tmp_path)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        ok = (r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
              and needle in lines[0])
        if not ok:
            failures.append((argv, r.returncode, r.stderr[-500:]))
    assert not failures, failures
    # nothing was written for the refused commands
    assert not (tmp_path / "tl_spectral_report").exists()
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["notes.txt"]


def test_debug_shows_the_traceback(tmp_path):
    r = run_cli("analyze", "--n-docs", "0", "--debug", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_zoo_name_wins_over_a_local_folder(tmp_path):
    """A folder named like a zoo model does not shadow the zoo; ./name selects the folder."""
    from tl_spectral.cli import resolve_model
    from tl_spectral.usage import UsageError

    d = tmp_path / "char-shakespeare"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")  # (a folder without weights is refused)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve_model("char-shakespeare") == ("zoo", "char-shakespeare")
        assert resolve_model("./char-shakespeare")[0] == "hf"
        (tmp_path / "mine").mkdir()
        with pytest.raises(UsageError, match=r"\./mine"):
            resolve_model("mine")
    finally:
        os.chdir(cwd)


def test_version_and_help(tmp_path):
    from tl_spectral.viz.sections import section_keys

    r = run_cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("tl-spectral ")
    r = run_cli("study", "--help", cwd=tmp_path)
    assert r.returncode == 0
    for name in ("routing", "surgery", "scale-pod", "contributions"):
        assert name in r.stdout
    r = run_cli("analyze", "--help", cwd=tmp_path)
    assert r.returncode == 0
    for key in section_keys():  # every registered section, derived (no list here)
        assert key in r.stdout


#: the built-in sections in report order (their ``order``): a new section may go anywhere,
#: these keep their relative order (the report's layout)
BUILTIN_ORDER = ("sanity", "attention_stats", "head_scores", "scale_pod", "routing_filtering",
                 "contributions", "surgery")


def test_section_keys_come_from_the_one_registry():
    """The CLI reads --sections from the sections' own registry (no list of its own), and
    that registry is filled by the section modules found by file (viz/*_section.py)."""
    import tl_spectral.cli as cli
    from tl_spectral.viz.context import register_section
    from tl_spectral.viz.sections import SECTION_MODULES, SECTIONS, section_keys

    assert not hasattr(cli, "SECTION_KEYS")
    keys = section_keys()
    assert keys == tuple(f().key for f in SECTIONS)
    on_disk = {f"tl_spectral.viz.{p.stem}" for p in
               (Path(cli.__file__).parent / "viz").glob("*_section.py")}
    assert set(SECTION_MODULES) == on_disk and len(on_disk) >= 6
    builtin = {f.__module__ for f in SECTIONS if f.__module__.startswith("tl_spectral.")}
    assert on_disk <= builtin <= on_disk | {"tl_spectral.viz.sections"}
    orders = [getattr(f, "order", 100) for f in SECTIONS]
    assert orders == sorted(orders)
    assert [k for k in keys if k in BUILTIN_ORDER] == list(BUILTIN_ORDER)

    class Extra:
        key, title, order = "extra_test_section", "Extra", 25

    try:
        register_section(Extra)
        after = [k for k in section_keys() if k in (*BUILTIN_ORDER, "extra_test_section")]
        assert after == [*BUILTIN_ORDER[:4], "extra_test_section", *BUILTIN_ORDER[4:]]
        with pytest.raises(ValueError, match="already registered"):
            register_section(type("Other", (), {"key": "scale_pod"}))
    finally:
        SECTIONS.remove(Extra)


def test_geometry_command(tmp_path):
    r = run_cli("geometry", "--model", "sd-char-shakespeare-noln", "--out", str(tmp_path / "g"),
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "routing_fraction" in r.stdout
    assert (tmp_path / "g" / "heads.csv").stat().st_size > 0
    assert (tmp_path / "g" / "geometry.png").stat().st_size > 0
    rows = (tmp_path / "g" / "layers.csv").read_text().splitlines()
    assert len(rows) == 7  # header + 6 layers


def test_analyze_refuses_then_replaces_an_old_report(tmp_path):
    from tl_spectral.cli import REPORT_MARKER, main

    out = tmp_path / "rep"
    base = ["analyze", "--model", "random", "--n-docs", "2", "--length", "32", "--out", str(out),
            "--no-progress", "--sections", "attention_stats"]
    assert main(base) == 0
    assert (out / REPORT_MARKER).is_file()
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask  # not mkdtemp's 0700
    (out / "results" / "stale.safetensors").write_text("old")
    assert main(base) == 2  # an earlier report needs --overwrite
    assert (out / "results" / "stale.safetensors").exists()
    assert main([*base, "--overwrite"]) == 0
    assert not (out / "results" / "stale.safetensors").exists()  # replaced whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep")]  # no temp left
    shutil.rmtree(out)


def test_model_and_corpus_loading_live_in_the_library():
    """load_corpus / check_corpus are tl_spectral.data's, model loading by name is
    tl_spectral.models.loading's; tl_spectral.cli re-exports them for the studies."""
    import tl_spectral.cli as cli
    from tl_spectral.data import check_corpus, load_corpus, tiny_shakespeare
    from tl_spectral.models import load_checkpoint
    from tl_spectral.models.loading import load_model, load_named_model, resolve_model

    assert load_corpus("shakespeare") == tiny_shakespeare() == cli.load_corpus("shakespeare")
    check_corpus("shakespeare")
    assert resolve_model("random") == ("random", "random") == cli.resolve_model("random")
    assert load_model is not load_checkpoint  # two names, two meanings
    assert load_named_model is not load_checkpoint
    from tl_spectral.cli import load_model as old  # noqa: F401 - deprecated, still importable


def test_the_command_line_module_starts_without_torch():
    code = "import sys, tl_spectral.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
