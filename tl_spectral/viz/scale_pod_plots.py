"""Plots of the scale-selective POD (``tl_spectral.analysis.scale_pod`` / ``.pod``).

Every function takes a result (:class:`~tl_spectral.analysis.pod.PODResult`,
:class:`~tl_spectral.analysis.scale_pod.ScalePODLayer` or
:class:`~tl_spectral.analysis.scale_pod.ScalePODResult`) and returns a matplotlib
``Figure``. ``matplotlib.pyplot`` is imported inside each function (Agg-safe).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from tl_spectral.viz.figures import layer_key, layer_style, register_plot

__all__ = [
    "plot_band_modes",
    "plot_coherence",
    "plot_eigen_spectrum",
    "plot_layer_spectra",
    "plot_mode_profiles",
    "plot_scale_energies",
    "plot_scale_energy",
    "plot_scalogram",
    "plot_tspec_hstar",
]

_BAND_EDGES = (7.0, 20.0)  # fixed bands: fine a <= 7, medium 7 < a < 20, coarse a >= 20


def _new_axes(ax: Any, figsize: tuple[float, float]):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    else:
        fig = ax.figure
    return fig, ax


def _scale_ticks(ax: Any, values: Any, axis: str = "x") -> None:
    """Plain-number ticks (1, 2, 5 × 10^k) on a log scale axis spanning ``values``: no
    crowded minor labels such as ``2×10⁰ 3×10⁰ 4×10⁰`` on a short range."""
    from matplotlib.ticker import NullFormatter

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return
    lo, hi = float(v.min()), float(v.max())
    cand = [m * 10.0 ** e for e in range(int(np.floor(np.log10(lo))) - 1,
                                         int(np.ceil(np.log10(hi))) + 1) for m in (1, 2, 5)]
    ticks = [t for t in cand if lo * 0.999 <= t <= hi * 1.001]
    if len(ticks) < 2:
        ticks = sorted({lo, hi})
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_minor_formatter(NullFormatter())
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, [f"{t:.3g}" for t in ticks])


def _lag_extent(mode: np.ndarray, lags: np.ndarray, share: float = 0.02) -> tuple[float, float]:
    """Lag range where a mode ``[T, L]`` (or profile ``[L]``) holds any entry above
    ``share`` of its largest |entry|, padded by two lags: the part worth drawing."""
    a = np.abs(mode).reshape(-1, mode.shape[-1]).max(0)
    big = np.nonzero(a > share * (a.max() or 1.0))[0]
    if big.size == 0:
        return float(lags[0]) - 0.5, float(lags[-1]) + 0.5
    i0, i1 = max(0, int(big[0]) - 2), min(len(lags) - 1, int(big[-1]) + 2)
    return float(lags[i0]) - 0.5, float(lags[i1]) + 0.5


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _spectrum_on(ax, lam: np.ndarray, summary: dict, label: str, color=None) -> None:
    lam = lam[lam > 0]
    k = np.arange(1, lam.size + 1)
    line = ax.loglog(k, lam, ".", ms=3, color=color, label=label)[0]
    beta, n_fit = summary.get("beta"), int(summary.get("tspec_n_fit", 0))
    if beta is not None and math.isfinite(beta) and n_fit >= 2:
        kk = np.arange(1, n_fit + 1, dtype=float)
        c = np.mean(np.log(lam[:n_fit]) + beta * np.log(kk))
        ax.loglog(kk, np.exp(c - beta * np.log(kk)), "-", lw=1, color=line.get_color(), alpha=0.8)
    H = summary.get("H_star")
    if H is not None and H <= lam.size:
        ax.axvline(H, color=line.get_color(), ls=":", lw=0.8)


def plot_eigen_spectrum(result: Any, *, ax: Any = None):
    """POD eigenvalues ``lambda_k`` vs ``k`` (log-log) with the power-law fit over the modes
    holding 99% of the energy and ``H*`` marked (dotted).

    Args:
        result: a :class:`PODResult`.
        ax: an existing Axes (optional).
    """
    fig, ax = _new_axes(ax, (4.5, 3.5))
    s = result.headline()
    _spectrum_on(
        ax,
        _np(result.eigenvalues),
        s,
        f"T_spec={s['T_spec']:.3g} (R²={s['tspec_r2']:.2f}), H*={s['H_star_str']}",
    )
    ax.set_xlabel("mode k")
    ax.set_ylabel("eigenvalue λ_k")
    ax.set_title("POD spectrum")
    ax.legend(fontsize=8)
    return fig


def plot_scalogram(layer: Any, *, ax: Any = None, log: bool = True):
    """Scalogram ``E(a, tau)`` (scale vs lag) of one layer, dominant scales marked.

    Args:
        layer: a :class:`ScalePODLayer`.
        ax: an existing Axes (optional).
        log: colour on a log scale (default).
    """
    from matplotlib.colors import LogNorm

    fig, ax = _new_axes(ax, (5.5, 3.8))
    E = _np(layer.scalogram)
    lags = _np(layer.lags)
    s = _np(layer.scales)
    pos = E[E > 0]
    norm = (
        LogNorm(vmin=max(pos.max() * 1e-4, pos.min()), vmax=pos.max()) if log and pos.size else None
    )
    mesh = ax.pcolormesh(
        lags,
        s,
        np.where(E > 0, E, np.nan) if log else E,
        shading="nearest",
        norm=norm,
        cmap="magma",
    )
    ax.set_yscale("log")
    for a in layer.dominant_scales:
        ax.axhline(a, color="c", ls="--", lw=0.8)
    ax.set_xlabel("lag τ")
    ax.set_ylabel("scale a (tokens)")
    ax.set_title(f"layer {layer.layer}: scalogram E(a, τ)")
    _scale_ticks(ax, s, "y")
    fig.colorbar(mesh, ax=ax, label="energy E(a, τ)" + (" (log colour)" if norm else ""))
    return fig


def plot_scale_energy(layer: Any, *, ax: Any = None, normalize: bool = True):
    """Scale energy ``E(a)`` of one layer, with the dominant scales and the fixed band edges
    (``a = 7``, ``a = 20``) marked.

    Args:
        layer: a :class:`ScalePODLayer`.
        ax: an existing Axes (optional).
        normalize: divide by ``max E(a)``.
    """
    fig, ax = _new_axes(ax, (4.8, 3.4))
    s, E = _np(layer.scales), _np(layer.scale_energy)
    if normalize and E.max() > 0:
        E = E / E.max()
    ax.semilogx(s, E, "-", color="k", lw=1.2)
    for a in layer.dominant_scales:
        ax.axvline(a, color="tab:red", ls="--", lw=1)
        ax.annotate(
            f"a*={a:.1f}",
            (a, 1.0 if normalize else E.max()),
            fontsize=8,
            color="tab:red",
            rotation=90,
            va="top",
            ha="right",
        )
    for edge in _BAND_EDGES:
        ax.axvline(edge, color="0.6", ls=":", lw=1)
    be = layer.band_energy
    ax.set_title(
        f"layer {layer.layer}: E(a)  fine {be['fine']:.2f} · medium "
        f"{be['medium']:.2f} · coarse {be['coarse']:.2f}",
        fontsize=9,
    )
    ax.set_xlabel("scale a (tokens)")
    ax.set_ylabel("E(a)" + (" / max" if normalize else ""))
    ax.set_ylim(0, 1.05 * (1.0 if normalize else max(float(E.max()), 1e-300)))  # zero baseline
    _scale_ticks(ax, s)
    return fig


def plot_scale_energies(result: Any, *, ax: Any = None):
    """``E(a) / max E(a)`` of every layer on one axis (fixed band edges dotted).

    Args:
        result: a :class:`ScalePODResult`.
        ax: an existing Axes (optional).
    """
    import matplotlib.pyplot as plt

    fig, ax = _new_axes(ax, (5.0, 3.5))
    cmap = plt.get_cmap("viridis")
    n = max(1, result.n_layers - 1)
    for i, layer in enumerate(result.layers):
        E = _np(layer.scale_energy)
        ax.semilogx(
            _np(layer.scales),
            E / max(E.max(), 1e-300),
            color=cmap(i / n),
            label=f"layer {layer.layer}",
        )
    for edge in _BAND_EDGES:
        ax.axvline(edge, color="0.6", ls=":", lw=1)
    ax.set_xlabel("scale a (tokens)")
    ax.set_ylabel("E(a) / max")
    ax.set_ylim(0, 1.05)
    _scale_ticks(ax, np.concatenate([_np(lay.scales) for lay in result.layers]))
    layer_key(ax, [lay.layer for lay in result.layers])
    ax.set_title("scale energy by layer")
    return fig


def plot_layer_spectra(layer: Any, *, ax: Any = None):
    """POD eigen-spectra (log-log) of one layer: whole field and each band, with the
    power-law fits (solid) and ``H*`` (dotted).

    Args:
        layer: a :class:`ScalePODLayer`.
        ax: an existing Axes (optional).
    """
    fig, ax = _new_axes(ax, (5.0, 3.8))
    f = layer.full
    _spectrum_on(
        ax,
        _np(layer.full_eigenvalues),
        f,
        f"field: T_spec={f['T_spec']:.3g}, H*={f['H_star_str']}",
        color="k",
    )
    for b in layer.bands:
        lam = _np(layer.band_eigenvalues[str(b["band"])])
        _spectrum_on(
            ax, lam, b, f"a*={b['scale']:.1f}: T_spec={b['T_spec']:.3g}, H*={b['H_star_str']}"
        )
    ax.set_xlabel("mode k")
    ax.set_ylabel("eigenvalue λ_k")
    ax.set_title(f"layer {layer.layer}: POD spectra")
    ax.legend(fontsize=8)
    return fig


def _band_list(layer: Any) -> list[tuple[str, Any, np.ndarray, str]]:
    out = [("field", layer.full_modes, _np(layer.lags), "whole field")]
    for b in layer.bands:
        k = str(b["band"])
        out.append((k, layer.band_modes[k], _np(layer.band_lags[k]), f"a*={b['scale']:.1f}"))
    return out


def plot_band_modes(layer: Any, *, n_modes: int = 3, include_full: bool = True):
    """First POD modes of each band as ``(query, lag)`` images (rows: bands, columns: modes).

    Args:
        layer: a :class:`ScalePODLayer`.
        n_modes: modes per band.
        include_full: add a first row with the whole-field modes.
    """
    import matplotlib.pyplot as plt

    rows = _band_list(layer)[(0 if include_full else 1) :]
    if not rows:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "no dominant scale", ha="center", va="center")
        ax.axis("off")
        return fig
    fig, axes = plt.subplots(
        len(rows), n_modes, figsize=(3.1 * n_modes + 0.8, 2.4 * len(rows) + 0.4), squeeze=False,
        constrained_layout=True,
    )
    im = None
    for r, (_, modes, lags, title) in enumerate(rows):
        for c in range(n_modes):
            ax = axes[r, c]
            if c >= modes.shape[0]:
                ax.axis("off")
                continue
            m = _np(modes[c])  # [T, L]
            v = np.abs(m).max() or 1.0
            im = ax.imshow(
                m / v,  # each mode over its largest |entry|: one colour bar for the figure
                aspect="auto",
                origin="lower",
                cmap="RdBu_r",
                vmin=-1.0,
                vmax=1.0,
                extent=(lags[0] - 0.5, lags[-1] + 0.5, -0.5, m.shape[0] - 0.5),
                interpolation="nearest",
            )
            ax.set_xlim(*_lag_extent(m, lags))  # the lags where the mode lives
            ax.tick_params(labelsize=8)
            ax.set_title(f"{title} · mode {c + 1}", fontsize=8)
            if c == 0:
                ax.set_ylabel("query i")
            if r == len(rows) - 1:
                ax.set_xlabel("lag τ")
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.9)
        cb.set_label("amplitude / max |amplitude| of the mode", fontsize=9)
    fig.suptitle(f"layer {layer.layer}: POD modes (query × lag)", fontsize=10)
    return fig


def plot_mode_profiles(layer: Any, *, n_modes: int = 3, include_full: bool = False):
    """First POD modes of each band as mean lag profiles (mean over queries): one panel per
    band.

    Args:
        layer: a :class:`ScalePODLayer`.
        n_modes: modes per band.
        include_full: add a panel with the whole-field modes.
    """
    import matplotlib.pyplot as plt

    rows = _band_list(layer)[(0 if include_full else 1) :]
    if not rows:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "no dominant scale", ha="center", va="center")
        ax.axis("off")
        return fig
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.0), squeeze=False,
                             sharey=True)
    for ax, (_, modes, lags, title) in zip(axes[0], rows):
        prof = [_np(modes[c]).mean(0) for c in range(min(n_modes, modes.shape[0]))]
        for c, p in enumerate(prof):
            ax.plot(lags, p, label=f"mode {c + 1}")
        if prof:
            ax.set_xlim(*_lag_extent(np.stack(prof), np.asarray(lags)))
        ax.axhline(0, color="0.7", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("lag τ")
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("mean over queries")
    fig.suptitle(f"layer {layer.layer}: mode lag profiles", fontsize=10)
    fig.tight_layout()
    return fig


def plot_coherence(layer: Any, *, scales: list[float] | None = None):
    """Cross-coherence maps ``gamma_ij(a)`` (query × query) at the dominant scales (or the
    given ``scales``, nearest grid point), plus the mean off-diagonal coherence vs scale.

    Args:
        layer: a :class:`ScalePODLayer` with ``coherence`` computed.
        scales: scales to show (default: the dominant scales, else 3 spread over the grid).
    """
    import matplotlib.pyplot as plt

    if layer.coherence is None:
        raise ValueError("this layer has no coherence; run scale_pod_layer(coherence_queries=16)")
    g = _np(layer.coherence)  # [S, Q, Q]
    s = _np(layer.scales)
    q = _np(layer.coherence_queries).astype(int)
    want = (
        list(scales) if scales else (list(layer.dominant_scales) or [s[0], s[len(s) // 2], s[-1]])
    )
    idx = [int(np.argmin(np.abs(np.log(s / a)))) for a in want]
    fig, axes = plt.subplots(1, len(idx) + 1, figsize=(3.2 * (len(idx) + 1), 3.0), squeeze=False)
    for ax, i in zip(axes[0], idx):
        im = ax.imshow(g[i], vmin=0, vmax=1, cmap="viridis", origin="lower")
        ticks = np.arange(len(q))[:: max(1, len(q) // 4)]
        ax.set_xticks(ticks)
        ax.set_xticklabels(q[ticks])
        ax.set_yticks(ticks)
        ax.set_yticklabels(q[ticks])
        ax.set_title(f"γ(a={s[i]:.1f})", fontsize=9)
        ax.set_xlabel("query j")
    axes[0, 0].set_ylabel("query i")
    fig.colorbar(im, ax=axes[0, len(idx) - 1], label="coherence γ")
    ax = axes[0, -1]
    Q = g.shape[-1]
    off = g[:, ~np.eye(Q, dtype=bool)].mean(-1) if Q > 1 else np.zeros(len(s))
    ax.semilogx(s, off, color="k")
    _scale_ticks(ax, s)
    ax.set_ylim(0, 1)
    ax.set_xlabel("scale a")
    ax.set_ylabel("mean γ (i ≠ j)")
    fig.suptitle(f"layer {layer.layer}: cross-coherence", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tspec_hstar(result: Any, layer_kinds: Any = None):
    """``T_spec`` and ``H*`` across layers, beside the head allocation (recommended vs
    uniform). ``H*`` values bounded by the number of documents
    (:func:`~tl_spectral.analysis.scale_pod.h_star_bounded`) are drawn hollow and grey, with
    the bound as a dashed line; their ``T_spec`` grey too. The ∝ H* bars are drawn only
    when no layer is bounded (else the figure says why there is no advice). Up to
    ``MAX_LAYER_LABELS`` layers every point carries its fit's R²; deeper models get thinned
    layer ticks and the R² in the table.

    Args:
        result: a :class:`ScalePODResult`.
        layer_kinds: per layer "local"/"global" (global layers marked G), or None.
    """
    import matplotlib.pyplot as plt

    from tl_spectral.viz.layer_plots import MAX_LAYER_LABELS, set_layer_axis

    layers = [lay.layer for lay in result.layers]
    L = len(layers)
    x = np.arange(L)
    # the library's rule, carried by the allocation rows (a result saved before it: the
    # saturation flag)
    bounded = np.array([bool(row.get("bounded", row["saturated"])) for row in result.allocation],
                       dtype=bool)
    fig, axes = plt.subplots(1, 3, figsize=(max(12.5, 0.3 * L + 6), 3.6))
    ts = np.array([lay.T_spec for lay in result.layers], dtype=float)
    r2 = [lay.full["tspec_r2"] for lay in result.layers]
    ax = axes[0]
    ax.plot(x, ts, "-", color="tab:blue", zorder=2)
    if (~bounded).any():  # (no legend entry for points that are not there)
        ax.scatter(x[~bounded], ts[~bounded], color="tab:blue", zorder=3, label="whole field")
    if bounded.any():
        ax.scatter(x[bounded], ts[bounded], facecolors="none", edgecolors="0.55", zorder=3,
                   label="whole field, H* bounded by N")
    if L <= MAX_LAYER_LABELS:
        for xi, t, r in zip(x, ts, r2):
            if math.isfinite(t):  # the last label to the left of its point (clear of the bar)
                ax.annotate(
                    f"R²={r:.2f}", (xi, t), fontsize=8, textcoords="offset points",
                    xytext=(-30, 5) if xi == x[-1] else (2, 4),
                )
    # band values are markers only: band b of one layer and band b of the next are at
    # different scales, so no line joins them; the colour gives the band's scale a*
    bx, by, bs = [], [], []
    for xi, lay in zip(x, result.layers):
        for b in lay.bands:
            if math.isfinite(float(b["T_spec"])):
                bx.append(xi)
                by.append(float(b["T_spec"]))
                bs.append(float(b["scale"]))
    if bx:
        from matplotlib.colors import LogNorm

        sc = ax.scatter(bx, by, c=bs, cmap="plasma", marker="s", s=18, zorder=3,
                        norm=LogNorm(vmin=min(bs), vmax=max(max(bs), min(bs) * 1.01)),
                        label="band (colour: scale a*)")
        cb = fig.colorbar(sc, ax=ax, fraction=0.06, pad=0.02)
        cb.set_label("band scale a* (tokens)", fontsize=8)
        cb.ax.tick_params(labelsize=8)
    ax.set_title("spectral concentration T_spec = 1/β", fontsize=9)
    ax.set_ylabel("T_spec")
    _hstar_panel(axes[1], result, x, bounded)
    _heads_panel(axes[2], result, x, bounded)
    for a in axes:
        set_layer_axis(a, layers, layer_kinds)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _hstar_panel(ax: Any, result: Any, x: Any, bounded: Any) -> None:
    """H* per layer: resolved values filled green, bounded ones hollow grey, the bound and
    the N − 1 modes as lines."""
    H = np.array([row["H_star"] for row in result.allocation], dtype=float)
    ax.plot(x, H, "-", color="tab:green", lw=0.8)
    if (~bounded).any():
        ax.scatter(x[~bounded], H[~bounded], color="tab:green", zorder=3, label="H*(ε)")
    if bounded.any():
        ax.scatter(x[bounded], H[bounded], facecolors="none", edgecolors="0.55", zorder=3,
                   label="bounded by N")
    eps = result.config.get("epsilon", 0.1)
    N = max(int(lay.n_documents) for lay in result.layers)
    top = max(N - 1, int(np.nanmax(H)) if len(H) else 1, 1)
    ax.axhline(N - 1, color="0.5", ls=":", lw=0.8, label=f"N − 1 = {N - 1}")
    hb = result.allocation[0].get("H_star_bound") if result.allocation else None
    if hb is not None:
        ax.axhline(hb, color="0.4", ls="--", lw=0.8, label=f"bound {hb} at N = {N}")
    ax.set_ylim(0, top * 1.45)  # room above for the legend
    ax.set_title(f"effective rank H*(ε={eps:g})", fontsize=9)
    ax.set_ylabel("H* (modes for 90% energy)")
    ax.legend(fontsize=8, loc="upper center", ncol=2)


def _heads_panel(ax: Any, result: Any, x: Any, bounded: Any) -> None:
    """Uniform heads per layer, and the ∝ H* advice when no layer is bounded."""
    uni = [row["uniform"] for row in result.allocation]
    ax.bar(x - 0.2, uni, width=0.4, color="0.7", label="uniform")
    if not bounded.any():
        rec = [row["recommended"] for row in result.allocation]
        ax.bar(x + 0.2, rec, width=0.4, color="tab:orange", label="∝ H*")
    else:
        rec = []
        ax.text(0.5, 0.68, f"no advice ∝ H*:\nH* bounded by N\nin {int(bounded.sum())} of "
                           f"{len(bounded)} layers", transform=ax.transAxes, ha="center",
                va="center", fontsize=8, color="0.25",
                bbox={"facecolor": "white", "edgecolor": "0.7"})
    ax.set_title(f"heads per layer (budget {result.head_budget})", fontsize=9)
    ax.set_ylabel("heads")
    # room above the bars for the legend (and the note)
    ax.set_ylim(0, (1.35 if not bounded.any() else 2.0) * max([*uni, *rec, 1]))
    ax.legend(fontsize=8, loc="upper center", ncol=2)


# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)
register_plot("scale_pod_layer", "plot_scalogram")(plot_scalogram)
register_plot("scale_pod_layer", "plot_scale_energy")(plot_scale_energy)
register_plot("scale_pod_layer", "plot_spectra")(plot_layer_spectra)
register_plot("scale_pod_layer", "plot_band_modes")(plot_band_modes)
register_plot("scale_pod_layer", "plot_mode_profiles")(plot_mode_profiles)
register_plot("scale_pod_layer", "plot_coherence")(plot_coherence)
register_plot("scale_pod", "plot_tspec_hstar")(plot_tspec_hstar)
register_plot("scale_pod", "plot_scale_energies")(plot_scale_energies)
register_plot("pod", "plot_spectrum")(plot_eigen_spectrum)


@register_plot("attention_fields", "plot_mean")
def attention_fields_plot_mean(res):
    """Mean lag profile per layer: ``Σ_i F̄(i, tau)`` against ``tau``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for li, layer in enumerate(res.layers):
        m = res.mean[str(layer)]
        prof = m.mean(dim=0) if not res.per_head else m.mean(dim=(0, 1))
        ax.plot(res.lags.numpy(), prof.numpy(), label=f"layer {layer}",
                **layer_style(li, res.layers))
    ax.set_xlabel("lag τ (tokens)")
    ax.set_ylabel("mean attention" if res.field == "attention" else f"mean {res.field}")
    ax.set_yscale("log" if res.field in ("attention", "value_weighted",
                                          "value_weighted_raw") else "symlog")
    layer_key(ax, res.layers)
    return fig


@register_plot("streamed_attention_fields", "plot_mean")
def streamed_attention_fields_plot_mean(res):
    """Mean lag profile per layer: ``mean_i F̄(i, tau)`` against ``tau``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for li, layer in enumerate(res.layers):
        prof = res.mean[str(layer)].mean(dim=0)
        ax.plot(res.lags.numpy(), prof.numpy(), label=f"layer {layer}",
                **layer_style(li, res.layers))
    ax.set_xlabel("lag τ (tokens)")
    ax.set_ylabel("mean attention")
    ax.set_yscale("log")
    layer_key(ax, res.layers)
    return fig


@register_plot("scale_pod_heads_layer", "plot")
def scale_pod_heads_layer_figure(res, ax: Any = None):
    """Scale energy E(a) of every head (one line per head; the peak scale marked)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6)) if ax is None else (ax.figure, ax)
    a = res.scales.double().numpy()
    for h in range(res.n_heads):
        e = res.scale_energy[h].double().numpy()
        ax.plot(a, e / max(e.max(), 1e-300), lw=1.2, label=f"H{h}")
    ax.set_xscale("log")
    ax.set_xlabel("scale a (tokens of lag)")
    ax.set_ylabel("E(a) / max")
    ax.set_title(f"layer {res.layer}: scale energy per head", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


@register_plot("scale_pod_heads", "plot")
def scale_pod_heads_figure(res, ax: Any = None):
    """Peak scale of every head (layer × head heat map, log colour scale, colour bar)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    peaks = torch.stack([lay.peak_scale.double() for lay in res.layers]).numpy()
    fig, ax = plt.subplots(figsize=(6, 3.4)) if ax is None else (ax.figure, ax)
    finite = peaks[peaks == peaks]
    norm = LogNorm(vmin=max(finite.min(), 1e-3), vmax=max(finite.max(), 1e-3)) \
        if finite.size else None
    im = ax.imshow(peaks, aspect="auto", cmap="viridis", norm=norm)
    fig.colorbar(im, ax=ax, label="peak scale a (tokens)")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("the scale each head works at", fontsize=9)
    fig.tight_layout()
    return fig
