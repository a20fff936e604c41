"""run_probes and AttentionStatsProbe: brute force, padding, sharding, early stop, errors."""

from __future__ import annotations

import matplotlib.figure
import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.model_view import ModelView
from tl_spectral.probes import AttentionStatsProbe, LayerCapture, Probe, run_probes
from tl_spectral.probes.attention_stats import AttentionStatsResult
from tl_spectral.results import Result


def _patterns(model, tokens):
    """All layers' patterns of one [1, T] document, by plain run_with_hooks."""
    v = ModelView(model)
    got = {}

    def make(layer):
        def hook(t, hook):
            got[layer] = t.detach().clone()
            return t

        return hook

    with torch.no_grad():
        v.run(tokens, fwd_hooks=[(v.hook_pattern(l), make(l)) for l in range(v.n_layers)],
              return_type=None)
    return got


def _brute_stats(model, docs):
    """Entropy, distance, first mass per layer/head by explicit loops over documents."""
    v = ModelView(model)
    L, H = v.n_layers, v.n_heads
    ent = torch.zeros(L, H, dtype=torch.float64)
    dist = torch.zeros(L, H, dtype=torch.float64)
    first = torch.zeros(L, H, dtype=torch.float64)
    n = 0
    for d in docs:
        pats = _patterns(model, d[None])
        T = d.numel()
        n += T
        for layer in range(L):
            for h in range(H):
                for i in range(T):
                    row = pats[layer][0, h, i].double()
                    ent[layer, h] -= sum(float(a) * float(torch.log(a)) for a in row if a > 0)
                    dist[layer, h] += sum(float(row[j]) * abs(i - j) for j in range(T))
                    first[layer, h] += float(row[0])
    return ent / n, dist / n, first / n


@pytest.mark.tl39
def test_attention_stats_brute_force(native_ln):
    torch.manual_seed(0)
    docs = [torch.randint(0, 50, (t,)) for t in (5, 9, 7)]
    res = run_probes(native_ln, docs, [AttentionStatsProbe()], batch_size=2, progress=False)
    r = res["attention_stats"]
    ent, dist, first = _brute_stats(native_ln, docs)
    torch.testing.assert_close(r.entropy.double(), ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(r.distance.double(), dist, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(r.first_token_mass.double(), first, atol=1e-5, rtol=1e-5)
    assert r.n_queries.tolist() == [21, 21, 21]
    # the mean pattern at (i, j) averages the documents where both positions exist
    pats = [_patterns(native_ln, d[None]) for d in docs]
    expect = (pats[0][1][0, :, 4, 2] + pats[1][1][0, :, 4, 2] + pats[2][1][0, :, 4, 2]) / 3
    torch.testing.assert_close(r.mean_pattern[1, :, 4, 2], expect, atol=1e-6, rtol=1e-5)
    expect8 = pats[1][0][0, :, 8, 3]
    torch.testing.assert_close(r.mean_pattern[0, :, 8, 3], expect8, atol=1e-6, rtol=1e-5)


@pytest.mark.tl39
def test_padding_invariance_causal(native_ln):
    torch.manual_seed(1)
    doc = torch.randint(0, 50, (6,))
    others = [torch.randint(0, 50, (12,)), torch.randint(0, 50, (3,))]
    alone = run_probes(native_ln, [doc], [AttentionStatsProbe()], progress=False)["attention_stats"]
    batch = run_probes(native_ln, [others[0], doc, others[1]], [AttentionStatsProbe()], batch_size=3,
                       progress=False)["attention_stats"]
    parts = run_probes(native_ln, others, [AttentionStatsProbe()], batch_size=2,
                       progress=False)["attention_stats"]
    # sums: batch = alone + parts
    n_a, n_p = alone.n_queries[0].item(), parts.n_queries[0].item()
    combined = (alone.entropy * n_a + parts.entropy * n_p) / (n_a + n_p)
    torch.testing.assert_close(batch.entropy, combined, atol=1e-5, rtol=1e-5)


def test_padding_invariance_bidirectional(minilm):
    tok = minilm.tokenizer
    a = tok("The quick brown fox jumps.")["input_ids"]
    b = tok("A much longer sentence that forces padding of the short one, surely.")["input_ids"]
    alone = run_probes(minilm, [a], [AttentionStatsProbe(layers=[0, 5])], progress=False)["attention_stats"]
    both = run_probes(minilm, [a, b], [AttentionStatsProbe(layers=[0, 5])], batch_size=2,
                      progress=False)["attention_stats"]
    only_b = run_probes(minilm, [b], [AttentionStatsProbe(layers=[0, 5])], progress=False)["attention_stats"]
    na, nb = len(a), len(b)
    for field in ("entropy", "distance", "first_token_mass"):
        mixed = (getattr(alone, field) * na + getattr(only_b, field) * nb) / (na + nb)
        torch.testing.assert_close(getattr(both, field), mixed, atol=1e-5, rtol=1e-4)
    # the short document's pattern is the same alone and padded inside the batch
    rows = alone.mean_pattern[:, :, :na, :na].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-4, rtol=1e-4)
    mixed = (alone.mean_pattern[:, :, :na, :na] + only_b.mean_pattern[:, :, :na, :na]) / 2
    torch.testing.assert_close(both.mean_pattern[:, :, :na, :na], mixed, atol=1e-5, rtol=1e-4)


@pytest.mark.tl39
def test_sharded_equals_whole(native_ln):
    torch.manual_seed(2)
    toks = torch.randint(0, 50, (10, 16))
    whole = AttentionStatsProbe()
    r_whole = run_probes(native_ln, toks, [whole], batch_size=4, progress=False)["attention_stats"]
    a, b = AttentionStatsProbe(), AttentionStatsProbe()
    run_probes(native_ln, toks[:3], [a], batch_size=2, progress=False)
    run_probes(native_ln, toks[3:], [b], batch_size=5, progress=False)
    r_merged = a.merge(b).result()
    for f in ("entropy", "distance", "first_token_mass", "mean_pattern"):
        torch.testing.assert_close(getattr(r_merged, f), getattr(r_whole, f), atol=1e-6, rtol=1e-6)


@pytest.mark.tl39
@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=5), bs=st.integers(1, 4))
def test_first_mass_and_counts_property(native_noln, lengths, bs):
    g = torch.Generator().manual_seed(sum(lengths))
    docs = [torch.randint(0, 50, (n,), generator=g) for n in lengths]
    r = run_probes(native_noln, docs, [AttentionStatsProbe(layers=[0])], batch_size=bs,
                   progress=False)["attention_stats"]
    assert int(r.n_queries[0]) == sum(lengths)
    assert torch.isfinite(r.entropy).all()
    # entropy of a causal row over i+1 keys is at most log(i+1)
    bound = sum(torch.log(torch.arange(1, n + 1).double()).sum() for n in lengths) / sum(lengths)
    assert float(r.entropy.max()) <= float(bound) + 1e-5
    assert (r.first_token_mass > 0).all() and (r.first_token_mass <= 1 + 1e-6).all()


class _Recorder(Probe):
    name = "recorder"

    def __init__(self, layers):
        super().__init__()
        self.layers = layers
        self.seen = []

    def requires(self, view):
        return {l: {"pattern", "v"} for l in self.layers}

    def update(self, cap: LayerCapture):
        self.seen.append((cap.layer, tuple(cap.pattern.shape), tuple(cap.v.shape)))
        self.accumulate("n", torch.tensor([1.0]))

    def result(self):
        return self.seen


@pytest.mark.tl39
def test_shared_capture_and_early_stop(native_gqa):
    """Two probes on one layer share the capture; later layers never run."""
    fired = []
    view = ModelView(native_gqa)
    view.check_patterns()  # its own probe pass runs every layer
    later = view.hook_name("pattern", 2)
    view.model.hook_dict[later].add_hook(lambda t, hook: fired.append(1))
    try:
        a, b = _Recorder([0, 1]), _Recorder([1])
        b.name = "recorder2"
        run_probes(view, torch.randint(0, 50, (3, 8)), [a, b], batch_size=3, progress=False)
    finally:
        view.model.hook_dict[later].remove_hooks()
    assert fired == []  # layer 2 was never computed
    assert a.seen == [(0, (3, 4, 8, 8), (3, 8, 4, 16)), (1, (3, 4, 8, 8), (3, 8, 4, 16))]
    assert b.seen == [(1, (3, 4, 8, 8), (3, 8, 4, 16))]  # v repeated to the 4 query heads


@pytest.mark.tl39
def test_errors(native_ln):
    with pytest.raises(ValueError, match="empty"):
        run_probes(native_ln, torch.zeros(0, 5, dtype=torch.long), [AttentionStatsProbe()], progress=False)
    with pytest.raises(ValueError, match="empty"):
        run_probes(native_ln, [], [AttentionStatsProbe()], progress=False)
    with pytest.raises(ValueError, match="context of 64"):
        run_probes(native_ln, torch.zeros(1, 65, dtype=torch.long), [AttentionStatsProbe()], progress=False)
    with pytest.raises(ValueError, match="vocabulary"):
        run_probes(native_ln, torch.full((1, 5), 99), [AttentionStatsProbe()], progress=False)
    with pytest.raises(TypeError, match="tokenize"):
        run_probes(native_ln, "some text", [AttentionStatsProbe()], progress=False)
    with pytest.raises(ValueError, match="right-padded"):
        run_probes(native_ln, torch.zeros(1, 4, dtype=torch.long), [AttentionStatsProbe()],
                   attention_mask=torch.tensor([[0, 1, 1, 1]]), progress=False)
    with pytest.raises(ValueError, match="at least one probe"):
        run_probes(native_ln, torch.zeros(1, 4, dtype=torch.long), [], progress=False)
    with pytest.raises(RuntimeError, match="seen no data"):
        AttentionStatsProbe().result()


@pytest.mark.tl39
def test_nan_patterns_raise():
    m = make_native(seed=5)
    with torch.no_grad():
        hit = 0
        for name, p in m.named_parameters():
            if name.startswith(("layers.1.", "blocks.1.")) and (".q." in name or name.endswith("W_Q")):
                p.fill_(float("nan"))
                hit += 1
        assert hit
    with pytest.raises(FloatingPointError, match="layer 1"):
        run_probes(m, torch.randint(0, 50, (2, 6)), [AttentionStatsProbe()], progress=False)


@pytest.mark.tl39
def test_result_save_load_plot(native_ln, tmp_path):
    r = run_probes(native_ln, torch.randint(0, 50, (4, 10)), [AttentionStatsProbe()], progress=False)[
        "attention_stats"
    ]
    path = r.save(tmp_path / "stats.safetensors")
    back = AttentionStatsResult.load(path)
    assert isinstance(back, AttentionStatsResult)
    for f in ("entropy", "distance", "first_token_mass", "mean_pattern", "n_queries"):
        assert torch.equal(getattr(back, f), getattr(r, f))
    assert back.layers == r.layers and back.model_name == r.model_name
    assert isinstance(r.plot(), matplotlib.figure.Figure)
    assert isinstance(r.plot_patterns(), matplotlib.figure.Figure)
    assert len(r.to_rows()) == 3 * 4


def test_load_foreign_files(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "foreign.safetensors"
    save_file({"x": torch.zeros(2)}, str(p))
    with pytest.raises(ValueError, match="not a tl_spectral result"):
        Result.load(p)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable safetensors"):
        Result.load(bad)


def test_result_load_in_a_fresh_interpreter(native_ln, tmp_path):
    """Result.load finds every result kind without the caller importing its module."""
    import subprocess
    import sys

    r = run_probes(native_ln, torch.randint(0, 50, (2, 6)), [AttentionStatsProbe()], progress=False)
    path = r["attention_stats"].save(tmp_path / "s.safetensors")
    code = (f"from tl_spectral.results import Result; r = Result.load({str(path)!r}); "
            "print(type(r).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AttentionStatsResult"


def test_probe_state_stays_on_the_model_device(native_ln, monkeypatch):
    """No probe update copies to the CPU: states live on the model's device (here the CPU,
    checked by counting Tensor.cpu calls inside update), and results are CPU tensors."""
    import contextvars

    from tl_spectral.probes import AttentionFieldProbe, SinkProbe

    inside = contextvars.ContextVar("inside", default=False)
    calls: list[str] = []
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self, *a, **k):
        if inside.get():
            import traceback

            calls.append(traceback.format_stack(limit=3)[0])
        return real_cpu(self, *a, **k)

    probes = [AttentionStatsProbe(), SinkProbe(), AttentionFieldProbe()]
    for p in probes:
        def wrap(f):
            def update(cap):
                assert cap.pattern.device == cap.mask.device == cap.tokens.device \
                    == cap.doc_index.device == ModelView(native_ln).device
                tok = inside.set(True)
                try:
                    return f(cap)
                finally:
                    inside.reset(tok)
            return update
        p.update = wrap(p.update)
    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    res = run_probes(native_ln, tokens, probes, batch_size=2, progress=False)
    assert calls == []
    dev = ModelView(native_ln).device
    for p in probes:
        assert all(t.device == dev for t in p.state.values())
    assert res["attention_stats"].entropy.device.type == "cpu"
    assert res["attention_fields"].fields["0"].device.type == "cpu"
    # offload keeps the per-document fields in CPU memory
    off = AttentionFieldProbe(offload=True, name="off")
    run_probes(native_ln, tokens, [off], batch_size=2, progress=False)
    assert off.state["0.fields"].device.type == "cpu"


def test_attention_stats_pattern_positions_keeps_the_leading_block(native_ln):
    """The mean pattern kept for the first P positions equals that block of the full mean
    pattern; entropy, distance and first-token mass do not depend on P."""
    g = torch.Generator().manual_seed(5)
    docs = torch.randint(0, 50, (3, 24), generator=g)
    full = run_probes(native_ln, docs, [AttentionStatsProbe(pattern_positions=None)], batch_size=2,
                      progress=False)["attention_stats"]
    part = run_probes(native_ln, docs, [AttentionStatsProbe(pattern_positions=10)], batch_size=2,
                      progress=False)["attention_stats"]
    assert full.mean_pattern.shape[-1] == 24 and part.mean_pattern.shape[-2:] == (10, 10)
    torch.testing.assert_close(part.mean_pattern, full.mean_pattern[..., :10, :10])
    for name in ("entropy", "distance", "first_token_mass"):
        torch.testing.assert_close(getattr(part, name), getattr(full, name))
    with pytest.raises(ValueError, match="pattern_positions"):
        AttentionStatsProbe(pattern_positions=0)
