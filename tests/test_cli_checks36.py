"""Issue 36 items 8 (first half) and 9: exit statuses and checks of the command line.

8: a full disk is the user's environment: one line, exit 2 (a SafetensorError saying 'No
space left on device' was an 'internal error', exit 1). 9: ``--length 2`` / ``3`` passed the
range check and failed 13 s later ("need T >= 4"); a token file that records no model was
accepted for any ``--model``."""

from __future__ import annotations

import errno

import pytest

from tl_spectral import cli
from tl_spectral.data.tokenfile import write_token_file


@pytest.fixture
def no_model(monkeypatch):
    """These checks must come before any model loads."""
    def boom(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "load_named_model", boom)


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("length", [2, 3])
def test_a_window_shorter_than_four_tokens_is_refused_before_the_model_loads(
        tmp_path, capsys, no_model, length):
    code, err = _run(capsys, "analyze", "--model", "random", "--length", length,
                     "--out", tmp_path / "r", "--no-progress")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--length {length}" in err and "[4," in err and "at least 4 tokens" in err
    assert not (tmp_path / "r").exists()


def test_a_token_file_without_a_model_needs_tokens_model_ok(tmp_path, capsys, no_model):
    tok = write_token_file(tmp_path / "t.tok", [list(range(1, 60))])  # no model recorded
    code, err = _run(capsys, "analyze", "--model", "random", "--tokens", tok,
                     "--out", tmp_path / "r", "--no-progress")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "records no model" in err and "--tokens-model-ok" in err and "--model random" in err
    assert not (tmp_path / "r").exists()
    # with the flag the file is taken (the run goes on to load the model)
    with pytest.raises(AssertionError, match="the model was loaded"):
        cli.main(["analyze", "--model", "random", "--tokens", str(tok), "--tokens-model-ok",
                  "--n-docs", "2", "--length", "8", "--out", str(tmp_path / "r2"),
                  "--no-progress", "--debug"])
    # a file that records its model is still checked against --model
    named = write_token_file(tmp_path / "n.tok", [list(range(1, 60))], model="random")
    assert cli.open_token_file(str(named), "random").model == "random"
    with pytest.raises(cli.UsageError, match="tokenized for --model random"):
        cli.open_token_file(str(named), "char-shakespeare", model_ok=True)


def _disk_full_errors():
    from safetensors import SafetensorError

    chained = RuntimeError("could not write the report")
    chained.__cause__ = OSError(errno.ENOSPC, "No space left on device", "r/x.png")
    return {
        "safetensors": SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                                       "StorageFull, message: \"No space left on device\" })"),
        "enospc": OSError(errno.ENOSPC, "No space left on device", "out/index.html"),
        "edquot": OSError(errno.EDQUOT, "Disk quota exceeded", "out/index.html"),
        "chained": chained,
    }


@pytest.mark.parametrize("which", ["safetensors", "enospc", "edquot", "chained"])
def test_a_full_disk_is_one_line_and_exit_2(capsys, monkeypatch, which):
    exc = _disk_full_errors()[which]

    def analyze(argv):
        raise exc

    monkeypatch.setitem(cli.COMMANDS, "analyze", analyze)
    code, err = _run(capsys, "analyze")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("tl-spectral analyze: error: the disk is full") and "internal" not in err


def test_a_full_disk_error_with_its_own_advice_keeps_it(capsys, monkeypatch):
    """The model cache's builder says where and what to do (TL_SPECTRAL_CACHE): kept, and
    no second, contradicting advice is added."""
    exc = OSError("no space left on the disk for the x.gguf cache in /c (needs 300 MB); free "
                  "some space or set TL_SPECTRAL_CACHE to a folder on another disk")
    exc.errno = errno.ENOSPC

    def analyze(argv):
        raise exc

    monkeypatch.setitem(cli.COMMANDS, "analyze", analyze)
    code, err = _run(capsys, "analyze")
    assert code == 2 and len(err.splitlines()) == 1
    assert "TL_SPECTRAL_CACHE" in err and "--out" not in err


def test_other_internal_errors_keep_exit_1(capsys, monkeypatch):
    def analyze(argv):
        raise RuntimeError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "analyze", analyze)
    code, err = _run(capsys, "analyze")
    assert code == 1 and "internal error" in err


def test_a_report_from_a_token_file_scores_the_planted_heads_on_its_windows(tmp_path):
    """The head-score references read a token file's windows lazily (a TokenWindows is not a
    tensor: the report died with a TypeError), and give the tensor path's numbers."""
    from tl_spectral.data.tokenfile import TokenFile
    from tl_spectral.viz.head_scores_section import planted_score

    rows = [[(7 * i + 3 * d) % 11 + 1 for i in range(40)] for d in range(70)]
    tok = write_token_file(tmp_path / "t.tok", rows)
    windows = TokenFile(tok).windows(70, 16)
    dense = windows.batch(0, len(windows))
    assert dense.shape == (70, 16)
    for score in ("previous_token", "duplicate_token", "induction"):
        assert planted_score(windows, None, score) == pytest.approx(
            planted_score(dense, None, score))
    assert cli.main(["analyze", "--model", "random", "--tokens", str(tok), "--tokens-model-ok",
                     "--n-docs", "3", "--length", "8", "--out", str(tmp_path / "r"),
                     "--no-progress"]) == 0
