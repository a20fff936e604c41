"""Issue 30 item 2 at the command line: the windows ``analyze`` cuts are all real text, so a
corpus that holds the tokenizer's pad id (a char tokenizer's ``<unk>``, a BOS/EOS id used as
pad, as in SmolLM2 or GPT-2) is never trimmed by the runner's padding inference — the CLI
passes an explicit all-ones mask, to the main pass, the faithfulness curves and the induction
pass alike."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from _tiny_hf import save_tiny

from tl_spectral.cli import main
from tl_spectral.probes.runner import PaddingInferredWarning
from tl_spectral.results import Result


@pytest.fixture(scope="module")
def model_and_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("pad")
    save_tiny("gpt2", d / "m", n_layers=1, d_model=16, n_heads=2)
    rng = random.Random(0)
    # digits are not in the char tokenizer's alphabet: each is <unk> = <pad> = id 0, a
    # special token; windows start and end with runs of it of different lengths
    (d / "c.txt").write_text("".join(rng.choice("abcdefgh 0123") for _ in range(4000)))
    return d / "m", d / "c.txt"


def test_the_corpus_does_hold_runs_of_the_pad_id_at_window_ends(model_and_corpus):
    """The premise: without the CLI's mask, the runner would infer padding in these windows."""
    from _tiny_hf import boot

    from tl_spectral.data import document_windows
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes.runner import infer_padding

    m, corpus = model_and_corpus
    view = ModelView(boot(m))
    w = document_windows(corpus.read_text(), view.model.tokenizer, 8, 16, seed=0)
    with pytest.warns(PaddingInferredWarning):
        _, mask = infer_padding(view, w.tokens)
    assert mask is not None and not bool(mask.all())


def test_analyze_counts_every_token_of_its_windows(model_and_corpus, tmp_path):
    m, corpus = model_and_corpus
    out = tmp_path / "rep"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["analyze", "--model", str(m), "--corpus", str(corpus), "--n-docs", "8",
                     "--length", "16", "--no-progress", "--sections",
                     "attention_stats,head_scores,contributions", "--faithfulness-docs", "4",
                     "--out", str(out)]) == 0
    inferred = [w for w in seen if issubclass(w.category, PaddingInferredWarning)]
    assert not inferred, [str(w.message) for w in inferred]
    stats = Result.load(out / "results" / "attention_stats.safetensors")
    assert stats.n_queries.tolist() == [8 * 16]  # every token of every window a query
    f = Result.load(out / "results" / "faithfulness.safetensors")
    assert f.n_docs == 4 and f.n_tokens == 4 * 15  # all real (the last token predicts none)
    assert torch.isfinite(f.comprehensiveness).all()
