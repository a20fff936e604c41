"""AttentionFieldProbe: lag fields against brute force, Reynolds split, padding, merging."""

from __future__ import annotations

import pytest
import torch
from conftest import make_native

from tl_spectral.model_view import ModelView
from tl_spectral.probes import run_probes
from tl_spectral.probes.fields import AttentionFieldProbe, AttentionFields
from tl_spectral.results import Result


def _head_mean_patterns(model, tokens, layer):
    v = ModelView(model)
    got = {}
    v.run(tokens, fwd_hooks=[(v.hook_pattern(layer), lambda t, hook: got.__setitem__("p", t.detach()))],
          return_type=None)
    return got["p"].mean(dim=1)  # [b, q, k]


@pytest.mark.parametrize("direction", ["causal", "bidirectional"])
def test_lag_fields_brute_force(direction):
    model = make_native(attention_dir=direction, seed=4, n_ctx=32)
    toks = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(0))
    res = run_probes(model, toks, [AttentionFieldProbe()], batch_size=2,
                     progress=False)["attention_fields"]
    assert isinstance(res, AttentionFields) and res.n_docs == 5
    causal = direction == "causal"
    A = _head_mean_patterns(model, toks, 1)
    F = res.fields["1"]
    lags = res.lags.tolist()
    assert lags == (list(range(12)) if causal else list(range(-11, 12)))
    for s in range(5):
        for i in range(12):
            for t_idx, tau in enumerate(lags):
                j = i - tau if causal else i + tau
                expect = float(A[s, i, j]) if 0 <= j < 12 else 0.0
                assert abs(float(F[s, i, t_idx]) - expect) < 1e-6
    # Reynolds split: fluctuations average to zero over the ensemble
    u = res.fluctuations(1)
    assert u.sum(0).abs().max() < 1e-5
    torch.testing.assert_close(res.mean["1"], F.mean(0), atol=1e-6, rtol=1e-6)


def test_padding_excluded_from_mean_and_fluctuations(native_ln):
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 50, (n,), generator=g) for n in (10, 6, 10)]
    res = run_probes(native_ln, docs, [AttentionFieldProbe(layers=[0])], batch_size=3,
                     progress=False)["attention_fields"]
    alone = run_probes(native_ln, [docs[1]], [AttentionFieldProbe(layers=[0])],
                       progress=False)["attention_fields"]
    # the short document's real part is identical alone and padded in the batch
    torch.testing.assert_close(res.fields["0"][1, :6, :6], alone.fields["0"][0, :6, :6])
    assert res.doc_mask[1].tolist() == [1] * 6 + [0] * 4
    # query 8 exists in two documents only: the mean there averages those two
    A = [run_probes(native_ln, [d], [AttentionFieldProbe(layers=[0])], progress=False)
         ["attention_fields"].fields["0"][0] for d in docs]
    torch.testing.assert_close(res.mean["0"][8, :9], (A[0][8, :9] + A[2][8, :9]) / 2)
    torch.testing.assert_close(res.mean["0"][3, :4], (A[0][3, :4] + A[1][3, :4] + A[2][3, :4]) / 3)
    # padded queries carry no fluctuation
    assert res.fluctuations(0)[1, 6:].abs().max() == 0


def test_trimmed_batches_and_merge(native_ln):
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(0, 50, (n,), generator=g) for n in (4, 5, 16, 9)]
    whole = AttentionFieldProbe(max_lag=7)
    r = run_probes(native_ln, docs, [whole], batch_size=2, progress=False)["attention_fields"]
    assert r.fields["2"].shape == (4, 16, 8)  # first batch (T=5) padded back to 16
    a = AttentionFieldProbe(max_lag=7)
    run_probes(native_ln, docs, [a], batch_size=1, progress=False)
    torch.testing.assert_close(a.result().mean["2"], r.mean["2"], atol=1e-6, rtol=1e-6)
    x, y = AttentionFieldProbe(max_lag=7), AttentionFieldProbe(max_lag=7)
    run_probes(native_ln, docs[:3], [x], batch_size=2, progress=False)
    run_probes(native_ln, docs[3:], [y], batch_size=2, progress=False)
    merged = x.merge(y).result()
    # shards padded to their own lengths (16 and 9) merge into the whole-corpus fields
    torch.testing.assert_close(merged.fields["2"], r.fields["2"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(merged.mean["2"], r.mean["2"], atol=1e-6, rtol=1e-6)


def test_save_load_and_scale_pod_errors(native_ln, tmp_path):
    toks = torch.randint(0, 50, (1, 16))
    r = run_probes(native_ln, toks, [AttentionFieldProbe(layers=[0, 1])],
                   progress=False)["attention_fields"]
    back = Result.load(r.save(tmp_path / "f.safetensors"))
    assert torch.equal(back.fields["1"], r.fields["1"]) and back.layers == [0, 1]
    with pytest.raises(ValueError, match="at least 2 documents"):
        r.scale_pod(n_heads=4)
    with pytest.raises(ValueError, match="max_lag"):
        run_probes(native_ln, toks, [AttentionFieldProbe(max_lag=40)], progress=False)


def test_scale_pod_from_probe(native_ln):
    toks = torch.randint(0, 50, (6, 32), generator=torch.Generator().manual_seed(3))
    r = run_probes(native_ln, toks, [AttentionFieldProbe()], batch_size=3,
                   progress=False)["attention_fields"]
    pod = r.scale_pod(n_heads=4, coherence_queries=4)
    assert pod.n_layers == 3
    assert sum(row["recommended"] for row in pod.allocation) == 12
    assert all(row["uniform"] == 4 and row["recommended"] >= 1 for row in pod.allocation)


@pytest.mark.parametrize("T", [2, 5, 130, 257])
@pytest.mark.parametrize("max_lag", [None, 1, "half"])
def test_causal_mean_lag_field_equals_the_general_path(T, max_lag):
    """The fast path of full causal windows (head mean in lag coordinates read from the
    pattern's lower triangle, block by block) equals lag_fields of the head mean, brute
    force, exactly where the blocks tile the queries and at every max_lag."""
    from tl_spectral.analysis.scale_pod import lag_fields
    from tl_spectral.probes.fields import _causal_mean_lag_field

    g = torch.Generator().manual_seed(T)
    scores = torch.randn(2, 3, T, T, generator=g)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    p = scores.softmax(-1)
    L = (T - 1) // 2 if max_lag == "half" else max_lag
    F, lags = _causal_mean_lag_field(p, L)
    want, want_lags = lag_fields(p.mean(1), causal=True, max_lag=L)
    assert lags.tolist() == want_lags.tolist()
    torch.testing.assert_close(F, want, rtol=1e-6, atol=1e-7)
