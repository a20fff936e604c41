"""Figures of every layer at once (small multiples), drawn ONCE per figure kind whatever the
depth: a 30-layer model gets one figure per kind, never 30 stacked figures.

Mosaics (:func:`mosaic_image`) put panels ``[rows, cols, h, w]`` into one image with a gap of
blank pixels between panels and draw it with a single ``imshow`` (one Axes, one colour
bar): the cost does not grow with the number of Axes. Colour scales are honest:

* bounded quantities on their full range (attention, shares on ``[0, 1]``; entropy on
  ``[0, log T]``);
* a data-range scale only with the range in the title (and never narrower than a stated
  noise floor, see :func:`data_range`).

Imports nothing of the library (results are duck-typed), so result classes and sections may
call these without an import cycle.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

#: smallest tick-label size (points) of the report's figures: ≥ 8 px at the report's dpi
TICK_PT = 8


def _np(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().cpu().double().numpy()
    return np.asarray(t, dtype=np.float64)


def mosaic_image(panels: np.ndarray, gap: int = 1) -> np.ndarray:
    """``[R, C, h, w]`` panels as one ``[R (h + gap) − gap, C (w + gap) − gap]`` image, NaN in
    the gaps (drawn blank)."""
    R, C, h, w = panels.shape
    out = np.full((R * (h + gap) - gap, C * (w + gap) - gap), np.nan)
    for r in range(R):
        for c in range(C):
            out[r * (h + gap):r * (h + gap) + h, c * (w + gap):c * (w + gap) + w] = panels[r, c]
    return out


def _panel_ticks(ax, n: int, size: int, gap: int, labels: Sequence[str], axis: str,
                 max_labels: int = 40) -> None:
    pos = [i * (size + gap) + (size - 1) / 2 for i in range(n)]
    step = max(1, math.ceil(n / max_labels))
    pos, labels = pos[::step], list(labels)[::step]
    if axis == "x":
        ax.set_xticks(pos, labels, fontsize=TICK_PT)
    else:
        ax.set_yticks(pos, labels, fontsize=TICK_PT)


def block_mean(a: np.ndarray, rows: int) -> np.ndarray:
    """Mean over blocks of the second-to-last axis so that it has at most ``rows`` entries."""
    n = a.shape[-2]
    if n <= rows:
        return a
    f = math.ceil(n / rows)
    pad = (-n) % f
    if pad:
        a = np.concatenate([a, np.repeat(a[..., -1:, :], pad, axis=-2)], axis=-2)
    return a.reshape(*a.shape[:-2], -1, f, a.shape[-1]).mean(-2)


def data_range(a: np.ndarray, noise: float = 0.0) -> tuple[float, float]:
    """``(lo, hi)`` of the finite values, widened symmetrically to at least ``noise`` (a data
    range is never stretched over a span smaller than the statistic's noise)."""
    v = a[np.isfinite(a)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    if hi - lo < noise:
        mid = 0.5 * (hi + lo)
        lo, hi = mid - noise / 2, mid + noise / 2
    if hi <= lo:
        hi = lo + 1e-12
    return lo, hi


def heads_by_layer(ax, values: np.ndarray, layers: Sequence[Any], title: str, *,
                   vmin: float, vmax: float, cmap: str = "viridis", cbar_label: str = "",
                   marks: Optional[np.ndarray] = None, mark_label: str = ""):
    """One heads-by-layer heat map ``values [layer, head]`` on ``[vmin, vmax]`` with its
    colour bar; ``marks`` (bool ``[layer, head]``) drawn as dots."""
    im = ax.imshow(values, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax,
                   interpolation="nearest")
    L, H = values.shape
    ax.set_xticks(range(H), [str(h) for h in range(H)] if H <= 32 else None, fontsize=TICK_PT)
    if H > 32:
        ax.set_xticks(range(0, H, math.ceil(H / 16)))
    step = max(1, math.ceil(L / 32))
    ax.set_yticks(range(0, L, step), [str(layers[i]) for i in range(0, L, step)],
                  fontsize=TICK_PT)
    ax.set_xlabel("head", fontsize=9)
    ax.set_ylabel("layer", fontsize=9)
    ax.set_title(title, fontsize=9)
    if marks is not None and marks.any():
        ys, xs = np.nonzero(marks)
        ax.scatter(xs, ys, s=10, c="cyan", edgecolors="black", linewidths=0.4,
                   label=mark_label)
    cb = ax.figure.colorbar(im, ax=ax, shrink=0.9, pad=0.02)
    cb.ax.tick_params(labelsize=TICK_PT)
    if cbar_label:
        cb.set_label(cbar_label, fontsize=8)
    return im


def heads_by_layer_figure(panels: Sequence[dict], layers: Sequence[Any], *, ncols: int = 3):
    """Several heads-by-layer maps side by side: each panel a dict with ``values`` ``[L, H]``,
    ``title``, ``vmin``, ``vmax`` and optional ``cmap``, ``cbar``, ``marks``, ``mark_label``.
    The height grows with the number of layers (about 0.22 in per layer, ≥ 3 in)."""
    import matplotlib.pyplot as plt

    n = len(panels)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    L = len(layers)
    H = panels[0]["values"].shape[1]
    h = max(2.8, 0.2 * L + 1.2)
    w = min(4.6, max(3.2, 0.32 * H + 1.8))
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    for ax, p in zip(axes.ravel(), panels):
        heads_by_layer(ax, np.asarray(p["values"], dtype=float), layers, p["title"],
                       vmin=p["vmin"], vmax=p["vmax"], cmap=p.get("cmap", "viridis"),
                       cbar_label=p.get("cbar", ""), marks=p.get("marks"),
                       mark_label=p.get("mark_label", ""))
        if p.get("marks") is not None and p["marks"].any() and p.get("mark_label"):
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.5 / h),
                      frameon=False)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.subplots_adjust(left=0.06, right=0.97, wspace=0.45, hspace=0.5,
                        bottom=max(0.08, 0.7 / h), top=1 - 0.45 / h)
    return fig


def mean_patterns_mosaic(mean_pattern: Any, layers: Sequence[Any], causal: bool = True,
                         max_pos: int = 64, floor: float = 1e-3):
    """Every layer's and head's mean attention pattern (first ``max_pos`` positions) in one
    mosaic: rows = layers, columns = heads, query ↓ key →, on a LOG colour scale over the full
    range ``[floor, 1]`` of a probability (values below the floor drawn at its colour)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    mp = _np(mean_pattern)[..., :max_pos, :max_pos]  # [L, H, q, k]
    L, H, n, _ = mp.shape
    if causal:
        mp = np.where(np.tril(np.ones((n, n), dtype=bool)), mp, np.nan)
    img = mosaic_image(np.clip(mp, floor, 1.0), gap=max(1, n // 16))
    gap = max(1, n // 16)
    px = 0.012  # inches per position: 64 positions ≈ 0.77 in per panel
    fig_w = min(11.5, H * (n + gap) * px + 2.0)
    fig_h = L * (n + gap) * px * (fig_w - 2.0) / (H * (n + gap) * px) + 1.2
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    im = ax.imshow(img, cmap="viridis", norm=LogNorm(vmin=floor, vmax=1.0),
                   interpolation="nearest", aspect="equal")
    _panel_ticks(ax, H, n, gap, [str(h) for h in range(H)], "x")
    _panel_ticks(ax, L, n, gap, [str(x) for x in layers], "y")
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("head (each panel: key position →)", fontsize=9)
    ax.set_ylabel("layer (each panel: query position ↓)", fontsize=9)
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    cb = fig.colorbar(im, ax=ax, shrink=min(0.9, 6 / fig_h + 0.2), pad=0.02, aspect=30)
    cb.set_label(f"mean α_ij (log scale, full range [{floor:g}, 1])", fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.subplots_adjust(left=0.08, right=0.92, top=1 - 0.7 / fig_h, bottom=0.2 / fig_h)
    return fig


def scale_energy_map(pod: Any):
    """Rows = layers: the scale energy ``E(a)`` of each layer divided by its maximum (full
    range [0, 1]) against the scale ``a`` (log axis), dominant scales as dots, the fixed band
    edges (a = 7, 20) as dotted lines. Beside it: the fraction of the largest scale's energy
    in the layer's peak (a layer whose energy still rises at the largest scale is marked)."""
    import matplotlib.pyplot as plt

    lays = list(pod.layers)
    s = _np(lays[0].scales)
    E = np.stack([_np(lay.scale_energy) for lay in lays])
    E = E / np.maximum(E.max(1, keepdims=True), 1e-300)
    L = len(lays)
    h = max(2.8, 0.2 * L + 1.3)
    fig, ax = plt.subplots(figsize=(7.5, h))
    edges = np.concatenate([[s[0] / math.sqrt(s[1] / s[0])], np.sqrt(s[1:] * s[:-1]),
                            [s[-1] * math.sqrt(s[-1] / s[-2])]]) if s.size > 1 else \
        np.array([s[0] * 0.9, s[0] * 1.1])
    mesh = ax.pcolormesh(edges, np.arange(L + 1) - 0.5, E, cmap="magma", vmin=0, vmax=1)
    ax.set_xscale("log")
    ax.invert_yaxis()
    for i, lay in enumerate(lays):
        for a in lay.dominant_scales:
            ax.plot(a, i, "o", ms=4, mfc="cyan", mec="black", mew=0.4)
        if E[i, -1] >= 0.999:
            ax.plot(s[-1], i, ">", ms=6, mfc="white", mec="red")
    for edge in (7.0, 20.0):
        ax.axvline(edge, color="0.75", ls=":", lw=1)
    step = max(1, math.ceil(L / 32))
    ax.set_yticks(range(0, L, step), [str(lays[i].layer) for i in range(0, L, step)],
                  fontsize=TICK_PT)
    ax.tick_params(axis="x", labelsize=TICK_PT)
    ax.set_xlabel("scale a (tokens, log)", fontsize=9)
    ax.set_ylabel("layer", fontsize=9)
    ax.set_title("scale energy E(a) / max per layer (dots: dominant scales; red ▷: still "
                 "rising at the largest scale)", fontsize=9)
    cb = fig.colorbar(mesh, ax=ax, pad=0.02)
    cb.set_label("E(a) / max E (full range [0, 1])", fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.subplots_adjust(left=0.1, right=0.95, top=1 - 0.5 / h, bottom=0.6 / h)
    return fig


def _energy_extent(profiles: np.ndarray, share: float = 0.99) -> int:
    """Smallest number of leading lags holding ``share`` of every row's energy (max over rows)."""
    e = np.cumsum(profiles, axis=-1)
    tot = np.maximum(e[..., -1:], 1e-300)
    return int(max(1, (np.argmax(e / tot >= share, axis=-1) + 1).max()))


def scalograms_mosaic(pod: Any, floor: float = 1e-3):
    """Every layer's scalogram ``E(a, τ)`` (divided by its maximum; log colour scale over
    ``[floor, 1]``) stacked: rows = layers, within a row the scale runs up (log-spaced grid)
    and the lag τ to the right, cut at the lag holding 99% of the energy of every layer."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    lays = list(pod.layers)
    E = np.stack([_np(lay.scalogram) for lay in lays])  # [L, S, lags]
    E = E / np.maximum(E.max((1, 2), keepdims=True), 1e-300)
    lags = _np(lays[0].lags)
    m = _energy_extent(E.sum(1))
    m = min(E.shape[-1], max(m, 8))
    E = E[..., :m][:, ::-1, :]  # scale increasing upward inside each row
    L, S, _ = E.shape
    img = mosaic_image(np.clip(E, floor, 1.0)[:, None], gap=1)
    h = max(3.0, min(16.0, L * (S + 1) * 0.02 + 1.2))
    fig, ax = plt.subplots(figsize=(9.0, h))
    im = ax.imshow(img, cmap="magma", norm=LogNorm(vmin=floor, vmax=1), aspect="auto",
                   interpolation="nearest", extent=(lags[0] - 0.5, lags[m - 1] + 0.5,
                                                    img.shape[0] - 0.5, -0.5))
    _panel_ticks(ax, L, S, 1, [str(lay.layer) for lay in lays], "y")
    ax.tick_params(axis="x", labelsize=TICK_PT)
    ax.set_xlabel("lag τ (tokens)", fontsize=9)
    ax.set_ylabel("layer (in each row the scale a runs up, "
                  f"{_np(lays[0].scales)[0]:.3g} to {_np(lays[0].scales)[-1]:.3g})", fontsize=8)
    ax.set_title(f"scalograms E(a, τ) / max, lags 0–{int(lags[m - 1])} (99% of the energy)",
                 fontsize=9)
    cb = fig.colorbar(im, ax=ax, pad=0.02)
    cb.set_label(f"E(a, τ) / max (log, full range [{floor:g}, 1])", fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.subplots_adjust(left=0.1, right=0.95, top=1 - 0.45 / h, bottom=0.55 / h)
    return fig


def spectra_overlay(pod: Any):
    """Every layer's POD eigen-spectrum of the whole field, ``λ_k / Σ λ`` against ``k``
    (log-log), coloured by layer, ``H*`` as a dot on each curve."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    lays = list(pod.layers)
    L = len(lays)
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    for i, lay in enumerate(lays):
        lam = _np(lay.full_eigenvalues)
        lam = lam[lam > 0]
        if lam.size == 0:
            continue
        share = lam / lam.sum()
        c = cmap(i / max(1, L - 1))
        k = np.arange(1, lam.size + 1)
        ax.loglog(k, share, "-", lw=1, color=c)
        H = lay.full.get("H_star")
        if isinstance(H, (int, float)) and 1 <= H <= lam.size:
            ax.plot(H, share[int(H) - 1], "o", ms=3.5, color=c, mec="black", mew=0.3)
    ax.set_xlabel("mode k (log)", fontsize=9)
    ax.set_ylabel("λ_k / Σλ (log)", fontsize=9)
    ax.tick_params(labelsize=TICK_PT)
    ax.set_title("POD eigen-spectra of the whole field, one line per layer (dot: H*)",
                 fontsize=9)
    sm = ScalarMappable(norm=Normalize(vmin=lays[0].layer, vmax=lays[-1].layer), cmap=cmap)
    cb = fig.colorbar(sm, ax=ax, pad=0.02)
    cb.set_label("layer", fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.tight_layout()
    return fig


def modes_mosaic(pod: Any, max_rows: int = 48, max_cols: int = 256):
    """The first POD mode of the whole field and of each band, every layer: rows = layers,
    columns = whole field, band 1, band 2, … (query ↓, lag →; each panel on its own
    symmetric scale ±max|mode|, red positive, blue negative), lags cut at 99% of the
    modes' energy, queries averaged in blocks to at most ``max_rows`` and lags to at most
    ``max_cols``. Returns None when no mode was kept (slim results). :func:`modes_panels`
    then :func:`modes_figure`."""
    return modes_figure(modes_panels(pod, max_rows, max_cols))


def modes_panels(pod: Any, max_rows: int = 48, max_cols: int = 256) -> Optional[dict]:
    """What :func:`modes_mosaic` draws, without drawing it: ``panels [layer, column, query
    block, lag block]`` (each panel divided by its max |mode|, NaN where a band has no mode),
    ``bands`` (the number of band columns), ``layers`` (the row labels), ``lags`` (the lags
    shown, from 0: the modes' 99% energy extent) and ``lag_block`` (lags averaged per
    column: 1 up to ``max_cols`` lags; a panel wider than a figure's pixels only adds bytes
    to the report's state); None when no mode was kept."""
    lays = list(pod.layers)
    nb = max(len(lay.bands) for lay in lays)
    cols = 1 + nb
    mats = []
    for lay in lays:
        row = []
        ms = [lay.full_modes] + [lay.band_modes[str(b["band"])] for b in lay.bands]
        lg = [_np(lay.lags)] + [_np(lay.band_lags[str(b["band"])]) for b in lay.bands]
        for m, lags in zip(ms, lg):
            if m.shape[0] == 0:
                row.append(None)
                continue
            a = _np(m[0])  # [T, n_lags]
            full = np.zeros((a.shape[0], len(_np(lay.lags))))
            idx = np.searchsorted(_np(lay.lags), lags)
            full[:, idx] = a
            row.append(full)
        row += [None] * (cols - len(row))
        mats.append(row)
    if all(x is None for r in mats for x in r):
        return None
    any_m = next(x for r in mats for x in r if x is not None)
    prof = np.stack([np.abs(x).sum(0) if x is not None else np.zeros(any_m.shape[1])
                     for r in mats for x in r])
    m = min(any_m.shape[1], max(8, _energy_extent(prof ** 2)))
    T = block_mean(any_m, max_rows).shape[0]
    step = max(1, math.ceil(m / max_cols))
    panels = np.full((len(lays), cols, T, math.ceil(m / step)), np.nan)
    for i, r in enumerate(mats):
        for j, x in enumerate(r):
            if x is None:
                continue
            b = block_mean(block_mean(x, max_rows)[:, :m].T, max_cols).T
            v = np.abs(b).max() or 1.0
            panels[i, j] = b / v
    return {"panels": panels, "bands": nb, "layers": [str(lay.layer) for lay in lays],
            "lags": int(m), "lag_block": int(step)}


def modes_figure(data: Optional[dict]):
    """The mosaic of :func:`modes_mosaic` from :func:`modes_panels`' data (None: None)."""
    import matplotlib.pyplot as plt

    if data is None:
        return None
    panels = np.asarray(data["panels"], dtype=np.float64)
    nb = int(data["bands"])
    L, cols, T, m = panels.shape
    img = mosaic_image(panels, gap=2)
    fig_w = min(11.0, 1.6 + cols * 2.4)
    # at least 0.22 in per layer (a label of 8 pt each, whatever the depth)
    fig_h = max(3.0, min(24.0, max(0.22 * L + 1.6,
                                   L * (T + 2) * (fig_w - 1.6) / (cols * (m + 2)) / 90 * 0.6
                                   + 1.4)))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    im = ax.imshow(img, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    _panel_ticks(ax, cols, m, 2, ["whole field"] + [f"band {k + 1}" for k in range(nb)], "x")
    _panel_ticks(ax, L, T, 2, list(data["layers"]), "y")
    ax.xaxis.set_ticks_position("top")
    ax.tick_params(length=0)
    ax.set_ylabel("layer (each panel: query ↓)", fontsize=9)
    ax.xaxis.set_label_position("top")
    lags, step = int(data.get("lags", m)), int(data.get("lag_block", 1))
    per = "" if step == 1 else f", {step} lags per column"
    ax.set_xlabel(f"whole field or band (each panel: lag 0–{lags - 1} →{per})", fontsize=9)
    ax.set_title("first POD mode per band (each panel on its own scale ±max)", fontsize=9,
                 pad=8)
    cb = fig.colorbar(im, ax=ax, pad=0.02, shrink=min(0.9, 5 / fig_h + 0.2))
    cb.set_label("mode / max |mode| (full range [−1, 1])", fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.subplots_adjust(left=0.1, right=0.94, top=1 - 0.75 / fig_h, bottom=0.25 / fig_h)
    return fig


def coherence_map(pod: Any):
    """Rows = layers: the mean off-diagonal cross-coherence ``γ_ij(a)`` (i ≠ j) against the
    scale ``a`` (log axis, full range [0, 1]). Returns None when no layer has coherence."""
    lays = [lay for lay in pod.layers if lay.coherence is not None]
    if not lays:
        return None
    rows = []
    for lay in lays:
        g = _np(lay.coherence)  # [S, Q, Q]
        Q = g.shape[-1]
        rows.append(g[:, ~np.eye(Q, dtype=bool)].mean(-1) if Q > 1 else np.zeros(g.shape[0]))
    C = np.stack(rows)
    s = _np(lays[0].scales)
    edges = np.concatenate([[s[0] / math.sqrt(s[1] / s[0])], np.sqrt(s[1:] * s[:-1]),
                            [s[-1] * math.sqrt(s[-1] / s[-2])]]) if s.size > 1 else \
        np.array([s[0] * 0.9, s[0] * 1.1])
    return layer_log_mesh(edges, C, [str(lay.layer) for lay in lays], cmap="viridis",
                          xlabel="scale a (tokens, log)",
                          title="mean cross-coherence γ_ij(a) between different queries (i ≠ j)",
                          cbar_label="mean γ (full range [0, 1])")


def layer_log_mesh(edges: Any, values: Any, layer_labels: list[str], *, cmap: str, xlabel: str,
                   title: str, cbar_label: str, vmin: float = 0.0, vmax: float = 1.0):
    """Layers (rows, top to bottom) × a log-scaled axis (cell ``edges``) heat map of a
    quantity on ``[vmin, vmax]`` (default the full range [0, 1]), with its colour bar; one
    row per layer."""
    import matplotlib.pyplot as plt
    import numpy as np

    L = len(layer_labels)
    h = max(2.8, 0.2 * L + 1.3)
    fig, ax = plt.subplots(figsize=(7.5, h))
    mesh = ax.pcolormesh(edges, np.arange(L + 1) - 0.5, values, cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xscale("log")
    ax.invert_yaxis()
    step = max(1, math.ceil(L / 32))
    ax.set_yticks(range(0, L, step), layer_labels[::step], fontsize=TICK_PT)
    ax.tick_params(axis="x", labelsize=TICK_PT)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("layer", fontsize=9)
    ax.set_title(title, fontsize=9)
    cb = fig.colorbar(mesh, ax=ax, pad=0.02)
    cb.set_label(cbar_label, fontsize=8)
    cb.ax.tick_params(labelsize=TICK_PT)
    fig.subplots_adjust(left=0.1, right=0.95, top=1 - 0.45 / h, bottom=0.6 / h)
    return fig
