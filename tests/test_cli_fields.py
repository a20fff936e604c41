"""``tl-spectral analyze --fields``: the scale-POD report of contribution / value-weighted
fields beside the attention fields (one pass), and its bad values as one-line errors."""

from __future__ import annotations

import pytest
from test_cli_errors import run_cli


@pytest.mark.parametrize("value, message", [
    ("contrib", "unknown field(s) ['contrib']"),
    ("attention,attention", "names a field twice"),
    (",", "unknown field(s) [',']"),
])
def test_bad_fields_are_one_line_exit_2(tmp_path, value, message):
    r = run_cli("analyze", "--model", "random", "--fields", value, "--out", str(tmp_path / "o"),
                cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_fields_need_the_scale_pod_section(tmp_path):
    r = run_cli("analyze", "--model", "random", "--sections", "attention_stats", "--fields",
                "contribution", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 2 and "add scale_pod to --sections" in r.stderr, r.stderr


def test_fields_reach_the_report_options(tmp_path, monkeypatch):
    """The CLI passes the checked list to the report (build_report stubbed: fast)."""
    import tl_spectral.viz.sections as sections
    from tl_spectral.cli import main

    seen = {}

    def fake_build_report(ctx, secs, **kw):
        seen["fields"] = ctx.options["fields"]
        seen["keys"] = [s.key for s in secs]
        (ctx.out_dir / "index.html").write_text("stub")

    monkeypatch.setattr(sections, "build_report", fake_build_report)
    assert main(["analyze", "--model", "random", "--n-docs", "2", "--length", "16", "--out",
                 str(tmp_path / "rep"), "--no-progress", "--sections", "scale_pod",
                 "--fields", " attention, contribution ,value_weighted"]) == 0
    assert seen == {"fields": ["attention", "contribution", "value_weighted"],
                    "keys": ["scale_pod"]}


def test_contribution_field_section_in_the_report(tmp_path):
    import torch
    from conftest import make_native

    from tl_spectral.model_view import ModelView
    from tl_spectral.results import Result
    from tl_spectral.viz.scale_pod_section import ScalePODSection
    from tl_spectral.viz.sections import ReportContext, build_report

    view = ModelView(make_native(n_layers=2, seed=3, n_ctx=32))
    toks = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(0))
    ctx = ReportContext(view=view, tokens=toks, tokenizer=None, out_dir=tmp_path,
                        results_dir=tmp_path / "results",
                        options={"fields": ["attention", "contribution"]})
    ctx.results_dir.mkdir()
    build_report(ctx, [ScalePODSection()], progress=False)
    index = (tmp_path / "index.html").read_text()
    assert "Scale-selective POD of attention fields" in index
    assert "Scale-selective POD of contribution fields" in index
    assert "Scales of the contribution fields" in index
    att = Result.load(tmp_path / "results" / "scale_pod.safetensors")
    con = Result.load(tmp_path / "results" / "scale_pod_contribution.safetensors")
    assert att.n_layers == con.n_layers == 2
    # different fields, different spectra
    a, c = att.layers[1].full_eigenvalues, con.layers[1].full_eigenvalues
    assert a.shape != c.shape or not torch.allclose(a, c)


@pytest.mark.parametrize("value, message", [
    ("contribution,attention", "attention first"),
    ("attention,contrib", "pass distinct fields of attention"),
])
def test_study_fields_errors(tmp_path, value, message):
    """`tl-spectral study scale-pod --fields` (the field comparison) refuses bad lists early."""
    r = run_cli("study", "scale-pod", "--fields", value, "--out", str(tmp_path / "o"),
                cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_report_options_are_typed_and_every_one_is_set_by_the_cli_and_read():
    """ReportOptions: every field is set by `tl-spectral analyze` and read by the report;
    a dict of its names converts, an unknown name is refused."""
    import dataclasses
    import inspect
    import re
    from pathlib import Path

    from tl_spectral.viz.context import ReportContext, ReportOptions

    names = {f.name for f in dataclasses.fields(ReportOptions)}
    root = Path(__file__).resolve().parents[1] / "tl_spectral"
    cli = (root / "cli.py").read_text(encoding="utf-8")
    report = "".join(p.read_text(encoding="utf-8") for p in (root / "viz").glob("*.py")
                     if p.name != "context.py") + inspect.getsource(ReportContext)
    for n in names:
        assert re.search(rf"\b{n}=", cli), f"{n} is never set by the CLI"
        assert re.search(rf"options\.{n}\b", report), f"{n} is never read"
    o = ReportOptions.of({"fields": ["attention"], "save_raw": True})
    assert o.fields == ["attention"] and o["save_raw"] is True and o.get("stream_rank", 3) == 3
    with pytest.raises(ValueError, match="unknown report options"):
        ReportOptions.of({"surgery_docs": 4})
