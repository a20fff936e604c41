"""Issue 30 items 5 and 9: ``tl-spectral train`` refuses an out_dir holding what is not this
run's (a user's final/, a foreign log.jsonl, a folder named like a checkpoint); the train
config's bounds are one-line errors before anything is built; ``load_checkpoint`` checks the
weights against config.json before building the model it describes."""

from __future__ import annotations

import json

import pytest
import torch

from tl_spectral.models.gpt import GPT, GPTConfig, load_checkpoint, save_model
from tl_spectral.models.train import RunConflictError, TrainConfig, Trainer

VOCAB = 11


def _trainer(out_dir, **kw) -> Trainer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layers=1, n_heads=2, d_model=16, n_ctx=16,
                          d_mlp=32))
    data = torch.arange(800) % VOCAB
    base = {"steps": 4, "batch_size": 2, "warmup_steps": 0, "eval_every": 2,
            "eval_windows": 2, "checkpoint_every": 2, "progress": False, "device": "cpu",
            "log_every": 1, "out_dir": str(out_dir)}
    return Trainer(model, data[:700], data[700:], TrainConfig(**{**base, **kw}))


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("what", ["final_notes", "final_bad_config", "final_file",
                                  "foreign_log", "fake_checkpoint"])
def test_a_users_files_in_the_out_dir_are_refused(tmp_path, what):
    out = tmp_path / "run"
    out.mkdir()
    if what == "final_notes":
        (out / "final").mkdir()
        (out / "final" / "my_model.pt").write_text("mine")
    elif what == "final_bad_config":
        (out / "final").mkdir()
        (out / "final" / "config.json").write_text("{my own config")
    elif what == "final_file":
        (out / "final").write_text("mine")
    elif what == "foreign_log":
        (out / "log.jsonl").write_text('{"step": 99, "loss": 1.0, "mine": true}\n')
    else:
        (out / "checkpoints" / "step_0000002").mkdir(parents=True)
        (out / "checkpoints" / "step_0000002" / "notes.txt").write_text("mine")
    before = _tree(out)
    with pytest.raises(RunConflictError, match="--overwrite"):
        _trainer(out)
    assert _tree(out) == before
    # --overwrite: the run's own names go (a foreign log or final/ with them), others stay
    t = _trainer(out, overwrite=True)
    t.fit()
    assert (out / "run.json").is_file()


def test_the_same_run_still_resumes(tmp_path):
    out = tmp_path / "run"
    a = _trainer(out)
    a.fit(stop_at=2)
    (out / "README.txt").write_text("notes beside the run are left alone")
    b = _trainer(out)
    assert b.step == 2
    b.fit()
    assert (out / "README.txt").is_file()
    # a finished run, started again: its own final/ and log are accepted
    c = _trainer(out)
    assert c.step == 4


@pytest.mark.parametrize("field,value", [
    ("weight_decay", -1), ("grad_clip", -1), ("seq_len", 0), ("seq_len", -4),
    ("eval_windows", 0), ("eval_windows", -1), ("betas", [0.9]), ("betas", [0.9, 1.5]),
    ("num_threads", -2), ("num_threads", 0), ("eps", 0), ("eps", float("nan")),
    ("lr", float("inf")), ("seed", 2**70), ("seed", -1), ("warmup_steps", 1.5),
    ("device", "tpu")])
def test_train_config_bounds(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def _write_cfg(tmp_path, **train):
    doc = {"model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 16,
                     "d_head": 8, "n_ctx": 32, "d_mlp": 32},
           "train": {"steps": 2, "warmup_steps": 0, "out_dir": str(tmp_path / "run"),
                     **train}}
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("train,flags,msg", [
    ({"grad_clip": -1}, [], "grad_clip"), ({"seq_len": 0}, [], "seq_len"),
    ({"seq_len": 64}, [], "n_ctx"), ({"betas": [0.9]}, [], "betas"),
    ({}, ["--threads", "-3"], "num_threads"), ({}, ["--seed", str(2**70)], "seed"),
    ({"eval_windows": 0}, [], "eval_windows")])
def test_train_cli_bad_config_is_one_line_before_anything_is_built(tmp_path, capsys, train,
                                                                   flags, msg):
    from tl_spectral.cli import main

    p = _write_cfg(tmp_path, **train)
    assert main(["train", "--config", str(p), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_on_a_cpu_machine(tmp_path, capsys):
    from tl_spectral.cli import main

    for train, flags in (({"device": "cuda"}, []), ({}, ["--device", "cuda:1"])):
        p = _write_cfg(tmp_path, **train)
        assert main(["train", "--config", str(p), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert "no CUDA GPU" in err and "--device cpu" in err and len(err.splitlines()) == 1
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key,value", [("d_model", 10**9), ("n_layers", 10**8),
                                       ("vocab_size", 10**10), ("n_ctx", 10**9)])
def test_load_model_checks_the_weights_before_building(tmp_path, key, value):
    d = tmp_path / "ck"
    save_model(GPT(GPTConfig(vocab_size=VOCAB, n_layers=1, n_heads=2, d_model=16, n_ctx=16)), d)
    doc = json.loads((d / "config.json").read_text())
    doc["model"][key] = value
    (d / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=f"mis-shaped .* says {key}={value}"):
        load_checkpoint(d)


def test_an_older_runs_own_final_and_log_are_accepted(tmp_path):
    """An out_dir from before run.json: this run's final/ (its run id) vouches for the log."""
    import shutil

    out = tmp_path / "run"
    t = _trainer(out)
    t.fit()
    save_model(t.model, out / "final", extra={"run_id": t.run_id, "step": t.step})
    (out / "run.json").unlink()
    shutil.rmtree(out / "checkpoints")
    assert _trainer(out).step == 0  # accepted (nothing to resume from)
