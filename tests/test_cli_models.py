"""Issue 30 items 12 and 13 (command line): a Hugging Face folder with only pickled weights
is refused with how to convert it (never unpickled, torch's weights_only advice never
shown); NaN weights in the user's model are a one-line error with exit status 2."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch
from _tiny_hf import save_tiny

BASE = ["--n-docs", "2", "--length", "16", "--no-progress", "--sections", "attention_stats"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    ok = save_tiny("gpt2", root / "ok", n_layers=1, d_model=16, n_heads=2)
    import transformers as tr

    m = tr.AutoModelForCausalLM.from_pretrained(ok)
    binonly = root / "binonly"  # the same folder, its weights pickled (as older saves)
    binonly.mkdir()
    for f in ok.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, binonly / f.name)
    torch.save(m.state_dict(), binonly / "pytorch_model.bin")
    assert (binonly / "pytorch_model.bin").is_file()
    assert not list(binonly.glob("*.safetensors"))
    with torch.no_grad():
        m.transformer.h[0].attn.c_attn.weight[0, 0] = float("nan")
    nan = root / "nan"
    m.save_pretrained(nan)
    tr.AutoTokenizer.from_pretrained(ok).save_pretrained(nan)
    return {"ok": ok, "binonly": binonly, "nan": nan}


def test_pickled_weights_only_are_refused_with_how_to_convert(folders, capsys):
    from tl_spectral.cli import main

    for cmd in (["analyze", *BASE], ["geometry"], ["tokenize", "shakespeare", "-o",
                                                   str(folders["ok"].parent / "t.tok")]):
        assert main([*cmd, "--model", str(folders["binonly"])]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "pytorch_model.bin" in err and "safetensors only" in err
        assert "save_file" in err and "weights_only=False" not in err


def test_torchs_unpickling_advice_is_never_shown(monkeypatch, capsys):
    import tl_spectral.cli as cli

    def hostile(*a, **k):
        raise pickle.UnpicklingError("Weights only load failed ... set `weights_only=False`")

    monkeypatch.setattr(cli, "load_named_model", hostile)
    assert cli.main(["analyze", "--model", "random", *BASE]) == 2
    err = capsys.readouterr().err
    assert "weights_only" not in err and "never does" in err and "internal error" not in err


def test_nan_weights_are_the_users_error(folders, capsys):
    from tl_spectral.cli import main

    assert main(["analyze", "--model", str(folders["nan"]), *BASE,
                 "--out", str(folders["nan"].parent / "rep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' bars
    assert err.startswith("tl-spectral analyze: error: --model") and "internal" not in err
    assert "holds 1 NaN/inf value(s)" in err
    assert not (folders["nan"].parent / "rep").exists()


@pytest.mark.parametrize("key,value", [("vocab_size", 10**10), ("n_embd", 10**9),
                                       ("n_layer", 10**12)])
def test_a_hostile_hf_config_is_refused_before_building(folders, tmp_path, key, value,
                                                        capsys):
    import json

    from tl_spectral.cli import main

    d = tmp_path / "hostile"
    shutil.copytree(folders["ok"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(["analyze", "--model", str(d), *BASE]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "do not belong together" in err, err


def test_the_real_folder_passes_the_size_check(folders):
    from tl_spectral.cli import resolve_model

    assert resolve_model(str(folders["ok"]))[0] == "hf"
