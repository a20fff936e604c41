"""Issue 41 item 3: ``tl-spectral analyze`` checks everything before the model's weights load.

Three checks used to come after the load: ``--length`` against the model's context, a start
token (``--bos`` or the model's convention) with ``--tokens``, and a bidirectional model with
``--tokens``. They now read the model's metadata (:func:`tl_spectral.models.loading.
model_info`: the character checkpoints' config.json, a Hugging Face folder's config.json as
TransformerBridge boots it, the GGUF entries' declarations), so each is refused with the
loader patched to fail. The metadata agrees with the loaded model."""

from __future__ import annotations

import pytest
from _tiny_hf import save_tiny

from tl_spectral import cli
from tl_spectral.data.tokenfile import write_token_file
from tl_spectral.models.loading import ModelInfo, model_info


@pytest.fixture
def no_model(monkeypatch):
    """The checks must come before any model loads."""
    def boom(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "load_named_model", boom)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {fam: save_tiny(fam, root / fam, n_layers=1, d_model=16, n_heads=2, n_ctx=48)
            for fam in ("gpt2", "bert")}


def _run(capsys, *argv):
    code = cli.main(["analyze", *[str(a) for a in argv], "--no-progress"])
    return code, capsys.readouterr().err.strip()


def _token_file(tmp_path, model: str, name: str = "t.tok"):
    return write_token_file(tmp_path / name, [list(range(1, 40))] * 4, model=model)


@pytest.mark.parametrize("which,n_ctx", [("random", 256), ("char-shakespeare", 256),
                                         ("gpt2", 48), ("bert", 48)])
def test_a_window_longer_than_the_context_is_refused_before_the_load(
        hf, tmp_path, capsys, no_model, which, n_ctx):
    model = str(hf[which]) if which in hf else which
    code, err = _run(capsys, "--model", model, "--length", n_ctx + 1, "--out", tmp_path / "r")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--length {n_ctx + 1} is longer than {model}'s context of {n_ctx}" in err
    assert f"pass --length {n_ctx} or less" in err
    assert not (tmp_path / "r").exists()


def test_a_start_token_with_a_token_file_is_refused_before_the_load(hf, tmp_path, capsys,
                                                                    no_model):
    folder = hf["gpt2"]
    tok = _token_file(tmp_path, str(folder.resolve()))
    code, err = _run(capsys, "--model", folder, "--tokens", tok, "--bos", "--n-docs", "2",
                     "--length", "16", "--out", tmp_path / "r")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "start token" in err and "not framed with one yet" in err and "--no-bos" in err
    # a model trained with a start token: --no-bos is not offered (it is refused)
    bos = _token_file(tmp_path, "char-shakespeare-bos", "bos.tok")
    code, err = _run(capsys, "--model", "char-shakespeare-bos", "--tokens", bos, "--n-docs",
                     "2", "--length", "16", "--out", tmp_path / "r")
    assert code == 2 and "start token" in err and "--no-bos" not in err, err
    # without --bos the folder's windows start with no start token: the run goes on
    with pytest.raises(AssertionError, match="the model was loaded"):
        cli.main(["analyze", "--model", str(folder), "--tokens", str(tok), "--n-docs", "2",
                  "--length", "16", "--out", str(tmp_path / "r"), "--no-progress", "--debug"])


def test_a_zoo_decoders_start_token_convention_is_known_before_the_load(tmp_path, capsys,
                                                                        no_model):
    from tl_spectral.models.gguf import ENTRIES

    name = next(iter(ENTRIES))  # a GGUF decoder of the zoo: its entry declares the start token
    assert model_info(name).prepend_bos is ENTRIES[name].prepend_bos is True
    tok = _token_file(tmp_path, name)
    code, err = _run(capsys, "--model", name, "--tokens", tok, "--n-docs", "2", "--length",
                     "16", "--out", tmp_path / "r")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "start token" in err and "--no-bos" in err


def test_a_bidirectional_model_is_refused_with_tokens_or_bos_before_the_load(
        hf, tmp_path, capsys, no_model):
    folder = hf["bert"]
    tok = _token_file(tmp_path, str(folder.resolve()))
    code, err = _run(capsys, "--model", folder, "--tokens", tok, "--n-docs", "2", "--length",
                     "16", "--out", tmp_path / "r")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "is bidirectional" in err and "pass --corpus instead" in err
    code, err = _run(capsys, "--model", folder, "--bos", "--n-docs", "2", "--length", "16",
                     "--out", tmp_path / "r")
    assert code == 2 and "is bidirectional" in err and "leave --bos out" in err, err


def test_the_metadata_agrees_with_the_loaded_model(hf):
    from tl_spectral.models.loading import load_named_model

    for folder in hf.values():
        info = model_info(str(folder))
        loaded = ModelInfo.of_loaded(load_named_model(str(folder))[0])
        assert (info.n_ctx, info.causal) == (loaded.n_ctx, loaded.causal) == (
            48, folder.name != "bert")
    assert model_info("char-shakespeare-bos") == ModelInfo(256, True, True, bos_fixed=True)
    assert model_info("random") == ModelInfo(256, True, False)


def test_public_names_for_the_char_tokenizer_and_the_status_clock():
    from pathlib import Path

    from tl_spectral.models import zoo
    from tl_spectral.viz.context import ReportContext

    tok = zoo.char_tokenizer(zoo.checkpoint_info("char-shakespeare-bos"))
    assert tok.bos_id is not None
    ctx = ReportContext(view=None, tokens=None, tokenizer=None, out_dir=Path("."),
                        results_dir=Path("."), t0=12.5)
    assert ctx.t0 == 12.5
