"""The evidence runner (issue 39): the minimum-detectable-effect and sensitivity rules, the
zero-sink hook, the brute-force sink rows against an independent computation, resumable jobs
on a tiny random Llama, and the panel summary."""

from __future__ import annotations

import json
import math
import os
import sys
from statistics import NormalDist

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from tl_spectral_studies import evidence as ev  # noqa: E402
from tl_spectral_studies import evidence_summary as es  # noqa: E402
from tl_spectral_studies.claims import rules  # noqa: E402


# ------------------------------------------------------------------ rules: MDE
def test_mde_is_the_effect_detected_with_80_percent_power():
    se = 0.037
    m = rules.mde(se=se)
    z = NormalDist()
    # a true effect of size m: the estimate ~ N(m, se); power = P(estimate/se > z_.975)
    power = 1 - z.cdf(z.inv_cdf(0.975) - m / se)
    assert power == pytest.approx(0.80, abs=1e-9)
    assert m == pytest.approx(2.8016 * se, rel=1e-4)


def test_mde_reads_the_standard_error_from_a_95_interval():
    se = 0.5
    iv = {"low": 1.0 - 1.959964 * se, "high": 1.0 + 1.959964 * se}
    assert rules.se_from_interval(iv) == pytest.approx(se, rel=1e-6)
    assert rules.mde(iv) == pytest.approx(rules.mde(se=se), rel=1e-6)
    assert rules.mde(None) is None
    with pytest.raises(ValueError, match="alpha and power"):
        rules.mde(se=1.0, power=1.0)


# ---------------------------------------------------------- rules: sensitivity
def _panel(label_of):
    return [({"first token": f, "corpus": c, "draw": d}, label_of(f, c, d))
            for f in ("none", "<|im_start|>", "<|endoftext|>") for c in ("wiki", "austen")
            for d in (0, 1, 2)]


def test_sensitivity_robust_only_when_every_cell_agrees():
    assert rules.sensitivity(_panel(lambda f, c, d: rules.REPRODUCED)) == rules.ROBUST
    # a reason after the rule word does not make a different label
    cells = _panel(lambda f, c, d: "not comparable: x" if d else "not comparable: y")
    assert rules.sensitivity(cells) == rules.ROBUST


def test_sensitivity_names_the_factor_that_flips_the_label():
    cells = _panel(lambda f, c, d: rules.REPRODUCED if f == "none" else rules.NOT_DISTINGUISHABLE)
    assert rules.sensitivity(cells) == "depends on first token"
    cells = _panel(lambda f, c, d: rules.REPRODUCED if d == 2 else rules.NOT_DISTINGUISHABLE)
    assert rules.sensitivity(cells) == "depends on draw"
    cells = _panel(lambda f, c, d: rules.REPRODUCED if (c == "wiki" and f != "none")
                   else rules.NOT_REPRODUCED)
    assert rules.sensitivity(cells) == "depends on first token, corpus"


def test_sensitivity_incomplete_panel_names_the_varying_factors():
    cells = [({"first token": "none", "draw": 0}, rules.REPRODUCED),
             ({"first token": "<bos>", "draw": 1}, rules.NOT_REPRODUCED)]
    assert rules.sensitivity(cells) == "depends on first token, draw"
    assert rules.sensitivity([]) == rules.NOT_TESTED
    with pytest.raises(ValueError, match="same factors"):
        rules.sensitivity([({"a": 1}, "reproduced"), ({"b": 1}, "partly")])


# ------------------------------------------------------------------ hook, jobs
def test_zero_sink_hook_includes_or_excludes_the_sinks_self_attention():
    p = torch.rand(2, 3, 5, 5)
    inc = ev.zero_sink_hook(True)(p)
    exc = ev.zero_sink_hook(False)(p)
    assert (inc[..., 0] == 0).all()
    assert torch.equal(exc[..., 0, 0], p[..., 0, 0]) and (exc[..., 1:, 0] == 0).all()
    assert torch.equal(inc[..., 1:], p[..., 1:]) and torch.equal(exc[..., 1:], p[..., 1:])
    assert (p[..., 0] > 0).all()  # the input is not modified


def test_write_atomic_and_is_done(tmp_path):
    conf = {"a": 1}
    path = tmp_path / "x" / "job.json"
    assert not ev.is_done(path, conf)
    ev.write_atomic(path, {"config_hash": ev.config_hash(conf)})
    assert ev.is_done(path, conf) and not ev.is_done(path, {"a": 2})
    assert [p.name for p in path.parent.iterdir()] == ["job.json"]
    path.write_text('{"config_hash": "', encoding="utf-8")  # a half-written file
    assert not ev.is_done(path, conf)


def test_panel_cells_and_keys():
    cells = ev.panel("smollm2-135m")
    assert len(cells) == 3 * 2 * 3 and len({c.key for c in cells}) == 18
    assert len(ev.panel("gemma3-270m", "faithfulness")) == 2 * 1 * 3
    assert ev.Cell("<|im_start|>", "wiki", 1).key == "first=im_start.corpus=wiki.draw=1"
    with pytest.raises(ValueError, match="no panel"):
        ev.panel("gpt2")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from _tiny_hf import boot, char_tokenizer, save_tiny

    folder = tmp_path_factory.mktemp("tiny_llama")
    save_tiny("llama", folder, n_layers=2, n_ctx=64)
    data = tmp_path_factory.mktemp("data")
    words = "the quick brown fox jumps over a lazy dog. " * 200
    for name in ev.CORPORA.values():
        (data / name).write_text(words, encoding="utf-8")
    return folder, boot(folder), char_tokenizer(), data


def test_sink_rows_match_an_independent_computation(tiny):
    from tl_spectral.model_view import ModelView

    _, model, _, _ = tiny
    view = ModelView(model)
    toks = torch.randint(1, 60, (3, 12))
    rows = ev.sink_rows(view, toks, batch_size=2)
    _, cache = model.run_with_cache(toks)
    for li in range(view.n_layers):
        p = cache[f"blocks.{li}.attn.hook_pattern"].double()  # [b, H, T, T]
        assert torch.allclose(rows["attn0"][:, li], p[:, :, 1:, 0].mean((1, 2)), atol=1e-6)
        o = cache[f"blocks.{li}.hook_attn_out"].double()  # [b, T, m] (Llama: no b_O)
        v = cache[f"blocks.{li}.attn.hook_v"].double()  # [b, T, H_kv, d]
        W = view.weights(li).W_O.double()  # [H, d, m]
        g = W.shape[0] // v.shape[2]
        v0 = torch.einsum("bhd,hdm->bhm", v[:, 0].repeat_interleave(g, 1), W)
        c0 = (p[:, :, :, 0, None] * torch.einsum("btm,bhm->bht", o, v0)[..., None]).squeeze(-1)
        c0 = c0 / (o.norm(dim=-1) ** 2)[:, None, :]
        assert torch.allclose(rows["C0"][:, li], c0[:, :, 1:].sum(1).mean(1), atol=1e-5)


def test_zero_sink_matches_the_hf_reimplementation(tiny):
    from transformers import LlamaForCausalLM

    from tl_spectral.model_view import ModelView
    from tl_spectral_studies.real_decoder_ops import window_nll as hf_nll

    folder, model, _, _ = tiny
    hf = LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    view = ModelView(model)
    toks = torch.randint(1, 60, (2, 10))
    hooks = [(view.hook_pattern(li), ev.zero_sink_hook(True)) for li in range(2)]
    ours = ev.window_nll(view, toks, hooks, batch_size=1)
    ref = hf_nll(hf, toks, {0: "zero_sink", 1: "zero_sink"})
    assert torch.allclose(ours, ref, rtol=1e-4)
    assert torch.allclose(ev.window_nll(view, toks), hf_nll(hf, toks), rtol=1e-4)
    exc = ev.window_nll(view, toks, [(view.hook_pattern(li), ev.zero_sink_hook(False))
                                     for li in range(2)])
    assert not torch.allclose(exc, ours)  # the sink's own row matters downstream


def test_runner_resumes_and_summarizes(tiny, tmp_path, monkeypatch):
    _, model, tok, data = tiny
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    cells = [ev.Cell("none", "wiki", 0), ev.Cell("<pad>", "wiki", 0)]
    cfg = {"windows": 4, "length": 16, "batch_size": 2}
    kw = {"cfg": cfg, "cells": cells, "loaded": (model, tok), "log": lambda s: None}
    rows = ev.run("tiny", tmp_path, data, steps=("sinks", "zero_sink"), **kw)
    assert [r["ran"] for r in rows] == [True] * 4
    rows = ev.run("tiny", tmp_path, data, steps=("sinks", "zero_sink"), **kw)
    assert [r["ran"] for r in rows] == [False] * 4  # resumed: nothing recomputed
    job = json.loads(ev.job_path(tmp_path, "tiny", "sinks", cells[1]).read_text())
    sel = job["selection"]
    assert set(sel["select_windows"]).isdisjoint(sel["test_windows"])
    assert len(job["per_window"]["attn0"]) == 4
    ev.job_path(tmp_path, "tiny", "zero_sink", cells[0]).write_text("{", encoding="utf-8")
    rows = ev.run("tiny", tmp_path, data, steps=("zero_sink",), **kw)
    assert [r["ran"] for r in rows] == [True, False]  # the broken file is redone
    s = es.summarize(tmp_path, "tiny")
    zp = s["claims"]["C.zero_ppl"]
    assert len(zp["cells"]) == 4 and not zp["complete"]
    assert {c["factors"]["sink self-attention"] for c in zp["cells"]} == {"included",
                                                                           "excluded"}
    assert all(c["mde"] > 0 and math.isfinite(c["mde"]) for c in zp["cells"])


def test_summary_names_the_first_token_when_it_flips_the_label(tmp_path, monkeypatch):
    monkeypatch.setitem(ev.FIRST_TOKENS, "fake", ("none", "<|bos|>"))
    for first, lo in (("none", 0.1), ("<|bos|>", -0.1)):
        for corpus in ("wiki", "austen"):
            for draw in (0, 1, 2):
                cell = ev.Cell(first, corpus, draw)
                conf = ev.job_config("fake", "zero_sink", cell, ev.DEFAULTS)
                iv = {"estimate": lo + 0.2, "low": lo, "high": lo + 0.4}
                ev.write_atomic(ev.job_path(tmp_path, "fake", "zero_sink", cell),
                                {"config": conf, "include_self": iv, "exclude_self": iv})
    zp = es.summarize(tmp_path, "fake")["claims"]["C.zero_ppl"]
    assert zp["complete"] and zp["sensitivity"] == "depends on first token"
    assert zp["mde_max"] == pytest.approx(rules.mde({"low": 0.0, "high": 0.4}))
    table = es.cells_markdown(es.summarize(tmp_path, "fake"))
    assert table.count("`C.zero_ppl`") == 24 and "| depends on first token |" in table
    assert all(line.count("|") - line.count("\\|") == 11 for line in table.splitlines())


def test_records_carry_mde_and_the_panels_sensitivity(tmp_path):
    from tl_spectral_studies.claims import registry

    m = registry.Model("fake", "Fake", registry.STANDARD, "real_decoder", "res", "cmd", "s",
                       evidence="ev/summary.json")
    (tmp_path / "res").mkdir()
    c = registry.Claim("X.1", "paper", "C.0", "words", "rule", lambda r: registry.Measurement(
        "1.0 [0.5, 1.5]", rules.REPRODUCED, 1.0, (0.5, 1.5), 8), panel="X.1")
    rec = registry.evaluate(c, registry.Results(tmp_path, m))
    assert rec.mde == pytest.approx(rules.mde({"low": 0.5, "high": 1.5}))
    assert rec.sensitivity == "not tested: one framing (not recorded)"  # no panel, no file
    cells = [{"factors": {"first token": f, "draw": 0}, "label": lab, "n": 32,
              "estimate": 1.0, "low": 0.5, "high": 1.5}
             for f, lab in (("none", rules.REPRODUCED), ("<bos>", rules.NOT_DISTINGUISHABLE))]
    ev.write_atomic(tmp_path / "ev" / "summary.json", {"claims": {"X.1": {
        "sensitivity": "depends on first token", "complete": False, "cells": cells,
        "cells_expected": 36}}})
    rec = registry.evaluate(c, registry.Results(tmp_path, m))
    assert rec.sensitivity == "depends on first token so far (2 of 36 cells)"
    assert rec.label == rules.REPRODUCED and rec.n == 8 and rec.cells is None  # the study's
    assert rec.to_json()["mde"] == rec.mde


def test_compute_plan_extrapolates_per_window(tmp_path, monkeypatch):
    monkeypatch.setitem(ev.FIRST_TOKENS, "fake", ("none", "<bos>"))
    for step, n, secs in (("zero_sink", 8, 40.0), ("faithfulness", 2, 30.0)):
        cell = ev.Cell("<bos>", "wiki", 0)
        cfg = {**ev.DEFAULTS, "windows": n, "faith_docs": n}
        ev.write_atomic(ev.job_path(tmp_path, "fake", step, cell),
                        {"config": ev.job_config("fake", step, cell, cfg), "seconds": secs})
    plan = es.compute_plan(tmp_path, "fake")
    zs = plan["steps"]["zero_sink"]
    assert zs["cells"] == 2 * 2 * 3 and zs["seconds_per_window"] == 5.0
    assert zs["cpu_minutes_panel"] == pytest.approx(5.0 * 64 * 12 / 60)
    fa = plan["steps"]["faithfulness"]
    assert fa["cells"] == 2 * 3 and fa["cpu_minutes_per_cell"] == pytest.approx(15.0 * 32 / 60)
    assert plan["cpu_minutes_total"] == pytest.approx(zs["cpu_minutes_panel"]
                                                      + fa["cpu_minutes_panel"])
    assert "**all**" in es.plan_markdown([plan])
    with pytest.raises(ValueError, match="same length"):
        es.compute_plan(tmp_path, "fake", {"length": 128})


def test_run_times_measure_the_full_panel_as_it_ran(tmp_path, monkeypatch):
    """The compute plan at full size: jobs run of the panel's cells, the median job, minutes
    so far and left; a step with no job says it is not timed."""
    monkeypatch.setitem(ev.FIRST_TOKENS, "fake", ("none", "<bos>"))
    for d, secs in ((0, 100.0), (1, 300.0), (2, 200.0)):
        cell = ev.Cell("<bos>", "wiki", d)
        ev.write_atomic(ev.job_path(tmp_path, "fake", "zero_sink", cell),
                        {"config": ev.job_config("fake", "zero_sink", cell, ev.DEFAULTS),
                         "seconds": secs, "threads": 1})
    r = es.run_times(tmp_path, "fake")
    zs = r["steps"]["zero_sink"]
    assert (zs["cells"], zs["done"], zs["median_s"], zs["threads"]) == (12, 3, 200.0, [1])
    assert zs["minutes_done"] == pytest.approx(10.0)
    assert zs["minutes_left"] == pytest.approx(200.0 * 9 / 60)
    assert r["steps"]["sinks"]["done"] == 0 and r["steps"]["sinks"]["minutes_left"] is None
    table = es.runs_markdown([r])
    assert "| fake | zero_sink | 3 of 12 | 200 (100–300) | 1 | 10 | 30 |" in table
    assert "| fake | sinks | 0 of 12 | — | — | 0 | not timed at full size |" in table


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert ev.main(["--out", str(tmp_path), "--data-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--data-dir" in err and "\n" not in err
    from tl_spectral.usage import UsageError

    with pytest.raises(UsageError, match="gpt2"):
        ev.main(["--model", "gpt2"])


def test_faithfulness_job_and_hierarchy_cells(tiny, tmp_path, monkeypatch):
    _, model, tok, data = tiny
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    cell = ev.Cell("<pad>", "wiki", 1)
    ev.run("tiny", tmp_path, data, steps=("faithfulness",), cells=[cell],
           cfg={"faith_docs": 3, "faith_length": 12}, loaded=(model, tok), log=lambda s: None)
    job = json.loads(ev.job_path(tmp_path, "tiny", "faithfulness", cell).read_text())
    assert len(job["per_window_nll_sums"]) == 3 and "aliases" in job
    d = torch.tensor(es.faith_differences(job, n_resamples=50)["estimate"])  # [S, M, M, 2]
    assert torch.allclose(d, -d.transpose(1, 2), atol=1e-12)  # antisymmetric, zero diagonal
    hi = es.summarize(tmp_path, "tiny")["claims"]["C.hierarchy"]
    assert len(hi["cells"]) == 2 * len(job["settings"])
    assert all(rules.base(c["label"]) in rules.LABELS for c in hi["cells"])
    # the four (criterion, setting) variants are separate claims: one robustness each
    assert set(hi["sensitivity_by_variant"]) == {c["factors"]["criterion, setting"]
                                                for c in hi["cells"]}
    assert "criterion" not in hi["sensitivity"].split(":")[-1]
    for c in hi["cells"]:  # each step carries its own interval; the cell's MDE is the largest
        assert len(c["steps"]) == 3
        ivs = [st for st in c["steps"] if "low" in st]
        assert all(st["low"] <= st["estimate"] <= st["high"] for st in ivs)
        assert c["mde"] == max(rules.mde(st) for st in ivs)
        assert rules.steps([st["label"] for st in c["steps"]]) == c["label"]
    pv = rules.panel_verdict(hi["cells"], len(hi["cells"]))
    assert pv.mde == max(c["mde"] for c in hi["cells"]) and pv.interval is None


def test_split_sink_and_cone_cells_follow_the_registry_rules():
    """C.split: both factors by the sign rule, then the steps rule; C.sink: a count of the
    selected layers; C.cone.pooled: the pooled cone change kept apart from the registry's."""
    iv = lambda e, lo, hi: {"estimate": e, "low": lo, "high": hi}  # noqa: E731
    job = {"sink_layers": [3, 5], "pooled": {"v0_over_vothers": iv(0.2, 0.19, 0.21),
                                             "cos_minus_others": iv(-0.07, -0.08, -0.06),
                                             "cone_change": iv(-0.05, -0.06, -0.04)}}
    lab, cell = es.split_labels(job)[""]
    assert lab == rules.REPRODUCED and [st["label"] for st in cell["steps"]] == [
        rules.REPRODUCED, rules.REPRODUCED]
    job["pooled"]["cos_minus_others"] = iv(0.2, 0.1, 0.3)  # the direction factor reversed
    assert es.split_labels(job)[""][0] == rules.NOT_REPRODUCED
    job["pooled"]["cos_minus_others"] = iv(0.0, -0.1, 0.1)  # one step holds, one cannot tell
    assert es.split_labels(job)[""][0] == rules.PARTLY
    assert es.sink_labels(job)[""] == (rules.REPRODUCED, {"count": 2})
    assert es.sink_labels({"sink_layers": []})[""][0] == rules.NOT_REPRODUCED
    assert es.split_labels({"sink_layers": []})[""][0] == rules.NOT_TESTED
    cone = {c.id: c for c in es.PANEL_CLAIMS}["C.cone.pooled"]
    assert cone.cells_of(job)[""][0] == rules.NOT_REPRODUCED
    from tl_spectral_studies.claims import catalog

    c = catalog.all_claims()
    assert c["C.cone"].panel_apart == "C.cone.pooled" and c["C.cone"].panel == "C.cone"
    assert c["C.split"].panel == "C.split" and c["C.sink"].panel == "C.sink"


def test_pod_job_and_depth_cells_follow_the_registry_measures(tiny, tmp_path, monkeypatch):
    """The ``pod`` step keeps what the A-claims' measures read; each cell's label is the
    registry's own measure on the job, re-derived here from the stored intervals."""
    from tl_spectral_studies.claims import catalog, seed000

    _, model, tok, data = tiny
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    cells = [ev.Cell("<pad>", "wiki", 0), ev.Cell("none", "wiki", 0)]
    ev.run("tiny", tmp_path, data, steps=("pod",), cells=cells,
           cfg={"pod_docs": 6, "pod_length": 16}, loaded=(model, tok), log=lambda s: None)
    job = json.loads(ev.job_path(tmp_path, "tiny", "pod", cells[0]).read_text())
    assert set(job) >= set(ev.POD_KEEP) and job["n_docs"] == 6 and job["length"] == 16
    assert job["config"]["n"] == 6 and job["config"]["length"] == 16
    s = es.summarize(tmp_path, "tiny")["claims"]
    for cell in s["A.bands"]["cells"]:
        st = cell["steps"]
        by_rule = rules.steps([rules.sign(st[0], 0.0, above=True),
                               rules.sign(st[1], 0.0, above=False)])
        assert [x["label"] for x in st] == [rules.sign(st[0], 0.0, above=True),
                                            rules.sign(st[1], 0.0, above=False)]
        assert cell["label"] == by_rule and cell["n"] == 6
    for cid, m in (("A.hstar", seed000.hstar), ("A.tspec", seed000.tspec)):
        assert [c["label"] for c in s[cid]["cells"]] == [
            m(es._DepthJob(json.loads(ev.job_path(tmp_path, "tiny", "pod", c).read_text())))
            .label for c in cells], cid
    claims = catalog.all_claims()
    assert all(claims[c].panel == c for c in ("A.bands", "A.hstar", "A.tspec"))


def test_sensitivity_compares_descriptive_directions_and_untested_panels():
    f = [{"draw": 0}, {"draw": 1}]
    up, down = f"{rules.DESCRIPTIVE}: rises", f"{rules.DESCRIPTIVE}: falls"
    assert rules.sensitivity([(f[0], up), (f[1], up)]) == rules.ROBUST
    assert rules.sensitivity([(f[0], up), (f[1], down)]) == "depends on draw"
    nt = f"{rules.NOT_TESTED}: H* bounded by N"
    assert rules.sensitivity([(f[0], nt), (f[1], nt)]) == rules.NOT_TESTED
    pv = rules.panel_verdict([{"factors": x, "label": nt, "n": 4} for x in f], 2)
    assert pv.label == nt and pv.sensitivity == rules.NOT_TESTED
    assert rules.sensitivity([(f[0], nt), (f[1], rules.REPRODUCED)]) == "depends on draw"


def test_probe_sinks_job_reads_its_sinks_job_and_labels_by_the_registry(tiny, tmp_path,
                                                                       monkeypatch):
    """The probe_sinks step needs the cell's sinks job (clear error without it), keeps the
    SinkProbe's per-window rows, and its cells carry the registry's labels, re-derived here
    from the stored rows by the rules module."""
    from tl_spectral_studies.claims import catalog
    from tl_spectral_studies.real_decoder import doc_iv

    _, model, tok, data = tiny
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    cell = ev.Cell("<pad>", "wiki", 0)
    cfg = {"windows": 4, "length": 12}
    with pytest.raises(ValueError, match="run --step sinks first"):
        ev.run("tiny", tmp_path, data, steps=("probe_sinks",), cells=[cell], cfg=cfg,
               loaded=(model, tok), log=lambda s: None)
    ev.run("tiny", tmp_path, data, steps=("sinks", "probe_sinks"), cells=[cell], cfg=cfg,
           loaded=(model, tok), log=lambda s: None)
    job = json.loads(ev.job_path(tmp_path, "tiny", "probe_sinks", cell).read_text())
    sinks = json.loads(ev.job_path(tmp_path, "tiny", "sinks", cell).read_text())
    assert job["sink_layers"] == sinks["sink_layers"] and len(job["per_window"]["cos_v0_s"]) == 4
    s = es.summarize(tmp_path, "tiny")["claims"]
    for cid, key, above in (("C.anti", "cos_v0_s", False), ("C.norm", "rel_delta_norm", True),
                            ("C.cone", "delta_cos", True)):
        iv = doc_iv(torch.tensor(job["per_window"][key]), seed=0)
        per = [rules.sign({k: iv[k][i] for k in ("estimate", "low", "high")}, 0.0, above=above)
               for i in range(len(job["layer_ids"]))]
        assert rules.base(s[cid]["cells"][0]["label"]) == rules.over_layers(per), cid
        assert s[cid]["cells"][0]["n"] == 4
    rho = s["C.rho"]["cells"][0]
    if sinks["sink_layers"]:
        from tl_spectral_studies.claims.seed003 import RHO_SHARE

        assert rho["label"] == rules.sign(job["pooled"]["rho_star_in_0_1"], RHO_SHARE,
                                          above=True)
    else:
        assert rho["label"] == rules.NOT_TESTED
    c = catalog.all_claims()
    assert all(c[x].panel == x for x in ("C.anti", "C.rho", "C.cone", "C.norm"))


def test_a_count_over_layers_carries_its_largest_layer_mde():
    """C.anti's cell (a count over layers) has no interval; its MDE is the largest of its
    layers' MDEs, computed here from the stored per-layer intervals."""
    lay = [{"estimate": -0.2, "low": -0.3, "high": -0.1}, {"estimate": 0.1, "low": -0.1,
                                                            "high": 0.3}]
    job = {"layer_ids": [0, 1], "config": {"n": 8}, "selection": {}, "pooled": {},
           "probe": {k: {s: [x[s] for x in lay] for s in ("estimate", "low", "high")}
                     for k in ("cos_v0_s", "rho_star_in_0_1", "rel_delta_norm", "delta_cos")}}
    lab, cell = es.probe_labels("anti")(job)[""]
    assert lab == rules.over_layers([rules.REPRODUCED, rules.NOT_DISTINGUISHABLE])
    assert cell["layer_mde"] == pytest.approx(max(rules.mde(x) for x in lay))
    assert (cell["holds"], cell["reversed"], cell["layers"]) == (1, 0, 2)
    lab, cell = es.probe_labels("norm")(job)[""]  # Δ‖o‖ > 0 claimed: layer 0 reversed
    assert (cell["holds"], cell["reversed"]) == (0, 1) and lab == rules.NOT_REPRODUCED
    assert es.probe_labels("rho", "rho_star_in_0_1")(job)[""] == (rules.NOT_TESTED, None)


def test_interventions_job_reuses_the_clean_nll_and_labels_by_the_registry(tiny, tmp_path,
                                                                          monkeypatch):
    """The interventions step: its clean NLL is the zero_sink job's (checked: a job of other
    windows is refused), the linearization stops at the first collapse or k = 3, every stored
    interval follows from the stored per-window NLL, and the cells carry the registry's
    labels, re-derived here from the stored intervals by the rules module."""
    from transformers import LlamaForCausalLM

    from tl_spectral_studies.claims import catalog
    from tl_spectral_studies.claims.seed002 import CHEAP, PAPER_COLLAPSE_K

    folder, model, tok, data = tiny
    hf = LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    cell = ev.Cell("<pad>", "wiki", 1)
    cfg = {"windows": 4, "length": 12}
    kw = {"cells": [cell], "cfg": cfg, "loaded": (model, tok), "log": lambda s: None, "hf": hf}
    ev.run("tiny", tmp_path, data, steps=("zero_sink", "interventions"), **kw)
    job = json.loads(ev.job_path(tmp_path, "tiny", "interventions", cell).read_text())
    zs = json.loads(ev.job_path(tmp_path, "tiny", "zero_sink", cell).read_text())
    assert job["clean_from"] == "zero_sink" and job["nll_clean"] == zs["nll_clean"]
    lin = job["linearization"]
    assert [r["k"] for r in lin] == list(range(1, len(lin) + 1)) and len(lin) <= 3
    assert all(r["low"] < rules.CATASTROPHIC_REL for r in lin[:-1])  # stopped at the first
    if len(lin) < 3:
        assert lin[-1]["low"] >= rules.CATASTROPHIC_REL
    clean = torch.tensor(job["nll_clean"], dtype=torch.float64)
    n_pred = 4 * 11
    for r in lin:
        assert r["estimate"] == pytest.approx(
            math.exp((sum(r["nll"]) - float(clean.sum())) / n_pred) - 1, rel=1e-9)
    a = job["removal"]["all layers"]
    d = a["log_ppl_routing_removed_minus_filtering_removed"]
    assert d["estimate"] == pytest.approx(
        (sum(a["nll_keep_filtering"]) - sum(a["nll_keep_routing"])) / n_pred, rel=1e-9)
    s = es.summarize(tmp_path, "tiny")["claims"]
    k = rules.first_collapse({r["k"]: r for r in lin})
    want = (rules.REPRODUCED if k == PAPER_COLLAPSE_K else rules.NOT_REPRODUCED)
    assert rules.base(s["B.collapse3"]["cells"][0]["label"]) == want
    if k is None:
        assert s["B.collapse3"]["cells"][0]["label"].endswith(f"no collapse up to k = {len(lin)}")
    st = [rules.sign(d, 0.0, above=False), rules.sign(a["keep_filtering"], CHEAP, above=False)]
    cellrow = s["B.inversion"]["cells"][0]
    assert cellrow["label"] == rules.steps(st) and cellrow["n"] == 4
    assert [x["label"] for x in cellrow["steps"]] == st
    assert cellrow["mde"] == pytest.approx(max(rules.mde(d), rules.mde(a["keep_filtering"])))
    c = catalog.all_claims()
    assert c["B.collapse3"].panel == "B.collapse3" and c["B.inversion"].panel == "B.inversion"
    # a zero_sink job of other windows: refused, one line naming the step to rerun
    other = ev.Cell("<pad>", "wiki", 2)
    ev.run("tiny", tmp_path, data, steps=("zero_sink",), **{**kw, "cells": [other]})
    zp = ev.job_path(tmp_path, "tiny", "zero_sink", other)
    bad = json.loads(zp.read_text())
    bad["nll_clean"] = [x + 1.0 for x in bad["nll_clean"]]
    ev.write_atomic(zp, bad)
    with pytest.raises(ValueError, match="rerun --step zero_sink"):
        ev.run("tiny", tmp_path, data, steps=("interventions",), **{**kw, "cells": [other]})


def test_interventions_linearize_up_to_the_first_collapse(tiny, monkeypatch):
    """With the NLL of k linearized layers doubling the PPL from k = 2 on, the step runs
    k = 1, 2 and stops (k = 3 is never computed); without a collapse it stops at k = 3."""
    from transformers import LlamaForCausalLM

    from tl_spectral_studies import real_decoder_ops

    folder, model, _, _ = tiny
    hf = LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    toks = torch.randint(1, 60, (6, 9))
    for jump, want in ((2, [1, 2]), (None, [1, 2, 3])):
        asked = []

        def fake(hf_, tokens, modes=None, *, batch_size=8, _jump=jump):
            k = sum(1 for m in (modes or {}).values() if m == "linear")
            if k:
                asked.append(k)
            base = torch.arange(1, tokens.shape[0] + 1, dtype=torch.float64) * 10.0
            grow = 8.0 * (tokens.shape[1] - 1) if _jump is not None and k >= _jump else 0.0
            return base + grow + 0.01 * torch.arange(tokens.shape[0]) * k

        monkeypatch.setattr(real_decoder_ops, "window_nll", fake)
        job = ev.step_interventions(None, toks, {}, 0, hf=hf)
        assert [r["k"] for r in job["linearization"]] == want
        # one linearized pass per k (the tiny model has 2 layers: k = 3 linearizes both), none
        # beyond the first collapse
        assert asked == [min(k, 2) for k in want]


def test_inversion_layers_job_shards_resumes_and_counts_by_the_registry(tiny, tmp_path,
                                                                       monkeypatch):
    """The one-layer-at-a-time inversion: two shards share the cell's layers, each finished
    layer is its own file (a rerun redoes nothing), the shard that finds every layer done
    writes the job and removes the layer files; each layer's row is the study's removal row
    of that layer alone (recomputed here), and the cell's counts are the registry's per-layer
    labels re-derived by the rules module."""
    from transformers import LlamaForCausalLM

    from tl_spectral_studies.claims import catalog, seed002
    from tl_spectral_studies.real_decoder import removal_row
    from tl_spectral_studies.real_decoder_ops import window_nll as hf_nll

    folder, model, tok, data = tiny
    hf = LlamaForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    monkeypatch.setitem(ev.FIRST_TOKENS, "tiny", ("none", "<pad>"))
    assert ev.panel("tiny", "inversion_layers") == [ev.Cell("none", "wiki", 0),
                                                    ev.Cell("<pad>", "wiki", 0)]
    cell, off = ev.Cell("<pad>", "wiki", 0), ev.Cell("<pad>", "austen", 0)
    cfg = {"windows": 4, "length": 12}
    kw = {"cfg": cfg, "loaded": (model, tok), "log": lambda s: None, "hf": hf}
    ev.run("tiny", tmp_path, data, steps=("zero_sink",), cells=[cell], **kw)
    path = ev.job_path(tmp_path, "tiny", "inversion_layers", cell)
    rows = ev.run("tiny", tmp_path, data, steps=("inversion_layers",), cells=[cell, off],
                  shard=(1, 2), **kw)
    assert [r["cell"] for r in rows] == [cell.key]  # not a cell of the step's panel
    assert not path.exists()  # layer 0 (shard 0 of 2) still to run
    assert [p.name for p in sorted(ev.layer_dir(path).iterdir())] == ["layer=01.json"]
    rows = ev.run("tiny", tmp_path, data, steps=("inversion_layers",), cells=[cell],
                  shard=(0, 2), **kw)
    assert rows[0]["ran"] and path.exists() and not ev.layer_dir(path).exists()
    rows = ev.run("tiny", tmp_path, data, steps=("inversion_layers",), cells=[cell], **kw)
    assert not rows[0]["ran"]  # done: nothing recomputed
    job = json.loads(path.read_text())
    zs = json.loads(ev.job_path(tmp_path, "tiny", "zero_sink", cell).read_text())
    assert job["clean_from"] == "zero_sink" and job["nll_clean"] == zs["nll_clean"]
    assert sorted(job["removal"]) == ["layer 0", "layer 1"]
    toks = ev.cell_windows(data, tok, cell, 4, 12)
    clean = torch.tensor(job["nll_clean"], dtype=torch.float64)
    for li in (0, 1):
        want = removal_row(hf, toks, clean, [li], hf_nll, 0, per_window=True)
        got = job["removal"][f"layer {li}"]
        for key in ("nll_keep_routing", "nll_keep_filtering"):
            assert got[key] == pytest.approx(want[key], rel=1e-6)
    steps = [seed002.inversion_steps(job["removal"][f"layer {li}"]) for li in (0, 1)]
    row = es.summarize(tmp_path, "tiny")["claims"]["B.inversion.layer"]
    c = row["cells"][0]
    assert not row["complete"] and row["cells_expected"] == 2 and c["n"] == 4
    assert c["holds"] == sum(rules.steps(st) == rules.REPRODUCED for st in steps)
    assert c["reversed"] == sum(st[0] == rules.NOT_REPRODUCED for st in steps)
    assert c["layers"] == 2
    assert c["label"] == rules.count([rules.steps(st) == rules.REPRODUCED for st in steps])
    assert c["mde"] == pytest.approx(max(
        max(rules.mde(job["removal"][f"layer {li}"][k])
            for k in ("log_ppl_routing_removed_minus_filtering_removed", "keep_filtering"))
        for li in (0, 1)))
    assert catalog.all_claims()["B.inversion.layer"].panel == "B.inversion.layer"
    other = ev.Cell("none", "wiki", 0)
    with pytest.raises(ValueError, match="shard"):
        ev.run("tiny", tmp_path, data, steps=("inversion_layers",), cells=[other],
               shard=(2, 2), **kw)
    # a zero_sink job of other windows: refused (every window checked), one line
    ev.run("tiny", tmp_path, data, steps=("zero_sink",), cells=[other], **kw)
    zp = ev.job_path(tmp_path, "tiny", "zero_sink", other)
    bad = json.loads(zp.read_text())
    bad["nll_clean"][-1] += 1.0  # the last window only
    ev.write_atomic(zp, bad)
    with pytest.raises(ValueError, match="rerun --step zero_sink"):
        ev.run("tiny", tmp_path, data, steps=("inversion_layers",), cells=[other], **kw)


def test_cli_bad_shard_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "wiki_excerpt.txt").write_text("x", encoding="utf-8")
    (tmp_path / "austen.txt").write_text("x", encoding="utf-8")
    rc = ev.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--shard", "2/2",
                  "--step", "inversion_layers"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--shard" in err and "I/K" in err


def test_a_panel_claim_takes_labels_or_extract_and_rule():
    with pytest.raises(ValueError, match="give labels, or extract and rule"):
        es.PanelClaim("X", "sinks", "text", "rule")
    with pytest.raises(ValueError, match="not both"):
        es.PanelClaim("X", "sinks", "text", "rule", extract=lambda j: {},
                      rule=lambda iv: rules.NOT_TESTED, labels=lambda j: {})
    c = es.PanelClaim("X", "sinks", "text", "rule", extract=lambda j: {"": {"low": 1}},
                      rule=lambda iv: rules.REPRODUCED)
    assert c.cells_of({}) == {"": (rules.REPRODUCED, {"low": 1})}
