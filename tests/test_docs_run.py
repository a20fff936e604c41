"""Docs that run: every code block of README.md and docs/*.md is executed here, or marked
``<!-- illustrative: reason -->`` on the line before it. Python blocks run in order, one
namespace per document, with small stand-ins for the names the prose defines (``model``,
``windows``, ``tokens``…); shell blocks are checked command by command: every
``tl-spectral`` subcommand, study and flag must exist (against its ``--help``), every
``bash scripts/…`` script must exist. ``text`` blocks are output or diagrams."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- illustrative: (?P<why>[^>]+?) -->\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)```",
                   re.S)


def blocks(path: Path) -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["why"]) for m in FENCE.finditer(path.read_text("utf-8"))]


def test_every_block_is_tagged():
    for doc in DOCS:
        for lang, _code, _why in blocks(doc):
            assert lang in ("python", "bash", "text"), f"{doc.name}: a ``` block without a " \
                                                      "language (python | bash | text)"


# ------------------------------------------------------------------------- python blocks
def _tiny_gpt(attention="softmax", n_layers=6, seed=0):
    from tl_spectral.models import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=20, n_layers=n_layers, n_heads=2, d_model=16, d_head=8,
                         n_ctx=16, d_mlp=32, attention=attention)).eval()


def _low_rank(model):
    """Give every head a low routing rank, as trained models have (so a 50% cascade
    allocation is feasible on a tiny random model)."""
    with torch.no_grad():
        for blk in model.blocks:
            att = blk.attn
            if hasattr(att, "qkv"):
                W = att.qkv.weight.view(3, att.n_heads, att.d_head, -1)
                decay = torch.exp(-torch.arange(att.d_head, dtype=W.dtype))[None, :, None]
                W[0] *= decay
                W[1] *= decay
            elif hasattr(att, "A"):
                keep = att.A[..., :2, :2].clone()
                att.A.zero_()
                att.A[..., :2, :2] = keep
    return model


def _tiny_run(tmp: Path) -> Path:
    from tl_spectral.models.train import run_from_config

    doc = {"model": {"vocab_size": "auto", "n_layers": 2, "n_heads": 2, "d_model": 16,
                     "d_head": 4, "n_ctx": 16, "d_mlp": 32, "normalization": "none",
                     "attention": "sd"},
           "data": {"corpus": "tiny_shakespeare", "tokenizer": "char", "val_fraction": 0.1},
           "train": {"steps": 2, "batch_size": 2, "warmup_steps": 1, "eval_every": 2,
                     "eval_windows": 2, "checkpoint_every": 1, "out_dir": str(tmp / "run"),
                     "progress": False, "device": "cpu"}}
    run_from_config(doc)
    return tmp / "run"


def _namespace(doc: str, tmp: Path) -> dict:
    from conftest import make_native

    g = torch.Generator().manual_seed(0)
    if doc == "models.md":
        return {"tokens": torch.randint(0, 78, (2, 17), generator=g)}
    if doc == "probes.md":
        model = make_native(n_layers=2, n_heads=4, d_model=32, d_head=8, n_ctx=32, d_vocab=50)
        return {"model": model, "windows": torch.randint(0, 50, (5, 12), generator=g),
                "corpus_a": torch.randint(0, 50, (4, 12), generator=g),
                "corpus_b": torch.randint(0, 50, (4, 12), generator=g),
                "tokens": torch.randint(0, 50, (3, 12), generator=g)}
    if doc == "routing_filtering.md":
        return {"W_Q": torch.randn(2, 4, 32, 8, generator=g),
                "W_K": torch.randn(2, 4, 32, 8, generator=g),
                "tl_model": make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=16,
                                        d_vocab=20),
                "gpt": _tiny_gpt("sd", n_layers=2), "run_dir": _tiny_run(tmp),
                "windows": torch.randint(0, 20, (3, 9), generator=g)}
    if doc == "scale_pod.md":  # per-head lag fields of a small model, as the prose describes
        from tl_spectral.probes import AttentionFieldProbe, run_probes

        tiny = make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=32, d_vocab=20)
        f = run_probes(tiny, torch.randint(0, 20, (4, 16), generator=g),
                       [AttentionFieldProbe(per_head=True)], progress=False)["attention_fields"]
        fields = [f.fields[str(layer)] for layer in f.layers]
        return {"F": fields[0], "head_fields": fields, "lags": f.lags}
    if doc == "surgery.md":
        ids = torch.randint(0, 20, (2000,), generator=g)
        return {"model": _low_rank(_tiny_gpt()), "sd_model": _low_rank(_tiny_gpt("sd", seed=1)),
                "ids": ids,
                "train_ids": ids, "val_ids": torch.randint(0, 20, (400,), generator=g),
                "windows": torch.randint(0, 20, (3, 9), generator=g)}
    return {}


PY_DOCS = [d for d in DOCS if any(lang == "python" and why is None for lang, _, why in blocks(d))]


@pytest.mark.parametrize("doc", PY_DOCS, ids=[d.name for d in PY_DOCS])
def test_python_blocks_run(doc, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    ns = _namespace(doc.name, tmp_path)
    ran = 0
    for lang, code, why in blocks(doc):
        if lang != "python" or why is not None:
            continue
        exec(compile(code, f"{doc.name} block {ran}", "exec", dont_inherit=True), ns)
        plt.close("all")
        ran += 1
    assert ran >= 1


def test_illustrative_blocks_give_a_reason():
    n = 0
    for doc in DOCS:
        for _lang, _code, why in blocks(doc):
            if why is not None:
                assert len(why.split()) >= 4, f"{doc.name}: say why the block is not run"
                n += 1
    assert n <= 4, "keep illustrative blocks rare: make them runnable"


# -------------------------------------------------------------------------- shell blocks
_HELP: dict[tuple[str, ...], str] = {}


def _help(*argv: str) -> str:
    from tl_spectral.cli import main

    if argv not in _HELP:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) if argv[:1] != (
                "study",) or len(argv) > 1 else contextlib.nullcontext():
            main([*argv, "--help"])
        _HELP[argv] = out.getvalue()
    return _HELP[argv]


def _commands(code: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line.replace("$S", "")))
    return out


def _check_tl_spectral(args: list[str]) -> None:
    if not args or args[0] in ("--version", "-V"):
        return
    sub = args[0]
    assert sub in ("analyze", "tokenize", "train", "study", "geometry", "render"), sub
    words = [w.strip("[]") for w in args[1:]]
    if sub == "study":
        names = words[0].split("|")
        for name in names:
            assert name in _help("study"), name
        words = words[1:]
        key: tuple[str, ...] = ("study", names[0])
        if words and re.fullmatch(r"[a-z][\w-]*", words[0]) and words[0] in _help(*key):
            key = (*key, words[0])
            words = words[1:]
        text = _help(*key)
    else:
        text = _help(sub)
    for w in words:
        if w.startswith("--"):
            flag = w.split("=")[0]
            assert flag in text, f"tl-spectral {' '.join(args[:2])}: no flag {flag}"


SH_DOCS = [d for d in DOCS if any(lang == "bash" for lang, _, _ in blocks(d))]


@pytest.mark.parametrize("doc", SH_DOCS, ids=[d.name for d in SH_DOCS])
def test_shell_blocks_name_real_commands_and_flags(doc):
    checked = 0
    for lang, code, _why in blocks(doc):
        if lang != "bash":
            continue
        for argv in _commands(code):
            while argv and ("=" in argv[0] or argv[0] in ("nice", "-n", "nohup")
                            or argv[0].isdigit() or argv[0] == "S"):
                argv = argv[1:]
            if not argv:
                continue
            if argv[0] == "torchrun" and "tl_spectral" in argv:  # torchrun ... -m tl_spectral CMD
                argv = ["tl-spectral", *argv[argv.index("tl_spectral") + 1:]]
            if argv[0] == "tl-spectral":
                _check_tl_spectral(argv[1:])
                checked += 1
            elif argv[0] == "bash":
                assert (ROOT / argv[1]).is_file(), argv[1]
                checked += 1
    assert checked >= 1
