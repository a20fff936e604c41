"""The study figures in the docs: every image reference points to a file, and the figure
functions redraw what the committed results hold (tl_spectral_studies.routing.figures_from_dir,
tl_spectral_studies.surgery.figures_from_results)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def _image_refs() -> list[tuple[str, str]]:
    refs = []
    for md in sorted(DOCS.glob("*.md")):
        refs += [(md.name, m) for m in IMAGE.findall(md.read_text(encoding="utf-8"))
                 if not m.startswith(("http://", "https://"))]
    return refs


def test_docs_have_image_references():
    assert len(_image_refs()) > 10  # the pattern finds the figures (the check below can fail)


@pytest.mark.parametrize("doc,ref", _image_refs())
def test_every_docs_image_exists(doc, ref):
    assert (DOCS / ref).is_file(), f"docs/{doc} shows {ref}, which does not exist"


def test_routing_figures_from_committed_results(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from tl_spectral_studies import routing

    paths = routing.figures_from_dir(DOCS / "results" / "routing", tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["routing_ablations.png", "routing_qk_geometry.png",
                     "routing_sd_geometry.png"]  # no cascade files are committed
    assert all((tmp_path / n).stat().st_size > 10_000 for n in names)
    import json

    cap = routing.figure_caption(json.loads(
        (DOCS / "results" / "routing" / "summary.json").read_text()))
    assert "64 × 256" in cap and "seed: not recorded" in cap and "shipped models only" in cap
    assert "char-shakespeare (2600 steps)" in cap


def test_surgery_figures_from_committed_results(tmp_path):
    pytest.importorskip("matplotlib")
    from tl_spectral_studies import surgery

    paths = surgery.figures_from_results(DOCS / "results" / "surgery", tmp_path)
    names = {p.name for p in paths}
    expected = {"surgery_collapse_final.png", "surgery_params_vs_ppl_all.png",
                "surgery_allocation.png", "surgery_params_vs_ppl.png",
                *(f"surgery_collapse_step{s}.png" for s in (300, 400, 500, 1000)),
                *(f"surgery_allocation{t}.png" for t in ("_long", "_sd", "_sdS")),
                *(f"surgery_params_vs_ppl{t}.png" for t in ("_long", "_sd", "_sdS"))}
    assert names == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
    # every redrawn figure is one the docs show or keep in docs/figures
    assert all((DOCS / "figures" / n).is_file() for n in names)
