"""Trainer: schedule, exact resume, clear checkpoint errors, CLI, DDP with 2 gloo processes."""

from __future__ import annotations

import itertools
import json
import os
import socket

import pytest
import torch

from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer, load_checkpoint
from tl_spectral.models.train import train_cli

VOCAB = 11


def _data(n=4000, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a learnable stream: a noisy cycle through the vocabulary
    base = torch.arange(n) % VOCAB
    noise = torch.randint(0, VOCAB, (n,), generator=g)
    keep = torch.rand(n, generator=g) < 0.8
    return torch.where(keep, base, noise)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = {"vocab_size": VOCAB, "n_layers": 2, "n_heads": 2, "d_model": 16, "n_ctx": 16, "d_mlp": 32}
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def _tcfg(tmp_path=None, **kw):
    base = {"steps": 8, "batch_size": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "eval_every": 4,
                "eval_windows": 6, "checkpoint_every": 3, "progress": False, "seed": 0, "device": "cpu"}
    if tmp_path is not None:
        base["out_dir"] = str(tmp_path)
    base.update(kw)
    return TrainConfig(**base)


def test_schedule_warmup_and_cosine():
    c = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup_steps=10)
    assert c.lr_at(0) == pytest.approx(1e-4)
    assert c.lr_at(9) == pytest.approx(1e-3)
    assert c.lr_at(10) == pytest.approx(1e-3)
    assert c.lr_at(55) == pytest.approx(0.55e-3)
    assert c.lr_at(100) == pytest.approx(1e-4)
    lrs = [c.lr_at(s) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_train_config_validation_and_json():
    c = _tcfg(betas=(0.8, 0.95))
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"stepz": 3})
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=5, warmup_steps=6)
    with pytest.raises(ValueError, match="device"):
        TrainConfig(device="tpu")


def test_fit_lowers_loss_and_evaluates():
    data = _data()
    t = Trainer(_model(), data[:3500], data[3500:], _tcfg(steps=20, eval_every=10))
    h = t.fit()
    assert len(h.train_loss) == 20 and h.tokens_seen == 20 * 4 * 16
    assert sum(h.train_loss[-3:]) < sum(h.train_loss[:3])
    assert [e["step"] for e in h.evals] == [10, 20]
    ev = h.evals[-1]
    assert ev["val_ppl"] == pytest.approx(torch.tensor(ev["val_loss"]).exp().item())


def test_evaluate_matches_brute_force():
    data = _data()
    t = Trainer(_model(), data[:3500], data[3500:], _tcfg(eval_windows=None))
    w = t.val_windows()
    assert w.shape == ((500 - 1) // 16, 17)
    torch.testing.assert_close(w[1, 0], data[3500 + 16])  # stride seq_len: targets once each
    with torch.no_grad():
        ref = torch.stack([t.model.loss(w[i:i + 1]) for i in range(len(w))]).mean()
    assert t.evaluate()["val_loss"] == pytest.approx(ref.item(), rel=1e-5)


def test_resume_reproduces_uninterrupted_curve(tmp_path):
    data = _data()
    full = Trainer(_model(), data[:3500], data[3500:], _tcfg()).fit()

    a = Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path))
    a.fit(stop_at=5)  # "killed" after step 5: last checkpoint at step 3
    del a
    b = Trainer(_model(seed=123), data[:3500], data[3500:], _tcfg(tmp_path))
    assert b.step == 3  # the last checkpoint before the interruption
    h = b.fit()
    assert h.train_loss == full.train_loss  # exactly, step by step
    assert [e["val_loss"] for e in h.evals] == [e["val_loss"] for e in full.evals]


def test_resume_from_an_earlier_checkpoint(tmp_path):
    data = _data()
    full = Trainer(_model(), data[:3500], data[3500:], _tcfg()).fit()
    a = Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path, keep_checkpoints=5))
    a.fit(stop_at=7)
    b = Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path, resume=False))
    assert b.resume(tmp_path / "checkpoints" / "step_0000003")
    assert b.step == 3
    assert b.fit().train_loss == full.train_loss


def test_corrupted_or_foreign_trainer_checkpoint(tmp_path):
    data = _data()
    Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path)).fit(stop_at=3)
    ck = tmp_path / "checkpoints" / "step_0000003"
    # another model configuration in the same out_dir
    with pytest.raises(ValueError, match="different model configuration"):
        Trainer(_model(d_model=8), data[:3500], data[3500:], _tcfg(tmp_path))
    # a corrupted optimizer state file
    (ck / "trainer_state.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="corrupted"):
        Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path))
    # a corrupted weights file
    raw = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(raw[:100])
    with pytest.raises(ValueError, match="corrupted"):
        Trainer(_model(), data[:3500], data[3500:], _tcfg(tmp_path))
    with pytest.raises(ValueError, match="corrupted"):
        load_checkpoint(ck)


def test_bad_data_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        Trainer(_model(), torch.full((100,), VOCAB), torch.zeros(100, dtype=torch.long), _tcfg())
    with pytest.raises(ValueError, match="at least"):
        Trainer(_model(), torch.zeros(5, dtype=torch.long), torch.zeros(100, dtype=torch.long),
                _tcfg())


def test_cli_runs_and_writes_final(tmp_path, capsys):
    from tl_spectral.data import tiny_shakespeare

    corpus = tmp_path / "small.txt"
    corpus.write_text(tiny_shakespeare()[:6000])
    doc = {
        "model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 8,
                  "n_ctx": 16, "d_mlp": 16, "normalization": "none"},
        "data": {"corpus": str(corpus), "tokenizer": "char", "val_fraction": 0.1},
        "train": {"steps": 3, "batch_size": 2, "warmup_steps": 1, "eval_every": 3,
                  "eval_windows": 4, "checkpoint_every": 3, "out_dir": str(tmp_path / "run"),
                  "progress": False},
    }
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(doc))
    assert train_cli(["--config", str(path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"] == 3
    final = tmp_path / "run" / "final"
    m = load_checkpoint(final)
    meta = json.loads((final / "config.json").read_text())
    assert meta["tokenizer"]["type"] == "char"
    assert m.cfg.vocab_size == len(set(corpus.read_text()))
    assert meta["metrics"]["val_loss"] > 0
    with pytest.raises(SystemExit):
        train_cli(["--config", str(tmp_path / "missing.json")])


# ------------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    data = _data()
    t = Trainer(_model(), data[:3500], data[3500:], _tcfg(out_dir, steps=4, checkpoint_every=4))
    h = t.fit()
    if rank == 0:
        with open(os.path.join(out_dir, "ddp.json"), "w") as f:
            json.dump({"loss": h.train_loss, "val": h.evals[-1]["val_loss"]}, f)
    dist.destroy_process_group()


def test_ddp_two_gloo_processes_match_single_process(tmp_path):
    import torch.multiprocessing as mp

    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        assert k not in os.environ
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    got = json.loads((tmp_path / "ddp.json").read_text())
    data = _data()
    ref = Trainer(_model(), data[:3500], data[3500:], _tcfg(steps=4)).fit()
    assert got["loss"] == pytest.approx(ref.train_loss, abs=1e-5)
    assert got["val"] == pytest.approx(ref.evals[-1]["val_loss"], abs=1e-5)
    assert (tmp_path / "checkpoints" / "step_0000004" / "trainer_state.json").is_file()


def test_run_from_config_with_caller_data_and_extra_metrics(tmp_path):
    """The study path (BPE data prepared by the caller) goes through the same run_from_config:
    the final folder carries the run identity and the caller's metrics."""
    from tl_spectral.data import CharTokenizer
    from tl_spectral.models.gpt import read_checkpoint_config
    from tl_spectral.models.train import run_from_config

    text = "to be or not to be, that is the question " * 40
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text))
    doc = {"model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 16,
                     "d_head": 8, "n_ctx": 16, "d_mlp": 32},
           "train": {"steps": 2, "batch_size": 2, "warmup_steps": 0, "eval_every": 2,
                     "eval_windows": 2, "out_dir": str(tmp_path / "run"), "progress": False}}
    trainer, _ = run_from_config(doc, data=(tok, ids[:1200], ids[1200:]),
                                 extra_metrics={"val_unk_fraction": 0.0})
    meta = read_checkpoint_config(tmp_path / "run" / "final")
    assert meta["metrics"]["val_unk_fraction"] == 0.0 and meta["run_id"] == trainer.run_id
    assert meta["model"]["vocab_size"] == tok.vocab_size
