"""Gemma-3's natural experiment (tl_spectral_studies/gemma_window.py) on a tiny random Gemma3
with a window of 8 in three of four layers and windows of 21 tokens (> 8): every statistic
against a brute force from the Hugging Face model's own attention patterns (eager,
``output_attentions=True``), never through the probes. No real model."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_gemma3_tiny import WINDOW, boot, save_gemma3  # noqa: E402

from tl_spectral_studies import gemma_window as gw  # noqa: E402

N, T = 6, 21
LOCAL = [0, 2, 3]
GLOBAL = [1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(bridge, HF model, tokens, HF patterns [layer][window, head, T, T] float64)."""
    from transformers import AutoModelForCausalLM

    folder = save_gemma3(tmp_path_factory.mktemp("gemma3w"))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    toks = torch.randint(1, 64, (N, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        att = [a.double() for a in hf(toks, output_attentions=True).attentions]
    return boot(folder), hf, toks, att


@pytest.fixture(scope="module")
def measured(tiny):
    bridge, _, toks, _ = tiny
    return gw.measure(bridge, toks, decode=lambda t: f"t{t}")


@pytest.fixture(scope="module")
def probed(tiny):
    bridge, _, toks, _ = tiny
    return gw.probe_pass(bridge, toks)


def _brute_queries(p: torch.Tensor, W: int) -> dict[str, dict[str, torch.Tensor]]:
    """Per set A / B, statistic -> ``[window, head]`` means, by direct indexing per query."""
    n, H, T_, _ = p.shape
    out = {}
    for name, qs in (("A", range(1, min(W, T_))), ("B", range(W, T_))):
        acc = {k: torch.zeros(n, H, dtype=torch.float64) for k in gw.WINDOW_STATS}
        for d in range(n):
            for h in range(H):
                for i in qs:
                    row = p[d, h, i]
                    jf = max(0, i - W + 1)
                    j = int(torch.argmax(row))
                    lag = i - j
                    vals = {"n": 1.0, "alpha0": row[0], "first_visible": row[jf],
                            "edge4": sum(row[k] for k in range(jf, min(jf + 4, i + 1))),
                            "top_weight": row.max(), "top_is_first_visible": float(j == jf),
                            "top_is_0": float(j == 0), "top_is_self": float(j == i),
                            "top_is_previous": float(j == i - 1),
                            "top_rel_lag": lag / max(1, i - jf), "top_lag": float(lag),
                            "mass_beyond": sum(row[k] for k in range(0, i - W + 1))}
                    for k, v in vals.items():
                        acc[k][d, h] += float(v)
        out[name] = {k: v / acc["n"] for k, v in acc.items() if k != "n"}
    return out


def test_window_probe_equals_direct_indexing(tiny, probed):
    _, _, _, att = tiny
    win = probed["window"]
    assert win["split"] == WINDOW and win["windows"] == [8, None, 8, 8]
    for layer in range(4):
        brute = _brute_queries(att[layer], WINDOW)
        for part in ("A", "B"):
            S = win[part][layer]  # [window, head, K] sums
            for c, k in enumerate(gw.WINDOW_STATS):
                if k == "n":
                    continue
                got = S[..., c] / S[..., 0]
                torch.testing.assert_close(got, brute[part][k], atol=2e-5, rtol=1e-4,
                                           msg=f"layer {layer} {part} {k}")


def test_patterns_and_field_energy_are_exactly_zero_beyond_the_window(measured, tiny):
    _, _, _, att = tiny
    q, f = measured["queries"], measured["fields"]["per_layer"]
    for layer in range(4):
        i = torch.arange(T)
        far = (i[:, None] - i[None, :]) >= WINDOW
        if layer in LOCAL:
            assert float(att[layer][..., far].abs().max()) == 0.0  # the brute force agrees
            assert q["beyond_max"][layer] == 0.0
            for k in ("mean_beyond_share", "fluct_beyond_share"):
                assert f[layer][k]["estimate"] == 0.0
                assert f[layer][k]["low"] == 0.0 and f[layer][k]["high"] == 0.0
            assert q["B"]["mass_beyond"]["per_layer"]["estimate"][layer] == 0.0
            assert q["B"]["alpha0"]["per_layer"]["estimate"][layer] == 0.0
        else:
            assert q["beyond_max"][layer] == pytest.approx(float(att[layer][..., far].max()),
                                                           rel=1e-5)
            assert f[layer]["mean_beyond_share"]["estimate"] > 0


def test_field_energies_beyond_the_window_against_raw_patterns(measured, tiny):
    _, _, _, att = tiny
    i = torch.arange(T)
    far = (i[:, None] - i[None, :]) >= WINDOW
    for layer, row in enumerate(measured["fields"]["per_layer"]):
        A = att[layer].mean(1)  # head mean [window, T, T]
        m = A.mean(0)
        u = A - m
        want = {"mean_beyond_share": float((m[far] ** 2).sum() / (m ** 2).sum()),
                "fluct_beyond_share": float((u[:, far] ** 2).sum() / (u ** 2).sum()),
                "mean_energy": float((m ** 2).sum()),
                "fluct_energy": float((u ** 2).sum() / N)}
        for k, v in want.items():
            assert row[k]["estimate"] == pytest.approx(v, rel=1e-4, abs=1e-9), (layer, k)
        assert row["kind"] == ("local" if layer in LOCAL else "global")
    # the contrast is global − local of the layer estimates
    rows = measured["fields"]["per_layer"]
    c = measured["fields"]["global_minus_local"]["fluct_beyond_share"]["estimate"]
    loc = sum(rows[li]["fluct_beyond_share"]["estimate"] for li in LOCAL) / len(LOCAL)
    assert c == pytest.approx(rows[1]["fluct_beyond_share"]["estimate"] - loc)


def test_pod_statistics_equal_the_librarys(probed, measured):
    from tl_spectral.analysis.bootstrap import group_jackknife
    from tl_spectral.analysis.scale_pod import pod_statistics, scale_pod_grams

    fields = probed["fields"]
    for layer, row in enumerate(measured["fields"]["per_layer"]):
        u = fields.fluctuations(layer)
        want = pod_statistics(scale_pod_grams(u), epsilon=gw.EPSILON, fit_energies=(0.99,))
        assert row["H_star"]["estimate"] == want["H_star"]
        assert row["T_spec"]["estimate"] == pytest.approx(want["T_spec_99"], rel=1e-6)
        for b in ("fine", "medium", "coarse"):
            assert row[f"E_{b}"]["estimate"] == pytest.approx(want[f"E_{b}"], rel=1e-6)
    # the interval is the library's jackknife of that statistic (layer 1's H*)
    g = scale_pod_grams(fields.fluctuations(1))
    jk = group_jackknife(lambda idx: torch.tensor(
        pod_statistics(g, idx, epsilon=gw.EPSILON)["H_star"]), N,
        n_groups=gw.JACKKNIFE_GROUPS, seed=0)
    assert measured["fields"]["per_layer"][1]["H_star"]["low"] == pytest.approx(
        float(jk["low"]))


def test_band_grams_equal_scale_pod_grams():
    from tl_spectral.analysis.scale_pod import scale_pod_grams

    F = torch.randn(5, 12, 12, generator=torch.Generator().manual_seed(0))
    want = scale_pod_grams(F)
    got = gw.band_grams(F, gw.band_operators(12, 12))
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_sink_rate_per_window_against_raw_patterns(measured, tiny):
    _, _, _, att = tiny
    for layer in range(4):
        per = att[layer][..., 0].mean((1, 2))  # [window]: α_i0 over queries and heads
        iv = measured["sink_probe"]["sink_rate"]["per_layer"]
        assert iv["estimate"][layer] == pytest.approx(float(per.mean()), rel=1e-4)
    # local/global pools: the window means of the layer groups
    loc = torch.stack([att[li][..., 0].mean((1, 2)) for li in LOCAL], 1).mean(1)
    assert measured["sink_probe"]["sink_rate"]["local"]["estimate"] == pytest.approx(
        float(loc.mean()), rel=1e-4)


def test_key_token_mass_against_raw_patterns(measured, tiny):
    _, _, toks, att = tiny
    for part, qs in (("A", range(1, WINDOW)), ("B", range(WINDOW, T))):
        for row in measured["key_tokens"][part]:
            layer = row["layer"]
            w = WINDOW if layer in LOCAL else T
            mass, uni = {}, {}
            for d in range(N):
                for i in qs:
                    vis = [j for j in range(i + 1) if i - j < w]
                    for j in range(1, i + 1):
                        t = int(toks[d, j])
                        mass[t] = mass.get(t, 0.0) + float(att[layer][d, :, i, j].sum())
                        if j in vis:
                            uni[t] = uni.get(t, 0.0) + att[layer].shape[1] / len(vis)
            tot, utot = sum(mass.values()), sum(uni.values())
            best = sorted(mass, key=mass.get, reverse=True)[:5]
            assert [x["id"] for x in row["tokens"]][:2] == best[:2]
            for x in row["tokens"]:
                assert x["text"] == f"t{x['id']}"
                assert x["share"] == pytest.approx(mass[x["id"]] / tot, rel=1e-4)
                assert x["uniform_share"] == pytest.approx(uni.get(x["id"], 0) / utot,
                                                           rel=1e-6)


def test_group_difference_rules():
    # two global layers far above six local ones: the observed split is the extreme one
    x = torch.zeros(8, 4, dtype=torch.float64)
    x[[1, 4]] = 1.0
    x += 0.01 * torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    is_g = torch.tensor([False, True, False, False, True, False, False, False])
    r = gw.group_difference(x, is_g)
    assert r["difference"]["estimate"] == pytest.approx(float(x[is_g].mean() - x[~is_g].mean()))
    assert r["n_global"] == 8 and r["n_local"] == 24
    assert r["n_layer_splits"] == math.comb(8, 2)
    assert r["p_layers"] == pytest.approx(1 / 28)
    assert r["p_heads"] == pytest.approx(1 / (1 + gw.N_PERMUTATIONS))
    assert r["difference"]["low"] > 0.9
    lm = x.mean(1)
    obs = float(lm[is_g].mean() - lm[~is_g].mean())
    brute = sum(abs(float(lm[list(c)].mean() - lm[[i for i in range(8) if i not in c]].mean()))
                >= abs(obs) - 1e-12 for c in itertools.combinations(range(8), 2)) / 28
    assert r["p_layers"] == brute
    assert gw.verdict(r, {"difference": {"estimate": 0.0}}) == "differ"
    assert gw.verdict(r, {"difference": {"estimate": r["difference"]["estimate"]}}).startswith(
        "differ (as the untrained")
    same = gw.group_difference(torch.ones(8, 4, dtype=torch.float64), is_g)
    assert same["difference"]["estimate"] == 0.0 and same["p_layers"] == 1.0
    assert gw.verdict(same, same) == "not distinguishable"


def test_layer_permutation_enumerates_every_split():
    v = [0.0, 5.0, 1.0, 2.0, 6.0]
    r = gw.layer_permutation(v, [False, True, False, False, True])
    assert r["n_splits"] == 10 and r["difference"] == pytest.approx(5.5 - 1.0)
    ds = [abs(sum(v[i] for i in c) / 2 - sum(v[i] for i in range(5) if i not in c) / 3)
          for c in itertools.combinations(range(5), 2)]
    assert r["p"] == sum(d >= 4.5 - 1e-12 for d in ds) / 10 == 0.1
    with pytest.raises(ValueError, match="both global and local"):
        gw.layer_permutation(v, [False] * 5)


def test_routing_reads_each_layers_theta_and_window(tiny):
    bridge = tiny[0]
    r = gw.routing(bridge, n_ctx=T)
    assert r["kinds"] == ["local", "global", "local", "local"]
    assert r["rope_base"][0] == pytest.approx(1e4, rel=1e-6)
    assert r["rope_base"][1] == pytest.approx(1e6, rel=1e-6)
    assert r["offsets"] == [0, -1, -8, -7, -20]
    s = r["summary"]["rf_delta0"]
    assert s["trained"]["n_local"] == 12 and s["trained"]["n_global"] == 4
    per = torch.tensor(r["per_head"]["rf_delta0"])
    assert s["trained"]["global_mean"] == pytest.approx(float(per[1].mean()))
    assert s["verdict"] in ("differ", "not distinguishable",
                            "differ (as the untrained Gaussian kernels do)")
    assert r["rule"] == gw.RULE


def test_run_study_writes_resumable_files_and_tables(tiny, tmp_path):
    bridge, _, toks, _ = tiny
    logs: list[str] = []
    out = tmp_path / "gw"
    res = gw.run_study(out, None, loaded=(bridge, None), tokens=toks, windows=4,
                       twin_windows=4, command="cmd", log=logs.append)
    assert set(res["seconds"]) == {"routing", "probes", "twin"}
    for step in gw.STEPS:
        d = json.loads((out / f"{step}.json").read_text())
        assert d["command"] == "cmd" and d["config"]["step"] == step
    twin = json.loads((out / "twin.json").read_text())
    assert twin["twin"]["function"].endswith("random_copy") and twin["n_windows"] == 4
    logs.clear()
    gw.run_study(out, None, loaded=(bridge, None), tokens=toks, windows=4, twin_windows=4,
                 command="cmd", log=logs.append)
    assert all('"ran": false' in x for x in logs)  # resumed: nothing ran again
    blocks = gw.tables(out)
    assert blocks and all(k.startswith("real_decoder/gemma_window/") for k in blocks)
    assert "| layer |" in gw.markdown(out)
    with pytest.raises(ValueError, match="windows=2: the jackknife"):
        gw.run_study(out, None, loaded=(bridge, None), tokens=toks, windows=2)
