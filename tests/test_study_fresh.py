"""Issue 36 item 5: ``tl-spectral study routing --fresh --overwrite`` deleted before it
validated (``--threads 0`` left only the marker; ``--out .`` in a marked folder deleted a
user's file, then failed with Errno 22), and ``--windows 0`` / ``-5`` ended in a
ZeroDivisionError / RuntimeError after partial output. Every argument is checked first; a
fresh run writes a temporary sibling and swaps it in at the end, as ``analyze`` does."""

from __future__ import annotations

import json

import pytest

from tl_spectral import cli
from tl_spectral_studies import routing
from tl_spectral_studies._common import MARKER


def _marked(folder):
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"study": "routing"}) + "\n")
    (folder / "summary.json").write_text('{"old": true}')
    (folder / "notes.txt").write_text("the user's notes")
    return folder


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def _cli(capsys, *args):
    code = cli.main(["study", "routing", *map(str, args)])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture
def no_run(monkeypatch):
    """The study itself must never start in these tests."""
    def boom(*a, **k):
        raise AssertionError("run_study started")

    monkeypatch.setattr(routing, "run_study", boom)


@pytest.mark.parametrize("bad", [["--threads", "0"], ["--windows", "0"], ["--windows", "-5"],
                                 ["--models", "nope"]])
def test_bad_arguments_are_one_line_and_touch_nothing(tmp_path, capsys, no_run, bad):
    out = _marked(tmp_path / "out")
    before = _tree(out)
    code, err = _cli(capsys, "--out", out, "--fresh", "--overwrite", *bad)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert bad[0] in err
    assert _tree(out) == before
    code, err = _cli(capsys, "--out", tmp_path / "new", *bad)
    assert code == 2 and not (tmp_path / "new").exists()


def test_fresh_overwrite_of_the_current_folder_is_refused(tmp_path, capsys, no_run,
                                                          monkeypatch):
    out = _marked(tmp_path / "here")
    before = _tree(out)
    monkeypatch.chdir(out)
    code, err = _cli(capsys, "--out", ".", "--fresh", "--overwrite")
    assert code == 2 and len(err.splitlines()) == 1 and "current folder" in err, err
    assert _tree(out) == before


def test_a_fresh_run_replaces_the_folder_only_at_its_end(tmp_path, capsys, monkeypatch):
    out = _marked(tmp_path / "out")
    before = _tree(out)
    seen = {}

    def fails(out_dir, **kw):
        seen["dir"] = out_dir
        (out_dir / "partial.safetensors").write_text("half")
        raise RuntimeError("the run failed half way")

    monkeypatch.setattr(routing, "run_study", fails)
    code, err = _cli(capsys, "--out", out, "--fresh", "--overwrite")
    assert code == 1 and "half way" in err
    assert seen["dir"] != out and not seen["dir"].exists()  # a temporary sibling, removed
    assert _tree(out) == before  # the earlier output untouched

    def works(out_dir, **kw):
        assert kw["merge"] is False and kw["n_windows"] == 3
        (out_dir / "summary.json").write_text('{"new": true}')
        return {"models": {}}

    monkeypatch.setattr(routing, "run_study", works)
    monkeypatch.setattr(routing, "study_markdown", lambda s: "tables\n")
    code, err = _cli(capsys, "--out", out, "--fresh", "--overwrite", "--windows", 3)
    assert code == 0, err
    assert set(_tree(out)) == {MARKER, "summary.json", "tables.md"}
    assert (out / "summary.json").read_text() == '{"new": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left


def test_fresh_without_overwrite_and_a_foreign_folder_are_refused(tmp_path, capsys, no_run):
    out = _marked(tmp_path / "out")
    code, err = _cli(capsys, "--out", out, "--fresh")
    assert code == 2 and "--overwrite" in err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    code, err = _cli(capsys, "--out", foreign, "--fresh", "--overwrite")
    assert code == 2 and "not an output" in err
    assert (foreign / "thesis.tex").read_text() == "x"
