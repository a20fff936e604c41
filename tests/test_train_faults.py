"""Trainer fault tolerance: run identity in out_dir, atomic final/, checksummed checkpoints
with fallback, log truncation on resume, and a process killed during a save (issue #15)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer, load_checkpoint, save_model
from tl_spectral.models.gpt import model_state, sha256_bytes
from tl_spectral.models.train import (
    CorruptCheckpointError,
    RunConflictError,
    _canonical,
    train_cli,
)

VOCAB = 11


def _data(n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(n) % VOCAB
    noise = torch.randint(0, VOCAB, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.8
    return torch.where(keep, base, noise)


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layers=1, n_heads=2, d_model=16, n_ctx=16,
                         d_mlp=32))


def _tcfg(out_dir=None, **kw):
    base = {"steps": 8, "batch_size": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2,
            "eval_every": 4, "eval_windows": 4, "checkpoint_every": 2, "keep_checkpoints": 2,
            "progress": False, "seed": 0, "device": "cpu", "log_every": 1, "num_threads": 1}
    if out_dir is not None:
        base["out_dir"] = str(out_dir)
    base.update(kw)
    return TrainConfig(**base)


def _trainer(out_dir=None, model_seed=0, **kw) -> Trainer:
    data = _data()
    return Trainer(_model(model_seed), data[:2600], data[2600:], _tcfg(out_dir, **kw))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _log_steps(out_dir: Path) -> list[int]:
    lines = (out_dir / "log.jsonl").read_text().splitlines()
    return [json.loads(x)["step"] for x in lines if "loss" in json.loads(x)]


@pytest.fixture(scope="module")
def reference():
    """Weights and losses of the uninterrupted run (no out_dir)."""
    t = _trainer()
    h = t.fit()
    return model_state(t.model), h.train_loss


# ------------------------------------------------------------------- run identity
def test_new_run_refuses_another_runs_out_dir(tmp_path):
    old = _trainer(tmp_path, steps=12, checkpoint_every=3)
    old.fit()
    ck = tmp_path / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step_0000009", "step_0000012"]
    before = _snapshot(tmp_path)
    # a new run (other lr) with resume=False used to overwrite step_3/6 and prune them
    with pytest.raises(RunConflictError, match="--overwrite") as e:
        _trainer(tmp_path, steps=6, checkpoint_every=3, lr=1e-3, resume=False)
    assert str(tmp_path) in str(e.value) and "lr" in str(e.value)
    with pytest.raises(RunConflictError, match="another run"):  # a new seed, resume=True
        _trainer(tmp_path, steps=12, checkpoint_every=3, seed=1)
    assert _snapshot(tmp_path) == before  # nothing touched
    # --overwrite: the old run's checkpoints, final/ and log go first
    (tmp_path / "final").mkdir()
    new = _trainer(tmp_path, steps=6, checkpoint_every=3, lr=1e-3, overwrite=True)
    assert new.step == 0 and not (tmp_path / "final").exists()
    new.fit()
    assert sorted(p.name for p in ck.iterdir()) == ["step_0000003", "step_0000006"]
    assert _log_steps(tmp_path) == list(range(1, 7))
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == new.run_id
    for p in ck.iterdir():
        assert json.loads((p / "trainer_state.json").read_text())["run_id"] == new.run_id
    # the same run resumes as before
    again = _trainer(tmp_path, steps=6, checkpoint_every=3, lr=1e-3, keep_checkpoints=5)
    assert again.step == 6 and again.run_id == new.run_id


def test_pruning_keeps_this_runs_newest_by_step(tmp_path):
    t = _trainer(tmp_path, steps=8, checkpoint_every=2, keep_checkpoints=2)
    t.fit(stop_at=4)
    # a checkpoint of another run slipped in after the start: never pruned or resumed
    foreign = tmp_path / "checkpoints" / "step_0000001"
    foreign.mkdir()
    (foreign / "trainer_state.json").write_text(json.dumps({"run_id": "someone-else"}))
    t.fit()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_0000001", "step_0000006", "step_0000008"]


def test_cli_overwrite_flag(tmp_path, capsys):
    from tl_spectral.data import tiny_shakespeare

    corpus = tmp_path / "small.txt"
    corpus.write_text(tiny_shakespeare()[:3000])
    doc = {
        "model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 8,
                  "n_ctx": 16, "d_mlp": 16, "normalization": "none"},
        "data": {"corpus": str(corpus), "tokenizer": "char", "val_fraction": 0.1},
        "train": {"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_every": 2,
                  "eval_windows": 2, "checkpoint_every": 2, "out_dir": str(tmp_path / "run"),
                  "progress": False},
    }
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(doc))
    assert train_cli(["--config", str(path)]) == 0
    doc["train"]["lr"] = 5e-4
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_cli(["--config", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--overwrite" in err and str(tmp_path / "run") in err
    assert train_cli(["--config", str(path), "--overwrite"]) == 0
    meta = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert meta["train"]["lr"] == 5e-4 and meta["step"] == 2
    load_checkpoint(tmp_path / "run" / "final")


# --------------------------------------------------------------------- final/ atomic
class _Killed(BaseException):
    """Stands for a crash: not an Exception, so no ``except Exception`` handler runs."""


def test_load_model_refuses_weights_and_config_of_different_saves(tmp_path):
    a, b = _model(0), _model(1)
    save_model(a, tmp_path / "a", extra={"step": 320})
    save_model(b, tmp_path / "b", extra={"step": 300})
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "model.safetensors").write_bytes((tmp_path / "a" / "model.safetensors").read_bytes())
    (mixed / "config.json").write_text((tmp_path / "b" / "config.json").read_text())
    with pytest.raises(ValueError, match="does not belong"):
        load_checkpoint(mixed)
    torch.testing.assert_close(model_state(load_checkpoint(tmp_path / "a")), model_state(a))


def test_save_model_crash_keeps_previous_final_intact(tmp_path, monkeypatch):
    import tl_spectral.models.gpt as gpt

    final = tmp_path / "final"
    old = _model(0)
    save_model(old, final, extra={"step": 300})
    real = gpt.write_file_durably
    calls = []

    def crash_on_config(path, data):
        calls.append(Path(path).name)
        if Path(path).name == "config.json":
            raise _Killed("killed between the weights and config.json")
        real(path, data)

    monkeypatch.setattr(gpt, "write_file_durably", crash_on_config)
    with pytest.raises(_Killed):
        save_model(_model(1), final, extra={"step": 320})
    monkeypatch.undo()
    assert calls == ["model.safetensors", "config.json"]
    got = load_checkpoint(final)  # the step-300 pair, untouched
    assert json.loads((final / "config.json").read_text())["step"] == 300
    for k, v in model_state(old).items():
        assert torch.equal(model_state(got)[k], v)
    # the half-written temporary folder is removed when a trainer starts in out_dir
    assert list(tmp_path.glob(".tmp_final_*"))
    (tmp_path / "checkpoints" / ".tmp_step_0000004").mkdir(parents=True)
    _trainer(tmp_path)
    assert not list(tmp_path.glob(".tmp_*"))
    assert not list((tmp_path / "checkpoints").glob(".tmp_*"))


# -------------------------------------------------------- verified resume, fallback
def _flip_bit(path: Path, offset_from_end: int = 40) -> None:
    raw = bytearray(path.read_bytes())
    raw[-offset_from_end] ^= 0x10
    path.write_bytes(bytes(raw))


def _rewrite_state_with_nan(ck: Path, key_part: str) -> None:
    """Put NaN into a tensor of the checkpoint and re-record valid checksums (a bug, not a
    disk fault: only the NaN check can catch it)."""
    from safetensors.torch import load_file, save_file

    fname = "model.safetensors" if key_part == "weights" else "trainer_state.safetensors"
    tensors = load_file(str(ck / fname))
    key = next(k for k in sorted(tensors) if (key_part == "weights" or key_part in k)
               and tensors[k].is_floating_point())
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, str(ck / fname))
    meta = json.loads((ck / "trainer_state.json").read_text())
    meta["files"][fname] = sha256_bytes((ck / fname).read_bytes())
    if fname == "model.safetensors":
        cfg = json.loads((ck / "config.json").read_text())
        cfg["weights_sha256"] = meta["files"][fname]
        (ck / "config.json").write_text(json.dumps(cfg))
        meta["files"]["config.json"] = sha256_bytes((ck / "config.json").read_bytes())
    meta.pop("meta_sha256")
    meta["meta_sha256"] = sha256_bytes(_canonical(meta).encode())
    (ck / "trainer_state.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("fault", ["bit_flip_weights", "bit_flip_adam", "nan_adam",
                                   "nan_weights", "torn_meta", "broken_config"])
def test_bad_latest_checkpoint_falls_back_to_previous(tmp_path, reference, fault):
    ref_state, ref_loss = reference
    a = _trainer(tmp_path)
    a.fit(stop_at=5)  # checkpoints at steps 2 and 4
    latest = tmp_path / "checkpoints" / "step_0000004"
    if fault == "bit_flip_weights":
        _flip_bit(latest / "model.safetensors")
    elif fault == "bit_flip_adam":
        _flip_bit(latest / "trainer_state.safetensors")
    elif fault == "nan_adam":
        _rewrite_state_with_nan(latest, "exp_avg_sq")
    elif fault == "nan_weights":
        _rewrite_state_with_nan(latest, "weights")
    elif fault == "broken_config":
        raw = (latest / "config.json").read_text()
        (latest / "config.json").write_text(raw.replace('"model"', "model", 1))
    else:
        raw = (latest / "trainer_state.json").read_text()
        (latest / "trainer_state.json").write_text(raw.replace('"step": 4', '"step": 5'))
    with pytest.warns(RuntimeWarning, match="skipping bad checkpoint .*step_0000004"):
        b = _trainer(tmp_path, model_seed=7)
    assert b.step == 2 and [p.name for p, _ in b.rejected_checkpoints] == ["step_0000004"]
    h = b.fit()
    assert h.train_loss == ref_loss  # bit-identical to the uninterrupted run
    for k, v in ref_state.items():
        assert torch.equal(model_state(b.model)[k], v), k
    events = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()
              if "event" in json.loads(x)]
    assert events and events[0]["event"] == "bad_checkpoint_skipped"
    assert events[0]["path"].endswith("step_0000004") and events[0]["step"] == 2


def test_no_intact_checkpoint_is_a_clear_error(tmp_path):
    _trainer(tmp_path).fit(stop_at=4)
    for ck in (tmp_path / "checkpoints").iterdir():
        _flip_bit(ck / "model.safetensors")
    with pytest.warns(RuntimeWarning), pytest.raises(CorruptCheckpointError,
                                                     match="no intact checkpoint"):
        _trainer(tmp_path)
    # an explicitly named bad checkpoint is refused at once
    t = _trainer(tmp_path, resume=False)
    with pytest.raises(ValueError, match="checksum"):
        t.resume(tmp_path / "checkpoints" / "step_0000004")


def test_log_does_not_repeat_steps_after_resume(tmp_path, reference):
    a = _trainer(tmp_path)
    a.fit(stop_at=5)  # logged steps 1..5, last checkpoint at 4
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 6, "loss": 1.')  # a torn last line from the kill
    b = _trainer(tmp_path)
    assert b.step == 4
    b.fit()
    steps = _log_steps(tmp_path)
    assert steps == list(range(1, 9))
    losses = [json.loads(x)["loss"] for x in (tmp_path / "log.jsonl").read_text().splitlines()
              if "loss" in json.loads(x)]
    assert losses == reference[1]


# ----------------------------------------------------- fault injection: killed saves
_CHILD = r"""
import os, random, shutil, signal, sys
sys.path.insert(0, {tests!r})
import torch
torch.set_num_threads(1)
import tl_spectral.models.gpt as gpt
import tl_spectral.models.train as train
from test_train_faults import _trainer

kill_at, seed = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
count = [0]

def hit():
    count[0] += 1
    return count[0] == kill_at

def die():
    os.kill(os.getpid(), signal.SIGKILL)

real_write = gpt.write_file_durably
def write(path, data):
    if hit():  # torn write: a random prefix reaches the disk, then the process dies
        with open(path, "wb") as f:
            f.write(data[:rng.randrange(len(data) + 1)])
        die()
    real_write(path, data)

def wrap(fn):
    def inner(*a, **k):
        if hit():
            die()
        return fn(*a, **k)
    return inner

gpt.write_file_durably = train.write_file_durably = write
os.replace = wrap(os.replace)
shutil.rmtree = wrap(shutil.rmtree)
gpt._rename_exchange = wrap(gpt._rename_exchange)
_trainer(sys.argv[1]).fit()
print("finished", count[0])
"""


def _killed_child(tests_dir: Path, script: Path, out_dir: Path, kill_at: int, seed: int):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(script), str(out_dir), str(kill_at),
                             str(seed)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigkill_during_save_then_resume_is_bit_identical(tmp_path, reference):
    """A tiny run is SIGKILLed at a random I/O operation of a save (fixed seeds, three
    repetitions in parallel processes), then resumed here: no checkpoint is broken, no
    temporary folder survives the restart, and the final weights and losses equal those of
    the uninterrupted run bit for bit."""
    ref_state, ref_loss = reference
    tests_dir = Path(__file__).resolve().parent
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(tests_dir)))
    rng = random.Random(15)
    jobs = []
    for rep in range(3):
        out = tmp_path / f"run{rep}"
        kill_at = rng.randint(6, 30)  # 4 saves of about 7 I/O operations each
        jobs.append((out, kill_at, _killed_child(tests_dir, script, out, kill_at, rep)))
    for out, kill_at, proc in jobs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, (kill_at, proc.returncode, stderr[-2000:])
        t = _trainer(out)
        assert t.rejected_checkpoints == []  # a kill never breaks a published checkpoint
        assert not list(out.glob(".tmp_*")) and not list(out.glob("checkpoints/.tmp_*"))
        h = t.fit()
        assert h.train_loss == ref_loss, kill_at
        for k, v in ref_state.items():
            assert torch.equal(model_state(t.model)[k], v), (kill_at, k)
        assert _log_steps(out) == list(range(1, 9))
