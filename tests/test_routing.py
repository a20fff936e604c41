"""Model-level QK geometry (geometry.model), B.4 ablations (interventions.ablations), the cascade over
training (geometry.cascade), top-K BPE (data.topk_bpe), errors for unreadable heads, and the
routing study (tl_spectral_studies.routing)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_native
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.data.topk_bpe import TopKBPE
from tl_spectral.geometry.cascade import CascadeResult, cascade_over_training
from tl_spectral.geometry.model import (
    UnreadableHeadsError,
    geometry_layer_table,
    model_qk_geometry,
    model_sd_geometry,
    native_attention_weights,
)
from tl_spectral.geometry.qk import sd_geometry
from tl_spectral.interventions.ablations import (
    AblationResult,
    KernelPartAttention,
    ablate,
    ablation_table,
    perplexity,
)
from tl_spectral.models import GPT, GPTConfig, to_transformer_lens


def _model(norm="none", d_head=6, attention="sd", seed=0, n_layers=3, options=None):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=17, n_layers=n_layers, n_heads=4, d_model=24, d_head=d_head,
                      n_ctx=32, d_mlp=40, normalization=norm, attention=attention,
                      attention_options=options or {}, init_std=0.1))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def _windows(n=6, T=17, seed=1):
    return torch.randint(0, 17, (n, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- model geometry
@pytest.mark.parametrize("norm", ["ln", "none"])
def test_native_geometry_equals_converted_transformer_lens(norm):
    """The native path (own LN folding, unpadded heads) and ModelView on the converted
    TransformerLens model (padded heads, TL-layout folding) give the same geometry."""
    m = _model(norm, [4, 8, 6], ["sd", "softmax", "sd"])
    g_native = model_qk_geometry(m)
    g_tl = model_qk_geometry(to_transformer_lens(m))
    assert g_native.d_head == [4, 8, 6] and g_tl.d_head == [8, 8, 8]
    for f in ("routing_fraction", "eff_rank_R", "pr_R", "eff_rank_F", "positive_share"):
        torch.testing.assert_close(getattr(g_native, f), getattr(g_tl, f), atol=1e-5, rtol=1e-5)
    assert torch.equal(g_native.unstable, g_tl.unstable)


def test_native_fold_matches_dense_kernel():
    """Brute force: the folded kernel is C·diag(g)·W_Q W_Kᵀ·diag(g)·C (C = centring)."""
    m = _model("ln", 6, "softmax")
    w = native_attention_weights(m, fold_ln=True)[1]
    raw = m.blocks[1].attn.weights()
    g = m.blocks[1].ln1.weight.detach().double()
    C = torch.eye(24, dtype=torch.float64) - 1.0 / 24
    for h in range(4):
        M_raw = raw["W_Q"][h].double() @ raw["W_K"][h].double().T
        want = C @ torch.diag(g) @ M_raw @ torch.diag(g) @ C
        torch.testing.assert_close(w["W_Q"][h] @ w["W_K"][h].T, want)
    torch.testing.assert_close(native_attention_weights(m, fold_ln=False)[1]["W_Q"], raw["W_Q"])


def test_transformer_lens_random_models(native_ln, native_gqa):
    g = model_qk_geometry(native_ln)
    assert g.routing_fraction.shape == (3, 4)
    torch.testing.assert_close(g.routing_fraction + g.filtering_fraction,
                               torch.ones(3, 4, dtype=torch.float64))
    assert g.key_bias_norm is not None
    g2 = model_qk_geometry(native_gqa, biases=False)
    assert g2.n_kv_heads == 4 and g2.key_bias_norm is None  # ModelView repeats kv heads
    rows = geometry_layer_table(g)
    assert [r["layer"] for r in rows] == ["L0", "L1", "L2"]
    assert all(0 <= r["routing_fraction"] <= 1 for r in rows)


def test_sd_geometry_of_native_model():
    m = _model("none", [4, 8, 6], ["sd", "softmax", "sd"])
    sg = model_sd_geometry(m)
    assert sg.layer_names == ["L0", "L2"] and sg.d_head == [4, 6]
    ref = sd_geometry([m.blocks[0].attn.S().detach(), m.blocks[2].attn.S().detach()],
                      [m.blocks[0].attn.D().detach(), m.blocks[2].attn.D().detach()])
    torch.testing.assert_close(sg.eff_rank_S, ref.eff_rank_S)
    assert sg.all_stable
    rows = geometry_layer_table(sg, measure="participation")
    assert rows[0]["stable_share"] == 1.0
    with pytest.raises(ValueError, match="no S–D"):
        model_sd_geometry(_model("none", 6, "softmax"))


# ------------------------------------------------------------------------- errors
def test_linear_layers_are_refused_with_the_layer_named():
    m = GPT(GPTConfig(vocab_size=5, n_layers=3, n_heads=2, d_model=8, n_ctx=8,
                      attention=["softmax", "linear", "sd"]))
    with pytest.raises(UnreadableHeadsError, match=r"layers 1 \(LinearAttention.*φ"):
        model_qk_geometry(m)


def test_rotary_and_foreign_models_are_refused():
    rot = make_native(n_layers=1, n_heads=2, d_model=16, d_head=8, seed=3)
    rot.cfg.positional_embedding_type = "rotary"  # the check reads the config only
    with pytest.raises(UnreadableHeadsError, match="rotary.*allow_rotary=True"):
        model_qk_geometry(rot)
    assert model_qk_geometry(rot, allow_rotary=True).n_layers == 1
    rot.cfg.positional_embedding_type = "standard"
    with pytest.raises(TypeError, match="TransformerLens model"):
        model_qk_geometry(torch.nn.Linear(2, 2))


def test_non_finite_weights_say_which_layer():
    m = _model("none", 6, "softmax")
    with torch.no_grad():
        m.blocks[2].attn.qkv.weight[0, 0] = float("nan")
    with pytest.raises(UnreadableHeadsError, match=r"W_Q\[2\]"):
        model_qk_geometry(m)


def test_missing_query_weights_are_named():
    tl = make_native(n_layers=2, n_heads=2, d_model=16, d_head=8, seed=4)

    class NoQ:  # a view whose layer-0 attention exposes no W_Q
        pass

    from tl_spectral.model_view import ModelView

    view = ModelView(tl)
    view._attn = lambda layer: NoQ()  # type: ignore[method-assign]
    with pytest.raises(UnreadableHeadsError, match="exposes no W_Q"):
        model_qk_geometry(view)


# ---------------------------------------------------------------------- ablations
def _dense_kernel_part_pattern(att, x, keep):
    """Brute force per head with the dense d_model×d_model kernel part."""
    w = {k: v.double() for k, v in att.weights().items()}
    x = x.double()
    T = x.shape[1]
    pats = []
    for h in range(att.n_heads):
        M = w["W_Q"][h] @ w["W_K"][h].T
        Mp = 0.5 * (M - M.T) if keep == "skew" else 0.5 * (M + M.T)
        s = x[0] @ Mp @ x[0].T
        s = s + (x[0] @ w["W_Q"][h] @ w["b_K"][h])[:, None]
        s = s + (x[0] @ w["W_K"][h] @ w["b_Q"][h])[None, :] + w["b_Q"][h] @ w["b_K"][h]
        s = s / math.sqrt(att.d_head)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        pats.append(s.softmax(-1))
    return torch.stack(pats)


@pytest.mark.parametrize("keep", ["skew", "symmetric"])
def test_kernel_part_attention_matches_dense(keep):
    m = _model("none", 6, "softmax")
    att = m.blocks[0].attn
    x = torch.randn(1, 9, 24, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, pat = KernelPartAttention(att, keep)(x, return_pattern=True)
    torch.testing.assert_close(pat[0].double(), _dense_kernel_part_pattern(att, x, keep),
                               atol=1e-5, rtol=1e-4)


def test_kernel_parts_add_up_to_the_original_scores():
    """skew + symmetric bilinear scores = the original q·k (checked through log-patterns
    of a model with zero biases: softmax(a + b) vs the original)."""
    m = _model("none", 6, "softmax")
    att = m.blocks[0].attn
    with torch.no_grad():
        att.qkv.bias.zero_()
    x = torch.randn(1, 7, 24, generator=torch.Generator().manual_seed(6))
    w = att.weights()
    q0 = torch.einsum("bpm,hmd->bhpd", x, w["W_Q"])
    k0 = torch.einsum("bpm,hmd->bhpd", x, w["W_K"])
    qk, kq = q0 @ k0.mT, k0 @ q0.mT
    torch.testing.assert_close(0.5 * (qk - kq) + 0.5 * (qk + kq), qk)
    with torch.no_grad():
        _, p_orig = att(x, return_pattern=True)
        _, p_s = KernelPartAttention(att, "skew")(x, return_pattern=True)
        _, p_f = KernelPartAttention(att, "symmetric")(x, return_pattern=True)
    # log-patterns are scores minus a per-row constant, so log p − log p_s − log p_f must
    # be constant along every causal row
    for i in range(7):
        r = (p_orig.log() - p_s.log() - p_f.log())[..., i, : i + 1]
        assert (r - r[..., :1]).abs().max() < 1e-4


def test_sd_ablations_set_the_parameters():
    m = _model("none", 6, "sd")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    a = ablate(m, "filtering_collapse")
    for i in range(3):
        D0, D1 = m.blocks[i].attn.D().detach(), a.blocks[i].attn.D().detach()
        d1 = torch.diagonal(D1, dim1=-2, dim2=-1)
        torch.testing.assert_close(d1, d1[:, :1].expand_as(d1))  # scalar per head
        torch.testing.assert_close(d1.mean(-1), torch.diagonal(D0, dim1=-2, dim2=-1).mean(-1))
        torch.testing.assert_close(a.blocks[i].attn.S(), m.blocks[i].attn.S())
    r = ablate(m, "routing_removal", layers=[1])
    assert (r.blocks[1].attn.S() == 0).all() and (r.blocks[0].attn.S() != 0).any()
    f = ablate(m, "filtering_removal")
    assert all((f.blocks[i].attn.D() == 0).all() for i in range(3))
    for k, v in m.state_dict().items():  # the input model is untouched
        assert torch.equal(v, before[k])


def test_ablation_errors_and_noops():
    m = _model("none", 6, "sd", options={"filtering": "scalar"})
    tok = _windows(2, 9)[:, :8]
    with torch.no_grad():
        torch.testing.assert_close(ablate(m, "filtering_collapse")(tok), m(tok))
    with pytest.raises(ValueError, match="unknown ablation"):
        ablate(m, "bogus")
    with pytest.raises(ValueError, match="needs 'softmax' attention layers"):
        ablate(m, "skew_removal")
    with pytest.raises(ValueError, match="layers"):
        ablate(m, "routing_removal", layers=[7])
    with pytest.raises(TypeError):
        ablate(torch.nn.Linear(2, 2), "routing_removal")


def test_perplexity_and_ablation_table(tmp_path):
    m = _model("ln", 6, ["sd", "softmax", "sd"])
    w = _windows()
    p = perplexity(m, w, batch_size=4)
    with torch.no_grad():
        want = float(m.loss(w))
    assert abs(p["loss"] - want) < 1e-5 and abs(p["ppl"] - math.exp(want)) < 1e-3
    t = ablation_table(m, w, name="tiny")
    kinds = {r["ablation"] for r in t.rows}
    assert kinds == {"filtering_collapse", "routing_removal", "filtering_removal",
                     "symmetric_removal", "skew_removal"}
    assert {r["layers"] for r in t.rows if r["ablation"] == "routing_removal"} == {"all", 0, 2}
    assert all(math.isfinite(r["delta_ppl"]) for r in t.rows)
    back = AblationResult.load(t.save(tmp_path / "abl.safetensors"))
    assert back.rows == t.rows and back.baseline_ppl == t.baseline_ppl
    assert t.plot() is not None


# ------------------------------------------------------------------------ cascade
def test_cascade_over_training(tmp_path):
    from tl_spectral.models import TrainConfig, Trainer

    m = _model("none", 4, "sd", n_layers=2)
    ids = torch.randint(0, 17, (400,), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=2,
                      eval_windows=2, checkpoint_every=2, keep_checkpoints=10,
                      out_dir=str(tmp_path / "run"), progress=False, device="cpu")
    Trainer(m, ids[:300], ids[300:], cfg).fit()
    c = cascade_over_training(tmp_path / "run")
    assert c.steps.tolist() == [2, 4]
    assert c.rank_S.shape == c.rank_R.shape == (2, 2, 4)
    assert (c.val_loss > 0).all()
    torch.testing.assert_close(c.rank_S[-1], model_sd_geometry(m).eff_rank_S)
    back = CascadeResult.load(c.save(tmp_path / "c.safetensors"))
    torch.testing.assert_close(back.rank(), c.rank())
    assert c.plot() is not None and c.plot(which="R") is not None
    with pytest.raises(ValueError, match="which"):
        c.plot(which="Q")
    with pytest.raises(FileNotFoundError):
        cascade_over_training(tmp_path / "nothing")


# ------------------------------------------------------------------ top-K BPE
def test_top_k_bpe(tmp_path):
    from pathlib import Path

    ranks = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpt2.tiktoken"
    if not ranks.is_file():
        pytest.skip("no ../shared/data/gpt2.tiktoken")
    text = "the cat sat on the mat. the cat ate the rat."
    from tl_spectral.data import BPETokenizer

    raw = torch.tensor(BPETokenizer(ranks).encode(text))
    tok = TopKBPE.fit(ranks, raw, top_k=4)
    assert tok.vocab_size == 4 and tok.unk_id == 3
    counts = torch.bincount(raw)
    assert [int(counts[i]) for i in tok.keep] == sorted(
        [int(counts[i]) for i in tok.keep], reverse=True)
    assert int(counts[tok.keep[-1]]) >= int(counts[counts > 0].sort(descending=True).values[3])
    ids = tok.encode(text)
    assert max(ids) <= 3 and 3 in ids
    assert tok.decode([0, 3]) == tok.bpe.decode([tok.keep[0]]) + "<unk>"
    with pytest.raises(ValueError):
        TopKBPE.fit(ranks, raw, top_k=1)


# -------------------------------------------------------------- hypothesis: S–D stability
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 10.0),
       filtering=st.sampled_from(["diag", "scalar", "none"]),
       routing=st.sampled_from(["skew", "none"]))
def test_random_sd_models_are_stable(seed, scale, filtering, routing):
    """Re λ(S − D) <= 0 for random parameters of a whole S–D model, every variant, also
    after the ablations (collapse / removal keep S skew and D >= 0)."""
    if filtering == "none" and routing == "none":
        return
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=5, n_layers=2, n_heads=2, d_model=8, d_head=[3, 5], n_ctx=8,
                      attention="sd", attention_options={"filtering": filtering,
                                                         "routing": routing}))
    with torch.no_grad():
        for blk in m.blocks:
            if routing == "skew":
                blk.attn.A.normal_(0, scale)
            if filtering != "none":
                blk.attn.delta.normal_(0, scale)
    assert model_sd_geometry(m).all_stable
    assert model_sd_geometry(ablate(m, "filtering_collapse")).all_stable
    g = model_qk_geometry(m)  # W_P random: M = W_P (S − D) W_Pᵀ need not be stable
    assert g.routing_fraction.shape == (2, 2)


# ------------------------------------------------------------------ report section
def test_report_section(tmp_path, native_ln):
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.report import Report
    from tl_spectral.viz.routing_section import RoutingFilteringSection
    from tl_spectral.viz.sections import SECTIONS, ReportContext

    assert RoutingFilteringSection in SECTIONS
    ctx = ReportContext(view=ModelView(native_ln), tokens=torch.zeros(1, 4, dtype=torch.long),
                        tokenizer=None, out_dir=tmp_path, results_dir=tmp_path / "results")
    sec = RoutingFilteringSection()
    assert sec.probes(ctx) == []
    rep = Report("t")
    res = {mp.key: mp.run(ctx) for mp in sec.passes(ctx)}
    sec.render(rep, {**res, **sec.derive(res, ctx)}, ctx)
    html = rep.write(tmp_path).read_text()
    assert "Routing and filtering" in html and html.count("<img") == 3
    assert (tmp_path / "results" / "qk_geometry.safetensors").is_file()
    assert (tmp_path / "results" / "qk_geometry_heads.csv").is_file()
    # a model that says it is rotary: the offset-resolved section, or a paragraph saying why
    # it could not be computed; nothing crashes
    rot = make_native(n_layers=1, n_heads=2, d_model=16, d_head=8, seed=5)
    rot.cfg.positional_embedding_type = "rotary"
    ctx2 = ReportContext(view=ModelView(rot), tokens=ctx.tokens, tokenizer=None,
                         out_dir=tmp_path / "b", results_dir=tmp_path / "b" / "results")
    rep2 = Report("t2")
    res2 = {mp.key: mp.run(ctx2) for mp in sec.passes(ctx2)}
    sec.render(rep2, {**res2, **sec.derive(res2, ctx2)}, ctx2)
    html2 = rep2.write(tmp_path / "b").read_text()
    assert "could not be computed" in html2 or "This model has rotary positions" in html2


# -------------------------------------------------------------------------- study
def test_study_on_a_tiny_run(tmp_path):
    """run_study end to end on a 3-step S–D char run named like a study run."""
    from tl_spectral.geometry.cascade import latest_model_dir
    from tl_spectral.geometry.model import random_baseline
    from tl_spectral.models.train import run_from_config
    from tl_spectral_studies.routing import minimal_rank_share, run_study, run_validation_windows

    doc = {"model": {"vocab_size": "auto", "n_layers": 2, "n_heads": 2, "d_model": 16,
                     "d_head": 4, "n_ctx": 16, "d_mlp": 32, "normalization": "none",
                     "attention": "sd"},
           "data": {"corpus": "tiny_shakespeare", "tokenizer": "char", "val_fraction": 0.1},
           "train": {"steps": 3, "batch_size": 2, "warmup_steps": 1, "eval_every": 3,
                     "eval_windows": 2, "checkpoint_every": 1, "keep_checkpoints": 5,
                     "out_dir": str(tmp_path / "runs" / "sd-char-shakespeare-noln"),
                     "progress": False, "device": "cpu"}}
    run_from_config(doc)
    d, step, finished = latest_model_dir(tmp_path / "runs" / "sd-char-shakespeare-noln")
    assert d.name == "final" and step == 3 and finished
    w = run_validation_windows(d, "char", n_windows=3)
    assert w.shape == (3, 17)
    assert minimal_rank_share(torch.tensor([[2.0, 2.5], [4.0, 5.0]])) == 0.5
    assert abs(float(random_baseline(64, 2, 8, n_layers=2).routing_fraction.mean()) - 0.5) < 0.1
    s = run_study(tmp_path / "out", runs_dir=tmp_path / "runs", fig_dir=tmp_path / "fig",
                  n_windows=2, minilm=False, per_layer=False,
                  names=["sd-char-shakespeare-noln", "char-shakespeare", "bpe-sd-noln"])
    e = s["models"]["sd-char-shakespeare-noln"]
    assert e["step"] == 3 and e["sd"]["all_stable"] and e["cascade_steps"] == [1, 2, 3]
    # absent runs: shipped models come from the zoo (no cascade), others are reported
    z = s["models"]["char-shakespeare"]
    assert z["model_dir"] == "zoo:char-shakespeare" and "cascade_steps" not in z
    assert z["ablation"]["baseline_ppl"] < 10
    assert "retrain" in s["models"]["bpe-sd-noln"]["error"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [
        "routing_ablations.png", "routing_cascade_depth.png", "routing_cascade_training.png",
        "routing_cascade_training_R.png", "routing_qk_geometry.png", "routing_sd_geometry.png"]
    assert len(e["cascade_rank_R_mean"]) == 3
