"""The three papers' claims on a real pretrained decoder, SmolLM2-135M-Instruct or Gemma-3-270M (docs/real_decoder.md).

    tl-spectral study real-decoder --data-dir ../shared/data --out docs/results/real_decoder
    tl-spectral study real-decoder --data-dir ../shared/data --step routing --out ...
    tl-spectral study real-decoder --model gemma3-270m --data-dir ../shared/data \
        --out docs/results/real_decoder                      # into OUT/gemma3-270m/
    tl-spectral study real-decoder --quick --data-dir ../shared/data --out /tmp/rd  # seconds

``--model`` (:data:`MODELS`): ``smollm2-135m`` (default; results in ``OUT`` itself) or
``gemma3-270m`` (results in ``OUT/gemma3-270m``). Each model's windows start with its own
start token (SmolLM2 ``<|im_start|>``, Gemma-3 ``<bos>``; the id from its tokenizer), and
its brute-force references come from the Hugging Face class of its cache folder
(:func:`tl_spectral_studies.real_decoder_ops.load_hf`: Llama, Gemma 3 with QK-norm, one
key/value head and sliding-window layers).

Steps (``--step``, repeatable; default all), each writing ``<results>/<step>.json``:

* ``sinks`` (seed 003): with and without the start token on the same Wikipedia text, and on
  Austen with it: the library's probes (ContributionProbe, SinkProbe; per document, so every
  per-layer number has an interval over documents) and the brute-force sink decomposition
  from the Hugging Face modules (:mod:`tl_spectral_studies.real_decoder_ops`), the
  zero-the-sink ΔPPL (paired over windows);
* ``faithfulness`` (seed 003): comprehensiveness / sufficiency of the paper's four measures
  under the layer-wide ranking (where value-weighted and output-normalized differ);
* ``routing`` (seed 002): the offset-resolved rotary QK geometry of every head (SmolLM2: 270,
  Gemma-3: 72) and an i.i.d. Gaussian reference of the same shapes (each layer's own rotary
  θ); on a model with sliding-window layers also per layer type (local / global);
* ``scales`` (seed 000): scale POD of the attention fields of every layer (with each
  layer's type where the model has two);
* ``interventions`` (seed 002): zero-shot linearization of the leading k layers and
  routing-only / filtering-only attention, paired over windows.

:func:`verdicts` turns the numbers into labels by the rules of :data:`RULES` (tested);
``<results>/verdicts.json`` holds them; :func:`tables` renders the doc blocks.
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
    prepare_out,
    require_data_dir,
)
from tl_spectral_studies.claims import rules

NAME = "real-decoder"
MODEL = "smollm2-135m"
"""The default model (its results in OUT itself, where they have always been)."""
STEPS = ("sinks", "faithfulness", "routing", "scales", "interventions")
N_RESAMPLES = 1000
FULL = {"n_docs": 8, "length": 128, "faith_docs": 6, "faith_length": 32,
        "pod_docs": 150, "pod_length": 128, "int_docs": 8, "int_length": 128,
        "ks": [0, 1, 2, 3, 4, 6, 8, 16, 30], "removal_layers": list(range(30)),
        "layers": None, "per_head_layers": [0, 14, 29]}
QUICK = {"n_docs": 2, "length": 32, "faith_docs": 2, "faith_length": 16,
         "pod_docs": 8, "pod_length": 32, "int_docs": 2, "int_length": 32,
         "ks": [0, 1, 2], "removal_layers": [0, 1], "layers": [0, 1], "per_head_layers": [0]}
MODELS = {
    "smollm2-135m": {"start": "<|im_start|>", "subdir": "", "full": {}},
    "gemma3-270m": {"start": "<bos>", "subdir": "gemma3-270m", "full": {
        "ks": [0, 1, 2, 3, 4, 6, 8, 12, 18], "removal_layers": list(range(18)),
        "per_head_layers": [0, 5, 9, 17]}},
}
"""Per model: its start token, the folder of its results under OUT, and the settings of
:data:`FULL` that depend on its depth (Gemma-3: 18 layers; per-head POD of the first local,
first global, a middle local and the last global layer)."""
from tl_spectral_studies.claims.seed003 import (  # noqa: E402,F401  (one declaration of each)
    FAITH_MEASURES,
    HIERARCHY,
    SINK_LAYER_MIN,
)


# ------------------------------------------------------------------------------- data
def windows(data_dir: Path, corpus: str, tok: Any, n: int, length: int, seed: int = 0
            ) -> torch.Tensor:
    """``[n, length]`` token windows from the validation split (last 10%) of
    ``DATA_DIR/<corpus>``, without a start token (the caller puts one in front)."""
    from tl_spectral.data import document_windows, train_val_split

    text = (data_dir / corpus).read_text(encoding="utf-8")
    _, val = train_val_split(text)
    return document_windows(val, tok, n, length, seed=seed).tokens


def start_token_id(tok: Any, model: str = MODEL) -> int:
    """The id of ``model``'s start token (:data:`MODELS`) in its tokenizer."""
    from tl_spectral_studies.evidence_panel import start_id

    return int(start_id(tok, MODELS[model]["start"]))


def framing_record(cfg: dict, window_seed: int) -> dict[str, Any]:
    """What a step's results file records of its windows' framing (the claims registry's
    sensitivity names it): the first token, the corpus and the window draw."""
    return {"first_token": MODELS[cfg["model"]]["start"],
            "corpus": "wiki_excerpt.txt (validation split)", "window_seed": int(window_seed)}


def with_start(w: torch.Tensor, start: int) -> torch.Tensor:
    """The same text with the start token ``start`` in front (the last token dropped)."""
    return torch.cat([torch.full((w.shape[0], 1), start, dtype=w.dtype), w[:, :-1]], 1)


def results_dir(out: str | Path, model: str = MODEL) -> Path:
    """Where ``model``'s results go under ``out`` (SmolLM2: ``out`` itself)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; use one of {sorted(MODELS)}")
    sub = MODELS[model]["subdir"]
    return Path(out) / sub if sub else Path(out)


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
def _load_cached(model: str, need_bridge: bool = True):
    from tl_spectral.models import zoo
    from tl_spectral_studies.real_decoder_ops import load_hf

    bridge, tok = zoo.load(model) if need_bridge else (None, None)
    if tok is None:
        from tl_spectral.models import gguf

        tok = gguf.tokenizer(model, progress=False)
    return bridge, tok, load_hf(model)


def _load(cfg: dict, need_bridge: bool = True):
    """(bridge or None, tokenizer, HF decoder) of ``cfg["model"]``, loaded once per process;
    ``cfg["loaded"]``: the three given instead (tests pass tiny models)."""
    if cfg.get("loaded") is not None:
        return cfg["loaded"]
    return _load_cached(cfg["model"], need_bridge)


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
    bridge, tok, hf = _load(cfg)
    start = start_token_id(tok, cfg["model"])
    layers = cfg["layers"]
    n, T = cfg["n_docs"], cfg["length"]
    wiki = windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed)
    austen = windows(data_dir, "austen.txt", tok, n, T, seed)
    settings = {"wiki_start": with_start(wiki, start), "wiki_no_start": wiki,
                "austen_start": with_start(austen, start)}
    res: dict[str, Any] = {"model": cfg["model"], "n_docs": n, "length": T, "seed": seed,
                           "layers": layers, "settings": {}}
    L = len(hf.model.layers)
    lay = list(range(L)) if layers is None else list(layers)
    res["layer_ids"] = lay
    from tl_spectral.model_view import layer_windows

    wins = layer_windows(bridge)
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
        # document and layer; the probe's means include query 0, where α_00 = C_00 = 1, and
        # run over the queries that see key 0 (a sliding window W: the first min(T, W))
        Tn = int(toks.shape[1])
        n0 = torch.tensor([min(Tn, wins[li] or Tn) for li in lay], dtype=torch.float64)
        for key, pk in (("C0", "C_on_first_token"), ("attn0", "attn_on_first_token")):
            incl = (1.0 + (Tn - 1) * brute[key]) / n0
            s[f"probe_vs_brute_max_abs_diff_{key}"] = float((pr[pk] - incl).abs().max())
        s.update(select_and_pool(pr, brute, lay, seed))
        bs = nll_batch(hf, T)
        clean = window_nll(hf, toks, batch_size=bs)
        zero = window_nll(hf, toks, {li: "zero_sink" for li in lay}, batch_size=bs)
        s["zero_sink_ppl"] = relative_ppl_change(clean, zero, T - 1, seed=seed)
        res["settings"][name] = s
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "sinks.json", res)
    return res


SINK_KEYS_POOLED = ("C0", "attn0", "v0_over_vothers", "cos_factor", "cos_factor_others",
                    "cone_zeroed", "cone_clean", "rel_norm_change", "tail_C_share",
                    "tail_attn_share")
"""The brute-force keys :func:`select_and_pool` reads."""


def select_and_pool(pr: dict, brute: dict, lay: Sequence[int], seed: int = 0) -> dict:
    """The sink layers and the numbers pooled over them, without testing a selection on the
    windows that chose it: the layers are selected on one half of the windows by the
    documented interval rule (:func:`~tl_spectral_studies.claims.rules.select_layers`, the
    bootstrap interval of mean α_i0 above :data:`SINK_LAYER_MIN`) and the pooled numbers
    computed on the other half (documents resampled together). Fewer than 4 windows: no
    split (recorded as ``"split": False``; the records then say the numbers are provisional).

    Args:
        pr: the probe's per-document rows (``[docs, layers]`` tensors).
        brute: the brute-force sink decomposition (``[docs, layers]`` tensors).
        lay: the layer ids of the columns.

    Returns:
        ``{"selection", "sink_layers"}`` and ``"pooled"`` when a layer is selected.
    """
    nd = int(brute["attn0"].shape[0])  # a split needs 2 windows a side for the intervals
    sel_docs, test_docs = (rules.split_windows(nd, seed) if nd >= 4 else
                           (list(range(nd)), list(range(nd))))
    sel_iv = doc_iv(brute["attn0"][sel_docs], seed=seed)
    chosen = rules.select_layers(
        [{"low": lo, "high": hi} for lo, hi in zip(sel_iv["low"], sel_iv["high"])],
        SINK_LAYER_MIN, list(range(len(lay))))
    out: dict[str, Any] = {
        "selection": {"rule": "interval", "threshold": SINK_LAYER_MIN, "split": nd >= 4,
                      "select_windows": sel_docs, "test_windows": test_docs},
        "sink_layers": [lay[i] for i in chosen]}
    if chosen:
        out["pooled"] = _pooled(pr, brute, torch.tensor(chosen), torch.tensor(test_docs), seed)
    return out


def _pooled(pr: dict, brute: dict, idx: torch.Tensor, docs: torch.Tensor, seed: int) -> dict:
    """The sink-layer numbers pooled over layers ``idx``, on windows ``docs`` only."""
    def sub(x: torch.Tensor) -> torch.Tensor:
        return x[docs][:, idx].mean(1)

    return {
        "C0_over_attn0": _ratio_iv(sub(brute["C0"]), sub(brute["attn0"]), seed),
        **{k: doc_iv(sub(v), seed=seed) for k, v in
           {"cos_v0_s": pr["cos_v0_s"], "rho_star_in_0_1": pr["rho_star_in_0_1"],
            "v0_over_vothers": brute["v0_over_vothers"],
            "cos_minus_others": brute["cos_factor"] - brute["cos_factor_others"],
            "cone_change": brute["cone_zeroed"] - brute["cone_clean"],
            "rel_norm_change": brute["rel_norm_change"],
            "tail_C_minus_attn": brute["tail_C_share"] - brute["tail_attn_share"],
            }.items()}}


# ----------------------------------------------------------------------- faithfulness


def run_faithfulness(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral.probes.faithfulness import faithfulness

    t0 = time.perf_counter()
    bridge, tok, _ = _load(cfg)
    n, T = cfg["faith_docs"], cfg["faith_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 1),
                      start_token_id(tok, cfg["model"]))
    res: dict[str, Any] = {"model": cfg["model"], "n_docs": n, "length": T, "seed": seed,
                           **framing_record(cfg, seed + 1),
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
from tl_spectral_studies.real_decoder_routing import (  # noqa: E402,F401  (re-exported)
    OFFSETS,
    layer_types,
    routing_numbers,
)


def run_routing(out: Path, cfg: dict, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    bridge, _, _ = _load(cfg)
    res = {"model": cfg["model"], **routing_numbers(bridge, cfg["length"], seed, N_RESAMPLES)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "routing.json", res)
    return res


# ----------------------------------------------------------------------------- scales
def run_scales(out: Path, data_dir: Path, cfg: dict, seed: int = 0) -> dict:
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral_studies.scale_pod import bootstrap_layers

    t0 = time.perf_counter()
    bridge, tok, _ = _load(cfg)
    n, T = cfg["pod_docs"], cfg["pod_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 2),
                      start_token_id(tok, cfg["model"]))
    fields = run_probes(bridge, toks, [AttentionFieldProbe(layers=cfg["layers"])],
                        batch_size=8, progress=False)["attention_fields"]
    pod = fields.scale_pod(n_heads=int(bridge.cfg.n_heads))
    boot = bootstrap_layers([fields.fluctuations(li) for li in fields.layers],
                            n_resamples=N_RESAMPLES)
    res: dict[str, Any] = {"model": cfg["model"], "n_docs": n, "length": T, "seed": seed,
                           "corpus": "wiki_excerpt.txt (validation split), start token first",
                           "table": pod.to_rows(), "bootstrap": boot}
    types = layer_types(bridge)
    if len(set(types)) > 1:  # local / global layers (Gemma-3)
        res["layer_types"] = [types[int(li)] for li in fields.layers]
    del fields
    ph = run_probes(bridge, toks, [AttentionFieldProbe(layers=cfg["per_head_layers"],
                                                       per_head=True)],
                    batch_size=8, progress=False)["attention_fields"]
    php = ph.scale_pod(n_heads=int(bridge.cfg.n_heads))
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
    from tl_spectral_studies.real_decoder_ops import relative_ppl_change
    from tl_spectral_studies.real_decoder_ops import window_nll as _window_nll

    t0 = time.perf_counter()
    _, tok, hf = _load(cfg, need_bridge=False)
    n, T = cfg["int_docs"], cfg["int_length"]
    toks = with_start(windows(data_dir, "wiki_excerpt.txt", tok, n, T, seed + 3),
                      start_token_id(tok, cfg["model"]))
    L = len(hf.model.layers)
    window_nll = functools.partial(_window_nll, batch_size=nll_batch(hf, T))
    clean = window_nll(hf, toks)
    res: dict[str, Any] = {"model": cfg["model"], "n_docs": n, "length": T, "seed": seed,
                           **framing_record(cfg, seed + 3),
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
        rem[label] = removal_row(hf, toks, clean, ls, window_nll, seed)
    res["removal"] = rem
    res["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "interventions.json", res)
    return res


def removal_row(hf: Any, toks: torch.Tensor, clean: torch.Tensor, layers: list[int],
                window_nll: Any, seed: int, per_window: bool = False) -> dict[str, Any]:
    """One row of the inversion (seed 002, B.4): PPL'/PPL − 1 with routing kept (filtering
    removed) and with filtering kept (routing removed) in ``layers``, and the paired
    log PPL(routing removed) − log PPL(filtering removed) over windows (``per_window``: the
    windows' NLL sums of both conditions too, as ``nll_keep_routing``/``nll_keep_filtering``)."""
    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral_studies.real_decoder_ops import relative_ppl_change

    n, T = int(toks.shape[0]), int(toks.shape[1])
    row: dict[str, Any] = {}
    nll = {}
    for keep in ("routing", "filtering"):
        nll[keep] = window_nll(hf, toks, {li: keep for li in layers})
        row[f"keep_{keep}"] = relative_ppl_change(clean, nll[keep], T - 1, seed=seed)
    diff = bootstrap(lambda idx: (nll["filtering"][idx].sum() - nll["routing"][idx].sum())
                     / (len(idx) * (T - 1)), n, n_resamples=N_RESAMPLES, seed=seed).to_dict()
    row["log_ppl_routing_removed_minus_filtering_removed"] = {
        k: diff[k] for k in ("estimate", "low", "high")}
    if per_window:
        row.update({f"nll_keep_{k}": v.tolist() for k, v in nll.items()})
    return row


def nll_batch(hf: Any, T: int) -> int:
    """Windows per forward of the NLL passes: 8 (SmolLM2's runs), fewer where the logits of 8
    windows would pass 512 MB (Gemma-3's 262,144-token vocabulary: 4 at T = 128)."""
    V = int(hf.config.vocab_size)
    return min(8, max(1, 2 ** 29 // (4 * V * int(T))))


def _write(path: Path, obj: dict) -> None:
    obj = {**obj, "provenance": _provenance(obj.get("seed"))}
    path.write_text(json.dumps(_jsonable(obj), indent=1) + "\n", encoding="utf-8")


def _provenance(seed: Any) -> dict:
    """command, commit and seed of a run (what the claims records quote)."""
    import sys

    from tl_spectral_studies._common import git_commit

    return {"command": " ".join(["tl-spectral study real-decoder"] + sys.argv[1:]),
            "commit": git_commit(), "seeds": [seed]}


from tl_spectral_studies.real_decoder_tables import (  # noqa: E402,F401  (re-exported)
    faith_markdown,
    interventions_markdown,
    markdown,
    routing_markdown,
    scales_markdown,
    sinks_markdown,
    tables,
    verdict_markdown,
    verdicts,
    write_verdicts,
)


# -------------------------------------------------------------------------------- main
def run_study(out_dir: str | Path, data_dir: str | Path, *, steps: Sequence[str] = STEPS,
              quick: bool = False, seed: int = 0, model: str = MODEL,
              loaded: tuple | None = None, **overrides: Any) -> dict:
    """Run ``steps`` of ``model`` into :func:`results_dir` of ``out_dir``; ``overrides``:
    entries of :data:`FULL` / :data:`QUICK` (e.g. ``pod_docs=150``); ``loaded``: (bridge,
    tokenizer, Hugging Face decoder) to use instead of the zoo's (tests: tiny models)."""
    out = results_dir(out_dir, model)
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(QUICK) if quick else {**FULL, **MODELS[model]["full"]}
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError(f"unknown setting {k!r}; use one of {sorted(cfg)}")
        if v is not None:
            cfg[k] = v
    cfg.update(model=model, loaded=loaded)
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
    write_verdicts(out, model)
    return {"seconds": times}


def main(argv: Sequence[str], prog: str = "tl-spectral study real-decoder") -> int:
    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_run_arguments(ap, default_out="real_decoder_results")
    ap.add_argument("--data-dir", default=None,
                    help="folder with wiki_excerpt.txt and austen.txt (../shared/data)")
    ap.add_argument("--model", choices=sorted(MODELS), default=MODEL,
                    help="the decoder (default smollm2-135m, results in OUT; gemma3-270m: "
                         "results in OUT/gemma3-270m)")
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
        write_verdicts(results_dir(out, a.model), a.model)
    else:
        r = run_study(out, a.data_dir, steps=a.step or STEPS, quick=a.quick, seed=a.seed,
                      model=a.model, pod_docs=a.pod_docs, n_docs=a.n_docs,
                      int_docs=a.int_docs, faith_docs=a.faith_docs)
        print(json.dumps(r))
    print(markdown(results_dir(out, a.model), a.model))
    return 0


if __name__ == "__main__":  # python -m tl_spectral_studies.real_decoder ...
    import sys

    sys.exit(main(sys.argv[1:], prog="python -m tl_spectral_studies.real_decoder"))

