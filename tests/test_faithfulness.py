"""Faithfulness interventions through TransformerLens hooks (SPEC C.3), against brute force.

The brute-force side materializes every projected value ``ṽ_j = v_j W_O`` in d_model and
runs one unbatched forward pass per condition with masks from
``analysis.faithfulness.removal_mask``.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.contributions import contribution_weights
from tl_spectral.analysis.faithfulness import allowed_mask, removal_counts, removal_mask
from tl_spectral.model_view import ModelView
from tl_spectral.probes.faithfulness import (
    FaithfulnessResult,
    faithfulness,
    intervention_strategy,
    recompute_pattern,
    removal_hooks,
    removal_ranks,
)
from tl_spectral.results import Result


# ----------------------------------------------------------------------------- helpers
def capture(model, tokens, attention_mask=None, layers=None):
    """Clean pass: per layer (pattern, v repeated to heads, o = hook on attn.o.hook_out)."""
    view = ModelView(model)
    layers = range(view.n_layers) if layers is None else layers
    caps: dict = {}

    def grab(key):
        def hook(t, hook=None):
            caps[key] = t.detach().clone()
            return t

        return hook

    hooks = []
    for l in layers:
        hooks += [(f"blocks.{l}.attn.hook_pattern", grab((l, "p"))),
                  (f"blocks.{l}.attn.hook_v", grab((l, "v"))),
                  (f"blocks.{l}.attn.o.hook_out", grab((l, "o")))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = view.run(tokens, attention_mask=attention_mask, fwd_hooks=hooks)
    return {l: (caps[(l, "p")], view.repeat_kv(caps[(l, "v")], 2), caps[(l, "o")]) for l in layers}, out


def brute_removed_share(pattern, v, W_O, mask):
    """Σ_{j removed} α_ij ṽ_j through explicit d_model vectors. [b, q, d_model]."""
    vt = torch.einsum("bkhd,hdm->bhkm", v.double(), W_O.double())  # ṽ_j^h
    pairs = pattern.double()[..., None] * vt[:, :, None]  # [b, H, q, k, m]
    return (pairs * mask[..., None]).sum((1, 3))


def nll_sums(logits, tokens, mask):
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    ok = mask[:, 1:] & mask[:, :-1]
    return float((nll * ok).sum()), float(ok.sum())


# ----------------------------------------------------------------------------- strategy
def test_strategy_native_edits_pattern(native_ln, native_gqa):
    assert intervention_strategy(native_ln) == "pattern"
    assert intervention_strategy(native_gqa) == "pattern"


def test_strategy_minilm_discards_pattern_edits_uses_z(minilm):
    # the bridge delegates to HF and fires hook_pattern after the fact: edits are discarded
    view = ModelView(minilm)
    tokens = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    got = {}

    def zero(t, hook=None):
        return t * 0.0

    def grab(t, hook=None):
        got["z"] = t.detach().clone()
        return t

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        view.run(tokens, fwd_hooks=[("blocks.0.attn.hook_z", grab)], return_type=None)
        clean = got["z"]
        view.run(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", zero),
                                    ("blocks.0.attn.hook_z", grab)], return_type=None)
    assert torch.equal(clean, got["z"])  # the pattern edit did nothing
    assert intervention_strategy(minilm) == "z"


def test_recompute_pattern_matches_hook_pattern(minilm):
    # bidirectional with key padding: α = softmax(q kᵀ/√d) reproduces HF's pattern
    view = ModelView(minilm)
    tokens = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 102, 0, 0, 0]])
    am = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])
    got = {}

    def grab(k):
        def hook(t, hook=None):
            got[k] = t.detach()
            return t

        return hook

    with torch.no_grad():
        view.run(tokens, attention_mask=am, return_type=None, fwd_hooks=[
            (f"blocks.2.attn.hook_{k}", grab(k)) for k in ("q", "k", "pattern")])
    p = recompute_pattern(got["q"], got["k"], scale=math.sqrt(view.d_head), causal=False,
                          key_mask=am.bool())
    real = am.bool()[:, None, :, None]
    torch.testing.assert_close(p * real, got["pattern"] * real, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- hooks
def _random_mask(shape, seed, allowed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < 0.4) & allowed


@pytest.mark.parametrize("strategy", ["pattern", "z"])
@pytest.mark.parametrize("which", ["ln", "gqa", "encoder"])
def test_removal_hook_equals_brute_force(which, strategy):
    """o' − o at the intervened layer equals −Σ_{removed} α_ij ṽ_j (explicit d_model)."""
    if which == "ln":
        model = make_native(n_layers=2, seed=3)
    elif which == "gqa":
        model = make_native(n_layers=2, n_heads=4, n_key_value_heads=2, seed=4)
    else:
        model = make_native(n_layers=2, seed=5, attention_dir="bidirectional")
    view = ModelView(model)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (2, 12), generator=g)
    am = None
    key_mask = torch.ones(2, 12, dtype=torch.bool)
    if which == "encoder":
        key_mask[1, 9:] = False
        am = key_mask.long()
    caps, _ = capture(model, tokens, am, layers=[1])
    pattern, v, o = caps[1]
    allowed = allowed_mask(12, causal=view.causal, key_mask=key_mask, query_mask=key_mask)
    mask = _random_mask((2, 4, 12, 12), 1, allowed)
    got = {}

    def grab(t, hook=None):
        got["o"] = t.detach().clone()
        return t

    hooks = removal_hooks(view, {1: mask}, key_mask=key_mask, strategy=strategy)
    with torch.no_grad():
        view.run(tokens, attention_mask=am, fwd_hooks=hooks + [("blocks.1.attn.o.hook_out", grab)],
                 return_type=None)
    W_O = view.weights(1).W_O
    expect = o.double() - brute_removed_share(pattern, v, W_O, mask)
    real = key_mask[:, :, None]
    torch.testing.assert_close(got["o"].double() * real, expect * real, atol=2e-5, rtol=1e-4)


def test_removal_hook_minilm_equals_brute_force(minilm):
    view = ModelView(minilm)
    tokens = torch.tensor([[101, 2023, 2003, 1037, 3231, 1997, 102], [101, 7592, 2088, 102, 0, 0, 0]])
    key_mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]]).bool()
    caps, _ = capture(minilm, tokens, key_mask.long(), layers=[3])
    pattern, v, o = caps[3]
    allowed = allowed_mask(7, causal=False, key_mask=key_mask, query_mask=key_mask)
    mask = _random_mask((2, 1, 7, 7), 2, allowed)
    got = {}

    def grab(t, hook=None):
        got["o"] = t.detach().clone()
        return t

    hooks = removal_hooks(view, {3: mask}, key_mask=key_mask)
    with torch.no_grad():
        view.run(tokens, attention_mask=key_mask.long(), return_type=None,
                 fwd_hooks=hooks + [("blocks.3.attn.o.hook_out", grab)])
    expect = o.double() - brute_removed_share(pattern, v, view.weights(3).W_O, mask)
    real = key_mask[:, :, None]
    torch.testing.assert_close(got["o"].double() * real, expect * real, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy", ["pattern", "z"])
def test_fraction_zero_leaves_logits_unchanged(native_ln, strategy):
    view = ModelView(native_ln)
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    allowed = allowed_mask(16)
    scores = torch.rand(2, 1, 16, 16)
    masks = {l: removal_mask(scores, 0.0, "top", allowed) for l in range(view.n_layers)}
    with torch.no_grad():
        clean = view.run(tokens)
        hooked = view.run(tokens, fwd_hooks=removal_hooks(view, masks, strategy=strategy))
    assert torch.equal(clean, hooked)


def test_fraction_zero_leaves_minilm_unchanged(minilm):
    view = ModelView(minilm)
    tokens = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    masks = {l: torch.zeros(1, 1, 6, 6, dtype=torch.bool) for l in range(view.n_layers)}
    got = []

    def grab(t, hook=None):
        got.append(t.detach().clone())
        return t

    name = f"blocks.{view.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        view.run(tokens, fwd_hooks=[(name, grab)], return_type=None)
        view.run(tokens, fwd_hooks=removal_hooks(view, masks) + [(name, grab)], return_type=None)
    assert torch.equal(got[0], got[1])


def test_removal_hooks_rejects_bad_masks(native_ln):
    view = ModelView(native_ln)
    with pytest.raises(ValueError, match="bool"):
        removal_hooks(view, {0: torch.zeros(1, 1, 4, 4)})
    with pytest.raises(ValueError, match="strategy"):
        removal_hooks(view, {0: torch.zeros(1, 1, 4, 4, dtype=torch.bool)}, strategy="q")


# ----------------------------------------------------------------------------- ranks
@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 14),
    h=st.sampled_from([1, 3]),
    causal=st.booleans(),
    ties=st.booleans(),
    which=st.sampled_from(["top", "bottom"]),
    seed=st.integers(0, 10_000),
)
def test_removal_ranks_reproduce_removal_mask(T, h, causal, ties, which, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, h, T, T, generator=g)
    if ties:
        scores = scores.round()
    key_mask = torch.rand(2, T, generator=g) > 0.2
    allowed = allowed_mask(T, causal=causal, key_mask=key_mask, query_mask=key_mask)
    ranks = removal_ranks(scores, which, allowed)
    for f in [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]:
        k = removal_counts(allowed.expand_as(scores), f)
        mine = (ranks < k.unsqueeze(-1)) & allowed
        assert torch.equal(mine, removal_mask(scores, f, which, allowed))


# ----------------------------------------------------------------------------- end to end
def brute_curves(model, tokens, mask, measures, fractions, layer, mode="inter", metric="ppl"):
    """One unbatched forward per (document, setting, measure, which, fraction)."""
    view = ModelView(model)
    L = view.n_layers
    out = {}
    clean_nll = clean_n = 0.0
    per_doc = []
    for d in range(tokens.shape[0]):
        n = int(mask[d].sum())
        tok = tokens[d : d + 1, :n]
        m1 = torch.ones(1, n, dtype=torch.bool)
        caps, logits = capture(model, tok)
        if metric == "ppl":
            a, c = nll_sums(logits, tok, m1)
            clean_nll += a
            clean_n += c
        allowed = allowed_mask(n, causal=view.causal)
        scores = {}
        for name in measures:
            for l in range(L):
                p, v, _ = caps[l]
                maps = contribution_weights(p, v, view.weights(l).W_O, mode)
                if name == "abs_contribution":
                    scores[name, l] = maps.token_level("contribution").abs()
                else:
                    scores[name, l] = maps.token_level(name)
        per_doc.append((tok, allowed, scores))
    for si, layers in enumerate([list(range(L)), [layer]]):
        for name in measures:
            for which in ("top", "bottom"):
                for f in fractions:
                    nll = cnt = 0.0
                    for tok, allowed, scores in per_doc:
                        masks = {l: removal_mask(scores[name, l], f, which, allowed) for l in layers}
                        with torch.no_grad():
                            lg = ModelView(model).run(tok, fwd_hooks=removal_hooks(
                                view, masks, strategy="pattern"))
                        a, c = nll_sums(lg, tok, torch.ones_like(tok, dtype=torch.bool))
                        nll += a
                        cnt += c
                    out[si, name, which, f] = math.exp(nll / cnt)
    clean = math.exp(clean_nll / clean_n)
    return {k: v - clean for k, v in out.items()}, clean


def test_faithfulness_matches_unbatched_brute_force():
    model = make_native(n_layers=2, seed=7)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 50, (3, 14), generator=g)
    mask = torch.ones(3, 14, dtype=torch.bool)
    mask[2, 10:] = False  # right padding
    tokens[2, 10:] = 0
    measures = ["attention", "contribution"]
    fr = [0.0, 0.5]
    res = faithfulness(model, tokens, attention_mask=mask.long(), measures=measures,
                       fractions=fr, layer=1, batch_size=2, rows_per_pass=5)
    ref, clean = brute_curves(model, tokens, mask, measures, fr, layer=1)
    assert res.clean == pytest.approx(clean, rel=1e-5)
    for si in range(2):
        for mi, name in enumerate(measures):
            for fi, f in enumerate(fr):
                assert float(res.comprehensiveness[si, mi, fi]) == pytest.approx(
                    ref[si, name, "top", f], abs=2e-3, rel=1e-4)
                assert float(res.sufficiency[si, mi, fi]) == pytest.approx(
                    ref[si, name, "bottom", f], abs=2e-3, rel=1e-4)
    assert torch.all(res.comprehensiveness[..., 0] == 0)
    assert torch.all(res.sufficiency[..., 0] == 0)


def test_abs_contribution_diagnostic_matches_brute_force():
    model = make_native(n_layers=2, seed=8, normalization_type=None)
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 10, dtype=torch.bool)
    res = faithfulness(model, tokens, measures=["abs_contribution"], fractions=[0.0, 0.5],
                       layer=0)
    ref, _ = brute_curves(model, tokens, mask, ["abs_contribution"], [0.0, 0.5], layer=0)
    for si in range(2):
        assert float(res.comprehensiveness[si, 0, 1]) == pytest.approx(
            ref[si, "abs_contribution", "top", 0.5], abs=2e-3, rel=1e-4)
        assert float(res.sufficiency[si, 0, 1]) == pytest.approx(
            ref[si, "abs_contribution", "bottom", 0.5], abs=2e-3, rel=1e-4)


def test_faithfulness_encoder_embedding_distance(minilm):
    view = ModelView(minilm)
    tokens = torch.tensor([[101, 2023, 2003, 1037, 3231, 1997, 102], [101, 7592, 2088, 102, 0, 0, 0]])
    am = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    res = faithfulness(minilm, tokens, attention_mask=am, measures=["contribution"],
                       fractions=[0.0, 0.5], layer=2)
    assert res.metric == "embedding_distance" and res.strategy == "z"
    assert float(res.comprehensiveness[0, 0, 0]) == pytest.approx(0.0, abs=1e-12)
    # brute force for the single-layer comprehensiveness point at r = 0.5
    name = f"blocks.{view.n_layers - 1}.hook_resid_post"
    dists = []
    for d in range(2):
        n = int(am[d].sum())
        tok = tokens[d : d + 1, :n]
        caps, _ = capture(minilm, tok, layers=[2])
        p, v, _ = caps[2]
        sc = contribution_weights(p, v, view.weights(2).W_O, "inter").token_level("contribution")
        m = removal_mask(sc, 0.5, "top", allowed_mask(n, causal=False))
        got = []

        def grab(t, hook=None):
            got.append(t.detach().double().mean(1))
            return t

        with torch.no_grad():
            view.run(tok, fwd_hooks=[(name, grab)], return_type=None)
            view.run(tok, fwd_hooks=removal_hooks(view, {2: m}) + [(name, grab)], return_type=None)
        dists.append(1 - float(torch.nn.functional.cosine_similarity(got[0], got[1])))
    assert float(res.comprehensiveness[1, 0, 1]) == pytest.approx(sum(dists) / 2, rel=1e-3, abs=1e-6)


def test_faithfulness_result_roundtrip_and_ordering(native_noln, tmp_path):
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(5))
    res = faithfulness(native_noln, tokens, fractions=[0.0, 0.5, 0.9], level="head")
    assert res.comprehensiveness.shape == (2, 5, 3)
    # per query, ‖o_i‖ is a positive constant, so output_normalized ranks like value_weighted
    assert res.aliases.get("output_normalized") == "value_weighted"
    back = Result.load(res.save(tmp_path / "f.safetensors"))
    assert isinstance(back, FaithfulnessResult)
    torch.testing.assert_close(back.sufficiency_area, res.sufficiency_area)
    order = res.ordering(0)
    assert sorted(order["comprehensiveness"]) == sorted(res.measures)
    po = order["paper_order"]["inter"]
    assert po["measures"] == ["attention", "value_weighted", "output_normalized", "contribution"]
    assert po["ties"] == 1 and isinstance(po["comprehensiveness"], bool)
    assert len(res.to_rows(1)) == 5
    import matplotlib.pyplot as plt

    plt.close(res.plot_curves())


def test_faithfulness_bad_arguments(native_ln, minilm):
    tokens = torch.randint(0, 50, (1, 8))
    with pytest.raises(ValueError, match="unknown measure"):
        faithfulness(native_ln, tokens, measures=["rollout"])
    with pytest.raises(ValueError, match="fractions"):
        faithfulness(native_ln, tokens, fractions=[0.1, 0.5])
    with pytest.raises(ValueError, match="level"):
        faithfulness(native_ln, tokens, level="layer")
    with pytest.raises(ValueError, match="delta_ppl needs a causal"):
        faithfulness(minilm, torch.tensor([[101, 7592, 102]]), metric="delta_ppl")


def _synthetic(comp, suff, measures, aliases=None, mode="inter"):
    c = torch.tensor([comp], dtype=torch.float32)
    s = torch.tensor([suff], dtype=torch.float32)
    z = torch.zeros(1, len(measures), 2)
    return FaithfulnessResult(metric="delta_ppl", measures=measures, fractions=[0.0, 0.5],
                              settings=["all layers"], comprehensiveness=z, sufficiency=z,
                              comprehensiveness_area=c, sufficiency_area=s, clean=1.0,
                              mode=mode, aliases=aliases or {})


def test_ordering_detects_the_paper_order_and_ties():
    names = ["attention", "value_weighted", "output_normalized", "contribution",
             "contribution@intra", "output_normalized@intra"]
    res = _synthetic([1, 2, 2, 3, 0.5, 0.4], [4, 3, 3, 1, 5, 6], names,
                     aliases={"output_normalized": "value_weighted"})
    o = res.ordering()
    assert o["comprehensiveness"][0] == "contribution" and o["sufficiency"][0] == "contribution"
    inter = o["paper_order"]["inter"]
    assert inter["comprehensiveness"] and inter["sufficiency"] and inter["ties"] == 1
    intra = o["paper_order"]["intra"]
    assert intra["measures"][2:] == ["output_normalized@intra", "contribution@intra"]
    assert not intra["comprehensiveness"] and not intra["sufficiency"]
    # inter mode: output_normalized ranks like value_weighted by construction (a tie)
    po = _synthetic([1, 2, 2, 3], [4, 3, 3, 1], names[:4]).ordering()["paper_order"]["inter"]
    assert po["comprehensiveness"] and po["ties"] == 1
    # intra mode at token level: no such identity, equal areas break the strict order
    po = _synthetic([1, 2, 2, 3], [4, 3, 3, 1], names[:4], mode="intra").ordering()
    assert not po["paper_order"]["intra"]["comprehensiveness"]
