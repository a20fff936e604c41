"""An HTML report that opens offline as ONE self-contained file.

* Figures are embedded as PNG ``data:`` URIs; per-layer / per-head figures sit behind a
  selector (plain inline JavaScript) instead of rows of six.
* circuitsvis views are inlined into the page: the circuitsvis bundle (its ``iife.js``, the
  JavaScript that ``RenderedHTML.local_src`` inlines) is written once, each view is a ``<div>``
  and a small script calling ``CircuitsVis.render`` with the view's props. Copying
  ``index.html`` alone keeps every view. (``views/<name>.html`` also holds each view as a
  standalone page.)
* Long tables show their informative rows; the rest is behind a toggle, and every table is
  downloadable as CSV. Every column name is defined (header tooltips + the glossary).
* Escaping: every string that goes into the HTML is escaped with :func:`html.escape`, and every
  string that goes into inline JSON / JavaScript with :func:`js_json` (``<``, ``>``, ``&`` and
  U+2028/9 as ``\\uXXXX``; the bundle's own ``</`` as ``<\\/``), so a token string such as
  ``</script><script>alert(1)</script>`` stays text.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:1.5em auto;
padding:0 1em;color:#222;line-height:1.45;overflow-wrap:anywhere}
h1{border-bottom:2px solid #444;padding-bottom:.2em;font-size:1.7em}
h2{margin-top:2em;border-bottom:1px solid #bbb}
h3{margin-top:1.4em}
figure{margin:1em 0;max-width:100%}
figure img{max-width:100%;height:auto;border:1px solid #ddd}
figcaption{font-size:.9em;color:#555}
.tablewrap{max-width:100%;overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:.85em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#f2f2f2;white-space:normal;max-width:9em;vertical-align:bottom;font-size:.95em}
th[title]{cursor:help;text-decoration:underline dotted}
.meta{font-size:.9em;color:#444;background:#f7f7f7;padding:.6em 1em;border-radius:4px}
.findings{background:#eef5ff;border-left:4px solid #3b7dd8;padding:.6em 1.2em;margin:1em 0}
.findings li{margin:.3em 0}
nav.toc{background:#fafafa;border:1px solid #ddd;padding:.5em 1em;font-size:.92em}
nav.toc ol{margin:.2em 0;padding-left:1.4em}
nav.toc>ol{columns:2;column-gap:2em}
nav.toc>ol>li{break-inside:avoid}
nav.toc ol ol{font-size:.95em}
.selector{margin:.5em 0;font-size:.95em}
.selector select{font-size:1em}
.cvview{max-width:100%;overflow-x:auto;border:1px solid #ddd;padding:0 .5em}
details{margin:.3em 0}
.csv{font-size:.85em;margin-left:.6em}
.note{font-size:.9em;color:#444;border-top:1px solid #bbb;margin-top:2.5em;padding-top:.6em}
dl.glossary dt{font-family:monospace;font-weight:bold;margin-top:.4em}
dl.glossary dd{margin-left:1.5em}
"""

_SCRIPT = """
(function(){
  document.querySelectorAll('.figset').forEach(function(set){
    var sel = set.querySelector('select');
    function show(){
      set.querySelectorAll('[data-opt]').forEach(function(el){
        el.style.display = (el.getAttribute('data-opt') === sel.value) ? '' : 'none';
      });
    }
    sel.addEventListener('change', show);
    show();
  });
})();
"""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def esc(s: Any) -> str:
    """``html.escape`` of ``str(s)`` (quotes included): for text and attribute values."""
    return html.escape(str(s), quote=True)


def js_json(obj: Any) -> str:
    """JSON for inline ``<script>``: ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as
    ``\\uXXXX``, so no string can close the script element or open a comment."""
    s = json.dumps(obj, allow_nan=False)
    return (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _round_floats(obj: Any, digits: int = 4) -> Any:
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return 0.0
        return round(obj, digits)
    if isinstance(obj, list):
        return [_round_floats(v, digits) for v in obj]
    if isinstance(obj, dict):
        return {k: _round_floats(v, digits) for k, v in obj.items()}
    return obj


def figure_to_base64(fig: Any, dpi: int = 90) -> str:
    """PNG bytes of a matplotlib Figure, base64-encoded (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    try:  # a 256-colour palette PNG: a third of the size, no visible change for plots
        from PIL import Image

        img = Image.open(io.BytesIO(data)).convert("RGB")
        out = io.BytesIO()
        img.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
            out, format="PNG", optimize=True)
        if out.tell() < len(data):
            data = out.getvalue()
    except Exception:  # noqa: BLE001 - Pillow missing or failing: keep the plain PNG
        pass
    return base64.b64encode(data).decode("ascii")


def _fmt(v: Any, floatfmt: str = "{:.4g}") -> str:
    if isinstance(v, float):
        return floatfmt.format(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x, floatfmt) for x in v)
    return str(v)


def rows_to_csv(rows: Sequence[dict]) -> str:
    """Rows (dicts with the same keys) as CSV text."""
    keys = list(rows[0].keys()) if rows else []
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(keys)
    for r in rows:
        w.writerow([_fmt(r.get(k, ""), "{:.6g}") for k in keys])
    return buf.getvalue()


def table_html(rows: Sequence[dict], floatfmt: str = "{:.4g}", max_rows: int = 200,
               glossary: Optional[dict] = None) -> str:
    """An HTML table from a list of dicts with the same keys (headers with tooltips)."""
    if not rows:
        return "<p><em>(empty table)</em></p>"
    gl = glossary or {}
    keys = list(rows[0].keys())
    def name(k: str) -> str:  # break opportunities after underscores: narrow columns
        return esc(k).replace("_", "_<wbr>")

    head = "".join(
        f"<th title=\"{esc(gl[k])}\">{name(k)}</th>" if k in gl else f"<th>{name(k)}</th>"
        for k in keys)
    out = [f"<div class='tablewrap'><table><tr>{head}</tr>"]
    for row in rows[:max_rows]:
        out.append("<tr>" + "".join(f"<td>{esc(_fmt(row.get(k, ''), floatfmt))}</td>"
                                    for k in keys) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


# ------------------------------------------------------------------------ circuitsvis
_CV_RENDER = re.compile(
    r"CircuitsVis\.render\(\s*\"([^\"]*)\",\s*CircuitsVis\.(\w+),\s*(.*)\)\s*</script>\s*$",
    re.DOTALL)


def circuitsvis_props(rendered: Any) -> tuple[str, dict]:
    """(element name, props) of a circuitsvis ``RenderedHTML`` (parsed from ``local_src``)."""
    src = getattr(rendered, "local_src", None)
    if src is None:
        raise TypeError("expected a circuitsvis RenderedHTML (with .local_src)")
    m = _CV_RENDER.search(src)
    if m is None:
        raise ValueError("could not read the view's props from circuitsvis' local_src")
    return m.group(2), json.loads(m.group(3))


def circuitsvis_bundle() -> str:
    """circuitsvis' browser bundle (``dist/cdn/iife.js``), safe inside a ``<script>``."""
    import circuitsvis

    p = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    js = p.read_text(encoding="utf-8")
    js = re.sub(r"//# sourceMappingURL=\S*\s*$", "", js)  # no request for a .map file
    return js.replace("</", "<\\/").replace("<!--", "<\\!--")


VIEW_BUNDLE = "circuitsvis.js"
"""The circuitsvis bundle beside the standalone view pages in ``views/`` (loaded from the
same folder: no network)."""


def _view_script(div_id: str, element: str, props: dict) -> str:
    if not re.fullmatch(r"\w+", element):
        raise ValueError(f"bad circuitsvis element name {element!r}")
    return (f"<script>CircuitsVis.render({js_json(div_id)}, CircuitsVis[{js_json(element)}], "
            f"{js_json(props)});</script>")


# ------------------------------------------------------------------------------ report
@dataclass
class Section:
    """One section of the page: its title, anchor, HTML parts and subsections."""
    title: str
    anchor: str = ""
    parts: list[str] = field(default_factory=list)
    subsections: list[tuple[str, str]] = field(default_factory=list)  # (title, anchor)


class Report:
    """Collects sections of text, figures, tables and circuitsvis views; writes index.html."""

    def __init__(self, title: str, meta: Optional[dict] = None,
                 glossary: Optional[dict] = None):
        from tl_spectral.viz.glossary import GLOSSARY

        self.title = title
        self.meta = meta or {}
        self.sections: list[Section] = []
        self.findings: list[tuple[str, str]] = []  # (sentence, anchor)
        self.glossary: dict[str, str] = dict(GLOSSARY if glossary is None else glossary)
        self.used_terms: list[str] = []
        self.closing: list[str] = []
        self.tables: dict[str, str] = {}  # csv file name -> csv text
        self._views: dict[str, str] = {}  # views/<name>.html -> standalone page
        self._n_views = 0
        self._anchors: set[str] = set()
        self._n_sets = 0
        #: appended to every figure caption (the run: model, windows, seed)
        self.figure_suffix = ""

    # ------------------------------------------------------------------ structure
    def _anchor(self, title: str) -> str:
        base = _slug(title)
        a, i = base, 2
        while a in self._anchors:
            a, i = f"{base}-{i}", i + 1
        self._anchors.add(a)
        return a

    def section(self, title: str) -> Section:
        s = Section(title, self._anchor(title))
        self.sections.append(s)
        return s

    def subsection(self, title: str) -> str:
        """Start a subsection (an ``<h3>`` listed in the table of contents); its anchor."""
        sec = self._current()
        a = self._anchor(f"{sec.anchor}-{title}")
        sec.subsections.append((title, a))
        sec.parts.append(f'<h3 id="{esc(a)}">{esc(title)}</h3>')
        return a

    def _current(self) -> Section:
        if not self.sections:
            return self.section("Results")
        return self.sections[-1]

    @property
    def anchor(self) -> str:
        """Anchor of the current section."""
        return self._current().anchor

    def finding(self, sentence: str, anchor: Optional[str] = None) -> None:
        """A sentence for the findings summary at the top, linking to ``anchor`` (default:
        the current section)."""
        self.findings.append((sentence, anchor or self.anchor))

    def define(self, term: str, definition: str) -> None:
        self.glossary[term] = definition

    def note(self, sentence: str) -> None:
        """A sentence for the closing note."""
        self.closing.append(sentence)

    # ------------------------------------------------------------------ content
    def text(self, paragraph: str) -> None:
        """Add a paragraph (plain text, escaped)."""
        self._current().parts.append(f"<p>{esc(paragraph)}</p>")

    def html(self, fragment: str) -> None:
        """Add a trusted HTML fragment."""
        self._current().parts.append(fragment)

    @staticmethod
    def _img(fig: Any, alt: str) -> str:
        return f'<img src="data:image/png;base64,{figure_to_base64(fig)}" alt="{esc(alt)}"/>'

    def figure(self, fig: Any, caption: str = "") -> None:
        caption = caption + self.figure_suffix if caption else caption
        cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        self._current().parts.append(f"<figure>{self._img(fig, caption)}{cap}</figure>")

    def figure_set(self, figures: Iterable[tuple[str, Any]], caption: str = "",
                   label: str = "layer") -> None:
        """Several figures behind one selector (e.g. one per layer): ``figures`` is a
        sequence of (option label, Figure); only the selected one is shown."""
        items = list(figures)
        if not items:
            return
        if len(items) == 1:
            self.figure(items[0][1], f"{label} {items[0][0]}: {caption}" if caption else "")
            return
        self._n_sets += 1
        sid = f"figset-{self._n_sets}"
        opts = "".join(f'<option value="{i}">{esc(lab)}</option>'
                       for i, (lab, _) in enumerate(items))
        caption = caption + self.figure_suffix if caption else caption
        imgs = "".join(f'<div data-opt="{i}">{self._img(fig, f"{label} {lab}: {caption}")}</div>'
                       for i, (lab, fig) in enumerate(items))
        cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        self._current().parts.append(
            f'<figure class="figset" id="{sid}"><div class="selector"><label>{esc(label)} '
            f'<select aria-label="{esc(label)}">{opts}</select></label></div>{imgs}{cap}</figure>')

    def table(self, rows: Sequence[dict], caption: str = "", *, name: Optional[str] = None,
              show: Optional[Sequence[int]] = None, max_shown: int = 12) -> None:
        """A table with header tooltips, a CSV download, and (when longer than
        ``max_shown`` rows) only the rows ``show`` (default: the first ``max_shown``) in view,
        the whole table behind a toggle."""
        rows = list(rows)
        sec = self._current()
        if caption:
            sec.parts.append(f"<p><strong>{esc(caption)}</strong></p>")
        if not rows:
            sec.parts.append("<p><em>(empty table)</em></p>")
            return
        for k in rows[0]:
            if k not in self.used_terms:
                self.used_terms.append(k)
        fname = f"{_slug(name or caption or 'table')}.csv"
        while fname in self.tables:
            fname = fname[:-4] + "-2.csv"
        text = rows_to_csv(rows)
        self.tables[fname] = text
        link = (f'<a class="csv" download="{esc(fname)}" href="data:text/csv;charset=utf-8,'
                f'{esc(urllib.parse.quote(text))}">download CSV ({len(rows)} rows)</a>')
        if len(rows) <= max_shown:
            sec.parts.append(table_html(rows, glossary=self.glossary) + link)
            return
        idx = sorted(set(show)) if show is not None else list(range(max_shown))
        short = [rows[i] for i in idx if 0 <= i < len(rows)]
        sec.parts.append(
            table_html(short, glossary=self.glossary)
            + f"<details><summary>show all {len(rows)} rows</summary>"
            + table_html(rows, glossary=self.glossary, max_rows=len(rows)) + "</details>" + link)

    def circuitsvis(self, rendered: Any, name: str, caption: str = "", height: int = 0) -> None:
        """Inline a circuitsvis view (offline: the bundle is written once into the page).
        ``height`` is ignored (kept for compatibility: the view takes its own height)."""
        element, props = circuitsvis_props(rendered)
        self.circuitsvis_element(element, props, name, caption)

    def circuitsvis_element(self, element: str, props: dict, name: str,
                            caption: str = "") -> None:
        html = self._view_html(element, props, name)
        cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        self._current().parts.append(f"<figure>{html}{cap}</figure>")

    def _view_html(self, element: str, props: dict, name: str) -> str:
        """The inline div + render script of one view; also kept as ``views/<name>.html``."""
        props = _round_floats(props)
        self._n_views += 1
        div = f"cv-{self._n_views}-{_slug(name)}"
        fname = f"views/{_slug(name)}.html"
        # the standalone pages share one copy of the bundle (views/circuitsvis.js, 1.4 MB),
        # written once by write(): a page per layer must not repeat it
        self._views[fname] = (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{esc(name)}</title></head><body><div id='view'></div>"
            f"<script src='{VIEW_BUNDLE}'></script>{_view_script('view', element, props)}"
            "</body></html>")
        return f'<div class="cvview" id="{esc(div)}"></div>' + _view_script(div, element, props)

    def circuitsvis_set(self, views: Iterable[tuple[str, Any]], name: str, caption: str = "",
                        label: str = "layer") -> None:
        """Several circuitsvis views behind one selector (e.g. one per layer): ``views`` is a
        sequence of (option label, rendered view); only the selected one is shown."""
        items = [(lab, *circuitsvis_props(r)) for lab, r in views]
        if not items:
            return
        caption = caption + self.figure_suffix if caption else caption
        if len(items) == 1:
            lab, element, props = items[0]
            self.circuitsvis_element(element, props, f"{name}-{lab}",
                                     f"{label} {lab}: {caption}" if caption else "")
            return
        self._n_sets += 1
        sid = f"figset-{self._n_sets}"
        opts = "".join(f'<option value="{i}">{esc(lab)}</option>'
                       for i, (lab, _, _) in enumerate(items))
        divs = "".join(f'<div data-opt="{i}">{self._view_html(el, pr, f"{name}-{lab}")}</div>'
                       for i, (lab, el, pr) in enumerate(items))
        cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        self._current().parts.append(
            f'<figure class="figset" id="{sid}"><div class="selector"><label>{esc(label)} '
            f'<select aria-label="{esc(label)}">{opts}</select></label></div>{divs}{cap}</figure>')

    # ------------------------------------------------------------------ output
    def _toc(self) -> str:
        items = []
        if self.findings:
            items.append('<li><a href="#findings">Findings</a></li>')
        for s in self.sections:
            sub = "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for t, a in s.subsections)
            items.append(f'<li><a href="#{esc(s.anchor)}">{esc(s.title)}</a>'
                         + (f"<ol>{sub}</ol>" if sub else "") + "</li>")
        if self.used_terms:
            items.append('<li><a href="#glossary">Glossary of column names</a></li>')
        items.append('<li><a href="#about">About this report</a></li>')
        return f"<nav class='toc'><strong>Contents</strong><ol>{''.join(items)}</ol></nav>"

    def _render(self, closing_extra: Sequence[str] = ()) -> str:
        meta = "".join(f"<div><strong>{esc(k)}</strong>: {esc(v)}</div>"
                       for k, v in self.meta.items())
        body = [
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{esc(self.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{esc(self.title)}</h1>",
            f"<div class='meta'>{meta}</div>" if meta else "",
        ]
        if self.findings:
            lis = "".join(f'<li>{esc(s)} <a href="#{esc(a)}">→ section</a></li>'
                          for s, a in self.findings)
            body.append(f"<section class='findings' id='findings'><h2 style='margin-top:.3em'>"
                        f"Findings</h2><ul>{lis}</ul></section>")
        body.append(self._toc())
        if self._n_views:
            body.append(f"<script>{circuitsvis_bundle()}</script>")
        for s in self.sections:
            body.append(f'<h2 id="{esc(s.anchor)}">{esc(s.title)}</h2>')
            body.extend(s.parts)
        if self.used_terms:
            dl = "".join(f"<dt>{esc(t)}</dt><dd>{esc(self.glossary.get(t, '(not defined)'))}</dd>"
                         for t in self.used_terms)
            body.append(f"<h2 id='glossary'>Glossary of column names</h2>"
                        f"<dl class='glossary'>{dl}</dl>")
        note = [*self.closing, *closing_extra]
        body.append("<h2 id='about'>About this report</h2><div class='note'>"
                    + "".join(f"<p>{esc(x)}</p>" for x in note) + "</div>")
        body.append(f"<script>{_SCRIPT}</script></body></html>")
        return "\n".join(body)

    def write(self, out_dir: str | Path, size_note: bool = True) -> Path:
        """Write ``out_dir/index.html`` (self-contained), ``views/`` and ``tables/``
        (CSV). Returns the index path. With ``size_note`` the closing note gives the sizes of
        the page and of the whole folder."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for fname, content in self._views.items():
            p = out / fname
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
        if self._views:
            (out / "views" / VIEW_BUNDLE).write_text(circuitsvis_bundle(), encoding="utf-8")
        if self.tables:
            (out / "tables").mkdir(exist_ok=True)
            for fname, text in self.tables.items():
                (out / "tables" / fname).write_text(text, encoding="utf-8")
        (out / "report.json").write_text(
            json.dumps({"title": self.title, "meta": {k: str(v) for k, v in self.meta.items()},
                        "sections": [s.title for s in self.sections],
                        "findings": [f for f, _ in self.findings]}, indent=2),
            encoding="utf-8")
        index = out / "index.html"
        page = self._render()
        if size_note:
            index.write_text(page, encoding="utf-8")
            for _ in range(2):  # the note's own length changes the sizes by a few bytes
                page_mb = index.stat().st_size / 1e6
                total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6
                res = sum(p.stat().st_size for p in (out / "results").rglob("*")
                          if p.is_file()) / 1e6 if (out / "results").is_dir() else 0.0
                page = self._render([
                    f"Sizes: index.html {page_mb:.1f} MB (self-contained: figures, views and "
                    f"CSV tables inlined); results/ {res:.1f} MB; the whole folder "
                    f"{total:.1f} MB."])
                index.write_text(page, encoding="utf-8")
        else:
            index.write_text(page, encoding="utf-8")
        return index
