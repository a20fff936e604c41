"""A report re-renders from its folder of saved results without the model (issue 41 item 1):
``results/report_state.json`` lists what the renders read, and ``tl-spectral render FOLDER``
(:func:`tl_spectral.viz.sections.rerender`) writes the same page with the model's forward,
``ModelView.run`` and every model loader refusing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tl_spectral import cli

SMALL = ["--n-docs", "4", "--length", "32"]
ROTARY = ["--model", "char-shakespeare-rotary", "--baseline", "random",
          "--faithfulness-docs", "2", "--n-docs", "6", "--length", "32"]


def _analyze(out: Path, args: list[str]) -> Path:
    assert cli.main(["analyze", *args, "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def char_report(tmp_path_factory) -> Path:
    return _analyze(tmp_path_factory.mktemp("char") / "report", SMALL)


@pytest.fixture(scope="module")
def rotary_report(tmp_path_factory) -> Path:
    return _analyze(tmp_path_factory.mktemp("rot") / "report", ROTARY)


@pytest.fixture
def no_model(monkeypatch):
    """Every way to a model refuses: any module's forward, ModelView.run and the loaders."""
    import torch

    from tl_spectral.model_view import ModelView
    from tl_spectral.models import zoo

    def refuse(*a, **k):
        raise AssertionError("re-rendering touched a model")

    monkeypatch.setattr(ModelView, "run", refuse)
    monkeypatch.setattr(torch.nn.Module, "__call__", refuse)
    monkeypatch.setattr(zoo, "load", refuse)
    monkeypatch.setattr(cli, "load_named_model", refuse)
    monkeypatch.setattr(cli, "load_model", refuse)


def _files(folder: Path) -> dict[str, bytes]:
    """index.html, results/, tables/ and views/ of a report, by relative path."""
    out = {"index.html": (folder / "index.html").read_bytes()}
    for sub in ("results", "tables", "views"):
        for p in sorted((folder / sub).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(folder))] = p.read_bytes()
    return out


@pytest.mark.parametrize("which", ["char", "rotary"])
def test_render_writes_the_same_report_without_the_model(which, char_report, rotary_report,
                                                         tmp_path, no_model, capsys):
    # (the module's reports are written first: fixtures of a wider scope come first)
    src = char_report if which == "char" else rotary_report
    new = tmp_path / "again"
    assert cli.main(["render", str(src), "--out", str(new), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == str((new / "index.html").resolve())
    before, after = _files(src), _files(new)
    assert before.keys() == after.keys()
    differ = [k for k in before if before[k] != after[k]]
    assert not differ, differ  # the page, the saved results and the state itself
    assert (new / cli.REPORT_MARKER).read_bytes() == (src / cli.REPORT_MARKER).read_bytes()
    timings = json.loads((new / "report.json").read_text())["timings_s"]
    assert "save state" in timings and not any(k.startswith("pass ") for k in timings)


def test_the_state_holds_what_renders_read_and_no_big_result(char_report):
    """Renders read derived results, never the big probe results (the per-window fields,
    the views' raw patterns, the contribution maps of every layer)."""
    state = json.loads((char_report / "results" / "report_state.json").read_text())
    keys = set(state["results"])
    assert {"attention_stats_shown", "attention_views", "scale_pod", "scale_pod_modes",
            "scale_pod_intervals", "contribution_views", "sanity_perplexity"} <= keys
    assert not keys & {"attention_fields", "view_patterns", "contributions", "attention_stats"}
    assert all(e["kind"] != "unsaved" for e in state["results"].values())
    # a file a section saved already is named, not written twice
    assert state["results"]["head_scores"]["file"] == "head_scores.safetensors"
    assert state["model"]["n_layers"] > 0 and state["sections"][0] == "sanity"
    assert state["token_strings"]  # what the views showed, replayed


def test_in_place_needs_overwrite_and_then_keeps_the_page(char_report, tmp_path, no_model,
                                                          capsys):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(char_report, folder)
    page = (folder / "index.html").read_bytes()
    assert cli.main(["render", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--overwrite" in err and len(err.splitlines()) == 1
    assert cli.main(["render", str(folder), "--overwrite", "--no-progress"]) == 0
    assert (folder / "index.html").read_bytes() == page
    assert (folder / "results" / "report_state.json").is_file()
    # --out over an earlier report: refused without --overwrite
    assert cli.main(["render", str(char_report), "--out", str(folder)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_render_refuses_a_folder_that_is_not_a_report_or_has_no_state(char_report, tmp_path,
                                                                      capsys):
    import shutil

    plain = tmp_path / "plain"
    plain.mkdir()
    assert cli.main(["render", str(plain), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a tl_spectral report" in err and len(err.splitlines()) == 1
    old = tmp_path / "old"
    shutil.copytree(char_report, old)
    (old / "results" / "report_state.json").unlink()
    assert cli.main(["render", str(old), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no saved report state" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "y").exists()


def test_a_model_description_answers_the_layer_and_norm_helpers():
    from tl_spectral.viz.context import ModelDescription
    from tl_spectral.viz.layer_plots import kinds_note, layer_kinds
    from tl_spectral.viz.routing_section import norm_folded

    d = ModelDescription(name="m", n_layers=3, n_heads=2, d_head=4, d_model=8, d_vocab=10,
                         n_ctx=16, causal=True, positional="rotary", normalization="RMS",
                         pre_ln=True, layer_types=["local", "global", "local"],
                         sliding_window=4, rmsnorm_uses_offset=True)
    assert layer_kinds(d) == ["local", "global", "local"]
    assert "Layers 1 attend globally" in kinds_note(d) and "of 4 tokens" in kinds_note(d)
    assert "Gemma's 1 + w" in norm_folded(d)
    plain = ModelDescription(**{**d.to_json(), "layer_types": None, "normalization": "LN",
                                "rmsnorm_uses_offset": False})
    assert layer_kinds(plain) is None and kinds_note(plain) == ""
    assert norm_folded(plain).startswith("LayerNorm folded")


def test_a_state_naming_a_file_outside_its_folder_is_refused(tmp_path):
    """A manifest names files of its own results folder only: ``../`` or an absolute path is
    a one-line error, nothing is read."""
    from tl_spectral.viz.report_state import _load_value, load_windows

    (tmp_path / "results").mkdir()
    (tmp_path / "secret.json.gz").write_bytes(b"")
    for rel in ("../secret.json.gz", str(tmp_path / "secret.json.gz")):
        with pytest.raises(ValueError, match="outside its results folder"):
            _load_value({"kind": "json", "file": rel}, "k", tmp_path / "results")
        with pytest.raises(ValueError, match="outside its results folder"):
            load_windows({"windows": rel}, tmp_path / "results")
