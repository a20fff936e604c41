"""AttentionFieldProbe(field=...): the captured per-pair fields (attention, contribution
inter/intra, value-weighted) against explicit loops over (i, j) from the model's weights
and its attention input, on a native tiny model (causal and bidirectional, with padding)
and on TransformerBridge-booted tiny Hugging Face GPT-2 and BERT models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.model_view import ModelView
from tl_spectral.probes import AttentionFieldProbe, run_probes
from tl_spectral.probes.pair_fields import FIELD_KINDS

KINDS = FIELD_KINDS


def _captures(view: ModelView, tokens: torch.Tensor, layer: int, mask=None):
    """pattern [b, H, q, k], attention input [b, pos, d_model] and attention output (hook)."""
    got = {}

    def keep(name):
        def hook(t, hook=None):
            got[name] = t.detach().double()
            return t
        return hook

    hooks = [(view.hook_pattern(layer), keep("p")), (view.hook_attn_in(layer), keep("x"))]
    kw = {} if mask is None else {"attention_mask": mask}
    with torch.no_grad():
        view.run(tokens, fwd_hooks=hooks, return_type=None, **kw)
    return got["p"], got["x"]


def brute_fields(view: ModelView, tokens, layer: int, mask=None) -> dict[str, np.ndarray]:
    """Every kind's per-head field [b, H, q, k] by explicit loops (float64): values from
    the attention input and W_V, b_V; projected values ṽ = v W_O; outputs o_i^h, o_i as sums
    over j; contributions as inner products divided by squared norms."""
    p, x = _captures(view, tokens, layer, mask)
    w = view.weights(layer)
    W_V, b_V, W_O = (t.double().numpy() for t in (w.W_V, w.b_V, w.W_O))  # [H, dm, dh], [H, dh]
    p, x = p.numpy(), x.numpy()
    b, H, T, _ = p.shape
    m = np.ones((b, T), bool) if mask is None else mask.bool().numpy()
    out = {k: np.zeros((b, H, T, T)) for k in KINDS}
    for s in range(b):
        vt = np.stack([np.stack([(x[s, j] @ W_V[h] + b_V[h]) @ W_O[h] for j in range(T)])
                       for h in range(H)])  # ṽ [H, T, d_model]
        for i in range(T):
            if not m[s, i]:
                continue
            oh = [sum(p[s, h, i, j] * vt[h, j] for j in range(T) if m[s, j]) for h in range(H)]
            o = sum(oh)
            for h in range(H):
                vw = [p[s, h, i, j] * np.linalg.norm(vt[h, j]) if m[s, j] else 0.0
                      for j in range(T)]
                for j in range(T):
                    if not m[s, j]:
                        continue
                    out["attention"][s, h, i, j] = p[s, h, i, j]
                    term = p[s, h, i, j] * vt[h, j]
                    out["contribution"][s, h, i, j] = term @ o / (o @ o)
                    out["contribution_intra"][s, h, i, j] = term @ oh[h] / (oh[h] @ oh[h])
                    out["value_weighted_raw"][s, h, i, j] = vw[j]
                    out["value_weighted"][s, h, i, j] = vw[j] / sum(vw)
    return out


def combine(kind: str, per_head: np.ndarray) -> np.ndarray:
    return per_head.sum(1) if kind == "contribution" else per_head.mean(1)


def lag(A: np.ndarray, causal: bool) -> np.ndarray:
    """[b, T, T] (query, key) -> [b, T, n_lags] by loops (SPEC A.3)."""
    b, T, _ = A.shape
    lags = range(T) if causal else range(-(T - 1), T)
    F = np.zeros((b, T, len(lags)))
    for s in range(b):
        for i in range(T):
            for t, tau in enumerate(lags):
                j = i - tau if causal else i + tau
                if 0 <= j < T:
                    F[s, i, t] = A[s, i, j]
    return F


def _run(model, tokens, layers, per_head=False, mask=None, batch_size=2):
    probes = [AttentionFieldProbe(layers=layers, field=k, per_head=per_head) for k in KINDS]
    kw = {} if mask is None else {"attention_mask": mask}
    return run_probes(model, tokens, probes, batch_size=batch_size, progress=False, **kw)


def _close(got, want, what):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=2e-4, atol=2e-5,
                               err_msg=what)


@pytest.mark.parametrize("direction", ["causal", "bidirectional"])
def test_fields_match_brute_force_loops(direction):
    model = make_native(attention_dir=direction, seed=5, n_ctx=16, n_layers=2)
    view = ModelView(model)
    causal = direction == "causal"
    toks = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(3))
    res = _run(model, toks, [1])  # all five fields in ONE pass (one run_probes call)
    assert set(res) == {"attention_fields"} | {f"{k}_fields" for k in KINDS[1:]}
    bf = brute_fields(view, toks, 1)
    for kind in KINDS:
        r = res["attention_fields" if kind == "attention" else f"{kind}_fields"]
        assert r.field == kind
        F = lag(combine(kind, bf[kind]), causal)
        _close(r.fields["1"], F, f"{kind}: per-document lag fields")
        _close(r.mean["1"], F.mean(0), f"{kind}: ensemble mean field")
    # the normalisations the docs state: rows of every field but the raw one sum to 1
    for kind in ("attention", "contribution", "contribution_intra", "value_weighted"):
        rows = combine(kind, bf[kind]).sum(-1)
        np.testing.assert_allclose(rows, 1.0, atol=1e-9, err_msg=kind)
    # the per-head inter rows sum to each head's share, and the shares to 1
    shares = bf["contribution"].sum(-1)
    assert not np.allclose(shares, 1.0 / shares.shape[1])
    np.testing.assert_allclose(shares.sum(1), 1.0, atol=1e-9)


def test_per_head_fields_and_padding():
    model = make_native(seed=6, n_ctx=16, n_layers=2)
    view = ModelView(model)
    toks = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False  # a short document, right-padded
    res = _run(model, toks, [0, 1], per_head=True, mask=mask)
    for layer in (0, 1):
        bf = brute_fields(view, toks, layer, mask)
        for kind in KINDS:
            r = res["attention_fields" if kind == "attention" else f"{kind}_fields"]
            assert r.per_head and r.fields[str(layer)].shape == (3, 4, 9, 9)
            want = np.stack([lag(bf[kind][:, h], True) for h in range(4)], 1)
            _close(r.fields[str(layer)], want, f"{kind}, layer {layer}, per head")
            # the mean over real queries only: query 7 exists in documents 0 and 2
            _close(r.mean[str(layer)][:, 7], (want[0, :, 7] + want[2, :, 7]) / 2,
                   f"{kind}: mean over the real documents")
            assert float(r.fields[str(layer)][1, :, 6:].abs().max()) == 0.0


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_tiny_hf_bridge_fields(tmp_path, family):
    pytest.importorskip("transformers")
    from _tiny_hf import tiny_bridge

    model = tiny_bridge(family, tmp_path / family, n_layers=2, d_model=32, n_heads=4)
    view = ModelView(model)
    toks = torch.randint(1, 60, (3, 10), generator=torch.Generator().manual_seed(5))
    res = _run(model, toks, [1], batch_size=3)
    bf = brute_fields(view, toks, 1)
    for kind in KINDS:
        r = res["attention_fields" if kind == "attention" else f"{kind}_fields"]
        F = lag(combine(kind, bf[kind]), view.causal)
        _close(r.fields["1"], F, f"{kind} on a booted {family}")
        _close(r.mean["1"], F.mean(0), f"{kind} mean on a booted {family}")


def test_the_comparison_can_fail():
    """A field from another layer's values is caught: the brute force tells fields apart."""
    model = make_native(seed=5, n_ctx=16, n_layers=2)
    view = ModelView(model)
    toks = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    res = _run(model, toks, [0])
    bf = brute_fields(view, toks, 1)
    F = lag(combine("contribution", bf["contribution"]), True)
    with pytest.raises(AssertionError):
        _close(res["contribution_fields"].fields["0"], F, "wrong layer")


def test_bad_field_kind_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^field='contrib' is not one of 'attention', "):
        AttentionFieldProbe(field="contrib")


def test_scale_pod_of_contribution_fields_runs(tmp_path):
    from tl_spectral.results import Result

    model = make_native(seed=7, n_ctx=32, n_layers=2)
    toks = torch.randint(0, 50, (6, 16), generator=torch.Generator().manual_seed(6))
    r = run_probes(model, toks, [AttentionFieldProbe(field="contribution")],
                   progress=False)["contribution_fields"]
    r.save(tmp_path / "f.safetensors")
    back = Result.load(tmp_path / "f.safetensors")
    assert back.field == "contribution"
    torch.testing.assert_close(back.fields["1"], r.fields["1"])
    pod = r.scale_pod(n_heads=4)
    assert len(pod.layers) == 2 and all(lay.H_star >= 1 for lay in pod.layers)


def _loop_field(p, v, W_O, mask, kind):
    """Per-head field [b, H, q, k] by loops from a pattern, values and W_O (float64)."""
    b, H, T, _ = p.shape
    out = np.zeros((b, H, T, T))
    for s in range(b):
        vt = np.stack([v[s, :, h] @ W_O[h] for h in range(H)])  # ṽ [H, T, d_model]
        for i in range(T):
            if not mask[s, i]:
                continue
            oh = [sum(p[s, h, i, j] * vt[h, j] for j in range(T) if mask[s, j]) for h in range(H)]
            o = sum(oh)
            for h in range(H):
                vw = np.array([p[s, h, i, j] * np.linalg.norm(vt[h, j]) if mask[s, j] else 0.0
                               for j in range(T)])
                for j in range(T):
                    if not mask[s, j]:
                        continue
                    term = p[s, h, i, j] * vt[h, j]
                    out[s, h, i, j] = {
                        "attention": p[s, h, i, j],
                        "contribution": term @ o / (o @ o),
                        "contribution_intra": term @ oh[h] / (oh[h] @ oh[h]),
                        "value_weighted_raw": vw[j],
                        "value_weighted": vw[j] / vw.sum(),
                    }[kind]
    return out


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(2, 6), d=st.integers(1, 4),
       causal=st.booleans(), per_head=st.booleans(), kind=st.sampled_from(KINDS),
       seed=st.integers(0, 2**16), short=st.integers(1, 6))
def test_pair_field_matches_loops_on_random_captures(b, H, T, d, causal, per_head, kind, seed,
                                                     short):
    """pair_field on random captures (any shape, causal or not, a right-padded first
    document) against the loops: the field alone, without a model."""
    from tl_spectral.probes.base import LayerCapture
    from tl_spectral.probes.pair_fields import pair_field

    g = torch.Generator().manual_seed(seed)
    dm = d + 2
    mask = torch.ones(b, T, dtype=torch.bool)
    mask[0, min(short, T):] = False
    allow = mask[:, None, None, :] & (torch.ones(T, T).tril().bool() if causal else True)
    logits = torch.randn(b, H, T, T, generator=g, dtype=torch.float64)
    p = torch.softmax(logits.masked_fill(~allow, -torch.inf), -1).nan_to_num(0.0)
    v = torch.randn(b, T, H, d, generator=g, dtype=torch.float64)
    W_O = torch.randn(H, d, dm, generator=g, dtype=torch.float64)
    cap = LayerCapture(layer=0, mask=mask, tokens=torch.zeros(b, T, dtype=torch.long),
                       doc_index=torch.arange(b), pattern=p, v=v)
    got = pair_field(cap, kind, W_O=W_O, per_head=per_head)
    want = _loop_field(p.numpy(), v.numpy(), W_O.numpy(), mask.numpy(), kind)
    if not per_head:
        want = combine(kind, want)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-11)
