"""Global (layer-level) ranking in faithfulness, head level, and intervals over documents
(issue 17 item 4), against unbatched brute force."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.analysis.contributions import contribution_weights
from tl_spectral.analysis.faithfulness import allowed_mask, removal_mask
from tl_spectral.model_view import ModelView
from tl_spectral.probes.faithfulness import (
    FaithfulnessResult,
    faithfulness,
    removal_hooks,
    removal_ranks,
    scope_counts,
    structural_aliases,
)
from tl_spectral.results import Result


def brute_layer_mask(scores, allowed, fraction, which):
    """Python sort of every allowed pair of a [batch, head] slice: key (∓score, i, j)."""
    b, h, q, k = scores.shape
    out = torch.zeros(b, h, q, k, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            pairs = [(i, j) for i in range(q) for j in range(k) if allowed[bi, hi, i, j]]
            n_rm = math.floor(fraction * len(pairs) + 0.5 + 1e-9)
            sign = -1.0 if which == "top" else 1.0
            pairs.sort(key=lambda p: (sign * float(scores[bi, hi, p[0], p[1]]), p[0], p[1]))
            for i, j in pairs[:n_rm]:
                out[bi, hi, i, j] = True
    return out


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 3), T=st.integers(1, 9),
       fraction=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 1.0]),
       which=st.sampled_from(["top", "bottom"]), causal=st.booleans(), ties=st.booleans(),
       seed=st.integers(0, 10_000))
def test_layer_scope_mask_and_ranks_match_brute_force(h, T, fraction, which, causal, ties,
                                                       seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, h, T, T, generator=g)
    if ties:
        scores = scores.round()
    km = torch.rand(2, T, generator=g) > 0.2
    allowed = allowed_mask(T, causal=causal, key_mask=km, query_mask=km)
    want = brute_layer_mask(scores, allowed.expand_as(scores), fraction, which)
    got = removal_mask(scores, fraction, which, allowed, scope="layer")
    assert torch.equal(got, want)
    ranks = removal_ranks(scores, which, allowed, "layer")
    mine = (ranks < scope_counts(allowed, fraction, "layer")) & allowed
    assert torch.equal(mine, want)
    # the query scope is unchanged by the refactor
    q = (removal_ranks(scores, which, allowed) < scope_counts(allowed, fraction)) & allowed
    assert torch.equal(q, removal_mask(scores, fraction, which, allowed))


BAD_SCOPE = r"^scope='(corpus|doc)' is not one of 'query', 'layer'; .*'query': each"


def test_scope_bad_input():
    s = torch.zeros(1, 1, 3, 3)
    with pytest.raises(ValueError, match=BAD_SCOPE):
        removal_mask(s, 0.5, scope="corpus")
    with pytest.raises(ValueError, match=BAD_SCOPE):
        faithfulness(make_native(n_layers=1), torch.zeros(1, 4, dtype=torch.long),
                     scope="doc")


def _brute(model, tokens, measures, fractions, layer, level, scope, mode="inter"):
    """One unbatched forward pass per (document, setting, measure, which, fraction)."""
    view = ModelView(model)
    L = view.n_layers
    nll = {}
    clean = []
    for d in range(tokens.shape[0]):
        tok = tokens[d:d + 1]
        caps = {}

        def grab(key):
            def hook(t, hook=None):
                caps[key] = t.detach().clone()
                return t
            return hook

        hooks = []
        for l in range(L):
            hooks += [(f"blocks.{l}.attn.hook_pattern", grab((l, "p"))),
                      (f"blocks.{l}.attn.hook_v", grab((l, "v")))]
        with torch.no_grad():
            lg = view.run(tok, fwd_hooks=hooks)
        logp = torch.log_softmax(lg[:, :-1].double(), -1)
        clean.append(float(-logp.gather(-1, tok[:, 1:, None]).sum()))
        allowed = allowed_mask(tok.shape[1], causal=True)
        for si, layers in enumerate([list(range(L)), [layer]]):
            for name in measures:
                sc = {}
                for l in range(L):
                    cm = contribution_weights(caps[l, "p"], view.repeat_kv(caps[l, "v"], 2),
                                              view.weights(l).W_O, mode)
                    sc[l] = cm.token_level(name) if level == "token" else cm.measure(name)
                for which in ("top", "bottom"):
                    for f in fractions:
                        masks = {l: removal_mask(sc[l], f, which, allowed, scope=scope)
                                 for l in layers}
                        with torch.no_grad():
                            out = view.run(tok, fwd_hooks=removal_hooks(view, masks,
                                                                        strategy="pattern"))
                        lp = torch.log_softmax(out[:, :-1].double(), -1)
                        nll[d, si, name, which, f] = float(-lp.gather(-1, tok[:, 1:, None]).sum())
    return nll, clean


@pytest.mark.parametrize("level", ["token", "head"])
def test_layer_scope_faithfulness_matches_brute_force(level):
    model = make_native(n_layers=2, seed=11)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(5))
    measures = ["value_weighted", "output_normalized"]
    fr = [0.0, 0.3, 0.6]
    res = faithfulness(model, tokens, measures=measures, fractions=fr, layer=1, level=level,
                       scope="layer", batch_size=2, rows_per_pass=7)
    assert res.scope == "layer" and "output_normalized" not in res.aliases
    nll, clean = _brute(model, tokens, measures, fr, 1, level, "layer")
    n_tgt = 3 * 9
    ppl0 = math.exp(sum(clean) / n_tgt)
    assert res.clean == pytest.approx(ppl0, rel=1e-5)
    for si in range(2):
        for mi, name in enumerate(measures):
            for fi, f in enumerate(fr):
                for which, curves in (("top", res.comprehensiveness),
                                      ("bottom", res.sufficiency)):
                    want = math.exp(sum(nll[d, si, name, which, f] for d in range(3)) / n_tgt)
                    assert float(curves[si, mi, fi]) == pytest.approx(want - ppl0, abs=2e-3,
                                                                      rel=1e-4)
    # per-document statistics add up to the curves; intervals are centred on them
    assert res.doc_stats.shape == (3, 2, 2, 2, 3, 2)
    assert float(res.doc_stats[..., 1].max()) == 9
    iv = res.area_intervals(n_resamples=50)
    torch.testing.assert_close(iv["comprehensiveness_area"].estimate.float(),
                               res.comprehensiveness_area, atol=1e-5, rtol=1e-5)
    assert bool((iv["sufficiency_area"].low <= iv["sufficiency_area"].high).all())
    diff = res.area_difference("value_weighted", "output_normalized", setting=0,
                               n_resamples=50)
    want = float(res.comprehensiveness_area[0, 0] - res.comprehensiveness_area[0, 1])
    assert diff["comprehensiveness"].estimate == pytest.approx(want, abs=1e-5)


def test_layer_scope_separates_value_weighted_from_output_normalized():
    """Per query the two measures rank alike (aliased, identical curves); ranked over the
    whole layer they remove different pairs, so their curves differ."""
    model = make_native(n_layers=2, seed=3)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(9))
    measures = ["value_weighted", "output_normalized"]
    q = faithfulness(model, tokens, measures=measures, fractions=[0.0, 0.5])
    assert q.aliases == {"output_normalized": "value_weighted"}
    assert torch.equal(q.comprehensiveness[:, 0], q.comprehensiveness[:, 1])
    g = faithfulness(model, tokens, measures=measures, fractions=[0.0, 0.5], scope="layer")
    assert g.aliases == {}
    assert not torch.allclose(g.comprehensiveness[:, 0], g.comprehensiveness[:, 1])
    assert structural_aliases(measures, "inter", "head", "layer") == {}
    assert structural_aliases(measures, "inter", "head") == {
        "output_normalized": "value_weighted"}


def test_result_roundtrip_keeps_scope_and_doc_stats(tmp_path):
    model = make_native(n_layers=1, seed=2)
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    res = faithfulness(model, tokens, measures=["attention"], fractions=[0.0, 0.5],
                       scope="layer", layer=0)
    back = Result.load(res.save(tmp_path / "f"))
    assert isinstance(back, FaithfulnessResult) and back.scope == "layer"
    torch.testing.assert_close(back.doc_stats, res.doc_stats)
    old = FaithfulnessResult(**{**{f: getattr(res, f) for f in (
        "metric", "measures", "fractions", "settings", "comprehensiveness", "sufficiency",
        "comprehensiveness_area", "sufficiency_area", "clean")}})
    with pytest.raises(ValueError, match="per-document statistics"):
        old.area_intervals()
