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
