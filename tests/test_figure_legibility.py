"""Legibility of every figure: each registered plot of the plotting leaf (``viz/*_plots.py``,
``@register_plot``) drawn on a small real result of its kind, and every figure the default
report draws, checked on the rendered matplotlib figure by :mod:`_figure_checks` (the rules
are in its docstring): text ≥ 8 pt at the saved size, no backtick, axis labels (small
multiples: the outer axes; thumbnails without tick labels: none), colour bars labelled, no
two texts overlapping, no legend over data points, no line broken mid-word."""

from __future__ import annotations

import pytest
from _figure_checks import figure_problems


def test_every_registered_plot_is_legible(tmp_path):
    import matplotlib.pyplot as plt
    from test_result_protocol import _instances

    from tl_spectral.results import _import_result_modules
    from tl_spectral.viz.plots import FIGURES

    _import_result_modules()
    inst = _instances(tmp_path)
    problems, drawn = [], 0
    for (kind, name), fn in sorted(FIGURES.items()):
        if name == "view":  # circuitsvis views: the browser tests check them
            continue
        r = inst[kind]
        # the method when the result has one (its defaults); collapse takes a list
        out = getattr(r, name)() if hasattr(r, name) else fn([r])
        for fig in out if isinstance(out, (list, tuple)) else [out]:
            problems += figure_problems(fig, f"{kind}.{name}")
            drawn += 1
        plt.close("all")
    assert drawn >= 40
    assert not problems, "\n".join(problems)


def test_every_report_figure_is_legible(tmp_path, monkeypatch):
    """Every figure the default report draws (all sections, a small random model) passes
    the same checks before it is saved."""
    import tl_spectral.viz.report as rep
    from tl_spectral.cli import main

    seen: list[str] = []
    problems: list[str] = []
    orig = rep.figure_to_base64

    def checked(fig, *a, **k):
        title = fig._suptitle.get_text() if fig._suptitle is not None else ""
        if not title:
            title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        seen.append(title)
        problems.extend(figure_problems(fig, f"report figure {len(seen)} {title[:40]!r}"))
        return orig(fig, *a, **k)

    monkeypatch.setattr(rep, "figure_to_base64", checked)
    out = tmp_path / "r"
    assert main(["analyze", "--model", "random", "--n-docs", "4", "--length", "32", "--out",
                 str(out), "--no-progress"]) == 0
    assert len(seen) >= 10
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("bad", ["`code`", "lay\ner"])
def test_the_checks_catch_what_they_should(bad):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1], label="x")
    ax.set_title(bad)
    ax.set_xlabel("x")
    ax.text(0.5, 0.5, "tiny", fontsize=5)
    ax.legend(loc="center")
    ax.text(0.5, 0.5, "over")
    p = "\n".join(figure_problems(fig, "t"))
    plt.close(fig)
    assert "no y label" in p and "5.0 pt" in p and "overlap" in p and "legend covers" in p
    assert ("backtick" in p) if "`" in bad else ("mid-word" in p)


def test_per_layer_figures_of_a_deep_model_are_legible():
    """More than MAX_LEGEND_LAYERS layers: per-layer lines take a colour bar, not a legend
    over the data (SmolLM2's 30 layers collapsed the ρ* figure)."""
    import matplotlib.pyplot as plt
    import torch
    from conftest import make_native

    from tl_spectral.probes import AttentionFieldProbe, ContributionProbe, SinkProbe, run_probes

    model = make_native(n_layers=12, n_heads=2, d_model=16, d_head=8, n_ctx=16, d_vocab=20)
    toks = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    res = run_probes(model, toks, [ContributionProbe(), SinkProbe(), AttentionFieldProbe()],
                     progress=False)
    c, s, f = res["contributions"], res["sinks"], res["attention_fields"]
    problems = []
    for name, fig in (("plot_source", c.plot_source()), ("plot_lag", c.plot_lag()),
                      ("plot_rho_star", s.plot_rho_star()),
                      ("plot_anti_alignment", s.plot_anti_alignment()),
                      ("plot_mean", f.plot_mean()),
                      ("plot_scale_energies", f.scale_pod(n_heads=2).plot_scale_energies())):
        assert not any(ax.get_legend() for ax in fig.axes if ax.get_legend() and len(
            ax.get_legend().get_texts()) > 8), name
        problems += figure_problems(fig, name)
        plt.close(fig)
    assert not problems, "\n".join(problems)


def _report_figure_problems(tmp_path, monkeypatch, folder, n_docs: int = 8,
                            ticks: list | None = None) -> tuple[list, list]:
    """Every figure of ``tl-spectral analyze --model folder`` checked before it is saved:
    (titles seen, problems); ``ticks`` collects each figure's tick labels."""
    ticks = [] if ticks is None else ticks
    import tl_spectral.viz.report as rep
    from tl_spectral.cli import main

    seen: list[str] = []
    problems: list[str] = []
    orig = rep.figure_to_base64

    def checked(fig, *a, **k):
        title = fig._suptitle.get_text() if fig._suptitle is not None else ""
        if not title:
            title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        seen.append(title)
        problems.extend(figure_problems(fig, f"report figure {len(seen)} {title[:40]!r}"))
        ticks.append(" ".join(t.get_text() for ax in fig.axes
                              for t in ax.get_xticklabels() + ax.get_yticklabels()))
        return orig(fig, *a, **k)

    monkeypatch.setattr(rep, "figure_to_base64", checked)
    out = tmp_path / "r"
    assert main(["analyze", "--model", str(folder), "--n-docs", str(n_docs), "--length", "40",
                 "--out", str(out), "--no-progress"]) == 0
    return seen, problems


def test_figures_of_a_30_layer_report_are_legible(tmp_path, monkeypatch):
    """Issue 40 item 1: a random model of SmolLM2's shape (30 layers, 9 heads): no two texts
    of any figure overlap (layer ticks thinned, no per-point R² beyond 12 layers), every
    text legible. Fails on the T_spec / H* figure of before (ticks "0123456789101112…" and
    thirty R² annotations on top of each other)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _tiny_hf import save_smol_shape

    folder = save_smol_shape(tmp_path / "smol30", d_mlp=32)
    seen, problems = _report_figure_problems(tmp_path, monkeypatch, folder)
    assert len(seen) >= 10
    assert not problems, "\n".join(problems)


def test_figures_of_an_18_layer_gemma3_report_are_legible(tmp_path, monkeypatch):
    """A random Gemma-3 shape (18 layers, sliding-window layers with global layers 5, 11,
    17): legible figures, the global layers marked G on the layer axes."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _deep_models import save_gemma3_shape

    marked: list[str] = []
    folder = save_gemma3_shape(tmp_path / "gemma18")
    seen, problems = _report_figure_problems(tmp_path, monkeypatch, folder, ticks=marked)
    assert not problems, "\n".join(problems)
    # the per-layer figures mark the three global layers
    per_layer = [m for m in marked if "5 G" in m]
    assert len(per_layer) >= 6, marked
    assert all("11 G" in m and "17 G" in m for m in per_layer)
