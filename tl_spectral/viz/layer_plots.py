"""Layer axes that stay legible at any depth, and the model's local / global layers.

* :func:`layer_kinds`: per layer ``"local"`` (sliding-window attention) or ``"global"``
  (full attention), read from the model's configuration (``layer_types`` as Gemma-2/3 and
  Hugging Face declare them, or ``sliding_window`` with a pattern); None for a model whose
  layers all attend alike.
* :func:`layer_ticks`: which layers get a tick label (every layer up to
  ``MAX_LAYER_LABELS``, then a step of 2, 5, … so labels never run together; global
  layers always labelled) and their texts (a global layer as ``"5 G"``).
* :func:`set_layer_axis`: applies both to a matplotlib axis (global layers' labels bold).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

#: up to this many layers every layer gets a tick label (and per-point annotations)
MAX_LAYER_LABELS = 12
#: a global layer's tick label suffix, and the note that explains it
GLOBAL_MARK = "G"
GLOBAL_NOTE = "G: global (full) attention; the other layers attend within a sliding window"


def _config_of(model: Any) -> list:
    """Objects that may carry the layer types: a ModelView's model, its TransformerLens cfg,
    the Hugging Face config of a TransformerBridge."""
    out = []
    m = getattr(model, "model", model)  # ModelView -> model
    for obj in (model, m, getattr(m, "cfg", None),
                getattr(getattr(m, "original_model", None), "config", None),
                getattr(m, "config", None)):
        if obj is not None:
            out.append(obj)
    return out


def layer_kinds(model: Any) -> Optional[list[str]]:
    """Per layer ``"local"`` or ``"global"`` when the model mixes sliding-window and full
    attention (``layer_types`` of its configuration: ``"sliding_attention"`` /
    ``"full_attention"``, Gemma-2/3's convention); None when every layer attends alike or
    the configuration does not say."""
    for obj in _config_of(model):
        types = getattr(obj, "layer_types", None)
        if isinstance(types, (list, tuple)) and types:
            kinds = ["local" if "slid" in str(t) or "local" in str(t) else "global"
                     for t in types]
            return kinds if len(set(kinds)) > 1 else None
    return None


def sliding_window(model: Any) -> Optional[int]:
    """The sliding window (tokens) of the local layers, when the configuration gives one."""
    for obj in _config_of(model):
        w = getattr(obj, "sliding_window", None) or getattr(obj, "window_size", None)
        if isinstance(w, int) and w > 0:
            return w
    return None


def kinds_note(model: Any) -> str:
    """A sentence naming the global layers (empty for a model without layer kinds)."""
    kinds = layer_kinds(model)
    if not kinds:
        return ""
    g = [i for i, k in enumerate(kinds) if k == "global"]
    w = sliding_window(model)
    return (f"Layers {', '.join(map(str, g))} attend globally (full attention, marked "
            f"{GLOBAL_MARK} in figures, 'global' in tables); the other {len(kinds) - len(g)} "
            f"attend within a sliding window" + (f" of {w} tokens" if w else "") + ".")


def layer_ticks(layers: Sequence[int], kinds: Optional[Sequence[str]] = None,
                max_labels: int = MAX_LAYER_LABELS) -> tuple[list[int], list[str]]:
    """(positions, texts) of the layer ticks of an axis with one slot per entry of
    ``layers``: every slot up to ``max_labels`` slots, else every ``step``-th (step 2, 5, 10,
    … so that at most ``max_labels`` regular labels remain) plus every global layer;
    ``kinds`` (per layer index, :func:`layer_kinds`) marks global layers ``"5 G"``."""
    n = len(layers)
    step = 1
    for s in (1, 2, 5, 10, 20, 50, 100):
        step = s
        if n <= max_labels * s:
            break
    def is_global(i: int) -> bool:
        lay = _int(str(layers[i]))
        return bool(kinds) and lay is not None and 0 <= lay < len(kinds) \
            and kinds[lay] == "global"

    pos = [i for i in range(n) if i % step == 0 or is_global(i)]
    if step > 1:  # a regular label that would touch a global one's is dropped
        glob = {i for i in pos if is_global(i)}
        pos = [i for i in pos if i in glob or not any(0 < abs(i - g) < step for g in glob)]
    texts = [f"{layers[i]} {GLOBAL_MARK}" if is_global(i) else str(layers[i]) for i in pos]
    return pos, texts


def set_layer_axis(ax: Any, layers: Sequence[int], kinds: Optional[Sequence[str]] = None,
                   axis: str = "x", label: Optional[str] = "layer",
                   offset: float = 0.0) -> None:
    """Layer ticks (:func:`layer_ticks`) on ``ax``'s ``axis`` (slot ``i`` at ``i + offset``),
    global layers' labels in bold, and the axis label (with the G note when marked)."""
    pos, texts = layer_ticks(layers, kinds)
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter([p + offset for p in pos])
    (ax.set_xticklabels if axis == "x" else ax.set_yticklabels)(texts)
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    for t in ticks:
        if t.get_text().endswith(GLOBAL_MARK):
            t.set_fontweight("bold")
    if label is not None:
        marked = any(t.endswith(GLOBAL_MARK) for t in texts)
        text = label + (f" ({GLOBAL_MARK} = global)" if marked else "")
        (ax.set_xlabel if axis == "x" else ax.set_ylabel)(text)


def mark_rows(rows: list[dict], kinds: Optional[Sequence[str]], key: str = "layer") -> list[dict]:
    """``rows`` with an ``attention`` column (``"local"`` / ``"global"``) after ``key`` for a
    model with layer kinds (unchanged otherwise)."""
    if not kinds:
        return rows
    out = []
    for r in rows:
        new: dict = {}
        for k, v in r.items():
            new[k] = v
            if k == key:
                lay = int(v)
                new["attention"] = kinds[lay] if 0 <= lay < len(kinds) else ""
        out.append(new)
    return out


def _int(text: str) -> Optional[int]:
    text = text.replace("−", "-").strip()
    return int(text) if text.lstrip("-").isdigit() else None


def mark_layer_axes(fig: Any, kinds: Optional[Sequence[str]]) -> None:
    """Mark the global layers on every layer axis of a drawn figure (an axis whose label
    starts with "layer" and whose tick labels are layer numbers): their ticks added where
    thinning dropped them (positions from the existing ticks' linear map), labelled
    ``"5 G"`` in bold, neighbouring regular labels that would touch them dropped, and
    ``(G = global)`` added to the axis label. No-op without ``kinds``."""
    if not kinds or "global" not in kinds:
        return
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.get_label_text()
            if not label.lower().startswith("layer") or GLOBAL_MARK + " = global" in label:
                continue
            # a colour bar (a per-layer line key) keeps its short label: beside a panel
            # a longer one would run into the next panel's
            _mark_axis(axis, kinds, note=ax.get_label() != "<colorbar>")


def _mark_axis(axis: Any, kinds: Sequence[str], note: bool = True) -> None:
    locs = list(axis.get_majorticklocs())
    labs = axis.get_ticklabels()
    pairs = [(float(p), _int(t.get_text())) for p, t in zip(locs, labs)]
    pairs = [(p, lay) for p, lay in pairs if lay is not None]
    if len(pairs) < 2 or len({lay for _, lay in pairs}) < 2:
        return
    (p0, l0), (p1, l1) = pairs[0], pairs[-1]
    b = (p1 - p0) / (l1 - l0)
    a = p0 - b * l0
    size = labs[0].get_fontsize() if labs else None
    shown = sorted({lay for _, lay in pairs})
    step = min(y - x for x, y in zip(shown, shown[1:])) if len(shown) > 1 else 1
    lo, hi = min(shown), max(shown) + step - 1
    glob = [i for i, k in enumerate(kinds) if k == "global" and lo <= i <= min(hi, len(kinds) - 1)]
    keep = [lay for lay in shown
            if lay in glob or not any(0 < abs(lay - g) < max(step, 2) for g in glob)] \
        if step > 1 else shown
    layers = sorted(set(keep) | set(glob))
    axis.set_ticks([a + b * lay for lay in layers])
    axis.set_ticklabels([f"{lay} {GLOBAL_MARK}" if lay in glob else str(lay) for lay in layers],
                        **({"fontsize": size} if size else {}))
    for t in axis.get_ticklabels():
        if t.get_text().endswith(GLOBAL_MARK):
            t.set_fontweight("bold")
    if note:
        axis.set_label_text(axis.get_label_text() + f" ({GLOBAL_MARK} = global)")
