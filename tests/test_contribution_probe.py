"""ContributionProbe against brute force (every ṽ_j materialized in d_model), T <= 32."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from tl_spectral.analysis.contributions import MEASURES, contribution_weights
from tl_spectral.model_view import ModelView
from tl_spectral.probes import run_probes
from tl_spectral.probes.contributions import (
    ContributionProbe,
    ContributionStats,
    _lag_sums,
    contribution_map,
    layer_maps,
)
from tl_spectral.results import Result


# ----------------------------------------------------------------------------- brute force
def brute_maps(pattern, v, W_O, mode):
    """All four measures per head, by explicit d_model vectors, float64, one unpadded doc.

    pattern: [1, H, T, T]; v: [1, T, H|kv, d]; returns dict of [H, T, T]."""
    H = pattern.shape[1]
    v = v.repeat_interleave(H // v.shape[2], dim=2)
    vt = torch.einsum("bkhd,hdm->bhkm", v.double(), W_O.double())[0]  # ṽ_j^h [H, k, m]
    a = pattern.double()[0]  # [H, q, k]
    pairs = a[..., None] * vt[:, None]  # [H, q, k, m]
    oh = pairs.sum(2)  # [H, q, m]
    ref = oh if mode == "intra" else oh.sum(0, keepdim=True)
    n2 = (ref * ref).sum(-1)  # [H|1, q]
    c = (pairs * ref[:, :, None]).sum(-1) / n2[..., None]
    vn = vt.norm(dim=-1)[:, None, :]  # [H, 1, k]
    return {
        "attention": a,
        "value_weighted": a * vn,
        "output_normalized": a * vn / n2.sqrt()[..., None],
        "contribution": c,
    }


def capture_doc(model, tokens, layer):
    got = {}

    def grab(k):
        def hook(t, hook=None):
            got[k] = t.detach().clone()
            return t

        return hook

    with torch.no_grad():
        ModelView(model).run(tokens, return_type=None, fwd_hooks=[
            (f"blocks.{layer}.attn.hook_pattern", grab("p")), (f"blocks.{layer}.attn.hook_v", grab("v"))])
    return got["p"], got["v"]


def brute_stats(model, docs, layer, mode, T_batch, rank_queries, negative_rtol=1e-6):
    """Corpus statistics from per-document (unpadded) brute-force maps; rank queries at
    ``round(linspace(2, L − 1, min(n, L − 2)))`` of each document's own length ``L``."""
    view = ModelView(model)
    H, causal = view.n_heads, view.causal
    W_O = view.weights(layer).W_O
    T = T_batch
    src = torch.zeros(H + 1, T, dtype=torch.float64)
    src_n = torch.zeros(T, dtype=torch.float64)
    lag = {}
    neg_n = torch.zeros(H + 1, dtype=torch.float64)
    neg_n0 = torch.zeros(H + 1, dtype=torch.float64)
    neg = torch.zeros(H + 1, dtype=torch.float64)
    absum = torch.zeros(H + 1, dtype=torch.float64)
    pairs = 0
    M = len(MEASURES)
    rho = torch.zeros(H + 1, M, M, dtype=torch.float64)
    rows = torch.zeros(H + 1, dtype=torch.float64)
    for doc in docs:
        p, v = capture_doc(model, doc[None], layer)
        maps = brute_maps(p, v, W_O, mode)
        c = maps["contribution"]
        cc = torch.cat([c, c.sum(0, keepdim=True)])  # [H+1, q, k]
        L = doc.numel()
        tau = negative_rtol * cc.abs().sum(-1)  # [H+1, q]
        for i in range(L):
            for j in range(L):
                if causal and j > i:
                    continue
                src[:, j] += cc[:, i, j]
                src_n[j] += 1
                key = i - j
                s, k = lag.get(key, (torch.zeros(H + 1, dtype=torch.float64), 0))
                lag[key] = (s + cc[:, i, j], k + 1)
                neg_n += (cc[:, i, j] < -tau[:, i]).double()
                neg_n0 += (cc[:, i, j] < 0).double()
                neg += cc[:, i, j].clamp(max=0).abs()
                absum += cc[:, i, j].abs()
                pairs += 1
        tok = {m: torch.cat([maps[m], maps[m].sum(0, keepdim=True)]) for m in MEASURES}
        n = min(rank_queries, L - 2)
        qidx = torch.linspace(2, L - 1, n).round().long().unique().tolist() if n > 0 else []
        for i in qidx:
            keys = list(range(i + 1)) if causal else list(range(L))
            if len(keys) < 3:
                continue
            for h in range(H + 1):
                rows[h] += 1
                for a in range(M):
                    for b in range(M):
                        r = spearmanr(tok[MEASURES[a]][h, i, keys].numpy(),
                                      tok[MEASURES[b]][h, i, keys].numpy()).statistic
                        rho[h, a, b] += r
    return dict(src=src / src_n.clamp_min(1), src_n=src_n, lag=lag, neg_frac=neg_n / pairs,
                neg_frac0=neg_n0 / pairs,
                neg_mass=neg / absum, rho=rho / rows.clamp_min(1)[:, None, None])


# ----------------------------------------------------------------------------- maths
@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    H=st.sampled_from([2, 4]),
    kv=st.sampled_from([1, 2]),
    T=st.integers(1, 12),
    mode=st.sampled_from(["intra", "inter"]),
    causal=st.booleans(),
    pad=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_contribution_map_equals_contribution_weights_and_sums_to_one(b, H, kv, T, mode, causal,
                                                                       pad, seed):
    g = torch.Generator().manual_seed(seed)
    d, dm = 4, 8
    scores = torch.randn(b, H, T, T, generator=g, dtype=torch.float64)
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    qm = torch.ones(b, T, dtype=torch.bool)
    if pad and T > 1:
        qm[-1, T // 2 + 1 :] = False
        scores = scores.masked_fill(~qm[:, None, None, :], float("-inf"))
    pattern = torch.softmax(scores, -1)
    v = torch.randn(b, T, kv, d, generator=g, dtype=torch.float64)
    W_O = torch.randn(H, d, dm, generator=g, dtype=torch.float64)
    ref = contribution_weights(pattern, v, W_O, mode, qm)
    vh = v.repeat_interleave(H // kv, dim=2).permute(0, 2, 1, 3)
    p = pattern.masked_fill(~qm[:, None, :, None], 0.0)
    c = contribution_map(p, vh, W_O, mode, qm)
    torch.testing.assert_close(c, ref.contribution, atol=1e-12, rtol=1e-10)
    valid = ref.valid  # [b, H|1, q]
    if mode == "inter":
        rows = c.sum((1, 3))
        torch.testing.assert_close(rows[valid[:, 0]], torch.ones_like(rows[valid[:, 0]]))
    else:
        rows = c.sum(-1)
        torch.testing.assert_close(rows[valid], torch.ones_like(rows[valid]))
    # brute force, one document at a time
    for bi in range(b):
        L = int(qm[bi].sum())
        bm = brute_maps(pattern[bi : bi + 1, :, :L, :L], v[bi : bi + 1, :L], W_O, mode)
        torch.testing.assert_close(c[bi, :, :L, :L], bm["contribution"], atol=1e-9, rtol=1e-7)


def test_lag_sums_brute_force():
    m = torch.randn(3, 7, 7, dtype=torch.float64)
    pos, neg = _lag_sums(m)
    for lag in range(7):
        torch.testing.assert_close(pos[:, lag], torch.diagonal(m, -lag, dim1=-2, dim2=-1).sum(-1))
        if lag:
            torch.testing.assert_close(neg[:, lag], torch.diagonal(m, lag, dim1=-2, dim2=-1).sum(-1))
    assert torch.all(neg[:, 0] == 0)


# ----------------------------------------------------------------------------- probe
def _docs(lengths, seed, vocab=50):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize(
    "kind,mode",
    [("ln", "inter"), ("noln", "intra"), ("gqa", "inter"), ("encoder", "inter"), ("encoder", "intra")],
)
def test_probe_statistics_match_brute_force(kind, mode):
    kw = {"ln": {}, "noln": {"normalization_type": None}, "gqa": {"n_key_value_heads": 2},
          "encoder": {"attention_dir": "bidirectional"}}[kind]
    model = make_native(n_layers=2, n_heads=4, seed=11, **kw)
    docs = _docs([14, 10, 7], seed=1)  # right padded inside one batch
    probe = ContributionProbe(mode=mode, rank_queries=5, rank_per_head=True, rank_stride=1)
    res = run_probes(model, docs, [probe], batch_size=3, progress=False)["contributions"]
    layer = 1
    ref = brute_stats(model, docs, layer, mode, T_batch=14, rank_queries=5)
    li = res.layers.index(layer)
    torch.testing.assert_close(res.source_mean[li].double(), ref["src"].float().double(), atol=1e-5,
                               rtol=1e-4)
    torch.testing.assert_close(res.source_count[li].double(), ref["src_n"])
    for lag, (s, k) in ref["lag"].items():
        pos = int((res.lags == lag).nonzero())
        assert float(res.lag_count[li, pos]) == k
        torch.testing.assert_close(res.lag_mean[li, :, pos].double(), s / k, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(res.negative_fraction[li].double(), ref["neg_frac"], atol=1e-6, rtol=0)
    torch.testing.assert_close(res.negative_fraction_raw[li].double(), ref["neg_frac0"], atol=1e-6,
                               rtol=0)
    assert res.negative_rtol == 1e-6
    torch.testing.assert_close(res.negative_mass[li].double(), ref["neg_mass"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(res.rank_corr[li].double(), ref["rho"], atol=1e-5, rtol=1e-5)
    if kind == "encoder":
        assert int(res.lags.min()) == -13
    else:
        assert int(res.lags.min()) == 0


def test_probe_sum_identity_and_attention_means(native_ln):
    docs = _docs([16, 16, 9], seed=2)
    res = run_probes(native_ln, docs, [ContributionProbe()], batch_size=2,
                     progress=False)["contributions"]
    n_queries = sum(d.numel() for d in docs)
    for li in range(len(res.layers)):
        # Σ_j Σ_i C_ij = number of real queries (inter rows sum to 1)
        total = float((res.source_mean[li, -1] * res.source_count[li]).sum())
        assert total == pytest.approx(n_queries, rel=1e-5)
        # attention rows sum to 1 per head
        att = (res.source_attention[li] * res.source_count[li]).sum(-1)
        torch.testing.assert_close(att, torch.full_like(att, float(n_queries)), rtol=1e-5, atol=1e-3)
        # lag means cover the same pairs
        assert float(res.lag_count[li].sum()) == float(res.source_count[li].sum())


def test_probe_kept_maps_and_merge(native_gqa, tmp_path):
    docs = _docs([12, 12, 12, 12], seed=3)
    tokens = torch.stack(docs)
    # rank_stride=1: shards run apart number their documents from 0 (a distributed run
    # keeps global indices), so strided selection would differ between the two runs
    full = ContributionProbe(keep_docs=[2], rank_stride=1)
    run_probes(native_gqa, tokens, [full], batch_size=2, progress=False)
    a = ContributionProbe(keep_docs=[2], rank_stride=1)
    b = ContributionProbe(keep_docs=[2], rank_stride=1)
    run_probes(native_gqa, tokens[:2], [a], batch_size=2, progress=False)
    run_probes(native_gqa, tokens[2:], [b], batch_size=2, progress=False)
    # shard b saw document 2 as its index 0: kept maps follow the shard's own indices
    assert b.state.get("kept_docs") is None
    merged = a.merge(b).result()
    ref = full.result()
    for field in ("source_mean", "lag_mean", "negative_fraction", "negative_mass", "rank_corr"):
        torch.testing.assert_close(getattr(merged, field), getattr(ref, field), atol=1e-5, rtol=1e-5)
    # kept maps equal contribution_weights on that document
    assert ref.kept_docs.tolist() == [2]
    for layer in ref.layers:
        p, v = capture_doc(native_gqa, tokens[2:3], layer)
        cw = contribution_weights(p, v, ModelView(native_gqa).weights(layer).W_O, "inter")
        mp = ref.maps(layer, 0)
        for name in MEASURES:
            torch.testing.assert_close(getattr(mp, name), getattr(cw, name), atol=1e-6, rtol=1e-5)
    back = Result.load(ref.save(tmp_path / "c.safetensors"))
    assert isinstance(back, ContributionStats)
    torch.testing.assert_close(back.kept_maps["0.contribution"], ref.kept_maps["0.contribution"])
    import matplotlib.pyplot as plt

    for fig in (ref.plot_source(), ref.plot_lag(), ref.plot_rank_corr(), ref.plot_negative()):
        plt.close(fig)
    assert len(ref.to_rows()) == len(ref.layers)


def test_probe_on_minilm_matches_brute_force(minilm):
    # real encoder, padded batch; brute force on the unpadded documents
    docs = [torch.tensor([101, 2023, 2003, 1037, 3231, 1997, 1996, 102]),
            torch.tensor([101, 7592, 2088, 102])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_probes(minilm, docs, [ContributionProbe(layers=[4], rank_queries=4, rank_stride=1)],
                         batch_size=2, progress=False)["contributions"]
        ref = brute_stats(minilm, docs, 4, "inter", T_batch=8, rank_queries=4)
    torch.testing.assert_close(res.source_mean[0].double(), ref["src"], atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(res.negative_fraction[0].double(), ref["neg_frac"], atol=1e-6, rtol=0)
    torch.testing.assert_close(res.rank_corr[0, -1].double(), ref["rho"][-1], atol=1e-5, rtol=0)


def test_layer_maps_and_registry(native_ln):
    tokens = torch.randint(0, 50, (2, 9))
    maps = layer_maps(native_ln, tokens, layers=[0, 2])
    assert sorted(maps) == [0, 2]
    p, v = capture_doc(native_ln, tokens, 2)
    ref = contribution_weights(p, v, ModelView(native_ln).weights(2).W_O)
    torch.testing.assert_close(maps[2].contribution, ref.contribution)


def test_probe_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        ContributionProbe(mode="cross")
    with pytest.raises(ValueError, match="rank_queries"):
        ContributionProbe(rank_queries=-1)
    with pytest.raises(ValueError, match="rank_stride"):
        ContributionProbe(rank_stride=0)
    with pytest.raises(ValueError, match="chunk_docs"):
        ContributionProbe(chunk_docs=0)
    with pytest.raises(RuntimeError, match="no data"):
        ContributionProbe().result()


def test_report_section_and_signed_view(native_ln, tmp_path):
    from tl_spectral.viz.contribution_plots import contribution_view
    from tl_spectral.viz.contribution_section import ContributionSection
    from tl_spectral.viz.sections import SECTIONS, ReportContext, build_report

    assert ContributionSection in SECTIONS

    class Tok:
        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)

    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(9))
    ctx = ReportContext(view=ModelView(native_ln), tokens=tokens, tokenizer=Tok(),
                        out_dir=tmp_path / "r", results_dir=tmp_path / "r" / "results",
                        options={"faithfulness_docs": 1})
    index = build_report(ctx, sections=[ContributionSection()], progress=False)
    html = index.read_text()
    assert "Contribution weights and attention sinks" in html and "faithfulness" in html
    assert list((tmp_path / "r" / "views").glob("contributions-*.html"))
    maps = layer_maps(native_ln, tokens[:1], layers=[1])[1]
    view = contribution_view(maps, [str(i) for i in range(12)], clip_quantile=0.9)
    assert "red" in view.local_src and "blue" in view.local_src
    with pytest.raises(ValueError, match="clip_quantile"):
        contribution_view(maps, [str(i) for i in range(12)], clip_quantile=0)


# ----------------------------------------------------------------------------- batching (#15.5)
_RAGGED_MODEL: dict = {}


def _ragged_model():
    if "m" not in _RAGGED_MODEL:
        _RAGGED_MODEL["m"] = make_native(n_layers=2, n_heads=4, seed=5)
    return _RAGGED_MODEL["m"]


def _assert_same_stats(a, b, atol=1e-6):
    for f in ("rank_corr", "rank_rows", "negative_fraction", "negative_fraction_raw",
              "negative_mass", "source_mean", "source_count", "lag_mean", "lag_count"):
        torch.testing.assert_close(getattr(a, f), getattr(b, f), atol=atol, rtol=1e-5, msg=f)


def test_rank_query_positions_follow_each_document():
    from tl_spectral.probes.contributions import rank_query_positions

    qidx, ok = rank_query_positions([40, 5, 2, 3, 256], 8)
    rows = [qidx[i][ok[i]].tolist() for i in range(5)]
    assert rows[0] == torch.linspace(2, 39, 8).round().long().tolist()
    assert rows[1] == [2, 3, 4]  # min(8, L − 2) = 3 queries over 2 … 4
    assert rows[2] == [] and rows[3] == [2]
    assert rows[4] == torch.linspace(2, 255, 8).round().long().tolist()
    assert all(max(r, default=0) < L for r, L in zip(rows, [40, 5, 2, 3, 256]))


def test_rank_statistics_do_not_depend_on_batch_size():
    # a 40-token document is sampled at the same 8 queries alone and inside a batch padded
    # further; before, batch 11 sampled every document on the batch's padded length
    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(0, 50, (n,), generator=g) for n in (40, 5, 23, 3, 17, 31, 2, 12, 28, 9, 36)]
    res = [
        run_probes(_ragged_model(), docs, [ContributionProbe(rank_stride=1, rank_per_head=True)],
                   batch_size=bs, progress=False)["contributions"]
        for bs in (1, 11)
    ]
    _assert_same_stats(*res)
    assert float(res[0].rank_rows[0, -1]) == sum(min(8, n - 2) for n in
                                                 (40, 5, 23, 3, 17, 31, 12, 28, 9, 36))


@settings(max_examples=6, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=2, max_size=7),
       bs=st.integers(1, 7), rank_queries=st.integers(1, 9), seed=st.integers(0, 100))
def test_rank_statistics_batch_invariance_property(lengths, bs, rank_queries, seed):
    docs = _docs(lengths, seed)

    def run(b):
        probe = ContributionProbe(rank_queries=rank_queries, rank_stride=2)
        return run_probes(_ragged_model(), docs, [probe], batch_size=b,
                          progress=False)["contributions"]

    _assert_same_stats(run(1), run(bs))


# ----------------------------------------------------------------------------- negatives (#15.6)
@settings(max_examples=40, deadline=None)
@given(q=st.integers(1, 5), k=st.integers(1, 9), seed=st.integers(0, 10_000),
       rtol=st.sampled_from([1e-6, 1e-4]))
def test_row_negatives_skip_round_off(q, k, seed, rtol):
    from tl_spectral.probes.contributions import _row_negatives

    g = torch.Generator().manual_seed(seed)
    c = torch.randn(2, 3, q, k, generator=g, dtype=torch.float64)
    c = c.sign() * (c.abs() + 0.05)  # ordinary entries stay well above any τ
    tiny = torch.rand(2, 3, q, k, generator=g, dtype=torch.float64) < 0.4
    tiny[..., 0] = False  # every row keeps one entry of ordinary size
    mass = c.abs().masked_fill(tiny, 0).sum(-1, keepdim=True)
    # round-off-sized entries: |c| ≤ rtol/10 of the row's mass (either sign)
    c = torch.where(tiny, c.sign() * mass * rtol * 0.1 * torch.rand(c.shape, generator=g,
                                                                     dtype=torch.float64), c)
    strict, anyneg = _row_negatives(c, rtol)
    tau = rtol * c.abs().sum(-1, keepdim=True)
    assert strict.tolist() == (c < -tau).sum((0, 2, 3)).double().tolist()
    assert anyneg.tolist() == (c < 0).sum((0, 2, 3)).double().tolist()
    assert strict.tolist() == ((c < 0) & ~tiny).sum((0, 2, 3)).double().tolist()


def test_negative_fraction_threshold_is_relative_to_the_row(native_ln):
    docs = _docs([14, 9, 11], seed=4)
    strict = run_probes(native_ln, docs, [ContributionProbe(rank_queries=0)], batch_size=3,
                        progress=False)["contributions"]
    loose = run_probes(native_ln, docs, [ContributionProbe(rank_queries=0, negative_rtol=0.0)],
                       batch_size=3, progress=False)["contributions"]
    big = run_probes(native_ln, docs, [ContributionProbe(rank_queries=0, negative_rtol=0.05)],
                     batch_size=3, progress=False)["contributions"]
    assert strict.negative_rtol == 1e-6 and loose.negative_rtol == 0.0
    torch.testing.assert_close(loose.negative_fraction, loose.negative_fraction_raw)
    torch.testing.assert_close(strict.negative_fraction_raw, loose.negative_fraction_raw)
    assert bool((big.negative_fraction <= strict.negative_fraction).all())
    assert bool((strict.negative_fraction <= strict.negative_fraction_raw).all())
    assert bool((big.negative_fraction < big.negative_fraction_raw).any())
    # by hand at token level from the maps, with τ_i = 0.05 Σ_j |C_ij|
    maps = layer_maps(native_ln, torch.nn.utils.rnn.pad_sequence(docs, batch_first=True),
                      attention_mask=torch.nn.utils.rnn.pad_sequence(
                          [torch.ones_like(d) for d in docs], batch_first=True))
    for li, layer in enumerate(big.layers):
        C = maps[layer].token.double()
        tau = 0.05 * C.abs().sum(-1, keepdim=True)
        pairs = float(big.source_count[li].sum())
        want = float((C < -tau).sum()) / pairs
        assert float(big.negative_fraction[li, -1]) == pytest.approx(want, abs=2.5 / pairs)
    row = strict.to_rows()[0]
    assert "neg_pair_share_tau0" in row
    with pytest.raises(ValueError, match="negative_rtol"):
        ContributionProbe(negative_rtol=-1)


def test_old_result_files_load_with_tau_zero(native_ln, tmp_path):
    # files written before negative_fraction_raw existed hold the τ = 0 share
    res = run_probes(native_ln, _docs([8, 6], seed=5), [ContributionProbe(rank_queries=2)],
                     batch_size=2, progress=False)["contributions"]
    res.negative_fraction_raw = None
    res.negative_rtol = 0.0
    back = Result.load(res.save(tmp_path / "old"))
    assert back.negative_fraction_raw is None and back.negative_rtol == 0.0
    assert "neg_pair_share_tau0" not in back.to_rows()[0]
