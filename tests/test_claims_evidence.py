"""The evidence of the verdict records (issue 39): the panel rule (a complete panel gives the
record; an incomplete one only its "so far" sensitivity; a claim the panel lacks gets "one
framing"), the framing each results file records, the depth-thirds rules of A.bands and
A.hstar, and the sensitivity shown beside the label in the rendered cells."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tl_spectral_studies.claims import catalog, registry, render, rules

ROOT = Path(__file__).resolve().parents[1]
FACTORS = [{"first token": f, "corpus": c, "draw": d} for f in ("none", "<|im_start|>", "<eot>")
           for c in ("wiki", "austen") for d in (0, 1, 2)]


def cell(factors, label, est=0.4, half=0.01, n=32):
    return {"factors": dict(factors), "label": label, "n": n, "estimate": est,
            "low": est - half, "high": est + half, "mde": rules.mde(
                {"low": est - half, "high": est + half})}


def robust_cells():
    return [cell(f, rules.REPRODUCED, 0.36 + 0.01 * i) for i, f in enumerate(FACTORS)]


def depends_cells():
    """Draw 1 flips the label in every (first token, corpus): the label depends on draw."""
    return [cell(f, rules.NOT_REPRODUCED, 0.613, 0.02) if f["draw"] == 1 else c
            for f, c in zip(FACTORS, robust_cells())]


# ------------------------------------------------------------------ rules.panel_verdict
def test_panel_verdict_of_a_robust_panel_is_its_common_label():
    pv = rules.panel_verdict(robust_cells(), 18)
    assert pv.complete and pv.sensitivity == rules.ROBUST and pv.label == rules.REPRODUCED
    assert pv.cells == 18 and pv.n == pv.n_max == 32
    assert pv.estimates == pytest.approx((0.36, 0.36 + 0.17))
    assert pv.interval == pytest.approx((0.35, 0.36 + 0.17 + 0.01))
    assert pv.mde == pytest.approx(rules.mde({"low": 0.0, "high": 0.02}))
    assert pv.counts == ((rules.REPRODUCED, 18),)


def test_panel_verdict_of_a_split_panel_is_its_sensitivity_with_the_counts():
    pv = rules.panel_verdict(depends_cells(), 18)
    assert pv.sensitivity == "depends on draw"
    assert pv.label == ("depends on draw (reproduced in 12 of 18 cells, not reproduced in 6)")
    assert rules.base(pv.label) == rules.DEPENDS
    assert pv.interval[1] == pytest.approx(0.633)  # the highest high, a flipped cell's
    assert pv.mde == pytest.approx(rules.mde({"low": 0.0, "high": 0.04}))  # the widest cell


def test_panel_verdict_of_an_incomplete_panel_says_so_far():
    pv = rules.panel_verdict(robust_cells()[:12], 36)
    assert not pv.complete and pv.sensitivity == "robust so far (12 of 36 cells)"
    assert not rules.panel_verdict(robust_cells(), 18, complete=False).complete
    with pytest.raises(ValueError, match="at least one cell"):
        rules.panel_verdict([], 18)
    assert rules.one_framing("") == "not tested: one framing (not recorded)"


# ------------------------------------------------------------------ registry records
def _model(**kw):
    return registry.Model("fake", "Fake", registry.STANDARD, "real_decoder", "res", "cmd",
                          "a fake column", evidence="ev/summary.json", **kw)


def _study(res):
    res.json("sinks")
    return registry.Measurement("0.48 [0.45, 0.51]", rules.NOT_DISTINGUISHABLE, 0.48,
                                (0.45, 0.51), 8)


def _write(tmp_path, claims, sinks=True):
    (tmp_path / "res").mkdir(exist_ok=True)
    if sinks:
        (tmp_path / "res" / "sinks.json").write_text(json.dumps({"seed": 0, "settings": {
            "wiki_start": {"first_tokens": ["<|im_start|>"] * 8}}}))
    (tmp_path / "ev").mkdir(exist_ok=True)
    (tmp_path / "ev" / "summary.json").write_text(json.dumps({"model": "fake",
                                                              "claims": claims}))


def _entry(cells, expected, complete=True):
    return {"text": "a panel claim", "cells": cells, "cells_expected": expected,
            "complete": complete, "sensitivity": rules.sensitivity(
                [(c["factors"], c["label"]) for c in cells])}


def _evaluate(tmp_path, claim, **kw):
    return registry.evaluate(claim, registry.Results(tmp_path, _model(**kw)))


def test_a_complete_panel_gives_the_record(tmp_path):
    _write(tmp_path, {"X.1": _entry(depends_cells(), 18)})
    c = registry.Claim("X.1", "p", "C.0", "words", "rule", _study, panel="X.1")
    r = _evaluate(tmp_path, c)
    assert r.label.startswith("depends on draw (reproduced in 12 of 18 cells")
    assert r.sensitivity == "depends on draw" and r.cells == 18 and r.n == 32
    assert "cell estimates 0.36 to 0.613" in r.number and "18 cells" in r.number
    assert r.interval == pytest.approx((0.35, 0.633)) and r.mde == pytest.approx(
        rules.mde({"low": 0.0, "high": 0.04}))
    assert r.provenance["results"] == "ev/summary.json" and "evidence" in r.provenance["command"]
    assert "envelope" in r.note and r.to_json()["cells"] == 18


def test_an_incomplete_panel_keeps_the_study_record(tmp_path):
    _write(tmp_path, {"X.1": _entry(robust_cells()[:12], 36, complete=False)})
    c = registry.Claim("X.1", "p", "C.0", "words", "rule", _study, panel="X.1")
    r = _evaluate(tmp_path, c)
    assert r.label == rules.NOT_DISTINGUISHABLE and r.n == 8 and r.cells is None
    assert r.sensitivity == "robust so far (12 of 36 cells)"


def test_a_claim_the_panel_lacks_has_one_framing(tmp_path):
    _write(tmp_path, {"X.1": _entry(robust_cells(), 18)})
    for c in (registry.Claim("X.2", "p", "C.0", "words", "rule", _study, panel="X.2"),
              registry.Claim("X.1", "p", "C.0", "words", "rule", _study)):  # not mapped
        r = _evaluate(tmp_path, c)
        assert r.label == rules.NOT_DISTINGUISHABLE and r.cells is None
        assert r.sensitivity == ("not tested: one framing (sinks.json setting wiki_start: "
                                 "first token <|im_start|>, window seed 0)")
    # no summary file at all (a model whose panel has not run): the same
    (tmp_path / "ev" / "summary.json").unlink()
    r = _evaluate(tmp_path, registry.Claim("X.1", "p", "C.0", "w", "r", _study, panel="X.1"))
    assert r.sensitivity.startswith("not tested: one framing")


def test_a_panel_of_layer_counts_names_its_counts_and_largest_layer_mde(tmp_path):
    cells = [{"factors": {"draw": d}, "label": rules.MIXED, "n": 64, "mde": m, "holds": h,
              "reversed": r, "layers": 30} for d, m, h, r in ((0, 0.05, 11, 17), (1, 0.09, 15,
                                                                                   15))]
    _write(tmp_path, {"X.1": _entry(cells, 2)})
    r = _evaluate(tmp_path, registry.Claim("X.1", "p", "C.0", "w", "r", _study, panel="X.1"))
    assert "holds in 11 to 15 of 30 layers and is reversed in 15 to 17" in r.number
    assert r.mde == pytest.approx(0.09) and r.interval is None and "no interval" in r.note
    assert r.label == rules.MIXED and r.sensitivity == rules.ROBUST


def test_a_panel_names_only_the_factors_its_cells_cross(tmp_path):
    """A step run on one corpus and draw (the one-layer inversion) crosses the first token
    alone: its record says "3 cells (first token)", not the full panel's three factors."""
    cells = [{"factors": {"first token": f, "corpus": "wiki", "draw": 0}, "label": rules.PARTLY,
              "n": 64, "mde": 0.04, "holds": 19, "reversed": 6, "layers": 30}
             for f in ("none", "<a>", "<b>")]
    _write(tmp_path, {"X.1": _entry(cells, 3)})
    r = _evaluate(tmp_path, registry.Claim("X.1", "p", "C.0", "w", "r", _study, panel="X.1"))
    assert "evidence panel, 3 cells (first token), n = 64 per cell" in r.number
    full = [dict(c, factors={"first token": c["factors"]["first token"], "corpus": k,
                             "draw": d}) for c in cells for k in ("wiki", "austen")
            for d in (0, 1)]
    _write(tmp_path, {"X.1": _entry(full, 12)})
    r = _evaluate(tmp_path, registry.Claim("X.1", "p", "C.0", "w", "r", _study, panel="X.1"))
    assert "12 cells (first token × corpus × draw)" in r.number


def test_a_record_of_the_weights_alone_has_no_framing(tmp_path):
    """A measure that reads routing.json only (the weights) is neither robust nor one
    framing; one that also reads a data file is one framing."""
    _write(tmp_path, {})
    (tmp_path / "res" / "routing.json").write_text(json.dumps({"n_ctx": 128}))

    def weights(res):
        res.json("routing")
        return registry.Measurement("0.47 [0.46, 0.47]", rules.REPRODUCED, 0.47, (0.46, 0.47),
                                    270)

    def both(res):
        res.json("sinks")
        return weights(res)

    r = _evaluate(tmp_path, registry.Claim("X.w", "p", "B.1", "w", "r", weights))
    assert r.sensitivity == "no framing: weights only (routing.json, n_ctx 128)"
    assert render.sensitivity_short(r.label, r.sensitivity) == "reproduced · weights only"
    r = _evaluate(tmp_path, registry.Claim("X.b", "p", "B.1", "w", "r", both))
    assert r.sensitivity.startswith("not tested: one framing (sinks.json")
    smol = {x.claim: x for x in catalog.records(ROOT) if x.model == "smollm2-135m"}
    assert smol["B.rank"].sensitivity.startswith(rules.WEIGHTS_ONLY)
    # the numerical check of issue 26's puzzle is on no panel (the one-layer inversion is,
    # since the inversion_layers step: "… so far (k of 3 cells)" until its cells have run)
    assert smol["C.puzzle"].sensitivity.startswith("not tested: one framing")
    assert not smol["B.inversion.layer"].sensitivity.startswith("not tested")


def test_a_results_file_that_records_its_framing_is_named_by_it(tmp_path):
    """The study's faithfulness and intervention steps record first token, corpus and window
    draw (``real_decoder.framing_record``); a file that does not says "not recorded"."""
    from tl_spectral_studies import real_decoder

    (tmp_path / "res").mkdir()
    rec = real_decoder.framing_record({"model": "smollm2-135m"}, 3)
    assert rec == {"first_token": "<|im_start|>", "corpus": "wiki_excerpt.txt (validation "
                   "split)", "window_seed": 3}
    (tmp_path / "res" / "interventions.json").write_text(json.dumps({"seed": 0, **rec}))
    (tmp_path / "res" / "faithfulness.json").write_text(json.dumps({"seed": 0}))
    res = registry.Results(tmp_path, _model())
    assert registry.framing(res, "interventions") == (
        "interventions.json: first token <|im_start|>, corpus wiki_excerpt.txt (validation "
        "split), window seed 3")
    assert registry.framing(res, "faithfulness") == (
        "faithfulness.json: first token and corpus not recorded, seed 0")


def test_a_panel_fills_a_claim_the_study_did_not_measure(tmp_path):
    """Gemma-3: no sinks step in the study, but a complete panel → the panel's record."""
    _write(tmp_path, {"X.1": _entry(robust_cells(), 18)}, sinks=False)
    c = registry.Claim("X.1", "p", "C.0", "w", "r", lambda res: None, panel="X.1")
    assert _evaluate(tmp_path, c).label == rules.REPRODUCED
    _write(tmp_path, {"X.1": _entry(robust_cells()[:6], 18, complete=False)}, sinks=False)
    r = _evaluate(tmp_path, c)
    assert r.label == rules.NOT_MEASURED and r.sensitivity == "robust so far (6 of 18 cells)"


def test_panel_cells_select_one_variant_and_panel_apart_is_only_a_note(tmp_path):
    cells = [dict(c, factors={**c["factors"], "criterion, setting": v},
                  label=rules.PARTLY if v == "a" else rules.NOT_REPRODUCED)
             for c in robust_cells() for v in ("a", "b")]
    _write(tmp_path, {"H": _entry(cells, 36), "X.p": _entry(robust_cells(), 18)})
    c = registry.Claim("H.a", "p", "C.0", "w", "r", _study, panel="H",
                       panel_cells=(("criterion, setting", "a"),))
    r = _evaluate(tmp_path, c)
    assert r.label == rules.PARTLY and r.cells == 18 and "criterion" not in r.number
    c = registry.Claim("N", "p", "C.0", "w", "r", _study, panel_apart="X.p")
    r = _evaluate(tmp_path, c)
    assert r.label == rules.NOT_DISTINGUISHABLE and r.cells is None
    assert "X.p is another measure" in r.note and "reproduced · robust" in r.note


# ------------------------------------------------------------------ committed records
def test_every_real_decoder_record_has_its_evidence():
    """n, interval and MDE, or a note saying why there is no interval; and a sensitivity."""
    for r in catalog.records(ROOT):
        m = catalog.MODELS[r.model]
        if m.layout != "real_decoder" or r.number == "—":
            continue
        assert r.sensitivity, (r.claim, r.model)
        assert r.n is not None, (r.claim, r.model)
        if r.interval is not None:
            assert r.mde is not None and r.mde > 0, (r.claim, r.model)
        elif rules.base(r.label) != rules.NOT_COMPARABLE:
            assert "no interval" in r.note, (r.claim, r.model)


def test_norm_is_kept_apart_from_the_pooled_panel_claim():
    """C.norm (per layer, the library probe) and the panel's C.norm.pooled (pooled over the
    sink layers, brute force) are different measures: C.norm.pooled never labels C.norm; the
    panel's own C.norm (the probe per window, probe_sinks) does."""
    m = catalog.MODELS["smollm2-135m"]
    summary = json.loads((ROOT / m.evidence).read_text())["claims"]
    r = {x.claim: x for x in catalog.records(ROOT) if x.model == m.key}["C.norm"]
    assert r.cells == len(summary["C.norm"]["cells"])  # the probe panel's, not the pooled
    assert "holds in" in r.number and "cell estimates" not in r.number
    one = dataclasses.replace(m, evidence=None)  # without a panel: one framing
    r = {x.claim: x for x in catalog.records(ROOT, {one.key: one})}["C.norm"]
    assert r.cells is None and r.sensitivity.startswith("not tested: one framing")
    assert catalog.all_claims()["C.norm"].panel_apart == "C.norm.pooled"


# ------------------------------------------------------------------ depth thirds
def _depth(early, late, h_early=(40.0, 41.0), h_late=(30.0, 31.0), n_docs=150):
    th = {"early": [0, 1], "middle": [2, 3], "late": [4, 5]}
    lay = [{"estimate": h} for h in (*h_early, 50.0, 50.0, *h_late)]
    d_iv = {"estimate": -10.0, "low": -12.0, "high": -8.0}
    t_iv = {"estimate": 0.4, "low": 0.3, "high": 0.5}  # T_spec: late − early third
    v = ["with", "zeroed", "renormalized"]
    return {"n_docs": n_docs, "variants": v, "thirds": th,
            "claims": [{"id": "bands.paper", "intervals": {x: {"early": early, "late": late}
                                                           for x in v}},
                       {"id": "tspec", "labels": {"with": "descriptive: rises",
                                                  "zeroed": "descriptive: rises",
                                                  "renormalized": "descriptive: no change "
                                                                  "distinguishable"}}],
            "spectrum": {"layers": [[[h] for h in lay]] * 3,
                         "early": [[{"estimate": 40.5}, {"estimate": 0.8}]] * 3,
                         "late": [[{"estimate": 30.5}, {"estimate": 1.2}]] * 3,
                         "late_minus_early": [[d_iv, t_iv]] * 3},
            "config": {"start": "<bos>", "corpus": "wiki_excerpt.txt", "window_seed": 2},
            "provenance": {"command": "tl-spectral study pod-depth", "commit": "abc",
                           "seed": 0}}


def _depth_records(tmp_path, d):
    (tmp_path / "res").mkdir(exist_ok=True)
    (tmp_path / "depth.json").write_text(json.dumps(d))
    m = dataclasses.replace(_model(), depth="depth.json", evidence=None)
    return {r.claim: r for r in catalog.records(tmp_path, {m.key: m})}


def test_bands_and_hstar_read_the_depth_thirds(tmp_path):
    up, down = {"estimate": 0.08, "low": 0.07, "high": 0.09}, \
        {"estimate": -0.04, "low": -0.06, "high": -0.01}
    recs = _depth_records(tmp_path, _depth(up, down))
    b, h = recs["A.bands"], recs["A.hstar"]
    assert b.label == rules.REPRODUCED and b.n == 150 and "first third (layers 0–1)" in b.number
    assert b.mde == pytest.approx(max(rules.mde(up), rules.mde(down)))
    assert h.label == rules.REPRODUCED and "last − first third -10.00" in h.number
    assert b.provenance["results"] == "depth.json" and b.provenance["commit"] == "abc"
    assert b.sensitivity == ("not tested: one framing (pod_depth: first token <bos>, corpus "
                             "wiki_excerpt.txt, window seed 2)")
    # the first third not fine: a step reversed; H* of a layer at the library's bound (86 at
    # N = 150): not tested, whatever the interval says
    recs = _depth_records(tmp_path, _depth(down, down, h_early=(90.0, 41.0)))
    assert recs["A.bands"].label == rules.NOT_REPRODUCED
    assert recs["A.hstar"].label == "not tested: H* bounded by N"
    assert "1 of these 4 layers bounded by N (H* ≥ 86" in recs["A.hstar"].number
    assert "older bound N − 1" in recs["A.hstar"].note


def test_tspec_reads_the_depth_thirds(tmp_path):
    """Issue 39 item 4: T_spec is compared across thirds of the stack where the model has the
    pod-depth study, with the sink-column variants beside it, not first against last layer."""
    up, down = {"estimate": 0.08, "low": 0.07, "high": 0.09}, \
        {"estimate": -0.04, "low": -0.06, "high": -0.01}
    t = _depth_records(tmp_path, _depth(up, down))["A.tspec"]
    assert t.label == "descriptive: rises" and t.n == 150
    assert t.estimate == pytest.approx(0.4) and t.interval == pytest.approx((0.3, 0.5))
    assert "first third (layers 0–1) 0.8" in t.number and "last third (layers 4–5) 1.2" in t.number
    assert "rows renormalized without it: descriptive: no change distinguishable" in t.number
    assert t.provenance["results"] == "depth.json"


def test_bands_rule_is_the_thirds_rule():
    c = catalog.all_claims()
    for cid in ("A.bands", "A.hstar", "A.tspec"):
        assert "third" in c[cid].rule and "l/(L − 1)" in c[cid].rule
        assert "first layer" not in c[cid].rule


# ------------------------------------------------------------------ rendering
def test_sensitivity_in_short_beside_the_label():
    s = render.sensitivity_short
    assert s("reproduced", "robust", 18) == "reproduced · robust (18 cells)"
    assert s("not distinguishable", rules.one_framing("x")) == "not distinguishable · one framing"
    assert s("reproduced", "robust so far (12 of 36 cells)") == \
        "reproduced · robust so far (12 of 36 cells)"
    lab = "depends on draw (reproduced in 17 of 18 cells, not reproduced in 1)"
    assert s(lab, "depends on draw", 18) == lab
    assert s("not comparable: x", rules.one_framing("x")) == "not comparable: x"
    assert s("reproduced", "") == "reproduced"


def test_matrix_shows_sensitivity_for_real_decoders_only():
    md = render.matrix_markdown(catalog.records(ROOT))
    rows = [ln for ln in md.splitlines() if ln.startswith("| `")]
    head = md.splitlines()[0].split(" | ")
    smol, char = head.index("SmolLM2-135M"), head.index("char-shakespeare")
    assert all("·" not in ln.split(" | ")[char] for ln in rows)
    assert any("· one framing" in ln.split(" | ")[smol] for ln in rows)
    assert "- panel: " in md and "- one framing: " in md
