"""The S–D training-runs comparison (tl_spectral_studies.sd_runs): per-window losses, the
paired ΔPPL bootstrap, D statistics, the verdicts, the study on tiny training runs, its
markdown and the CLI's refusal to overwrite."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch

from tl_spectral.interventions.ablations import ablate, perplexity
from tl_spectral.interventions.surgery import window_losses
from tl_spectral.models import GPT, GPTConfig
from tl_spectral_studies import sd_runs
from tl_spectral_studies._common import StudyUsageError
from tl_spectral_studies.sd_runs import (
    d_statistics,
    filtering_collapse_verdict,
    layer0_minimum_verdict,
    paired_delta_ppl,
    sd_runs_markdown,
    sd_runs_study,
    seed_spread,
)


def _model(filtering="diag", seed=0, n_layers=2, attention="sd"):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=17, n_layers=n_layers, n_heads=3, d_model=24, d_head=4,
                      n_ctx=32, d_mlp=40, normalization="none", attention=attention,
                      attention_options={"filtering": filtering} if attention == "sd" else {},
                      init_std=0.1))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def _windows(n=10, T=17, seed=1):
    return torch.randint(0, 17, (n, T), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ per-window losses
def test_window_losses_average_to_perplexity_and_match_each_window():
    m, w = _model(), _windows()
    per = window_losses(m, w, batch_size=3)
    assert per.shape == (10,)
    # token-weighted: every window has 16 targets, so the plain mean is perplexity's loss
    assert math.isclose(float(per.mean()), perplexity(m, w)["loss"], rel_tol=1e-6)
    for i in range(w.shape[0]):  # brute force: one window at a time
        assert math.isclose(float(per[i]), perplexity(m, w[i:i + 1])["loss"], rel_tol=1e-6)


def test_paired_delta_ppl_estimate_and_interval_by_brute_force():
    from tl_spectral.analysis.bootstrap import resample_indices

    g = torch.Generator().manual_seed(3)
    base = 2.0 + 0.3 * torch.rand(12, generator=g, dtype=torch.float64)
    abl = base + 0.1 * torch.rand(12, generator=g, dtype=torch.float64) - 0.02
    r = paired_delta_ppl(base, abl)
    direct = math.exp(float(abl.mean())) - math.exp(float(base.mean()))
    assert math.isclose(r["delta_ppl"]["estimate"], direct, rel_tol=1e-12)
    assert math.isclose(r["rel_delta_ppl"]["estimate"], direct / math.exp(float(base.mean())),
                        rel_tol=1e-12)
    assert math.isclose(r["base_ppl"], math.exp(float(base.mean())), rel_tol=1e-12)
    # the paired bootstrap by hand: the same resampled windows for both models
    idx = resample_indices(12, 1000, 0)
    reps = (abl[idx].mean(1).exp() - base[idx].mean(1).exp())
    assert math.isclose(r["delta_ppl"]["low"], float(torch.quantile(reps, 0.025)), rel_tol=1e-9)
    assert math.isclose(r["delta_ppl"]["high"], float(torch.quantile(reps, 0.975)), rel_tol=1e-9)
    # an unpaired resampling would give another (wider) interval: the pairing matters
    idx2 = resample_indices(12, 1000, 1)
    unpaired = abl[idx2].mean(1).exp() - base[idx].mean(1).exp()
    assert float(torch.quantile(unpaired, 0.975) - torch.quantile(unpaired, 0.025)) > (
        r["delta_ppl"]["high"] - r["delta_ppl"]["low"])
    with pytest.raises(ValueError, match="one shape"):
        paired_delta_ppl(base, abl[:5])


def test_filtering_collapse_of_a_head_constant_delta_costs_exactly_nothing():
    m = _model()
    with torch.no_grad():
        for b in m.blocks:  # δ constant within each head, different across heads
            b.attn.delta.copy_(torch.tensor([[20.0], [30.0], [40.0]]).expand_as(b.attn.delta))
    col = ablate(m, "filtering_collapse")
    for b, c in zip(m.blocks, col.blocks):  # the collapse maps D to itself, bit for bit
        assert torch.equal(b.attn.delta, c.attn.delta)
    w = _windows()
    r = paired_delta_ppl(window_losses(m, w), window_losses(col, w))
    assert r["delta_ppl"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert filtering_collapse_verdict({"ablations": {"filtering_collapse": r}}) == "free"
    # a δ that varies within a head is not left alone and does cost something
    with torch.no_grad():
        m.blocks[0].attn.delta.copy_(torch.linspace(-3, 3, 12).reshape(3, 4))
    r2 = paired_delta_ppl(window_losses(m, w), window_losses(ablate(m, "filtering_collapse"), w))
    assert r2["delta_ppl"]["estimate"] != 0.0


def test_d_statistics_against_a_hand_computation():
    m = _model(n_layers=2)
    deltas = [[0.0, 0.0, 0.0, 0.0], [-1.0, 0.5, 2.0, 0.0], [3.0, 3.0, -2.0, 1.0]]
    with torch.no_grad():
        m.blocks[0].attn.delta.copy_(torch.tensor(deltas))
        m.blocks[1].attn.delta.zero_()
    st = d_statistics(m)
    sp = [[math.log1p(math.exp(x)) for x in row] for row in deltas]
    d0 = math.log(2.0)
    means = [sum(r) / 4 for r in sp]
    cvs = [math.sqrt(sum((x - mu) ** 2 for x in r) / 4) / mu for r, mu in zip(sp, means)]
    rels = [sum(abs(x - d0) / d0 for x in r) / 4 for r in sp]
    assert math.isclose(st[0]["d_init"], d0, rel_tol=1e-12)
    for key, vals in (("mean", means), ("cv", cvs), ("rel_change", rels)):
        iv = st[0][key]
        assert math.isclose(iv["estimate"], sum(vals) / 3, rel_tol=1e-6), key
        # the t-interval over the 3 heads: mean ± t(0.975, 2) · sd / √3
        m = sum(vals) / 3
        sd = math.sqrt(sum((x - m) ** 2 for x in vals) / 2)
        assert math.isclose(iv["high"] - m, 4.302653 * sd / math.sqrt(3), rel_tol=1e-5)
        assert math.isclose(m - iv["low"], iv["high"] - m, rel_tol=1e-9)
    # δ = 0 everywhere: D is its initial 0.693·I, no spread, no change
    assert math.isclose(st[1]["mean"]["estimate"], d0, rel_tol=1e-9)
    assert st[1]["cv"]["estimate"] == 0.0 and st[1]["rel_change"]["estimate"] == 0.0
    # scalar filtering has no within-head spread; a layer without filtering has no entry
    sc = d_statistics(_model(filtering="scalar"))
    assert sc[0]["cv"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert d_statistics(_model(filtering="none")) == [None, None]


# ------------------------------------------------------------------ verdicts
def _iv(e, lo, hi):
    return {"estimate": e, "low": lo, "high": hi}


def _run(R, fc_delta, fc_rel, name="cfg", seed=0, recipe="r"):
    return {"identity": {"config_name": name, "seed": seed, "recipe_id": recipe},
            "cascade": {"final": {"R": R}},
            "ablations": {"filtering_collapse": {"delta_ppl": fc_delta, "rel_delta_ppl": fc_rel}}}


def test_layer0_minimum_verdict_is_descriptive():
    """The summary holds percentile intervals over 8 heads (they under-cover): the layer-0
    call only describes the head means, and a changed mean changes it."""
    sep = [_iv(2.0, 1.8, 2.2), _iv(3.0, 2.5, 3.5), _iv(4.0, 3.6, 4.4)]
    assert layer0_minimum_verdict(_run(sep, None, None)) == (
        "layer 0 has the lowest head mean (descriptive: no test)")
    notmin = copy.deepcopy(sep)
    notmin[2]["estimate"] = 1.9  # layer 2's mean falls below layer 0's
    assert layer0_minimum_verdict(_run(notmin, None, None)) == (
        "layer 0 does not have the lowest head mean")
    with pytest.raises(ValueError, match="2 layers"):
        layer0_minimum_verdict(_run(sep[:1], None, None))


def test_filtering_collapse_verdict_branches():
    R = [_iv(1, 1, 1)] * 2
    # the interval contains 0 (even though it reaches beyond ±1%)
    assert filtering_collapse_verdict(_run(R, _iv(0.1, -0.2, 0.5), _iv(0.02, -0.04, 0.1))) == "free"
    # excludes 0 but within ±1% of the base PPL
    assert filtering_collapse_verdict(_run(R, _iv(0.03, 0.01, 0.04),
                                           _iv(0.006, 0.002, 0.008))) == "free"
    # the upper end passes 1%: a cost, with its relative interval in percent
    assert filtering_collapse_verdict(_run(R, _iv(0.05, 0.01, 0.07), _iv(0.01, 0.002, 0.014))
                                      ) == "costs 1.00% [0.20, 1.40]"


def test_seed_spread_groups_by_config_name():
    R = lambda r0: [_iv(r0, r0, r0), _iv(5, 5, 5)]  # noqa: E731
    s = {"runs": {"a": _run(R(2.0), None, None, seed=0), "b": _run(R(3.0), None, None, seed=1),
                  "c": _run(R(4.5), None, None, seed=2), "x": _run(R(9.0), None, None, "other")}}
    (g,) = seed_spread(s)
    assert g["labels"] == ["a", "b", "c"] and g["seeds"] == [0, 1, 2] and g["seed_only"]
    assert "different steps" not in sd_runs._seed_line(g)
    s["runs"]["c"]["identity"]["steps"] = 300
    assert "(at different steps: None, None, 300)" in sd_runs._seed_line(seed_spread(s)[0])
    assert math.isclose(g["layer0_R_mean"], 9.5 / 3) and (g["layer0_R_min"], g["layer0_R_max"]) == (
        2.0, 4.5)
    s["runs"]["c"]["identity"]["recipe_id"] = "another"
    assert not seed_spread(s)[0]["seed_only"]
    del s["runs"]["b"], s["runs"]["c"]
    assert seed_spread(s) == []


# ------------------------------------------------------------------ the study on tiny runs
_TINY = {
    "name": "tiny-sd",
    "model": {"vocab_size": "auto", "n_layers": 2, "n_heads": 2, "d_model": 16, "d_head": 4,
              "n_ctx": 16, "d_mlp": 32, "normalization": "none", "attention": "sd", "init_std": 0.3,
              "attention_options": {"filtering": "diag", "routing": "skew", "a_init_std": 0.05}},
    "data": {"corpus": "tiny_shakespeare", "tokenizer": "char", "val_fraction": 0.1},
    "train": {"steps": 4, "batch_size": 2, "lr": 0.003, "warmup_steps": 1, "eval_every": 2,
              "eval_windows": 2, "eval_batch_size": 256, "checkpoint_every": 2,
              "keep_checkpoints": 10, "seed": 0, "device": "cpu", "progress": False,
              "no_decay": ["*.A", "*.delta"]},
}


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    from tl_spectral.models.train import run_from_config

    root = tmp_path_factory.mktemp("sdruns")
    run_from_config(_TINY, overrides={"out_dir": str(root / "tiny-sd")})
    run_from_config(_TINY, overrides={"out_dir": str(root / "tiny-sd-s1"), "seed": 1})
    shutil.copytree(root / "tiny-sd-s1", root / "partial")
    shutil.rmtree(root / "partial" / "final")  # a run stopped before its end
    return root


def test_sd_runs_study_on_tiny_runs(tiny_runs, tmp_path):
    from tl_spectral.geometry.model import model_qk_geometry, model_sd_geometry
    from tl_spectral.models import load_checkpoint
    from tl_spectral_studies.routing import run_validation_windows

    runs = [tiny_runs / "tiny-sd", tiny_runs / "tiny-sd-s1", tiny_runs / "partial"]
    s = sd_runs_study(runs, tmp_path / "res", labels=["seed0", "seed1", "partial"], n_windows=8)
    assert json.loads((tmp_path / "res" / "summary.json").read_text()) == s
    # the figure redraws from summary.json alone
    from tl_spectral_studies.sd_runs import sd_runs_figure

    png = sd_runs_figure(tmp_path / "res", tmp_path / "fig" / "sd_runs.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    a, b, p = (s["runs"][k] for k in ("seed0", "seed1", "partial"))
    assert (a["identity"]["config_name"], b["identity"]["config_name"]) == ("tiny-sd", "tiny-sd")
    assert (a["identity"]["seed"], b["identity"]["seed"]) == (0, 1)
    assert a["identity"]["recipe_id"] == b["identity"]["recipe_id"]
    assert a["identity"]["a_init_std"] == 0.05 and a["identity"]["normalization"] == "none"
    assert a["identity"]["no_decay"] == ["*.A", "*.delta"] and a["identity"]["steps"] == 4
    meta = json.loads((runs[0] / "final" / "config.json").read_text())
    assert a["identity"]["final"] and a["identity"]["val_loss"] == meta["metrics"]["val_loss"]
    assert not p["identity"]["final"] and "no final/" in p["identity"]["val_loss_from"]
    assert p["identity"]["model_dir"].endswith("step_0000004")
    # cascade: every checkpoint, head means; last step's intervals around the model's ranks
    assert a["cascade"]["steps"] == [2, 4]
    model = load_checkpoint(runs[0] / "final")
    R = model_qk_geometry(model, biases=False).eff_rank_R.double()
    S = model_sd_geometry(model).eff_rank_S.double()
    for li in range(2):
        assert math.isclose(a["cascade"]["final"]["R"][li]["estimate"], float(R[li].mean()),
                            rel_tol=1e-6)
        assert math.isclose(a["cascade"]["rank_S_mean"][-1][li], float(S[li].mean()), rel_tol=1e-6)
    assert a["filtering"] == d_statistics(model)
    # ablations: the base loss is perplexity's on the same 8 windows
    ab = a["ablations"]
    assert (ab["n_windows"], ab["seq_len"]) == (8, 16)
    win = run_validation_windows(runs[0] / "final", "char", n_windows=8)
    base = perplexity(model, win)
    for kind in ("filtering_collapse", "routing_removal", "filtering_removal"):
        assert math.isclose(ab[kind]["base_loss"], base["loss"], rel_tol=1e-6)
        abl = perplexity(ablate(model, kind), win)
        # float32 logits: the two paths agree to rounding, ~1e-6 of the PPL
        assert abs(ab[kind]["delta_ppl"]["estimate"] - (abl["ppl"] - base["ppl"])) <= (
            1e-5 * base["ppl"])
        assert ab[kind]["delta_ppl"]["estimate"] != 0.0  # the ablations do change the model
    md = sd_runs_markdown(tmp_path / "res")
    for label in ("seed0", "seed1", "partial"):
        assert f"| {label} |" in md
    assert "Seed spread: tiny-sd, seeds 0, 1:" in md and "Intervals: " in md
    assert p["identity"]["recipe_id"] == b["identity"]["recipe_id"]  # a copy of seed 1's run
    assert "(step 4, no final/)" in md


def test_sd_runs_cli_refuses_to_overwrite(tiny_runs, tmp_path, capsys):
    from tl_spectral_studies.routing import main

    args = ["sd-runs", "--run-dir", str(tiny_runs / "tiny-sd"), "--results", str(tmp_path),
            "--windows", "4"]
    assert main(args) == 0
    assert "| tiny-sd |" in capsys.readouterr().out
    before = (tmp_path / "summary.json").read_text()
    with pytest.raises(StudyUsageError, match="--overwrite"):
        main(args)
    assert (tmp_path / "summary.json").read_text() == before
    assert main(args + ["--label", "again", "--overwrite"]) == 0
    assert "again" in json.loads((tmp_path / "summary.json").read_text())["runs"]
    with pytest.raises(StudyUsageError, match="one --label per --run-dir"):
        main(args + ["--label", "a", "--label", "b", "--overwrite"])


def test_routing_verdict_rows_from_sd_runs_follow_the_numbers():
    """The claim rows that docs/routing_filtering.md takes from the S–D runs: a layer-0 rank
    above 3, late layers at 10+, a collapse that costs, or a routing removal below +100%
    changes the verdict (a changed number is caught)."""
    from tl_spectral_studies.routing import _sd_runs_verdict_rows

    def iv(e, lo, hi):
        return {"estimate": e, "low": lo, "high": hi}

    def run(seed, r0, collapse):
        return {"identity": {"normalization": "none", "seed": seed, "no_decay": [],
                             "config_name": "cfg", "recipe_id": "x", "steps": 10},
                "cascade": {"final": {"R": [r0, iv(5, 4.5, 5.5), iv(6, 5, 7), iv(7, 6, 8)]}},
                "filtering": [{"cv": iv(0.05, 0.04, 0.06)}, None, {"cv": iv(0.02, 0.01, 0.03)}],
                "ablations": {"filtering_collapse": {
                    "delta_ppl": collapse, "rel_delta_ppl": {k: v / 5 for k, v in
                                                             collapse.items()}},
                    "routing_removal": {"rel_delta_ppl": iv(2.0, 1.5, 2.5)}}}

    s = {"runs": {"a": run(0, iv(2.1, 2.0, 2.2), iv(0.01, -0.01, 0.03)),
                  "b": run(1, iv(2.3, 2.2, 2.4), iv(0.02, 0.0, 0.04))}}
    rank, coll, rem = (r.label for r in _sd_runs_verdict_rows(s))
    assert "layer 0 at ≤ 3 in 2 of 2 runs and the lowest layer in 2 of 2" in rank
    assert "late layers reach 10+ in 0 of 2" in rank and rank.startswith("partly")
    assert "seeds 0, 1): 2.10–2.30" in _sd_runs_verdict_rows(s)[0].number
    assert coll.startswith("reproduced in every run") and "CV ≤ 0.05" in coll
    assert rem.startswith("reproduced in every run")
    s["runs"]["b"]["cascade"]["final"]["R"][0] = iv(5.2, 5.0, 5.4)  # above 3, not the minimum
    assert "layer 0 at ≤ 3 in 1 of 2 runs and the lowest layer in 1 of 2" in (
        _sd_runs_verdict_rows(s)[0].label)
    for r in s["runs"].values():  # late layers reach 10+: no longer "partly"
        r["cascade"]["final"]["R"][3] = iv(11, 10.5, 11.5)
    assert "late layers at 10+ in 2 of 2" in _sd_runs_verdict_rows(s)[0].label
    s["runs"]["a"]["ablations"]["filtering_collapse"] = {
        "delta_ppl": iv(0.5, 0.4, 0.6), "rel_delta_ppl": iv(0.1, 0.08, 0.12)}
    assert _sd_runs_verdict_rows(s)[1].label.startswith("reproduced in 1 of 2 runs")
    s["runs"]["a"]["ablations"]["routing_removal"]["rel_delta_ppl"] = iv(0.6, 0.5, 0.7)
    assert _sd_runs_verdict_rows(s)[2].label.startswith("reproduced in 1 of 2 runs")
    assert _sd_runs_verdict_rows(None) == []


def test_no_import_circle_between_routing_and_sd_runs():
    """sd_runs (and the shared _runs) never import the routing study; routing imports them."""
    import ast
    from pathlib import Path

    import tl_spectral_studies

    pkg = Path(tl_spectral_studies.__file__).parent
    for name in ("sd_runs.py", "_runs.py", "verdicts.py"):
        tree = ast.parse((pkg / name).read_text(encoding="utf-8"))
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "tl_spectral_studies.routing" not in mods, name
