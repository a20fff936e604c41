"""What AttentionFieldProbe keeps (issue 42): no per-layer pair counts for full windows, the
causal sum as its triangle, the first batch kept without a copy — and the same mean, fields
and counts as a brute force from the kept fields and the documents' masks."""

from __future__ import annotations

import pytest
import torch
from conftest import make_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl_spectral.probes import ContributionProbe, SinkProbe, run_probes
from tl_spectral.probes.fields import AttentionFieldProbe


@pytest.fixture(scope="module")
def causal_model():
    return make_native(n_layers=2, seed=7, n_ctx=32)


@pytest.fixture(scope="module")
def bidir_model():
    return make_native(n_layers=2, seed=8, n_ctx=32, attention_dir="bidirectional")


def brute_mean(res, layer: int) -> torch.Tensor:
    """``Σ_s F_s(i, τ) / #{s: query i and its key at lag τ are real}`` (0 where none), from
    the result's own fields and document mask: an independent count."""
    F = res.fields[str(layer)].double()
    m = res.doc_mask.bool()
    T = m.shape[1]
    i = torch.arange(T)[:, None]
    j = i - res.lags[None, :] if res.causal else i + res.lags[None, :]
    inside = (j >= 0) & (j < T)
    key_real = m[:, j.clamp(0, T - 1)] & inside[None]
    pair = (m[:, :, None] & key_real).double()  # [N, T, n_lags]
    cnt = pair.sum(0)
    if res.per_head:
        pair = pair[:, None]
    total = (F * pair).sum(0)
    return torch.where(cnt > 0, total / cnt.clamp_min(1), 0.0)


def _docs(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50, (n,), generator=g) for n in lengths]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(3, 12), min_size=2, max_size=5),
       batch=st.integers(1, 3), max_lag=st.one_of(st.none(), st.integers(0, 2)),
       per_head=st.booleans(), causal=st.booleans(), seed=st.integers(0, 99))
def test_mean_equals_brute_force(causal_model, bidir_model, lengths, batch, max_lag, per_head,
                                 causal, seed):
    model = causal_model if causal else bidir_model
    probe = AttentionFieldProbe(max_lag=max_lag, per_head=per_head)
    res = run_probes(model, _docs(lengths, seed), [probe], batch_size=batch,
                     progress=False)["attention_fields"]
    for layer in (0, 1):
        torch.testing.assert_close(res.mean[str(layer)].double(), brute_mean(res, layer),
                                   atol=1e-6, rtol=1e-6)
    # result() leaves the state as it was: a second call gives the same numbers
    again = probe.result()
    for layer in (0, 1):
        assert torch.equal(again.mean[str(layer)], res.mean[str(layer)])


def test_runs_of_two_lengths_accumulate_to_the_brute_force_mean(causal_model):
    """Full windows of 6 and then of 10 tokens (accumulate=True): the counts of each length
    add up, as if the short windows were padded."""
    probe = AttentionFieldProbe()
    run_probes(causal_model, torch.stack(_docs([6] * 3, 1)), [probe], batch_size=2,
               progress=False)
    run_probes(causal_model, torch.stack(_docs([10] * 2, 2)), [probe], batch_size=2,
               progress=False, accumulate=True)
    res = probe.result()
    assert res.n_docs == 5 and res.fields["0"].shape == (5, 10, 10)
    assert res.doc_mask[:3].sum(1).tolist() == [6, 6, 6]
    for layer in (0, 1):
        torch.testing.assert_close(res.mean[str(layer)].double(), brute_mean(res, layer),
                                   atol=1e-6, rtol=1e-6)


def test_full_windows_keep_no_counts_and_a_triangle_sum(causal_model):
    T = 16
    toks = torch.randint(0, 50, (3, T), generator=torch.Generator().manual_seed(0))
    probe = AttentionFieldProbe()
    run_probes(causal_model, toks, [probe], batch_size=2, progress=False)
    keys = set(probe.state)
    assert not any(k.endswith(".count") or k.endswith(".sum") for k in keys)
    for layer in (0, 1):
        assert probe.state[f"{layer}.sum_tri"].shape == (T * (T + 1) // 2,)
        assert probe.state[f"{layer}.n_full"].tolist() == [0.0] * (T - 1) + [3.0]
    # everything but the fields themselves: the triangle, n_full, the masks
    kept = sum(v.numel() * v.element_size() for k, v in probe.state.items()
               if not k.endswith(".fields"))
    fields = sum(v.numel() * v.element_size() for k, v in probe.state.items()
                 if k.endswith(".fields"))
    assert fields == 2 * 3 * T * T * 4
    assert kept < 2 * (T * (T + 1) // 2 * 4 + T * 8) + 3 * T * 2 + 64


def test_the_first_batch_is_kept_without_a_copy_and_later_ones_append(causal_model):
    toks = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(3))
    one = AttentionFieldProbe()
    r1 = run_probes(causal_model, toks, [one], batch_size=3, progress=False)
    many = AttentionFieldProbe()
    r3 = run_probes(causal_model, toks, [many], batch_size=1, progress=False)
    for layer in ("0", "1"):
        torch.testing.assert_close(r1["attention_fields"].fields[layer],
                                   r3["attention_fields"].fields[layer], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(r1["attention_fields"].mean[layer],
                                   r3["attention_fields"].mean[layer], atol=1e-6, rtol=1e-6)


def test_weight_probes_hold_one_layer_of_w_o(causal_model):
    """ContributionProbe and SinkProbe keep the current layer's W_O only, not one per layer
    for the whole run; two batches give the same numbers as one."""
    toks = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(5))
    c, s = ContributionProbe(), SinkProbe()
    one = run_probes(causal_model, toks, [c, s], batch_size=4, progress=False)
    assert len(c._W) <= 1 and len(s._W) <= 1
    two = run_probes(causal_model, toks, [ContributionProbe(), SinkProbe()], batch_size=2,
                     progress=False)
    for name in one:
        a, b = one[name], two[name]
        for k, v in vars(a).items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                torch.testing.assert_close(v, vars(b)[k], atol=1e-5, rtol=1e-5)


def test_release_free_heap_gives_freed_pages_back():
    """After a burst of freed buffers below a live one, glibc's heap keeps their pages;
    release_free_heap() returns them (the resident set drops). Skipped without glibc."""
    import sys

    from tl_spectral.probes.heap import _trim, release_free_heap

    if _trim() is None or not sys.platform.startswith("linux"):
        pytest.skip("no glibc malloc_trim here")

    def rss_kib() -> int:
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS:"))

    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size, n = 64 * 1024, 800  # 50 MiB in chunks below glibc's mmap threshold: in the heap
    blocks = [libc.malloc(size) for _ in range(n)]
    for b in blocks:
        libc.memset(b, 1, size)
    keep = libc.malloc(size)  # a live block above them: the heap top cannot shrink
    libc.memset(keep, 1, size)
    for b in blocks:
        libc.free(b)
    before = rss_kib()
    release_free_heap()
    after = rss_kib()
    libc.free(keep)
    assert before - after > 30 * 1024  # most of the 50 MiB went back


def test_pair_counts_equal_the_brute_force_counts(causal_model):
    docs = _docs([9, 5, 9, 7], 4)
    probe = AttentionFieldProbe(max_lag=3)
    res = run_probes(causal_model, docs, [probe], batch_size=2, progress=False)[
        "attention_fields"]
    m = res.doc_mask.bool()
    T = m.shape[1]
    i = torch.arange(T)[:, None]
    j = i - res.lags[None, :]
    real = m[:, :, None] & m[:, j.clamp(0, T - 1)] & (j >= 0)[None]
    for layer in (0, 1):
        assert torch.equal(probe.pair_counts(layer), real.sum(0).float())


def test_the_pass_trims_once_per_trim_bytes_of_patterns(monkeypatch):
    from tl_spectral.probes import heap

    calls = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: calls.append(1) or True)
    counter = [0]
    step = heap.TRIM_BYTES // 4 + 1
    for _ in range(7):
        heap.note_freed(counter, step)
    assert len(calls) == 1  # after the 4th layer (4 × step ≥ TRIM_BYTES), none since
    assert counter[0] == 3 * step
