"""SinkProbe and the zero-sink-value intervention against brute force (explicit ṽ_j)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from conftest import make_native

from tl_spectral.model_view import ModelView
from tl_spectral.probes import run_probes
from tl_spectral.probes.sinks import SinkInterventionResult, SinkProbe, SinkStats, zero_sink_value
from tl_spectral.results import Result


def capture_doc(model, tokens, layer):
    got = {}

    def grab(k):
        def hook(t, hook=None):
            got[k] = t.detach().clone()
            return t

        return hook

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ModelView(model).run(tokens, return_type=None, fwd_hooks=[
            (f"blocks.{layer}.attn.hook_pattern", grab("p")),
            (f"blocks.{layer}.attn.hook_v", grab("v"))])
    return got["p"][0].double(), got["v"][0].double()


def brute_doc(model, doc, layer):
    """Per head and query, by explicit d_model vectors: a dict of [H, T] tensors + layer [T]."""
    view = ModelView(model)
    p, v = capture_doc(model, doc[None], layer)  # [H, T, T], [T, kv, d]
    H, T = p.shape[0], p.shape[1]
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    vt = torch.einsum("khd,hdm->hkm", v, view.weights(layer).W_O.double())  # [H, k, m]
    a0 = p[..., 0]  # [H, T]
    s = torch.einsum("hqk,hkm->hqm", p[..., 1:], vt[:, 1:])  # s_i
    m = p[..., 1:].sum(-1)
    o_h = s + a0[..., None] * vt[:, None, 0]
    v0 = vt[:, None, 0].expand_as(s)
    cos = torch.nn.functional.cosine_similarity
    out = {"a0": a0, "anti": cos(v0, s, dim=-1), "s_ok": s.norm(dim=-1) > 1e-9, "m": m}
    sbar = s / m.clamp_min(1e-300)[..., None]
    d = sbar - v0
    out["rho"] = (sbar * d).sum(-1) / (d * d).sum(-1)
    out["rho_ok"] = m > 0
    out["vratio"] = vt[:, None, 0].norm(dim=-1).expand_as(m) / sbar.norm(dim=-1)
    out["hdn"] = s.norm(dim=-1) - o_h.norm(dim=-1)
    out["hrel"] = out["hdn"] / o_h.norm(dim=-1)
    out["hdc"] = 1 - cos(o_h, s, dim=-1)
    o, sl = o_h.sum(0), s.sum(0)
    out["ldn"] = sl.norm(dim=-1) - o.norm(dim=-1)
    out["lrel"] = out["ldn"] / o.norm(dim=-1)
    out["ldc"] = 1 - cos(o, sl, dim=-1)
    out["ldc_ok"] = sl.norm(dim=-1) > 1e-9  # the first causal query has s = 0
    out["last"] = p[..., -1]
    out["key0"] = a0.sum(-1) / T  # Gu score of token 0: n_0 = T (causal T − 0; bidirectional T)
    return out


@pytest.mark.parametrize("kind", ["ln", "gqa", "encoder"])
def test_sink_probe_matches_brute_force(kind):
    kw = {"ln": {}, "gqa": {"n_key_value_heads": 2}, "encoder": {"attention_dir": "bidirectional"}}[kind]
    model = make_native(n_layers=2, n_heads=4, seed=21, **kw)
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, 50, (n,), generator=g) for n in (13, 9, 16)]
    probe = SinkProbe(layers=[1], threshold=0.05, n_bins=20)
    res = run_probes(model, docs, [probe], batch_size=3, progress=False)["sinks"]
    per = [brute_doc(model, d, 1) for d in docs]
    cat = {k: torch.cat([b[k] for b in per], -1) for k in per[0] if k != "key0"}
    close = dict(atol=1e-5, rtol=1e-4)
    f = lambda t: t[0].double()  # noqa: E731  layer axis
    torch.testing.assert_close(f(res.sink_rate), cat["a0"].mean(-1), **close)
    torch.testing.assert_close(f(res.last_token_rate), cat["last"].mean(-1), **close)
    key = torch.stack([b["key0"] for b in per]).mean(0)
    torch.testing.assert_close(f(res.key_score), key, **close)
    assert torch.equal(res.sink_head[0], key.float() > 0.05)
    ok = cat["s_ok"]
    anti = torch.stack([cat["anti"][h][ok[h]].mean() for h in range(4)])
    torch.testing.assert_close(f(res.anti_mean), anti, **close)
    rok = cat["rho_ok"]
    rho = cat["rho"]
    torch.testing.assert_close(f(res.rho_mean), torch.stack(
        [rho[h][rok[h]].clamp(0, 1).mean() for h in range(4)]), **close)
    torch.testing.assert_close(f(res.rho_in_unit), torch.stack(
        [((rho[h] > 0) & (rho[h] < 1))[rok[h]].double().mean() for h in range(4)]), **close)
    torch.testing.assert_close(f(res.over_sink), torch.stack(
        [(cat["a0"][h] > rho[h].clamp(0, 1))[rok[h]].double().mean() for h in range(4)]), **close)
    torch.testing.assert_close(f(res.sink_value_ratio), torch.stack(
        [cat["vratio"][h][rok[h]].mean() for h in range(4)]), **close)
    torch.testing.assert_close(f(res.alpha_on_rho), torch.stack(
        [cat["a0"][h][rok[h]].mean() for h in range(4)]), **close)
    torch.testing.assert_close(f(res.head_delta_norm), cat["hdn"].mean(-1), **close)
    torch.testing.assert_close(f(res.head_rel_delta_norm), cat["hrel"].mean(-1), **close)
    torch.testing.assert_close(f(res.head_delta_cos), torch.stack(
        [cat["hdc"][h][ok[h]].mean() for h in range(4)]), **close)
    torch.testing.assert_close(float(res.delta_norm[0]), float(cat["ldn"].mean()), **close)
    torch.testing.assert_close(float(res.rel_delta_norm[0]), float(cat["lrel"].mean()), **close)
    ldc_ok = cat["ldc_ok"]
    torch.testing.assert_close(float(res.delta_cos[0]), float(cat["ldc"][ldc_ok].mean()), **close)
    # histograms: counts and shape against numpy on the same edges
    n_valid = int(ok.sum())
    assert float(res.anti_hist.sum()) == n_valid
    h_np, _ = np.histogram(cat["anti"][ok].numpy(), bins=res.anti_edges.double().numpy())
    np.testing.assert_allclose(res.anti_hist[0].sum(0).numpy(), h_np, atol=1)
    assert float(res.rho_hist.sum()) == float(rok.sum()) == float(res.rho_alpha_hist.sum())
    if kind != "encoder":  # causal: the first query sees only the sink, s_0 = 0
        assert n_valid == 4 * (sum(d.numel() for d in docs) - len(docs))


def test_sink_probe_merge_roundtrip_and_plots(native_ln, tmp_path):
    tokens = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(2))
    full = SinkProbe()
    run_probes(native_ln, tokens, [full], batch_size=2, progress=False)
    a, b = SinkProbe(), SinkProbe()
    run_probes(native_ln, tokens[:2], [a], batch_size=2, progress=False)
    run_probes(native_ln, tokens[2:], [b], batch_size=2, progress=False)
    merged, ref = a.merge(b).result(), full.result()
    for field in ("sink_rate", "key_score", "anti_hist", "rho_alpha_hist", "delta_cos", "rho_mean"):
        torch.testing.assert_close(getattr(merged, field), getattr(ref, field))
    assert ref.n_docs == 4
    back = Result.load(ref.save(tmp_path / "s.safetensors"))
    assert isinstance(back, SinkStats)
    torch.testing.assert_close(back.rho_hist, ref.rho_hist)
    import matplotlib.pyplot as plt

    for fig in (ref.plot_rates(), ref.plot_rho_star(), ref.plot_anti_alignment()):
        plt.close(fig)
    assert len(ref.to_rows()) == 3


def _ppl_with_v_zeroed(model, tokens, layers):
    """Independent path: zero the sink's value vector in hook_v (ṽ_0 = v_0 W_O = 0)."""
    def zero(t, hook=None):
        t = t.clone()
        t[:, 0] = 0.0
        return t

    hooks = [(f"blocks.{l}.attn.hook_v", zero) for l in layers]
    with torch.no_grad():
        logits = ModelView(model).run(tokens, fwd_hooks=hooks)
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    return math.exp(float(-logp.gather(-1, tokens[:, 1:, None]).mean()))


@pytest.mark.parametrize("gqa", [False, True])
def test_zero_sink_value_matches_value_hook(gqa):
    model = make_native(n_layers=2, seed=31, **({"n_key_value_heads": 2} if gqa else {}))
    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(4))
    res = zero_sink_value(model, tokens, batch_size=2, rows_per_pass=4)
    assert res.settings == ["layer 0", "layer 1", "all layers"]
    clean = _ppl_with_v_zeroed(model, tokens, [])
    assert res.clean == pytest.approx(clean, rel=1e-6)
    for si, layers in enumerate([[0], [1], [0, 1]]):
        ref = _ppl_with_v_zeroed(model, tokens, layers) - clean
        assert float(res.delta[si]) == pytest.approx(ref, rel=1e-4, abs=1e-4)


def test_analytic_delta_norm_equals_model_intervention(native_noln):
    # ‖o'‖ − ‖o‖ from SinkProbe equals the change of attn.o.hook_out − b_O when v_0 = 0
    view = ModelView(native_noln)
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(6))
    res = run_probes(native_noln, tokens, [SinkProbe(layers=[2])], progress=False)["sinks"]
    b_O = view.weights(2).b_O
    got = []

    def grab(t, hook=None):
        got.append((t.detach() - b_O).norm(dim=-1))
        return t

    def zero(t, hook=None):
        t = t.clone()
        t[:, 0] = 0.0
        return t

    with torch.no_grad():
        view.run(tokens, return_type=None, fwd_hooks=[("blocks.2.attn.o.hook_out", grab)])
        view.run(tokens, return_type=None, fwd_hooks=[("blocks.2.attn.hook_v", zero),
                                                      ("blocks.2.attn.o.hook_out", grab)])
    assert float(res.delta_norm[0]) == pytest.approx(float((got[1] - got[0]).mean()), abs=1e-5)


def test_zero_sink_value_minilm(minilm):
    docs = [torch.tensor([101, 2023, 2003, 1037, 3231, 102]), torch.tensor([101, 7592, 102])]
    res = zero_sink_value(minilm, docs, layers=[1])
    assert isinstance(res, SinkInterventionResult) and res.metric == "embedding_distance"
    view = ModelView(minilm)
    name = f"blocks.{view.n_layers - 1}.hook_resid_post"
    dist = []
    for d in docs:
        got = []

        def grab(t, hook=None):
            got.append(t.detach().double().mean(1))
            return t

        def zero(t, hook=None):
            t = t.clone()
            t[:, 0] = 0.0
            return t

        with torch.no_grad():
            view.run(d[None], return_type=None, fwd_hooks=[(name, grab)])
            view.run(d[None], return_type=None, fwd_hooks=[("blocks.1.attn.hook_v", zero), (name, grab)])
        dist.append(1 - float(torch.nn.functional.cosine_similarity(got[0], got[1])))
    assert float(res.delta[0]) == pytest.approx(np.mean(dist), rel=1e-3, abs=1e-6)
    assert float(res.delta[-1]) == pytest.approx(float(res.delta[0]), rel=1e-6)  # one layer
    assert res.to_rows()[0]["setting"] == "layer 1"


def test_sink_probe_bad_arguments():
    with pytest.raises(ValueError, match="n_bins"):
        SinkProbe(n_bins=1)
    with pytest.raises(RuntimeError, match="no data"):
        SinkProbe().result()
