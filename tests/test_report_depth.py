"""The report at real depth: a random-weight Llama-style model shaped like SmolLM2-135M
(30 layers, 9 query / 3 key-value heads, d_model 576, RoPE; small MLP and vocabulary) saved
to a temporary folder and analysed through ``tl-spectral analyze --model PATH`` (issue 25
item 3, issue 32 item 2): one figure per kind whatever the depth, heads-by-layer maps with
30 rows, views of every layer behind selectors 0 → 29 with the layers that matter marked,
the offset-resolved rotary geometry in the routing section, the title from the model's
config, the folder within 15 MB. The timing target lives in benchmarks/report_stages.py
(no test depends on timing)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def deep_report(tmp_path_factory):
    from _tiny_hf import save_smol_shape

    from tl_spectral.cli import main

    folder = save_smol_shape(tmp_path_factory.mktemp("hf") / "smol30", d_mlp=64)
    out = tmp_path_factory.mktemp("rep") / "r"
    assert main(["analyze", "--model", str(folder), "--n-docs", "4", "--length", "48",
                 "--out", str(out), "--no-progress"]) == 0
    return out


def test_report_at_30_layers(deep_report):
    html = (deep_report / "index.html").read_text()
    # the title from the model's config, not only the folder's name
    assert "<title>tl_spectral report — smol30 (LlamaForCausalLM)</title>" in html
    # one figure per kind: as many images as at 6 layers (tests/test_report.py), no
    # per-layer figure sets
    assert html.count("<img") <= 24 and 'class="figset"' not in html
    # every layer's views behind selectors 0 → 29, 2 documents (270 heads), lazily rendered
    sets = re.findall(r'<figure class="viewset".*?</figure>', html, re.S)
    assert len(sets) == 2
    for fs in sets:
        layer_sel = re.search(r'data-dim="1".*?</select>', fs, re.S).group(0)
        assert re.findall(r'<option value="(\d+)"', layer_sel) == [str(i) for i in range(30)]
        doc_sel = re.search(r'data-dim="0".*?</select>', fs, re.S).group(0)
        assert len(re.findall("<option", doc_sel)) == 2
        assert fs.count('class="cvview"') == 60
    assert "most focused head" in sets[0]
    # routing: the offset-resolved rotary geometry, not "could not be computed"
    assert "could not be computed" not in html
    assert "M(Δ) = W_Q R(Δ) W_Kᵀ" in html and "averaged over the causal offsets" in html
    assert (deep_report / "results" / "rotary_qk_geometry_heads.csv").is_file()
    # untrained: a random-weight model says so in its first finding
    findings = json.loads((deep_report / "report.json").read_text())["findings"]
    assert "looks untrained" in findings[0]
    size = sum(p.stat().st_size for p in deep_report.rglob("*") if p.is_file()) / 1e6
    assert size <= 15, size


def test_heads_by_layer_maps_have_a_row_per_layer():
    import numpy as np

    from tl_spectral.viz.multiples import heads_by_layer_figure

    fig = heads_by_layer_figure([{"values": np.random.rand(30, 9), "title": "t", "vmin": 0.0,
                                  "vmax": 1.0}], list(range(30)))
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (30, 9)
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(30)]
    assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 8
