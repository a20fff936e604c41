"""The three papers' claims on a real pretrained decoder, SmolLM2-135M-Instruct (docs/real_decoder.md).

    tl-spectral study real-decoder --data-dir ../shared/data --out docs/results/real_decoder
    tl-spectral study real-decoder --data-dir ../shared/data --step routing --out ...
    tl-spectral study real-decoder --quick --data-dir ../shared/data --out /tmp/rd  # seconds

Steps (``--step``, repeatable; default all), each writing ``OUT/<step>.json``:

* ``sinks`` (seed 003): with and without the start token on the same Wikipedia text, and on
  Austen with it: the library's probes (ContributionProbe, SinkProbe; per document, so every
  per-layer number has an interval over documents) and the brute-force sink decomposition
  from the Hugging Face modules (:mod:`tl_spectral_studies.real_decoder_ops`), the
  zero-the-sink ΔPPL (paired over windows);
* ``faithfulness`` (seed 003): comprehensiveness / sufficiency of the paper's four measures
  under the layer-wide ranking (where value-weighted and output-normalized differ);
* ``routing`` (seed 002): the offset-resolved rotary QK geometry of all 270 heads and an
  i.i.d. Gaussian reference of the same shapes;
* ``scales`` (seed 000): scale POD of the attention fields of every layer;
* ``interventions`` (seed 002): zero-shot linearization of the leading k layers and
  routing-only / filtering-only attention, paired over windows.

:func:`verdicts` turns the numbers into labels by the rules of :data:`RULES` (tested);
``OUT/verdicts.json`` holds them; :func:`tables` renders the doc blocks.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral.usage import ArgumentParser
from tl_spectral_studies._common import (
    add_run_arguments,
    fmt_interval,
    prepare_out,
    require_data_dir,
)

NAME = "real-decoder"
MODEL = "smollm2-135m"
START = 1  # <|im_start|>
STEPS = ("sinks", "faithfulness", "routing", "scales", "interventions")
N_RESAMPLES = 1000
FULL = {"n_docs": 8, "length": 128, "faith_docs": 6, "faith_length": 32,
        "pod_docs": 150, "pod_length": 128, "int_docs": 8, "int_length": 128,
        "ks": [0, 1, 2, 3, 4, 6, 8, 16, 30], "removal_layers": list(range(30)),
        "layers": None, "per_head_layers": [0, 14, 29]}
QUICK = {"n_docs": 2, "length": 32, "faith_docs": 2, "faith_length": 16,
         "pod_docs": 8, "pod_length": 32, "int_docs": 2, "int_length": 32,
         "ks": [0, 1, 2], "removal_layers": [0, 1], "layers": [0, 1], "per_head_layers": [0]}
CHEAP = 0.05
"""A removal is cheap when the upper end of its paired interval of PPL'/PPL − 1 is below
this (+5%, the surgery paper's tolerance for linearization)."""
INV_RULE = ("reproduced when the paired interval of log PPL(routing removed) − log "
            "PPL(filtering removed) lies below 0 and removing routing is cheap (interval upper "
            "end below +5%); partly when only the first holds; not reproduced when the "
            "interval lies above 0")
SINK_LAYER_MIN = 0.5
"""A layer counts as a sink layer when the document-interval of its mean α_i0 (start token
in front) lies above this."""


# ------------------------------------------------------------------------------- data
def windows(data_dir: Path, corpus: str, tok: Any, n: int, length: int, seed: int = 0
            ) -> torch.Tensor:
    """``[n, length]`` token windows from the validation split (last 10%) of
    ``DATA_DIR/<corpus>``, without a start token (the caller puts one in front)."""
    from tl_spectral.data import document_windows, train_val_split

    text = (data_dir / corpus).read_text(encoding="utf-8")
    _, val = train_val_split(text)
    return document_windows(val, tok, n, length, seed=seed).tokens


def with_start(w: torch.Tensor) -> torch.Tensor:
    """The same text with the start token in front (the last token dropped)."""
    return torch.cat([torch.full((w.shape[0], 1), START, dtype=w.dtype), w[:, :-1]], 1)


def doc_iv(x: torch.Tensor, *, seed: int = 0, n_resamples: int = N_RESAMPLES) -> dict:
    """Percentile bootstrap over documents (axis 0) of the mean: ``estimate/low/high`` lists
    (or floats for ``x [n]``)."""
    from tl_spectral.analysis.bootstrap import bootstrap

    x = torch.as_tensor(x, dtype=torch.float64)
    iv = bootstrap(lambda idx: x[idx].mean(0), int(x.shape[0]), n_resamples=n_resamples,
                   seed=seed)
    d = iv.to_dict()
    return {k: d[k] for k in ("estimate", "low", "high")}


def _ratio_iv(num: torch.Tensor, den: torch.Tensor, seed: int = 0) -> dict:
    from tl_spectral.analysis.bootstrap import bootstrap

    iv = bootstrap(lambda idx: num[idx].mean() / den[idx].mean(), int(num.shape[0]),
                   n_resamples=N_RESAMPLES, seed=seed)
    d = iv.to_dict()
    return {k: d[k] for k in ("estimate", "low", "high")}


@functools.lru_cache(maxsize=2)
def _load(need_bridge: bool = True):
    """(bridge or None, tokenizer, HF Llama), loaded once per process."""
    from tl_spectral.models import zoo
    from tl_spectral_studies.real_decoder_ops import load_hf

    bridge, tok = zoo.load(MODEL) if need_bridge else (None, None)
    if tok is None:
        from transformers import AutoTokenizer

        from tl_spectral.models import smollm2

        tok = AutoTokenizer.from_pretrained(str(smollm2.ensure_cache(progress=False)))
    return bridge, tok, load_hf()


# ------------------------------------------------------------------------------ sinks
def _probe_rows(bridge: Any, tokens: torch.Tensor, layers: Sequence[int] | None) -> dict:
    """Library probes per document: SinkProbe rows and per-head rates, ContributionProbe's
    first-token contribution and attention."""
    from tl_spectral.probes import ContributionProbe, SinkProbe, run_probes

    keys = ("sink_rate", "cos_v0_s", "rho_star_in_0_1", "rho_star_clamped", "rel_delta_norm",
            "delta_cos")
    out: dict[str, list] = {k: [] for k in (*keys, "C_on_first_token", "attn_on_first_token",
                                            "head_sink_rate", "head_key_score")}
    for d in range(int(tokens.shape[0])):
        res = run_probes(bridge, tokens[d:d + 1], [ContributionProbe(rank_stride=1, layers=layers),
                                                   SinkProbe(layers=layers)],
                         batch_size=1, progress=False)
        srows = res["sinks"].to_rows()
        crows = res["contributions"].to_rows()
        for k in keys:
            out[k].append([r[k] for r in srows])
        out["C_on_first_token"].append([r["C_on_first_token"] for r in crows])
        out["attn_on_first_token"].append([r["attn_on_first_token"] for r in crows])
        out["head_sink_rate"].append(res["sinks"].sink_rate.double())
        out["head_key_score"].append(res["sinks"].key_score.double())
    return {k: (torch.stack(v) if isinstance(v[0], torch.Tensor)
                else torch.tensor(v, dtype=torch.float64)) for k, v in out.items()}


def run_sinks(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral_studies.real_decoder_ops import (
        SINK_KEYS,
        relative_ppl_change,
        sink_decompositions,
        window_nll,
    )

    t0 = time.perf_counter()
    bridge, tok, hf = _load()
    layers = cfg["layers"]
    n, T = cfg["n_docs"], cfg["length"]
    wiki = windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed)
    austen = windows(data_dir, "austen.txt", tok, n, T, seed)
    settings = {"wiki_start": with_start(wiki), "wiki_no_start": wiki,
                "austen_start": with_start(austen)}
    res: dict[str, Any] = {"model": MODEL, "n_docs": n, "length": T, "seed": seed,
                           "layers": layers, "settings": {}}
    L = len(hf.model.layers)
    lay = list(range(L)) if layers is None else list(layers)
    res["layer_ids"] = lay
    for name, toks in settings.items():
        s: dict[str, Any] = {"first_tokens": tok.convert_ids_to_tokens(toks[:, 0].tolist())}
        pr = _probe_rows(bridge, toks, layers)
        brute = sink_decompositions(hf, toks, lay)
        s["probe"] = {k: doc_iv(v, seed=seed) for k, v in pr.items()
                      if not k.startswith("head_")}
        s["head_sink_rate"] = pr["head_sink_rate"].mean(0).tolist()  # [L, H]
        s["head_key_score"] = pr["head_key_score"].mean(0).tolist()
        s["brute"] = {k: doc_iv(brute[k], seed=seed) for k in SINK_KEYS}
        s["brute_head_attn0"] = brute["head_attn0"].mean(0).tolist()
        # the library's first-token contribution and attention against the brute force, per
        # document and layer; the probe's means include query 0, where α_00 = C_00 = 1
        Tn = int(toks.shape[1])
        for key, pk in (("C0", "C_on_first_token"), ("attn0", "attn_on_first_token")):
            incl = (1.0 + (Tn - 1) * brute[key]) / Tn
            s[f"probe_vs_brute_max_abs_diff_{key}"] = float((pr[pk] - incl).abs().max())
        # pooled over the sink layers of this setting (documents resampled together)
        a0 = brute["attn0"].mean(0)
        sink = [i for i in range(len(lay)) if float(a0[i]) > SINK_LAYER_MIN]
        s["sink_layers"] = [lay[i] for i in sink]
        if sink:
            idx = torch.tensor(sink)
            s["pooled"] = {
                "C0_over_attn0": _ratio_iv(brute["C0"][:, idx].mean(1),
                                           brute["attn0"][:, idx].mean(1), seed),
                **{k: doc_iv(v[:, idx].mean(1), seed=seed) for k, v in
                   {"cos_v0_s": pr["cos_v0_s"], "rho_star_in_0_1": pr["rho_star_in_0_1"],
                    "v0_over_vothers": brute["v0_over_vothers"],
                    "cos_minus_others": brute["cos_factor"] - brute["cos_factor_others"],
                    "cone_change": brute["cone_zeroed"] - brute["cone_clean"],
                    "rel_norm_change": brute["rel_norm_change"],
                    "tail_C_minus_attn": brute["tail_C_share"] - brute["tail_attn_share"],
                    }.items()}}
        clean = window_nll(hf, toks)
        zero = window_nll(hf, toks, {li: "zero_sink" for li in lay})
        s["zero_sink_ppl"] = relative_ppl_change(clean, zero, T - 1, seed=seed)
        res["settings"][name] = s
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "sinks.json", res)
    return res


# ----------------------------------------------------------------------- faithfulness
FAITH_MEASURES = ("attention", "value_weighted", "output_normalized", "contribution", "random")
HIERARCHY = ("attention", "value_weighted", "output_normalized", "contribution")


def run_faithfulness(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral.probes.faithfulness import faithfulness

    t0 = time.perf_counter()
    bridge, tok, _ = _load()
    n, T = cfg["faith_docs"], cfg["faith_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 1))
    res: dict[str, Any] = {"model": MODEL, "n_docs": n, "length": T, "seed": seed,
                           "measures": list(FAITH_MEASURES), "scope": "layer"}
    sums, counts = [], []
    meta: dict[str, Any] = {}
    for d in range(n):
        f = faithfulness(bridge, toks[d:d + 1], measures=FAITH_MEASURES, scope="layer",
                         batch_size=1, seed=seed + d, rows_per_pass=64,
                         layer=None if cfg["layers"] is None else cfg["layers"][-1])
        curves = torch.stack([f.comprehensiveness, f.sufficiency], 2).double()  # [S, M, 2, F]
        sums.append(float(f.n_tokens) * torch.log(curves + f.clean))
        counts.append(float(f.n_tokens))
        meta = {"settings": list(f.settings), "fractions": list(f.fractions),
                "aliases": dict(f.aliases), "clean_ppl_last_doc": f.clean}
    res.update(meta)
    S = torch.stack(sums)  # [n, S, M, 2, F]
    C = torch.tensor(counts, dtype=torch.float64)
    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral.analysis.faithfulness import curve_area

    fr = meta["fractions"]
    # areas of ΔPPL relative to the clean PPL (a relative change, comparable across scales);
    # clean NLL: the r = 0 point of every curve is the clean run

    def stat(idx: torch.Tensor) -> torch.Tensor:
        nll = S[idx].sum(0) / C[idx].sum()  # mean NLL per condition
        clean = nll[..., :1]
        rel = torch.exp(nll - clean) - 1.0
        a = curve_area(fr, rel)  # [S, M, 2]
        dif = a[:, :, None, :] - a[:, None, :, :]
        return torch.cat([a.flatten(), dif.flatten()])

    iv = bootstrap(stat, n, n_resamples=N_RESAMPLES, seed=seed)
    nS, nM = len(meta["settings"]), len(FAITH_MEASURES)
    k = nS * nM * 2

    def part(lo: int, hi: int, shape: tuple) -> dict:
        return {"estimate": iv.estimate[lo:hi].reshape(shape).tolist(),
                "low": iv.low[lo:hi].reshape(shape).tolist(),
                "high": iv.high[lo:hi].reshape(shape).tolist()}

    res["areas"] = part(0, k, (nS, nM, 2))
    res["differences"] = part(k, len(iv.estimate), (nS, nM, nM, 2))
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "faithfulness.json", res)
    return res


# ---------------------------------------------------------------------------- routing
OFFSETS = (0, -1, -2, -4, -8, -16, -32, -64, -127)


def run_routing(out: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral.geometry.model import model_rotary_geometry
    from tl_spectral.geometry.rotary import RotarySpec, rotary_qk_geometry

    t0 = time.perf_counter()
    bridge, _, _ = _load()
    n_ctx = cfg["length"]
    g = model_rotary_geometry(bridge, offsets=list(OFFSETS), n_ctx=n_ctx, average_ranks=False)
    gen = torch.Generator().manual_seed(seed)
    L, H = g.routing_fraction.shape[:2]
    d = g.d_head[0]
    WQ = torch.randn(L, H, g.d_model, d, generator=gen, dtype=torch.float64)
    WK = torch.randn(L, g.n_kv_heads, g.d_model, d, generator=gen, dtype=torch.float64)
    base = rotary_qk_geometry(WQ, WK, RotarySpec(g.inv_freq, g.pairing, g.attention_scaling),
                              offsets=list(OFFSETS), n_ctx=n_ctx, average_ranks=False)
    cap = min(2 * d, g.d_model)

    def heads_iv(x: torch.Tensor) -> dict:  # x [L, H] -> interval over the 270 heads
        flat = x.flatten().double()
        iv = bootstrap(lambda idx: flat[idx].mean(), flat.numel(), n_resamples=N_RESAMPLES,
                       seed=seed).to_dict()
        return {k: iv[k] for k in ("estimate", "low", "high")}

    def thirds(x: torch.Tensor) -> dict:  # last third − first third of the layers, over heads
        a, b = x[: L // 3].flatten().double(), x[-(L // 3):].flatten().double()
        from tl_spectral.analysis.bootstrap import resample_indices

        ia = resample_indices(a.numel(), N_RESAMPLES, seed)
        ib = resample_indices(b.numel(), N_RESAMPLES, seed + 1)
        reps = b[ib].mean(1) - a[ia].mean(1)
        return {"estimate": float(b.mean() - a.mean()),
                "low": float(reps.quantile(0.025)), "high": float(reps.quantile(0.975))}

    rf0 = g.routing_fraction[..., 0]
    res: dict[str, Any] = {
        "model": MODEL, "n_ctx": n_ctx, "offsets": list(OFFSETS), "n_heads_total": L * H,
        "capacity": cap, "distribution": g.distribution,
        "routing_fraction_delta0": heads_iv(rf0),
        "routing_fraction_causal": heads_iv(g.mean_routing_fraction),
        "eff_rank_R_delta0": heads_iv(g.eff_rank_R[..., 0]),
        "eff_rank_F_delta0": heads_iv(g.eff_rank_F[..., 0]),
        "gaussian": {"routing_fraction_delta0": float(base.routing_fraction[..., 0].mean()),
                     "routing_fraction_causal": float(base.mean_routing_fraction.mean()),
                     "eff_rank_R_delta0": float(base.eff_rank_R[..., 0].mean()),
                     "eff_rank_F_delta0": float(base.eff_rank_F[..., 0].mean())},
        "per_layer": [{"layer": li,
                       "rf_by_offset": g.routing_fraction[li].mean(0).tolist(),
                       "rf_causal": float(g.mean_routing_fraction[li].mean()),
                       "rf_causal_min": float(g.mean_routing_fraction[li].min()),
                       "rf_causal_max": float(g.mean_routing_fraction[li].max()),
                       "rank_R_by_offset": g.eff_rank_R[li].mean(0).tolist(),
                       "rank_F_by_offset": g.eff_rank_F[li].mean(0).tolist()}
                      for li in range(L)],
        "gaussian_rf_by_offset": base.routing_fraction.flatten(0, 1).mean(0).tolist(),
        "offset_effect": heads_iv(g.routing_fraction[..., -1] - rf0),
        "depth_effect_rf": thirds(g.mean_routing_fraction),
        "depth_effect_rank_R": thirds(g.eff_rank_R[..., 0]),
    }
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "routing.json", res)
    return res


# ----------------------------------------------------------------------------- scales
def run_scales(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral_studies.scale_pod import bootstrap_layers

    t0 = time.perf_counter()
    bridge, tok, _ = _load()
    n, T = cfg["pod_docs"], cfg["pod_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 2))
    fields = run_probes(bridge, toks, [AttentionFieldProbe(layers=cfg["layers"])],
                        batch_size=8, progress=False)["attention_fields"]
    pod = fields.scale_pod(n_heads=9)
    boot = bootstrap_layers([fields.fluctuations(li) for li in fields.layers],
                            n_resamples=N_RESAMPLES)
    res: dict[str, Any] = {"model": MODEL, "n_docs": n, "length": T, "seed": seed,
                           "corpus": "wiki_excerpt.txt (validation split), start token first",
                           "table": pod.to_rows(), "bootstrap": boot}
    del fields
    ph = run_probes(bridge, toks, [AttentionFieldProbe(layers=cfg["per_head_layers"],
                                                       per_head=True)],
                    batch_size=8, progress=False)["attention_fields"]
    php = ph.scale_pod(n_heads=9)
    res["per_head"] = [{"layer": int(li), "diversity": _jsonable(lay.diversity)}
                       for li, lay in zip(ph.layers, php.layers)]
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "scales.json", res)
    return res


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ---------------------------------------------------------------------- interventions
def run_interventions(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral_studies.real_decoder_ops import relative_ppl_change, window_nll

    t0 = time.perf_counter()
    _, tok, hf = _load(need_bridge=False)
    n, T = cfg["int_docs"], cfg["int_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 3))
    L = len(hf.model.layers)
    clean = window_nll(hf, toks)
    res: dict[str, Any] = {"model": MODEL, "n_docs": n, "length": T, "seed": seed,
                           "ppl_clean": math.exp(float(clean.sum()) / (n * (T - 1)))}
    lin = []
    for k in cfg["ks"]:
        if k == 0:
            continue
        nll = window_nll(hf, toks, {li: "linear" for li in range(min(k, L))})
        lin.append({"k": k, **relative_ppl_change(clean, nll, T - 1, seed=seed)})
    res["linearization"] = lin
    rem: dict[str, Any] = {}
    layer_sets = {"all layers": list(range(L))}
    layer_sets.update({f"layer {li}": [li] for li in cfg["removal_layers"]})
    for label, ls in layer_sets.items():
        row: dict[str, Any] = {}
        nll = {}
        for keep in ("routing", "filtering"):
            nll[keep] = window_nll(hf, toks, {li: keep for li in ls})
            row[f"keep_{keep}"] = relative_ppl_change(clean, nll[keep], T - 1, seed=seed)
        # paired: log PPL(routing removed) − log PPL(filtering removed), over windows
        from tl_spectral.analysis.bootstrap import bootstrap

        diff = bootstrap(lambda idx: (nll["filtering"][idx].sum() - nll["routing"][idx].sum())
                         / (len(idx) * (T - 1)), n, n_resamples=N_RESAMPLES, seed=seed).to_dict()
        row["log_ppl_routing_removed_minus_filtering_removed"] = {
            k: diff[k] for k in ("estimate", "low", "high")}
        rem[label] = row
    res["removal"] = rem
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "interventions.json", res)
    return res


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(_jsonable(obj), indent=1) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- verdicts
RULES = {
    "sign": "reproduced when the 95% interval lies on the claimed side of the threshold, "
            "not reproduced when it lies on the other side, else not distinguishable",
}


def sign_label(iv: dict | None, threshold: float, claim_below: bool) -> str:
    """The sign rule of :data:`RULES`: ``iv`` (``low``, ``high``) against ``threshold``;
    ``claim_below``: the claim is that the value lies below the threshold."""
    if not iv:
        return "not tested"
    lo, hi = float(iv["low"]), float(iv["high"])
    if (hi < threshold) if claim_below else (lo > threshold):
        return "reproduced"
    if (lo > threshold) if claim_below else (hi < threshold):
        return "not reproduced"
    return "not distinguishable"


def hierarchy_label(diff: dict, aliases: dict, setting: int = 0, kind: int = 0
                    ) -> tuple[str, list]:
    """The four-measure order attention < value-weighted < output-normalized < contribution.
    ``kind`` 0: comprehensiveness (a larger area is more faithful: each step holds when the
    interval of area(better) − area(worse) lies above 0); 1: sufficiency (a smaller area is
    more faithful: the interval lies below 0). A step is reversed when the interval lies on
    the other side, a tie by construction when the two measures are aliases; reproduced when
    every step holds, not reproduced when one is reversed, else partly."""
    M = list(FAITH_MEASURES)
    steps = []
    for a, b in zip(HIERARCHY, HIERARCHY[1:]):
        if aliases.get(b) == a or aliases.get(a) == b:
            steps.append((f"{a} < {b}", "tie by construction", None))
            continue
        ia, ib = M.index(a), M.index(b)
        iv = {k: diff[k][setting][ib][ia][kind] for k in ("estimate", "low", "high")}
        steps.append((f"{a} < {b}", sign_label(iv, 0.0, claim_below=kind == 1), iv))
    labels = [s[1] for s in steps]
    if all(x == "reproduced" for x in labels):
        lab = "reproduced"
    elif any(x == "not reproduced" for x in labels):
        lab = "not reproduced"
    else:
        lab = "partly"
    return lab, steps


def verdicts(results_dir: str | Path) -> list[dict]:
    """Per-claim SmolLM2 verdicts from the step results present in ``results_dir``: claim
    id, claim text, number, interval, label, rule."""
    d = Path(results_dir)
    V: list[dict] = []

    def add(cid: str, claim: str, number: str, iv: dict | None, label: str, rule: str) -> None:
        V.append({"id": cid, "claim": claim, "number": number,
                  "interval": None if iv is None else
                  [iv.get("low"), iv.get("high")] if "low" in iv else None,
                  "label": label, "rule": rule})

    def load(name: str) -> dict | None:
        p = d / f"{name}.json"
        return json.loads(p.read_text()) if p.is_file() else None

    s = load("sinks")
    if s:
        st = s["settings"]["wiki_start"]
        ns = s["settings"]["wiki_no_start"]
        nsink = len(st["sink_layers"])
        mx = max(max(r) for r in st["head_sink_rate"])
        add("C.sink", "decoders with a start token form attention sinks",
            f"{nsink} of {len(s['layer_ids'])} layers with mean α_i0 > {SINK_LAYER_MIN}; "
            f"largest head sink rate {mx:.3f}", None,
            "reproduced" if nsink > 0 else "not reproduced",
            f"a count over layers (no interval): reproduced when at least one layer's mean "
            f"attention on the start token exceeds {SINK_LAYER_MIN}")
        P = st.get("pooled", {})
        r = P.get("C0_over_attn0")
        add("C.little", "the sink draws attention but contributes little to the output",
            f"contribution / attention of the start token over the sink layers "
            f"{fmt_interval(r)}", r, sign_label(r, 0.5, claim_below=True),
            "sign rule on C_i0 / α_i0 pooled over sink layers against 0.5 (the sink supplies "
            "less than half the output share its attention would give)")
        r = P.get("cos_v0_s")
        add("C.anti", "the sink's value is anti-aligned with the mean output of the other "
            "tokens, cos(ṽ_0, s_i) < 0", f"cos over the sink layers {fmt_interval(r)}", r,
            sign_label(r, 0.0, claim_below=True), "sign rule against 0")
        r = P.get("rho_star_in_0_1")
        add("C.rho", "the optimal sink rate ρ* lies below 1 (0 < ρ* < 1)",
            f"share of queries with 0 < ρ* < 1 over the sink layers {fmt_interval(r)}", r,
            sign_label(r, 0.5, claim_below=False),
            "sign rule on the share of queries against 0.5 (a majority); not a clamped mean")
        r = st["zero_sink_ppl"]
        add("C.zero_ppl", "removing the sink's value raises perplexity",
            f"PPL'/PPL − 1 = {fmt_interval(r, '{:+.3g}')} (every layer, paired over windows)",
            r, sign_label(r, 0.0, claim_below=False), "sign rule against 0 (relative change)")
        r = P.get("cone_change")
        add("C.cone", "without the sink, outputs collapse into a narrow cone",
            f"change of the mean pairwise cosine of layer outputs over the sink layers "
            f"{fmt_interval(r, '{:+.3g}')}", r, sign_label(r, 0.0, claim_below=False),
            "sign rule: the pairwise cosine rises (> 0)")
        r = P.get("rel_norm_change")
        add("C.norm", "zeroing the sink changes the output norm",
            f"mean ‖o'‖/‖o‖ − 1 over the sink layers {fmt_interval(r, '{:+.3g}')}", r,
            sign_label(r, 0.0, claim_below=True), "sign rule: the norm drops (< 0)")
        r1, r2 = P.get("v0_over_vothers"), P.get("cos_minus_others")
        l1 = sign_label(r1, 1.0, claim_below=True)
        l2 = sign_label(r2, 0.0, claim_below=True)
        add("C.split", "the sink's small contribution comes from its value norm and its "
            "direction", f"‖ṽ_0‖ / mean ‖ṽ_j‖ {fmt_interval(r1)} (norm factor: {l1}); "
            f"cos(o, ṽ_0) − cos(o, ṽ_j) {fmt_interval(r2, '{:+.3g}')} (cosine factor: {l2})",
            r1, "reproduced" if l1 == l2 == "reproduced" else
            "partly" if "reproduced" in (l1, l2) else "not reproduced",
            "each factor by the sign rule (norm ratio < 1; cosine below the other tokens' by "
            "α-weighted mean); reproduced when both hold, partly when one does")
        r = P.get("tail_C_minus_attn")
        add("C.tail", "tail tokens: their contribution is set jointly by attention and "
            "alignment (not by attention alone)", f"contribution share − attention share of "
            f"tail tokens {fmt_interval(r, '{:+.3g}')}", r,
            "reproduced" if r and (r["low"] > 0 or r["high"] < 0) else "not distinguishable",
            "reproduced when the interval of the difference excludes 0")
        b0 = ns["brute"]
        li24 = s["layer_ids"].index(24) if 24 in s["layer_ids"] else len(s["layer_ids"]) - 1
        diff = max(ns["probe_vs_brute_max_abs_diff_C0"], ns["probe_vs_brute_max_abs_diff_attn0"])
        add("C.puzzle", "issue 26: without a start token, position 0 draws most of layer 24's "
            "attention and supplies most of its output — model or measure?",
            f"layer {s['layer_ids'][li24]} no start token: α_i0 "
            f"{b0['attn0']['estimate'][li24]:.3f}, C_i0 {b0['C0']['estimate'][li24]:.3f}; "
            f"with start token: α_i0 {st['brute']['attn0']['estimate'][li24]:.3f}, C_i0 "
            f"{st['brute']['C0']['estimate'][li24]:.3f}; library probe − brute force from the "
            f"HF modules, max over documents and layers {diff:.1e}", None,
            "the model (the measure matches the brute force)" if diff < 1e-3 else
            "the measure (the probe differs from the brute force)",
            "measure wrong when the library's C_i0 or α_i0 (mean over queries, query 0 "
            "included) differs from the brute force from the HF modules by more than 1e-3 on "
            "any document and layer")
    f = load("faithfulness")
    if f:
        for si, sname in enumerate(f["settings"]):
            for kind, kname in ((0, "comprehensiveness"), (1, "sufficiency")):
                lab, steps = hierarchy_label(f["differences"], f["aliases"], si, kind)
                txt = "; ".join(f"{n}: {lb}" + (f" {fmt_interval(iv, '{:+.3g}')}" if iv else "")
                                for n, lb, iv in steps)
                add(f"C.hierarchy.{kname[:4]}.{sname.replace(' ', '')}",
                    f"faithfulness hierarchy attention < value-weighted < output-normalized < "
                    f"contribution ({kname}, {sname})",
                    f"layer-wide ranking, {f['n_docs']} documents; steps (difference of areas "
                    f"of PPL'/PPL − 1): {txt}", None, lab,
                    "every step by the sign rule on the area difference (comprehensiveness: "
                    "above 0; sufficiency: below 0); reproduced when all three steps hold, not "
                    "reproduced when one is reversed, else partly; the step intervals are in "
                    "the number column")
    r = load("routing")
    if r:
        g = r["gaussian"]
        for key, what in (("routing_fraction_delta0", "Δ = 0"),
                          ("routing_fraction_causal", "causal offset distribution")):
            iv = r[key]
            add(f"B.budget.{key}", f"filtering dominates the spectral budget (routing fraction "
                f"< 0.5), {what}", f"routing fraction {fmt_interval(iv)} over "
                f"{r['n_heads_total']} heads; Gaussian kernel {g[key]:.3f}", iv,
                sign_label(iv, 0.5, claim_below=True),
                "sign rule against 0.5 (interval over heads)")
        iv = r["eff_rank_R_delta0"]
        cap = r["capacity"]
        lab = ("reproduced" if iv["high"] < 0.5 * cap else
               "not reproduced" if iv["low"] > 0.5 * cap else "not distinguishable")
        add("B.rank", "routing runs at low rank, far below the capacity min(2·d_head, d_model)",
            f"entropy rank of R at Δ = 0 {fmt_interval(iv)} of {cap} "
            f"({100 * iv['estimate'] / cap:.0f}%); Gaussian {g['eff_rank_R_delta0']:.1f}", iv,
            lab, "reproduced when the interval lies below half the capacity, not reproduced "
            "above it")
        iv = r["depth_effect_rank_R"]
        add("B.depth", "routing rank rises with depth (the cascade)",
            f"rank of R, last third − first third of the layers {fmt_interval(iv, '{:+.3g}')}",
            iv, sign_label(iv, 0.0, claim_below=False), "sign rule against 0")
    sc = load("scales")
    if sc:
        tb = sc["table"]
        b = sc["bootstrap"]
        N = sc["n_docs"]
        e0 = b["layers"][0]["E_fine_minus_coarse"]
        eL = b["layers"][-1]["E_fine_minus_coarse"]
        l0 = sign_label(e0, 0.0, claim_below=False)
        lL = sign_label(eL, 0.0, claim_below=True)
        add("A.bands", "fine scales (a ≤ 7) early, coarse (a ≥ 20) late",
            f"E fine − E coarse: layer {tb[0]['layer']} {fmt_interval(e0, '{:+.2f}')}, layer "
            f"{tb[-1]['layer']} {fmt_interval(eL, '{:+.2f}')}", e0,
            "reproduced" if l0 == lL == "reproduced" else
            "partly" if "reproduced" in (l0, lL) else "not reproduced",
            "sign rule in the first (fine > coarse) and last layer (coarse > fine); partly "
            "when one holds")
        hs = [_hstar(row["H_star"]) for row in tb]
        bound = sum(1 for h in hs if h is not None and h >= N - 1)
        jk = b["jackknife"]["last_minus_first"]["H_star"]
        add("A.hstar", "H*(0.1) higher early than late (paper: > 150 vs ≈ 91 at N = 150)",
            f"H* first {tb[0]['H_star']}, last {tb[-1]['H_star']} of N = {N}; last − first "
            f"{fmt_interval(jk, '{:+.1f}')} (jackknife); {bound} layers at the bound N − 1",
            jk, "not tested: H* bounded by N" if bound else
            sign_label(jk, 0.0, claim_below=True) + (
                " (zero-width jackknife interval: every replicate gives the same counts; "
                "not certainty)" if jk["low"] == jk["high"] else ""),
            "sign rule on last − first (jackknife interval); not tested when a layer's H* "
            "reaches N − 1 (a statistic bounded by N carries no verdict)")
        jt = b["jackknife"]["last_minus_first"]["T_spec_99"]
        add("A.tspec", "T_spec changes with depth", f"T_spec (99% fit) last − first "
            f"{fmt_interval(jt, '{:+.3g}')} (jackknife)", jt,
            "descriptive: " + ("rises" if jt["low"] > 0 else "falls" if jt["high"] < 0
                               else "no change distinguishable"),
            "descriptive (the papers' direction is contradicted within its own summary, "
            "SPEC A.7): the sign of the jackknife interval")
        rec = [row["recommended_heads"] for row in tb]
        add("A.alloc", "head allocation ∝ H* differs from the uniform 9 heads per layer",
            f"recommended heads per layer {rec} (uniform 9)", None,
            "descriptive: no trained test", "no rule: an allocation is advice until a model "
            "trained with it is compared (not done here)")
    it = load("interventions")
    if it:
        lin = {row["k"]: row for row in it["linearization"]}
        ks = sorted(lin)
        kmax = 0  # the largest k such that every k' <= k stays within +5% (upper end)
        for k in ks:
            if lin[k]["high"] >= 0.05:
                break
            kmax = k
        k3 = lin.get(3)
        add("B.linear", "early layers linearize zero-shot (S–D paper: first 4 layers within "
            "1.4%, first 7 < 5% of a 125 M S–D model)",
            "PPL'/PPL − 1: " + "; ".join(f"k = {k}: {fmt_interval(lin[k], '{:+.3g}')}"
                                         for k in ks[:4]) + f"; largest k within +5%: {kmax}",
            lin.get(ks[0]) if ks else None,
            "reproduced" if kmax >= 4 else "not reproduced",
            "reproduced when linearizing the leading 4 layers stays within +5% (upper end of "
            "the paired interval, every k ≤ 4); the paper's claim is for S–D models, standard "
            "attention is expected to fail (next row)")
        if k3:
            add("B.collapse3", "standard attention collapses under linearization from layer 3",
                "PPL'/PPL − 1: " + "; ".join(f"k = {k}: {fmt_interval(lin[k], '{:+.3g}')}"
                                             for k in ks if k <= 3), k3,
                sign_label(k3, 1.0, claim_below=False),
                "collapse = PPL more than doubles at k = 3 (interval above +100%); the smaller k "
                "are in the number column")
        def inv_label(row: dict) -> str:
            d_ = row["log_ppl_routing_removed_minus_filtering_removed"]
            sign = sign_label(d_, 0.0, claim_below=True)
            if sign != "reproduced":
                return sign
            return "reproduced" if row["keep_filtering"]["high"] < CHEAP else \
                "partly: routing removal costs less, but is not cheap"

        a = it["removal"]["all layers"]
        add("B.inversion", "the inversion: in standard attention removing filtering is "
            "prohibitive, removing routing cheap (every layer at once)",
            f"keep routing (filtering removed) {fmt_interval(a['keep_routing'], '{:+.3g}')}, "
            f"keep filtering (routing removed) {fmt_interval(a['keep_filtering'], '{:+.3g}')} "
            f"(PPL'/PPL − 1); log PPL(routing removed) − log PPL(filtering removed) "
            f"{fmt_interval(a['log_ppl_routing_removed_minus_filtering_removed'], '{:+.3g}')}",
            a["log_ppl_routing_removed_minus_filtering_removed"], inv_label(a), INV_RULE)
        single = {k: v for k, v in it["removal"].items() if k != "all layers"}
        if single:
            labs = {k: inv_label(v) for k, v in single.items()}
            n_ok = sum(1 for v in labs.values() if v == "reproduced")
            signs = [sign_label(v["log_ppl_routing_removed_minus_filtering_removed"], 0.0,
                                claim_below=True) for v in single.values()]
            rr = [v["keep_filtering"]["estimate"] for v in single.values()]
            fr = [v["keep_routing"]["estimate"] for v in single.values()]
            cheap = sum(1 for v in single.values() if v["keep_filtering"]["high"] < CHEAP)
            add("B.inversion.layer", "the inversion, one layer at a time",
                f"{len(single)} layers ({', '.join(k.split()[-1] for k in single)}): routing "
                f"removed {min(rr):+.3g} to {max(rr):+.3g}, filtering removed {min(fr):+.3g} "
                f"to {max(fr):+.3g} (PPL'/PPL − 1); routing removal costs less (interval below "
                f"0) in {signs.count('reproduced')}, more in {signs.count('not reproduced')}, "
                f"not distinguishable in {signs.count('not distinguishable')}; routing removal "
                f"cheap (upper end < +{100 * CHEAP:.0f}%) in {cheap}; per-layer intervals in "
                "the interventions table", None,
                f"reproduced in {n_ok} of {len(single)} layers tested",
                f"a count over the layers tested, each by the rule of the row above ({INV_RULE});"
                " no multiple-comparison correction, so descriptive")
    return V


def _hstar(x: Any) -> int | None:
    try:
        return int(str(x).lstrip(">≥ ").split("–")[0])
    except ValueError:
        return None


# ----------------------------------------------------------------------------- tables
def verdict_markdown(V: list[dict]) -> str:
    L = ["| claim (paper) | SmolLM2-135M number [95% CI] | verdict | rule |", "|---|---|---|---|"]
    for v in V:
        L.append(f"| {v['id']}: {v['claim']} | {v['number']} | {v['label']} | {v['rule']} |")
    return "\n".join(L)


def _iv_cell(iv: dict, i: int | None = None, fmt: str = "{:.3f}") -> str:
    if i is None:
        return fmt_interval(iv, fmt)
    return fmt_interval({k: iv[k][i] for k in ("estimate", "low", "high")}, fmt)


def sinks_markdown(s: dict) -> str:
    lay = s["layer_ids"]
    out = []
    for name, st in s["settings"].items():
        out.append(f"**{name}** (first tokens: {', '.join(sorted(set(st['first_tokens'])))}; "
                   f"sink layers: {st['sink_layers'] or 'none'}; zero the sink in every layer: "
                   f"PPL'/PPL − 1 = {fmt_interval(st['zero_sink_ppl'], '{:+.3g}')})")
        out.append("")
        out.append("| layer | α_i0 | C_i0 | ‖ṽ_0‖/mean ‖ṽ_j‖ | cos(o,ṽ_0) | cos(o,ṽ_j) | "
                   "cos(ṽ_0,s) | 0<ρ*<1 | ‖o'‖/‖o‖−1 | cone clean → zeroed | max head α_i0 | "
                   "sink heads (key score > 0.3) |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        b, p = st["brute"], st["probe"]
        for i, li in enumerate(lay):
            out.append(
                f"| {li} | {_iv_cell(b['attn0'], i)} | {_iv_cell(b['C0'], i)} | "
                f"{_iv_cell(b['v0_over_vothers'], i, '{:.2f}')} | "
                f"{b['cos_factor']['estimate'][i]:.2f} | "
                f"{b['cos_factor_others']['estimate'][i]:.2f} | "
                f"{_iv_cell(p['cos_v0_s'], i, '{:.2f}')} | "
                f"{_iv_cell(p['rho_star_in_0_1'], i, '{:.2f}')} | "
                f"{b['rel_norm_change']['estimate'][i]:+.2f} | "
                f"{b['cone_clean']['estimate'][i]:.2f} → {b['cone_zeroed']['estimate'][i]:.2f} | "
                f"{max(st['brute_head_attn0'][i]):.3f} | "
                f"{sum(1 for x in st['head_key_score'][i] if x > 0.3)} of "
                f"{len(st['head_key_score'][i])} |")
        out.append("")
    return "\n".join(out).rstrip()


def faith_markdown(f: dict) -> str:
    L = ["| setting | measure | comprehensiveness area [95% CI] | sufficiency area [95% CI] |",
         "|---|---|---|---|"]
    for si, sname in enumerate(f["settings"]):
        for mi, m in enumerate(f["measures"]):
            c = {k: f["areas"][k][si][mi][0] for k in ("estimate", "low", "high")}
            s = {k: f["areas"][k][si][mi][1] for k in ("estimate", "low", "high")}
            L.append(f"| {sname} | {m} | {fmt_interval(c)} | {fmt_interval(s)} |")
    L.append("")
    L.append(f"Areas of the relative ΔPPL curve (PPL'/PPL − 1) over removal fractions "
             f"{f['fractions'][0]}–{f['fractions'][-1]}; {f['n_docs']} documents of "
             f"{f['length']} tokens (start token first), layer-wide ranking; intervals: "
             f"bootstrap over documents. Aliases (identical rankings by construction): "
             f"{f['aliases'] or 'none'}.")
    return "\n".join(L)


def routing_markdown(r: dict) -> str:
    offs = r["offsets"]
    L = ["| layer | " + " | ".join(f"Δ = {o}" for o in offs) + " | causal mean (min–max) | "
         "rank R at Δ = 0 | rank F at Δ = 0 |", "|---|" + "---|" * (len(offs) + 3)]
    for row in r["per_layer"]:
        L.append(f"| {row['layer']} | " + " | ".join(f"{x:.3f}" for x in row["rf_by_offset"])
                 + f" | {row['rf_causal']:.3f} ({row['rf_causal_min']:.3f}–"
                 f"{row['rf_causal_max']:.3f}) | {row['rank_R_by_offset'][0]:.1f} | "
                 f"{row['rank_F_by_offset'][0]:.1f} |")
    L.append("| Gaussian | " + " | ".join(f"{x:.3f}" for x in r["gaussian_rf_by_offset"])
             + f" | {r['gaussian']['routing_fraction_causal']:.3f} | "
             f"{r['gaussian']['eff_rank_R_delta0']:.1f} | {r['gaussian']['eff_rank_F_delta0']:.1f} |")
    L.append("")
    L.append(f"Routing fraction ‖R(Δ)‖²/‖M(Δ)‖² (head mean), M(Δ) = W_Q R(Δ) W_Kᵀ with the RMSNorm "
             f"gain folded; causal mean over the offsets of a {r['n_ctx']}-token window; "
             f"capacity {r['capacity']}. Over all {r['n_heads_total']} heads: Δ = 0 "
             f"{fmt_interval(r['routing_fraction_delta0'])}, causal "
             f"{fmt_interval(r['routing_fraction_causal'])}; Δ = {offs[-1]} minus Δ = 0 "
             f"{fmt_interval(r['offset_effect'], '{:+.3g}')}; last − first third of the "
             f"layers: causal routing fraction {fmt_interval(r['depth_effect_rf'], '{:+.3g}')}, "
             f"rank of R {fmt_interval(r['depth_effect_rank_R'], '{:+.3g}')} (intervals: "
             f"bootstrap over heads).")
    return "\n".join(L)


def scales_markdown(sc: dict) -> str:
    b = sc["bootstrap"]
    L = ["| layer | dominant scales | E fine | E medium | E coarse | E fine − coarse [95% CI] | "
         "T_spec (R²) | H*(0.1) [jackknife] | heads rec. / uniform |", "|---|" + "---|" * 8]
    for i, row in enumerate(sc["table"]):
        jk = b["jackknife"]["layers"][i]["H_star"]
        L.append(f"| {row['layer']} | {row['dominant_scales']} | {row['E_fine']:.2f} | "
                 f"{row['E_medium']:.2f} | {row['E_coarse']:.2f} | "
                 f"{fmt_interval(b['layers'][i]['E_fine_minus_coarse'], '{:+.2f}')} | "
                 f"{row['T_spec']:.3g} ({row['tspec_r2']:.2f}) | {row['H_star']} "
                 f"[{jk['low']:.0f}, {jk['high']:.0f}] | {row['recommended_heads']} / "
                 f"{row['uniform_heads']} |")
    L.append("")
    L.append(f"N = {sc['n_docs']} windows × {sc['length']} tokens ({sc['corpus']}); H* ≤ N − 1 "
             f"by construction. Per-head diversity (layers "
             f"{[p['layer'] for p in sc['per_head']]}): "
             + "; ".join(f"layer {p['layer']}: {_diversity_text(p['diversity'])}"
                         for p in sc["per_head"]) + ".")
    return "\n".join(L)


def _diversity_text(d: dict) -> str:
    def g(k: str, fmt: str = "{:.2f}") -> str:
        v = d.get(k)
        return "—" if v is None else fmt.format(v) if isinstance(v, float) else str(v)

    return (f"peak scales {g('peak_scale_min')}–{g('peak_scale_max')} "
            f"(log2 std {g('log2_peak_scale_std')}), {g('n_scale_classes')} scale classes, "
            f"band counts {d.get('band_counts')}, mean pairwise TV {g('mean_pairwise_tv')}, "
            f"head H* {g('H_star_min')}–{g('H_star_max')}")


def interventions_markdown(it: dict) -> str:
    L = [f"Clean PPL {it['ppl_clean']:.3f} ({it['n_docs']} windows × {it['length']} tokens).",
         "", "| leading layers linearized k | PPL | PPL'/PPL − 1 [95% CI, paired] |",
         "|---|---|---|"]
    for row in it["linearization"]:
        L.append(f"| {row['k']} | {row['ppl_changed']:.3f} | "
                 f"{fmt_interval(row, '{:+.3g}')} |")
    L += ["", "| layers | keep routing (filtering removed) | keep filtering (routing removed) | "
          "log PPL difference (routing removed − filtering removed) |", "|---|---|---|---|"]
    for label, row in it["removal"].items():
        L.append(f"| {label} | {fmt_interval(row['keep_routing'], '{:+.3g}')} | "
                 f"{fmt_interval(row['keep_filtering'], '{:+.3g}')} | "
                 f"{fmt_interval(row['log_ppl_routing_removed_minus_filtering_removed'], '{:+.3g}')} |")
    return "\n".join(L)


def tables(results_dir: str | Path) -> dict[str, str]:
    """Every generated block of docs/real_decoder.md, by key."""
    d = Path(results_dir)
    out = {"real_decoder/verdict": verdict_markdown(verdicts(d))}
    for step, fn in (("sinks", sinks_markdown), ("faithfulness", faith_markdown),
                     ("routing", routing_markdown), ("scales", scales_markdown),
                     ("interventions", interventions_markdown)):
        p = d / f"{step}.json"
        if p.is_file():
            out[f"real_decoder/{step}"] = fn(json.loads(p.read_text()))
    return out


def markdown(results_dir: str | Path) -> str:
    return "\n\n".join(tables(results_dir).values())


def write_verdicts(results_dir: str | Path) -> list[dict]:
    V = verdicts(results_dir)
    (Path(results_dir) / "verdicts.json").write_text(json.dumps(V, indent=1) + "\n",
                                                     encoding="utf-8")
    return V


# -------------------------------------------------------------------------------- main
def run_study(out_dir: str | Path, data_dir: str | Path, *, steps: Sequence[str] = STEPS,
              quick: bool = False, seed: int = 0, **overrides: Any) -> dict:
    """Run ``steps`` into ``out_dir``; ``overrides``: entries of :data:`FULL` / :data:`QUICK`
    (e.g. ``pod_docs=150``)."""
    out = Path(out_dir)
    cfg = dict(QUICK if quick else FULL)
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError(f"unknown setting {k!r}; use one of {sorted(cfg)}")
        if v is not None:
            cfg[k] = v
    data = require_data_dir(data_dir, "wiki_excerpt.txt and austen.txt")
    times = {}
    for step in steps:
        t0 = time.perf_counter()
        if step == "sinks":
            run_sinks(out, data, cfg, seed)
        elif step == "faithfulness":
            run_faithfulness(out, data, cfg, seed)
        elif step == "routing":
            run_routing(out, cfg, seed)
        elif step == "scales":
            run_scales(out, data, cfg, seed)
        elif step == "interventions":
            run_interventions(out, data, cfg, seed)
        times[step] = round(time.perf_counter() - t0, 1)
    write_verdicts(out)
    return {"seconds": times}


def main(argv: Sequence[str], prog: str = "tl-spectral study real-decoder") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="real_decoder_results")
    ap.add_argument("--data-dir", default=None,
                    help="folder with wiki_excerpt.txt and austen.txt (../shared/data)")
    ap.add_argument("--step", action="append", choices=STEPS,
                    help="run only this step (repeatable; default all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pod-docs", type=int, default=None,
                    help="windows of the scale POD (default 150, the paper's N; H* <= N - 1)")
    ap.add_argument("--n-docs", type=int, default=None, help="windows of the sinks step")
    ap.add_argument("--int-docs", type=int, default=None,
                    help="windows of the interventions step")
    ap.add_argument("--faith-docs", type=int, default=None,
                    help="windows of the faithfulness step")
    ap.add_argument("--tables-only", action="store_true",
                    help="only rewrite verdicts.json from the results in --out")
    a = ap.parse_args(list(argv))
    out = prepare_out(a.out, NAME, overwrite=a.overwrite)
    if a.tables_only:
        write_verdicts(out)
    else:
        r = run_study(out, a.data_dir, steps=a.step or STEPS, quick=a.quick, seed=a.seed,
                      pod_docs=a.pod_docs, n_docs=a.n_docs, int_docs=a.int_docs,
                      faith_docs=a.faith_docs)
        print(json.dumps(r))
    print(markdown(out))
    return 0


if __name__ == "__main__":  # python -m tl_spectral_studies.real_decoder ...
    import sys

    sys.exit(main(sys.argv[1:], prog="python -m tl_spectral_studies.real_decoder"))
