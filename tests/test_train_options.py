"""Trainer options: parameters excluded from weight decay (``no_decay``) and a start token
in front of every window (``bos_id`` / ``"data": {"bos": true}``)."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.data import CharTokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
from tl_spectral.models import GPT, GPTConfig, TrainConfig, Trainer
from tl_spectral.models.train import IDENTITY_FIELDS, _load_data, run_from_config

VOCAB = 11


def _data(n=4000, seed=0, vocab=VOCAB):
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(n) % vocab
    noise = torch.randint(0, vocab, (n,), generator=g)
    return torch.where(torch.rand(n, generator=g) < 0.8, base, noise)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = {"vocab_size": VOCAB, "n_layers": 2, "n_heads": 2, "d_model": 16, "n_ctx": 16,
           "d_mlp": 32}
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def _tcfg(tmp_path=None, **kw):
    base = {"steps": 8, "batch_size": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2,
            "eval_every": 4, "eval_windows": 6, "checkpoint_every": 3, "progress": False,
            "seed": 0, "device": "cpu"}
    if tmp_path is not None:
        base["out_dir"] = str(tmp_path)
    base.update(kw)
    return TrainConfig(**base)


# ------------------------------------------------------------------------- no_decay
def test_no_decay_parameters_are_untouched_by_decay_on_a_zero_gradient():
    """One AdamW step with lr > 0 and zero gradients: Adam's update is 0, so a decayed
    parameter becomes p * (1 - lr * wd) and an excluded one stays exactly p."""
    data = _data()
    model = _model(attention="sd")
    t = Trainer(model, data[:3500], data[3500:],
                _tcfg(no_decay=["*.A", "*.delta"], weight_decay=0.5))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = 0.1
    for g in t.optimizer.param_groups:
        g["lr"] = lr
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    t.optimizer.step()
    for n, p in model.named_parameters():
        excluded = p.dim() < 2 or n.endswith(".A") or n.endswith(".delta")
        want = before[n] if excluded else before[n] * (1 - lr * 0.5)
        torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-7, msg=n)
    assert any(n.endswith(".attn.A") for n in t.decay_split()[1])
    # without the option A and delta are decayed (the default recipe)
    t0 = Trainer(_model(attention="sd"), data[:3500], data[3500:], _tcfg())
    assert any(n.endswith(".attn.A") for n in t0.decay_split()[0])


@settings(max_examples=15, deadline=None)
@given(pats=st.lists(st.sampled_from(["*.A", "*.delta", "blocks.0.*", "*.weight",
                                      "tok_embed.weight", "*mlp*"]), max_size=3, unique=True))
def test_decay_split_matches_brute_force(pats):
    data = _data(200)
    model = _model(attention="sd", n_layers=1)
    t = Trainer(model, data[:150], data[150:], _tcfg(no_decay=pats))
    decay, no = t.decay_split()
    for n, p in model.named_parameters():
        excluded = p.dim() < 2 or any(fnmatchcase(n, q) for q in pats)
        assert (n in no) == excluded and (n in decay) != excluded
    groups = t.optimizer.param_groups
    params = dict(model.named_parameters())
    assert [id(p) for p in groups[0]["params"]] == [id(params[n]) for n in decay]
    assert groups[0]["weight_decay"] == t.cfg.weight_decay and groups[1]["weight_decay"] == 0


def test_no_decay_bad_input_is_rejected():
    data = _data(200)
    with pytest.raises(ValueError, match="match no parameter"):
        Trainer(_model(), data[:150], data[150:], _tcfg(no_decay=["*.A"]))  # softmax model
    with pytest.raises(ValueError, match="list of parameter-name patterns"):
        _tcfg(no_decay="*.A")
    with pytest.raises(ValueError, match="list of parameter-name patterns"):
        _tcfg(no_decay=[3])


def test_old_configs_load_unchanged_and_keep_their_identity():
    old = json.load(open(CONFIGS / "sd-char-shakespeare.json"))["train"]
    assert "no_decay" not in old
    c = TrainConfig.from_dict(old)
    assert c.no_decay == [] and sorted(c.identity()) == sorted(IDENTITY_FIELDS)
    c2 = TrainConfig.from_dict({**old, "no_decay": ["*.A", "*.delta"]})
    assert c2.identity()["no_decay"] == ["*.A", "*.delta"]
    assert TrainConfig.from_dict(json.loads(json.dumps(c2.to_dict()))) == c2
    data = _data(400)
    a = Trainer(_model(attention="sd"), data[:300], data[300:], _tcfg())
    b = Trainer(_model(attention="sd"), data[:300], data[300:], _tcfg(no_decay=["*.A"]))
    assert a.run_id != b.run_id


def test_resume_keeps_the_groups_and_the_curve(tmp_path):
    data = _data()
    kw = {"no_decay": ["*.A", "*.delta"], "weight_decay": 0.3}
    full = Trainer(_model(attention="sd"), data[:3500], data[3500:], _tcfg(**kw)).fit()
    a = Trainer(_model(attention="sd"), data[:3500], data[3500:], _tcfg(tmp_path, **kw))
    a.fit(stop_at=5)
    b = Trainer(_model(seed=9, attention="sd"), data[:3500], data[3500:],
                _tcfg(tmp_path, **kw))
    assert b.step == 3 and b.decay_split() == a.decay_split()
    assert [g["weight_decay"] for g in b.optimizer.param_groups] == [0.3, 0.0]
    assert b.fit().train_loss == full.train_loss
    # another no_decay in the same out_dir is another run, and the message says why
    with pytest.raises(ValueError, match="no_decay"):
        Trainer(_model(attention="sd"), data[:3500], data[3500:], _tcfg(tmp_path))


# ------------------------------------------------------------------------------ BOS
def test_char_tokenizer_bos_id_json_and_hf():
    tok = CharTokenizer.from_text("abcab", bos=True)
    assert tok.bos_id == 3 and tok.vocab_size == 4 and tok.encode("cab") == [2, 0, 1]
    back = CharTokenizer.from_json(tok.to_json())
    assert back.bos_id == 3 and back.vocab_size == 4
    assert tok.decode([3, 0, 2]) == CharTokenizer.BOS_TEXT + "ac"
    plain = CharTokenizer.from_text("abcab")
    assert plain.bos_id is None and plain.vocab_size == 3
    assert "bos" not in json.loads(plain.to_json())  # old descriptions are unchanged
    assert CharTokenizer.from_json(plain.to_json()).bos_id is None
    assert tok.to_hf().bos_token_id == tok.bos_id


def _find(stream: torch.Tensor, row: torch.Tensor) -> list[int]:
    """Every offset where ``row`` occurs in ``stream`` (brute force)."""
    L = row.numel()
    return [s for s in range(stream.numel() - L + 1) if torch.equal(stream[s:s + L], row)]


def test_bos_windows_training_and_validation():
    vocab = VOCAB + 1
    bos = VOCAB
    data = _data(1200)
    t = Trainer(_model(vocab_size=vocab), data[:1000], data[1000:],
                _tcfg(eval_windows=None), bos_id=bos)
    b = t._batch()
    assert b.shape == (4, 17) and (b[:, 0] == bos).all() and (b[:, 1:] != bos).all()
    train = data[:1000]
    for row in b:
        assert _find(train, row[1:])  # the other 16 tokens are consecutive stream tokens
    w = t.val_windows()
    assert w.shape == (200 // 16, 17) and (w[:, 0] == bos).all()
    # stride seq_len: every validation token is a target exactly once, in order
    torch.testing.assert_close(w[:, 1:].reshape(-1), data[1000:1000 + 12 * 16])
    with torch.no_grad():
        ref = torch.stack([t.model.loss(w[i:i + 1]) for i in range(len(w))]).mean()
    assert t.evaluate()["val_loss"] == pytest.approx(ref.item(), rel=1e-5)
    plain = Trainer(_model(vocab_size=vocab), data[:1000], data[1000:], _tcfg())
    assert plain.run_id != t.run_id and "bos_id" not in plain.run_identity
    with pytest.raises(ValueError, match="bos_id"):
        Trainer(_model(), data[:1000], data[1000:], _tcfg(), bos_id=VOCAB)


def test_run_config_bos_saves_the_tokenizer(tmp_path):
    tok, train_ids, val_ids = _load_data({"bos": True})
    assert tok.bos_id == tok.vocab_size - 1 and int(train_ids.max()) < tok.bos_id
    with pytest.raises(ValueError, match="data.bos"):
        _load_data({"bos": "yes"})
    from tl_spectral.models.gpt import read_checkpoint_config

    text = "to be or not to be, that is the question " * 40
    tok = CharTokenizer.from_text(text, bos=True)
    ids = torch.tensor(tok.encode(text))
    doc = {"model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 16,
                     "d_head": 8, "n_ctx": 16, "d_mlp": 32},
           "train": {"steps": 2, "batch_size": 2, "warmup_steps": 0, "eval_every": 2,
                     "eval_windows": 2, "out_dir": str(tmp_path / "run"), "progress": False}}
    trainer, _ = run_from_config(doc, data=(tok, ids[:1200], ids[1200:]))
    assert trainer.bos_id == tok.bos_id
    meta = read_checkpoint_config(tmp_path / "run" / "final")
    assert CharTokenizer.from_json(json.dumps(meta["tokenizer"])).bos_id == tok.bos_id
    assert meta["model"]["vocab_size"] == tok.vocab_size


@pytest.mark.parametrize("overlap", [False, True])
def test_document_windows_with_a_start_token(overlap):
    from tl_spectral.data import document_windows

    text = "".join(chr(97 + (i * 7) % 26) for i in range(600))
    tok = CharTokenizer.from_text(text, bos=True)
    ids = torch.tensor(tok.encode(text))
    w = document_windows(text, tok, 5, 10, seed=3, overlap=overlap, bos_id=tok.bos_id)
    assert w.tokens.shape == (5, 10) and (w.tokens[:, 0] == tok.bos_id).all()
    assert w.bos_id == tok.bos_id
    for row, s in zip(w.tokens, w.starts.tolist()):
        torch.testing.assert_close(row[1:], ids[s:s + 9])  # 9 stream tokens after the start
    if not overlap:
        assert (w.starts % 9 == 0).all()  # disjoint pieces of length - 1
    plain = document_windows(text, tok, 5, 10, seed=3, overlap=overlap)
    assert plain.bos_id is None and (plain.tokens != tok.bos_id).all()
    with pytest.raises(ValueError, match="bos_id"):
        document_windows(text, tok, 5, 10, bos_id=-1)


def test_cli_seed_override_and_bos_config(tmp_path, capsys):
    from tl_spectral.data import tiny_shakespeare
    from tl_spectral.models.gpt import read_checkpoint_config
    from tl_spectral.models.train import train_cli

    corpus = tmp_path / "small.txt"
    corpus.write_text(tiny_shakespeare()[:6000])
    doc = {"model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 8,
                     "n_ctx": 16, "d_mlp": 16},
           "data": {"corpus": str(corpus), "val_fraction": 0.1, "bos": True},
           "train": {"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_every": 2,
                     "eval_windows": 2, "checkpoint_every": 2, "progress": False}}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(doc))
    assert train_cli(["--config", str(path), "--out-dir", str(tmp_path / "s3"),
                      "--seed", "3"]) == 0
    meta = read_checkpoint_config(tmp_path / "s3" / "final")
    assert meta["train"]["seed"] == 3 and meta["tokenizer"]["bos"] is True
    assert meta["model"]["vocab_size"] == len(set(corpus.read_text())) + 1
    run = json.loads((tmp_path / "s3" / "run.json").read_text())
    assert run["identity"]["bos_id"] == meta["model"]["vocab_size"] - 1


def test_analyze_frames_windows_after_the_start_token():
    from types import SimpleNamespace

    from tl_spectral.cli import _windows
    from tl_spectral.data import tiny_shakespeare

    text = tiny_shakespeare()[:20000]
    args = SimpleNamespace(n_docs=3, length=32, seed=0, overlap=False, corpus="shakespeare")
    tok = CharTokenizer.from_text(tiny_shakespeare(), bos=True)
    w = _windows(text, tok, args)
    assert w.tokens.shape == (3, 32) and (w.tokens[:, 0] == tok.bos_id).all()
    plain = _windows(text, CharTokenizer.from_text(tiny_shakespeare()), args)
    assert plain.bos_id is None and plain.tokens.shape == (3, 32)


def test_zoo_load_of_a_start_token_model_prepends_it(tmp_path, monkeypatch):
    """A zoo checkpoint whose tokenizer has a start token loads with default_prepend_bos:
    to_tokens puts bos_id first, as the model saw in training."""
    from tl_spectral.models import save_model, zoo

    tok = CharTokenizer.from_text("abcdefg \n", bos=True)
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layers=1, n_heads=2, d_model=16, n_ctx=32))
    save_model(m, tmp_path / "ck", extra={"tokenizer": json.loads(tok.to_json())})
    monkeypatch.setattr(zoo, "checkpoint_dir", lambda name: tmp_path / "ck")
    tl_model, tok2 = zoo.load("char-shakespeare")
    assert tok2.bos_id == tok.bos_id and tl_model.cfg.default_prepend_bos
    assert tl_model.to_tokens("abc")[0].tolist() == [tok.bos_id, *tok.encode("abc")]



@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_config_builds(path):
    """Every run config in configs/ builds its model and its trainer settings (a config that
    only fails when its multi-hour run starts is caught here), and the head-allocation
    config has the same attention parameter count as the uniform model it is compared with."""
    from tl_spectral.interventions.surgery import attention_param_count
    from tl_spectral.models import GPT, GPTConfig
    from tl_spectral.models.train import TrainConfig

    doc = json.loads(path.read_text())
    mdoc = {**doc["model"], "vocab_size": 65}
    with torch.device("meta"):
        GPT(GPTConfig.from_dict(mdoc))
    TrainConfig.from_dict(doc["train"])
    assert doc["train"]["out_dir"] == f"runs/{doc['name']}"
    if path.stem == "char-shakespeare-alloc":
        uni = json.loads((CONFIGS / "char-shakespeare.json").read_text())["model"]
        assert sum(mdoc["n_heads"]) == uni["n_layers"] * uni["n_heads"]
        assert attention_param_count(GPTConfig.from_dict(mdoc)) == \
            attention_param_count(GPTConfig.from_dict({**uni, "vocab_size": 65}))
