"""Scale-POD claims across depth, tokenizers and the sink column (issue 39, item 4;
docs/scale_pod.md, "Across depth, tokenizers and the sink column").

    python -m tl_spectral_studies.pod_depth --model smollm2-135m --data-dir ../shared/data \
        --out docs/results/real_decoder/pod_depth
    python -m tl_spectral_studies.pod_depth --model gemma3-270m ...       # 64 × 256, <bos>
    python -m tl_spectral_studies.pod_depth --model char-shakespeare-d256 ...  # the paper's width
    python -m tl_spectral_studies.pod_depth --tables-only --out ...        # the doc's markdown

One probe pass (``AttentionFieldProbe``, the head-mean field of every layer) per model; the
per-window lag fields are then post-processed into three fields (:data:`VARIANTS`):

* ``with``: the field as captured — the softmax output over every key, the first one
  included (the object of the paper's claims: SPEC A.1, the head-mean field ``A_s(i, j)``);
* ``zeroed``: the key-0 column set to 0 (lag coordinates: entry ``τ = i`` of query ``i``),
  the other entries unchanged (rows then sum to ``1 − α_i0``);
* ``renormalized``: the key-0 column removed and each row rescaled to sum to 1 over the
  keys ``j ≥ 1``: ``A(i, j) / (1 − A(i, 0))`` (query 0, which sees key 0 only, becomes a
  zero row). This is the head-*mean* row renormalized (the probe keeps no per-head field);
  it equals the mean of per-head renormalized rows weighted by each head's ``1 − α^h_i0``.

Per layer and field: H*(0.1) and T_spec (99% fit) with the delete-a-group jackknife over
windows (20 groups, seed 0: the library's, as the ``scales`` step), band shares with the
percentile bootstrap (1,000 resamples, seed 0) under two sets of band cut-offs
(:func:`band_sets`): the paper's, in tokens (fine a ≤ 7, coarse a ≥ 20), and the same
spans of *text* converted to tokens by the corpus' mean characters per token (the rule is
fixed before the data: :func:`cutoffs_in_tokens`). Depth is the fraction ``l / (L − 1)``
(:func:`depth_fraction`), and every claim is restated on thirds of the stack
(:func:`third_of`): early ``l/(L−1) < 1/3``, middle ``< 2/3``, late the rest.

Writes ``OUT/pod_depth_<model>.json`` atomically.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral.analysis.scale_pod import h_star_bound, h_star_bounded
from tl_spectral.usage import ArgumentParser
from tl_spectral_studies.depth import (  # noqa: F401  (re-exported)
    THIRDS,
    depth_fraction,
    third_layers,
    third_of,
)

NAME = "pod-depth"
VARIANTS = ("with", "zeroed", "renormalized")
PAPER_CUTS = (7.0, 20.0)
"""The paper's band cut-offs (fine a ≤ 7, coarse a ≥ 20), measured on a character model:
tokens = characters there, so they are spans of 7 and 20 characters of text."""
CUT_SETS = ("paper", "text")
N_RESAMPLES = 1000
JACKKNIFE_GROUPS = 20
SEED = 0
STATS = ("H_star", "T_spec_99")
MODELS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {"corpus": "wiki_excerpt.txt", "start": "<|im_start|>", "n_docs": 150,
                     "length": 128, "window_seed": 2, "batch_size": 8},
    "gemma3-270m": {"corpus": "wiki_excerpt.txt", "start": "<bos>", "n_docs": 64,
                    "length": 256, "window_seed": 2, "batch_size": 4},
    "char-shakespeare-d256": {"corpus": "shakespeare", "start": None, "n_docs": 150,
                              "length": 256, "window_seed": 0, "batch_size": 16},
    "char-shakespeare": {"corpus": "shakespeare", "start": None, "n_docs": 150,
                         "length": 256, "window_seed": 0, "batch_size": 16},
}
"""Per model: corpus, the start token put in front of every window (the ``scales`` step's
``<|im_start|>`` for SmolLM2; Gemma-3's ``<bos>``; none for the char models, as in the
scale-POD study), N windows × T tokens, the window draw and the batch size. SmolLM2's
windows are those of ``real-decoder --step scales`` (draw 2 of seed 0)."""


# ------------------------------------------------------------------- depth and cut-offs
def cutoffs_in_tokens(chars_per_token: float, cuts: Sequence[float] = PAPER_CUTS
                      ) -> tuple[float, float]:
    """The paper's cut-offs as the same spans of text in tokens: ``cut / c̄`` with ``c̄`` the
    corpus' mean characters per token (1 on a character model, where they are unchanged).

    The rule (fixed before any field was looked at): the paper's cut-offs were set on a
    character model, so a ≤ 7 and a ≥ 20 are lags of 7 and 20 characters; a lag of ``a`` BPE
    tokens spans ``a · c̄`` characters on average."""
    c = float(chars_per_token)
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"chars_per_token must be a positive number, got {chars_per_token}")
    return float(cuts[0]) / c, float(cuts[1]) / c


def band_sets(chars_per_token: float) -> dict[str, dict[str, tuple[float, float, bool, bool]]]:
    """``{"paper": bands, "text": bands}`` in the format of
    :data:`~tl_spectral.analysis.wavelets.FIXED_BANDS` (fine ``a ≤ lo``, medium
    ``lo < a < hi``, coarse ``a ≥ hi``): the paper's cut-offs in tokens, and
    :func:`cutoffs_in_tokens`."""
    out = {}
    for name, (lo, hi) in (("paper", PAPER_CUTS),
                           ("text", cutoffs_in_tokens(chars_per_token))):
        out[name] = {"fine": (-math.inf, lo, False, True), "medium": (lo, hi, False, False),
                     "coarse": (hi, math.inf, True, False)}
    return out


def chars_per_token(tok: Any, windows: torch.Tensor, skip_first: bool) -> float:
    """Mean characters per token of ``windows [n, T]``: characters of each window's decoded
    text over its token count (``skip_first``: the start token left out of both)."""
    w = windows[:, 1:] if skip_first else windows
    chars = sum(len(tok.decode(row.tolist())) for row in w)
    return chars / float(w.numel())


# ----------------------------------------------------------------------- sink column
def sink_variant(F: torch.Tensor, variant: str, *, eps: float = 1e-6) -> torch.Tensor:
    """The causal lag field ``F [N, T, n_lags]`` (``F[s, i, τ] = α_s(i, i − τ)``, all lags)
    as field ``variant`` of :data:`VARIANTS` (a new tensor; ``with`` is a copy).

    The key-0 column is the entry ``τ = i`` of query ``i``. ``zeroed``: that entry set to 0.
    ``renormalized``: each row divided by ``1 − α(i, 0)`` and the entry then set to 0;
    rows with ``1 − α(i, 0) ≤ eps`` (query 0, and any row wholly on key 0) become 0."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown field variant {variant!r}; use one of {VARIANTS}")
    N, T, n_lags = (int(d) for d in F.shape)
    if n_lags != T:
        raise ValueError(f"the sink column needs every lag (n_lags = T = {T}, got {n_lags}); "
                         "capture with AttentionFieldProbe(max_lag=None)")
    G = F.clone()
    if variant == "with":
        return G
    i = torch.arange(T)
    col = G[:, i, i].clone()  # [N, T]: α(i, 0)
    G[:, i, i] = 0.0
    if variant == "renormalized":
        rest = 1.0 - col
        scale = torch.where(rest > eps, 1.0 / rest.clamp_min(eps), torch.zeros_like(rest))
        G = G * scale[..., None]
    return G


def fluctuations(F: torch.Tensor) -> torch.Tensor:
    """``F_s − mean_s F_s`` of full causal windows (the Reynolds split; entries outside the
    causal triangle are 0 in every window, so they stay 0)."""
    return F - F.mean(0, keepdim=True)


def column_share(u: torch.Tensor) -> float:
    """Share of the fluctuation energy ``Σ u²`` held by the key-0 column (entries ``τ = i``)."""
    T = int(u.shape[1])
    i = torch.arange(T)
    tot = float((u.double() ** 2).sum())
    return float((u[:, i, i].double() ** 2).sum()) / tot if tot > 0 else 0.0


# -------------------------------------------------------------------------- per layer
def layer_grams(u: torch.Tensor, sets: dict, scales: torch.Tensor) -> dict[str, Any]:
    """Document Grams of one layer's fluctuations ``u [N, T, T]`` (the whole field's and each
    band's of every cut-off set, keys ``"<set>:<band>"``; one pass, see
    :func:`~tl_spectral.analysis.scale_pod.scale_pod_grams`) and the scale energy ``E(a)``
    on ``scales`` (``E(a) = tr(C P_a)``, ``C`` the lag second moment), normalized to sum 1."""
    from tl_spectral.analysis.scale_pod import band_energy_operators, scale_pod_grams

    bands = {f"{s}:{b}": v for s, bs in sets.items() for b, v in bs.items()}
    g = scale_pod_grams(u, scales=scales, bands=bands)
    n = int(u.shape[-1])
    per = band_energy_operators(n, scales, bands={str(k): (float(a), float(a), True, True)
                                                  for k, a in enumerate(scales.tolist())})
    X = u.reshape(-1, n).double()
    C = X.T @ X
    E = torch.stack([(C * per[str(k)]).sum() for k in range(len(scales))])
    return {"grams": g, "E_a": (E / E.sum()).tolist()}


def spectrum_stats(g: torch.Tensor, idx: torch.Tensor) -> list[float]:
    """``[H*(0.1), T_spec (99% fit)]`` of the documents ``idx`` from the whole-field Gram."""
    from tl_spectral.analysis.bootstrap import centred_gram_resample
    from tl_spectral.analysis.pod import effective_rank, spectral_concentration
    from tl_spectral.analysis.scale_pod import spectrum_from_gram

    lam = spectrum_from_gram(centred_gram_resample(g, idx) / int(idx.numel()))
    return [float(effective_rank(lam, 0.10)[0]),
            float(spectral_concentration(lam, energy=0.99)["T_spec"])]


def band_traces(grams: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Band energies ``tr(H G[idx][:, idx] H)`` of resamples given by their multiplicity
    vectors ``counts [R, N]`` (``H`` the centring of the resample), for stacked Grams
    ``grams [B, N, N]``: ``Σ_s c_s G_ss − cᵀ G c / n``. Returns ``[R, B]``."""
    n = counts.sum(1, keepdim=True)
    diag = torch.diagonal(grams, dim1=1, dim2=2)  # [B, N]
    quad = torch.einsum("rs,bst,rt->rb", counts, grams, counts)
    return counts @ diag.T - quad / n


def shares(tr: torch.Tensor, n_sets: int) -> torch.Tensor:
    """Band traces ``[..., n_sets * 3]`` (fine, medium, coarse per set) → shares per set."""
    t = tr.reshape(*tr.shape[:-1], n_sets, 3)
    return t / t.sum(-1, keepdim=True)


# --------------------------------------------------------------------------- analysis
def layer_weights(n_layers: int) -> dict[str, torch.Tensor]:
    """Linear summaries over layers, as weight vectors ``[L]``: each third's mean, ``late −
    early`` (late-third mean minus early-third mean) and ``last − first`` (the old contrast)."""
    L = int(n_layers)
    out: dict[str, torch.Tensor] = {}
    for t, ls in third_layers(L).items():
        w = torch.zeros(L, dtype=torch.float64)
        if ls:
            w[ls] = 1.0 / len(ls)
        out[t] = w
    out["late_minus_early"] = out["late"] - out["early"]
    w = torch.zeros(L, dtype=torch.float64)
    w[-1] += 1.0
    w[0] -= 1.0
    out["last_minus_first"] = w
    return out


def _iv(est: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> Any:
    """Nested lists of ``{"estimate", "low", "high"}`` (floats) from equal-shape tensors."""
    if est.dim() == 0:
        return {"estimate": float(est), "low": float(lo), "high": float(hi)}
    return [_iv(e, a, b) for e, a, b in zip(est, lo, hi)]


def intervals(est: torch.Tensor, reps: torch.Tensor, kind: str, seed: int = SEED) -> Any:
    """Intervals of ``est [...]`` from replicates ``reps [R, ...]``: ``"jackknife"`` (the
    library's delete-a-group interval) or ``"bootstrap"`` (percentile)."""
    from tl_spectral.analysis.bootstrap import jackknife_interval, percentile_interval

    if kind == "jackknife":
        j = jackknife_interval(est, reps, seed=seed)
        return _iv(est, j["low"], j["high"])
    lo, hi = percentile_interval(est, reps)
    return _iv(est, lo, hi)


def summarize(est: torch.Tensor, reps: torch.Tensor, kind: str) -> dict[str, Any]:
    """``est [V, L, ...]`` (variants × layers × statistics) and replicates ``[R, V, L, ...]``:
    per layer, per layer minus the ``with`` field, and the :func:`layer_weights` summaries,
    each with its interval (the same replicates, so differences are paired)."""
    L = int(est.shape[1])
    out: dict[str, Any] = {"layers": intervals(est, reps, kind),
                           "minus_with": intervals(est - est[:1], reps - reps[:, :1], kind)}
    for name, w in layer_weights(L).items():
        e = torch.tensordot(est, w, dims=([1], [0]))
        r = torch.tensordot(reps, w, dims=([2], [0]))
        out[name] = intervals(e, r, kind)
        out[name + "_minus_with"] = intervals(e - e[:1], r - r[:, :1], kind)
    return out


def spectrum_jackknife(field_grams: list[list[torch.Tensor]], *, n_groups: int = JACKKNIFE_GROUPS,
                       seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor, int]:
    """H* and T_spec of every variant and layer ``[V, L, 2]`` with their delete-a-group
    replicates ``[G, V, L, 2]`` (the library's groups), from the whole-field Grams
    ``field_grams[v][l]``; also the number of groups."""
    from tl_spectral.analysis.bootstrap import group_jackknife

    N = int(field_grams[0][0].shape[0])

    def stat(idx: torch.Tensor) -> torch.Tensor:
        return torch.tensor([[spectrum_stats(g, idx) for g in row] for row in field_grams],
                            dtype=torch.float64)

    j = group_jackknife(stat, N, n_groups=n_groups, seed=seed)
    return j["estimate"], j["replicates"], int(j["meta"]["n_groups"])


def band_bootstrap(band_grams: torch.Tensor, n_sets: int, *, n_resamples: int = N_RESAMPLES,
                   seed: int = SEED, chunk: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Band shares ``[V, L, n_sets, 4]`` (fine, medium, coarse, fine − coarse) and their
    bootstrap replicates ``[R, ...]`` from ``band_grams [V, L, n_sets * 3, N, N]``; the
    resamples are the library's (:func:`~tl_spectral.analysis.bootstrap.resample_indices`)."""
    from tl_spectral.analysis.bootstrap import resample_indices

    V, L, B, N, _ = band_grams.shape
    idx = resample_indices(N, n_resamples, seed)
    counts = torch.zeros(n_resamples + 1, N, dtype=torch.float64)
    counts[0] = 1.0
    counts[1:].scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
    flat = band_grams.reshape(V * L * B, N, N)
    tr = torch.cat([band_traces(flat[k:k + chunk], counts) for k in range(0, flat.shape[0], chunk)],
                   1).reshape(n_resamples + 1, V, L, B)
    s = shares(tr, n_sets)
    s = torch.cat([s, (s[..., 0] - s[..., 2])[..., None]], -1)
    return s[0], s[1:]


def analyse(lag_fields: Sequence[torch.Tensor], *, chars_per_token: float,
            n_resamples: int = N_RESAMPLES, n_groups: int = JACKKNIFE_GROUPS,
            seed: int = SEED) -> dict[str, Any]:
    """Everything of one model from its raw causal lag fields (one ``[N, T, T]`` per layer,
    full windows, every lag): per layer and :data:`VARIANTS` field, H*, T_spec (jackknife),
    band shares under both cut-off sets (bootstrap), the peak of ``E(a)``, the key-0
    column's share of the fluctuation energy and the mean sink mass ``α(i, 0)`` over
    queries ``i ≥ 1``; the same as thirds of the stack (:func:`summarize`)."""
    from tl_spectral.analysis.wavelets import default_scales

    N, T, _ = (int(d) for d in lag_fields[0].shape)
    L = len(lag_fields)
    scales = default_scales(T)
    sets = band_sets(chars_per_token)
    field_grams: list[list[torch.Tensor]] = [[] for _ in VARIANTS]
    band_grams: list[list[torch.Tensor]] = [[] for _ in VARIANTS]
    layers = []
    i = torch.arange(1, T)
    for li, F in enumerate(lag_fields):
        row: dict[str, Any] = {"layer": li, "depth": depth_fraction(li, L),
                               "third": third_of(li, L),
                               "sink_mass": float(F[:, i, i].double().mean())}
        for vi, v in enumerate(VARIANTS):
            u = fluctuations(sink_variant(F, v))
            lg = layer_grams(u, sets, scales)
            g = lg["grams"]
            field_grams[vi].append(g["field"])
            band_grams[vi].append(torch.stack([g[f"{s}:{b}"] for s in CUT_SETS
                                               for b in ("fine", "medium", "coarse")]))
            E = torch.tensor(lg["E_a"])
            row[v] = {"E_a": lg["E_a"], "peak_scale": float(scales[int(E.argmax())]),
                      "column_share": column_share(u)}
            del u
        layers.append(row)
    est, reps, G = spectrum_jackknife(field_grams, n_groups=n_groups, seed=seed)
    spec = summarize(est, reps, "jackknife")
    bg = torch.stack([torch.stack(b) for b in band_grams])
    b_est, b_reps = band_bootstrap(bg, len(CUT_SETS), n_resamples=n_resamples, seed=seed)
    bands = summarize(b_est, b_reps, "bootstrap")
    lo, hi = cutoffs_in_tokens(chars_per_token)
    return {"n_layers": L, "n_docs": N, "length": T, "chars_per_token": chars_per_token,
            "cutoffs": {"paper": list(PAPER_CUTS), "text": [lo, hi]},
            "scales": scales.tolist(), "variants": list(VARIANTS), "cut_sets": list(CUT_SETS),
            "thirds": third_layers(L), "layers": layers,
            "spectrum": {"stats": list(STATS), **spec},
            "bands": {"stats": ["fine", "medium", "coarse", "fine_minus_coarse"], **bands},
            "intervals": {"spectrum": f"delete-a-group jackknife, {G} groups, seed {seed}",
                          "bands": f"percentile bootstrap, {n_resamples} resamples, seed {seed}",
                          "level": 0.95}}


# ----------------------------------------------------------------------------- claims
def claims(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The scale-POD claims restated on thirds of the stack, each labelled by the sign rule
    (:mod:`tl_spectral_studies.claims.rules`) for every field variant and cut-off set; the
    verdict is the ``with`` field's (the paper's object) and says "depends on the sink
    column" where the variants' labels differ."""
    from tl_spectral_studies.claims import rules

    V = res["variants"]
    out = []

    def add(cid: str, text: str, labels: dict[str, str], ivs: dict[str, Any], note: str = ""):
        same = len(set(labels.values())) == 1
        out.append({"id": cid, "claim": text, "labels": labels, "intervals": ivs,
                    "verdict": labels["with"] if same else
                    f"depends on the sink column ({labels['with']} with it; "
                    + "; ".join(f"{labels[v]} {v}" for v in V[1:]) + ")",
                    "sink_dependent": not same, "note": note})

    b = res["bands"]
    for si, s in enumerate(res["cut_sets"]):
        lo, hi = res["cutoffs"][s]
        cut = f"fine a ≤ {lo:.3g}, coarse a ≥ {hi:.3g} tokens ({s} cut-offs)"
        ivs = {v: {"early": b["early"][vi][si][3], "late": b["late"][vi][si][3],
                   "late_minus_early": b["late_minus_early"][vi][si][3]}
               for vi, v in enumerate(V)}
        lab = {v: rules.steps([rules.sign(ivs[v]["early"], 0.0, above=True),
                               rules.sign(ivs[v]["late"], 0.0, above=False)]) for v in V}
        add(f"bands.{s}", f"E fine − E coarse > 0 in the early third and < 0 in the late "
            f"third; {cut}", lab, ivs, rules.STEPS_RULE)
        lab = {v: rules.sign(ivs[v]["late_minus_early"], 0.0, above=False) for v in V}
        add(f"shift.{s}", f"E fine − E coarse falls from the early to the late third; {cut}",
            lab, {v: ivs[v]["late_minus_early"] for v in V}, rules.SIGN_RULE)
    sp = res["spectrum"]
    N = res["n_docs"]
    # the library's one rule of "bounded by N" (h_star_bounded: H* >= h_star_bound(N)) over
    # the layers the comparison reads (the early and the late third), as the registry's A.hstar
    read = [li for t in ("early", "late") for li in res["thirds"][t]]
    bound = {v: any(h_star_bounded(sp["layers"][vi][li][0]["estimate"], N) for li in read)
             for vi, v in enumerate(V)}
    ivs = {v: sp["late_minus_early"][vi][0] for vi, v in enumerate(V)}
    lab = {v: rules.NOT_TESTED if bound[v] else rules.sign(ivs[v], 0.0, above=False) for v in V}
    add("hstar", "H*(0.1) higher in the early third than in the late third (late − early < 0)",
        lab, ivs, f"sign rule; not tested when a layer of the two thirds has H* bounded by N "
        f"(tl_spectral's h_star_bounded: H* ≥ {h_star_bound(N)} at N = {N})")
    ivs = {v: sp["late_minus_early"][vi][1] for vi, v in enumerate(V)}

    def word(iv):
        up, down = rules.sign(iv, 0.0, above=True), rules.sign(iv, 0.0, above=False)
        return "rises" if up == rules.REPRODUCED else "falls" if down == rules.REPRODUCED \
            else "no change distinguishable"
    add("tspec", "T_spec (99% fit) changes from the early to the late third (descriptive)",
        {v: f"{rules.DESCRIPTIVE}: {word(ivs[v])}" for v in V}, ivs, "descriptive")
    return out


# ------------------------------------------------------------------------------ runs
def model_windows(model: str, tok: Any, data_dir: Path | None, cfg: dict[str, Any]
                  ) -> tuple[torch.Tensor, float, str]:
    """``(windows [N, T], chars per token, source)`` of ``model``'s configuration: the real
    models' validation windows of ``DATA_DIR/<corpus>`` with the start token in front (the
    window's last token dropped), the char models' as the scale-POD study takes them."""
    from tl_spectral_studies.evidence_panel import start_id

    n, T = cfg["n_docs"], cfg["length"]
    if cfg["start"] is None:
        from tl_spectral.data import load_corpus
        from tl_spectral_studies._common import validation_windows

        w, source = validation_windows(load_corpus(cfg["corpus"]), tok, n, T, cfg["window_seed"])
        w = getattr(w, "tokens", w)
        bos = getattr(tok, "bos_id", None) is not None
        return w, chars_per_token(tok, w, skip_first=bos), f"{cfg['corpus']} ({source})"
    from tl_spectral_studies.real_decoder import windows

    if data_dir is None:
        raise ValueError(f"{model} reads {cfg['corpus']}: pass --data-dir ../shared/data")
    w = windows(Path(data_dir), cfg["corpus"], tok, n, T, cfg["window_seed"])
    sid = start_id(tok, cfg["start"])
    w = torch.cat([torch.full((n, 1), sid, dtype=w.dtype), w[:, :-1]], 1)
    return w, chars_per_token(tok, w, skip_first=True), \
        f"{cfg['corpus']} (validation split), {cfg['start']} first"


def run_model(model: str, out: Path, data_dir: Path | None = None, *,
              overrides: dict[str, Any] | None = None, loaded: tuple | None = None
              ) -> dict[str, Any]:
    """One model: windows, one ``AttentionFieldProbe`` pass, :func:`analyse`, :func:`claims`;
    writes ``out/pod_depth_<model>.json`` atomically and returns it. ``loaded``: a
    ``(model, tokenizer)`` pair instead of loading ``model`` by name (tests)."""
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral_studies.evidence_panel import write_atomic

    cfg = {**MODELS.get(model, {}), **(overrides or {})}
    missing = {"corpus", "start", "n_docs", "length", "window_seed", "batch_size"} - set(cfg)
    if missing:
        raise ValueError(f"no configuration for model {model!r}: use one of {sorted(MODELS)} "
                         f"or pass overrides with {sorted(missing)}")
    t0 = time.perf_counter()
    if loaded is None:
        from tl_spectral.models.loading import load_named_model

        loaded = load_named_model(model)
    net, tok = loaded
    view = ModelView(net)
    if not view.causal:
        raise ValueError(f"{model} is bidirectional; the sink column is defined for causal "
                         "models here")
    w, cpt, source = model_windows(model, tok, data_dir, cfg)
    fields = run_probes(view, w, [AttentionFieldProbe()], batch_size=cfg["batch_size"],
                        progress=False)["attention_fields"]
    if not bool(fields.doc_mask.bool().all()):
        raise ValueError("padded windows: pass full windows of exactly T tokens")
    t_fwd = time.perf_counter() - t0
    res = analyse([fields.fields[str(li)] for li in fields.layers], chars_per_token=cpt)
    res.update({"model": model, "view": repr(view), "windows": source,
                "config": {k: cfg[k] for k in sorted(cfg)}, "forward_s": round(t_fwd, 1),
                "seconds": round(time.perf_counter() - t0, 1)})
    res["claims"] = claims(res)
    res["provenance"] = _provenance()
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"pod_depth_{model}.json", res)
    return res


def run_study(out_dir: str | Path, data_dir: str | Path | None = None, *,
              models: Sequence[str] = ("smollm2-135m",),
              overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """:func:`run_model` for every model of ``models`` into ``out_dir`` (the entry function of
    ``tl-spectral study pod-depth``)."""
    return [run_model(m, Path(out_dir), None if data_dir is None else Path(data_dir),
                      overrides=overrides) for m in models]


def _provenance() -> dict[str, Any]:
    import sys

    from tl_spectral_studies._common import git_commit

    return {"command": " ".join(["python -m tl_spectral_studies.pod_depth"] + sys.argv[1:]),
            "commit": git_commit(), "seed": SEED}


# -------------------------------------------------------------------------------- main
def relabel(path: Path) -> None:
    """Recompute the ``claims`` of a stored result file by :func:`claims` (the rules of this
    code on the stored intervals; nothing else in the file changes)."""
    from tl_spectral_studies.evidence_panel import write_atomic

    res = json.loads(path.read_text(encoding="utf-8"))
    res["claims"] = claims(res)
    write_atomic(path, res)


def main(argv: Sequence[str], prog: str = "python -m tl_spectral_studies.pod_depth") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=sorted(MODELS),
                    help="model to run (repeatable; default smollm2-135m)")
    ap.add_argument("--data-dir", default=None,
                    help="folder with wiki_excerpt.txt (../shared/data); real models only")
    ap.add_argument("--out", default="docs/results/real_decoder/pod_depth",
                    help="output folder (default docs/results/real_decoder/pod_depth)")
    ap.add_argument("--n-docs", type=int, default=None, help="windows N (default per model)")
    ap.add_argument("--length", type=int, default=None, help="tokens T (default per model)")
    ap.add_argument("--tables-only", action="store_true",
                    help="only print the doc's markdown from the JSON files in --out")
    ap.add_argument("--relabel", action="store_true",
                    help="recompute the claims' labels of the JSON files in --out from their "
                         "stored numbers (no model runs), then print the markdown")
    a = ap.parse_args(list(argv))
    out = Path(a.out)
    if a.relabel:
        for p in sorted(out.glob("pod_depth_*.json")):
            relabel(p)
    elif not a.tables_only:
        torch.set_num_threads(1)
        over = {k: v for k, v in (("n_docs", a.n_docs), ("length", a.length)) if v is not None}
        for m in a.model or ["smollm2-135m"]:
            r = run_model(m, out, None if a.data_dir is None else Path(a.data_dir),
                          overrides=over)
            print(json.dumps({"model": m, "seconds": r["seconds"],
                              "forward_s": r["forward_s"]}))
    print(markdown(out))
    return 0


from tl_spectral_studies.pod_depth_tables import markdown  # noqa: E402,F401  (the doc section)

if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
