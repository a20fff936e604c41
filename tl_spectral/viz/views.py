"""circuitsvis views of results. Imports nothing of the library, so result classes may
call these without an import cycle.

``contribution_view`` shows a contribution map with ``circuitsvis.attention.attention_heads``
(one small heat map per head, plus the token level ``C = Σ_h c`` as the last "head"):
positive values in red, negative values (destructive interference) in blue, white at 0, with
symmetric limits ``±lim`` so equal magnitudes get equal colour depth. ``lim`` is the largest
|value| over the shown maps, or with ``clip_quantile < 1`` that quantile of |value|.

Views come back as :class:`NotebookView`: a circuitsvis ``RenderedHTML`` (same ``local_src`` /
``cdn_src``) whose notebook display shares the circuitsvis JavaScript. circuitsvis' own
display inlines its 1.3 MB bundle in every view (after a network probe of google.com); a
``NotebookView`` inlines it only in the first view a kernel displays, later views wait for
``window.CircuitsVis`` and render into their own ``<div>`` — five views cost one bundle.
Offline, no network. Google Colab isolates each output in its own frame, so there every view
carries the bundle; :func:`reset_notebook_bundle` makes the next view carry it again (e.g.
after clearing the output of the cell that held it).
"""

from __future__ import annotations

import json
import math
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

_CV_RENDER = re.compile(
    r"CircuitsVis\.render\(\s*\"([^\"]*)\",\s*CircuitsVis\.(\w+),\s*(.*)\)\s*</script>\s*$",
    re.DOTALL)

#: per kernel: whether the bundle went out, how many views were shown, an id prefix (unique
#: per kernel, so two notebooks open in one JupyterLab page never share a div id)
_NOTEBOOK = {"bundle_sent": False, "n": 0, "prefix": uuid.uuid4().hex[:8]}


def reset_notebook_bundle() -> None:
    """Make the next :class:`NotebookView` displayed in this kernel inline the circuitsvis
    JavaScript again (e.g. after the output of the cell that carried it was cleared)."""
    _NOTEBOOK["bundle_sent"] = False


def _js_json(obj: Any) -> str:
    """JSON safe inside an inline ``<script>``."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _rounded(obj: Any, digits: int = 4) -> Any:
    if isinstance(obj, float):
        return round(obj, digits) if math.isfinite(obj) else 0.0
    if isinstance(obj, list):
        return [_rounded(v, digits) for v in obj]
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    return obj


def _bundle() -> str:
    """circuitsvis' browser bundle (``dist/cdn/iife.js``), safe inside a ``<script>``."""
    import circuitsvis

    js = (Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js").read_text(
        encoding="utf-8")
    js = re.sub(r"//# sourceMappingURL=\S*\s*$", "", js)
    return js.replace("</", "<\\/").replace("<!--", "<\\!--")


class NotebookView:
    """A circuitsvis view whose notebook display shares one copy of the JavaScript per kernel
    (see the module doc). ``local_src`` / ``cdn_src`` / ``show_code()`` / ``str()`` are the
    wrapped ``RenderedHTML``'s, so it goes wherever a circuitsvis view goes (the report
    reads ``local_src``)."""

    def __init__(self, rendered: Any):
        self.rendered = rendered
        m = _CV_RENDER.search(rendered.local_src)
        if m is None:
            raise ValueError("could not read the view's props from circuitsvis' local_src")
        self.element = m.group(2)
        self.props = _rounded(json.loads(m.group(3)))

    @property
    def local_src(self) -> str:
        return self.rendered.local_src

    @property
    def cdn_src(self) -> str:
        return self.rendered.cdn_src

    def show_code(self) -> str:
        return self.rendered.show_code()

    def __str__(self) -> str:
        return str(self.rendered)

    def __repr__(self) -> str:
        return f"NotebookView(circuitsvis {self.element})"

    def _repr_html_(self) -> str:
        _NOTEBOOK["n"] += 1
        div = f"tls-cv-{_NOTEBOOK['prefix']}-{_NOTEBOOK['n']}"
        call = (f"CircuitsVis.render({_js_json(div)}, CircuitsVis[{_js_json(self.element)}], "
                f"{_js_json(self.props)});")
        out = f'<div id="{div}" class="tls-cv-view" style="margin: 15px 0;"></div>'
        if not _NOTEBOOK["bundle_sent"] or "google.colab" in sys.modules:
            _NOTEBOOK["bundle_sent"] = True
            return out + f"<script>{_bundle()}</script><script>{call}</script>"
        # the bundle came with an earlier view of this kernel: wait for it (a few seconds)
        missing = ("circuitsvis JavaScript not loaded: it comes with the first view of the "
                   "notebook; call tl_spectral.viz.views.reset_notebook_bundle() and show "
                   "this view again")
        return out + (
            "<script>(function(){var n=0;function go(){if(window.CircuitsVis){" + call
            + "}else if(n++<100){setTimeout(go,100);}else{var d=document.getElementById("
            + _js_json(div) + ");if(d){d.textContent=" + _js_json(missing) + ";}}}go();})();"
            "</script>")


def contribution_view(
    maps: Any,
    tokens: Sequence[str],
    batch: int = 0,
    measure: str = "contribution",
    *,
    causal: bool = True,
    clip_quantile: float = 1.0,
    max_tokens: Optional[int] = None,
):
    """circuitsvis ``attention_heads`` view of one document's signed map.

    maps: ``ContributionMaps``; tokens: the document's token strings; measure: one of
    ``MEASURES``; the heads are followed by the token level (sum over heads). Red =
    positive, blue = negative, symmetric limits (see module doc). Returns a
    :class:`NotebookView` (a circuitsvis ``RenderedHTML`` that shares the JavaScript).
    """
    import circuitsvis as cv

    if not (callable(getattr(maps, "measure", None)) and callable(getattr(maps, "token_level", None))):
        raise TypeError(
            f"contribution_view takes ContributionMaps first, got {type(maps).__name__}: pass "
            "e.g. layer_maps(model, tokens)[layer] (or ContributionStats.maps(layer)), then the "
            "document's token strings (tls.token_strings(model, tokens[0]))"
        )
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(
            f"contribution_view: tokens are the document's token strings, got "
            f"{type(tokens).__name__}{' of ' + type(next(iter(tokens))).__name__ if not isinstance(tokens, str) and len(tokens) else ''}; "
            "pass e.g. tls.token_strings(model, tokens[0])"
        )
    if not 0 < clip_quantile <= 1:
        raise ValueError(f"clip_quantile must be in (0, 1], got {clip_quantile}")
    per_head = maps.measure(measure)[batch]  # [H, q, k]
    token = maps.token_level(measure)[batch]  # [1, q, k]
    m = torch.cat([per_head, token]).detach().float().cpu()
    n = len(tokens) if max_tokens is None else min(len(tokens), max_tokens)
    m = m[:, :n, :n]
    a = m.abs().flatten()
    lim = float(a.max()) if clip_quantile == 1 else float(torch.quantile(a, clip_quantile))
    lim = lim or 1.0
    # short badges ("H3", "Σ heads"): circuitsvis pins each at its thumbnail's top right, and
    # a long one ("contribution H3") ran past the thumbnail's left edge, clipped
    names = [f"H{h}" for h in range(per_head.shape[0])] + ["Σ heads"]
    return NotebookView(cv.attention.attention_heads(
        attention=m.clamp(-lim, lim), tokens=list(tokens[:n]), attention_head_names=names,
        max_value=lim, min_value=-lim, positive_color="red", negative_color="blue",
        mask_upper_tri=causal,
    ))
