"""circuitsvis views in a notebook: one copy of the JavaScript per kernel, escaped props."""

from __future__ import annotations

import json
import re

import circuitsvis as cv
import torch

from tl_spectral.viz import views
from tl_spectral.viz.report import circuitsvis_props


def _view(tokens=("a", "b", "</script><b>", "d")):
    att = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(0))
    return views.NotebookView(cv.attention.attention_heads(attention=att, tokens=list(tokens)))


def test_bundle_once_per_kernel(monkeypatch):
    monkeypatch.setitem(views._NOTEBOOK, "bundle_sent", False)
    first, second, third = (_view()._repr_html_() for _ in range(3))
    bundle = views._bundle()
    assert len(bundle) > 500_000
    assert bundle in first and bundle not in second and bundle not in third
    assert len(second) < 5_000 and len(third) < 5_000
    ids = [re.search(r'<div id="([^"]+)"', h).group(1) for h in (first, second, third)]
    assert len(set(ids)) == 3  # every view renders into its own div
    # later views wait for window.CircuitsVis and render into their div
    assert "window.CircuitsVis" in second and f'CircuitsVis.render("{ids[1]}"' in second
    views.reset_notebook_bundle()
    assert bundle in _view()._repr_html_()


def test_props_escaped_and_equal_to_circuitsvis(monkeypatch):
    monkeypatch.setitem(views._NOTEBOOK, "bundle_sent", True)
    v = _view()
    html = v._repr_html_()
    # nothing of the user's tokens closes the script: only our own </script> tags
    assert html.count("</script>") == 1 and "<b>" not in html
    element, props = circuitsvis_props(v)  # the report reads the wrapped local_src
    assert element == v.element == "AttentionHeads"
    assert props["tokens"] == v.props["tokens"] == ["a", "b", "</script><b>", "d"]
    got = json.loads(re.search(r'CircuitsVis\["AttentionHeads"\], (.*?)\);\}else', html)
                     .group(1).replace("\\u003c", "<").replace("\\u003e", ">"))
    torch.testing.assert_close(torch.tensor(got["attention"]),
                               torch.tensor(props["attention"]), atol=1e-4, rtol=0)
    assert v.cdn_src == v.rendered.cdn_src and str(v) == str(v.rendered)


def test_colab_gets_the_bundle_every_time(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(views._NOTEBOOK, "bundle_sent", True)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("colab"))
    assert "CircuitsVis=" in _view()._repr_html_().replace(" ", "")


def test_show_closes_the_figure_it_displayed(monkeypatch):
    """In a notebook, show() displays the figure once and closes it (the inline backend would
    otherwise show it again at the end of the cell)."""
    import IPython
    import IPython.display
    import matplotlib.pyplot as plt

    from tl_spectral.results import Result

    made, _ = plt.subplots()

    class Plain(Result):
        kind = "plain_for_show_test"

        def plot_it(self):
            return made

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    assert plt.fignum_exists(made.number)
    assert Plain().show() is None  # shown once, not again as the cell's value
    assert shown == [made] and not plt.fignum_exists(made.number)


def test_five_views_stay_under_5_mb(monkeypatch):
    """Five views of 9 heads × 64 tokens: ~1.9 MB with the shared bundle, where circuitsvis'
    own display (the bundle in every view) would carry ~6.9 MB."""
    monkeypatch.setitem(views._NOTEBOOK, "bundle_sent", False)
    g = torch.Generator().manual_seed(0)
    vs = [views.NotebookView(cv.attention.attention_heads(
        attention=torch.rand(9, 64, 64, generator=g), tokens=[f"t{i}" for i in range(64)]))
        for _ in range(5)]
    shared = sum(len(v._repr_html_().encode()) for v in vs)
    alone = sum(len(v.local_src.encode()) for v in vs)
    assert shared < 5_000_000 < alone
