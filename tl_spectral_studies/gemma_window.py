"""Gemma-3's natural experiment (issue 39 item 5): a 512-token sliding window in 15 of
Gemma-3-270M's 18 layers, measured at T = 1,024 (docs/real_decoder.md, last section).

    python -m tl_spectral_studies.gemma_window --data-dir ../shared/data \\
        --out docs/results/real_decoder/gemma_window
    python -m tl_spectral_studies.gemma_window --data-dir ../shared/data --windows 4 \\
        --length 600 --twin-windows 0 --layers 4 5 6 --out /tmp/gw   # a small run
    python -m tl_spectral_studies.gemma_window --tables-only --out ...   # the doc blocks

Gemma-3-270M (``tl_spectral.models.zoo.load("gemma3-270m")``): 18 layers, 4 query heads
reading 1 key/value head, head_dim 256, QK-norm; layers 5, 11 and 17 attend to every earlier
token with rotary θ = 10⁶, the other 15 to the last ``W`` = 512 tokens (lags 0 … 511) with
θ = 10⁴. The data are windows of the Wikipedia excerpt's validation split with Gemma's own
``<bos>`` in front (:func:`~tl_spectral_studies.evidence.cell_windows`, draw = seed).

Three questions, one file each in ``OUT`` (written atomically; a file whose configuration
matches is reused, so a killed run resumes):

* ``probes.json`` — one probe pass (per window: AttentionFieldProbe accumulated over the
  windows, SinkProbe per window, and :class:`WindowSinkProbe`, this module's per-window
  window/sink statistics):
  (a) does the scale POD see the window? per layer the share of the attention field's
  energy at lags ≥ W, of the mean field and of the fluctuations separately, and H*,
  T_spec, the fine/medium/coarse band shares, with the library's delete-a-group jackknife
  over windows (:func:`field_statistics`), and local − global contrasts with the same
  jackknife;
  (c) where do sinks live once position 0 leaves a local layer's window? for queries
  ``1 ≤ i < W`` and ``i ≥ W`` separately: mean α_i0, the weight on the first visible key
  ``j = i − W + 1``, the top-attended key (its weight, whether it is the first visible key,
  position 0, the query itself or its predecessor, and its lag relative to the visible
  span), the mass at lags ≥ W; and the SinkProbe's statistics per window; intervals by the
  percentile bootstrap over windows.
* ``twin.json`` — the same on the library's random-weight twin
  (:func:`tl_spectral.viz.baseline.random_copy`) on the same windows: what an untrained
  Gemma with this architecture (QK-norm, windows, θ) gives.
* ``routing.json`` — (b) weights only: the offset-resolved rotary QK geometry of the 72
  heads (:func:`~tl_spectral.geometry.model.model_rotary_geometry`: each layer's own θ, the
  causal offset average restricted to the window in local layers), local (60 heads) against
  global (12 heads) under :data:`RULE`, beside i.i.d. Gaussian kernels of the same shapes
  rotated by the same per-layer θ.

What the library lacked and is computed here: the per-window statistics of queries before and
after the window edge (:class:`WindowSinkProbe`), the energy beyond a lag (from document Grams
of the raw fields, :func:`field_statistics`) and the band Grams with the band operators built
once for all layers (:func:`band_grams`, equal to
:func:`~tl_spectral.analysis.scale_pod.scale_pod_grams`, tested).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral.probes.base import LayerCapture, Probe
from tl_spectral_studies.gemma_window_routing import (  # noqa: F401  (re-exported)
    N_PERMUTATIONS,
    RULE,
    gaussian_geometry,
    group_difference,
    head_statistics,
    layer_kinds,
    layer_permutation,
    routing,
    routing_offsets,
    verdict,
)

NAME = "gemma-window"
MODEL = "gemma3-270m"
FIRST = "<bos>"
DEFAULTS = {"windows": 16, "length": 1024, "twin_windows": 16, "draw": 0}
VERSION = 1
"""Bumped when a computation changes (part of every file's configuration)."""
N_RESAMPLES = 1000
JACKKNIFE_GROUPS = 8
EPSILON = 0.10
FIT_ENERGY = 0.99

#: per-query statistics of :class:`WindowSinkProbe`, in column order
WINDOW_STATS = ("n", "alpha0", "first_visible", "edge4", "top_weight", "top_is_first_visible",
                "top_is_0", "top_is_self", "top_is_previous", "top_rel_lag", "top_lag",
                "mass_beyond")
#: SinkProbe rows kept per window (``SinkStats.to_rows`` keys) and the key score
SINK_KEYS = ("sink_rate", "max_head_sink_rate", "sink_head_share", "cos_v0_s",
             "rho_star_in_0_1", "over_sink_share", "rel_delta_norm")
#: per-layer field statistics of (a), in the order of :func:`field_statistics`' vector
FIELD_KEYS = ("mean_beyond_share", "fluct_beyond_share", "mean_energy", "fluct_energy",
              "H_star", "T_spec", "E_fine", "E_medium", "E_coarse")


# ------------------------------------------------------------------------- the probe
class WindowSinkProbe(Probe):
    """Per window, layer and head: where the attention of the queries before and after the
    window edge goes (module docstring, (c)).

    ``split``: the window ``W`` that splits the queries into ``A = {1 ≤ i < W}`` (position
    0 visible in every layer) and ``B = {i ≥ W}`` (position 0 outside a local layer's
    window); the first visible key of query ``i`` is ``j_f = max(0, i − W + 1)`` in every
    layer (in a global layer: the key at lag ``W − 1``, for comparison). Default: the
    model's sliding window. Query 0 (which sees only itself) is in neither set.

    State per layer, one row per window: ``{layer}.A`` and ``{layer}.B`` ``[window, head,
    len(WINDOW_STATS)]`` sums over the set's queries (``n`` its size; every other column a
    sum whose mean is column / n), ``{layer}.beyond_max`` ``[window, head]`` the largest
    α_ij at lags ``i − j ≥ W`` (exactly 0 in a layer whose window is ``W``). Full windows
    only (no padding).
    """

    name = "window_sinks"

    def __init__(self, layers: Sequence[int] | None = None, split: int | None = None):
        super().__init__()
        self.layers = None if layers is None else sorted({int(x) for x in layers})
        self.split = None if split is None else int(split)
        self.reductions = {}

    def requires(self, view: Any) -> dict[int, set[str]]:
        from tl_spectral.model_view import layer_windows

        layers = self._read_layers(view)
        self.windows = layer_windows(view)
        if self.split is None:
            ws = [w for w in self.windows if w is not None]
            if not ws:
                raise ValueError(f"{view.name} has no sliding-window layer; pass split=W")
            self.split = max(ws)
        for layer in layers:
            for k in ("A", "B", "beyond_max"):
                self.reductions[f"{layer}.{k}"] = "cat"
        return {layer: {"pattern"} for layer in layers}

    def update(self, cap: LayerCapture) -> None:
        if not bool(cap.mask.all()):
            raise ValueError("WindowSinkProbe takes full windows only; pass unpadded windows "
                             "of one length")
        p = cap.pattern.double()
        b, H, T, _ = p.shape
        W = int(self.split)
        i = torch.arange(T, device=p.device)
        beyond = (i[:, None] - i[None, :]) >= W  # [T, T]: lags ≥ W
        self.accumulate(f"{cap.layer}.beyond_max",
                        (p * beyond).amax((-1, -2)) if T > W else p.new_zeros(b, H))
        cols = query_statistics(p, W, beyond)  # [b, H, T, K]
        win = self.windows[cap.layer]
        vis = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :]) < (win or T))
        uni = vis.to(p.dtype) / vis.sum(-1, keepdim=True)  # uniform over the visible keys
        for name, sel in (("A", (i >= 1) & (i < W)), ("B", i >= W)):
            s = sel[:, None].to(p.dtype)
            self.accumulate(f"{cap.layer}.{name}", (cols * s).sum(2))
            # the mass each key token receives from the set's queries (heads summed), and
            # what uniform attention over the layer's visible keys would give it; the
            # key at position 0 left out (where the mass goes besides position 0)
            got = (p * s).sum((1, 2))  # [b, T]
            base = (uni * s).sum(0).expand(b, T) * H
            for key, w in ((f"{cap.layer}.{name}_token_mass", got),
                           (f"{cap.layer}.{name}_token_uniform", base)):
                self.accumulate(key, _token_sums(cap.tokens, w))

    def result(self) -> dict[str, Any]:
        self._require_state()
        s = {k: v.cpu() for k, v in self.state.items()}
        return {"stats": list(WINDOW_STATS), "split": int(self.split),
                "windows": list(self.windows), "layers": list(self.layers),
                "A": {li: s[f"{li}.A"] for li in self.layers},
                "B": {li: s[f"{li}.B"] for li in self.layers},
                "beyond_max": {li: s[f"{li}.beyond_max"] for li in self.layers},
                "token_mass": {part: {li: (s[f"{li}.{part}_token_mass"],
                                           s[f"{li}.{part}_token_uniform"])
                                      for li in self.layers} for part in ("A", "B")}}


def _token_sums(tokens: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[max token + 1]`` float64: Σ of ``w [b, T]`` per token id of ``tokens [b, T]``,
    position 0 left out."""
    t, v = tokens[:, 1:].reshape(-1), w[:, 1:].reshape(-1).double()
    return torch.bincount(t, weights=v, minlength=int(tokens.max()) + 1)


def query_statistics(p: torch.Tensor, W: int, beyond: torch.Tensor) -> torch.Tensor:
    """Per query the columns of :data:`WINDOW_STATS` (``n`` = 1) of a causal pattern
    ``p [b, H, T, T]``, reference window ``W`` (first visible key ``max(0, i − W + 1)``),
    ``beyond [T, T]`` the pairs at lags ≥ W: ``[b, H, T, len(WINDOW_STATS)]``."""
    b, H, T, _ = p.shape
    i = torch.arange(T, device=p.device)
    jf = (i - W + 1).clamp_min(0)
    idx = jf.view(1, 1, T, 1).expand(b, H, T, 1)
    first = p.gather(-1, idx).squeeze(-1)
    e = jf[:, None] + torch.arange(4, device=p.device)[None, :]  # [T, 4]
    ok = (e <= i[:, None]).to(p.dtype)
    edge = (p.gather(-1, e.clamp_max(T - 1).view(1, 1, T, 4).expand(b, H, T, 4)) * ok).sum(-1)
    top, js = p.max(-1)
    lag = (i - js).to(p.dtype)
    span = (i - jf).clamp_min(1).to(p.dtype)
    one = torch.ones_like(top)
    cols = [one, p[..., 0], first, edge, top, (js == jf).to(p.dtype), (js == 0).to(p.dtype),
            (js == i).to(p.dtype), (js == i - 1).to(p.dtype), lag / span, lag,
            (p * beyond).sum(-1)]
    return torch.stack(cols, -1)


# ------------------------------------------------------------------------ probe pass
def probe_pass(model: Any, tokens: torch.Tensor, layers: Sequence[int] | None = None,
               split: int | None = None) -> dict[str, Any]:
    """One forward per window: AttentionFieldProbe and :class:`WindowSinkProbe` accumulated
    over the windows, a fresh SinkProbe per window (its statistics per window).

    Returns ``{"fields": AttentionFields, "window": WindowSinkProbe.result(), "sinks":
    {key: [window, layer]}, "key_score": [window, layer, head]}``."""
    from tl_spectral.probes import AttentionFieldProbe, SinkProbe, run_probes

    fp = AttentionFieldProbe(layers=layers)
    wp = WindowSinkProbe(layers=layers, split=split)
    rows: dict[str, list] = {k: [] for k in SINK_KEYS}
    key_score = []
    res: dict[str, Any] = {}
    for d in range(int(tokens.shape[0])):
        sp = SinkProbe(layers=layers)
        res = run_probes(model, tokens[d:d + 1], [fp, wp, sp], batch_size=1, progress=False,
                         accumulate=d > 0)
        srows = res["sinks"].to_rows()
        for k in SINK_KEYS:
            rows[k].append([r[k] for r in srows])
        key_score.append(res["sinks"].key_score.double())
    return {"fields": res["attention_fields"], "window": res["window_sinks"],
            "sinks": {k: torch.tensor(v, dtype=torch.float64) for k, v in rows.items()},
            "key_score": torch.stack(key_score)}


# ---------------------------------------------------------------------------- grams
def band_operators(n_lags: int, T: int) -> dict[str, torch.Tensor]:
    """The fixed bands' energy operators on the default scales of ``T`` queries
    (:func:`~tl_spectral.analysis.scale_pod.band_energy_operators`), built once."""
    from tl_spectral.analysis.scale_pod import band_energy_operators
    from tl_spectral.analysis.wavelets import default_scales

    return band_energy_operators(n_lags, default_scales(T))


def band_grams(F: torch.Tensor, ops: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`~tl_spectral.analysis.scale_pod.scale_pod_grams` of ``F [N, T, n_lags]`` with
    the band operators ``ops`` given (the same arithmetic; the operators, ~1 GB at 1,024
    lags, are built once for all layers instead of once per layer)."""
    N, T, n_lags = (int(d) for d in F.shape)
    X = F.reshape(N, T * n_lags)
    dt = torch.float64 if F.dtype == torch.float64 else torch.float32
    out = {"field": (X.to(dt) @ X.to(dt).T).to(torch.float64)}
    for name, P in ops.items():
        Y = (F.reshape(N * T, n_lags).to(dt) @ P.to(dt)).reshape(N, T * n_lags)
        g = (Y @ X.to(dt).T).to(torch.float64)
        out[name] = 0.5 * (g + g.T)
        del Y
    return out


def layer_grams(fields: Any, layer: int, W: int, ops: dict[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """A layer's document Grams: ``raw`` / ``raw_beyond`` (float64, of the raw fields, all
    lags / lags ≥ W) and the POD's (:func:`band_grams` of the fluctuations)."""
    F = fields.fields[str(layer)]
    N = int(F.shape[0])
    X = F.reshape(N, -1).double()
    Xb = F[:, :, W:].reshape(N, -1).double()
    g = {"raw": X @ X.T, "raw_beyond": Xb @ Xb.T}
    del X, Xb
    g.update(band_grams(fields.fluctuations(layer), ops))
    return g


def _layer_vector(g: dict[str, torch.Tensor], idx: torch.Tensor) -> list[float]:
    """:data:`FIELD_KEYS` of the documents ``idx`` from a layer's Grams."""
    from tl_spectral.analysis.bootstrap import centred_gram_resample
    from tl_spectral.analysis.scale_pod import pod_statistics

    n = int(idx.numel())
    raw, rb = g["raw"][idx][:, idx], g["raw_beyond"][idx][:, idx]
    m_all, m_b = float(raw.sum()) / n ** 2, float(rb.sum()) / n ** 2
    f_all = float(torch.trace(centred_gram_resample(g["raw"], idx))) / n
    f_b = float(torch.trace(centred_gram_resample(g["raw_beyond"], idx))) / n
    pod = pod_statistics({k: v for k, v in g.items() if not k.startswith("raw")}, idx,
                         epsilon=EPSILON, fit_energies=(FIT_ENERGY,))
    share = lambda a, b: a / b if b > 0 else 0.0  # noqa: E731
    return [share(m_b, m_all), share(f_b, f_all), m_all, f_all, pod["H_star"],
            pod[f"T_spec_{round(100 * FIT_ENERGY)}"], pod["E_fine"], pod["E_medium"],
            pod["E_coarse"]]


def _contrast(v: torch.Tensor, kinds: Sequence[str]) -> torch.Tensor:
    """``[K]`` mean over global − mean over local layers of ``v [L, K]`` (NaN when a group is
    empty)."""
    loc = torch.tensor([k == "local" for k in kinds])
    if not loc.any() or loc.all():
        return torch.full((v.shape[1],), float("nan"), dtype=torch.float64)
    return v[~loc].mean(0) - v[loc].mean(0)


def field_statistics(fields: Any, W: int, kinds: Sequence[str], *, seed: int = 0,
                     n_groups: int = JACKKNIFE_GROUPS) -> dict[str, Any]:
    """(a): per layer :data:`FIELD_KEYS` and the global − local contrasts, each with the
    library's delete-a-group jackknife over windows
    (:func:`~tl_spectral.analysis.bootstrap.group_jackknife`; the energies and POD
    statistics of every replicate from the layers' Grams, fluctuations about the
    replicate's own mean).

    ``mean_beyond_share``: ``Σ_{i, τ ≥ W} F̄(i, τ)² / Σ F̄²`` of the ensemble-mean field;
    ``fluct_beyond_share``: the same share of the fluctuation energy ``Σ_s ‖F_s − F̄‖²``;
    ``mean_energy``, ``fluct_energy`` (per window) their totals; H* (ε = 0.1), T_spec (the
    power law over the modes holding 99% of the energy, the library's default) and the band
    shares of the POD of the fluctuations (:func:`~tl_spectral.analysis.scale_pod.
    pod_statistics`)."""
    from tl_spectral.analysis.bootstrap import group_jackknife
    from tl_spectral.analysis.scale_pod import h_star_bound, h_star_bounded

    layers = list(fields.layers)
    T, n_lags = (int(d) for d in fields.fields[str(layers[0])].shape[1:])
    ops = band_operators(n_lags, T)
    grams = []
    for li in layers:
        grams.append(layer_grams(fields, li, W, ops))
    del ops
    N = int(grams[0]["raw"].shape[0])
    K = len(FIELD_KEYS)

    def stat(idx: torch.Tensor) -> torch.Tensor:
        v = torch.tensor([_layer_vector(g, idx) for g in grams], dtype=torch.float64)
        return torch.cat([v.flatten(), _contrast(v, kinds)])

    jk = group_jackknife(stat, N, n_groups=n_groups, seed=seed)

    def iv(pos: int) -> dict[str, float]:
        return {k: float(jk[k][pos]) for k in ("estimate", "low", "high", "se")}

    rows = []
    for li, (layer, kind) in enumerate(zip(layers, kinds)):
        row = {"layer": int(layer), "kind": kind,
               **{k: iv(li * K + ki) for ki, k in enumerate(FIELD_KEYS)}}
        row["H_star_bounded"] = h_star_bounded(row["H_star"]["estimate"], N, EPSILON)
        rows.append(row)
    return {"per_layer": rows,
            "global_minus_local": {k: iv(len(layers) * K + ki) for ki, k in
                                   enumerate(FIELD_KEYS)},
            "jackknife": jk["meta"], "n_windows": N, "h_star_bound": h_star_bound(N, EPSILON),
            "epsilon": EPSILON, "fit_energy": FIT_ENERGY}


# ------------------------------------------------------------------- query statistics
def doc_iv(x: torch.Tensor, seed: int = 0) -> dict:
    """Percentile bootstrap over windows (axis 0) of the mean
    (:func:`tl_spectral_studies.real_decoder.doc_iv`, :data:`N_RESAMPLES` resamples)."""
    from tl_spectral_studies.real_decoder import doc_iv as _iv

    return _iv(x, seed=seed, n_resamples=N_RESAMPLES)


def _per_layer_ivs(x: torch.Tensor, kinds: Sequence[str], seed: int) -> dict[str, Any]:
    """``x [window, layer]``: per-layer intervals, the local and global layer means and
    global − local, each over windows (NaN-free: a group that is absent is left out)."""
    loc = torch.tensor([k == "local" for k in kinds])
    out: dict[str, Any] = {"per_layer": doc_iv(x, seed)}
    if loc.any():
        out["local"] = doc_iv(x[:, loc].mean(1), seed)
    if (~loc).any():
        out["global"] = doc_iv(x[:, ~loc].mean(1), seed)
    if loc.any() and (~loc).any():
        out["global_minus_local"] = doc_iv(x[:, ~loc].mean(1) - x[:, loc].mean(1), seed)
    return out


def query_summary(window: dict[str, Any], kinds: Sequence[str], seed: int = 0
                  ) -> dict[str, Any]:
    """(c): per set of queries (``A``: 1 ≤ i < W, ``B``: i ≥ W) and statistic of
    :data:`WINDOW_STATS`, the head-mean per window and layer, with intervals over windows
    (:func:`_per_layer_ivs`); ``beyond_max``: per layer the largest α_ij at lags ≥ W over
    every window and head."""
    layers = window["layers"]
    out: dict[str, Any] = {"split": window["split"], "stats": list(WINDOW_STATS[1:])}
    for part in ("A", "B"):
        S = torch.stack([window[part][li] for li in layers], 1)  # [window, layer, head, K]
        n = S[..., 0].sum(-1)  # [window, layer]
        if not bool((n > 0).all()):
            continue
        out[part] = {"n_queries_per_head": int(S[0, 0, 0, 0]),
                     **{k: _per_layer_ivs(S[..., c].sum(-1) / n, kinds, seed)
                        for c, k in enumerate(WINDOW_STATS) if k != "n"}}
    out["beyond_max"] = [float(window["beyond_max"][li].max()) for li in layers]
    return out


def token_summary(window: dict[str, Any], decode: Any = None, top: int = 5
                  ) -> dict[str, Any]:
    """Per set of queries and layer, the ``top`` key tokens by the share of the attention
    mass they receive (position 0 left out), with the share uniform attention over the
    layer's visible keys would give them and the ratio of the two (pooled over windows and
    heads; descriptive). ``decode``: token id -> text (default: the id)."""
    out: dict[str, Any] = {}
    for part, per in window["token_mass"].items():
        rows = []
        for li in window["layers"]:
            got, base = per[li]
            if not float(got.sum()) > 0:
                continue
            share, ushare = got / got.sum(), base / base.sum()
            ids = share.argsort(descending=True)[:top].tolist()
            rows.append({"layer": int(li), "tokens": [
                {"id": int(t), "text": decode(int(t)) if decode else str(t),
                 "share": float(share[t]), "uniform_share": float(ushare[t]),
                 "ratio": float(share[t] / ushare[t]) if ushare[t] > 0 else None}
                for t in ids]})
        out[part] = rows
    return out


def sink_summary(run: dict[str, Any], kinds: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """The SinkProbe's per-window statistics (:data:`SINK_KEYS`, and the head-mean Gu key
    score of position 0) with intervals over windows."""
    keys = dict(run["sinks"])
    keys["key_score"] = run["key_score"].mean(-1)
    return {k: _per_layer_ivs(v, kinds, seed) for k, v in keys.items()}


def measure(model: Any, tokens: torch.Tensor, *, layers: Sequence[int] | None = None,
            seed: int = 0, decode: Any = None) -> dict[str, Any]:
    """(a) and (c) on ``tokens [window, T]`` (full windows): one probe pass
    (:func:`probe_pass`), then :func:`field_statistics`, :func:`query_summary` and
    :func:`sink_summary`."""
    run = probe_pass(model, tokens, layers)
    win = run["window"]
    kinds = layer_kinds(win["windows"], win["layers"])
    W = int(win["split"])
    out = {"n_windows": int(tokens.shape[0]), "length": int(tokens.shape[1]), "split": W,
           "layers": list(win["layers"]), "kinds": kinds,
           "layer_windows": [win["windows"][li] for li in win["layers"]],
           "queries": query_summary(win, kinds, seed),
           "key_tokens": token_summary(win, decode),
           "sink_probe": sink_summary(run, kinds, seed)}
    fields = run.pop("fields")
    del run
    out["fields"] = field_statistics(fields, W, kinds, seed=seed)
    return out


# ---------------------------------------------------------------------------- routing
STEPS = ("routing", "probes", "twin")


def step_config(step: str, cfg: dict) -> dict:
    """What a step's file depends on (a stored file is reused only when this matches)."""
    c = {"version": VERSION, "model": cfg.get("model", MODEL), "step": step,
         "first": FIRST, "corpus": "wiki", "draw": cfg["draw"], "length": cfg["length"]}
    if step == "probes":
        c.update(windows=cfg["windows"], layers=cfg.get("layers"))
    elif step == "twin":
        c.update(windows=cfg["twin_windows"], layers=cfg.get("layers"), twin_seed=cfg["draw"])
    return c


def _command(argv: Sequence[str] | None) -> str:
    return " ".join(["python -m tl_spectral_studies.gemma_window",
                     *(sys.argv[1:] if argv is None else argv)])


def run_step(step: str, out: Path, loaded: tuple[Any, Any], tokens: torch.Tensor, cfg: dict,
             command: str, log: Any = print) -> dict:
    """One step into ``OUT/<step>.json`` (atomically), skipped when its file is done with
    the same configuration."""
    from tl_spectral_studies.evidence_panel import config_hash, is_done, write_atomic

    conf = step_config(step, cfg)
    path = Path(out) / f"{step}.json"
    if is_done(path, conf):
        log(json.dumps({"step": step, "ran": False}))
        return json.loads(path.read_text(encoding="utf-8"))
    model = loaded[0]
    t0 = time.perf_counter()
    if step == "routing":
        res = routing(model, n_ctx=cfg["length"], seed=cfg["draw"])
    elif step == "probes":
        res = measure(model, tokens[: cfg["windows"]], layers=cfg.get("layers"),
                      seed=cfg["draw"], decode=_decoder(loaded[1]))
    else:
        from tl_spectral.viz.baseline import INIT_STD, random_copy

        twin = random_copy(model, seed=cfg["draw"])
        res = measure(twin, tokens[: cfg["twin_windows"]], layers=cfg.get("layers"),
                      seed=cfg["draw"], decode=_decoder(loaded[1]))
        res["twin"] = {"function": "tl_spectral.viz.baseline.random_copy",
                       "init_std": INIT_STD, "seed": cfg["draw"]}
        del twin
    secs = round(time.perf_counter() - t0, 1)
    obj = {"config": conf, "config_hash": config_hash(conf), "seconds": secs,
           "threads": torch.get_num_threads(), "command": command, **_jsonable(res)}
    write_atomic(path, obj)
    log(json.dumps({"step": step, "ran": True, "seconds": secs}))
    return obj


def _decoder(tok: Any) -> Any:
    """token id -> its text (``repr``-quoted, so spaces and newlines show), or None."""
    if tok is None or not callable(getattr(tok, "decode", None)):
        return None
    return lambda t: repr(tok.decode([t]))


def _jsonable(x: Any) -> Any:
    from tl_spectral_studies.real_decoder import _jsonable as j

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return j(x)


def run_study(out_dir: str | Path, data_dir: str | Path | None, *,
              steps: Sequence[str] = STEPS, loaded: tuple[Any, Any] | None = None,
              tokens: torch.Tensor | None = None, command: str | None = None,
              log: Any = print, **overrides: Any) -> dict:
    """Run ``steps`` into ``out_dir``. ``overrides``: entries of :data:`DEFAULTS` and
    ``layers``; ``loaded``: ``(model, tokenizer)`` (default ``zoo.load(MODEL)``);
    ``tokens``: the windows (default :func:`~tl_spectral_studies.evidence.cell_windows` of
    the Wikipedia excerpt with ``<bos>`` first, draw ``draw``)."""
    cfg = {**DEFAULTS, "layers": None}
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError(f"unknown setting {k!r}; use one of {sorted(cfg)}")
        if v is not None:
            cfg[k] = v
    for k in ("windows", "twin_windows"):  # the jackknife drops a group of windows
        if cfg[k] < 3 and not (k == "twin_windows" and cfg[k] == 0):
            raise ValueError(f"{k}={cfg[k]}: the jackknife over windows needs at least 3; "
                             f"pass {k}=3 or more" + (" (or 0: no twin)" if k != "windows"
                                                      else ""))
    if loaded is None:
        from tl_spectral.models import zoo

        loaded = zoo.load(MODEL)
    if tokens is None and any(s != "routing" for s in steps):
        from tl_spectral_studies._common import require_data_dir
        from tl_spectral_studies.evidence import cell_windows
        from tl_spectral_studies.evidence_panel import Cell

        data = require_data_dir(data_dir, "wiki_excerpt.txt")
        n = max(cfg["windows"], cfg["twin_windows"])
        tokens = cell_windows(data, loaded[1], Cell(FIRST, "wiki", cfg["draw"]), n,
                              cfg["length"])
    if tokens is not None:
        cfg["length"] = int(tokens.shape[1])
    times = {}
    for step in steps:
        if step == "twin" and cfg["twin_windows"] == 0:
            continue
        r = run_step(step, Path(out_dir), loaded, tokens, cfg,
                     command or _command(None), log)
        times[step] = r["seconds"]
    return {"seconds": times}


def main(argv: Sequence[str], prog: str = "python -m tl_spectral_studies.gemma_window") -> int:
    from tl_spectral.usage import ArgumentParser
    from tl_spectral_studies._common import positive_int, prepare_out

    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results/real_decoder/gemma_window")
    ap.add_argument("--data-dir", default=None, help="folder with wiki_excerpt.txt")
    ap.add_argument("--step", action="append", choices=STEPS,
                    help="run only this step (repeatable; default all)")
    ap.add_argument("--windows", type=positive_int, default=DEFAULTS["windows"])
    ap.add_argument("--length", type=positive_int, default=DEFAULTS["length"])
    ap.add_argument("--twin-windows", type=int, default=DEFAULTS["twin_windows"],
                    help="windows of the random-weight twin (0: no twin)")
    ap.add_argument("--draw", type=int, default=DEFAULTS["draw"], help="window draw (seed)")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="probe these layers only (a small run)")
    ap.add_argument("--tables-only", action="store_true",
                    help="only print the doc blocks from the results in --out")
    a = ap.parse_args(list(argv))
    if not a.tables_only:
        out = prepare_out(a.out, NAME)
        print(json.dumps(run_study(out, a.data_dir, steps=a.step or STEPS, windows=a.windows,
                                   length=a.length, twin_windows=a.twin_windows,
                                   draw=a.draw, layers=a.layers, command=_command(argv))))
    print(markdown(a.out))
    return 0


from tl_spectral_studies.gemma_window_tables import markdown, tables  # noqa: E402,F401

if __name__ == "__main__":  # python -m tl_spectral_studies.gemma_window ...
    from tl_spectral.usage import UsageError

    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as err:  # one line, exit 2 (as the tl-spectral CLI does)
        print(f"python -m tl_spectral_studies.gemma_window: error: {err}", file=sys.stderr)
        sys.exit(2)
