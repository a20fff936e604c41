"""Hostile strings (token strings, names, captions) never become markup or script in the
report page or in any circuitsvis view (issue #15 item 8)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import torch

HOSTILE = "</script><script>alert(document.domain)</script>"
HOSTILE2 = "<img src=x onerror=alert(1)>\u2028<!--"


class _Count(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.handlers: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.handlers += [k for k, _ in attrs if k.startswith("on")]


def _check_page(text: str, n_scripts: int | None = None) -> _Count:
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "alert(document.domain)</script>" not in text
    p = _Count()
    p.feed(text)
    assert not p.handlers, p.handlers
    assert p.tags.get("img", 0) == text.count('<img src="data:image/png;base64,')
    if n_scripts is not None:
        assert p.tags.get("script", 0) == n_scripts
    return p


def test_report_api_escapes_every_string(tmp_path):
    from tl_spectral.viz.report import Report, js_json

    rep = Report(f"title {HOSTILE}", meta={HOSTILE: HOSTILE2},
                 glossary={HOSTILE: HOSTILE2, "col": HOSTILE})
    rep.section(f"section {HOSTILE}")
    rep.subsection(HOSTILE2)
    rep.text(HOSTILE)
    rep.finding(f"finding {HOSTILE}")
    rep.note(HOSTILE2)
    rep.table([{HOSTILE: HOSTILE2, "col": HOSTILE}] * 20, caption=HOSTILE, name=HOSTILE)
    import matplotlib.pyplot as plt

    rep.figure(plt.figure(figsize=(1, 1)), HOSTILE)
    rep.figure_set([(HOSTILE, plt.figure(figsize=(1, 1))), ("b", plt.figure(figsize=(1, 1)))],
                   HOSTILE2, label=HOSTILE)
    rep.circuitsvis_element("AttentionPatterns",
                            {"tokens": [HOSTILE, HOSTILE2], "attention": [[[1.0, 0.0], [0.5, 0.5]]]},
                            HOSTILE, HOSTILE)
    index = rep.write(tmp_path)
    text = index.read_text()
    # bundle, one view, the selector script
    _check_page(text, n_scripts=3)
    assert "\\u003c/script\\u003e" in text  # the token is still there, as JSON text
    for v in (tmp_path / "views").glob("*.html"):
        _check_page(v.read_text(), n_scripts=2)
    for f in (tmp_path / "tables").glob("*.csv"):
        assert "/" not in f.name[:-4] and not f.name.startswith(".")
    assert "<" not in js_json(["</script>", "<!--"]) and "\u2028" not in js_json(["\u2028"])


def test_built_report_with_hostile_tokens(tmp_path, native_ln):
    """A tokenizer that decodes to script: every view and the page stay inert."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.contribution_section import ContributionSection
    from tl_spectral.viz.sections import AttentionStatsSection, ReportContext, build_report

    class Tok:
        def decode(self, ids):
            return HOSTILE if ids[0] % 2 else HOSTILE2

    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    ctx = ReportContext(view=ModelView(native_ln), tokens=tokens, tokenizer=Tok(),
                        out_dir=tmp_path / "r", results_dir=tmp_path / "r" / "results",
                        model_name=HOSTILE, options={"meta": {"corpus": HOSTILE}})
    ctx.results_dir.mkdir(parents=True)
    index = build_report(ctx, [AttentionStatsSection(), ContributionSection()], progress=False)
    text = index.read_text()
    # a pattern and a contribution view per layer and shown document (3), each a JSON script
    n_views = 2 * 3 * ctx.view.n_layers
    _check_page(text, n_scripts=n_views + 2)  # + the bundle and the page script
    assert len(re.findall(r"CircuitsVis\.render\(", text)) == 1  # rendered lazily, by one call
    views = list((tmp_path / "r" / "views").glob("*.html"))
    assert 2 <= len(views) <= 5  # standalone pages of the views shown first
    for v in views:
        _check_page(v.read_text(), n_scripts=2)
