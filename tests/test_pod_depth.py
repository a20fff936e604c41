"""tl_spectral_studies.pod_depth: the sink column removed from the lag fields (against a brute
force on a tiny random Llama), depth fractions and thirds, the cut-off rule, the resampled
band traces and the claims' labels."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tl_spectral_studies import pod_depth as pdp
from tl_spectral_studies.depth import third_layers


# ------------------------------------------------------------------- depth and cut-offs
def test_depth_fraction_and_thirds():
    assert pdp.depth_fraction(0, 30) == 0.0 and pdp.depth_fraction(29, 30) == 1.0
    assert pdp.depth_fraction(0, 1) == 0.0
    with pytest.raises(ValueError, match="not one of the 6 layers"):
        pdp.depth_fraction(6, 6)
    # the paper's 6 layers: layers 1–2 early, 5–6 late (0-based 0–1, 4–5)
    assert pdp.third_layers(6) == {"early": [0, 1], "middle": [2, 3], "late": [4, 5]}
    t30 = pdp.third_layers(30)
    assert t30["early"] == list(range(10)) and t30["late"] == list(range(20, 30))
    t18 = pdp.third_layers(18)
    assert t18["early"] == list(range(6)) and t18["late"] == list(range(12, 18))
    # a boundary exactly at 1/3 (L = 4: layer 1 has l/(L-1) = 1/3) is "middle", not early
    assert pdp.third_of(1, 4) == "middle" and pdp.third_of(2, 7) == "middle"
    for L in range(1, 40):
        for li in range(L):
            f = pdp.depth_fraction(li, L)
            want = "early" if f < 1 / 3 - 1e-12 else "middle" if f < 2 / 3 - 1e-12 else "late"
            assert pdp.third_of(li, L) == want, (li, L)


def test_layer_weights_are_the_thirds_means_and_contrasts():
    w = pdp.layer_weights(6)
    x = torch.arange(6, dtype=torch.float64) ** 2
    assert float(w["early"] @ x) == pytest.approx((0 + 1) / 2)
    assert float(w["late"] @ x) == pytest.approx((16 + 25) / 2)
    assert float(w["late_minus_early"] @ x) == pytest.approx(20.5 - 0.5)
    assert float(w["last_minus_first"] @ x) == pytest.approx(25.0)


def test_cutoffs_in_tokens_keep_the_text_span():
    assert pdp.cutoffs_in_tokens(1.0) == (7.0, 20.0)
    lo, hi = pdp.cutoffs_in_tokens(4.0)
    assert (lo, hi) == (1.75, 5.0)
    with pytest.raises(ValueError, match="positive"):
        pdp.cutoffs_in_tokens(0.0)
    b = pdp.band_sets(4.0)
    assert b["paper"]["fine"][1] == 7.0 and b["text"]["coarse"][0] == 5.0
    assert b["text"]["medium"][:2] == (1.75, 5.0)


def test_chars_per_token_counts_decoded_characters():
    class Tok:
        def decode(self, ids):
            return "".join("ab"[:i] for i in ids)  # token i decodes to i characters

    w = torch.tensor([[9, 1, 2], [9, 2, 2]])
    assert pdp.chars_per_token(Tok(), w, skip_first=True) == pytest.approx(7 / 4)


# ----------------------------------------------------------------------- sink column
def _brute_lag(A: torch.Tensor) -> torch.Tensor:
    """Lag coordinates by loops: ``F[s, i, τ] = A[s, i, i − τ]`` (0 where τ > i)."""
    N, T, _ = A.shape
    F = torch.zeros(N, T, T, dtype=A.dtype)
    for i in range(T):
        for tau in range(i + 1):
            F[:, i, tau] = A[:, i, i - tau]
    return F


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from _tiny_hf import boot, char_tokenizer, save_tiny

    folder = tmp_path_factory.mktemp("tiny_llama")
    save_tiny("llama", folder, n_layers=3, n_ctx=64)
    return boot(folder), char_tokenizer()


def _patterns(model, toks):
    """Every layer's head-mean pattern ``[N, T, T]`` straight from hook_pattern."""
    from tl_spectral.model_view import ModelView

    view = ModelView(model)
    got = {}
    hooks = [(view.hook_pattern(li),
              (lambda li: lambda p, hook=None: got.__setitem__(li, p.detach().mean(1)))(li))
             for li in range(view.n_layers)]
    with torch.no_grad():
        view.run(toks, fwd_hooks=hooks)
    return [got[li].double() for li in range(view.n_layers)]


def test_sink_variants_match_a_brute_force_on_a_tiny_model(tiny):
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    model, _ = tiny
    toks = torch.randint(1, 40, (5, 12), generator=torch.Generator().manual_seed(0))
    fields = run_probes(model, toks, [AttentionFieldProbe()], batch_size=2,
                        progress=False)["attention_fields"]
    for li, A in enumerate(_patterns(model, toks)):
        F = fields.fields[str(li)].double()
        assert torch.allclose(F, _brute_lag(A), atol=1e-6)
        # with: the library's own fluctuations
        u = pdp.fluctuations(pdp.sink_variant(F, "with"))
        assert torch.allclose(u, fields.fluctuations(li).double(), atol=1e-6)
        # zeroed: the key-0 column of α set to 0, then lag coordinates
        Z = A.clone()
        Z[:, :, 0] = 0.0
        assert torch.allclose(pdp.sink_variant(F, "zeroed"), _brute_lag(Z), atol=1e-6)
        # renormalized: rows over keys j >= 1 rescaled to sum to 1; query 0 a zero row
        R = A.clone()
        R[:, :, 0] = 0.0
        R[:, 1:, :] /= R[:, 1:, :].sum(-1, keepdim=True)
        R[:, 0, :] = 0.0
        got = pdp.sink_variant(F, "renormalized")
        assert torch.allclose(got, _brute_lag(R), atol=1e-6)
        assert torch.allclose(got[:, 1:].sum(-1), torch.ones(5, 11, dtype=got.dtype),
                              atol=1e-6)
        # the column's energy share, by loops over (s, i)
        uc = pdp.fluctuations(F)
        col = sum(float(uc[s, i, i]) ** 2 for s in range(5) for i in range(12))
        assert pdp.column_share(uc) == pytest.approx(col / float((uc ** 2).sum()))
        assert pdp.column_share(pdp.fluctuations(pdp.sink_variant(F, "zeroed"))) == 0.0


def test_sink_variant_refuses_truncated_lags_and_unknown_names():
    with pytest.raises(ValueError, match="every lag"):
        pdp.sink_variant(torch.zeros(2, 8, 4), "zeroed")
    with pytest.raises(ValueError, match="use one of"):
        pdp.sink_variant(torch.zeros(2, 8, 8), "dropped")


# ------------------------------------------------------------------ resampled statistics
def test_band_traces_equal_the_centred_gram_of_each_resample():
    from tl_spectral.analysis.bootstrap import centred_gram_resample, resample_indices

    g = torch.Generator().manual_seed(1)
    X = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)
    grams = X @ X.transpose(1, 2)
    idx = resample_indices(7, 4, seed=3)
    counts = torch.zeros(4, 7, dtype=torch.float64).scatter_add_(
        1, idx, torch.ones_like(idx, dtype=torch.float64))
    got = pdp.band_traces(grams, counts)
    for r in range(4):
        for b in range(3):
            want = torch.trace(centred_gram_resample(grams[b], idx[r]))
            assert float(got[r, b]) == pytest.approx(float(want), rel=1e-10)


def test_analyse_on_the_tiny_model_agrees_with_the_library(tiny):
    from tl_spectral.analysis.scale_pod import pod_statistics, scale_pod_grams
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    model, _ = tiny
    toks = torch.randint(1, 40, (12, 16), generator=torch.Generator().manual_seed(2))
    fields = run_probes(model, toks, [AttentionFieldProbe()], batch_size=4,
                        progress=False)["attention_fields"]
    F = [fields.fields[str(li)] for li in fields.layers]
    res = pdp.analyse(F, chars_per_token=2.0, n_resamples=50, n_groups=4)
    assert res["cutoffs"]["text"] == [3.5, 10.0]
    for li in fields.layers:
        ref = pod_statistics(scale_pod_grams(fields.fluctuations(li)), fit_energies=(0.99,))
        hs, ts = (res["spectrum"]["layers"][0][li][k]["estimate"] for k in range(2))
        assert hs == ref["H_star"] and ts == pytest.approx(ref["T_spec_99"], rel=1e-6)
        fine, med, coarse, fmc = (x["estimate"] for x in res["bands"]["layers"][0][li][0])
        assert (fine, med, coarse) == pytest.approx(
            (ref["E_fine"], ref["E_medium"], ref["E_coarse"]), rel=1e-6)
        assert fmc == pytest.approx(fine - coarse)
        # the zeroed field's H* is the library's on the zeroed fluctuations
        u = pdp.fluctuations(pdp.sink_variant(fields.fields[str(li)], "zeroed"))
        refz = pod_statistics(scale_pod_grams(u), fit_energies=(0.99,))
        assert res["spectrum"]["layers"][1][li][0]["estimate"] == refz["H_star"]
        assert abs(sum(res["layers"][li]["with"]["E_a"]) - 1) < 1e-9
    # the late − early contrast is the difference of the thirds' means (3 layers: 0 | 1 | 2)
    d = res["spectrum"]
    assert d["late_minus_early"][0][0]["estimate"] == pytest.approx(
        d["layers"][0][2][0]["estimate"] - d["layers"][0][0][0]["estimate"])
    for iv in (d["late_minus_early"][1][0], res["bands"]["early"][2][1][3]):
        assert iv["low"] <= iv["estimate"] <= iv["high"]
    assert d["minus_with"][0][0][0]["estimate"] == 0.0


# ----------------------------------------------------------------------------- claims
def _res(early, late, hstar, n_docs=150):
    """A minimal result: per variant, the (estimate, low, high) of E fine − E coarse in the
    early and late thirds and of H* late − early."""
    def iv(x):
        return {"estimate": x[0], "low": x[1], "high": x[2]}

    per = {"early": early, "late": late,
           "late_minus_early": [(lt[0] - e[0], lt[1] - e[2], lt[2] - e[1])
                                for e, lt in zip(early, late)]}
    bands = {k: [[[None, None, None, iv(x)] for _ in pdp.CUT_SETS] for x in v]
             for k, v in per.items()}
    spec = {"layers": [[[iv((h[0], h[0], h[0]))] for _ in range(3)] for h in hstar],
            "late_minus_early": [[iv(h), iv((0.1, -0.1, 0.3))] for h in hstar]}
    return {"variants": list(pdp.VARIANTS), "cut_sets": list(pdp.CUT_SETS),
            "cutoffs": {"paper": [7, 20], "text": [1.5, 4.4]}, "bands": bands,
            "spectrum": spec, "n_docs": n_docs, "n_layers": 3, "thirds": third_layers(3)}


def test_claims_say_when_the_label_depends_on_the_sink_column():
    pos, neg = (0.1, 0.05, 0.15), (-0.1, -0.15, -0.05)
    res = _res([pos, pos, pos], [neg, neg, (0.0, -0.1, 0.1)],
               [(-10, -15, -5), (5, 1, 9), (-10, -15, -5)])
    c = {x["id"]: x for x in pdp.claims(res)}
    assert c["bands.paper"]["labels"] == {"with": "reproduced", "zeroed": "reproduced",
                                          "renormalized": "partly"}
    assert c["bands.paper"]["verdict"].startswith("depends on the sink column (reproduced")
    assert c["hstar"]["labels"]["with"] == "reproduced"
    assert c["hstar"]["labels"]["zeroed"] == "not reproduced" and c["hstar"]["sink_dependent"]
    assert c["tspec"]["verdict"] == "descriptive: no change distinguishable"
    assert not c["tspec"]["sink_dependent"]
    same = _res([pos] * 3, [neg] * 3, [(-10, -15, -5)] * 3)
    assert {x["id"]: x["verdict"] for x in pdp.claims(same)}["bands.text"] == "reproduced"


def test_claims_do_not_test_hstar_at_the_bound():
    res = _res([(0.1, 0.05, 0.15)] * 3, [(-0.1, -0.2, -0.05)] * 3,
               [(149, 149, 149), (-10, -15, -5), (-10, -15, -5)])
    c = {x["id"]: x for x in pdp.claims(res)}
    assert c["hstar"]["labels"]["with"] == "not tested"


def test_hstar_bound_is_the_librarys_over_the_two_thirds():
    """The one rule (h_star_bounded: H* ≥ h_star_bound(N)), read over the early and late
    thirds only: at N = 150 the bound is 86, so 86 is not tested and 85 is; a bounded
    middle layer does not stop the comparison."""
    from tl_spectral.analysis.scale_pod import h_star_bound

    bound = h_star_bound(150)
    assert bound == 86

    def label(early, middle, late):
        res = _res([(0.1, 0.05, 0.15)] * 3, [(-0.1, -0.2, -0.05)] * 3,
                   [(-10, -15, -5)] * 3)
        for vi in range(3):
            for li, h in enumerate((early, middle, late)):
                res["spectrum"]["layers"][vi][li][0]["estimate"] = float(h)
        c = {x["id"]: x for x in pdp.claims(res)}["hstar"]
        return c["labels"]["with"], c["note"]

    assert label(bound, 50, 50)[0] == "not tested"
    assert label(50, 50, bound)[0] == "not tested"
    lab, note = label(bound - 1, 149, 50)
    assert lab == "reproduced" and "H* ≥ 86 at N = 150" in note


def test_run_model_writes_its_json_atomically(tiny, tmp_path):
    model, tok = tiny
    data = tmp_path / "data"
    data.mkdir()
    (data / "wiki_excerpt.txt").write_text("the quick brown fox jumps over a lazy dog. " * 80,
                                           encoding="utf-8")
    cfg = {"corpus": "wiki_excerpt.txt", "start": "<pad>", "n_docs": 6, "length": 16,
           "window_seed": 0, "batch_size": 3}
    res = pdp.run_model("tiny", tmp_path / "out", data, overrides=cfg, loaded=(model, tok))
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["pod_depth_tiny.json"]
    d = json.loads((tmp_path / "out" / files[0]).read_text())
    assert d["chars_per_token"] == 1.0 and d["n_docs"] == 6 and len(d["layers"]) == 3
    assert {x["id"] for x in d["claims"]} == {"bands.paper", "shift.paper", "bands.text",
                                              "shift.text", "hstar", "tspec"}
    assert math.isclose(res["layers"][0]["depth"], 0.0)
