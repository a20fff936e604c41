"""The CLI report and the quickstart demo, end to end (small sizes)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_analyze_random_model_offline_report(tmp_path):
    from tl_spectral.cli import main

    out = tmp_path / "rep"
    rc = main(["analyze", "--model", "random", "--n-docs", "4", "--length", "64", "--out",
               str(out), "--no-progress", "--sections", "attention_stats"])
    assert rc == 0
    index = (out / "index.html").read_text()
    assert "Attention statistics" in index and "data:image/png;base64," in index
    # one self-contained page: the views (every layer of the 6-layer random model × 3
    # documents, behind the document and layer selectors) are inlined as JSON and rendered
    # lazily by one function (bundle once), no iframe to lose
    assert index.count('class="cvview"') == 18 and index.count("CircuitsVis.render(") == 1
    assert "<iframe" not in index
    assert "unpkg.com" not in index
    views = list((out / "views").glob("*.html"))
    assert views, "circuitsvis view missing"
    v = views[0].read_text()
    assert "CircuitsVis" in v and "unpkg.com" not in v and "cdn." not in v.lower()[:5000]
    # the standalone pages share one copy of the bundle beside them
    assert "<script src='circuitsvis.js'>" in v and "var CircuitsVis" not in v
    assert "var CircuitsVis" in (out / "views" / "circuitsvis.js").read_text()
    assert (out / "results" / "attention_stats.safetensors").exists()


def test_analyze_errors(tmp_path, capsys):
    from tl_spectral.cli import main

    def err(argv):
        assert main(argv) == 2
        return capsys.readouterr().err

    assert "context" in err(["analyze", "--model", "random", "--length", "999", "--out",
                             str(tmp_path / "a")])
    assert "unknown sections" in err(["analyze", "--model", "random", "--n-docs", "2",
                                      "--length", "32", "--sections", "nope", "--out",
                                      str(tmp_path / "b")])
    assert "missing.txt" in err(["analyze", "--model", "random", "--corpus",
                                 str(tmp_path / "missing.txt"), "--out", str(tmp_path / "c")])


def test_cli_help_runs():
    r = subprocess.run([sys.executable, "-m", "tl_spectral.cli", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "analyze" in r.stdout


def test_quickstart_demo_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKSTART_N_DOCS", "8")
    monkeypatch.setattr(sys, "argv", ["quickstart.py", str(tmp_path)])
    runpy.run_path(str(ROOT / "demos" / "quickstart.py"), run_name="__main__")
    assert (tmp_path / "attention_stats.png").exists()
    assert (tmp_path / "attention_stats.safetensors").exists()


def test_analyze_scale_pod_section(tmp_path):
    from tl_spectral.cli import main
    from tl_spectral.results import Result

    out = tmp_path / "rep"
    assert main(["analyze", "--model", "random", "--n-docs", "4", "--length", "32", "--out",
                 str(out), "--no-progress", "--sections", "scale_pod"]) == 0
    index = (out / "index.html").read_text()
    assert "Scale-selective POD" in index and "head allocation" in index
    pod = Result.load(out / "results" / "scale_pod.safetensors")
    assert pod.n_layers == 6 and sum(r["recommended"] for r in pod.allocation) == 48


def test_train_command_runs_and_resumes(tmp_path):
    """`tl-spectral train --config FILE` trains, checkpoints, and resumes from the checkpoint."""
    import json

    from tl_spectral.cli import main

    cfg = {
        "name": "tiny",
        "model": {"vocab_size": "auto", "n_layers": 1, "n_heads": 2, "d_model": 16, "d_head": 8,
                  "n_ctx": 32, "d_mlp": 32, "normalization": "ln", "attention": "softmax"},
        "data": {"corpus": "tiny_shakespeare", "tokenizer": "char", "val_fraction": 0.1},
        "train": {"steps": 4, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "eval_every": 2,
                  "eval_windows": 4, "checkpoint_every": 2, "out_dir": str(tmp_path / "run"),
                  "seed": 0, "num_threads": 1, "progress": False, "log_every": 1},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(path), "--no-progress"]) == 0
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts and ckpts[-1].name.endswith("4")
    # a second call resumes from the last checkpoint instead of starting over
    assert main(["train", "--config", str(path), "--no-progress", "--steps", "6"]) == 0
    assert sorted((tmp_path / "run" / "checkpoints").iterdir())[-1].name.endswith("6")
