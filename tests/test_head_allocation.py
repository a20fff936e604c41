"""Head allocation, validated (issue 17 item 2): per-window losses, the paired PPL difference
and its verdict, and the study's summary on tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tl_spectral.interventions.surgery import perplexity, window_losses
from tl_spectral.models import GPT, GPTConfig, save_model
from tl_spectral_studies._common import StudyUsageError
from tl_spectral_studies.head_allocation import (
    markdown,
    paired_ppl_difference,
    parse_run,
    run_study,
    verdict,
)


def _gpt(heads, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=9, n_layers=2, n_heads=heads, d_model=16, d_head=4,
                         n_ctx=12)).eval()


def test_window_losses_average_to_perplexity_and_match_a_loop():
    m = _gpt([1, 3])
    w = torch.randint(0, 9, (7, 11), generator=torch.Generator().manual_seed(1))
    lw = window_losses(m, w, batch_size=3)
    assert lw.shape == (7,) and lw.dtype == torch.float64
    assert math.isclose(float(lw.mean()), perplexity(m, w)["loss"], rel_tol=1e-6)
    for i in range(7):  # brute force: one window, one target at a time
        logits = m(w[i:i + 1, :-1])[0]
        ce = [-torch.log_softmax(logits[t].double(), -1)[w[i, t + 1]] for t in range(10)]
        assert math.isclose(float(lw[i]), float(sum(ce) / 10), rel_tol=1e-5)


def test_paired_difference_estimate_and_interval():
    g = torch.Generator().manual_seed(0)
    b = 1.0 + 0.1 * torch.rand(200, generator=g, dtype=torch.float64)
    a = b - 0.05  # a is better on every window
    d = paired_ppl_difference(a, b, n_resamples=200)
    assert math.isclose(d["estimate"], math.exp(a.mean()) - math.exp(b.mean()), rel_tol=1e-12)
    assert d["low"] <= d["estimate"] <= d["high"] < 0
    same = paired_ppl_difference(b, b, n_resamples=50)
    assert same["estimate"] == same["low"] == same["high"] == 0.0
    with pytest.raises(ValueError, match="per-window losses of one shape"):
        paired_ppl_difference(a, b[:5])


def test_verdict_branches():
    iv = lambda e, lo, hi: {"estimate": e, "low": lo, "high": hi}  # noqa: E731
    s = {"paired": {"0": iv(-0.05, -0.07, -0.03), "1": iv(-0.04, -0.06, -0.02)},
         "uniform_seed_change": 0.01}
    assert verdict(s).startswith("the allocation helps")
    s["uniform_seed_change"] = 0.045  # seed 1's difference is within the seed noise
    assert verdict(s).startswith("not distinguishable")
    s = {"paired": {"0": iv(0.05, 0.03, 0.07), "1": iv(0.06, 0.04, 0.08)},
         "uniform_seed_change": 0.01}
    assert verdict(s).startswith("the allocation hurts")
    s["paired"]["1"] = iv(0.02, -0.01, 0.05)  # an interval that contains 0
    assert verdict(s).startswith("not distinguishable")
    assert "one seed" in verdict({"paired": {"0": iv(-1, -2, -0.5)}, "uniform_seed_change": None})
    assert verdict({"paired": {}}) == "no seed has both models yet"


def test_run_study_on_tiny_runs(tmp_path):
    runs = {}
    for which, heads in (("uniform", 2), ("alloc", [1, 3])):
        for seed in (0, 1):
            d = tmp_path / f"{which}{seed}"
            save_model(_gpt(heads, seed), d / "final", extra={"metrics": {"val_loss": 1.0}})
            runs[(which, seed)] = d
    w = torch.randint(0, 9, (20, 11), generator=torch.Generator().manual_seed(2))
    specs = [f"{w_}:{s}={d}" for (w_, s), d in runs.items()]
    s = run_study(specs, tmp_path / "res", n_resamples=100, windows=w)
    assert set(s["paired"]) == {"0", "1"} and s["n_windows"] == 20 and s["seq_len"] == 10
    m = s["models"]
    assert m["alloc:0"]["heads_per_layer"] == [1, 3] and m["uniform:0"]["heads_per_layer"] == [2, 2]
    assert m["alloc:0"]["attention_params"] == m["uniform:0"]["attention_params"]
    # the paired estimate is the difference of the two models' PPL on the same windows
    assert math.isclose(s["paired"]["0"]["estimate"],
                        m["alloc:0"]["val_ppl"] - m["uniform:0"]["val_ppl"], rel_tol=1e-9)
    assert math.isclose(m["uniform:0"]["val_loss"],
                        perplexity(_gpt(2, 0), w)["loss"], rel_tol=1e-6)
    assert s["uniform_seed_change"] == pytest.approx(
        abs(m["uniform:1"]["val_ppl"] - m["uniform:0"]["val_ppl"]))
    md = markdown(tmp_path / "res")
    assert "1, 3" in md and "Verdict:" in md and s["verdict"] in md
    # every model came from a run folder: the table says how to re-check it
    assert "Re-checking:" in md and s["command"] in md
    from tl_spectral_studies.head_allocation import short_verdict

    assert short_verdict(tmp_path / "res").startswith(s["verdict"])
    assert "seed 1:" in short_verdict(tmp_path / "res")
    assert json.loads((tmp_path / "res" / "summary.json").read_text())["verdict"] == s["verdict"]
    with pytest.raises(StudyUsageError, match="--overwrite"):
        run_study(specs, tmp_path / "res", windows=w)
    with pytest.raises(StudyUsageError, match="WHICH:SEED=SOURCE"):
        parse_run("alloc=runs/x")
