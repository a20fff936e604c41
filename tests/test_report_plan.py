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
