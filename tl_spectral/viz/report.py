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
figcaption{font-size:.9em;color:#444}
.cvview [tabindex]:focus{outline:2px solid #1a4f9c}
.cvview h4{font-size:1.17em}
.cvview h5{font-size:1em;white-space:nowrap;overflow:visible}
.tablewrap{max-width:100%;overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:.85em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#f2f2f2;white-space:normal;max-width:9em;vertical-align:bottom;font-size:.95em;
overflow-wrap:normal;word-break:normal;hyphens:none}
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
details.lazyview>summary{cursor:pointer;font-weight:600;color:#1a4f9c;padding:.3em 0}
.totop{font-size:.85em;margin-left:.8em;font-weight:normal}
table caption{caption-side:top;text-align:left;font-weight:600;padding:.2em 0}
details{margin:.3em 0}
.csv{font-size:.85em;margin-left:.6em}
.note{font-size:.9em;color:#444;border-top:1px solid #bbb;margin-top:2.5em;padding-top:.6em}
dl.glossary dt{font-family:monospace;font-weight:bold;margin-top:.4em}
dl.glossary dd{margin-left:1.5em}
"""

_UNPACK_JS = """
function tlNoWebGL(){
  // circuitsvis computes with TensorFlow.js, whose WebGL backend compiles shaders before its
  // first result: about 20 s in a software renderer (headless Chromium, many laptops' remote
  // sessions) for maps of a few thousand numbers. Without a WebGL context it takes its CPU
  // backend and a view renders in well under a second. Nothing else on the page uses WebGL.
  [window.HTMLCanvasElement, window.OffscreenCanvas].forEach(function(C){
    if (!C || C.prototype.tlNoWebGL) return;
    var get = C.prototype.getContext;
    C.prototype.getContext = function(type, attrs){
      if (/webgl/i.test(String(type))) return null;
      return get.call(this, type, attrs);
    };
    C.prototype.tlNoWebGL = true;
  });
}
function tlUnpack(p){
  var bin = atob(p.b64), n = bin.length, u = new Uint8Array(n), i;
  for (i = 0; i < n; i++) u[i] = bin.charCodeAt(i);
  var H = p.shape[0], Q = p.shape[1], K = p.shape[2], step = (p.hi - p.lo) / 254, k = 0, out = [];
  for (var h = 0; h < H; h++) {
    var rows = [];
    for (var q = 0; q < Q; q++) {
      var row = new Array(K);
      for (var j = 0; j < K; j++) row[j] = (p.tri && j > q) ? 0 : p.lo + u[k++] * step;
      rows.push(row);
    }
    out.push(rows);
  }
  return out;
}
function tlInk(view){
  // circuitsvis writes its head labels and tokens in white on the head's colour or the
  // token's attention shade (1.7:1 on light green). Whenever the view (re)draws, every text
  // below 4.5:1 (WCAG AA) against its background takes black or white, whichever contrasts
  // more (at least 4.58:1 on any background): a real colour change, not a shadow. Text
  // drawn into a canvas is not reachable this way; circuitsvis draws none (its head
  // thumbnails are canvases without text, labels and tokens are elements).
  function rgba(c){
    var m = /rgba?\\(([^)]+)\\)/.exec(c || '');
    if (!m) return null;
    var p = m[1].split(/[ ,\\/]+/).filter(function(x){ return x.length; }).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  }
  function over(f, b){ return [0, 1, 2].map(function(i){ return f[i] * f[3] + b[i] * (1 - f[3]); }); }
  function lum(c){
    return [0.2126, 0.7152, 0.0722].reduce(function(s, w, i){
      var v = c[i] / 255;
      return s + w * (v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4));
    }, 0);
  }
  function ratio(a, b){ var x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
  function back(e){
    var chain = [], bg = [255, 255, 255];
    for (; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
    for (var i = chain.length - 1; i >= 0; i--) {
      var c = rgba(getComputedStyle(chain[i]).backgroundColor);
      if (c && c[3] > 0) bg = over(c, bg);
    }
    return bg;
  }
  var pending = false;
  function fix(){
    pending = false;
    view.querySelectorAll('*').forEach(function(e){
      var own = Array.prototype.some.call(e.childNodes, function(n){
        return n.nodeType === 3 && n.textContent.trim();
      });
      if (!own) return;
      var fg = rgba(getComputedStyle(e).color);
      if (!fg) return;
      var bg = back(e), ink = over(fg, bg);
      if (ratio(ink, bg) >= 4.5) return;
      var best = ratio([0, 0, 0], bg) >= ratio([255, 255, 255], bg) ? '#000' : '#fff';
      e.style.setProperty('color', best, 'important');
    });
  }
  new MutationObserver(function(){
    if (!pending) { pending = true; requestAnimationFrame(fix); }
  }).observe(view, {subtree: true, childList: true, attributes: true,
                    attributeFilter: ['style', 'class']});
  fix();
}"""

_SCRIPT = _UNPACK_JS + """
window.tlViews = {rendered: 0};
function tlBundle(){
  if (window.CircuitsVis) return;
  tlNoWebGL();
  var b = document.getElementById('cv-bundle');
  var s = document.createElement('script');
  s.textContent = b.textContent;
  document.head.appendChild(s);
}
function tlRender(el){
  if (el.getAttribute('data-done')) return;
  tlBundle();
  var d = JSON.parse(document.getElementById(el.getAttribute('data-src')).textContent);
  (d.packed || []).forEach(function(k){ d.props[k] = tlUnpack(d.props[k]); });
  CircuitsVis.render(el.id, CircuitsVis[d.element], d.props);
  el.setAttribute('data-done', '1');
  window.tlViews.rendered++;
  tlInk(el);
  setTimeout(function(){ tlKeyboard(el); }, 300);
}
function tlKeyboard(el){
  // circuitsvis' head thumbnails answer the mouse only: make them focusable, announce
  // them, and let Enter / Space act like a click (focus acts like hovering)
  el.querySelectorAll('canvas').forEach(function(c){
    var t = c.parentElement;
    if (!t || t.getAttribute('tabindex') !== null || c.width >= 400) return;
    t.setAttribute('tabindex', '0');
    t.setAttribute('role', 'button');
    var label = (t.parentElement && t.parentElement.innerText || '').trim().split('\\n')[0];
    t.setAttribute('aria-label', label || 'head');
    t.addEventListener('keydown', function(e){
      if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); t.click(); }
    });
    t.addEventListener('focus', function(){
      t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    });
  });
}
(function(){
  document.querySelectorAll('figure.viewset').forEach(function(set){
    var det = set.querySelector('details');
    var sels = Array.from(set.querySelectorAll('select[data-dim]'));
    function show(){
      var key = sels.map(function(s){ return s.value; }).join('|');
      set.querySelectorAll('.cvview').forEach(function(el){
        var on = el.getAttribute('data-key') === key;
        el.style.display = on ? '' : 'none';
        if (on && det.open) tlRender(el);
      });
    }
    sels.forEach(function(s){ s.addEventListener('change', show); });
    det.addEventListener('toggle', show);
    show();
  });
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


def pack_maps(maps: Any, lo: float, hi: float, tri: bool = False) -> dict:
    """A ``[heads, query, key]`` array as 255 levels on ``[lo, hi]`` (one byte per entry,
    base64; with ``tri`` only the entries ``key <= query``): the page's ``tlUnpack`` turns it
    back into nested lists before a view renders. Level ``q`` stands for ``lo + q (hi − lo) /
    254`` (values clipped to ``[lo, hi]``), so 0 is exact when ``lo = −hi`` or ``lo = 0``."""
    import numpy as np

    a = np.asarray(maps.detach().cpu().float().numpy() if hasattr(maps, "detach") else maps,
                   dtype=np.float64)
    if a.ndim != 3:
        raise ValueError(f"pack_maps expects [heads, query, key], got shape {a.shape}")
    hi = float(hi) if float(hi) > float(lo) else float(lo) + 1.0
    q = np.rint((np.clip(np.nan_to_num(a), lo, hi) - lo) / (hi - lo) * 254).astype(np.uint8)
    if tri:
        iq, ik = np.tril_indices(a.shape[1], 0, a.shape[2])
        q = q[:, iq, ik]
    return {"b64": base64.b64encode(q.tobytes()).decode("ascii"), "shape": list(a.shape),
            "lo": float(lo), "hi": hi, "tri": bool(tri)}


def unpack_maps(p: dict) -> list:
    """The inverse of :func:`pack_maps` (what the page's ``tlUnpack`` does), for tests and
    the standalone view pages."""
    import numpy as np

    H, Q, K = p["shape"]
    u = np.frombuffer(base64.b64decode(p["b64"]), dtype=np.uint8).astype(np.float64)
    v = p["lo"] + u * (p["hi"] - p["lo"]) / 254
    out = np.zeros((H, Q, K))
    if p["tri"]:
        iq, ik = np.tril_indices(Q, 0, K)
        out[:, iq, ik] = v.reshape(H, -1)
    else:
        out[:] = v.reshape(H, Q, K)
    return out.tolist()


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


FIGURE_FORMATS = ("png", "svg")


def figure_to_base64(fig: Any, dpi: int = 90, fmt: str = "png") -> str:
    """PNG (or with ``fmt="svg"`` SVG) bytes of a matplotlib Figure, base64-encoded (the
    figure is closed). PNG: a 256-colour palette PNG (a third of the size of the RGB one,
    no visible change for plots), or the RGB PNG where Pillow fails."""
    import matplotlib.pyplot as plt

    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"figure format must be one of {FIGURE_FORMATS}, got {fmt!r}")
    buf = io.BytesIO()
    try:
        if fmt == "svg":
            fig.savefig(buf, format="svg", bbox_inches="tight")
            return base64.b64encode(buf.getvalue()).decode("ascii")
        # uncompressed (lossless: the same pixels), as it is decoded again at once
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches=_tight_bbox(fig, dpi),
                    pil_kwargs={"compress_level": 0})
        try:
            data = _palette_png(buf.getvalue())
        except Exception:  # noqa: BLE001 - Pillow failing: the plain PNG, compressed
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
            data = buf.getvalue()
        return base64.b64encode(data).decode("ascii")
    finally:
        plt.close(fig)


def _tight_bbox(fig: Any, dpi: int) -> Any:
    """The figure's tight bounding box at ``dpi`` (what ``bbox_inches="tight"`` crops to,
    padded by ``savefig.pad_inches``), found without the full draw ``savefig`` runs first
    for it: the layout engine, if any, run once (then switched off, as ``savefig`` does for
    its own draw), the extents read from the Agg renderer. ``"tight"`` itself for a figure
    with another layout engine (constrained layout), or where this fails. The same pixels as ``"tight"``
    (``tests/test_report.py`` compares them); one draw of the figure instead of two."""
    import matplotlib as mpl
    from matplotlib.layout_engine import PlaceHolderLayoutEngine, TightLayoutEngine

    engine = fig.get_layout_engine()  # after fig.tight_layout(): a place holder
    if engine is not None and not isinstance(engine, (TightLayoutEngine,
                                                      PlaceHolderLayoutEngine)):
        return "tight"
    old = fig.dpi
    try:
        fig.dpi = dpi
        renderer = fig.canvas.get_renderer()
        if engine is not None:
            engine.execute(fig)
        box = fig.get_tightbbox(renderer).padded(mpl.rcParams["savefig.pad_inches"])
    except Exception:  # noqa: BLE001 - not an Agg canvas, …: savefig finds it itself
        return "tight"
    finally:
        fig.dpi = old
    fig.set_layout_engine("none")
    return box


def _palette_png(data: bytes) -> bytes:
    """The PNG ``data`` quantized to a 256-colour palette (Pillow's fast octree)."""
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(out, format="PNG",
                                                                     optimize=True)
    return out.getvalue()


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
               glossary: Optional[dict] = None, caption: str = "") -> str:
    """An HTML table from a list of dicts with the same keys (column headers with
    ``scope="col"`` and tooltips; ``caption`` as the table's ``<caption>``)."""
    if not rows:
        return "<p><em>(empty table)</em></p>"
    gl = glossary or {}
    keys = list(rows[0].keys())
    def name(k: str) -> str:  # break opportunities after underscores: narrow columns
        return esc(k).replace("_", "_<wbr>")

    head = "".join(
        f"<th scope=\"col\" title=\"{esc(gl[k])}\">{name(k)}</th>" if k in gl
        else f"<th scope=\"col\">{name(k)}</th>" for k in keys)
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    out = [f"<div class='tablewrap'><table>{cap}<tr>{head}</tr>"]
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
    js = _view_heading_levels(js)
    return js.replace("</", "<\\/").replace("<!--", "<\\!--")


def _view_heading_levels(js: str) -> str:
    """circuitsvis' heading levels -> the report's. Its views sit under an h3 ("Interactive
    view"); circuitsvis' ``attention_heads`` writes h3 "Head Selector", an h4 label on each
    head thumbnail (absolutely positioned), h3 "H0 Zoomed" and an h2 badge with the zoomed
    head's name — an h2 inside the h3's view; ``attention_patterns`` writes h4 "Attention
    Patterns" and "Tokens". Within a view: section titles h4, head labels h5 (the page's
    CSS keeps their look). Rewrites the ``createElement("h…", …)`` calls of its React
    components."""
    js = js.replace('createElement("h4",{style:{position:"absolute"',
                    'createElement("h5",{style:{position:"absolute"')
    js = js.replace('createElement("h3",', 'createElement("h4",')
    return js.replace('createElement("h2",', 'createElement("h5",')


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
                 glossary: Optional[dict] = None, figure_format: str = "png"):
        from tl_spectral.viz.glossary import GLOSSARY

        if figure_format not in FIGURE_FORMATS:
            raise ValueError(f"figure_format must be one of {FIGURE_FORMATS}, got "
                             f"{figure_format!r}")
        self.figure_format = figure_format
        self.title = title
        self.meta = meta or {}
        self.sections: list[Section] = []
        self.findings: list[tuple[str, str]] = []  # (sentence, anchor)
        self.glossary: dict[str, str] = dict(GLOSSARY if glossary is None else glossary)
        self.used_terms: list[str] = []
        self.closing: list[str] = []
        #: (key, text) of the works and specification sections the page cites as "[key]"
        self.references: list[tuple[str, str]] = []
        self.tables: dict[str, str] = {}  # csv file name -> csv text
        self._views: dict[str, str] = {}  # views/<name>.html -> standalone page
        self._n_views = 0
        self._anchors: set[str] = set()
        self._n_sets = 0
        #: appended to every figure caption (the run: model, windows, seed)
        self.figure_suffix = ""
        #: per layer "local"/"global" for a model that mixes sliding-window and full
        #: attention (viz.layer_plots.layer_kinds): every per-layer table gets an
        #: ``attention`` column and every layer axis of a figure marks the global layers
        self.layer_kinds: Optional[list[str]] = None

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

    def finding(self, sentence: str, anchor: Optional[str] = None,
                first: "bool | str" = False) -> None:
        """A sentence for the findings summary at the top, linking to ``anchor`` (default:
        the current section); ``first``: after the earlier sanity findings, ahead of every
        other finding; ``first="top"``: ahead of all."""
        item = (sentence, anchor or self.anchor)
        if first:  # a verdict on the whole model ("looks untrained") goes above them all
            n = 0 if first == "top" else getattr(self, "_n_first", 0)
            self.findings.insert(n, item)
            self._n_first = getattr(self, "_n_first", 0) + 1
        else:
            self.findings.append(item)

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

    def _img(self, fig: Any, alt: str) -> str:
        if self.layer_kinds:
            from tl_spectral.viz.layer_plots import mark_layer_axes

            mark_layer_axes(fig, self.layer_kinds)
        mime = "image/svg+xml" if self.figure_format == "svg" else "image/png"
        data = figure_to_base64(fig, fmt=self.figure_format)
        return f'<img src="data:{mime};base64,{data}" alt="{esc(alt)}"/>'

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
        if self.layer_kinds and rows and "layer" in rows[0] and "attention" not in rows[0]:
            from tl_spectral.viz.layer_plots import mark_rows

            rows = mark_rows(rows, self.layer_kinds)
        sec = self._current()
        if not rows:
            if caption:
                sec.parts.append(f"<p><strong>{esc(caption)}</strong></p>")
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
            sec.parts.append(table_html(rows, glossary=self.glossary, caption=caption) + link)
            return
        idx = sorted(set(show)) if show is not None else list(range(max_shown))
        short = [rows[i] for i in idx if 0 <= i < len(rows)]
        sec.parts.append(
            table_html(short, glossary=self.glossary, caption=caption)
            + f"<details><summary>show all {len(rows)} rows</summary>"
            + table_html(rows, glossary=self.glossary, max_rows=len(rows),
                         caption=f"{caption} (all rows)" if caption else "")
            + "</details>" + link)

    def circuitsvis(self, rendered: Any, name: str, caption: str = "", height: int = 0) -> None:
        """Inline a circuitsvis view (offline: the bundle is written once into the page),
        rendered when the reader opens it. ``height`` is ignored (kept for compatibility)."""
        element, props = circuitsvis_props(rendered)
        self.circuitsvis_element(element, props, name, caption)

    def circuitsvis_element(self, element: str, props: dict, name: str,
                            caption: str = "", packed: Sequence[str] = ()) -> None:
        """One view (see :meth:`view_set`)."""
        self.view_set([((), element, props)], [], name, caption, packed=packed)

    def circuitsvis_set(self, views: Iterable[tuple[str, Any]], name: str, caption: str = "",
                        label: str = "layer") -> None:
        """Several circuitsvis views behind one selector (e.g. one per layer): ``views`` is a
        sequence of (option label, rendered view)."""
        items = [((lab,), *circuitsvis_props(r)) for lab, r in views]
        if items:
            self.view_set(items, [label], name, caption)

    def view_set(self, items: Sequence[tuple[tuple[str, ...], str, dict]], dims: Sequence[str],
                 name: str, caption: str = "", *, default: Optional[tuple[str, ...]] = None,
                 packed: Sequence[str] = (), standalone: Optional[Sequence[tuple]] = None,
                 summary: str = "", option_notes: Optional[dict] = None) -> None:
        """Interactive circuitsvis views behind one selector per dimension (``dims``, e.g.
        ``["document", "layer"]``), rendered LAZILY: each view's props sit in the page as a
        JSON script and the view is compiled only when the reader opens the figure's
        ``<details>`` and selects it (so the page is usable at once, whatever the number of
        views).

        items: ``(key, element, props)``, the key one option label per dimension (options
        keep their first-appearance order); default: the key shown first (default: the
        first item); packed: props keys holding :func:`pack_maps` output (unpacked in the
        page); standalone: the keys also written as ``views/<name>-<key>.html`` pages
        (default: the default key only); option_notes: ``{(dim index, label): note}``
        appended to an option's text (e.g. "sink layer")."""
        if not items:
            return
        keys = [tuple(str(k) for k in key) for key, _, _ in items]
        default = tuple(str(k) for k in (default or keys[0]))
        if default not in keys:
            default = keys[0]
        notes = option_notes or {}
        want = {tuple(str(k) for k in t) for t in (standalone or [default])}
        caption = caption + self.figure_suffix if caption else caption
        self._n_sets += 1
        sid = f"viewset-{self._n_sets}"
        sels = []
        for d, dim in enumerate(dims):
            opts: list[str] = []
            for k in keys:
                if k[d] not in opts:
                    opts.append(k[d])
            html_opts = "".join(
                f'<option value="{esc(o)}"{" selected" if o == default[d] else ""}>'
                f'{esc(o)}{esc(" — " + notes[(d, o)]) if (d, o) in notes else ""}</option>'
                for o in opts)
            sels.append(f'<label>{esc(dim)} <select data-dim="{d}" aria-label="{esc(dim)}">'
                        f'{html_opts}</select></label>')
        divs = []
        for key, (_, element, props) in zip(keys, items):
            if not re.fullmatch(r"\w+", element):
                raise ValueError(f"bad circuitsvis element name {element!r}")
            props = _round_floats(props)
            self._n_views += 1
            label = "-".join([name, *key]) if key else name
            div = f"cv-{self._n_views}-{_slug(label)}"
            src = f"cvd-{self._n_views}"
            data = {"element": element, "props": props, "packed": list(packed)}
            divs.append(f'<script type="application/json" id="{src}">{js_json(data)}</script>'
                        f'<div class="cvview" id="{esc(div)}" data-src="{src}" '
                        f'data-key="{esc("|".join(key))}"></div>')
            if key in want:
                fname = f"views/{_slug(label)}.html"
                # the standalone pages share one copy of the bundle (views/circuitsvis.js,
                # 1.4 MB), written once by write(); packed maps are unpacked in the page
                self._views[fname] = (
                    "<!DOCTYPE html><html><head><meta charset='utf-8'>"
                    f"<title>{esc(label)}</title></head><body><div id='view'></div>"
                    f"<script src='{VIEW_BUNDLE}'></script><script>{_UNPACK_JS}"
                    f"tlNoWebGL(); var d = {js_json(data)};"
                    "(d.packed || []).forEach(function(k){ d.props[k] = tlUnpack(d.props[k]); });"
                    "CircuitsVis.render('view', CircuitsVis[d.element], d.props);"
                    "tlInk(document.getElementById('view'));</script>"
                    "</body></html>")
        n = len(items)
        what = summary or ("Open the interactive view" if n == 1 else
                           f"Open the interactive views ({n}: pick "
                           + " and ".join(dims) + ")")
        cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
        sel_html = f'<div class="selector">{" ".join(sels)}</div>' if sels else ""
        self._current().parts.append(
            f'<figure class="viewset" id="{sid}"><details class="lazyview"><summary>{esc(what)}'
            f'</summary>{sel_html}{"".join(divs)}</details>{cap}</figure>')

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
        if self.references:
            items.append('<li><a href="#references">References</a></li>')
        items.append('<li><a href="#about">About this report</a></li>')
        return f"<nav class='toc' id='contents'><strong>Contents</strong><ol>{''.join(items)}</ol></nav>"

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
        if self._n_views:  # compiled by the first view that is opened (tlBundle)
            body.append(f"<script type='text/plain' id='cv-bundle'>{circuitsvis_bundle()}"
                        "</script>")
        for s in self.sections:
            body.append(f'<h2 id="{esc(s.anchor)}">{esc(s.title)}'
                        '<a class="totop" href="#contents">↑ contents</a></h2>')
            body.extend(s.parts)
        if self.used_terms:
            dl = "".join(f"<dt>{esc(t)}</dt><dd>{esc(self.glossary.get(t, '(not defined)'))}</dd>"
                         for t in self.used_terms)
            body.append(f"<h2 id='glossary'>Glossary of column names</h2>"
                        f"<dl class='glossary'>{dl}</dl>")
        if self.references:
            refs = "".join(f'<li id="ref-{esc(_slug(k))}">[{esc(k)}] {esc(t)}</li>'
                           for k, t in self.references)
            body.append("<h2 id='references'>References<a class=\"totop\" href=\"#contents\">"
                        f"↑ contents</a></h2><ul class='refs'>{refs}</ul>")
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
