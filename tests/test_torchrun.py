"""tl-spectral tokenize / analyze --tokens, and analyze under torchrun (2 gloo processes):
the report's results equal one process's (the streamed scale POD: its sums all-reduced, its
factor rows and buffered fields all-gathered; tests/test_distributed.py covers the other
probes' reductions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tl_spectral.cli import main
from tl_spectral.data import tiny_shakespeare
from tl_spectral.data.tokenfile import TokenFile
from tl_spectral.results import Result

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--model", "random", "--n-docs", "10", "--length", "32", "--batch-size", "3",
        "--sections", "scale_pod", "--stream-rank", "12", "--no-progress"]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    text = d / "part.txt"
    text.write_text(tiny_shakespeare()[:20_000], encoding="utf-8")
    out = d / "part.tok"
    assert main(["tokenize", str(text), "--model", "random", "-o", str(out)]) == 0
    return out


def test_tokenize_errors(token_file, tmp_path, capsys):
    assert TokenFile(token_file).n_tokens == 20_000
    assert main(["tokenize", str(tmp_path / "missing.txt"), "--model", "random", "-o",
                 str(tmp_path / "x.tok")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["tokenize", "shakespeare", "--model", "random", "-o", str(token_file)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["tokenize", "shakespeare", "--model", "random", "-o", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["analyze", "--tokens", str(token_file), "--corpus", "shakespeare"]) == 2
    assert "either --corpus or --tokens" in capsys.readouterr().err
    assert main(["analyze", "--tokens", str(token_file), "--model", "char-shakespeare"]) == 2
    assert "tokenized for --model random" in capsys.readouterr().err
    bad = tmp_path / "bad.tok"
    bad.write_bytes(b"garbage")
    assert main(["analyze", "--model", "random", "--tokens", str(bad)]) == 2
    assert "not a tl_spectral token file" in capsys.readouterr().err
    assert main(["analyze", "--model", "random", "--tokens", str(token_file), "--n-docs", "900",
                 "--length", "32", "--out", str(tmp_path / "r")]) == 2
    assert "disjoint windows" in capsys.readouterr().err
    # a start-token model: token-file windows are not framed with BOS, refused before loading
    bos_file = tmp_path / "bos.tok"
    text = tmp_path / "bos.txt"
    text.write_text(tiny_shakespeare()[:5_000], encoding="utf-8")
    assert main(["tokenize", str(text), "--model", "char-shakespeare-bos", "-o",
                 str(bos_file)]) == 0
    assert main(["analyze", "--model", "char-shakespeare-bos", "--tokens", str(bos_file),
                 "--n-docs", "2", "--length", "32", "--out", str(tmp_path / "rb")]) == 2
    assert "start token" in capsys.readouterr().err


def test_torchrun_two_processes_equal_one(token_file, tmp_path):
    one = tmp_path / "one"
    assert main(["analyze", "--tokens", str(token_file), *ARGS, "--out", str(one)]) == 0
    two = tmp_path / "two"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tl_spectral", "analyze", "--tokens", str(token_file), *ARGS, "--out", str(two)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (two / "index.html").is_file()
    assert '"processes": 2' in (two / ".tl_spectral_report.json").read_text()
    pa = Result.load(one / "results" / "scale_pod.safetensors")
    pb = Result.load(two / "results" / "scale_pod.safetensors")
    for la, lb in zip(pa.layers, pb.layers):
        assert la.dominant_scales == lb.dominant_scales
        assert la.full["H_star_str"] == lb.full["H_star_str"]
        torch.testing.assert_close(lb.full_eigenvalues, la.full_eigenvalues, rtol=1e-5, atol=1e-12)
        for k in la.band_eigenvalues:
            torch.testing.assert_close(lb.band_eigenvalues[k], la.band_eigenvalues[k], rtol=1e-5,
                                       atol=1e-12)
        torch.testing.assert_close(lb.scale_energy, la.scale_energy, rtol=1e-6, atol=1e-12)
