"""Issue 30 items 8 and 10: token files refuse ids they would wrap or that the vocabulary
lacks, a crafted header is a clear ValueError (fuzzed), files get the umask's mode, a killed
or failed writer leaves nothing behind (or the next write removes it), and --tokens matches
a model folder however it is spelled."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tl_spectral.data.tokenfile import MAGIC, TokenFile, write_token_file


@pytest.mark.parametrize("doc,vocab,msg", [
    ([1, 2**32], None, "2\\*\\*32|4294967296"), (np.array([1, 2**40]), None, "1099511627776"),
    ([2**64 - 1], None, "18446744073709551615"), ([1, 70], 64, "vocab_size=64"),
    (torch.tensor([0.5, 1.0]), None, "float"), (np.array([1.0]), None, "float"),
    (torch.tensor([True]), None, "bool")])
def test_ids_that_would_wrap_or_lie_outside_the_vocabulary(tmp_path, doc, vocab, msg):
    with pytest.raises(ValueError, match=msg):
        write_token_file(tmp_path / "t.tok", [[1, 2], doc], vocab_size=vocab)
    assert os.listdir(tmp_path) == []


def test_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        p = write_token_file(tmp_path / "t.tok", [[1, 2, 3]])
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o640


def test_a_failure_while_finishing_removes_both_temporary_files(tmp_path, monkeypatch):
    real = os.replace

    def disk_full(a, b):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_token_file(tmp_path / "t.tok", [[1, 2, 3]])
    monkeypatch.setattr(os, "replace", real)
    assert os.listdir(tmp_path) == []


_KILLED = """
import os, signal, sys
from tl_spectral.data.tokenfile import write_token_file
os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
write_token_file(sys.argv[1], [[1, 2, 3]])
"""


def test_sigkill_leftovers_are_removed_by_the_next_write(tmp_path):
    out = tmp_path / "x.tok"
    r = subprocess.run([sys.executable, "-c", _KILLED, str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    left = sorted(p.name.split("-")[0] for p in tmp_path.iterdir())
    assert left == [".x.tok.ids", ".x.tok.tmp"]
    mine = tmp_path / f".x.tok.ids-{os.getpid()}-alive"  # a live writer's: kept
    mine.write_text("")
    other = tmp_path / ".x.tok.ids-notapid"  # not provably ours: kept
    other.write_text("")
    write_token_file(out, [[4, 5]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x.tok", mine.name, other.name])
    assert TokenFile(out).n_tokens == 2


def _write_raw(path, header, body=b"\0" * 64, hlen=None):
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(hb) if hlen is None else hlen
    path.write_bytes(MAGIC + np.uint64(n).astype("<u8").tobytes() + hb + body)


def _valid_header(tmp_path):
    p = write_token_file(tmp_path / "ok.tok", [[1, 2, 3], [4, 5]])
    return json.loads(p.read_bytes()[16:16 + int(np.frombuffer(p.read_bytes()[8:16], "<u8")[0])])


@pytest.mark.parametrize("change", [
    {"n_tokens": None}, {"n_docs": -1}, {"n_docs": 0}, {"version": [1]}, {"version": True},
    {"ids_offset": -8}, {"ids_offset": 0}, {"ids_offset": 8}, {"offsets_offset": -1},
    {"n_tokens": 10**30}, {"n_tokens": "5"}, {"dtype": ["uint16"]}, {"model": {"a": 1}},
    {"vocab_size": -3}, {"n_docs": 1.5}])
def test_crafted_headers_are_clear_errors(tmp_path, change):
    h = _valid_header(tmp_path)
    for k, v in change.items():
        if v is None:
            h.pop(k)
        else:
            h[k] = v
    _write_raw(tmp_path / "bad.tok", h)
    with pytest.raises(ValueError, match="bad.tok"):
        TokenFile(tmp_path / "bad.tok")


def test_deeply_nested_header_is_a_clear_error(tmp_path):
    _write_raw(tmp_path / "deep.tok", b"[" * 100_000)
    with pytest.raises(ValueError, match="corrupt token file header"):
        TokenFile(tmp_path / "deep.tok")


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                     | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                        max_size=3),
                     max_leaves=6)
_KEYS = ["format", "version", "dtype", "n_tokens", "n_docs", "ids_offset", "offsets_offset",
         "model", "vocab_size"]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.dictionaries(st.sampled_from(_KEYS), _json | st.just("<drop>"), max_size=3),
       body=st.binary(max_size=80), hlen_delta=st.integers(-4, 4))
def test_fuzzed_headers_open_or_raise_value_error(tmp_path, edits, body, hlen_delta):
    h = {"format": "tl_spectral.tokens", "version": 1, "dtype": "uint16", "n_tokens": 5,
         "n_docs": 2, "ids_offset": 160, "offsets_offset": 176, "model": "m",
         "vocab_size": 6}
    for k, v in edits.items():
        if v == "<drop>":
            h.pop(k, None)
        else:
            h[k] = v
    hb = json.dumps(h).encode()
    p = tmp_path / "fuzz.tok"
    _write_raw(p, hb, body=body, hlen=max(0, len(hb) + hlen_delta))
    try:
        tf = TokenFile(p)
    except ValueError:
        return
    # opened: what it says is consistent with the file
    assert tf.offsets[0] == 0 and tf.offsets[-1] == tf.n_tokens == len(tf.ids)


def test_tokens_match_a_model_folder_however_spelled(tmp_path, monkeypatch):
    from tl_spectral.cli import UsageError, open_token_file

    m = tmp_path / "m"
    m.mkdir()
    p = write_token_file(tmp_path / "t.tok", [[1, 2, 3]], model=str(m.resolve()))
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    assert open_token_file(str(p), "../m").model == str(m.resolve())
    assert open_token_file(str(p), str(m) + "/").n_tokens == 3
    with pytest.raises(UsageError, match="tokenized for"):
        open_token_file(str(p), "./other")
    with pytest.raises(UsageError, match="tokenized for"):
        open_token_file(str(p), "char-shakespeare")


def test_tokenize_refuses_a_symlink(tmp_path, capsys):
    from tl_spectral.cli import main

    (tmp_path / "real.tok").write_text("mine")
    (tmp_path / "link.tok").symlink_to(tmp_path / "real.tok")
    assert main(["tokenize", "shakespeare", "--model", "char-shakespeare", "-o",
                 str(tmp_path / "link.tok"), "--overwrite"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert (tmp_path / "link.tok").is_symlink()
    assert (tmp_path / "real.tok").read_text() == "mine"
