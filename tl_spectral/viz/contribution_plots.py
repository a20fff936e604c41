"""Views of contribution weights, faithfulness and sinks (the report section is
``contribution_section.py``).

Signed maps in circuitsvis. ``contribution_view`` shows a contribution map with
``circuitsvis.attention.attention_heads`` (one small heat map per head, plus the token level
``C = Σ_h c`` as the last "head"): positive values in red, negative values (destructive
interference) in blue, white at 0, with symmetric limits ``±lim`` so equal magnitudes get
equal colour depth. ``lim`` is the largest |value| over the shown maps, or with
``clip_quantile < 1`` that quantile of |value| (a sink column can otherwise wash out the
rest; values beyond are shown at full depth). Raw attention and the other non-negative
baselines are shown the same way (they are simply never blue).

The study of docs/contributions.md is ``tl-spectral study contributions`` (the
``tl_spectral_studies`` package).
"""

from __future__ import annotations

from typing import Any

import torch

from tl_spectral.viz.figures import layer_key, layer_style, register_plot
from tl_spectral.viz.layer_plots import MAX_LAYER_LABELS, set_layer_axis
from tl_spectral.viz.sink_plots import plot_rho_star, plot_sink_rates  # noqa: F401
from tl_spectral.viz.views import contribution_view  # noqa: F401 - re-exported


# ----------------------------------------------------------------------------- views
def plot_faithfulness_areas(res: Any):
    """Bars of the comprehensiveness and sufficiency areas per measure and setting (linear
    axis when every value is positive, symlog only when signs mix)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    M, S = len(res.measures), len(res.settings)
    w = 0.8 / S
    for ax, (title, areas) in zip(axes, (("comprehensiveness area (higher = better)",
                                          res.comprehensiveness_area),
                                         ("sufficiency area (lower = better)",
                                          res.sufficiency_area))):
        for si, sname in enumerate(res.settings):
            ax.bar(torch.arange(M).numpy() + si * w, areas[si].numpy(), width=w, label=sname)
        ax.set_xticks(torch.arange(M).numpy() + 0.4 - w / 2, res.measures, rotation=25,
                      ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("area")
        if bool((areas < 0).any()):
            ax.set_yscale("symlog", linthresh=1e-3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_spearman(stats: Any, skip: tuple = ()):
    """Token-level Spearman correlation of each attention-only measure with the
    contribution c, layer × measure, annotated in a readable size (``skip``: measures left
    out, e.g. one identical to another by construction)."""
    import matplotlib.pyplot as plt

    ci = stats.measures.index("contribution")
    others = [m for m in stats.measures if m != "contribution" and m not in skip]
    short = {"attention": "α", "value_weighted": "α‖ṽ‖", "output_normalized": "α‖ṽ‖/‖o‖"}
    mat = torch.stack([stats.rank_corr[:, -1, stats.measures.index(m), ci] for m in others],
                      dim=1).float().numpy()  # [layer, measure]
    L = len(stats.layers)
    annotate = L <= MAX_LAYER_LABELS  # deeper: the values are in the table
    fig, ax = plt.subplots(figsize=(1.9 * len(others) + 2.5,
                                    (0.45 if annotate else 0.18) * L + 1.6),
                           constrained_layout=True)
    im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
    ax.set_xticks(range(len(others)), [f"{short.get(m, m)} vs c" for m in others], fontsize=9)
    ax.set_xlabel("attention-only measure")
    set_layer_axis(ax, stats.layers, axis="y")
    for a in range(L if annotate else 0):
        for b in range(len(others)):
            ax.text(b, a, f"{mat[a, b]:.2f}", ha="center", va="center", fontsize=9,
                    color="white" if abs(mat[a, b]) > 0.6 else "black")
    fig.colorbar(im, ax=ax, shrink=0.9, label="Spearman ρ")
    ax.set_title("rank correlation with the contribution c (token level)", fontsize=10)
    return fig


def slim_contribution_stats(stats: Any, layer: int, n: int) -> Any:
    """A copy keeping only the kept maps of the first kept document at ``layer``, cut to the
    first ``n`` positions (what the report shows first): the per-query maps of every layer
    and document are the bulk of the file."""
    import dataclasses

    kept = {k: (v[:1, ..., :n, :n].clone()) for k, v in stats.kept_maps.items()
            if k.split(".", 1)[0] == str(layer)}
    return dataclasses.replace(
        stats, kept_maps=kept,
        kept_docs=None if stats.kept_docs is None else stats.kept_docs[:1].clone(),
        kept_tokens=None if stats.kept_tokens is None else stats.kept_tokens[:1, :n].clone(),
        kept_mask=None if stats.kept_mask is None else stats.kept_mask[:1, :n].clone())


# ------------------------------------------------------------ figures of the result kinds
# (registered for Result._draw: each result method is one line that calls these)


@register_plot("contribution_stats", "view")
def contribution_stats_view(res, layer: int | None = None, doc: int = 0, **kwargs):
    """circuitsvis view of a kept document's contribution map (``keep_docs`` of the
    probe); default: the last layer."""
    if not res.kept_maps:
        raise NotImplementedError("no maps were kept: run ContributionProbe(keep_docs=[0])")
    layer = res.layers[-1] if layer is None else layer
    return res.maps(layer, doc).view(**kwargs)


@register_plot("contribution_stats", "plot_source")
def contribution_stats_plot_source(res, max_pos: int = 64):
    """Mean token-level contribution and mean attention (head mean) by source
    position, one line per layer, first ``max_pos`` positions."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    n = min(max_pos, res.source_mean.shape[-1])
    for li, layer in enumerate(res.layers):
        ok = res.source_count[li, :n] > 0
        x = torch.arange(n)[ok].numpy()
        st = layer_style(li, res.layers)
        axes[0].plot(x, res.source_mean[li, -1, :n][ok].numpy(), label=f"L{layer}", **st)
        axes[1].plot(x, res.source_attention[li, :, :n].mean(0)[ok].numpy(), label=f"L{layer}",
                     **st)
    axes[0].axhline(0, color="black", lw=0.6)
    axes[0].set_title("mean token-level contribution C_ij by source j", fontsize=9)
    axes[1].set_title("mean attention α_ij (head mean) by source j", fontsize=9)
    axes[0].set_ylabel("mean contribution C_ij")
    axes[1].set_ylabel("mean attention α_ij")
    for ax in axes:
        ax.set_xlabel("source position j")
        ax.set_yscale("symlog", linthresh=1e-3)
    layer_key(axes[1], res.layers)
    fig.tight_layout()
    return fig


@register_plot("contribution_stats", "plot_lag")
def contribution_stats_plot_lag(res, max_lag: int = 64):
    """Mean token-level contribution and mean attention by lag ``i − j``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    lags = res.lags
    sel = lags.abs() <= max_lag
    for li, layer in enumerate(res.layers):
        ok = sel & (res.lag_count[li] > 0)
        st = layer_style(li, res.layers)
        axes[0].plot(lags[ok].numpy(), res.lag_mean[li, -1][ok].numpy(), label=f"L{layer}", **st)
        axes[1].plot(lags[ok].numpy(), res.lag_attention[li].mean(0)[ok].numpy(),
                     label=f"L{layer}", **st)
    axes[0].axhline(0, color="black", lw=0.6)
    axes[0].set_title("mean token-level contribution by lag i − j", fontsize=9)
    axes[1].set_title("mean attention (head mean) by lag i − j", fontsize=9)
    axes[0].set_ylabel("mean contribution C_ij")
    axes[1].set_ylabel("mean attention α_ij")
    for ax in axes:
        ax.set_xlabel("lag i − j")
        ax.set_yscale("symlog", linthresh=1e-3)
    layer_key(axes[1], res.layers)
    fig.tight_layout()
    return fig


@register_plot("contribution_stats", "plot_rank_corr")
def contribution_stats_plot_rank_corr(res):
    """Token-level Spearman correlation matrices between the measures, one per layer."""
    import matplotlib.pyplot as plt

    L = len(res.layers)
    fig, axes = plt.subplots(1, L, figsize=(2.6 * L + 1.4, 3.4), squeeze=False,
                             constrained_layout=True)
    short = {"attention": "α", "value_weighted": "α‖ṽ‖", "output_normalized": "α‖ṽ‖/‖o‖",
             "contribution": "c"}
    labels = [short.get(m, m) for m in res.measures]
    for li, layer in enumerate(res.layers):
        ax = axes[0][li]
        im = ax.imshow(res.rank_corr[li, -1].numpy(), vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=8)
        ax.set_yticks(range(len(labels)), labels if li == 0 else [""] * len(labels), fontsize=8)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("measure")
        if li == 0:
            ax.set_ylabel("measure")
        for a in range(len(labels)):
            for b in range(len(labels)):
                ax.text(b, a, f"{float(res.rank_corr[li, -1, a, b]):.2f}", ha="center",
                        va="center", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Spearman ρ")
    fig.suptitle("Spearman rank correlation between measures (token level)", fontsize=10)
    return fig


@register_plot("contribution_stats", "plot_negative")
def contribution_stats_plot_negative(res):
    """Heat maps (layer × head, last column = token level) of the negative shares."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, max(3.4, 0.16 * len(res.layers) + 1.4)),
                             constrained_layout=True)
    H = res.negative_fraction.shape[1] - 1
    xt = [str(h) for h in range(H)] + ["Σh"]
    what = (f"share of pairs with c < −{res.negative_rtol:g}·Σ|c_row|" if res.negative_rtol
            else "share of pairs with c < 0")
    for ax, (m, title) in zip(axes, ((res.negative_fraction, what),
                                     (res.negative_mass, "negative mass Σ|c⁻| / Σ|c|"))):
        im = ax.imshow(m.numpy(), aspect="auto", cmap="viridis", vmin=0)
        ax.set_xticks(range(H + 1), xt, fontsize=8)
        ax.set_xlabel("head")
        set_layer_axis(ax, res.layers, axis="y")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.85, label="share" if m is res.negative_fraction
                     else "share of |c|")
    return fig


@register_plot("faithfulness", "plot_curves")
def faithfulness_plot_curves(res):
    """Comprehensiveness and sufficiency curves, one panel per setting and criterion."""
    import matplotlib.pyplot as plt

    S = len(res.settings)
    fig, axes = plt.subplots(S, 2, figsize=(10, 3.4 * S), squeeze=False)
    ylabel = "ΔPPL" if res.metric == "delta_ppl" else "1 − cos(e', e)"
    styles = {"random": dict(color="grey", ls=":")}
    for si, sname in enumerate(res.settings):
        for ci, (crit, data) in enumerate(
            (("comprehensiveness (top removed)", res.comprehensiveness),
             ("sufficiency (bottom removed)", res.sufficiency))
        ):
            ax = axes[si][ci]
            for mi, m in enumerate(res.measures):
                ax.plot(res.fractions, data[si, mi].numpy(), marker="o", ms=3,
                        label=m, **styles.get(m, {}))
            ax.set_title(f"{sname}: {crit}", fontsize=9)
            ax.set_xlabel("removal fraction r")
            ax.set_ylabel(ylabel)
            if res.metric == "delta_ppl":
                ax.set_yscale("symlog", linthresh=max(1e-3, 0.01 * res.clean))
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"faithfulness — {res.model_name} ({res.mode}, {res.level} level)",
                 fontsize=10)
    fig.tight_layout()
    return fig


@register_plot("contribution_maps", "view")
def contribution_maps_view(res, tokens=None, batch: int = 0, measure: str = "contribution",
                           **kwargs):
    """circuitsvis view of one document's signed map (red positive, blue negative;
    see :func:`tl_spectral.viz.contribution_plots.contribution_view`); ``tokens``:
    the document's token strings (default: position indices)."""
    n = res.measure(measure).shape[-1]
    toks = [str(i) for i in range(n)] if tokens is None else list(tokens)
    return contribution_view(res, toks, batch, measure, **kwargs)


@register_plot("contribution_maps", "plot_maps")
def contribution_maps_plot_maps(res, batch: int = 0, head: int | None = None, *,
                                max_tokens: int = 64):
    """Heatmaps (query × key) of the four measures for one head or the token level.

    ``head=None`` plots the token level (sum over heads). Signed maps (contribution,
    and any map with negative entries) use a diverging colormap centred on 0 with
    symmetric limits (red = positive, blue = negative); non-negative maps use a
    sequential one. Returns a matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res.measure_names),
                             figsize=(4.2 * len(res.measure_names), 4))
    for ax, name in zip(axes, res.measure_names):
        full = res.token_level(name) if head is None else res.measure(name)
        m = full[batch, 0 if head is None else head]
        m = m[:max_tokens, :max_tokens].detach().cpu().float()
        _signed_imshow(ax, m, name.replace("_", " "))
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("source j (key)")
    axes[0].set_ylabel("query i")
    where = "token level (Σ_h)" if head is None else f"head {head}"
    fig.suptitle(f"{res.mode}-head measures, batch {batch}, {where}")
    fig.tight_layout()
    return fig


@register_plot("contribution_maps", "plot_factorization")
def contribution_maps_plot_factorization(res, batch: int = 0, head: int = 0, query: int = -1):
    """Bars over sources j of ``α``, ``‖ṽ_j‖/‖o‖``, ``cos(o, ṽ_j)`` and ``c = α·ratio·cos``
    for one query of one head. Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    rows = [
        ("attention α", res.attention),
        ("relative norm ‖ṽ_j‖/‖o‖", res.relative_norm),
        ("cosine cos(o, ṽ_j)", res.cosine),
        ("contribution c", res.contribution),
    ]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 7), sharex=True)
    for ax, (label, t) in zip(axes, rows):
        y = t[batch, head, query].detach().cpu().float()
        colors = ["tab:red" if val >= 0 else "tab:blue" for val in y.tolist()]
        ax.bar(range(y.numel()), y.numpy(), color=colors)
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_ylabel(label, fontsize=8)
    axes[-1].set_xlabel("source j (key)")
    fig.suptitle(f"{res.mode}-head factorization, batch {batch}, head {head}, query {query}")
    fig.tight_layout()
    return fig


def _signed_imshow(ax, m: torch.Tensor, label: str = "value") -> None:
    """Diverging, zero-centred colormap if ``m`` has negative entries, else sequential."""
    lo, hi = float(m.min()), float(m.max())
    if lo < 0:
        lim = max(abs(lo), abs(hi)) or 1.0
        im = ax.imshow(m.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
    else:
        im = ax.imshow(m.numpy(), cmap="viridis", vmin=0.0, vmax=hi or 1.0)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=label)
