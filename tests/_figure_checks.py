"""Legibility checks on a drawn matplotlib figure (used by tests/test_figure_legibility.py).

Rules (each returns a list of problems, empty when the figure passes):

- every visible text (titles, axis labels, tick labels, legend, colour-bar labels,
  annotations, figure texts) at least ``MIN_PT`` points at the figure's saved size;
- no backtick in any text (literal markdown);
- every axes that shows data and tick labels on an axis has a label on that axis, or (small
  multiples) an axes in the same column (x) / row (y) has it and shares that axis with it
  (heat maps: shows an image too); an axis without tick labels (a thumbnail) needs none,
  the figure's title says what it shows; every colour bar has a label; an axes without
  data (a legend or text panel) needs nothing;
- no two texts' bounding boxes overlap (ticks of one axis against each other excepted when
  equal; tick labels against the other texts, axis labels, titles, legend, colour-bar
  labels, annotations), measured with ``get_window_extent`` after ``canvas.draw()``;
- a legend does not cover plotted data (line vertices and points along their segments,
  scatter offsets, bar centres' tops and bottoms) of its own axes;
- no title or label breaks a line mid-word (a line ending in a fragment of at most three
  letters that is not a short word, followed by a lower-case line: "lay\\ner").
"""

from __future__ import annotations

import re

import numpy as np

MIN_PT = 8.0
#: short words a line may end with (a shorter fragment before a lower-case line: mid-word)
_SHORT_WORDS = {"a", "an", "the", "of", "on", "in", "to", "by", "vs", "per", "and", "or", "for",
                "at", "is", "all", "one", "two", "top", "key", "non", "max", "min", "sum", "ppl",
                "pod", "lag", "k", "i", "j", "h", "l", "n", "t"}


def _texts(fig):
    """Every visible, non-empty text artist of the figure (tick labels included; the drawn
    ones are picked by :func:`_drawn_tick_labels`)."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
            and (t.axes is None or t.axes.get_visible())]


def _tick_texts(fig):
    """Tick label text objects that will be drawn (their tick is in the view)."""
    ids = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for lab in (tick.label1, tick.label2):
                    ids.add(id(lab))
    return ids


def _drawn_tick_labels(fig):
    """Per axis, the tick labels actually drawn (matplotlib keeps spare Tick objects;
    ``Axis._update_ticks`` returns the ones inside the view, as ``draw`` uses them)."""
    out = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks = axis._update_ticks()
            for tick in ticks:
                for lab in (tick.label1, tick.label2):
                    if lab.get_visible() and lab.get_text().strip():
                        out.append(lab)
    return out


def _sibling_label(fig, ax, which: str, image: bool) -> bool:
    """Small multiples label the outer axes only: an x (y) label counts for ``ax`` when an
    axes in the same column (row) has one and shares that axis with ``ax`` (heat maps: shows
    an image too)."""
    from matplotlib.collections import QuadMesh
    from matplotlib.image import AxesImage

    p = ax.get_position()
    for o in fig.axes:
        if o is ax or not o.get_visible():
            continue
        q = o.get_position()
        same = abs(q.x0 - p.x0) < 0.02 if which == "x" else abs(q.y0 - p.y0) < 0.02
        if not same or not (o.get_xlabel() if which == "x" else o.get_ylabel()).strip():
            continue
        shared = (ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()).joined(ax, o)
        o_image = any(isinstance(m, (AxesImage, QuadMesh)) for m in o.images + o.collections)
        if shared or (image and o_image):
            return True
    return False


def figure_problems(fig, name: str = "") -> list[str]:
    from matplotlib.collections import PathCollection, QuadMesh
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    probs: list[str] = []
    tick_ids = _tick_texts(fig)
    drawn_ticks = _drawn_tick_labels(fig)
    drawn_tick_ids = {id(t) for t in drawn_ticks}
    texts = [t for t in _texts(fig) if id(t) not in tick_ids] + drawn_ticks
    # clipped-away texts (annotations outside their axes) are not drawn
    texts = [t for t in texts if t.get_window_extent(renderer).width > 0]
    for t in texts:
        s = t.get_text()
        if t.get_fontsize() < MIN_PT - 1e-6:
            probs.append(f"{name}: text {s[:40]!r} at {t.get_fontsize():.1f} pt < {MIN_PT}")
        if "`" in s:
            probs.append(f"{name}: backtick in {s[:60]!r}")
        lines = s.split("\n")
        for line, nxt in zip(lines, lines[1:]):
            frag = re.search(r"([A-Za-z]+)$", line)
            if frag and re.match(r"[a-z]", nxt) and len(frag.group(1)) <= 3 \
                    and frag.group(1).lower() not in _SHORT_WORDS:
                probs.append(f"{name}: line break mid-word {line[-20:]!r} | {nxt[:12]!r}")
    # overlaps
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            (a, ba), (b, bb) = boxes[i], boxes[j]
            if a.get_text() == b.get_text() and id(a) in drawn_tick_ids and id(b) in drawn_tick_ids:
                continue
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > 1.0 and h > 1.0:
                probs.append(f"{name}: texts overlap {a.get_text()[:30]!r} / {b.get_text()[:30]!r}"
                             f" ({w:.0f}×{h:.0f} px)")
    # axis labels
    cbar_axes = {id(getattr(getattr(m, "colorbar", None), "ax", None))
                 for ax in fig.axes for m in ax.images + ax.collections
                 if getattr(m, "colorbar", None) is not None}
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        has_image = any(isinstance(m, (AxesImage, QuadMesh)) for m in ax.images + ax.collections)
        has_data = has_image or bool(ax.lines or ax.collections or ax.patches)
        xl, yl = ax.get_xlabel().strip(), ax.get_ylabel().strip()
        title = ax.get_title().strip() or ax.get_title(loc="left").strip()
        where = f"{name}: axes {title[:40]!r}"
        if id(ax) in cbar_axes or ax.get_label() == "<colorbar>":
            if not (xl or yl):
                probs.append(f"{where}: colour bar without a label")
            continue
        if not has_data:
            continue
        def ticked(axis):
            return axis.get_visible() and any(t.get_text().strip() for t in axis.get_ticklabels())

        if not xl and ticked(ax.xaxis) and not _sibling_label(fig, ax, "x", has_image):
            probs.append(f"{where}: no x label")
        if not yl and ticked(ax.yaxis) and not _sibling_label(fig, ax, "y", has_image):
            probs.append(f"{where}: no y label")
        # legend over data
        leg = ax.get_legend()
        if leg is not None and leg.get_visible():
            lb = leg.get_window_extent(renderer)
            pts = []
            for ln in ax.lines:
                if isinstance(ln, Line2D) and ln.get_visible():
                    xy = ln.get_xydata()
                    if len(xy):  # the vertices and points along each segment
                        d = ax.transData.transform(np.asarray(xy, dtype=float))
                        if ln.get_linestyle() not in ("None", "", " ") and len(d) > 1:
                            f = np.linspace(0, 1, 12)[:, None, None]
                            d = (d[:-1][None] * (1 - f) + d[1:][None] * f).reshape(-1, 2)
                        pts.append(d)
            for c in ax.collections:
                if isinstance(c, PathCollection) and c.get_visible():
                    off = c.get_offsets()
                    if len(off):
                        pts.append(c.get_offset_transform().transform(np.asarray(off, dtype=float)))
            for p in ax.patches:
                if isinstance(p, Rectangle) and p.get_visible() and p.get_height() != 0:
                    bb = p.get_window_extent(renderer)
                    pts.append(np.array([[bb.x0 + bb.width / 2, bb.y1], [bb.x0 + bb.width / 2, bb.y0]]))
            if pts:
                P = np.concatenate(pts)
                P = P[np.isfinite(P).all(1)]
                inside = ((P[:, 0] > lb.x0 + 1) & (P[:, 0] < lb.x1 - 1)
                          & (P[:, 1] > lb.y0 + 1) & (P[:, 1] < lb.y1 - 1))
                if inside.any():
                    probs.append(f"{where}: the legend covers {int(inside.sum())} data points")
    return probs
