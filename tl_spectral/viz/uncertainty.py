"""Intervals over documents for the report's scale-POD advice: H*, T_spec and the heads per
layer, by a delete-a-group jackknife (the estimator of ``tl_spectral_studies.scale_pod.
group_jackknife``: the documents split at random, seeded, into G groups, the statistic
recomputed without each group; standard error ``sqrt((G − 1)/G · Σ_g (θ_g − θ̄)²)``, interval
``θ̂ ± t_{G−1} · se``). H* and T_spec depend on the number of documents, so a bootstrap (about
63% distinct documents per resample) biases them; each jackknife replicate keeps (1 − 1/G) of
the documents, all distinct.

Each layer's whole-field POD spectrum of any subset of documents comes from ONE document
Gram ``G = X Xᵀ`` of its fluctuation fields (``centred_gram_resample``): the jackknife costs
one ``[N, N]`` eigen-decomposition per layer and replicate after one pass.

Also: which layers the number of documents bounds (the library's rule,
``tl_spectral.analysis.scale_pod.h_star_bounded``) and which N might resolve them.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

# the statistics live on the analysis floor (issue 38); re-exported here for compatibility
from tl_spectral.analysis.bootstrap import (  # noqa: E402,F401
    JACKKNIFE_GROUPS,
    group_jackknife,
    jackknife_interval,
)


def _advice_rows(pod: Any, jk: dict[str, Any]) -> list[dict[str, Any]]:
    """Per layer of ``pod``: H* and T_spec with their intervals, and the recommended heads
    with their range over the whole ensemble and every replicate (statistic layout
    ``[H* per layer, T_spec per layer, heads per layer]``)."""
    est, lo, hi, R = jk["estimate"], jk["low"], jk["high"], jk["replicates"]
    L = len(pod.layers)
    rows = []
    for i, lay in enumerate(pod.layers):
        rows.append({
            "layer": lay.layer,
            "H_star": float(est[i]), "H_star_low": float(lo[i]), "H_star_high": float(hi[i]),
            "T_spec": float(est[L + i]), "T_spec_low": float(lo[L + i]),
            "T_spec_high": float(hi[L + i]),
            "heads": int(est[2 * L + i]),
            "heads_min": int(min(est[2 * L + i], R[:, 2 * L + i].min())),
            "heads_max": int(max(est[2 * L + i], R[:, 2 * L + i].max())),
        })
    return rows


def field_grams(fluctuations: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer the float64 document Gram ``X Xᵀ`` of its fluctuation fields
    ``[N, T, n_lags]`` (the whole-field POD's Gram is ``G / N``)."""
    out = []
    for F in fluctuations:
        X = F.reshape(F.shape[0], -1)
        dt = torch.float64 if X.dtype == torch.float64 else torch.float32
        out.append((X.to(dt) @ X.to(dt).T).to(torch.float64))
    return out


def layer_statistics(gram: torch.Tensor, idx: torch.Tensor, epsilon: float) -> tuple[float, float]:
    """(H*(epsilon), T_spec) of the documents ``idx`` from one layer's Gram, fluctuations
    about the subset's own mean (as :func:`~tl_spectral.analysis.scale_pod.pod_statistics`)."""
    from tl_spectral.analysis.bootstrap import centred_gram_resample
    from tl_spectral.analysis.pod import effective_rank, spectral_concentration
    from tl_spectral.analysis.scale_pod import spectrum_from_gram

    n = int(idx.numel())
    lam = spectrum_from_gram(centred_gram_resample(gram, idx) / n)
    H, _ = effective_rank(lam, epsilon)
    T = spectral_concentration(lam)["T_spec"]
    return float(H), float(T)


def pod_jackknife(fields: Any, pod: Any, *, seed: int = 0,
                  n_groups: int = JACKKNIFE_GROUPS) -> dict[str, Any]:
    """Jackknife intervals of every layer's H* and T_spec and the range of the recommended
    heads over the replicates, for an :class:`~tl_spectral.probes.fields.AttentionFields`
    ensemble and its :class:`ScalePODResult` ``pod``.

    Returns ``{"rows": [per layer: layer, H_star, H_star_low, H_star_high, T_spec,
    T_spec_low, T_spec_high, heads, heads_min, heads_max], "meta", "n_docs"}``."""
    from tl_spectral.analysis.scale_pod import allocate_heads

    eps = float(pod.config.get("epsilon", 0.1))
    grams = field_grams([fields.fluctuations(layer) for layer in fields.layers])
    N = int(grams[0].shape[0])
    L = len(grams)
    budget = int(pod.head_budget)

    def stat(idx: torch.Tensor) -> torch.Tensor:
        v = [layer_statistics(g, idx, eps) for g in grams]
        hs = [h for h, _ in v]
        heads = allocate_heads(hs, budget) if sum(hs) > 0 else [0] * L
        return torch.tensor([h for h, _ in v] + [t for _, t in v] + list(heads),
                            dtype=torch.float64)

    jk = group_jackknife(stat, N, n_groups=n_groups, seed=seed)
    return {"rows": _advice_rows(pod, jk), "meta": jk["meta"], "n_docs": N}


def streamed_pod_jackknife(fields: Any, pod: Any) -> dict[str, Any]:
    """:func:`pod_jackknife` for a :class:`~tl_spectral.probes.fields.StreamedAttentionFields`
    (``--stream-rank``): each replicate's whole-field spectrum comes from the per-group
    moments the streaming probe kept in its second pass
    (:func:`~tl_spectral.analysis.streaming_pod.projected_group_spectrum`), H* and T_spec
    as the streamed POD computes them (:func:`~tl_spectral.analysis.streaming_pod.
    pod_from_spectrum`). Equal to the in-memory jackknife when the ensemble's rank is within
    the rank cap; the same groups (same seed). Raises ValueError when the probe kept no
    per-group moments (``jackknife_groups=0``)."""
    from tl_spectral.analysis.scale_pod import allocate_heads
    from tl_spectral.analysis.streaming_pod import pod_from_spectrum, projected_group_spectrum

    flat = getattr(fields, "jackknife", None) or {}
    parts = ("C", "c", "n", "sumsq", "gram")
    stats = {str(lay): {k: flat[f"{lay}.{k}"] for k in parts} for lay in fields.layers
             if all(f"{lay}.{k}" in flat for k in parts)}
    missing = [lay for lay in fields.layers if str(lay) not in stats]
    if missing:
        raise ValueError(f"the streamed fields carry no per-group moments for layers {missing}; "
                         "run AttentionFieldProbe(streaming=True, jackknife_groups=8)")
    eps = float(pod.config.get("epsilon", 0.1))
    L = len(fields.layers)
    budget = int(pod.head_budget)
    G = int(stats[str(fields.layers[0])]["n"].numel())
    meta_in = dict(getattr(fields, "jackknife_meta", {}) or {})

    def stat(keep: list[int]) -> torch.Tensor:
        hs, ts = [], []
        for lay in fields.layers:
            s = stats[str(lay)]
            lam, total, n = projected_group_spectrum(s, keep)
            p = pod_from_spectrum(lam, torch.zeros(0, 1, dtype=torch.float64),
                                  total_energy=total, n_snapshots=n, dim=1,
                                  dropped=max(0.0, total - float(lam.sum())), epsilon=eps)
            hs.append(float(p.H_star))
            ts.append(float(p.T_spec))
        heads = allocate_heads(hs, budget) if sum(hs) > 0 else [0] * L
        return torch.tensor(hs + ts + list(heads), dtype=torch.float64)

    R = torch.stack([stat([h for h in range(G) if h != g]) for g in range(G)])
    jk = jackknife_interval(stat(list(range(G))), R, seed=int(meta_in.get("seed", 0)))
    return {"rows": _advice_rows(pod, jk), "meta": {**jk["meta"], "streamed": True},
            "n_docs": int(fields.n_docs)}


def n_bound(h_star: Sequence[float], n_docs: int,
            epsilon: float = 0.1) -> tuple[list[int], int]:
    """(indices of the layers whose H* is bounded by the number of documents — the ONE rule,
    :func:`~tl_spectral.analysis.scale_pod.h_star_bounded` — and the least number of
    documents that could resolve the largest of them,
    :func:`~tl_spectral.analysis.scale_pod.docs_to_resolve`; ``n_docs`` when none is
    bounded)."""
    from tl_spectral.analysis.scale_pod import docs_to_resolve, h_star_bounded

    bound = [i for i, h in enumerate(h_star) if h_star_bounded(h, n_docs, epsilon)]
    if not bound:
        return [], int(n_docs)
    return bound, docs_to_resolve(max(float(h_star[i]) for i in bound), epsilon)
