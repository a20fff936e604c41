"""Findings a researcher can trust at depth (issue 40): one rule for "H* bounded by N" and
no head advice from a bounded H*; a perplexity sanity finding for every causal model; every
measured number of the Findings in a table of the report; no fact stated twice; heads named
once with all their roles; absence stated with its reference; tokens decoded the
tokenizer's way (``tls.token_strings``); local / global layers marked."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


# ------------------------------------------------------------------ the bounded rule
def _harmonic_h_star(n_docs: int, eps: float) -> int:
    """Brute force: H*(ε) of the spectrum λ_k = 1/k, k = 1 … N − 1, by the library's
    effective_rank (an independent path: cumulative sums of the spectrum itself)."""
    from tl_spectral.analysis.pod import effective_rank

    lam = torch.tensor([1.0 / k for k in range(1, n_docs)], dtype=torch.float64)
    return effective_rank(lam, eps)[0]


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.2])
def test_h_star_bound_is_the_h_star_of_a_1_over_k_spectrum(eps):
    from tl_spectral.analysis.scale_pod import h_star_bound

    for n in range(2, 200):
        assert h_star_bound(n, eps) == _harmonic_h_star(n, eps), n
    # the values docs/scale_pod.md quotes
    assert [h_star_bound(n) for n in (4, 8, 16, 32, 64)] == [3, 6, 11, 21, 40]


def test_bounded_rule_and_docs_to_resolve():
    from tl_spectral.analysis.scale_pod import docs_to_resolve, h_star_bound, h_star_bounded

    assert h_star_bounded(6, 8) and not h_star_bounded(5, 8)
    assert h_star_bounded(2, 8, saturated=True)  # a saturated H* is a lower bound
    assert h_star_bounded(1, 1)  # one document: nothing to resolve
    for h in (1, 3, 6, 13, 26, 40):
        n = docs_to_resolve(h)
        assert h_star_bound(n) > h and h_star_bound(n - 1) <= h  # the least such N


def _fields(kind: str, n_docs: int, T: int = 12, n_lags: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "noise":  # no shared structure: every document its own direction
        return torch.randn(n_docs, T, n_lags, generator=g, dtype=torch.float64)
    basis = torch.randn(2, T, n_lags, generator=g, dtype=torch.float64)
    coef = torch.randn(n_docs, 2, generator=g, dtype=torch.float64)
    noise = 1e-4 * torch.randn(n_docs, T, n_lags, generator=g, dtype=torch.float64)
    return torch.einsum("nr,rtl->ntl", coef, basis) + noise


@pytest.mark.parametrize("n_docs", [8, 16, 32])
def test_noise_is_bounded_and_low_rank_structure_is_not(n_docs):
    """The rule on fields whose answer is known: structureless noise (H* reports N) is
    bounded; a rank-2 field (H* = 2 whatever N) is not, and gets head advice."""
    from tl_spectral.analysis.scale_pod import layer_h_star_bounded, scale_pod

    lags = torch.arange(12)
    pod = scale_pod([_fields("noise", n_docs), _fields("rank2", n_docs, seed=1)], lags,
                    n_heads=4, coherence_queries=None)
    noise, low = pod.layers
    assert layer_h_star_bounded(noise) and not layer_h_star_bounded(low)
    assert low.H_star <= 2
    rows = pod.allocation
    assert rows[0]["bounded"] and not rows[1]["bounded"]
    # one bounded layer: no advice anywhere (the shares divide by a sum with a lower bound)
    assert all(r["advice"] is None for r in rows)
    assert [r["recommended_heads"] for r in pod.to_rows()] == ["—", "—"]
    assert [r["H_star_bounded"] for r in pod.to_rows()] == [True, False]
    ok = scale_pod([_fields("rank2", n_docs, seed=2), _fields("rank2", n_docs, seed=3)], lags,
                   n_heads=4, coherence_queries=None)
    assert [r["advice"] for r in ok.allocation] == [r["recommended"] for r in ok.allocation]


def test_tspec_hstar_figure_greys_bounded_layers_and_gives_no_advice():
    import matplotlib.pyplot as plt
    from _figure_checks import figure_problems

    from tl_spectral.analysis.scale_pod import scale_pod

    lags = torch.arange(12)
    pod = scale_pod([_fields("noise", 16), _fields("rank2", 16, seed=1)], lags, n_heads=4,
                    coherence_queries=None)
    fig = pod.plot_tspec_hstar()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    legends = [t.get_text() for ax in fig.axes if ax.get_legend()
               for t in ax.get_legend().get_texts()]
    assert any("no advice" in t for t in texts)
    assert "∝ H*" not in legends and any("bounded by N" in t for t in legends)
    assert any("bound 11 at N = 16" in t for t in legends)
    assert not figure_problems(fig, "tspec_hstar")
    plt.close(fig)


# ------------------------------------------------------------------ layer axes
def test_layer_ticks_thin_and_keep_global_layers():
    from tl_spectral.viz.layer_plots import layer_ticks

    pos, texts = layer_ticks(list(range(12)))
    assert pos == list(range(12))
    pos, texts = layer_ticks(list(range(30)))
    assert len(pos) <= 15 and texts[0] == "0"
    kinds = ["global" if (i + 1) % 6 == 0 else "local" for i in range(18)]
    pos, texts = layer_ticks(list(range(18)), kinds)
    assert {"5 G", "11 G", "17 G"} <= set(texts)
    # no regular label right beside a global one
    assert "4" not in texts and "6" not in texts


def test_layer_kinds_of_a_gemma3_model_and_marked_tables(tmp_path):
    from _deep_models import save_gemma3_shape
    from _tiny_hf import boot

    from tl_spectral.viz.layer_plots import kinds_note, layer_kinds, mark_rows

    model = boot(save_gemma3_shape(tmp_path / "g", n_layers=6, d_model=32, head_dim=16))
    kinds = layer_kinds(model)
    assert kinds == ["local"] * 5 + ["global"]
    assert "Layers 5 attend globally" in kinds_note(model) and "16 tokens" in kinds_note(model)
    rows = mark_rows([{"layer": 5, "x": 1.0}, {"layer": 0, "x": 2.0}], kinds)
    assert [list(r) for r in rows][0] == ["layer", "attention", "x"]
    assert [r["attention"] for r in rows] == ["global", "local"]


# ------------------------------------------------------------------ tokens
def test_token_strings_public_whitespace_visible():
    from _tiny_hf import char_tokenizer

    import tl_spectral as tls

    assert "token_strings" in tls.__all__
    tok = char_tokenizer()
    ids = tok("ab c\nd")["input_ids"]
    assert tls.token_strings(tok, ids) == ["a", "b", "␣", "c", "\\n", "d"]
    assert tls.token_strings(tok, ids, visible_whitespace=False)[2] == " "

    class Holder:  # a model that carries its tokenizer
        tokenizer = tok

    assert tls.token_strings(Holder(), torch.tensor(ids)) == tls.token_strings(tok, ids)
    with pytest.raises(ValueError, match="ONE sequence"):
        tls.token_strings(tok, [ids, ids])
    with pytest.raises(ValueError, match="tokenizer"):
        tls.token_strings(object(), ids)


# ------------------------------------------------------------------ head scores
def test_planted_scores_against_brute_force():
    from tl_spectral.viz.head_scores_section import planted_score

    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 5, (3, 9), generator=g)
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[2, 6:] = False

    def brute(score):
        hit = tot = 0
        for d in range(3):
            for i in range(9):
                if not mask[d, i]:
                    continue
                tot += 1
                t = toks[d].tolist()
                if score == "previous_token":
                    hit += i >= 1
                elif score == "duplicate_token":
                    hit += any(t[j] == t[i] for j in range(i))
                else:
                    hit += any(t[j - 1] == t[i] for j in range(1, i + 1))
        return hit / tot

    for s in ("previous_token", "duplicate_token", "induction"):
        assert planted_score(toks, mask, s) == pytest.approx(brute(s))


# ------------------------------------------------------------------ surgery on rotary
def test_linearization_curve_runs_on_a_rotary_bridge(tmp_path):
    from _tiny_hf import tiny_bridge

    from tl_spectral.interventions.surgery import tl_linearization_curve
    from tl_spectral.viz.sanity_section import window_perplexity

    model = tiny_bridge("llama", tmp_path / "l", n_layers=2)
    toks = torch.randint(1, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    curve = tl_linearization_curve(model, toks)
    from tl_spectral.model_view import ModelView

    assert curve.base_ppl == pytest.approx(window_perplexity(ModelView(model), toks), rel=1e-5)
    assert curve.ppl_zero_shot[1] != pytest.approx(curve.base_ppl, rel=1e-6)
    assert "rotated" in curve.note


# ------------------------------------------------------------------ the report
@pytest.fixture(scope="module")
def gemma_report(tmp_path_factory):
    from _deep_models import save_gemma3_shape

    from tl_spectral.cli import main

    folder = save_gemma3_shape(tmp_path_factory.mktemp("hf") / "gemma18")
    out = tmp_path_factory.mktemp("rep") / "r"
    assert main(["analyze", "--model", str(folder), "--n-docs", "8", "--length", "40",
                 "--out", str(out), "--no-progress"]) == 0
    return out


def _table_numbers(out: Path) -> list[float]:
    vals = []
    for p in (out / "tables").glob("*.csv"):
        with open(p, encoding="utf-8") as f:
            for row in csv.reader(f):
                for cell in row:
                    for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", cell):
                        vals.append(float(x))
    return vals


_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+|\d+(?=%))(%?)")


def measured_numbers(finding: str) -> list[tuple[float, int, bool]]:
    """(value, decimals, percent) of every measured number of a finding: a number with a
    decimal point or a percentage (plain integers are counts, indices and settings)."""
    out = []
    for m in _NUMBER.finditer(finding):
        text, pct = m.group(1), bool(m.group(2))
        dec = len(text.split(".")[1]) if "." in text else 0
        out.append((float(text), dec, pct))
    return out


def _in_tables(x: float, dec: int, pct: bool, table: list[float]) -> bool:
    tol = 0.5 * 10 ** (-dec) + 1e-9
    for v in table:
        w = 100 * v if pct else v
        if abs(w - x) <= tol:
            return True
        if not pct and x != 0:  # 4 significant digits ({:.4g}) of a larger value
            s = float(f"{w:.4g}") if w else 0.0
            if abs(s - x) <= tol:
                return True
    return False


def _findings(out: Path) -> list[str]:
    return json.loads((out / "report.json").read_text(encoding="utf-8"))["findings"]


def test_every_number_in_findings_is_in_a_table(gemma_report):
    table = _table_numbers(gemma_report)
    missing = [(f[:60], x) for f in _findings(gemma_report)
               for x, dec, pct in measured_numbers(f) if not _in_tables(x, dec, pct, table)]
    assert not missing, missing


def test_the_number_check_can_fail():
    assert measured_numbers("a 12% share, 0.25 and layer 3") == [(12.0, 0, True),
                                                                  (0.25, 2, False)]
    assert not _in_tables(0.31, 2, False, [0.2, 0.5, 3.0])
    assert _in_tables(31.0, 0, True, [0.312])


def _heads(text: str) -> list[str]:
    a = [f"L{m[0]}H{m[1]}" for m in re.findall(r"\bL(\d+)H(\d+)\b", text)]
    b = [f"L{m[0]}H{m[1]}" for m in re.findall(r"layer (\d+) head (\d+)", text)]
    return a + b


def no_fact_twice(findings: list[str]) -> list[str]:
    """Problems: a head named in two findings (or twice in one), or two findings that say
    the same once their numbers are removed."""
    probs = []
    seen: dict[str, int] = {}
    for i, f in enumerate(findings):
        for h in _heads(f):
            if h in seen:
                probs.append(f"{h} named in findings {seen[h]} and {i}")
            seen[h] = i
    shapes = [re.sub(r"\d+(\.\d+)?", "#", f) for f in findings]
    for i in range(len(shapes)):
        for j in range(i + 1, len(shapes)):
            if shapes[i] == shapes[j]:
                probs.append(f"findings {i} and {j} state the same fact")
    return probs


def test_no_two_findings_state_the_same_fact(gemma_report):
    assert not no_fact_twice(_findings(gemma_report))


def test_the_duplicate_check_can_fail():
    assert no_fact_twice(["most focused head: layer 18 head 8",
                          "strongest position-0 head: L18H8 (87%)"])
    assert no_fact_twice(["Sink in layer 3 (40%).", "Sink in layer 4 (41%)."])


def test_random_gemma_report_sanity_bounded_and_layers(gemma_report):
    findings = _findings(gemma_report)
    # a random-weight model: the perplexity sanity finding says so, first
    assert "looks untrained" in findings[0] and "unigram" in findings[0]
    html = (gemma_report / "index.html").read_text(encoding="utf-8")
    assert "Sanity: is this a trained language model?" in html
    # local / global layers in the header and in every per-layer table
    assert "Layers 5, 11, 17 attend globally" in html
    for p in (gemma_report / "tables").glob("*.csv"):
        head = p.read_text(encoding="utf-8").splitlines()[0].split(",")
        if head[0] == "layer":
            assert head[1] == "attention", p.name
    # H*: one finding, the rule named, no advice where bounded
    hf = [f for f in findings if "H*" in f and "bounded" in f or "resolved" in f]
    assert len(hf) == 1, findings
    alloc = (gemma_report / "tables" / "head-allocation.csv").read_text(encoding="utf-8")
    if "True" in alloc:
        assert "—" in alloc and "docs/scale_pod.md" in hf[0] and "--n-docs" in hf[0]
    # heads: each named once with its roles; absence stated with its reference
    assert sum("Heads that stand out" in f for f in findings) == 1
    assert any("no induction head" in f and "planted" in f for f in findings)
    # routing: RMSNorm named (not LayerNorm), one offset convention, data-set scales
    assert "RMSNorm gain folded (Gemma" in html and "LayerNorm folded" not in html
    assert "i − j + 1" not in html and "Δ = j − i" in html
    # surgery on a rotary model: the curve ran, the cascade step explained
    assert "linearization-curve.csv" in {p.name for p in (gemma_report / "tables").iterdir()}
    assert "cannot be rebuilt" in html
    assert all(math.isfinite(float(x)) for x in re.findall(r"perplexity (\d+\.?\d*)",
                                                           findings[0]))


def test_linearization_curve_reuses_a_known_base_and_stops_once_collapsed(tmp_path):
    """``base_ppl`` replaces the k = 0 pass (the sanity check's perplexity on the same
    windows); ``stop_at`` ends the curve after two k in a row at or above it, keeping the k
    that ran, each equal to the full curve's."""
    from _tiny_hf import tiny_bridge

    from tl_spectral.interventions.surgery import tl_linearization_curve

    model = tiny_bridge("llama", tmp_path / "l", n_layers=4)
    toks = torch.randint(1, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    full = tl_linearization_curve(model, toks)
    assert full.ks == [0, 1, 2, 3, 4]
    reused = tl_linearization_curve(model, toks, base_ppl=full.base_ppl * 2)
    assert reused.base_ppl == full.base_ppl * 2  # taken as given: k = 0 did not run
    assert reused.ppl_zero_shot[1:] == pytest.approx(full.ppl_zero_shot[1:], rel=1e-6)
    # every k counts as collapsed at -100%: two k in a row after k = 0, then the stop
    cut = tl_linearization_curve(model, toks, stop_at=-1.0)
    assert cut.ks == [0, 1, 2] and "stopped before k = 3" in cut.note
    assert cut.ppl_zero_shot == pytest.approx(full.ppl_zero_shot[:3], rel=1e-6)
    # a threshold never reached: the whole curve
    assert tl_linearization_curve(model, toks, stop_at=1e9).ks == full.ks


def test_window_perplexity_is_the_cross_entropy_of_the_real_targets(tmp_path, monkeypatch):
    """``nll_sum`` (and the sanity check's ``window_perplexity`` on it) against a brute force:
    the cross-entropy of every real target from one full forward pass, whatever the rows per
    pass (a logit budget of one row forces one window at a time)."""
    import math

    import torch.nn.functional as F
    from _tiny_hf import tiny_bridge

    import tl_spectral.probes.damage as iv
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.sanity_section import window_perplexity

    model = tiny_bridge("llama", tmp_path / "l", n_layers=2)
    toks = torch.randint(1, 60, (3, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[2, 7:] = False  # right padding of the last window
    with torch.no_grad():
        logits = model(toks[:, :-1], return_type="logits").float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1),
                         reduction="none").reshape(3, 9)
    keep = mask[:, 1:]
    brute = math.exp(float(ce[keep].double().mean()))
    view = ModelView(model)
    assert window_perplexity(view, toks, mask) == pytest.approx(brute, rel=1e-5)
    monkeypatch.setattr(iv, "LOGIT_BUDGET", 1)  # one row a pass
    tot, cnt = iv.nll_sum(view, toks, mask)
    assert cnt == int(keep.sum()) and math.exp(tot / cnt) == pytest.approx(brute, rel=1e-5)
