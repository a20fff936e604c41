"""The studies' evidence machinery: per-document faithfulness terms pool to the batched
run exactly; bootstrap intervals of weighted row means; generated doc blocks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral_studies._common import fill_generated, fmt_interval, generated_blocks

MEASURES = ("attention", "value_weighted", "contribution", "abs_contribution")


@pytest.fixture(scope="module")
def tiny():
    from tests.conftest import make_native

    return make_native(n_layers=2, n_heads=2, d_model=32, d_head=16, n_ctx=32, seed=3)


def test_per_document_terms_pool_to_the_batched_run(tiny):
    """ΔPPL curves pooled from per-document NLL sums equal one batched faithfulness run."""
    from tl_spectral.probes.faithfulness import faithfulness
    from tl_spectral_studies.contributions import (
        faithfulness_per_document,
        pooled_areas,
        pooled_curves,
    )

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (3, 12), generator=g)
    am = torch.ones_like(tokens)
    ref = faithfulness(tiny, tokens, attention_mask=am, layer=1, measures=MEASURES, batch_size=3)
    per = faithfulness_per_document(tiny, tokens, am, layer=1, measures=MEASURES)
    curves, clean = pooled_curves(per)
    assert clean == pytest.approx(ref.clean, rel=1e-9)
    torch.testing.assert_close(curves[:, :, 0].float(), ref.comprehensiveness, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(curves[:, :, 1].float(), ref.sufficiency, atol=2e-5, rtol=1e-4)
    areas = pooled_areas(per)
    torch.testing.assert_close(areas[..., 0].float(), ref.comprehensiveness_area,
                               atol=2e-5, rtol=1e-4)
    # a resample with a repeated document is the batched run on the repeated documents
    idx = torch.tensor([0, 0, 2])
    ref2 = faithfulness(tiny, tokens[idx], attention_mask=am[idx], layer=1, measures=MEASURES,
                        batch_size=3)
    torch.testing.assert_close(pooled_areas(per, idx)[..., 1].float(), ref2.sufficiency_area,
                               atol=2e-5, rtol=1e-4)


def test_row_intervals_weighted_mean_and_nan():
    """Estimate = token-weighted mean of per-document values; NaN documents carry no weight."""
    from tl_spectral_studies.contributions import row_intervals

    rows = [[{"layer": 0, "a": 1.0, "b": 0.5}], [{"layer": 0, "a": 3.0, "b": float("nan")}],
            [{"layer": 0, "a": 2.0, "b": 1.5}]]
    out = row_intervals(rows, [10, 30, 20], {"a": "tokens", "b": "docs"}, n_resamples=50)
    assert out[0]["a"]["estimate"] == pytest.approx((10 + 90 + 40) / 60)
    assert out[0]["b"]["estimate"] == pytest.approx(1.0)
    assert out[0]["a"]["low"] >= 1.0 and out[0]["a"]["high"] <= 3.0


def test_generated_blocks_round_trip_and_refuse_stale_keys():
    doc = ("intro\n<!-- generated: x/a -->\nold\n<!-- /generated -->\nmid\n"
           "<!-- generated: y/b -->\nkeep\n<!-- /generated -->\n")
    assert generated_blocks(doc) == {"x/a": "old", "y/b": "keep"}
    new = fill_generated(doc, {"x/a": "| new |"}, prefix="x/")
    assert generated_blocks(new) == {"x/a": "| new |", "y/b": "keep"}
    assert new.startswith("intro\n") and "mid\n" in new
    with pytest.raises(ValueError, match="x/a"):
        fill_generated(doc, {}, prefix="x/")
    with pytest.raises(ValueError, match="twice"):
        generated_blocks(doc + "<!-- generated: x/a -->\n1\n<!-- /generated -->")


def test_fmt_interval():
    assert fmt_interval({"estimate": 0.631, "low": 0.6, "high": 0.655}) == "0.631 [0.6, 0.655]"
    assert fmt_interval(None) == "—"


def test_verdicts_follow_the_interval():
    """'reproduced' only when the interval excludes the opposite of the claim."""
    from tl_spectral_studies.contributions import _verdict
    from tl_spectral_studies.scale_pod import _sign_verdict

    for f in (_verdict, _sign_verdict):
        assert f({"estimate": 1.0, "low": 0.1, "high": 2.0}) == "reproduced"
        assert f({"estimate": 1.0, "low": -0.1, "high": 2.0}) == "not distinguishable at this size"
        assert f({"estimate": -1.0, "low": -2.0, "high": -0.1}).startswith("**not reproduced**")
        assert f({"estimate": -1.0, "low": -2.0, "high": -0.1}, False) == "reproduced"


def _study(tmp_path, ppl):
    from tl_spectral.interventions.surgery import AllocationStudy

    rows = []
    for (name, seed), p in ppl.items():
        rows.append({"name": name + (f" (seed {seed})" if seed else ""), "d_head": [16],
                     "attention_params": 100 if name == "uniform" else 50,
                     "total_params": 1, "ppl": p, "loss": 0.0, "steps": 1})
    AllocationStudy(rows=rows, recipe={"steps": 1}, n_windows=1, seq_len=1,
                    note="test").save(tmp_path / "allocation_study_long.safetensors",
                                      overwrite=True)


def test_allocation_deltas_are_against_the_same_seed(tmp_path):
    from tl_spectral_studies.surgery import _alloc_verdict, _study_rows

    _study(tmp_path, {("uniform", 0): 4.0, ("uniform", 1): 5.0, ("cascade", 0): 4.4,
                      ("cascade", 1): 5.5, ("uniform-8", 0): 4.2, ("uniform-8", 1): 5.1})
    rows = {r["name"]: r for r in _study_rows(tmp_path, "_long")}
    assert rows["cascade (seed 1)"]["delta_same_seed_%"] == pytest.approx(10.0)
    assert rows["cascade"]["delta_same_seed_%"] == pytest.approx(10.0)
    # cascade / uniform-8 of the same seed: 4.4 / 4.2 and 5.5 / 5.1, seed range 25% -> unresolved
    nums, v = _alloc_verdict(tmp_path, "_long", "cascade", "uniform-8")
    assert v.startswith("not distinguishable") and "+4.76%, +7.84%" in nums, nums


def test_allocation_difference_beyond_the_seed_spread_is_resolved(tmp_path):
    from tl_spectral_studies.surgery import _alloc_verdict

    _study(tmp_path, {("uniform", 0): 4.0, ("uniform", 1): 4.04, ("cascade", 0): 4.4,
                      ("cascade", 1): 4.444, ("uniform-8", 0): 4.0, ("uniform-8", 1): 4.04})
    nums, v = _alloc_verdict(tmp_path, "_long", "cascade", "uniform-8")
    assert v == "resolved (worse)", (nums, v)


def test_three_seeds_use_the_t_interval_and_need_no_uniform_run(tmp_path):
    """Seed 2 has only the cascade and the equal-budget model: the comparison is per seed, so
    it counts; with three seeds the verdict is the 95% t-interval of the mean difference."""
    import statistics

    from tl_spectral_studies.surgery import _alloc_verdict, seed_difference, seed_markdown

    base = {("uniform", 0): 4.0, ("uniform", 1): 4.2}
    _study(tmp_path, {**base, ("cascade", 0): 4.4, ("uniform-8", 0): 4.0,
                      ("cascade", 1): 4.62, ("uniform-8", 1): 4.2,
                      ("cascade", 2): 4.59, ("uniform-8", 2): 4.1})
    nums, v = _alloc_verdict(tmp_path, "_long", "cascade", "uniform-8")
    assert "seeds 0 / 1 / 2" in nums and v == "resolved (worse)", (nums, v)
    assert "no uniform run" in seed_markdown(tmp_path, "_long")
    _study(tmp_path, {**base, ("cascade", 0): 4.4, ("uniform-8", 0): 4.0,
                      ("cascade", 1): 4.0, ("uniform-8", 1): 4.2,
                      ("cascade", 2): 4.2, ("uniform-8", 2): 4.1})
    nums, v = _alloc_verdict(tmp_path, "_long", "cascade", "uniform-8")
    assert v.startswith("not distinguishable") and "t-interval" in v, (nums, v)
    d = [10.0, 10.0, 12.0]
    iv = seed_difference(d)
    half = 4.302653 * statistics.stdev(d) / 3 ** 0.5  # t(0.975, 2), tabulated
    assert iv["estimate"] == pytest.approx(statistics.mean(d))
    assert (iv["low"], iv["high"]) == pytest.approx((statistics.mean(d) - half,
                                                     statistics.mean(d) + half))


def test_evaluate_keeps_committed_rows_and_refuses_another_recipe():
    import torch

    from tl_spectral.interventions.surgery import AllocationStudy
    from tl_spectral_studies.surgery import _merge_rows

    row = {"d_head": [16], "attention_params": 1, "total_params": 1, "loss": 0.0, "steps": 1}
    kept = AllocationStudy(rows=[{**row, "name": "cascade", "ppl": 5.0}],
                           recipe={"steps": 10, "seed": 0}, n_windows=2, seq_len=3)
    W = torch.zeros(2, 4, dtype=torch.long)
    new = [{**row, "name": "cascade", "ppl": 9.0}, {**row, "name": "cascade (seed 2)", "ppl": 6.0}]
    rows, recipe = _merge_rows(kept, new, [{"steps": 10, "seed": 2}], W)
    assert [(r["name"], r["ppl"]) for r in rows] == [("cascade", 5.0), ("cascade (seed 2)", 6.0)]
    with pytest.raises(SystemExit, match="steps"):
        _merge_rows(kept, new, [{"steps": 20, "seed": 2}], W)
    with pytest.raises(SystemExit, match="windows"):
        _merge_rows(kept, new, [], torch.zeros(3, 4, dtype=torch.long))


def test_validation_windows_frame_bos_in_both_branches():
    """Study windows come from the validation split, or the whole text when it is too short;
    a start-token model gets its BOS in front of every window either way."""
    from tl_spectral.data import CharTokenizer
    from tl_spectral_studies._common import validation_windows

    text = "abcdefgh " * 60
    tok = CharTokenizer.from_text(text, bos=True)
    w, src = validation_windows(text, tok, 2, 8, seed=0)
    assert src == "validation split" and (w.tokens[:, 0] == tok.bos_id).all()
    w, src = validation_windows(text, tok, 5, 64, seed=0)  # the split is too short
    assert src == "whole corpus" and (w.tokens[:, 0] == tok.bos_id).all()
    plain = CharTokenizer.from_text(text)
    w, _ = validation_windows(text, plain, 2, 8, seed=0)
    assert w.bos_id is None


@given(n_tok=st.integers(20, 200), length=st.integers(2, 16), data=st.data())
@settings(max_examples=40, deadline=None)
def test_strided_windows_are_distinct_slices_at_multiples_of_the_stride(n_tok, length, data):
    """``document_windows(stride=s)``: every window is the stream slice starting at a multiple
    of s, no window twice, all candidates reachable; stride = length is the disjoint cut."""
    from tl_spectral.data import CharTokenizer, document_windows

    alphabet = "abcdefghij"
    text = "".join(alphabet[(i * 7 + i // 3) % 10] for i in range(n_tok))
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text))
    stride = data.draw(st.integers(1, length))
    n_cand = (n_tok - length) // stride + 1 if n_tok >= length else 0
    if n_cand < 1:
        return
    n = data.draw(st.integers(1, n_cand))
    w = document_windows(text, tok, n, length, seed=data.draw(st.integers(0, 5)),
                         stride=stride)
    starts = w.starts.tolist()
    assert len(set(starts)) == n and all(s % stride == 0 and s + length <= n_tok for s in starts)
    for row, s in zip(w.tokens, starts):
        assert torch.equal(row, ids[s:s + length])
    full = document_windows(text, tok, n_cand, length, stride=stride)
    assert full.starts.tolist() == [k * stride for k in range(n_cand)]
    if n_tok // length >= 1:
        a = document_windows(text, tok, 1, length, seed=3, stride=length)
        b = document_windows(text, tok, 1, length, seed=3)
        assert torch.equal(a.tokens, b.tokens)
    with pytest.raises(ValueError, match="smaller stride"):
        document_windows(text, tok, n_cand + 1, length, stride=stride)


def test_validation_only_windows_refuse_the_whole_text_and_name_the_stride():
    from tl_spectral.data import CharTokenizer, document_windows
    from tl_spectral_studies._common import validation_windows

    text = "abcdefgh " * 60  # validation split: 54 characters
    tok = CharTokenizer.from_text(text, bos=True)
    with pytest.raises(ValueError, match="pass a stride below the window length"):
        validation_windows(text, tok, 5, 16, seed=0, validation_only=True)
    w, src = validation_windows(text, tok, 5, 16, seed=0, stride=4, validation_only=True)
    assert src == "validation split, stride 4" and (w.tokens[:, 0] == tok.bos_id).all()
    # with a start token the stride applies to the stream pieces of length - 1
    assert all(s % 4 == 0 for s in w.starts.tolist())
    with pytest.raises(ValueError, match="not both"):
        document_windows(text, tok, 2, 8, overlap=True, stride=2)
    with pytest.raises(ValueError, match="stride must be an int"):
        document_windows(text, tok, 2, 8, stride=9)


def test_contribution_verdict_rules_follow_the_numbers():
    """The four-measure order with a tie by construction is at most partly reproduced; ρ* < 1
    is the share of queries with 0 < ρ* < 1 against 50%, so a changed share changes it."""
    from tl_spectral_studies.contributions import order_label, rho_star_label

    assert order_label(["reproduced", "reproduced"], 1).startswith("partly")
    assert order_label(["reproduced", "reproduced"], 0) == "reproduced"
    assert order_label(["reproduced", "**not reproduced**: x"], 1).startswith("**not")
    # issue 38: one step holds and none is reversed → partly (the rules module's steps rule)
    assert order_label(["reproduced", "not distinguishable at this size"], 1).startswith(
        "partly: 1 of the 2")
    assert order_label(["not distinguishable at this size"] * 2, 1) == (
        "not distinguishable at this size")
    assert rho_star_label([0.9, 0.6]).endswith("in 2 of 2 layers — reproduced by that rule")
    assert rho_star_label([0.9, 0.4]).endswith("in 1 of 2 layers")


@pytest.mark.parametrize("name", ["rank_truncation", "sink_bos", "faithfulness_scope"])
def test_moved_measurements_run_as_modules(name):
    """The former scripts live in tl_spectral_studies and answer `python -m ...`."""
    import importlib

    from tl_spectral_studies import MEASUREMENTS

    assert name in MEASUREMENTS
    mod = importlib.import_module(f"tl_spectral_studies.{name}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0


def test_global_ranking_order_rows_follow_the_numbers():
    """The global-ranking rows of the contributions claim table: a step whose interval flips
    sign changes the order's verdict."""
    from tl_spectral_studies.contributions import global_order_rows

    def iv(e, lo, hi):
        return {"estimate": e, "low": lo, "high": hi}

    steps = [("attention", "value_weighted"), ("value_weighted", "output_normalized"),
             ("output_normalized", "contribution")]
    r = {"model": "m", "scope": "layer", "level": "token", "n_docs": 8,
         "paired": [{"setting": "all layers", "a": a, "b": b,
                     "comprehensiveness_a_minus_b": iv(-1, -2, -0.5),
                     "sufficiency_a_minus_b": iv(1, 0.5, 2)} for a, b in steps]}
    comp, suff = global_order_rows(r)
    assert comp.endswith("| reproduced |") and suff.endswith("| reproduced |")
    r["paired"][1]["sufficiency_a_minus_b"] = iv(-1, -2, -0.5)  # the step reverses
    assert "**not reproduced**" in global_order_rows(r)[1]
    r["paired"][0]["comprehensiveness_a_minus_b"] = iv(0, -1, 1)  # an unresolved step
    # issue 38: two steps hold, none reversed → partly (not "not distinguishable")
    assert global_order_rows(r)[0].endswith("| partly: 2 of the 3 testable steps reproduced |")


def test_sink_rows_do_not_apply_without_a_sink():
    """char-shakespeare has no sink: its anti-alignment and cone rows say "does not apply";
    give it a sink head (a changed number) and the same rows get a sign verdict."""
    import copy
    import json
    from pathlib import Path

    from tl_spectral_studies.contributions import _verdict_rows

    root = Path(__file__).resolve().parents[1] / "docs" / "results" / "contributions"
    s = json.loads((root / "char_shakespeare_summary.json").read_text())
    rows = _verdict_rows("char_shakespeare", s)
    anti = next(r for r in rows if "anti-aligned" in r)
    assert "| does not apply: this model has no sink" in anti
    s2 = copy.deepcopy(s)
    for r in s2["sink_intervals"]:
        r["sink_head_share"] = {"estimate": 0.5, "low": 0.4, "high": 0.6}
    anti2 = next(r for r in _verdict_rows("char_shakespeare", s2) if "anti-aligned" in r)
    # one rule for C.anti in every doc (issue 38): holds in layer 0, reversed in 2–5 → mixed
    assert "| mixed (C.anti: cos(ṽ_0, s) < 0: holds in 1 of 6 layers (0), reversed in 4 (2–5))" \
        in anti2
