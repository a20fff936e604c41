"""What the routing study and the S–D training-runs comparison share (no study imports
another's module for these): the validation windows of a study run, the BPE data of the
study's subword models, and the interval of a head mean over the heads of a layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tl_spectral.data.topk_bpe import TopKBPE
from tl_spectral_studies._common import require_data_dir

HEADS_INTERVALS = ("95% t-interval over the heads of a layer (mean ± t(0.975, n − 1) · sd / √n)")
"""How :func:`head_interval` computes (recorded in the summaries it writes)."""


def head_interval(x: torch.Tensor) -> dict[str, float]:
    """Mean over heads with its 95% t-interval over heads (:data:`HEADS_INTERVALS`; a
    percentile bootstrap over 8 heads under-covers)."""
    from tl_spectral_studies.verdicts import t_interval

    iv = t_interval(x.double().flatten().tolist())
    return {"estimate": iv["estimate"], "low": iv["low"], "high": iv["high"]}


def _corpus_text(name: str, data_dir: Path) -> str:
    from tl_spectral.data import load_austen, load_wikipedia

    if name == "austen":
        return load_austen(data_dir / "austen.txt")
    if name == "wikipedia":
        return load_wikipedia(data_dir / "wiki_excerpt.txt")
    raise ValueError(f"unknown corpus {name!r}; use 'austen' or 'wikipedia'")


def load_bpe_data(data: dict[str, Any], cache_dir: str | Path | None = None):
    """(tokenizer, train_ids [n_train], val_ids [n_val]) for a ``data`` section
    ``{"corpora": ["austen", "wikipedia"], "data_dir": ..., "top_k": 4096,
    "val_fraction": 0.1}``. Each corpus is split into a leading train and a trailing
    validation part; the parts are encoded with GPT-2 BPE and concatenated in the given
    order. The vocabulary is fitted on the train part only. ``cache_dir``: encoded GPT-2
    ids are cached there (``bpe_ids.safetensors``) so that a resumed run does not re-encode."""
    from tl_spectral.data import BPETokenizer, train_val_split

    data_dir = require_data_dir(data.get("data_dir"), "the BPE corpora (austen.txt, "
                                "wiki_excerpt.txt, gpt2.tiktoken)")
    ranks = data_dir / "gpt2.tiktoken"
    corpora = list(data.get("corpora", ["austen", "wikipedia"]))
    frac = float(data.get("val_fraction", 0.1))
    top_k = int(data.get("top_k", 4096))
    cache = Path(cache_dir) / "bpe_ids.safetensors" if cache_dir else None
    key = json.dumps({"corpora": corpora, "val_fraction": frac})
    ids = None
    if cache is not None and cache.is_file():
        from safetensors import safe_open

        with safe_open(str(cache), framework="pt") as fh:
            if (fh.metadata() or {}).get("key") == key:
                ids = fh.get_tensor("train"), fh.get_tensor("val")
    if ids is None:
        bpe = BPETokenizer(ranks)
        tr, va = [], []
        for c in corpora:
            t, v = train_val_split(_corpus_text(c, data_dir), frac)
            tr.append(torch.tensor(bpe.encode(t), dtype=torch.long))
            va.append(torch.tensor(bpe.encode(v), dtype=torch.long))
        ids = torch.cat(tr), torch.cat(va)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            from safetensors.torch import save_file

            save_file({"train": ids[0].contiguous(), "val": ids[1].contiguous()}, str(cache),
                      metadata={"key": key})
    tok = TopKBPE.fit(ranks, ids[0], top_k)
    return tok, tok.map_ids(ids[0]), tok.map_ids(ids[1])


def run_validation_windows(model_dir: str | Path, kind: str, *, n_windows: int | None = None,
                       data_dir: str | Path | None = None) -> torch.Tensor:
    """Validation windows ``[n, seq_len + 1]`` (stride seq_len, the trainer's evaluation
    windows) of a study run: ``kind`` "char" (bundled Tiny Shakespeare, last 10%, the
    run's own character table) or "bpe" (Austen + Wikipedia, last 10% of each, the run's
    top-K BPE). ``n_windows``: that many evenly spaced windows (None = all)."""
    from tl_spectral.data import CharTokenizer, tiny_shakespeare, train_val_split
    from tl_spectral.models.gpt import read_checkpoint_config

    meta = read_checkpoint_config(model_dir)
    seq = int(meta.get("train", {}).get("seq_len") or meta["model"]["n_ctx"])
    data = meta.get("data", {})
    if kind == "char":
        tok = CharTokenizer.from_json(json.dumps(meta["tokenizer"]))
        _, val = train_val_split(tiny_shakespeare(), float(data.get("val_fraction", 0.1)))
        ids = torch.tensor(tok.encode(val))
    elif kind == "bpe":
        if data_dir is not None:
            data = {**data, "data_dir": str(data_dir)}
        tok, _, ids = load_bpe_data(data, cache_dir=Path(model_dir).parents[
            0 if Path(model_dir).name == "final" else 1])
        if tok.keep != list(meta["tokenizer"]["keep"]):
            raise ValueError(f"{model_dir}: the refitted top-K vocabulary differs from the run's")
    else:
        raise ValueError(f"kind must be 'char' or 'bpe', got {kind!r}")
    n = (ids.numel() - 1) // seq
    starts = torch.arange(n) * seq
    if n_windows is not None and n_windows < n:
        starts = starts[torch.linspace(0, n - 1, n_windows).round().long()]
    return ids[starts[:, None] + torch.arange(seq + 1)[None, :]]


