"""An HTML report that opens offline: figures embedded as PNG, circuitsvis views inlined.

circuitsvis' ``str(html)`` loads its JavaScript from a CDN; we always write the object's
``local_src`` (the JavaScript inlined), each view in its own file under ``views/`` shown in
an iframe, so the page renders with no network and the index stays small.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #444;padding-bottom:.2em}
h2{margin-top:2em;border-bottom:1px solid #bbb}
figure{margin:1em 0}
figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.9em;color:#555}
table{border-collapse:collapse;font-size:.85em;margin:1em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f2f2f2}
.meta{font-size:.9em;color:#444;background:#f7f7f7;padding:.6em 1em;border-radius:4px}
iframe{width:100%;border:1px solid #ddd}
nav a{margin-right:1em}
"""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def figure_to_base64(fig: Any, dpi: int = 110) -> str:
    """PNG bytes of a matplotlib Figure, base64-encoded (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def table_html(rows: Sequence[dict], floatfmt: str = "{:.4g}", max_rows: int = 200) -> str:
    """An HTML table from a list of dicts with the same keys."""
    if not rows:
        return "<p><em>(empty table)</em></p>"
    keys = list(rows[0].keys())
    out = ["<table><tr>" + "".join(f"<th>{html.escape(str(k))}</th>" for k in keys) + "</tr>"]
    for row in rows[:max_rows]:
        cells = []
        for k in keys:
            v = row.get(k, "")
            s = floatfmt.format(v) if isinstance(v, float) else str(v)
            cells.append(f"<td>{html.escape(s)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    if len(rows) > max_rows:
        out.append(f"<p><em>{len(rows) - max_rows} more rows in the saved results.</em></p>")
    return "\n".join(out)


@dataclass
class Section:
    title: str
    parts: list[str] = field(default_factory=list)


class Report:
    """Collects sections of text, figures, tables and circuitsvis views; writes index.html."""

    def __init__(self, title: str, meta: Optional[dict] = None):
        self.title = title
        self.meta = meta or {}
        self.sections: list[Section] = []
        self._views: dict[str, str] = {}

    def section(self, title: str) -> Section:
        s = Section(title)
        self.sections.append(s)
        return s

    def _current(self) -> Section:
        if not self.sections:
            return self.section("Results")
        return self.sections[-1]

    def text(self, paragraph: str) -> None:
        """Add a paragraph (plain text, escaped)."""
        self._current().parts.append(f"<p>{html.escape(paragraph)}</p>")

    def html(self, fragment: str) -> None:
        """Add a trusted HTML fragment."""
        self._current().parts.append(fragment)

    def figure(self, fig: Any, caption: str = "") -> None:
        data = figure_to_base64(fig)
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._current().parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}"/>{cap}</figure>'
        )

    def table(self, rows: Sequence[dict], caption: str = "") -> None:
        if caption:
            self._current().parts.append(f"<p><strong>{html.escape(caption)}</strong></p>")
        self._current().parts.append(table_html(rows))

    def circuitsvis(self, rendered: Any, name: str, caption: str = "", height: int = 520) -> None:
        """Embed a circuitsvis view offline (its ``local_src``, in ``views/<name>.html``)."""
        src = getattr(rendered, "local_src", None)
        if src is None:
            raise TypeError("expected a circuitsvis RenderedHTML (with .local_src)")
        fname = f"views/{_slug(name)}.html"
        self._views[fname] = (
            "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + src + "</body></html>"
        )
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._current().parts.append(
            f'<figure><iframe src="{fname}" height="{height}"></iframe>{cap}</figure>'
        )

    def write(self, out_dir: str | Path) -> Path:
        """Write ``out_dir/index.html`` (and ``out_dir/views/``). Returns the index path."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for fname, content in self._views.items():
            p = out / fname
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
        nav = " ".join(
            f'<a href="#{_slug(s.title)}">{html.escape(s.title)}</a>' for s in self.sections
        )
        meta = "".join(
            f"<div><strong>{html.escape(str(k))}</strong>: {html.escape(str(v))}</div>"
            for k, v in self.meta.items()
        )
        body = [
            "<!DOCTYPE html><html><head><meta charset='utf-8'>",
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
            f"<div class='meta'>{meta}</div>" if meta else "",
            f"<nav>{nav}</nav>",
        ]
        for s in self.sections:
            body.append(f'<h2 id="{_slug(s.title)}">{html.escape(s.title)}</h2>')
            body.extend(s.parts)
        body.append("</body></html>")
        index = out / "index.html"
        index.write_text("\n".join(body), encoding="utf-8")
        (out / "report.json").write_text(
            json.dumps({"title": self.title, "meta": self.meta,
                        "sections": [s.title for s in self.sections]}, indent=2),
            encoding="utf-8",
        )
        return index
