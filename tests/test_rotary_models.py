"""Rotary positions in the tl_spectral GPT family (positional="rotary"): softmax and S–D
attention, partial rotary, unequal head sizes; conversion to TransformerLens with equal
logits; the score is x W_Q R(j − i) W_Kᵀ xᵀ; checkpoints save/load; old configs load."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tl_spectral.geometry.model import (
    UnreadableHeadsError,
    model_qk_geometry,
    model_rotary_geometry,
)
from tl_spectral.geometry.rotary import RotarySpec, rotary_matrix
from tl_spectral.models.attention import Rotary, make_attention, rotary_inv_freq
from tl_spectral.models.convert import max_logit_diff, to_transformer_lens
from tl_spectral.models.gpt import GPT, GPTConfig, load_checkpoint, save_model


def _model(attention="softmax", d_head=8, rotary_dim=None, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_head=d_head, n_ctx=12,
                    d_mlp=32, attention=attention, positional="rotary", rotary_dim=rotary_dim,
                    rotary_base=100.0, **kw)
    m = GPT(cfg)
    with torch.no_grad():  # weights large enough that positions matter
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m.eval()


CASES = [("softmax", 8, None), ("softmax", 8, 4), ("sd", 8, None), ("sd", 8, 2),
         ("softmax", [8, 6], 4), (["sd", "softmax"], 6, 6)]


@pytest.mark.parametrize("attention,d_head,rd", CASES)
def test_converted_model_has_equal_logits(attention, d_head, rd):
    m = _model(attention, d_head, rd)
    tl = to_transformer_lens(m)
    assert tl.cfg.positional_embedding_type == "rotary"
    toks = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    assert max_logit_diff(m, tl, toks) <= 1e-5
    # training mode (fused attention kernel) agrees to float32 round-off
    with torch.no_grad():
        a = m.train()(toks)
        b = m.eval()(toks)
    assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("attention", ["softmax", "sd"])
def test_pattern_is_the_softmax_of_the_offset_kernel(attention):
    """The native model's pattern equals softmax((x W_Q + b_Q) R(j − i) (x W_K + b_K)ᵀ/√d)
    with R built from the adjacent-pair RotarySpec of the config."""
    m = _model(attention, 8, 4)
    toks = torch.randint(0, 20, (2, 10), generator=torch.Generator().manual_seed(2))
    blk = m.blocks[0]
    with torch.no_grad():
        _, pats = m(toks, return_patterns=True)
        x = blk.ln1(m.tok_embed(toks)).double()
        w = {k: v.double() for k, v in blk.attn.weights().items()}
    q = torch.einsum("bpm,hmd->bhpd", x, w["W_Q"]) + w["b_Q"][None, :, None]
    k = torch.einsum("bpm,hmd->bhpd", x, w["W_K"]) + w["b_K"][None, :, None]
    spec = RotarySpec(rotary_inv_freq(4, 100.0), "adjacent")
    n = toks.shape[1]
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    s = torch.einsum("bhid,ijde,bhje->bhij", q, rotary_matrix(spec, 8, j - i), k) / math.sqrt(8)
    want = s.masked_fill(j > i, -math.inf).softmax(-1)
    torch.testing.assert_close(pats[0].double(), want, rtol=1e-5, atol=1e-6)
    # and the rotation matters (else this test could not fail on a wrong R)
    s0 = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(8)
    assert (s0.masked_fill(j > i, -math.inf).softmax(-1) - want).abs().max() > 1e-3


@pytest.mark.parametrize("attention,d_head", [("sd", 8), ("softmax", [8, 6])])
def test_native_and_converted_rotary_geometry_agree(attention, d_head):
    """Native weights + config spec vs the converted bridge read through ModelView (native
    cos/sin tables, zero-padded and rescaled heads of unequal size)."""
    m = _model(attention, d_head, 4)
    g1 = model_rotary_geometry(m, offsets=[0, -1, -5], average_ranks=False)
    g2 = model_rotary_geometry(to_transformer_lens(m), offsets=[0, -1, -5], average_ranks=False)
    assert g2.pairing == "adjacent" and g2.rotary_dim == 4
    torch.testing.assert_close(g1.routing_fraction, g2.routing_fraction, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g1.mean_routing_fraction, g2.mean_routing_fraction,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g1.eff_rank_R, g2.eff_rank_R, rtol=1e-5, atol=1e-5)
    with pytest.raises(UnreadableHeadsError, match="model_rotary_geometry"):
        model_qk_geometry(m)
    assert model_qk_geometry(m, allow_rotary=True).n_layers == 2


def test_checkpoint_roundtrip_and_old_configs(tmp_path):
    m = _model("softmax", 8, 4)
    save_model(m, tmp_path / "r")
    back = load_checkpoint(tmp_path / "r").eval()
    assert back.cfg.positional == "rotary" and back.cfg.rotary_dim == 4
    assert back.pos_embed is None and "pos_embed.weight" not in back.state_dict()
    toks = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        assert torch.equal(back(toks), m(toks))
    # a learned-position config serialises exactly as before the rotary fields existed (so
    # trainer run identities and saved configs are unchanged), and such configs load
    old = GPTConfig(vocab_size=20).to_dict()
    assert not {"positional", "rotary_dim", "rotary_base"} & set(old)
    cfg = GPTConfig.from_dict(json.loads(json.dumps(old)))
    assert cfg.positional == "learned" and cfg.rotary_dim is None
    assert GPT(cfg).pos_embed is not None
    from tl_spectral.models import zoo

    shipped = json.loads((zoo.checkpoint_dir("char-shakespeare") / "config.json").read_text())
    assert GPTConfig.from_dict(shipped["model"]).to_dict() == shipped["model"]


@pytest.mark.parametrize("kw,match", [
    (dict(positional="alibi"), "positional must be"),
    (dict(rotary_dim=4), "needs positional='rotary'"),
    (dict(positional="rotary", rotary_dim=3), "even int"),
    (dict(positional="rotary", rotary_dim=10), "even int"),
    (dict(positional="rotary", rotary_base=1.0), "rotary_base"),
    (dict(positional="rotary", attention="linear"), "linear"),
])
def test_bad_rotary_configs_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_head=8, **kw)


def test_rotary_module_and_attention_options():
    rot = Rotary(4, 12, 100.0)
    x = torch.randn(2, 3, 12, 6)
    y = rot(x)
    assert torch.equal(y[..., 4:], x[..., 4:])  # partial rotary: the rest passes
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation
    with pytest.raises(ValueError, match="linear attention does not support rotary"):
        make_attention("linear", 16, 2, 8, 12, rotary=rot)
    with pytest.raises(ValueError, match="does not fit"):
        make_attention("softmax", 16, 2, 2, 12, rotary=rot)
    assert "rotary" not in {n for n, _ in make_attention("softmax", 16, 2, 8, 12)
                            .named_buffers()}


def test_rotary_study_summary_and_tables(tmp_path):
    """tl_spectral_studies.routing.rotary_study on a small saved rotary GPT: the summary's
    numbers are model_rotary_geometry's, the dense curve is the trigonometric form's, and
    rotary_markdown renders one row per layer."""
    from tl_spectral_studies.routing import rotary_markdown, rotary_study

    m = _model("softmax", 8, 4)
    save_model(m, tmp_path / "ck")
    s = rotary_study(tmp_path / "ck", tmp_path / "res", fig_path=tmp_path / "f.png",
                     reference=None)
    assert s["lags"] == [0, 1, 2, 3, 4, 6, 8] and (tmp_path / "f.png").is_file()
    geo = model_rotary_geometry(m, offsets=[-x for x in s["lags"]])
    row = s["layers"]["L1"]
    assert row["routing_fraction_mean"] == geo.routing_fraction[1].mean(0).tolist()
    assert row["mean_routing_fraction"] == float(geo.mean_routing_fraction[1].mean())
    dense = row["dense_curve_mean"]
    assert len(dense) == 12
    torch.testing.assert_close(torch.tensor([dense[x] for x in s["lags"]], dtype=torch.float64),
                               geo.routing_fraction[1].mean(0), rtol=1e-9, atol=1e-12)
    with pytest.raises(FileExistsError, match="overwrite"):
        rotary_study(tmp_path / "ck", tmp_path / "res", reference=None)
    rotary_study(tmp_path / "ck", tmp_path / "res", reference=None, overwrite=True)
    md = rotary_markdown(tmp_path / "res")
    assert md.count("| L") == 2 and f"{row['mean_routing_fraction']:.3f}" in md


def test_rotary_doc_tables_regenerate_from_committed_results():
    """The tables of the rotary char model in docs/routing_filtering.md are
    rotary_markdown(docs/results/routing/rotary), verbatim."""
    from pathlib import Path

    from tl_spectral_studies.routing import rotary_markdown

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "routing_filtering.md").read_text(encoding="utf-8")
    md = rotary_markdown(root / "docs" / "results" / "routing" / "rotary")
    assert md in doc
    assert "| L5 |" in md and "Gaussian" in md


def test_shipped_rotary_checkpoint():
    """zoo 'char-shakespeare-rotary': rotary config, recorded validation loss reproduced on a
    fixed validation slice, converted model with equal logits, offset-resolved geometry."""
    from test_zoo import _val_windows

    from tl_spectral.models import zoo

    model, tok = zoo.load_native("char-shakespeare-rotary")
    c = model.cfg
    assert (c.positional, c.rotary_dim, c.n_layers, c.n_heads, c.d_model) == ("rotary", 16, 6,
                                                                               8, 128)
    recorded = zoo.checkpoint_info("char-shakespeare-rotary")["metrics"]["val_loss"]
    w = _val_windows(tok)
    with torch.no_grad():
        assert abs(model.loss(w).item() - recorded) < 0.3
    tl_model, _ = zoo.load("char-shakespeare-rotary")
    assert max_logit_diff(model, tl_model, w[:2, :-1]) <= 1e-4
    g = model_rotary_geometry(tl_model, offsets=[0, -8], average_ranks=False)
    assert g.pairing == "adjacent" and g.routing_fraction.shape == (6, 8, 2)


def test_cascade_over_training_reads_rotary_sd_runs(tmp_path):
    """The cascade over training reads a rotary S–D run: S (before the rotation, the same at
    every offset) as for learned positions, R at offset 0."""
    from tl_spectral.geometry.cascade import cascade_over_training
    from tl_spectral.geometry.model import model_sd_geometry

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=20, n_layers=2, n_heads=2, d_model=16, d_head=8, n_ctx=12,
                    d_mlp=32, attention="sd", positional="rotary", rotary_dim=4)
    model = GPT(cfg)
    save_model(model, tmp_path / "run" / "final")
    res = cascade_over_training(tmp_path / "run")
    torch.testing.assert_close(res.rank_S[-1], model_sd_geometry(model).eff_rank_S)
    torch.testing.assert_close(res.rank_R[-1], model_qk_geometry(model, biases=False,
                                                                 allow_rotary=True).eff_rank_R)


def test_rotary_cascade_doc_table_regenerates_from_committed_results():
    """The rotary S–D cascade table of docs/routing_filtering.md is
    rotary_cascade_markdown(docs/results/routing/rotary_sd), verbatim, and a changed
    number is caught."""
    from pathlib import Path

    from tl_spectral_studies.routing import rotary_cascade_markdown, rotary_cascade_verdict

    root = Path(__file__).resolve().parents[1]
    res = root / "docs" / "results" / "routing" / "rotary_sd"
    doc = (root / "docs" / "routing_filtering.md").read_text(encoding="utf-8")
    assert rotary_cascade_markdown(res) in doc
    s = json.loads((res / "summary.json").read_text())
    s["final"]["rotary_R"][0]["high"] = 99.0  # layer 0 no longer separated
    s["final"]["rotary_R"][3]["estimate"] = 0.5  # layer 3 falls below layer 0
    assert "rotary: layer 0 does not have the lowest head mean" in rotary_cascade_verdict(s)
