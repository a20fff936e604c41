"""Evidence that survives resampling (issue 39): the real-decoder claims on a sensitivity panel,
at samples sized for the claim, resumable.

    python -m tl_spectral_studies.evidence --model smollm2-135m --data-dir ../shared/data \\
        --out docs/results/real_decoder/evidence
    python -m tl_spectral_studies.evidence --model gemma3-270m --windows 8 ...  # small run
    python -m tl_spectral_studies.evidence --summarize --out docs/results/real_decoder/evidence
    python -m tl_spectral_studies.evidence --plan --out docs/results/real_decoder/evidence/plan

The panel of a model (:func:`panel`) crosses the first token (none, and each start/special
token of the model's own conventions: SmolLM2 ``<|im_start|>``, ``<|endoftext|>``; Gemma-3
``<bos>``), the corpus (the Wikipedia excerpt, Austen; validation split, the last 10%) and
three window draws (seeds 0, 1, 2). Each (model, step, cell) is one job writing its own file
``OUT/<model>/<step>/<cell>.json`` atomically (a temporary file renamed into place); a job
whose file exists with the same configuration (:func:`job_config`) is skipped, so a killed
run resumes where it stopped. Steps (:data:`STEPS`):

* ``sinks``: per window and layer, by brute force from the model's captured attention
  patterns and values (:func:`~tl_spectral_studies.real_decoder_ops.sink_decomposition`):
  α_i0, C_i0 and the other sink keys; the sink layers are *selected* on one half of the
  windows by the documented interval rule and the pooled numbers *tested* on the other
  (:func:`~tl_spectral_studies.real_decoder.select_and_pool`);
* ``zero_sink``: per-window NLL clean, with the sink's value zeroed in every layer for every
  query (the sink's own self-attention α_00 included) and for queries i ≥ 1 only (excluded);
* ``faithfulness``: per-window NLL sums of the paper's four measures under the layer-wide
  ranking (first token and draw only on the Wikipedia excerpt: the faithfulness claims are
  about one corpus in the paper);
* ``probe_sinks``: the library's ``SinkProbe`` per window on the ``sinks`` job's windows
  (its layers and halves): the per-layer cos(ṽ_0, s), ρ*, Δ‖o‖/‖o‖ and Δcos(o, s̄) that
  the registry's C.anti, C.rho, C.norm and C.cone read;
* ``interventions``: seed 002's B.collapse3 and B.inversion (every layer at once) on the
  cell's windows, attention recomputed in the Hugging Face model: the leading k ≤ 3 layers
  linearized (up to the first collapse) and routing or filtering removed, per-window NLL
  stored;
* ``inversion_layers``: seed 002's inversion one layer at a time (B.inversion.layer): routing
  or filtering removed in each layer alone, per-window NLL stored. Two passes per layer (60
  per SmolLM2 cell), so its panel is the first token alone (Wikipedia, draw 0), resumable per
  layer and shared between processes with ``--shard I/K``;
* ``pod``: the scale POD by thirds of the stack (the pod-depth study's analysis: H*, T_spec
  and the band energies of the first and last thirds, with and without the key-0 column) on
  N = 150 windows of the pod-depth study's T per model.

Per-window numbers are stored, so a verdict can be recomputed on any subset; the summary
(:mod:`tl_spectral_studies.evidence_summary`) gives per claim and cell the interval, the
label, the minimum detectable effect at that n and the panel's robustness label.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tl_spectral_studies.evidence_panel import (  # noqa: F401  (re-exported)
    CORPORA,
    DEFAULTS,
    DRAWS,
    FIRST_TOKENS,
    NAME,
    STEPS,
    VERSION,
    Cell,
    applies,
    config_hash,
    is_done,
    job_config,
    job_path,
    panel,
    start_id,
    write_atomic,
)


# ------------------------------------------------------------------------------- data
def cell_windows(data_dir: Path, tok: Any, cell: Cell, n: int, length: int) -> torch.Tensor:
    """``[n, length]`` windows of the cell: the validation split of its corpus, draw
    ``cell.draw``, with the first token in front (the window's last token dropped)."""
    from tl_spectral.data import document_windows, train_val_split

    text = (Path(data_dir) / CORPORA[cell.corpus]).read_text(encoding="utf-8")
    _, val = train_val_split(text)
    w = document_windows(val, tok, n, length, seed=cell.draw).tokens
    sid = start_id(tok, cell.first)
    if sid is None:
        return w
    return torch.cat([torch.full((w.shape[0], 1), sid, dtype=w.dtype), w[:, :-1]], 1)


# -------------------------------------------------------------------------- forwards
def zero_sink_hook(include_self: bool):
    """A ``hook_pattern`` hook setting α_i0 to 0 without renormalizing (the sink's value
    zeroed), for every query (``include_self``: the sink's own α_00 too) or queries i ≥ 1."""
    first = 0 if include_self else 1

    def hook(p: torch.Tensor, hook: Any = None) -> torch.Tensor:
        p = p.clone()
        p[..., first:, 0] = 0.0
        return p

    return hook


def window_nll(view: Any, tokens: torch.Tensor, hooks: Sequence = (), batch_size: int = 4
               ) -> torch.Tensor:
    """Summed next-token NLL ``[n]`` (float64) of every window under ``hooks``."""
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for s in range(0, tokens.shape[0], batch_size):
            w = tokens[s:s + batch_size]
            logits = view.run(w, fwd_hooks=list(hooks))[:, :-1].float()
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                  reduction="none").view(w.shape[0], -1).sum(1)
            out.append(nll.double())
    return torch.cat(out)


def sink_rows(view: Any, tokens: torch.Tensor, batch_size: int = 4) -> dict[str, torch.Tensor]:
    """:data:`~tl_spectral_studies.real_decoder_ops.SINK_KEYS` ``[n, L]`` by brute force from
    the captured pattern and values of every layer (computed layer by layer in the hooks, so
    no ``[L, b, H, T, T]`` stack is held)."""
    from tl_spectral_studies.real_decoder_ops import SINK_KEYS, sink_decomposition

    L = view.n_layers
    W_O = {li: view.weights(li).W_O for li in range(L)}
    rows: dict[str, list] = {k: [] for k in SINK_KEYS}
    for s in range(0, tokens.shape[0], batch_size):
        got: dict[int, dict] = {li: {} for li in range(L)}
        per: dict[int, dict] = {}

        def grab(kind: str, li: int):
            def hook(t: torch.Tensor, hook: Any = None) -> None:
                got[li][kind] = t.detach()
                if len(got[li]) == 2:
                    v = view.repeat_kv(got[li]["v"], 2).transpose(1, 2)  # [b, H, T, d]
                    per[li] = sink_decomposition(got[li]["pattern"], v, W_O[li])
                    got[li].clear()
            return hook

        hooks = [(view.hook_v(li), grab("v", li)) for li in range(L)]
        hooks += [(view.hook_pattern(li), grab("pattern", li)) for li in range(L)]
        with torch.no_grad():
            view.run(tokens[s:s + batch_size], fwd_hooks=hooks, return_type=None)
        for k in SINK_KEYS:
            rows[k].append(torch.stack([per[li][k] for li in range(L)], 1))
    return {k: torch.cat(v, 0) for k, v in rows.items()}


# ------------------------------------------------------------------------------ steps
def step_sinks(view: Any, tokens: torch.Tensor, cfg: dict, seed: int) -> dict:
    """Per-window sink rows, the split selection and the pooled numbers on the test half."""
    from tl_spectral_studies.real_decoder import select_and_pool

    brute = sink_rows(view, tokens, cfg["batch_size"])
    # select_and_pool also pools two library-probe keys (cos(ṽ_0, s), ρ*) that this runner
    # does not measure: zeros stand in for them and their pooled numbers are dropped
    pr = {"cos_v0_s": brute["cos_factor"] * 0, "rho_star_in_0_1": brute["attn0"] * 0}
    sel = select_and_pool(pr, brute, list(range(view.n_layers)), seed)
    pooled = sel.get("pooled", {})
    for k in ("cos_v0_s", "rho_star_in_0_1"):  # library-probe keys, not measured here
        pooled.pop(k, None)
    return {"per_window": {k: v.tolist() for k, v in brute.items()}, **sel}


def step_zero_sink(view: Any, tokens: torch.Tensor, cfg: dict, seed: int) -> dict:
    """Per-window NLL clean and with the sink's value zeroed in every layer, the sink's own
    self-attention included or not, with the paired relative ΔPPL intervals."""
    from tl_spectral_studies.real_decoder_ops import relative_ppl_change

    L, bs = view.n_layers, cfg["batch_size"]
    clean = window_nll(view, tokens, (), bs)
    out: dict[str, Any] = {"nll_clean": clean.tolist(), "n_pred": int(tokens.shape[1]) - 1}
    for name, incl in (("include_self", True), ("exclude_self", False)):
        hooks = [(view.hook_pattern(li), zero_sink_hook(incl)) for li in range(L)]
        nll = window_nll(view, tokens, hooks, bs)
        out[f"nll_{name}"] = nll.tolist()
        out[name] = relative_ppl_change(clean, nll, out["n_pred"], seed=seed)
    return out


def step_faithfulness(view: Any, tokens: torch.Tensor, cfg: dict, seed: int) -> dict:
    """Per-window log-NLL sums of the four measures' comprehensiveness / sufficiency curves
    (layer-wide ranking), as the real-decoder study computes them."""
    from tl_spectral.probes.faithfulness import faithfulness
    from tl_spectral_studies.claims.seed003 import FAITH_MEASURES

    sums, counts, meta = [], [], {}
    for d in range(int(tokens.shape[0])):
        f = faithfulness(view.model, tokens[d:d + 1], measures=FAITH_MEASURES, scope="layer",
                         batch_size=1, seed=seed + d, rows_per_pass=64)
        curves = torch.stack([f.comprehensiveness, f.sufficiency], 2).double()
        sums.append((float(f.n_tokens) * torch.log(curves + f.clean)).tolist())
        counts.append(float(f.n_tokens))
        meta = {"settings": list(f.settings), "fractions": list(f.fractions),
                "measures": list(FAITH_MEASURES), "aliases": dict(f.aliases)}
    return {"per_window_nll_sums": sums, "per_window_tokens": counts, **meta}


POD_KEEP = ("n_layers", "n_docs", "length", "chars_per_token", "cutoffs", "variants",
            "cut_sets", "thirds", "spectrum", "intervals", "claims")
"""What a ``pod`` job keeps of the pod-depth analysis: what the A-claims' measures read
(:mod:`tl_spectral_studies.claims.seed000`), not the per-layer energy spectra."""


def step_pod(view: Any, tokens: torch.Tensor, cfg: dict, seed: int, *, tok: Any = None,
             has_start: bool = True) -> dict:
    """The scale POD by thirds of the stack (:func:`tl_spectral_studies.pod_depth.analyse`
    and its claims) on the cell's windows: one ``AttentionFieldProbe`` pass, the field with
    and without the key-0 column."""
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral_studies.pod_depth import analyse, chars_per_token, claims

    fields = run_probes(view, tokens, [AttentionFieldProbe()], batch_size=cfg["batch_size"],
                        progress=False)["attention_fields"]
    res = analyse([fields.fields[str(li)] for li in fields.layers],
                  chars_per_token=chars_per_token(tok, tokens, skip_first=has_start))
    res["claims"] = claims(res)
    return {k: res[k] for k in POD_KEEP}


PROBE_SINK_KEYS = ("cos_v0_s", "rho_star_in_0_1", "rel_delta_norm", "delta_cos")
"""The library SinkProbe's per-layer quantities the registry's C.anti, C.rho, C.norm and
C.cone read (:mod:`tl_spectral_studies.claims.seed003`)."""


def step_probe_sinks(view: Any, tokens: torch.Tensor, cfg: dict, seed: int, *,
                     sinks_job: dict | None = None) -> dict:
    """The library's ``SinkProbe`` per window (batch 1: the probe's rows are means over a
    batch) on the cell's windows — the same windows as the cell's ``sinks`` job — with the
    per-layer intervals over windows, and ``cos(ṽ_0, s)`` and the ρ* share pooled over the
    sinks job's layers on its test half (:func:`tl_spectral_studies.real_decoder.select_and_pool`'s
    pooling)."""
    from tl_spectral.probes import SinkProbe, run_probes
    from tl_spectral_studies.real_decoder import doc_iv

    if sinks_job is None:
        raise ValueError("the probe_sinks step reads the cell's sinks job (its sink layers "
                         "and test half): run --step sinks first")
    rows: dict[str, list] = {k: [] for k in PROBE_SINK_KEYS}
    for d in range(int(tokens.shape[0])):
        r = run_probes(view, tokens[d:d + 1], [SinkProbe()], batch_size=1,
                       progress=False)["sinks"].to_rows()
        for k in PROBE_SINK_KEYS:
            rows[k].append([x[k] for x in r])
    pr = {k: torch.tensor(v, dtype=torch.float64) for k, v in rows.items()}  # [n, L]
    out: dict[str, Any] = {
        "layer_ids": list(range(int(pr["cos_v0_s"].shape[1]))),
        "per_window": {k: v.tolist() for k, v in pr.items()},
        "probe": {k: doc_iv(v, seed=seed) for k, v in pr.items()},
        "selection": sinks_job.get("selection"), "sink_layers": sinks_job.get("sink_layers")}
    layers, test = sinks_job.get("sink_layers") or [], (sinks_job.get("selection") or {}).get(
        "test_windows") or []
    if layers and test:
        idx, docs = torch.tensor(layers), torch.tensor(test)
        out["pooled"] = {k: doc_iv(pr[k][docs][:, idx].mean(1), seed=seed)
                         for k in ("cos_v0_s", "rho_star_in_0_1")}
    return out


INT_KS = (1, 2, 3)
"""Linearization depths of the ``interventions`` step: B.collapse3's label needs only whether
the first collapsing k is 3, so the step stops at the first k whose interval's lower end
reaches +100% (:func:`~tl_spectral_studies.claims.rules.first_collapse`); no collapse up to 3
is "not reproduced" as well."""


def step_interventions(view: Any, tokens: torch.Tensor, cfg: dict, seed: int, *, hf: Any,
                       zero_sink_job: dict | None = None) -> dict:
    """Seed 002's interventions on the cell's windows, as the real-decoder study computes them
    (:func:`tl_spectral_studies.real_decoder.run_interventions`, the attention recomputed in
    the Hugging Face model): the leading k layers linearized (k in :data:`INT_KS`, up to the
    first collapse) and routing or filtering removed in every layer at once (B.collapse3,
    B.inversion). ``hf``: the plain Hugging Face decoder of ``view``'s model
    (:func:`~tl_spectral_studies.real_decoder_ops.load_hf`; the bridge's own modules cannot be
    patched). The clean NLL is the cell's ``zero_sink`` job's (the same windows, through the
    bridge) when given, after the first batch is recomputed here and found equal to a relative
    1e-4 (a pass saved per cell; every changed NLL is the Hugging Face model's)."""
    import functools

    from tl_spectral_studies.claims.rules import first_collapse
    from tl_spectral_studies.real_decoder import nll_batch, removal_row
    from tl_spectral_studies.real_decoder_ops import hf_of, relative_ppl_change
    from tl_spectral_studies.real_decoder_ops import window_nll as hf_nll

    hf = hf_of(hf)
    T = int(tokens.shape[1])
    L = len(hf.model.layers)
    nll_fn = functools.partial(hf_nll, batch_size=nll_batch(hf, T))
    clean = clean_nll(hf, tokens, nll_fn, zero_sink_job)
    out: dict[str, Any] = {"n_pred": T - 1, "nll_clean": clean.tolist(),
                           "clean_from": "zero_sink" if zero_sink_job is not None else "here"}
    lin: list[dict] = []
    for k in INT_KS:
        nll = nll_fn(hf, tokens, {li: "linear" for li in range(min(k, L))})
        lin.append({"k": k, **relative_ppl_change(clean, nll, T - 1, seed=seed),
                    "nll": nll.tolist()})
        if first_collapse({r["k"]: r for r in lin}) is not None:
            break
    out["linearization"] = lin
    out["removal"] = {"all layers": removal_row(hf, tokens, clean, list(range(L)), nll_fn,
                                                seed, per_window=True)}
    return out


def clean_nll(hf: Any, tokens: torch.Tensor, nll_fn: Any, zero_sink_job: dict | None
              ) -> torch.Tensor:
    """``[n]`` float64 clean NLL of the windows: the cell's ``zero_sink`` job's (through the
    bridge) after its first batch is recomputed in the Hugging Face model ``hf`` and found
    equal to a relative 1e-4 (else a one-line error naming the step to rerun), or computed
    here without one."""
    from tl_spectral_studies.real_decoder import nll_batch

    n, T = int(tokens.shape[0]), int(tokens.shape[1])
    if zero_sink_job is None:
        return nll_fn(hf, tokens)
    b = min(n, nll_batch(hf, T))
    return check_clean(nll_fn(hf, tokens[:b]), zero_sink_job, n)


def check_clean(here: torch.Tensor, zero_sink_job: dict, n: int) -> torch.Tensor:
    """The ``zero_sink`` job's clean NLL ``[n]`` (float64), once it has ``n`` windows and its
    first ``len(here)`` equal ``here`` (recomputed in the Hugging Face model) to a relative
    1e-4; else a one-line error naming the step to rerun."""
    clean = torch.tensor(zero_sink_job["nll_clean"], dtype=torch.float64)
    b = int(here.shape[0])
    if clean.shape[0] != n or not torch.allclose(here, clean[:b], rtol=1e-4):
        from tl_spectral_studies._common import StudyUsageError

        raise StudyUsageError("the cell's zero_sink job has other windows or another "
                              "model (its clean NLL differs): rerun --step zero_sink")
    return clean


def layer_dir(path: Path) -> Path:
    """Where an ``inversion_layers`` job keeps its finished layers until every layer has run
    (``<cell>.layers/layer=NN.json``, one file per layer, written atomically)."""
    return Path(path).with_name(Path(path).stem + ".layers")


def run_layer_job(tok: Any, out: Path, data_dir: Path, model: str, cell: Cell, cfg: dict,
                  provenance: dict, get_hf: Any, shard: tuple[int, int] = (0, 1)
                  ) -> tuple[Path, bool, float]:
    """One ``inversion_layers`` job: seed 002's inversion one layer at a time
    (B.inversion.layer: routing or filtering removed in layer ``l`` alone, the study's
    :func:`~tl_spectral_studies.real_decoder.removal_row`, per-window NLL stored). Resumable
    per layer: each finished layer is its own file under :func:`layer_dir`; ``shard = (i, k)``
    runs the layers ``l`` with ``l % k == i``, so k processes share a cell. One clean pass
    keeps every layer's input (:func:`~tl_spectral_studies.real_decoder_ops.layer_inputs`;
    its NLL checked against the cell's ``zero_sink`` job, whose clean NLL is used as in the
    ``interventions`` step), so the removals of layer ``l`` run layers ``l`` … on only. The
    process that finds every layer done writes the job file (``removal``: ``{"layer l":
    row}``; ``seconds``: the layers' sum, each process's clean pass not counted) and removes
    the layer files. Returns (path, ran, seconds)."""
    import functools
    import shutil

    from tl_spectral_studies.real_decoder import nll_batch, removal_row
    from tl_spectral_studies.real_decoder_ops import hf_of, layer_inputs
    from tl_spectral_studies.real_decoder_ops import window_nll as hf_nll

    step = "inversion_layers"
    i, k = (int(x) for x in shard)
    if not (k >= 1 and 0 <= i < k):
        raise ValueError(f"shard must be (i, k) with 0 <= i < k (got {shard!r})")
    conf = job_config(model, step, cell, cfg)
    path = job_path(out, model, step, cell)
    if is_done(path, conf):
        return path, False, 0.0
    if get_hf is None:
        raise ValueError("the inversion_layers step needs the plain Hugging Face decoder: "
                         "pass get_hf")
    hf = hf_of(get_hf())
    L = len(hf.model.layers)
    n, T = conf["n"], conf["length"]
    d = layer_dir(path)
    todo = [li for li in range(L) if li % k == i
            and not is_done(d / f"layer={li:02d}.json", {**conf, "layer": li})]
    t0 = time.perf_counter()
    ran = False
    if todo:
        tokens = cell_windows(data_dir, tok, cell, n, T)
        nb = nll_batch(hf, T)
        zj = job_path(out, model, "zero_sink", cell)
        zs = (json.loads(zj.read_text(encoding="utf-8"))
              if is_done(zj, job_config(model, "zero_sink", cell, cfg)) else None)
        # one clean pass keeps every layer's input, so layer l's removals run layers l… only
        clean, inputs = layer_inputs(hf, tokens, batch_size=nb)
        if zs is not None:  # every window checked (the pass ran anyway), then the job's
            clean = check_clean(clean, zs, n)
        for li in todo:
            t1 = time.perf_counter()
            nll_fn = functools.partial(hf_nll, batch_size=nb, start=li, inputs=inputs)
            row = removal_row(hf, tokens, clean, [li], nll_fn, cell.draw, per_window=True)
            lconf = {**conf, "layer": li}
            write_atomic(d / f"layer={li:02d}.json", {
                "config": lconf, "config_hash": config_hash(lconf),
                "seconds": round(time.perf_counter() - t1, 2),
                "threads": torch.get_num_threads(), "nll_clean": clean.tolist(),
                "clean_from": "zero_sink" if zs is not None else "here", "row": row})
            ran = True
    layers = []
    for li in range(L):
        lp = d / f"layer={li:02d}.json"
        if not is_done(lp, {**conf, "layer": li}):  # another shard's layer still to run
            return path, ran, round(time.perf_counter() - t0, 2)
        layers.append(json.loads(lp.read_text(encoding="utf-8")))
    write_atomic(path, {
        "config": conf, "config_hash": config_hash(conf),
        "seconds": round(sum(x["seconds"] for x in layers), 2),
        "threads": max(int(x["threads"]) for x in layers), "provenance": provenance,
        "n_pred": T - 1, "nll_clean": layers[0]["nll_clean"],
        "clean_from": layers[0]["clean_from"],
        "removal": {f"layer {li}": x["row"] for li, x in enumerate(layers)}})
    shutil.rmtree(d, ignore_errors=True)
    return path, ran, round(time.perf_counter() - t0, 2)


STEP_FUNCS = {"sinks": step_sinks, "zero_sink": step_zero_sink,
              "faithfulness": step_faithfulness, "pod": step_pod,
              "probe_sinks": step_probe_sinks, "interventions": step_interventions}


# ------------------------------------------------------------------------------ runner
def run_job(view: Any, tok: Any, out: Path, data_dir: Path, model: str, step: str, cell: Cell,
            cfg: dict, provenance: dict, get_hf: Any = None, shard: tuple[int, int] = (0, 1)
            ) -> tuple[Path, bool, float]:
    """One (model, step, cell) job: skipped when its file is done with the same
    configuration. Returns (path, ran, seconds). ``get_hf``: a function returning the plain
    Hugging Face decoder the ``interventions`` step patches (called only when it runs)."""
    if step == "inversion_layers":
        return run_layer_job(tok, out, data_dir, model, cell, cfg, provenance, get_hf, shard)
    conf = job_config(model, step, cell, cfg)
    path = job_path(out, model, step, cell)
    if is_done(path, conf):
        return path, False, 0.0
    n, T = conf["n"], conf["length"]
    t0 = time.perf_counter()
    tokens = cell_windows(data_dir, tok, cell, n, T)
    kw: dict[str, Any] = {"tok": tok, "has_start": cell.first != "none"} if step == "pod" else {}
    if step == "interventions":  # the clean NLL of the same windows, when already run
        if get_hf is None:
            raise ValueError("the interventions step needs the plain Hugging Face decoder: "
                             "pass get_hf")
        kw["hf"] = get_hf()
        zj = job_path(out, model, "zero_sink", cell)
        if is_done(zj, job_config(model, "zero_sink", cell, cfg)):
            kw["zero_sink_job"] = json.loads(zj.read_text(encoding="utf-8"))
    if step == "probe_sinks":
        sj = job_path(out, model, "sinks", cell)
        sinks_conf = job_config(model, "sinks", cell, cfg)
        if not is_done(sj, sinks_conf):
            from tl_spectral_studies._common import StudyUsageError

            raise StudyUsageError(f"the probe_sinks step of {cell.key} reads its sinks "
                                  f"job ({sj}): run --step sinks first")
        kw["sinks_job"] = json.loads(sj.read_text(encoding="utf-8"))
    res = STEP_FUNCS[step](view, tokens, cfg, cell.draw, **kw)
    secs = round(time.perf_counter() - t0, 2)
    write_atomic(path, {"config": conf, "config_hash": config_hash(conf), "seconds": secs,
                        "threads": torch.get_num_threads(), "provenance": provenance, **res})
    return path, True, secs


def run(model_name: str, out: Path, data_dir: Path, *, steps: Sequence[str] = STEPS,
        cfg: dict | None = None, cells: Sequence[Cell] | None = None, log: Any = print,
        loaded: tuple[Any, Any] | None = None, hf: Any = None,
        shard: tuple[int, int] = (0, 1)) -> list[dict]:
    """Run every job of ``model_name``'s panel not yet done; returns one row per job.
    ``hf``: the plain Hugging Face decoder of the ``interventions`` and ``inversion_layers``
    steps (default: loaded once, when first needed, by
    :func:`~tl_spectral_studies.real_decoder_ops.load_hf`); ``shard``: ``(i, k)``, the
    ``inversion_layers`` layers this process runs (:func:`run_layer_job`)."""
    from tl_spectral.model_view import ModelView
    from tl_spectral_studies.real_decoder import _provenance

    cfg = {**DEFAULTS, **(cfg or {})}
    if loaded is None:
        from tl_spectral.models import zoo

        loaded = zoo.load(model_name)
    model, tok = loaded
    view = ModelView(model)
    prov = _provenance(None)
    prov["command"] = prov["command"].replace("real-decoder", "evidence")
    held: list[Any] = [hf]

    def get_hf() -> Any:
        if held[0] is None:
            from tl_spectral_studies.real_decoder_ops import load_hf

            held[0] = load_hf(model_name)
        return held[0]

    rows = []
    for step in steps:
        for cell in (cells if cells is not None else panel(model_name, step)):
            if not applies(step, cell):
                continue
            path, ran, secs = run_job(view, tok, Path(out), Path(data_dir), model_name, step,
                                      cell, cfg, prov, get_hf=get_hf, shard=shard)
            rows.append({"step": step, "cell": cell.key, "ran": ran, "seconds": secs})
            log(json.dumps(rows[-1]))
    return rows


def run_study(out_dir: str | Path, data_dir: str | Path, *, model: str = "smollm2-135m",
              **kwargs: Any) -> list[dict]:
    """:func:`run` of ``model``'s panel into ``out_dir`` (the entry function of
    ``tl-spectral study evidence``), then its ``summary.json``."""
    from tl_spectral_studies.evidence_summary import write_summary

    rows = run(model, Path(out_dir), Path(data_dir), **kwargs)
    write_summary(Path(out_dir), model)
    return rows


def markdown(results_dir: str | Path) -> str:
    """The cell table of every model's ``summary.json`` under ``results_dir``
    (:func:`~tl_spectral_studies.evidence_summary.cells_markdown`)."""
    from tl_spectral_studies.evidence_summary import cells_markdown

    parts = [cells_markdown(json.loads(p.read_text(encoding="utf-8")))
             for p in sorted(Path(results_dir).glob("*/summary.json"))]
    return "\n\n".join(parts) or f"(no <model>/summary.json in {results_dir})"


def main(argv: Sequence[str], prog: str = "python -m tl_spectral_studies.evidence") -> int:
    from tl_spectral.usage import ArgumentParser
    from tl_spectral_studies._common import StudyUsageError, require_data_dir

    ap = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(FIRST_TOKENS), default="smollm2-135m")
    ap.add_argument("--out", default="docs/results/real_decoder/evidence")
    ap.add_argument("--data-dir", default=None, help="folder with wiki_excerpt.txt, austen.txt")
    ap.add_argument("--step", action="append", choices=STEPS)
    for k in ("windows", "length", "faith_docs", "faith_length", "pod_docs", "batch_size"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=DEFAULTS[k])
    ap.add_argument("--draws", type=int, nargs="+", default=list(DRAWS))
    ap.add_argument("--shard", default="0/1", metavar="I/K",
                    help="inversion_layers: run the layers l with l %% K == I (start K "
                         "processes, I = 0 … K-1, to share a cell's layers; default 0/1)")
    ap.add_argument("--summarize", action="store_true",
                    help="only write OUT/<model>/summary.json from the stored jobs")
    ap.add_argument("--plan", action="store_true",
                    help="only write OUT/<model>/plan.json: the full plan's CPU minutes "
                         "extrapolated from the (small) run stored in OUT")
    a = ap.parse_args(list(argv))
    from tl_spectral_studies.evidence_summary import compute_plan, write_summary

    if a.plan:
        plan = compute_plan(Path(a.out), a.model)
        write_atomic(Path(a.out) / a.model / "plan.json", plan)
        print(json.dumps(plan, indent=1))
        return 0
    if not a.summarize:
        try:
            data = require_data_dir(a.data_dir, "wiki_excerpt.txt and austen.txt")
        except StudyUsageError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 2
        cfg = {k: getattr(a, k) for k in DEFAULTS}
        try:
            si, sk = (int(x) for x in a.shard.split("/"))
            if not (sk >= 1 and 0 <= si < sk):
                raise ValueError
        except ValueError:
            print(f"{prog}: error: argument --shard: expected I/K with 0 <= I < K, e.g. 1/2 "
                  f"(got {a.shard!r})", file=sys.stderr)
            return 2
        cells = [c for s in (a.step or STEPS) for c in panel(a.model, s, a.draws)]
        run(a.model, Path(a.out), data, steps=a.step or STEPS, cfg=cfg,
            cells=sorted(set(cells), key=lambda c: c.key), shard=(si, sk))
    print(json.dumps(write_summary(Path(a.out), a.model), indent=1)[:4000])
    return 0


if __name__ == "__main__":  # python -m tl_spectral_studies.evidence ...
    from tl_spectral.usage import UsageError

    try:
        sys.exit(main(sys.argv[1:], prog="python -m tl_spectral_studies.evidence"))
    except UsageError as err:  # one line, exit 2 (as the tl-spectral CLI does)
        print(f"python -m tl_spectral_studies.evidence: error: {err}", file=sys.stderr)
        sys.exit(2)
