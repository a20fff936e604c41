"""AttentionFieldProbe(streaming=True): constant-memory statistics equal the in-memory scale POD."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_native

from tl_spectral.analysis.scale_pod import ScalePODOptions
from tl_spectral.probes import run_probes
from tl_spectral.probes.fields import AttentionFieldProbe, StreamedAttentionFields
from tl_spectral.results import Result


def _tokens(N: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (N, T), generator=torch.Generator().manual_seed(seed))


def _compare(mem, st, *, rtol: float, check_modes: bool = True) -> None:
    """Streamed vs in-memory ScalePODResult: scales, band energies, eigenvalues, H*, T_spec."""
    assert len(mem.layers) == len(st.layers)
    for a, b in zip(mem.layers, st.layers):
        assert a.dominant_scales == b.dominant_scales
        torch.testing.assert_close(b.scale_energy, a.scale_energy, rtol=1e-5, atol=1e-12)
        for k in a.band_energy:
            assert abs(a.band_energy[k] - b.band_energy[k]) <= 1e-6
        pairs = [(a.full_eigenvalues, b.full_eigenvalues, a.full, b.full)]
        pairs += [(a.band_eigenvalues[k], b.band_eigenvalues[k], a.bands[int(k)], b.bands[int(k)])
                  for k in a.band_eigenvalues]
        for la, lb, sa, sb in pairs:
            n = min(la.numel(), lb.numel())
            torch.testing.assert_close(lb[:n], la[:n], rtol=rtol, atol=1e-9 * float(la[0]))
            assert abs(sa["total_energy"] - sb["total_energy"]) <= 1e-6 * sa["total_energy"]
            if sb["spectrum_complete"]:
                assert sa["H_star"] == sb["H_star"]
                assert math.isclose(sa["T_spec"], sb["T_spec"], rel_tol=1e-4)
        if check_modes:
            for k in range(min(2, a.full_modes.shape[0])):
                gap = a.full_eigenvalues[k] - a.full_eigenvalues[k + 1]
                if gap > 1e-3 * a.full_eigenvalues[0]:
                    # up to sign: the largest-entry sign convention is ambiguous at ties
                    d = min(float((b.full_modes[k] - a.full_modes[k]).norm()),
                            float((b.full_modes[k] + a.full_modes[k]).norm()))
                    assert d <= 1e-3
        if a.coherence is not None:
            torch.testing.assert_close(b.coherence, a.coherence, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fold_every", [3, 64])
def test_streamed_equals_in_memory(fold_every):
    """Rank cap above the ensemble's rank: every streamed figure equals the in-memory one
    (eigenvalues to 1e-5 relative: float32 fields on both paths)."""
    model = make_native(seed=3, n_ctx=32)
    toks = _tokens(12, 32)
    mem = run_probes(model, toks, [AttentionFieldProbe()], batch_size=5, progress=False)["attention_fields"]
    st = run_probes(model, toks, [AttentionFieldProbe(streaming=True, rank=16, fold_every=fold_every)],
                    batch_size=5, progress=False)["attention_fields"]
    assert isinstance(st, StreamedAttentionFields) and st.n_docs == 12
    for layer in mem.layers:
        torch.testing.assert_close(st.mean[str(layer)], mem.mean[str(layer)], rtol=1e-5, atol=1e-7)
    _compare(mem.scale_pod(n_heads=4), st.scale_pod(n_heads=4), rtol=1e-4)


def test_rank_cap_bounds_hstar_and_saves(tmp_path):
    """A rank cap below H*: H* reads '> K' and is a lower bound; the top eigenvalues stay
    close; total energies stay exact; the result survives save/load."""
    model = make_native(seed=5, n_ctx=32)
    toks = _tokens(40, 32, seed=1)
    mem = run_probes(model, toks, [AttentionFieldProbe()], batch_size=8, progress=False)["attention_fields"]
    K = 4
    st = run_probes(model, toks, [AttentionFieldProbe(streaming=True, rank=K, fold_every=8, n_modes=2)],
                    batch_size=8, progress=False)["attention_fields"]
    eps = ScalePODOptions(epsilon=0.01)
    a, b = mem.scale_pod(n_heads=4, options=eps), st.scale_pod(n_heads=4, options=eps)
    for la, lb in zip(a.layers, b.layers):
        assert la.dominant_scales == lb.dominant_scales
        assert abs(la.full["total_energy"] - lb.full["total_energy"]) <= 1e-6 * la.full["total_energy"]
        assert lb.full_eigenvalues.numel() <= K
        # the reported bounds contain the in-memory H*; "> K" only when it is above K
        H, s = la.full["H_star"], lb.full
        assert s["H_star_low"] <= H
        if s["H_star_str"].startswith(">"):
            assert H > K
        elif not s["H_star_str"].startswith("≥"):
            assert H <= s["H_star"]
        if s["H_star_exact"]:
            assert H == s["H_star"]
        # a truncated stream never overstates the leading eigenvalue
        assert float(lb.full_eigenvalues[0]) <= float(la.full_eigenvalues[0]) * (1 + 1e-5)
    st.save(tmp_path / "s.safetensors")
    back = Result.load(tmp_path / "s.safetensors")
    _compare(b, back.scale_pod(n_heads=4, options=ScalePODOptions(epsilon=0.01)), rtol=1e-6)


def test_streaming_memory_does_not_grow_with_n():
    """The state after the run holds no per-document tensor: sizes equal for 12 and 36 documents."""
    model = make_native(seed=3, n_ctx=16, n_layers=1)

    def nbytes(N):
        p = AttentionFieldProbe(streaming=True, rank=6, fold_every=4)
        run_probes(model, _tokens(N, 16, seed=N), [p], batch_size=4, progress=False)
        return sum(v.numel() * v.element_size() for d in (p.state, p._pass1) for v in d.values())

    assert nbytes(12) == nbytes(36)


def test_merge_of_shards_with_the_same_windows():
    """Two probes run apart merge after their second pass when their windows agree: two runs
    on the same shard merged equal one run on the shard twice over; probes at different
    passes or with different windows refuse to merge."""
    model = make_native(seed=3, n_ctx=32)
    toks = _tokens(7, 32, seed=2)
    a = AttentionFieldProbe(streaming=True, rank=16, fold_every=3)
    with pytest.raises(RuntimeError, match="seen no data"):
        a.result()
    b = AttentionFieldProbe(streaming=True, rank=16, fold_every=4)
    run_probes(model, toks, [a], batch_size=4, progress=False)
    run_probes(model, toks, [b], batch_size=3, progress=False)
    merged = a.merge(b).result().scale_pod(n_heads=4)
    twice = run_probes(model, torch.cat([toks, toks]), [AttentionFieldProbe(streaming=True, rank=16)],
                       batch_size=5, progress=False)["attention_fields"].scale_pod(n_heads=4)
    _compare(twice, merged, rtol=1e-4)
    fresh = AttentionFieldProbe(streaming=True, rank=16)
    fresh.layers = a.layers
    with pytest.raises(ValueError, match="different passes"):
        fresh.merge(a)


def test_bad_arguments():
    with pytest.raises(ValueError, match="per_head=False"):
        AttentionFieldProbe(streaming=True, per_head=True)
    with pytest.raises(ValueError, match="rank must be"):
        AttentionFieldProbe(streaming=True, rank=0)
    with pytest.raises(ValueError, match="streaming=True only"):
        AttentionFieldProbe(options=ScalePODOptions(max_dominant=2))
    with pytest.raises(ValueError, match="streaming=True only"):
        AttentionFieldProbe(coherence_queries=4)
    with pytest.raises(ValueError, match="epsilon chooses no band window"):
        AttentionFieldProbe(streaming=True, options=ScalePODOptions(epsilon=0.2))
    with pytest.raises(ValueError, match="must be a ScalePODOptions"):
        AttentionFieldProbe(streaming=True, options={"max_dominant": 2})
    model = make_native(seed=3, n_ctx=16, n_layers=1)
    with pytest.raises(ValueError, match="full windows"):
        run_probes(model, [torch.arange(10), torch.arange(7)], [AttentionFieldProbe(streaming=True)],
                   progress=False)
    st = run_probes(model, _tokens(6, 16), [AttentionFieldProbe(streaming=True, rank=8)],
                    progress=False)["attention_fields"]
    with pytest.raises(ValueError, match="differs from the streaming probe"):
        st.scale_pod(n_heads=4, options=ScalePODOptions(max_dominant=1))


def test_band_options_dict_is_deprecated_for_options():
    """AttentionFieldProbe(band_options={...}) warns, naming options=ScalePODOptions(...) and
    coherence_queries=, and chooses exactly the windows those choose."""
    new = AttentionFieldProbe(streaming=True, coherence_queries=None,
                              options=ScalePODOptions(max_dominant=2, lag_window="absolute"))
    with pytest.deprecated_call(match=r"options=ScalePODOptions\(\.\.\.\), coherence_queries"):
        old = AttentionFieldProbe(streaming=True, band_options={
            "max_dominant": 2, "lag_window": "absolute", "coherence_queries": None})
    assert old.band_options == new.band_options and old.options == new.options
    with pytest.deprecated_call(), pytest.raises(ValueError, match="unknown band options"):
        AttentionFieldProbe(streaming=True, band_options={"epsilon": 0.1})
    with pytest.deprecated_call(), pytest.raises(ValueError, match="streaming=True only"):
        AttentionFieldProbe(band_options={"max_dominant": 2})


def test_streamed_contribution_field_equals_in_memory():
    """The streamed statistics work for every per-pair field: the contribution field streamed
    with a rank cap above the ensemble's rank equals its in-memory scale POD."""
    model = make_native(seed=4, n_ctx=32)
    toks = _tokens(12, 32, seed=2)
    mem = run_probes(model, toks, [AttentionFieldProbe(field="contribution")], batch_size=5,
                     progress=False)["contribution_fields"]
    st = run_probes(model, toks, [AttentionFieldProbe(field="contribution", streaming=True,
                                                      rank=16, fold_every=4)],
                    batch_size=5, progress=False)["contribution_fields"]
    assert isinstance(st, StreamedAttentionFields)
    for layer in mem.layers:
        torch.testing.assert_close(st.mean[str(layer)], mem.mean[str(layer)], rtol=1e-5, atol=1e-7)
    _compare(mem.scale_pod(n_heads=4), st.scale_pod(n_heads=4), rtol=1e-4)


def test_streaming_benchmark_line_in_the_doc_is_the_committed_summary():
    """docs/scale_pod.md quotes the benchmark's summary line verbatim from
    docs/results/streaming_scale/summary.json, and the records behind it are committed (a
    number in the docs comes from a committed results file)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = root / "docs" / "results" / "streaming_scale"
    line = (res / "summary.json").read_text().strip()
    assert line in (root / "docs" / "scale_pod.md").read_text(encoding="utf-8")
    s = json.loads(line)
    for n in s["n_docs"]:
        assert (res / "records" / f"stream_{n}_T{s['T']}_K{s['rank']}.json").is_file()
    ref = s["in_memory_ref"]["n_docs"]
    assert (res / "records" / f"memory_{ref}_T{s['T']}_K{s['rank']}.json").is_file()


@pytest.mark.parametrize("kind", ["causal", "max_lag", "bidirectional"])
def test_streamed_folds_the_causal_triangle_only(kind):
    """Causal fields are folded over their valid entries (τ <= i: T(T + 1)/2 of T² with every
    lag; with max_lag the band of lags kept), bidirectional ones over the whole rectangle;
    the figures equal the in-memory scale POD's, and the modes, scattered back into the
    rectangle, are zero above the diagonal."""
    T = 24
    model = make_native(seed=3, n_ctx=T, n_layers=2,
                        attention_dir="bidirectional" if kind == "bidirectional" else "causal")
    toks = _tokens(14, T, seed=4)
    kw = {"max_lag": 9} if kind == "max_lag" else {}
    mem = run_probes(model, toks, [AttentionFieldProbe(**kw)], batch_size=5,
                     progress=False)["attention_fields"]
    probe = AttentionFieldProbe(streaming=True, rank=20, fold_every=6, **kw)
    st = run_probes(model, toks, [probe], batch_size=5, progress=False)["attention_fields"]
    n_lags = int(st.lags.numel())
    want = {"causal": T * (T + 1) // 2, "max_lag": sum(min(i, 9) + 1 for i in range(T)),
            "bidirectional": T * n_lags}[kind]
    assert probe._pass1["0.full.W"].shape[1] == want
    assert st.pods["0.full"]["dim"] == T * n_lags  # reported in the rectangle, as before
    _compare(mem.scale_pod(n_heads=4), st.scale_pod(n_heads=4), rtol=1e-4)
    if kind != "bidirectional":
        modes = st.modes["0.full"].reshape(-1, T, n_lags)
        above = st.lags[None, :] > torch.arange(T)[:, None]
        assert modes.shape[0] > 0 and float(modes[:, above].abs().max()) == 0.0


def test_streamed_buffers_do_not_grow_with_n():
    """Memory-shape invariants: every factor buffer is allocated at its first batch for the
    rank cap and the largest pending block and never reallocated during its pass — the same
    storage after one batch and after all, and the same shapes for 24 and 72 documents; the
    whole field's buffer shrinks to its K factor rows for the second pass."""
    model = make_native(seed=3, n_ctx=16, n_layers=1)

    def shapes(N):
        probe = AttentionFieldProbe(streaming=True, rank=6, fold_every=4)
        seen: dict = {}
        stream = probe._stream

        def spy(layer, F, *a, **k):
            stream(layer, F, *a, **k)
            for prefix, fb in probe._fb.items():
                if (".full" in prefix) == (probe._phase == 0):  # the pass's buffers
                    seen.setdefault(prefix, set()).add((fb.buf.data_ptr(), tuple(fb.buf.shape)))

        probe._stream = spy
        run_probes(model, _tokens(N, 16, seed=N), [probe], batch_size=4, progress=False)
        assert all(len(v) == 1 for v in seen.values()), seen  # never reallocated
        assert tuple(probe._fb["0.full"].buf.shape) == (6, 16 * 17 // 2)  # pass 2: K rows
        return {k: next(iter(v))[1] for k, v in seen.items()}

    small, large = shapes(24), shapes(72)
    assert small == large and small["0.full"] == (6 + 4 - 1 + 4 + 2, 16 * 17 // 2)
    assert len(small) > 1 and all(s[0] == 15 for s in small.values())


def test_streaming_memory_lines_in_the_docs_are_the_committed_results():
    """docs/scale_pod.md quotes benchmarks/streaming_memory.py's lines verbatim from
    docs/results/benchmarks/streaming_memory*.json, and docs/probes.md points at them; the
    figures hold: the streamed peak is flat (<= 1.1x) from N = K on — at K = 128 over every N
    measured —, below the previous code's at every N, with the same eigenvalues."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = root / "docs" / "results" / "benchmarks"
    doc = (root / "docs" / "scale_pod.md").read_text(encoding="utf-8")
    lines = {n: (res / n).read_text().strip() for n in ("streaming_memory.json",
                                                         "streaming_memory_K128.json")}
    for line in lines.values():
        assert line in doc
    s = json.loads(lines["streaming_memory.json"])
    peak = s["after"]["peak_mib"]
    assert peak[-1] / peak[s["n_docs"].index(s["rank"])] <= 1.1
    assert all(a < b for a, b in zip(peak, s["before"]["peak_mib"]))
    assert s["eig_rel_diff"] <= 1e-5
    k128 = json.loads(lines["streaming_memory_K128.json"])
    assert k128["rank"] <= min(k128["n_docs"]) and k128["after"]["growth"] <= 1.1
    assert "docs/results/benchmarks/streaming_memory.json" in (
        root / "docs" / "probes.md").read_text(encoding="utf-8")
