"""The analyze report's structure: one self-contained page, findings with links, every
column defined, slim results (raw maps only with --save-raw), encoder windows framed by the
model's special tokens, the model's name as title."""

from __future__ import annotations

import re
from argparse import Namespace
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def random_report(tmp_path_factory) -> Path:
    from tl_spectral.cli import main

    out = tmp_path_factory.mktemp("rep") / "r"
    assert main(["analyze", "--model", "random", "--n-docs", "4", "--length", "32", "--out",
                 str(out), "--no-progress"]) == 0
    return out


def test_page_is_self_contained_with_findings_and_glossary(random_report):
    from tl_spectral.viz.glossary import GLOSSARY
    from tl_spectral.viz.sections import SECTIONS

    html = (random_report / "index.html").read_text()
    assert html.count("var CircuitsVis") == 1  # the bundle once, views inlined
    # every layer of the 6-layer random model × 3 documents, for the patterns and for the
    # contributions: lazily rendered views (JSON props, one render function), no iframe
    assert html.count('class="cvview"') == 2 * 3 * 6 and "<iframe" not in html
    assert html.count("CircuitsVis.render(") == 1
    assert html.count('type="application/json"') == 2 * 3 * 6
    first = html.index('<figure class="viewset"')
    fig = html[first:html.index("</figure>", first)]
    layer_sel = fig[fig.index('data-dim="1"'):]
    layer_sel = layer_sel[:layer_sel.index("</select>")]
    assert re.findall(r'<option value="(\d+)"', layer_sel) == [str(i) for i in range(6)]
    assert "selected" in layer_sel and "most focused head" in layer_sel
    assert "unpkg.com" not in html and "sourceMappingURL" not in html
    # findings first, each linking to a section that exists
    assert html.index("id='findings'") < html.index("<nav class='toc'")
    ids = set(re.findall(r'id="([^"]+)"', html)) | set(re.findall(r"id='([^']+)'", html))
    links = re.findall(r'href="#([^"]+)"', html)
    assert len(links) > 10 and set(links) <= ids
    findings = html[html.index("id='findings'"):html.index("<nav class='toc'")]
    assert findings.count("<li>") >= 4 and re.search(r"\d", findings)
    # every column of every table is defined (tooltip + glossary entry)
    headers = re.findall(r"<th scope=\"col\"( title=\"[^\"]*\")?>(.*?)</th>", html)
    assert headers
    defined = dict(GLOSSARY)  # and the sections' own column definitions
    for f in SECTIONS:
        defined.update(getattr(f, "glossary", {}))
    for title, name in headers:
        name = name.replace("<wbr>", "")
        assert title and name in defined, name
    assert "id='glossary'" in html and "(not defined)" not in html
    # one figure per kind, never one per layer: the number of images does not grow with the
    # depth (tests/test_report_depth.py runs 30 layers); long tables collapsed, CSV download
    assert html.count("<img") <= 24 and 'class="figset"' not in html
    assert "<details><summary>show all 48 rows" in html
    assert "download=\"attention-heads.csv\"" in html
    assert (random_report / "tables" / "attention-heads.csv").read_text().count("\n") == 49
    # the closing note names the sizes and the run
    about = html[html.index("id='about'"):]
    assert "Sizes: index.html" in about and "MB" in about and "4 windows × 32 tokens" in about
    # every figure caption names the run
    caps = re.findall(r"<figcaption>(.*?)</figcaption>", html)
    img_caps = [c for c in caps if "layer" in c or "head" in c]
    assert img_caps and all("seed 0" in c for c in caps if "attention patterns of" not in c
                            and "contribution weights of" not in c)


def test_results_are_slim_and_reloadable(random_report):
    from tl_spectral.results import Result

    res = random_report / "results"
    att = Result.load(res / "attention_stats.safetensors")
    assert att.mean_pattern.shape[-1] <= 64
    pod = Result.load(res / "scale_pod.safetensors")
    assert all(lay.full_modes.shape[0] == 0 for lay in pod.layers)
    assert pod.to_rows() and pod.plot_tspec_hstar() is not None
    con = Result.load(res / "contribution_stats.safetensors")
    kept = {k.split(".")[0] for k in con.kept_maps}
    assert len(kept) == 1  # only the layer shown first, one document
    assert con.maps(int(kept.pop()), 0).contribution.shape[-1] <= 64
    assert con.kept_mask.shape[0] == 1
    assert con.to_rows()


def test_slim_helpers_keep_everything_else():
    import dataclasses

    from tl_spectral.viz.contribution_plots import slim_contribution_stats

    @dataclasses.dataclass
    class Fake:
        kept_maps: dict
        kept_tokens: torch.Tensor
        kept_mask: torch.Tensor
        kept_docs: torch.Tensor

    f = Fake({"1.contribution": torch.ones(2, 2, 80, 80), "0.contribution": torch.ones(2, 2, 80, 80)},
             torch.ones(2, 80), torch.ones(2, 80, dtype=torch.bool), torch.arange(2))
    g = slim_contribution_stats(f, 1, 64)
    assert list(g.kept_maps) == ["1.contribution"]
    assert g.kept_maps["1.contribution"].shape == (1, 2, 64, 64)
    assert g.kept_tokens.shape == (1, 64) and g.kept_docs.tolist() == [0]


def test_encoder_windows_start_with_cls(minilm):
    from tl_spectral.cli import _display_name, _encoder_windows
    from tl_spectral.usage import UsageError

    tok = minilm.tokenizer
    text = "First sentence here. Second one follows!\nA third line; and more words. " * 60
    args = Namespace(n_docs=5, length=24, seed=0, overlap=False, corpus="x")
    tokens, mask, framing = _encoder_windows(text, tok, args)
    assert tokens.shape == (5, 24) and bool(mask.all())
    assert (tokens[:, 0] == tok.cls_token_id).all() and (tokens[:, -1] == tok.sep_token_id).all()
    assert "[CLS]" in framing
    # windows start at sentence starts and do not overlap: the body's first token begins a
    # sentence (capitalised word here)
    firsts = tok.convert_ids_to_tokens(tokens[:, 1].tolist())
    assert all(t in {"first", "second", "a", "and"} for t in firsts), firsts
    with pytest.raises(UsageError, match="--overlap"):
        _encoder_windows(text[:300], tok, Namespace(n_docs=50, length=24, seed=0,
                                                    overlap=False, corpus="x"))
    assert _display_name("minilm", "zoo") == "minilm"
    assert _display_name("/a/b/site-packages/model_dir/", "hf") == "model_dir"


def test_mean_pattern_plot_uses_a_quantile_scale_with_colour_bar():
    from tl_spectral.probes.attention_stats import AttentionStatsResult
    from tl_spectral.viz.attention_plots import plot_mean_patterns

    L, H, T = 2, 3, 16
    mp = torch.rand(L, H, T, T) ** 8
    mp[..., 0] = 1.0
    res = AttentionStatsResult(entropy=torch.rand(L, H), distance=torch.rand(L, H),
                               first_token_mass=torch.rand(L, H), mean_pattern=mp,
                               n_queries=torch.ones(L), layers=[0, 1])
    fig = plot_mean_patterns(res, 1)
    ims = [im for ax in fig.axes for im in ax.get_images()]
    assert len(ims) == H
    from matplotlib.colors import BoundaryNorm

    assert isinstance(ims[0].norm, BoundaryNorm)
    assert len(fig.axes) > H  # the colour bar


def test_packed_maps_round_trip():
    """pack_maps / unpack_maps (what the page's tlUnpack does): 255 levels on [lo, hi], 0
    exact, the causal triangle only."""
    from tl_spectral.viz.report import pack_maps, unpack_maps

    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 9, 9, generator=g).tril()
    back = torch.tensor(unpack_maps(pack_maps(a, 0.0, 1.0, tri=True)))
    assert back.shape == a.shape and float((back - a).abs().max()) <= 0.5 / 254 + 1e-9
    assert bool((back.triu(1) == 0).all())
    s = torch.randn(2, 5, 7, generator=g)
    lim = float(s.abs().max())
    p = pack_maps(s, -lim, lim)
    assert len(p["b64"]) == 4 * -(-2 * 5 * 7 // 3)  # one byte per entry, base64
    back = torch.tensor(unpack_maps(p))
    assert float((back - s).abs().max()) <= lim / 254 + 1e-9
    assert unpack_maps(pack_maps(torch.zeros(1, 2, 2), -1.0, 1.0)) == [[[0.0, 0.0], [0.0, 0.0]]]


def test_token_strings_decode_the_tokenizers_way(minilm):
    """Word pieces join into words (spaces between words, no '##'), and a character split
    over byte tokens appears whole on the token that completes it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tl_spectral.viz.context import PARTIAL, token_strings

    tok = minilm.tokenizer
    ids = tok("unbelievably quick", add_special_tokens=False)["input_ids"]
    pieces = token_strings(tok, ids)
    assert "".join(pieces).strip() == "unbelievably quick"
    assert not any(p.startswith("##") for p in pieces) and len(pieces) == len(ids)
    # byte-level BPE without merges: every byte one token
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bl = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=bl)
    ids = fast("né a", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5  # 'n', two bytes of 'é', ' ', 'a'
    # a token of spaces only shows ␣ (a blank label is invisible); the raw text on request
    assert token_strings(fast, ids) == ["n", PARTIAL, "é", "␣", "a"]
    assert token_strings(fast, ids, visible_whitespace=False)[3] == " "


def test_display_name_reads_the_config(tmp_path):
    import json

    from tl_spectral.cli import _display_name

    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M",
                                               "architectures": ["LlamaForCausalLM"]}))
    assert _display_name(str(d), "hf") == "HuggingFaceTB/SmolLM2-135M"
    (d / "config.json").write_text(json.dumps({"_name_or_path": "/some/local/path",
                                               "architectures": ["LlamaForCausalLM"]}))
    assert _display_name(str(d), "hf") == "hf (LlamaForCausalLM)"


def test_svg_figures_and_random_baseline(tmp_path):
    from tl_spectral.cli import main

    out = tmp_path / "r"
    assert main(["analyze", "--model", "random", "--n-docs", "6", "--length", "32",
                 "--sections", "scale_pod", "--baseline", "random", "--figure-format", "svg",
                 "--out", str(out), "--no-progress"]) == 0
    html = (out / "index.html").read_text()
    assert "data:image/svg+xml;base64," in html and "data:image/png" not in html
    head = (out / "tables" / "scale-pod-layers.csv").read_text().splitlines()[0]
    assert "H_star_random" in head and "T_spec_random" in head
    assert "--baseline random" in html


def test_jackknife_against_direct_recomputation():
    """group_jackknife against a direct loop; pod_jackknife's estimates equal the scale POD's
    own H* and T_spec; n_bound flags H* near N − 1."""
    import math

    from tl_spectral.cli import random_reference_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral.viz.uncertainty import group_jackknife, n_bound, pod_jackknife

    x = torch.randn(10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    jk = group_jackknife(lambda idx: x[idx].mean().reshape(1), 10, n_groups=5, seed=1)
    groups = torch.randperm(10, generator=torch.Generator().manual_seed(1)).chunk(5)
    reps = torch.stack([x[[i for i in range(10) if i not in set(g.tolist())]].mean()
                        for g in groups])
    se = math.sqrt(4 / 5 * float(((reps - reps.mean()) ** 2).sum()))
    assert abs(float(jk["se"][0]) - se) < 1e-12 and abs(float(jk["estimate"][0]) - float(x.mean())) < 1e-12
    from scipy.stats import t

    assert abs(float(jk["high"][0]) - (float(x.mean()) + t.ppf(0.975, 4) * se)) < 1e-9

    m, _ = random_reference_model()
    toks = torch.randint(0, 60, (8, 32), generator=torch.Generator().manual_seed(0))
    f = run_probes(m, toks, [AttentionFieldProbe()], progress=False)["attention_fields"]
    pod = f.scale_pod(n_heads=8, coherence_queries=None)
    rows = pod_jackknife(f, pod)["rows"]
    for r, lay, a in zip(rows, pod.layers, pod.allocation):
        assert r["H_star"] == lay.H_star and abs(r["T_spec"] - lay.T_spec) < 1e-6
        assert r["heads"] == a["recommended"] and r["heads_min"] <= r["heads"] <= r["heads_max"]
        assert r["T_spec_low"] <= r["T_spec"] <= r["T_spec_high"]
    # the library's rule (h_star_bound(8) = 6): 6 of 7 modes is bounded, and 10 documents
    # are the least that could resolve an H* of 6
    assert n_bound([3.0, 6.0], 8) == ([1], 10)
    assert n_bound([3.0, 5.0], 8) == ([], 8)


def test_one_number_shown_once(random_report):
    """Measures equal by construction appear once, with the sentence saying why."""
    html = (random_report / "index.html").read_text()
    head = (random_report / "tables" / "contributions-layers.csv").read_text().splitlines()[0]
    assert "spearman_value_weighted_vs_c" in head and "spearman_output_normalized" not in head
    assert "equal by construction" in html
    # equal-length windows: sink rate = Gu key score = position-0 mass, one panel
    assert "are one number" in html
    # head scores: the first-token score is the position-0 mass, not repeated
    head = (random_report / "tables" / "head-scores.csv").read_text().splitlines()[0]
    assert "first_token" not in head.split(",")


def test_streamed_jackknife_equals_the_in_memory_one():
    """--stream-rank keeps per-group second moments in the first pass's POD directions: with
    the rank cap above the ensemble's rank, the streamed jackknife's H*, T_spec, intervals and
    head ranges equal the in-memory jackknife's (same groups, same seed); the per-group
    spectrum of every subset of groups equals the exact POD of those documents."""
    from tl_spectral.analysis.pod import pod
    from tl_spectral.analysis.streaming_pod import document_groups, projected_group_spectrum
    from tl_spectral.cli import random_reference_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes
    from tl_spectral.viz.uncertainty import pod_jackknife, streamed_pod_jackknife

    m, _ = random_reference_model()
    toks = torch.randint(0, 60, (12, 16), generator=torch.Generator().manual_seed(0))
    res = run_probes(m, toks, [AttentionFieldProbe(name="exact"),
                               AttentionFieldProbe(name="streamed", streaming=True, rank=16,
                                                   jackknife_groups=4, jackknife_seed=3,
                                                   coherence_queries=None)],
                     progress=False)
    f, s = res["exact"], res["streamed"]
    assert {k.split(".")[0] for k in s.jackknife} == {str(layer) for layer in s.layers}
    # one subset of groups against the exact POD of its documents
    groups = document_groups(12, 4, 3)
    keep = [0, 2, 3]
    idx = torch.cat([groups[g] for g in keep])
    X = f.fluctuations(0)[idx].reshape(len(idx), -1).to(torch.float64)
    exact = pod(X, center=True).eigenvalues
    lam, total, n = projected_group_spectrum(
        {k: s.jackknife[f"0.{k}"] for k in ("C", "c", "n", "sumsq", "gram")}, keep)
    assert n == len(idx)
    k = min(lam.numel(), exact.numel())
    torch.testing.assert_close(lam[:k], exact[:k], rtol=1e-4, atol=1e-7 * float(exact[0]))
    assert abs(total - float(exact.sum())) <= 1e-4 * total
    # the report's rows
    p_exact = f.scale_pod(n_heads=8, coherence_queries=None)
    p_stream = s.scale_pod(n_heads=8, coherence_queries=None)
    a = pod_jackknife(f, p_exact, seed=3, n_groups=4)
    b = streamed_pod_jackknife(s, p_stream)
    assert b["meta"]["n_groups"] == a["meta"]["n_groups"] == 4 and b["meta"]["streamed"]
    for ra, rb in zip(a["rows"], b["rows"]):
        for key in ("H_star", "H_star_low", "H_star_high", "heads", "heads_min", "heads_max"):
            assert abs(ra[key] - rb[key]) < 1e-6, (key, ra, rb)
        for key in ("T_spec", "T_spec_low", "T_spec_high"):
            assert abs(ra[key] - rb[key]) <= 1e-3 * max(1.0, abs(ra[key])), (key, ra, rb)
    # off: no per-group moments, a clear error
    off = run_probes(m, toks, [AttentionFieldProbe(streaming=True, rank=16, jackknife_groups=0,
                                                   coherence_queries=None)],
                     progress=False)["attention_fields"]
    assert off.jackknife == {}
    with pytest.raises(ValueError, match="jackknife_groups"):
        streamed_pod_jackknife(off, off.scale_pod(n_heads=8, coherence_queries=None))


def test_streamed_report_shows_jackknife_intervals(tmp_path):
    """--stream-rank: the scale-POD section still carries the jackknife intervals table."""
    from tl_spectral.cli import main

    out = tmp_path / "streamed"
    assert main(["analyze", "--model", "random", "--n-docs", "8", "--length", "32",
                 "--sections", "scale_pod", "--stream-rank", "12", "--out", str(out),
                 "--no-progress"]) == 0
    html = (out / "index.html").read_text()
    assert "jackknife intervals" in html and "per-group second moments" in html
    assert "not kept with" not in html
    rows = (out / "tables" / "scale-pod-intervals-attention.csv").read_text().splitlines()
    assert rows[0].startswith("layer,H_star,H_star_interval") and len(rows) >= 3


def test_streamed_jackknife_moments_merge_only_in_one_basis():
    """Two streaming probes whose first passes differ (different documents) took their
    per-group moments in different bases: merged, the moments are dropped (no wrong interval);
    two probes of the same first pass keep them."""
    from tl_spectral.cli import random_reference_model
    from tl_spectral.probes import AttentionFieldProbe, run_probes

    m, _ = random_reference_model()
    g = torch.Generator().manual_seed(1)
    kw = dict(streaming=True, rank=16, coherence_queries=None)
    a, b = AttentionFieldProbe(**kw), AttentionFieldProbe(**kw)
    run_probes(m, torch.randint(0, 60, (6, 16), generator=g), [a], progress=False)
    run_probes(m, torch.randint(0, 60, (6, 16), generator=g), [b], progress=False)
    a._selection = b._selection  # same windows, so the merge itself is allowed
    assert a.merge(b).result().jackknife == {}
    toks = torch.randint(0, 60, (6, 16), generator=g)
    c, d = AttentionFieldProbe(**kw), AttentionFieldProbe(**kw)
    run_probes(m, toks, [c], progress=False)
    run_probes(m, toks, [d], progress=False)
    jk = c.merge(d).result().jackknife
    assert jk and float(jk["0.n"].sum()) == 12


def test_figures_crop_to_the_same_pixels_as_bbox_tight():
    """figure_to_base64 crops with the tight box found in one draw (``_tight_bbox``): the
    same pixels as ``savefig(bbox_inches="tight")`` for a figure without a layout engine
    (colour bar, legend, title), one laid out once by ``tight_layout()``, one with the tight
    layout engine and one with constrained layout (which keeps ``"tight"``)."""
    import base64
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    from tl_spectral.viz.report import _tight_bbox, figure_to_base64

    def make(kind):
        fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout={
            "constrained": "constrained", "tight": "tight"}.get(kind))
        im = axes[0].imshow(np.arange(30.0).reshape(5, 6), aspect="auto")
        fig.colorbar(im, ax=axes[0], label="value")
        axes[1].plot([1, 2, 3], label="a line")
        axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.15))
        axes[1].set_title("a title that reaches out", fontsize=14)
        fig.suptitle("suptitle")
        if kind == "tight_layout":
            fig.tight_layout()
        return fig

    def pixels(fig, box):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches=box)
        plt.close(fig)
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGBA"))

    refs = {}
    for kind in ("none", "tight_layout", "tight", "constrained"):
        refs[kind] = ref = pixels(make(kind), "tight")
        fig = make(kind)
        box = _tight_bbox(fig, 90)
        assert (box == "tight") == (kind == "constrained")
        got = pixels(fig, box)
        assert got.shape == ref.shape and np.array_equal(got, ref), kind
    # the page's PNG (a palette PNG) has that size
    png = Image.open(io.BytesIO(base64.b64decode(figure_to_base64(make("none")))))
    assert png.size == (refs["none"].shape[1], refs["none"].shape[0])
