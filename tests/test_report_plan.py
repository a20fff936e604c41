"""The report's plan (issue 41 item 1): every computation on the model is declared by a
section (its probes, or a ``ModelPass``), the plan runs them in one place with a stage-table
row each, and the sections then render from the results alone."""

from __future__ import annotations

import pytest
import torch


def _ctx(tmp_path, model_name="char-shakespeare", n=3, T=24, **options):
    from tl_spectral.model_view import ModelView
    from tl_spectral.models import zoo
    from tl_spectral.viz.sections import ReportContext

    loaded = zoo.load(model_name)
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    view = ModelView(model)
    tokens = torch.randint(0, view.d_vocab, (n, T), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    return ReportContext(view=view, tokens=tokens, tokenizer=getattr(model, "tokenizer", None),
                         out_dir=out, results_dir=out / "results",
                         mask=torch.ones(n, T, dtype=torch.bool), options=options)


@pytest.mark.parametrize("name", ["char-shakespeare", "char-shakespeare-rotary"])
def test_sections_render_without_touching_the_model(tmp_path, monkeypatch, name):
    """After the probe pass and the model passes, the derive step and rendering every
    section run no forward pass and read no weight: the model's forward and ModelView.run
    raise."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.sections import (
        plan_report,
        render_report,
        run_derive,
        run_model_passes,
        run_probe_pass,
    )

    ctx = _ctx(tmp_path, name, faithfulness_docs=1, baseline="random", progress=False)
    plan = plan_report(ctx)
    keys = [mp.key for mp in plan.passes]
    # each computation on the model is declared once, in section order
    geometry = "rotary_qk_geometry" if "rotary" in name else "qk_geometry"
    assert keys == ["sanity_perplexity", "view_patterns", "head_scores_repeated",
                    "baseline_attention", geometry, "faithfulness", "surgery_tl_curve"]
    results = run_probe_pass(ctx, plan, batch_size=2, progress=False)
    run_model_passes(ctx, plan, results)
    assert set(keys) <= set(results) and not ctx.baseline_cache  # the twin is freed

    def refuse(*a, **k):
        raise AssertionError("a section touched the model while rendering")

    monkeypatch.setattr(ModelView, "run", refuse)
    monkeypatch.setattr(type(ctx.view.model), "forward", refuse)
    monkeypatch.setattr(type(ctx.view.model), "parameters", refuse)
    run_derive(ctx, plan, results)
    assert {"attention_stats_shown", "attention_views", "scale_pod", "scale_pod_intervals",
            "contribution_views"} <= set(results)
    index = render_report(ctx, plan.sections, results)
    html = index.read_text()
    assert "Sanity" in html and "linearization" in html.lower()
    # one stage-table row per pass, beside the probe pass and each section
    assert {f"pass {k}" for k in keys} <= set(ctx.timings)
    assert "probe pass" in ctx.timings and "derive scale_pod" in ctx.timings


def test_a_pass_key_declared_twice_runs_once(tmp_path):
    from tl_spectral.viz.context import ModelPass
    from tl_spectral.viz.sections import plan_report, run_model_passes

    calls = []

    class S:
        key, title = "s", "S"

        def __init__(self, tag):
            self.tag = tag

        def probes(self, ctx):
            return []

        def passes(self, ctx):
            return [ModelPass("shared", "shared pass", lambda c: calls.append(self.tag) or 7)]

    ctx = _ctx(tmp_path, progress=False)
    plan = plan_report(ctx, [S("a"), S("b")])
    results: dict = {}
    run_model_passes(ctx, plan, results)
    assert calls == ["a"] and results == {"shared": 7}


def test_rotary_bridge_without_firing_rotated_hooks_gets_a_reason(tmp_path):
    """A bridge of a native rotary model declares hook_rot_q / hook_rot_k but never calls
    them: the linearization curve says why it cannot run (it crashed the report before)."""
    from tl_spectral.interventions.surgery import tl_linearization_curve

    ctx = _ctx(tmp_path, model_name="char-shakespeare-rotary", n=1, T=8)
    with pytest.raises(ValueError, match="no hook on its rotated queries and keys"):
        tl_linearization_curve(ctx.view, ctx.tokens, ks=[0, 1])


def test_the_random_twin_reads_the_first_windows_of_the_check(tmp_path, monkeypatch):
    """The sanity pass: the model's and the unigram perplexity on the check's windows, the
    random-weight twin's on the first ``twin_windows`` of them (about RANDOM_TWIN_TOKENS
    tokens), each number what window_perplexity gives on those windows; the page says how
    many the twin read. The twin's perplexity is a magnitude: near the vocabulary size."""
    import tl_spectral.viz.sanity_section as ss
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.baseline import random_copy
    from tl_spectral.viz.report import Report

    ctx = _ctx(tmp_path, n=6, T=64, progress=False)
    assert ss.perplexity_windows(ctx) == 6 and ss.twin_windows(ctx) == 4  # 256 / 64
    seen = []
    real = ss.window_perplexity

    def spy(view, toks, mask=None, batch_size=8):
        seen.append((view is ctx.view, toks.clone()))
        return real(view, toks, mask, batch_size)

    monkeypatch.setattr(ss, "window_perplexity", spy)
    row = ss.sanity_perplexities(ctx)
    (own, t_model), (twin_own, t_twin) = seen
    assert own and not twin_own
    assert torch.equal(t_model, ctx.tokens[:6]) and torch.equal(t_twin, ctx.tokens[:4])
    assert (row["windows"], row["predicted_tokens"]) == (6, 6 * 63)
    assert (row["random_weights_windows"], row["random_weights_tokens"]) == (4, 4 * 63)
    twin = ModelView(random_copy(ctx.view.model, seed=0))
    assert row["random_weights_ppl"] == pytest.approx(real(twin, ctx.tokens[:4]), rel=1e-6)
    V = row["vocabulary"]
    every = real(twin, ctx.tokens)
    assert V / 2 < row["random_weights_ppl"] < 2 * V
    assert row["random_weights_ppl"] == pytest.approx(every, rel=0.05)
    report = Report("t")
    ss.SanitySection().render(report, {"sanity_perplexity": row}, ctx)
    html = report.write(tmp_path / "page").read_text(encoding="utf-8")
    assert "on the first 4 of these windows (252 predicted tokens)" in html


@pytest.mark.parametrize("padded", [False, True])
def test_the_model_perplexity_is_taken_in_the_probe_pass(tmp_path, monkeypatch, padded):
    """Issue 42 item 5: the sanity check's own perplexity comes from the probe pass (the
    last block's output of the check's windows through the final norm and unembedding), not
    from a second pass over those windows: the number is window_perplexity's on the same
    windows (padded ones included: targets at real tokens only), the sanity pass runs the
    model no more (only the random twin), and the check's windows may span batches."""
    import tl_spectral.viz.sanity_section as ss
    from tl_spectral.viz.sections import plan_report, run_model_passes, run_probe_pass

    ctx = _ctx(tmp_path, n=6, T=40, progress=False)
    if padded:
        ctx.mask[2, 25:] = False
        ctx.mask[5, 31:] = False
    n = ss.perplexity_windows(ctx)
    assert n == 6
    want = ss.window_perplexity(ctx.view, ctx.tokens[:n], ctx.mask[:n])
    plan = plan_report(ctx, [ss.SanitySection()])
    assert [type(p) for p in plan.probes] == [ss.WindowNLLProbe]
    results = run_probe_pass(ctx, plan, batch_size=4, progress=False)  # rows 0-3, then 4-5
    took = results[ss.WindowNLLProbe.name]
    assert took["count"] == int(ctx.mask[:n, 1:].sum()) and took["windows"] == n
    seen = []
    real = ss.window_perplexity
    monkeypatch.setattr(ss, "window_perplexity",
                        lambda view, *a, **k: seen.append(view is ctx.view) or real(view, *a, **k))
    run_model_passes(ctx, plan, results)
    assert seen == [False]  # the random twin's pass only
    assert results["sanity_perplexity"]["model_ppl"] == pytest.approx(want, rel=1e-5)
    assert ss.WindowNLLProbe.name not in results and not ctx.probe_results


def test_a_model_whose_logits_are_not_its_unembedded_output_gets_the_second_pass(
        tmp_path, monkeypatch):
    """Where the final norm and unembedding do not give the model's logits (a soft-cap or
    another step after them), ModelView.logits_from_resid_ok says so, the sanity section
    declares no probe and its pass runs the model over the check's windows as before."""
    import tl_spectral.viz.sanity_section as ss
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.sections import plan_report, run_model_passes, run_probe_pass

    ctx = _ctx(tmp_path, n=3, T=24, progress=False)
    assert ctx.view.logits_from_resid_ok()
    real = ModelView.logits_from_resid
    monkeypatch.setattr(ModelView, "logits_from_resid",
                        lambda self, r: 30.0 * torch.tanh(real(self, r) / 30.0))
    ctx.view = ModelView(ctx.view.model)  # a fresh view: the check is made once per view
    assert not ctx.view.logits_from_resid_ok()
    plan = plan_report(ctx, [ss.SanitySection()])
    assert plan.probes == []
    seen = []
    monkeypatch.setattr(ss, "window_perplexity",
                        lambda view, *a, **k: seen.append(view is ctx.view) or 2.0)
    results = run_probe_pass(ctx, plan, batch_size=2, progress=False)
    run_model_passes(ctx, plan, results)
    assert seen == [True, False] and results["sanity_perplexity"]["model_ppl"] == 2.0
