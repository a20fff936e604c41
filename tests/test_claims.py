"""Claims as data (issue 38): one registry of the papers' claims, one rules module, every
model a column, one renderer for tables and prose — and the seven defects of the issue, each
with a test that fails on the old behaviour."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tl_spectral_studies._common import generated_blocks
from tl_spectral_studies.claims import catalog, registry, render, rules, seed002, seed003

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
RD = RESULTS / "real_decoder"
SMOL = "smollm2-135m"


def iv(est, lo, hi):
    return {"estimate": est, "low": lo, "high": hi}


def _copy_rd(tmp_path: Path) -> Path:
    dst = tmp_path / "rd"
    shutil.copytree(RD, dst)
    return dst


def _records_of(results: Path, key: str = SMOL, **model) -> dict[str, registry.Record]:
    m = dataclasses.replace(catalog.MODELS[key], results=str(results), **model)
    return {r.claim: r for r in catalog.records(ROOT, {m.key: m})}


# ------------------------------------------------------------------ the rules module
def test_sign_rule_both_sides_and_bad_input():
    assert rules.sign(iv(1, 0.1, 2), 0, above=True) == rules.REPRODUCED
    assert rules.sign(iv(-1, -2, -0.1), 0, above=True) == rules.NOT_REPRODUCED
    assert rules.sign(iv(0, -1, 1), 0, above=True) == rules.NOT_DISTINGUISHABLE
    assert rules.sign(iv(-1, -2, -0.1), 0, above=False) == rules.REPRODUCED
    assert rules.sign(None, 0, above=True) == rules.NOT_TESTED
    with pytest.raises(ValueError, match="low"):
        rules.sign({"estimate": 1}, 0, above=True)
    with pytest.raises(ValueError, match="not an interval"):
        rules.sign(iv(0, 1, -1), 0, above=True)


def test_the_sign_rule_exists_once():
    """The four old copies (verdicts.side, contributions._verdict, scale_pod._sign_verdict,
    real_decoder.sign_label) are gone or delegate: no module compares an interval's ends
    with a threshold to make a label except rules.py."""
    from tl_spectral_studies import contributions, real_decoder, scale_pod, verdicts

    assert not hasattr(real_decoder, "sign_label")
    for f in (verdicts.side, contributions._verdict, scale_pod._sign_verdict):
        src = ast.unparse(ast.parse(__import__("inspect").getsource(f)))
        assert "lo > " not in src and "hi < " not in src, f.__qualname__
    # and they agree with rules.sign on every side
    for x in (iv(1, 0.1, 2), iv(0, -1, 1), iv(-1, -2, -0.1)):
        base = rules.sign(x, 0, above=True)
        for lab in (verdicts.side(x, 0, below=False), contributions._verdict(x),
                    scale_pod._sign_verdict(x)):
            assert rules.base(lab) == base


def test_practical_threshold_c_tail():
    """Defect 7: a sign rule alone passes any nonzero difference (C.tail's 0.7 points);
    the declared practical margin makes a tiny difference "not reproduced"."""
    tail = iv(-0.0067, -0.0092, -0.0045)
    assert rules.two_sided(tail, 0.0) == rules.REPRODUCED  # the old rule
    assert rules.two_sided(tail, 0.0, practical=seed003.TAIL_MARGIN) == rules.NOT_REPRODUCED
    assert rules.two_sided(iv(-0.2, -0.3, -0.1), 0.0, practical=0.05) == rules.REPRODUCED
    assert rules.two_sided(iv(0.04, -0.01, 0.09), 0.0, practical=0.05) == \
        rules.NOT_DISTINGUISHABLE
    c = catalog.all_claims()["C.tail"]
    assert c.threshold is not None and c.threshold[0] == seed003.TAIL_MARGIN
    assert "surgery" in c.threshold[1] and "choice" in c.threshold[1]
    assert _records_of(RD)["C.tail"].label == rules.NOT_REPRODUCED


def test_partly_needs_a_step_that_holds():
    """Defect 3: every step "not distinguishable" is not "partly"."""
    nd, ok, rev = rules.NOT_DISTINGUISHABLE, rules.REPRODUCED, rules.NOT_REPRODUCED
    assert rules.steps([nd, nd, nd]) == nd
    assert rules.steps([ok, nd, nd]) == rules.PARTLY
    assert rules.steps([ok, rev, ok]) == rev
    assert rules.steps([ok, ok]) == ok
    assert rules.steps([ok, rules.TIE, ok]) == rules.PARTLY
    recs = _records_of(RD, evidence=None)  # the one-framing study, without the panel
    for cid in ("C.hierarchy.comp.alllayers", "C.hierarchy.comp.layer15",
                "C.hierarchy.suff.layer15"):
        assert recs[cid].label == nd, cid
    assert recs["C.hierarchy.suff.alllayers"].label == rules.PARTLY
    # with the panel each record reads its own (criterion, setting) cells only
    panel = _records_of(RD)
    for cid in ("C.hierarchy.comp.alllayers", "C.hierarchy.suff.layer15"):
        assert panel[cid].cells == 9 and "criterion" not in panel[cid].sensitivity, cid
        assert panel[cid].mde is not None and panel[cid].mde > 0, cid
    assert rules.over_layers([ok, rev, nd]) == rules.MIXED
    assert rules.over_layers([nd, rev]) == rev


# ------------------------------------------------------------------ the seven defects
def _with_probe(d: Path, key: str, ivs: list[dict]) -> None:
    p = d / "sinks.json"
    s = json.loads(p.read_text())
    s["settings"]["wiki_start"]["probe"][key] = {k: [x[k] for x in ivs]
                                                 for k in ("estimate", "low", "high")}
    p.write_text(json.dumps(s))


def test_c_norm_a_norm_drop_is_not_reproduced(tmp_path):
    """Defect 1: seed 003 §3.3 — sinks suppress ‖o‖, so zeroing them should raise it. A
    synthetic drop in every layer is "not reproduced" (the old rule said "reproduced"),
    a rise "reproduced"."""
    d = _copy_rd(tmp_path)
    n = len(json.loads((d / "sinks.json").read_text())["layer_ids"])
    _with_probe(d, "rel_delta_norm", [iv(-0.2, -0.25, -0.15)] * n)
    assert _records_of(d, evidence=None)["C.norm"].label == rules.NOT_REPRODUCED
    _with_probe(d, "rel_delta_norm", [iv(0.2, 0.15, 0.25)] * n)
    assert _records_of(d, evidence=None)["C.norm"].label == rules.REPRODUCED


def test_one_claim_one_set_of_numbers_one_label_in_every_doc(tmp_path):
    """Defect 1/4: the same per-layer intervals get the same C.norm and C.anti label in the
    real-decoder record and in docs/contributions.md's row."""
    from tl_spectral_studies.contributions import _verdict_rows

    s = json.loads((RESULTS / "contributions" / "minilm_summary.json").read_text())
    d = _copy_rd(tmp_path)
    n = len(json.loads((d / "sinks.json").read_text())["layer_ids"])
    for key in ("rel_delta_norm", "cos_v0_s"):  # MiniLM's 6 layers, repeated over 30
        ivs = [r[key] for r in s["sink_intervals"]]
        _with_probe(d, key, (ivs * n)[:n])
    recs = _records_of(d, evidence=None)  # the study file, not the panel
    rows = _verdict_rows("minilm", s)
    norm_row = next(r for r in rows if "suppress the output norm" in r)
    anti_row = next(r for r in rows if "anti-aligned" in r)
    assert rules.base(norm_row.split(" | ")[-1]) == rules.base(recs["C.norm"].label)
    assert rules.base(anti_row.split(" | ")[-1]) == rules.base(recs["C.anti"].label)
    # and the registry's minilm column agrees with both
    mm = {r.claim: r for r in catalog.records(ROOT, {"minilm": catalog.MODELS["minilm"]})}
    assert mm["C.norm"].label == recs["C.norm"].label


def test_c_cone_is_spec_c4_cos_o_sbar(tmp_path):
    """Defect 2: C.cone reads SPEC C.4's Δcos(o, s̄) (the probe's delta_cos), not the mean
    pairwise cosine of the outputs."""
    r = _records_of(RD, evidence=None)["C.cone"]  # the study file
    assert "Δcos(o, s̄)" in r.number and "pairwise" not in r.number
    s = json.loads((RD / "sinks.json").read_text())
    dc = s["settings"]["wiki_start"]["probe"]["delta_cos"]
    k = sum(lo > 0 for lo in dc["low"])
    assert f"holds in {k} of {len(dc['low'])} layers" in r.number
    d = _copy_rd(tmp_path)
    _with_probe(d, "delta_cos", [iv(-0.1, -0.2, -0.05)] * len(dc["low"]))
    assert _records_of(d, evidence=None)["C.cone"].label == rules.NOT_REPRODUCED


def test_routing_rank_one_rule_for_every_model():
    """Defect 4: MiniLM and SmolLM2 both lie below the random kernel's rank and above half
    the capacity: one rule gives them one label (the old table: partly vs not reproduced),
    in docs/routing_filtering.md's rows and in the registry."""
    from tl_spectral_studies.routing import claim_rows

    smol = _records_of(RD)["B.rank"]
    mini = {r.claim: r for r in catalog.records(ROOT, {"minilm": catalog.MODELS["minilm"]})}
    assert rules.base(smol.label) == rules.base(mini["B.rank"].label)
    rows = {r.model: r for r in claim_rows(RESULTS / "routing") if r.key == "routing_rank"}
    assert rules.base(rows["minilm"].label) == rules.base(mini["B.rank"].label)
    assert seed002.rank_label(iv(50, 45, 55), 60, 64)[0] == rules.NOT_REPRODUCED
    assert seed002.rank_label(iv(20, 18, 22), 60, 64)[0] == rules.REPRODUCED
    assert seed002.rank_label(iv(50, 45, 70), 60, 64)[0] == rules.NOT_REPRODUCED


def test_collapse_one_rule_and_sd_claims_not_comparable():
    """Defect 4: collapse = the first k at ≥ +100% (docs/surgery.md's rule): SmolLM2 collapses
    at k = 1, not 3; B.linear and B.depth (S–D claims) are not comparable on standard
    attention."""
    from tl_spectral_studies.surgery import collapse_k

    recs = _records_of(RD)
    assert recs["B.collapse3"].label.startswith(rules.NOT_REPRODUCED)
    assert "k = 1" in recs["B.collapse3"].label
    it = json.loads((RD / "interventions.json").read_text())
    est = {r["k"]: r["estimate"] for r in it["linearization"]}
    assert collapse_k([est.get(k, 0.0) for k in range(max(est) + 1)]) == 1
    for cid in ("B.linear", "B.depth"):
        assert recs[cid].label.startswith(rules.NOT_COMPARABLE)
        assert recs[cid].number != "—"  # the number is still shown
    sd = dataclasses.replace(catalog.MODELS[SMOL], key="sd-fake", attention=registry.SD,
                             results=str(RD))
    r = {x.claim: x for x in catalog.records(ROOT, {sd.key: sd})}
    assert not r["B.depth"].label.startswith(rules.NOT_COMPARABLE)


def test_sink_selection_by_the_documented_interval_rule():
    """Defect 5: the interval must lie above 0.5 (layers 14 and 28 pass only by their point
    estimate); the committed pooled numbers say they are provisional."""
    s = json.loads((RD / "sinks.json").read_text())
    a = s["settings"]["wiki_start"]["brute"]["attn0"]
    sel = rules.select_layers([iv(e, lo, hi) for e, lo, hi in
                               zip(a["estimate"], a["low"], a["high"])], 0.5, s["layer_ids"])
    point = [i for i, e in zip(s["layer_ids"], a["estimate"]) if e > 0.5]
    assert set(point) - set(sel) == {14, 28}
    assert seed003.sink_layers(registry.Results(ROOT, catalog.MODELS[SMOL])) == sel
    assert f"{len(sel)} of 30" in _records_of(RD, evidence=None)["C.sink"].number
    recs = _records_of(RD)
    one = _records_of(RD, evidence=None)["C.rho"]  # the 8-window study's record
    assert "provisional" in one.note and "issue 39" in one.note
    for cid in ("C.little", "C.tail", "C.split", "C.sink", "C.rho"):  # the panel's
        r = recs[cid]
        assert r.cells == 18 or ("provisional" in r.note and "issue 39" in r.note), cid


def test_split_windows_are_disjoint_and_cover():
    for n in (2, 8, 9, 64):
        a, b = rules.split_windows(n, seed=3)
        assert not set(a) & set(b) and sorted(a + b) == list(range(n))
        assert abs(len(a) - len(b)) <= 1
    assert rules.split_windows(8, 0) == rules.split_windows(8, 0)
    with pytest.raises(ValueError):
        rules.split_windows(1)


def test_selection_is_not_tested_on_the_windows_that_chose_it():
    """The study's code path selects sink layers on one half of the windows (interval rule)
    and pools on the other: a layer that is a sink only in the testing half is not chosen,
    and the pooled numbers are the testing half's."""
    import torch

    from tl_spectral_studies.real_decoder import SINK_KEYS_POOLED, select_and_pool

    n, L = 8, 3
    sel, test = rules.split_windows(n, 0)
    attn0 = torch.full((n, L), 0.1, dtype=torch.float64)
    attn0[:, 0] = 0.9                      # a sink in every window
    attn0[test, 1] = 0.9                   # a sink only where it would be tested
    attn0[sel, 2] = torch.tensor([0.6, 0.55, 0.62, 0.58], dtype=torch.float64)[:len(sel)]
    brute = {k: torch.rand(n, L, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
             for k in SINK_KEYS_POOLED}
    brute["attn0"] = attn0
    pr = {k: torch.rand(n, L, dtype=torch.float64) for k in ("cos_v0_s", "rho_star_in_0_1")}
    out = select_and_pool(pr, brute, [10, 11, 12], seed=0)
    assert out["selection"]["split"] and out["selection"]["test_windows"] == test
    assert out["sink_layers"] == [10, 12]  # layer 11 only sinks in the testing half
    want = brute["rel_norm_change"][test][:, [0, 2]].mean(1).mean()
    assert out["pooled"]["rel_norm_change"]["estimate"] == pytest.approx(float(want))
    # three windows: no split, said so
    few = select_and_pool({k: v[:3] for k, v in pr.items()},
                          {k: v[:3] for k, v in brute.items()}, [10, 11, 12])
    assert few["selection"]["split"] is False


# ------------------------------------------------------------------ prose and tables
def test_in_short_is_generated_from_the_records():
    """Defect 6: docs/real_decoder.md's "In short" is a generated block (it cannot drift)."""
    text = (ROOT / "docs" / "real_decoder.md").read_text(encoding="utf-8")
    block = generated_blocks(text)["real_decoder/in_short"]
    recs = _records_of(RD)
    for cid in ("C.norm", "C.cone", "B.inversion.layer", "A.bands"):
        assert recs[cid].number in block and recs[cid].label in block
    assert "14 of 30 single layers" not in text and "most of 11–23" not in text


def test_a_wrong_layer_list_in_checked_prose_fails_the_check(tmp_path):
    """Defect 6: a layer list or number in a checked sentence that disagrees with its record
    fails `doc_tables --check`. The layer lists on a record of its own (which records hold
    layer lists changes as panels complete); the command's check on the committed docs."""
    from tl_spectral_studies import doc_tables

    recs = catalog.records(ROOT)
    text = (ROOT / "docs" / "real_decoder.md").read_text(encoding="utf-8")
    assert render.check_prose(text, recs) == []
    rec = dataclasses.replace(
        _records_of(RD)["B.inversion.layer"], label="partly",
        number="30 layers: routing removal costs less in 14 (0–2, 11–14, 17–20, 22–23, 27), "
               "more in 4 (3, 7–9); both steps hold in 8 (12, 17–20, 22–23, 27)")
    good = ("the inversion (both steps) holds in layers 12, 17–20, 22–23 and 27 (8 of 30): "
            "partly; routing removal costs more in layers 3 and 7–9")
    assert render.check_span(good, rec) == []
    bad = good.replace("12, 17–20, 22–23 and 27", "12, 17–20 and 27")
    assert any("layer list" in p for p in render.check_span(bad, rec))
    assert any("label" in p for p in render.check_span(good.replace("partly", "reproduced"),
                                                         rec))
    # through the command's check, on a copy of the repository's docs: a checked number moved
    span = "<!-- check: C.rho smollm2-135m -->0.935 to 0.981"
    assert span in text
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs")
    (root / "docs" / "real_decoder.md").write_text(
        text.replace(span, span.replace("0.935", "0.937")), encoding="utf-8")
    assert any("C.rho" in p and "0.937" in p for p in doc_tables.prose_differences(root))


def test_a_changed_number_in_checked_prose_fails():
    r = _records_of(RD)["C.cone"]
    assert render.check_span("it rises in 30 of 30 layers: reproduced", r) == []
    assert render.check_span("it rises by 0.123 in 30 of 30 layers: reproduced", r)
    assert render.layer_set("12–14, 16–19, 21 and 22") == {12, 13, 14, 16, 17, 18, 19, 21, 22}


PAPER_TABLES = {"contributions": "contributions", "routing": "routing",
                "scale_pod": "scale_pod", "surgery": "surgery"}


def test_a_fake_model_is_one_entry_and_a_column_of_every_table(tmp_path, monkeypatch):
    """Adding a model touches one file (claims/models.py: one add_model call; here the same
    call on a patched registry): it becomes a column of every paper doc's claim table and of
    the claims matrix."""
    from tl_spectral_studies import contributions, routing, scale_pod, surgery

    d = _copy_rd(tmp_path)
    models = dict(registry.MODELS)
    monkeypatch.setattr(registry, "MODELS", models)
    monkeypatch.setattr(catalog, "MODELS", models)
    registry.add_model(registry.Model(
        "fake-decoder", "FakeDecoder-1M", registry.STANDARD, "real_decoder", str(d),
        "tl-spectral study real-decoder --model fake", "a fake column"))
    for mod, study in ((contributions, "contributions"), (routing, "routing"),
                       (scale_pod, "scale_pod"), (surgery, "surgery")):
        block = mod.tables(RESULTS / study)[f"{study}/verdict"]
        header = next(ln for ln in block.splitlines() if ln.startswith("|"))
        assert "FakeDecoder-1M" in header, study
        assert "FakeDecoder-1M column: a fake column" in block
    recs = catalog.records(ROOT)
    assert "FakeDecoder-1M" in render.matrix_markdown(recs).splitlines()[0]
    assert {r.model for r in recs} >= {"fake-decoder", SMOL, "gemma-3-270m"}


def test_gemma_column_reads_its_committed_results():
    """The Gemma-3 column fills from docs/results/real_decoder/gemma3-270m: a claim whose
    step ran has a measured record with that run's provenance, one whose step did not run
    reads "not measured" (never "not yet measured" once the column has results)."""
    g = {r.claim: r for r in catalog.records(ROOT) if r.model == "gemma-3-270m"}
    assert g and not any(r.label == rules.NOT_YET_MEASURED for r in g.values())
    res = ROOT / "docs" / "results" / "real_decoder" / "gemma3-270m"
    assert (res / "routing.json").is_file()
    b = g["B.budget.routing_fraction_delta0"]
    assert b.interval is not None and "over 72 heads" in b.number
    assert b.provenance["results"] == "docs/results/real_decoder/gemma3-270m"
    for cid, step in (("A.bands", "scales"), ("C.sink", "sinks"),
                      ("B.inversion", "interventions"),
                      ("C.hierarchy.comp.alllayers", "faithfulness")):
        if g[cid].number.startswith("evidence panel"):  # the complete panel measured it
            summary = json.loads((ROOT / "docs" / "results" / "real_decoder" / "evidence" /
                                  "gemma3-270m" / "summary.json").read_text(encoding="utf-8"))
            assert summary["claims"][catalog.all_claims()[cid].panel]["complete"]
            continue
        assert (g[cid].label == rules.NOT_MEASURED) == (not (res / f"{step}.json").is_file())
    m = generated_blocks((ROOT / "docs" / "claims.md").read_text(encoding="utf-8"))
    assert "Gemma-3-270M" in m["claims/matrix"].splitlines()[0]


def test_records_carry_provenance_and_rules():
    for r in catalog.records(ROOT):
        if r.label in (rules.NOT_MEASURED, rules.NOT_YET_MEASURED):
            continue
        assert r.rule and r.paper.startswith(("seed", "issue")) and "SPEC" in r.paper
        assert {"command", "commit", "seeds"} <= set(r.provenance)


def test_claims_with_another_class_must_say_why():
    with pytest.raises(ValueError, match="not_comparable"):
        registry.Claim("X.y", "seed 002", "B.1", "words", "rule", lambda r: None,
                       applies_to=frozenset({registry.SD}))


# ------------------------------------------------------------------ stale text (defect 7)
def test_stale_lines_are_gone():
    from tl_spectral_studies import smol_column

    text = (ROOT / "docs" / "real_decoder.md").read_text(encoding="utf-8")
    assert "reinstall" not in text
    assert "fifth of one core" not in text
    assert "N = 150" in smol_column.SETTING
    assert "applied unchanged" in text  # the band cut-offs' origin is stated
    r = _records_of(RD)["A.bands"]
    assert "char model" in r.note


# ------------------------------------------------------------------ house
def _imports(root: Path) -> dict[str, set[str]]:
    mods = {}
    for pkg in ("tl_spectral", "tl_spectral_studies"):
        for p in (root / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            mods[name] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    t = f"{node.module}.{a.name}"
                    edges[m].add(t if t in mods else node.module)
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names}
    return {m: {t for t in v if t in mods and t != m} for m, v in edges.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_studies_and_analysis():
    """Every import (module level or inside a function) counts: no circle among the studies
    and the analysis floor (field_pod ↔ scale_pod and bootstrap ↔ streaming_pod were)."""
    cyc = [c for c in _cycles(_imports(ROOT))
           if any(m.startswith(("tl_spectral_studies", "tl_spectral.analysis")) for m in c)]
    assert not cyc, cyc


def test_no_import_circle_anywhere():
    assert not _cycles(_imports(ROOT))


def test_statistics_live_on_the_analysis_floor():
    from tl_spectral.analysis import bootstrap
    from tl_spectral.viz import uncertainty

    assert uncertainty.group_jackknife is bootstrap.group_jackknife
    assert uncertainty.jackknife_interval is bootstrap.jackknife_interval
    src = (ROOT / "tl_spectral" / "viz" / "uncertainty.py").read_text(encoding="utf-8")
    assert "def group_jackknife" not in src and "def jackknife_interval" not in src


def test_jackknife_of_a_mean_matches_the_classical_formula():
    import torch

    from tl_spectral.analysis.bootstrap import group_jackknife

    x = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    jk = group_jackknife(lambda i: x[i].mean(), 12, n_groups=12, seed=0)
    se = x.std() / 12 ** 0.5  # the leave-one-out jackknife of a mean is the classical se
    assert float(jk["se"]) == pytest.approx(float(se), rel=1e-9)


def test_verdicts_json_is_the_registry_records():
    committed = json.loads((RD / "verdicts.json").read_text(encoding="utf-8"))
    want = render.model_records(catalog.records(ROOT), SMOL)
    assert committed == json.loads(json.dumps(want, ensure_ascii=False))
    for r in copy.deepcopy(committed):  # the command each results file records
        assert r["provenance"]["command"].startswith(("tl-spectral",
                                                      "python -m tl_spectral_studies.")), r


def test_no_module_global_is_rebound_at_run_time():
    """surgery.main used to rebind ROOT/OUT/FIG/PUB that six commands read; no studies module
    has a ``global`` statement now."""
    for p in sorted((ROOT / "tl_spectral_studies").rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)], p.name


def test_surgery_paths_come_from_the_arguments(tmp_path):
    import argparse

    from tl_spectral_studies.surgery import Paths

    a = argparse.Namespace(root=str(tmp_path), work=None, fig_dir=None, publish=None)
    p = Paths.from_args(a)
    assert p.out == tmp_path / "runs" / "surgery" and p.fig == p.out / "figures"
    assert p.pub is None
    b = argparse.Namespace(root=".", work=str(tmp_path / "w"), fig_dir=str(tmp_path / "f"),
                           publish=str(tmp_path / "p"))
    q = Paths.from_args(b)
    assert (q.out, q.fig, q.pub) == (tmp_path / "w", tmp_path / "f", tmp_path / "p")


def test_no_long_function_without_a_stated_reason():
    """No studies function over 80 lines unless its docstring says why."""
    long = []
    for p in sorted((ROOT / "tl_spectral_studies").rglob("*.py")):
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 80:
                if "Longer than 80 lines on purpose" not in (ast.get_docstring(n) or ""):
                    long.append(f"{p.name}:{n.name}")
    assert not long, long


def test_no_studies_file_over_600_lines():
    big = [p.name for p in (ROOT / "tl_spectral_studies").rglob("*.py")
           if len(p.read_text(encoding="utf-8").splitlines()) > 600]
    assert not big, big


def test_a_check_marker_wrapped_across_lines_is_read_and_a_broken_one_reported():
    """A checked span whose markers wrap across lines is still checked (before, the pattern
    needed single spaces, and a wrapped marker left its sentence silently unchecked); a marker
    the pattern cannot read is reported, never skipped."""
    recs = [r for r in catalog.records(ROOT) if r.claim == "C.cone" and r.model == "smollm2-135m"]
    good = "<!-- check: C.cone\nsmollm2-135m -->it rises in 30 of 30 layers: reproduced<!--\n/check -->"
    assert render.check_prose(good, recs) == []
    wrong = good.replace("reproduced<", "rises by 0.123: reproduced<")
    assert any("0.123" in p for p in render.check_prose(wrong, recs))
    broken = good.replace("<!-- check: C.cone\nsmollm2-135m -->", "<!-- check: C.cone -->")
    assert any("check markers" in p for p in render.check_prose(broken, recs))
