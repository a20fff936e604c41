"""The evidence panel's verdicts (issue 39): per claim and panel cell the interval, n, label and
minimum detectable effect, and per claim the panel's robustness label.

Reads the job files of :mod:`tl_spectral_studies.evidence` (``OUT/<model>/<step>/<cell>.json``)
and writes ``OUT/<model>/summary.json``. Labels come from
:mod:`tl_spectral_studies.claims.rules` only: the claim's own rule per cell
(:func:`~tl_spectral_studies.claims.rules.sign` and friends), the minimum detectable effect
(:func:`~tl_spectral_studies.claims.rules.mde`, :data:`~tl_spectral_studies.claims.rules.MDE_RULE`)
and the robustness across the panel
(:func:`~tl_spectral_studies.claims.rules.sensitivity`). A claim whose panel is incomplete
says so (``"complete": False``) and its robustness covers only the cells present.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tl_spectral_studies.claims import rules
from tl_spectral_studies.claims.seed002 import CHEAP
from tl_spectral_studies.claims.seed003 import SINK_LAYER_MIN, TAIL_MARGIN


@dataclass(frozen=True)
class PanelClaim:
    """A claim read from one step's job files; its ``id`` is the registry's claim id only where
    the measure and rule are the registry's (then the records quote the panel's
    robustness). ``extract`` gives ``{variant: interval}`` of
    one job (a variant, e.g. the sink's self-attention included or not, is one more panel
    factor named ``variant_factor``); ``rule`` labels an interval."""

    id: str
    step: str
    text: str
    rule_text: str
    extract: Callable[[dict], dict[str, Mapping[str, Any] | None]] | None = None
    rule: Callable[[Mapping[str, Any] | None], str] | None = None
    variant_factor: str = ""
    variants_are_claims: bool = False
    """The variants are separate claims (the registry reads each apart): the robustness is
    then per variant, never across them."""
    n_windows: str = "test_windows"
    """For a claim read from a sink selection (``sinks``, ``probe_sinks``): the half of the
    windows behind its cells; "" for every window of the job."""
    labels: Callable[[dict], dict[str, tuple[str, Any]]] | None = None
    """Instead of ``extract``/``rule``: ``{variant: (label, interval or None)}`` of a job."""

    def __post_init__(self) -> None:
        if (self.labels is None) == (self.extract is None or self.rule is None):
            raise ValueError(f"panel claim {self.id}: give labels, or extract and rule "
                             "(not both)")

    def cells_of(self, job: dict) -> dict[str, tuple[str, Mapping[str, Any] | None]]:
        if self.labels is not None:
            return self.labels(job)
        assert self.extract is not None and self.rule is not None
        return {v: (self.rule(iv), iv) for v, iv in self.extract(job).items()}


def _pooled(key: str) -> Callable[[dict], dict]:
    return lambda job: {"": (job.get("pooled") or {}).get(key)}


def _no_pool_label(rule: Callable) -> Callable:
    """A pooled claim whose cell selected no sink layer: "not tested" (nothing to pool)."""
    return lambda iv: rules.NOT_TESTED if iv is None else rule(iv)


def faith_differences(job: Mapping[str, Any], seed: int = 0,
                      n_resamples: int = 1000) -> dict:
    """The area differences of a faithfulness job, as the real-decoder study computes them
    (:func:`tl_spectral_studies.real_decoder.run_faithfulness`): areas of PPL'/PPL − 1 of the
    corpus NLL of the resampled windows, bootstrapped over windows; ``[S, M, M, 2]`` lists."""
    import torch

    from tl_spectral.analysis.bootstrap import bootstrap
    from tl_spectral.analysis.faithfulness import curve_area

    S = torch.tensor(job["per_window_nll_sums"], dtype=torch.float64)  # [n, S, M, 2, F]
    C = torch.tensor(job["per_window_tokens"], dtype=torch.float64)
    fr = job["fractions"]

    def stat(idx: torch.Tensor) -> torch.Tensor:
        nll = S[idx].sum(0) / C[idx].sum()
        a = curve_area(fr, torch.exp(nll - nll[..., :1]) - 1.0)  # [S, M, 2]
        return (a[:, :, None, :] - a[:, None, :, :]).flatten()

    iv = bootstrap(stat, int(S.shape[0]), n_resamples=n_resamples, seed=seed)
    shape = (S.shape[1], S.shape[2], S.shape[2], 2)
    return {k: getattr(iv, k).reshape(shape).tolist() for k in ("estimate", "low", "high")}


def _steps(st) -> dict:
    """``{"steps": [...]}`` of ``(name, label, interval or None)`` triples (a tie by
    construction has no interval)."""
    return {"steps": [{"step": n, "label": lb, **({k: float(iv[k]) for k in ("estimate", "low",
                                                                            "high")}
                                                   if iv else {})} for n, lb, iv in st]}


def hierarchy_labels(job: Mapping[str, Any]) -> dict[str, tuple[str, dict]]:
    """Per (criterion, setting) of a faithfulness job, the hierarchy label by the registry's
    own steps (:func:`~tl_spectral_studies.claims.seed003.hierarchy_steps`, then
    :func:`~tl_spectral_studies.claims.rules.steps`), with every step's interval
    (``{"steps": [{"step", "label", "estimate", "low", "high"}]}``; a tie by construction has
    no interval)."""
    from tl_spectral_studies.claims.seed003 import hierarchy_steps

    diff = faith_differences(job, seed=int(job["config"]["draw"]))
    out = {}
    for si, name in enumerate(job["settings"]):
        # the faithfulness probe's one-layer setting is the middle layer (n_layers // 2:
        # SmolLM2's 15, Gemma-3's 9): one claim across models, named by its role
        name = "middle layer" if name.startswith("layer ") else name
        for kind, kn in ((0, "comprehensiveness"), (1, "sufficiency")):
            st = hierarchy_steps(diff, job.get("aliases", {}), si, kind)
            out[f"{kn}, {name}"] = (rules.steps([lb for _, lb, _ in st]), _steps(st))
    return out


def split_labels(job: Mapping[str, Any]) -> dict[str, tuple[str, dict | None]]:
    """The registry's ``C.split`` (:func:`~tl_spectral_studies.claims.seed003.split`) on a sinks
    job: the norm factor (‖ṽ_0‖ / mean ‖ṽ_j‖ below 1) and the cosine factor (cos(o, ṽ_0) −
    cos(o, ṽ_j) below 0), each by the sign rule on its pooled interval, then the steps rule."""
    pooled = job.get("pooled") or {}
    r1, r2 = pooled.get("v0_over_vothers"), pooled.get("cos_minus_others")
    if r1 is None or r2 is None:
        return {"": (rules.NOT_TESTED, None)}
    st = [("norm factor < 1", rules.sign(r1, 1.0, above=False), r1),
          ("cosine factor < 0", rules.sign(r2, 0.0, above=False), r2)]
    return {"": (rules.steps([lb for _, lb, _ in st]), _steps(st))}


def sink_labels(job: Mapping[str, Any]) -> dict[str, tuple[str, dict]]:
    """The registry's ``C.sink`` on a sinks job: reproduced when the documented interval rule
    selects at least one layer on the selection half (a count, no interval)."""
    layers = list(job.get("sink_layers") or [])
    return {"": (rules.at_least_one([True] * len(layers)), {"count": len(layers)})}


class _DepthJob:
    """A ``pod`` job in the place of the registry's results (what the A-claims' measures
    read: :meth:`depth`), so a cell's label comes from the registry's own measure and rule."""

    def __init__(self, job: Mapping[str, Any]):
        self._job = job

    def depth(self) -> Mapping[str, Any]:
        return self._job

    def json(self, name: str) -> None:
        return None


def depth_labels(measure_name: str) -> Callable[[dict], dict[str, tuple[str, dict | None]]]:
    """``{"": (label, interval)}`` of a ``pod`` job by the registry's measure
    ``tl_spectral_studies.claims.seed000.<measure_name>`` (the field with the key-0 column,
    thirds of the stack). ``A.bands`` keeps its two steps (first third fine > coarse, last
    third coarse > fine), each with its interval."""
    def labels(job: dict) -> dict[str, tuple[str, dict | None]]:
        from tl_spectral_studies.claims import seed000

        meas = getattr(seed000, measure_name)(_DepthJob(job))
        if measure_name == "bands":
            c = next(x for x in job["claims"] if x["id"] == "bands.paper")["intervals"]["with"]
            st = seed000._band_label(c)[1]
            return {"": (meas.label, _steps([("first third fine > coarse", st[0], c["early"]),
                                              ("last third coarse > fine", st[1], c["late"])]))}
        iv = None if meas.interval is None else {
            "estimate": meas.estimate, "low": meas.interval[0], "high": meas.interval[1]}
        return {"": (meas.label, iv)}
    return labels


class _SinksJob:
    """A ``probe_sinks`` job in the place of the registry's ``sinks.json`` (its
    ``wiki_start`` setting), so a cell's label comes from the registry's own measure."""

    def __init__(self, job: Mapping[str, Any]):
        self._s = {"layer_ids": job["layer_ids"], "n_docs": int(job["config"]["n"]),
                   "settings": {"wiki_start": {"probe": job["probe"],
                                               "pooled": job.get("pooled") or {},
                                               "selection": job.get("selection") or {}}}}

    def json(self, name: str) -> Mapping[str, Any] | None:
        return self._s if name == "sinks" else None


def probe_labels(measure_name: str, pooled_key: str = ""
                 ) -> Callable[[dict], dict[str, tuple[str, dict | None]]]:
    """``{"": (label, interval or None)}`` of a ``probe_sinks`` job by the registry's measure
    ``tl_spectral_studies.claims.seed003.<measure_name>``; a claim pooled over the sink layers
    (``pooled_key``) is "not tested" in a cell that selected none."""
    def labels(job: dict) -> dict[str, tuple[str, dict | None]]:
        from tl_spectral_studies.claims import seed003

        if pooled_key and not (job.get("pooled") or {}).get(pooled_key):
            return {"": (rules.NOT_TESTED, None)}
        meas = getattr(seed003, measure_name)(_SinksJob(job))
        if meas.interval is not None:
            return {"": (meas.label, {"estimate": meas.estimate, "low": meas.interval[0],
                                      "high": meas.interval[1]})}
        # a count over layers: no interval of its own; the smallest effect each layer's
        # interval could detect, the largest over the layers
        p = job["probe"][PROBE_KEY[measure_name]]
        ivs = [{"estimate": e, "low": lo, "high": hi}
               for e, lo, hi in zip(p["estimate"], p["low"], p["high"])]
        per = [rules.sign(iv, 0.0, above=measure_name != "anti") for iv in ivs]
        return {"": (meas.label, {"layer_mde": max(rules.mde(iv) for iv in ivs),
                                  "holds": per.count(rules.REPRODUCED),
                                  "reversed": per.count(rules.NOT_REPRODUCED),
                                  "layers": len(per)})}
    return labels


PROBE_KEY = {"anti": "cos_v0_s", "rho": "rho_star_in_0_1", "cone": "delta_cos",
             "norm": "rel_delta_norm"}
"""The SinkProbe quantity each of the registry's per-layer measures reads."""


class _InterventionsJob:
    """An ``interventions`` job in the place of the registry's ``interventions.json``, so a
    cell's label comes from the registry's own measure (seed 002's ``collapse``,
    ``inversion``)."""

    def __init__(self, job: Mapping[str, Any]):
        self._it = {"n_docs": int(job["config"]["n"]),
                    "linearization": job.get("linearization") or [],
                    "removal": job["removal"]}

    def json(self, name: str) -> Mapping[str, Any] | None:
        return self._it if name == "interventions" else None


def intervention_labels(measure_name: str
                        ) -> Callable[[dict], dict[str, tuple[str, dict | None]]]:
    """``{"": (label, interval or steps)}`` of an ``interventions`` job by the registry's
    measure ``tl_spectral_studies.claims.seed002.<measure_name>``. The job linearizes up to
    its first collapse or k = 3, so "no collapse" reads "no collapse up to k = 3";
    B.inversion keeps its two steps, each with its interval."""
    def labels(job: dict) -> dict[str, tuple[str, dict | None]]:
        from tl_spectral_studies.claims import seed002

        meas = getattr(seed002, measure_name)(_InterventionsJob(job))
        if measure_name == "inversion":
            a = job["removal"]["all layers"]
            st = seed002.inversion_steps(a)
            return {"": (meas.label, _steps([
                ("routing removal costs less", st[0],
                 a["log_ppl_routing_removed_minus_filtering_removed"]),
                (f"routing removal cheap (< +{CHEAP:.0%})", st[1],
                 a["keep_filtering"])]))}
        label = meas.label
        if label.endswith("no collapse"):
            label += f" up to k = {max(r['k'] for r in job['linearization'])}"
        iv = None if meas.interval is None else {
            "estimate": meas.estimate, "low": meas.interval[0], "high": meas.interval[1]}
        return {"": (label, iv)}
    return labels


def inversion_layer_labels(job: Mapping[str, Any]) -> dict[str, tuple[str, dict]]:
    """``{"": (label, counts)}`` of an ``inversion_layers`` job by the registry's
    ``B.inversion.layer`` measure (seed 002's ``inversion_layers``: B.inversion's two steps in
    each layer, then a count): the layers where both steps hold, those where removing routing
    costs more than removing filtering (the first step reversed), and the largest per-layer
    MDE (each layer's larger step MDE)."""
    from tl_spectral_studies.claims import seed002

    meas = seed002.inversion_layers(_InterventionsJob(job))
    rows = [v for k, v in job["removal"].items() if k != "all layers"]
    steps = [seed002.inversion_steps(v) for v in rows]
    mdes = [max(rules.mde(v["log_ppl_routing_removed_minus_filtering_removed"]),
                rules.mde(v["keep_filtering"])) for v in rows]
    return {"": (meas.label, {"layer_mde": max(mdes),
                              "holds": sum(rules.steps(st) == rules.REPRODUCED for st in steps),
                              "reversed": sum(st[0] == rules.NOT_REPRODUCED for st in steps),
                              "layers": len(rows)})}


PANEL_CLAIMS = (
    PanelClaim("A.bands", "pod", "fine scales early, coarse late: E fine − E coarse over the "
               "first and the last third of the stack (paper cut-offs a ≤ 7, a ≥ 20)",
               "two steps by the sign rule (first third > 0, last third < 0), then "
               + rules.STEPS_RULE, labels=depth_labels("bands")),
    PanelClaim("A.hstar", "pod", "H*(0.1) higher in the first third of the stack than in the "
               "last", "sign rule on H* last − first third (jackknife) against 0, below; not "
               "tested when a layer of the two thirds is bounded by N",
               labels=depth_labels("hstar")),
    PanelClaim("A.tspec", "pod", "T_spec changes with depth (last − first third; descriptive)",
               "descriptive: the sign of the jackknife interval", labels=depth_labels("tspec")),
    PanelClaim("C.sink", "sinks", "decoders with a start token form attention sinks: at least "
               "one layer whose interval of mean α_i0 lies above 0.5 (selection half)",
               "at least one layer selected by the interval rule (a count, no interval)",
               labels=sink_labels, n_windows="select_windows"),
    PanelClaim("C.split", "sinks", "the sink's small contribution comes from its value norm "
               "and its direction (pooled over the sink layers, test half)",
               "each factor by the sign rule (norm ratio < 1; cosine factor < 0), then "
               + rules.STEPS_RULE, labels=split_labels),
    PanelClaim("C.anti", "probe_sinks", "cos(ṽ_0, s_i) < 0 per layer (library SinkProbe, "
               "every window), then over layers",
               "the sign rule in each layer, then over layers", labels=probe_labels("anti"),
               n_windows=""),
    PanelClaim("C.rho", "probe_sinks", "the share of queries with 0 < ρ* < 1, pooled over the "
               "sink layers (test half), above a majority",
               "sign rule against the majority share, above",
               labels=probe_labels("rho", "rho_star_in_0_1"), n_windows="test_windows"),
    PanelClaim("C.cone", "probe_sinks", "Δcos(o, s̄) > 0 per layer when the sink's value is "
               "zeroed (library SinkProbe, every window), then over layers",
               "the sign rule in each layer, then over layers", labels=probe_labels("cone"),
               n_windows=""),
    PanelClaim("C.norm", "probe_sinks", "Δ‖o‖/‖o‖ > 0 per layer when the sink's value is "
               "zeroed (library SinkProbe, every window), then over layers",
               "the sign rule in each layer, then over layers", labels=probe_labels("norm"),
               n_windows=""),
    # not the registry's C.cone (per layer, library probe): its own id, as C.norm.pooled
    PanelClaim("C.cone.pooled", "sinks", "zeroing the sink's value raises cos(o, s̄) "
               "(pooled over the sink layers, test half)", "sign rule against 0, above",
               extract=_pooled("cone_change"),
               rule=_no_pool_label(lambda iv: rules.sign(iv, 0.0, above=True))),
    PanelClaim("C.little", "sinks", "the sink contributes little: C_i0/α_i0 pooled over the "
               "sink layers (selected on one half of the windows, tested on the other) < 0.5",
               "sign rule against 0.5, below", extract=_pooled("C0_over_attn0"),
               rule=_no_pool_label(lambda iv: rules.sign(iv, 0.5, above=False))),
    # not the registry's C.norm (per layer, library probe): its own id, so the panel's label
    # is not attached to a record of another measure
    PanelClaim("C.norm.pooled", "sinks", "zeroing the sink's value raises the output norm "
               "(Δ‖o‖/‖o‖ > 0, pooled over the sink layers, test half)",
               "sign rule against 0, above", extract=_pooled("rel_norm_change"),
               rule=_no_pool_label(lambda iv: rules.sign(iv, 0.0, above=True))),
    PanelClaim("C.tail", "sinks", "tail tokens: contribution share − attention share differs "
               "from 0 by more than the practical margin (pooled, test half)",
               f"two-sided, practical margin ±{TAIL_MARGIN}",
               extract=_pooled("tail_C_minus_attn"),
               rule=_no_pool_label(lambda iv: rules.two_sided(iv, 0.0, practical=TAIL_MARGIN))),
    PanelClaim("C.zero_ppl", "zero_sink", "removing the sink's value (every layer) raises "
               "perplexity: relative ΔPPL > 0, paired over windows",
               "sign rule against 0, above",
               extract=lambda job: {"included": job.get("include_self"),
                                    "excluded": job.get("exclude_self")},
               rule=lambda iv: rules.sign(iv, 0.0, above=True),
               variant_factor="sink self-attention"),
    PanelClaim("B.collapse3", "interventions", "standard attention collapses under "
               "linearization from layer 3: the first k whose PPL'/PPL − 1 has its lower end "
               "at or above +100% is 3", "collapse = the first k (linearized up to 3) whose "
               "interval's lower end is at or above +100%; reproduced when that k is 3",
               labels=intervention_labels("collapse")),
    PanelClaim("B.inversion", "interventions", "the inversion (every layer at once): removing "
               "routing costs less than removing filtering, and is cheap", "two steps by the "
               "sign rule (log PPL(routing removed) − log PPL(filtering removed) < 0; routing "
               f"removal below +{CHEAP:.0%}), then " + rules.STEPS_RULE,
               labels=intervention_labels("inversion")),
    PanelClaim("B.inversion.layer", "inversion_layers", "the inversion one layer at a time: "
               "in each layer, removing routing there alone costs less than removing filtering "
               "there alone, and is cheap; then a count over layers", "B.inversion's two steps "
               "in each layer, then a count over layers (descriptive: no multiple-comparison "
               "correction)", labels=inversion_layer_labels),
    PanelClaim("C.hierarchy", "faithfulness", "faithfulness hierarchy attention < "
               "value-weighted < output-normalized < contribution (layer-wide ranking)",
               "every step by the sign rule on the area difference, then " + rules.STEPS_RULE,
               variant_factor="criterion, setting", variants_are_claims=True,
               labels=hierarchy_labels),
)


def load_jobs(out: Path, model: str, step: str) -> list[dict]:
    """The complete job files of one step (temporary files of a killed run are ignored)."""
    d = Path(out) / model / step
    jobs = []
    for p in sorted(d.glob("first=*.json")) if d.is_dir() else []:
        try:
            jobs.append(json.loads(p.read_text(encoding="utf-8")))
        except ValueError:
            continue
    return jobs


def _cell_row(job: dict, claim: PanelClaim, variant: str, label: str, iv: Mapping | None
              ) -> dict:
    conf = job["config"]
    factors = {k: conf[k] for k in ("first token", "corpus", "draw")}
    if claim.variant_factor:
        factors[claim.variant_factor] = variant
    row: dict[str, Any] = {"factors": factors, "n": _n(job, claim), "label": label}
    if iv is not None and "layer_mde" in iv:  # a count over layers, each its own interval
        row["mde"] = float(iv["layer_mde"])
        row.update({k: int(iv[k]) for k in ("holds", "reversed", "layers") if k in iv})
    elif iv is not None and "count" in iv:  # a count over layers: no interval
        row["count"] = int(iv["count"])
    elif iv is not None and "steps" in iv:  # a claim of several steps: each its own interval
        steps = [dict(st, mde=rules.mde(st)) if "low" in st else dict(st) for st in iv["steps"]]
        row["steps"] = steps
        mdes = [st["mde"] for st in steps if "mde" in st]
        if mdes:
            row["mde"] = max(mdes)
    elif iv is not None:
        row.update({k: float(iv[k]) for k in ("estimate", "low", "high")})
        row["mde"] = rules.mde(iv)
    return row


def _n(job: dict, claim: PanelClaim) -> int:
    """The windows behind the cell's interval (the test half for pooled sink numbers)."""
    if claim.step == "pod":
        return int(job["n_docs"])
    if claim.step in ("sinks", "probe_sinks") and claim.n_windows:
        return len((job.get("selection") or {}).get(claim.n_windows) or [])
    return int(job["config"]["n"])


def summarize_claim(claim: PanelClaim, jobs: list[dict], expected_cells: int) -> dict:
    """One claim over the panel: per-cell rows, the robustness label, the sample and MDE."""
    per = [claim.cells_of(job) for job in jobs]
    cells = [_cell_row(job, claim, v, lab, iv) for job, got in zip(jobs, per)
             for v, (lab, iv) in got.items()]
    n_var = max(1, len(per[0]) if per else 1)
    mdes = [c["mde"] for c in cells if c.get("mde") is not None]
    res = {"id": claim.id, "text": claim.text, "rule": claim.rule_text,
           "mde_rule": rules.MDE_RULE, "sensitivity_rule": rules.SENSITIVITY_RULE,
           "cells": cells, "complete": len(jobs) >= expected_cells,
           "cells_expected": expected_cells * n_var,
           "sensitivity": rules.sensitivity([(c["factors"], c["label"]) for c in cells]),
           "labels": sorted({c["label"] for c in cells}),
           "mde_max": max(mdes) if mdes else None}
    if claim.variants_are_claims:  # one robustness per variant: they are different claims
        vf = claim.variant_factor
        by = {}
        for c in cells:
            by.setdefault(c["factors"][vf], []).append(
                ({k: v for k, v in c["factors"].items() if k != vf}, c["label"]))
        res["sensitivity_by_variant"] = {v: rules.sensitivity(fl) for v, fl in by.items()}
        res["sensitivity"] = "; ".join(f"{v}: {x}"
                                       for v, x in res["sensitivity_by_variant"].items())
    return res


def summarize(out: Path, model: str) -> dict:
    """Every panel claim of ``model`` from the stored jobs."""
    from tl_spectral_studies.evidence_panel import panel

    res: dict[str, Any] = {"model": model, "claims": {}, "selection": {}}
    for claim in PANEL_CLAIMS:
        jobs = load_jobs(out, model, claim.step)
        if jobs:
            res["claims"][claim.id] = summarize_claim(claim, jobs, len(panel(model, claim.step)))
    for job in load_jobs(out, model, "sinks"):
        c = job["config"]
        key = f"first={c['first token']} corpus={c['corpus']} draw={c['draw']}"
        res["selection"][key] = {"sink_layers": job.get("sink_layers"),
                                 "threshold": SINK_LAYER_MIN, **(job.get("selection") or {})}
    return res


def write_summary(out: Path, model: str) -> dict:
    """:func:`summarize` written to ``OUT/<model>/summary.json`` (atomically)."""
    from tl_spectral_studies.evidence_panel import write_atomic

    s = summarize(out, model)
    write_atomic(Path(out) / model / "summary.json", s)
    return s


# ---------------------------------------------------------------------- compute plan
def compute_plan(small_out: Path, model: str, full: Mapping[str, int] | None = None) -> dict:
    """CPU minutes of the full panel, extrapolated from a small run's job files under
    ``small_out`` (their ``seconds`` and window counts): per step, seconds per window at the
    small run's size × windows of the full plan × cells of the panel. Linear in windows (every
    window is one more forward pass of the same length); the small run's length must be the
    full plan's, which is checked."""
    from tl_spectral_studies.evidence_panel import DEFAULTS, panel

    full = {**DEFAULTS, **(full or {})}
    steps: dict[str, Any] = {}
    for step in ("sinks", "zero_sink", "faithfulness"):
        jobs = load_jobs(small_out, model, step)
        if not jobs:
            continue
        n_full, T_full = ((full["faith_docs"], full["faith_length"]) if step == "faithfulness"
                          else (full["windows"], full["length"]))
        per = [j["seconds"] / j["config"]["n"] for j in jobs]
        if any(j["config"]["length"] != T_full for j in jobs):
            raise ValueError(f"{step}: the small run's length differs from the full plan's "
                             f"{T_full}; time it at the same length")
        cells = len(panel(model, step))
        s_per = sum(per) / len(per)
        steps[step] = {"measured_windows": [j["config"]["n"] for j in jobs],
                       "measured_seconds": [j["seconds"] for j in jobs],
                       "seconds_per_window": s_per, "full_windows": n_full, "cells": cells,
                       "cpu_minutes_per_cell": s_per * n_full / 60,
                       "cpu_minutes_panel": s_per * n_full * cells / 60}
    return {"model": model, "steps": steps, "full": dict(full),
            "cpu_minutes_total": sum(s["cpu_minutes_panel"] for s in steps.values())}


def plan_markdown(plans: list[dict]) -> str:
    """The compute-plan table of docs/real_decoder.md."""
    out = ["| model | step | measured (windows: s) | s per window | full plan per cell | "
           "cells | panel (min) |", "|---|---|---|---|---|---|---|"]
    for p in plans:
        for step, s in p["steps"].items():
            meas = ", ".join(f"{n}: {sec:.0f}" for n, sec in zip(s["measured_windows"],
                                                                   s["measured_seconds"]))
            out.append(f"| {p['model']} | {step} | {meas} | {s['seconds_per_window']:.1f} | "
                       f"{s['full_windows']} windows: {s['cpu_minutes_per_cell']:.0f} min | "
                       f"{s['cells']} | {s['cpu_minutes_panel']:.0f} |")
        out.append(f"| {p['model']} | **all** | | | | | **{p['cpu_minutes_total']:.0f}** |")
    return "\n".join(out)


def run_times(out: Path, model: str) -> dict:
    """The full panel's jobs as they ran (issue 39 item 1: the compute plan measured at full
    size, not only extrapolated): per step, how many of the panel's cells have run, the wall
    seconds of each job (its file's ``seconds``; one process, ``threads`` torch threads), the
    minutes spent so far and the minutes left at the median job's time."""
    import statistics

    from tl_spectral_studies.evidence_panel import STEPS, panel

    steps: dict[str, Any] = {}
    for step in STEPS:
        jobs = [j for j in load_jobs(out, model, step) if "seconds" in j]
        cells = len(panel(model, step))
        secs = sorted(float(j["seconds"]) for j in jobs)
        med = statistics.median(secs) if secs else None
        steps[step] = {"cells": cells, "done": len(jobs), "seconds": secs, "median_s": med,
                       "threads": sorted({int(j.get("threads") or 0) for j in jobs}),
                       "minutes_done": sum(secs) / 60,
                       "minutes_left": None if med is None else med * (cells - len(jobs)) / 60}
    return {"model": model, "steps": steps}


def runs_markdown(runs: list[dict]) -> str:
    """The table of :func:`run_times` for docs/real_decoder.md."""
    out = ["| model | step | cells run | wall s per job: median (range) | threads | minutes "
           "so far | minutes left (median × cells left) |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        for step, s in r["steps"].items():
            if s["done"]:
                t = f"{s['median_s']:.0f} ({s['seconds'][0]:.0f}–{s['seconds'][-1]:.0f})"
                left = f"{s['minutes_left']:.0f}"
            else:
                t, left = "—", "not timed at full size"
            th = ", ".join(str(x) for x in s["threads"]) or "—"
            out.append(f"| {r['model']} | {step} | {s['done']} of {s['cells']} | {t} | {th} | "
                       f"{s['minutes_done']:.0f} | {left} |")
    return "\n".join(out)


def cells_markdown(summary: Mapping[str, Any]) -> str:
    """One row per (claim, cell) of a summary: n, estimate [interval], MDE, label, and the
    claim's robustness so far."""
    out = ["| claim | first token | corpus | draw | variant | n | estimate [95%] | MDE | label |"
           " panel so far |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cid, c in summary["claims"].items():
        done = (c["sensitivity"] if c["complete"] else
                f"so far {c['sensitivity']} ({len(c['cells'])} of {c['cells_expected']} cells)")
        by_var = c.get("sensitivity_by_variant")
        for r in c["cells"]:
            f = dict(r["factors"])
            var = next((f.pop(k) for k in list(f) if k not in ("first token", "corpus", "draw")),
                       "")
            if by_var and var in by_var:
                done = (by_var[var] if c["complete"] else f"so far {by_var[var]}")
            est = (f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if "estimate" in r
                   else f"{r['count']} layers" if "count" in r else
                   "; ".join(f"{st['estimate']:.3f} [{st['low']:.3f}, {st['high']:.3f}]"
                             for st in r["steps"] if "low" in st) or "—"
                   if "steps" in r else "—")
            mde = f"{r['mde']:.3f}" if r.get("mde") is not None else "—"
            first = str(f["first token"]).replace("|", "\\|")  # a table cell
            out.append(f"| `{cid}` | `{first}` | {f['corpus']} | {f['draw']} | "
                       f"{var or '—'} | {r['n']} | {est} | {mde} | {r['label']} | {done} |")
    return "\n".join(out)
