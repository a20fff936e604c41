"""Token files: exact round trip, the same windows as document_windows, lazy reading."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.data import CharTokenizer, document_windows, tiny_shakespeare
from tl_spectral.data.tokenfile import TokenFile, write_token_file


def test_same_windows_as_document_windows(tmp_path):
    text = tiny_shakespeare()[:60_000]
    tok = CharTokenizer.from_text(text)
    path = write_token_file(tmp_path / "t.tok", [tok.encode(text)], model="m", vocab_size=tok.vocab_size)
    tf = TokenFile(path)
    assert tf.n_docs == 1 and tf.model == "m" and tf.vocab_size == tok.vocab_size
    for seed, overlap in ((0, False), (3, False), (1, True)):
        ref = document_windows(text, tok, 50, 64, seed=seed, overlap=overlap)
        lazy = tf.windows(50, 64, seed=seed, overlap=overlap)
        assert torch.equal(lazy.starts, ref.starts)
        assert torch.equal(lazy.tokens, ref.tokens)
        assert torch.equal(lazy.batch(7, 19), ref.tokens[7:19])
        assert torch.equal(lazy[3], ref.tokens[3]) and torch.equal(lazy[2:5, :4], ref.tokens[2:5, :4])
        assert lazy.shape == ref.tokens.shape


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=6), length=st.integers(2, 9),
       seed=st.integers(0, 50), overlap=st.booleans())
def test_multi_document_windows_stay_inside_documents(tmp_path_factory, lens, length, seed, overlap):
    """Round trip of the ids; every window lies inside one document; the windows are the
    brute-force enumeration's, drawn with the same generator calls."""
    g = np.random.default_rng(seed)
    docs = [g.integers(0, 70_000 if seed % 2 else 300, n) for n in lens]
    path = tmp_path_factory.mktemp("tf") / "x.tok"
    if sum(lens) == 0:
        with pytest.raises(ValueError, match="no tokens"):
            write_token_file(path, docs)
        return
    tf = TokenFile(write_token_file(path, docs))
    assert tf.header["dtype"] == ("uint32" if max(int(d.max()) for d in docs if d.size) >= 1 << 16 else "uint16")
    for d, doc in enumerate(docs):
        assert np.array_equal(np.asarray(tf.document(d)), doc)
    # brute force: every admissible window start, document by document
    if overlap:
        cand = [int(tf.offsets[d]) + s for d, n in enumerate(lens) for s in range(n - length + 1)]
    else:
        cand = [int(tf.offsets[d]) + k * length for d, n in enumerate(lens) for k in range(n // length)]
    n_want = 5
    if not cand or (not overlap and len(cand) < n_want):
        with pytest.raises(ValueError):
            tf.windows(n_want, length, seed=seed, overlap=overlap)
        return
    w = tf.windows(n_want, length, seed=seed, overlap=overlap)
    gen = torch.Generator().manual_seed(seed)
    if overlap:
        idx = torch.randint(0, len(cand), (n_want,), generator=gen)
    else:
        idx = torch.randperm(len(cand), generator=gen)[:n_want].sort().values
    assert w.starts.tolist() == [cand[i] for i in idx.tolist()]
    flat = np.concatenate(docs)
    for i, s in enumerate(w.starts.tolist()):
        assert np.array_equal(w[i].numpy(), flat[s:s + length])


def test_refuses_overwrite_and_bad_files(tmp_path):
    p = write_token_file(tmp_path / "a.tok", [[1, 2, 3]])
    with pytest.raises(FileExistsError, match="overwrite"):
        write_token_file(p, [[4, 5]])
    assert TokenFile(p).n_tokens == 3
    write_token_file(p, [[4, 5]], overwrite=True)
    assert TokenFile(p).n_tokens == 2
    bad = tmp_path / "b.tok"
    bad.write_bytes(b"not a token file at all")
    with pytest.raises(ValueError, match="not a tl_spectral token file"):
        TokenFile(bad)
    raw = p.read_bytes()
    (tmp_path / "c.tok").write_bytes(raw[: len(raw) - 9])
    with pytest.raises(ValueError, match="truncated"):
        TokenFile(tmp_path / "c.tok")
    with pytest.raises(ValueError, match="negative"):
        write_token_file(tmp_path / "d.tok", [[1, -2]])


def test_run_probes_reads_lazily(tmp_path):
    """run_probes on lazy windows equals run_probes on the same windows in memory, and
    reads only a batch at a time."""
    from conftest import make_native

    from tl_spectral.probes import AttentionStatsProbe, run_probes

    ids = torch.randint(0, 50, (2000,), generator=torch.Generator().manual_seed(0))
    tf = TokenFile(write_token_file(tmp_path / "r.tok", [ids]))
    w = tf.windows(9, 16, seed=2)
    calls = []
    orig = w.batch
    w.batch = lambda lo, hi: (calls.append(hi - lo), orig(lo, hi))[1]  # type: ignore[method-assign]
    model = make_native(seed=1, n_ctx=16)
    lazy = run_probes(model, w, [AttentionStatsProbe()], batch_size=4, progress=False)["attention_stats"]
    assert max(calls) <= 4 and sum(calls) == 9
    mem = run_probes(model, orig(0, 9), [AttentionStatsProbe()], batch_size=4, progress=False)["attention_stats"]
    torch.testing.assert_close(lazy.entropy, mem.entropy)
    torch.testing.assert_close(lazy.mean_pattern, mem.mean_pattern)
