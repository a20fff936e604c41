"""Spectral surgery (SPEC B.5–B.6): linearize, ΔPPL curves, cascade allocation, conversion."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.interventions.surgery import (
    AllocationStudy,
    CascadeAllocation,
    FineTune,
    LinearizationCurve,
    attention_param_count,
    cascade_allocation,
    linearization_curve,
    linearize,
    perplexity,
    plot_collapse,
    tl_linearization_curve,
)
from tl_spectral.models import GPT, GPTConfig, load_checkpoint, save_model, to_transformer_lens
from tl_spectral.models.convert import max_logit_diff

V = 13


def gpt(attention="softmax", n_layers=3, d_head=None, normalization="ln", seed=0, n_ctx=32):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=V, n_layers=n_layers, n_heads=2, d_model=16, n_ctx=n_ctx,
                      d_head=d_head, attention=attention, normalization=normalization)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m


def toks(n=2, p=20, seed=0):
    return torch.randint(0, V, (n, p), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["softmax", "sd"])
def test_linearize_no_layer_changes_nothing(kind):
    m = gpt(kind)
    m2 = linearize(m, [])
    assert m2 is not m and m2.cfg.to_dict() == m.cfg.to_dict()
    t = toks()
    with torch.no_grad():
        assert torch.equal(m(t), m2(t))
    for (n1, p1), (n2, p2) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


def brute_linear_layer(x, W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O):
    """o_i = Σ_h Σ_{j<=i} φ(q_i)·φ(k_j) v_j / Σ_{j<=i} φ(q_i)·φ(k_j), then W_O, + b_O."""
    phi = lambda z: F.elu(z) + 1  # noqa: E731
    b, p, _ = x.shape
    out = torch.zeros(b, p, W_O.shape[-1], dtype=x.dtype) + b_O
    for h in range(W_Q.shape[0]):
        q = phi(x @ W_Q[h] + b_Q[h])
        k = phi(x @ W_K[h] + b_K[h])
        v = x @ W_V[h] + b_V[h]
        for i in range(p):
            w = (q[:, i:i + 1] * k[:, :i + 1]).sum(-1)  # [b, i+1]
            z = (w[..., None] * v[:, :i + 1]).sum(1) / w.sum(1, keepdim=True)
            out[:, i] += z @ W_O[h]
    return out


def test_linearized_sd_layer_uses_the_sd_projections():
    """S–D layer -> linear attention with q = p (S − D), k = p (SPEC B.5 + B.7), brute force."""
    m = gpt("sd").double()
    lm = linearize(m, [1])
    assert lm.cfg.attention == ["sd", "linear", "sd"]
    att = m.blocks[1].attn
    h, d, dm = att.n_heads, att.d_head, att.d_model
    with torch.no_grad():
        kern = att.kernel()
        W_P = att.proj.weight.view(h, d, dm).transpose(-1, -2)
        b_P = att.proj.bias.view(h, d)
        x = torch.randn(2, 11, dm, dtype=torch.float64)
        ref = brute_linear_layer(
            x, W_P @ kern, torch.einsum("hd,hde->he", b_P, kern), W_P, b_P,
            att.v.weight.view(h, d, dm).transpose(-1, -2), att.v.bias.view(h, d),
            att.out.weight.view(dm, h, d).permute(1, 2, 0), att.out.bias)
        torch.testing.assert_close(lm.blocks[1].attn(x), ref)
        # the other layers are untouched and the input model unchanged
        torch.testing.assert_close(lm.blocks[0].attn(x), att.__class__.forward(m.blocks[0].attn, x))
    assert m.cfg.attention == "sd"


def test_linearized_softmax_layer_brute_force():
    m = gpt("softmax").double()
    lm = linearize(m, 0)
    w = m.blocks[0].attn.weights()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(lm.blocks[0].attn(x), brute_linear_layer(
            x, w["W_Q"], w["b_Q"], w["W_K"], w["b_K"], w["W_V"], w["b_V"], w["W_O"], w["b_O"]))


def test_linearize_bad_layers():
    with pytest.raises(ValueError, match="out of range"):
        linearize(gpt(), [3])
    with pytest.raises(ValueError, match="train_tokens"):
        linearize(gpt(), [0], fine_tune=5)
    with pytest.raises(TypeError):
        linearize(torch.nn.Linear(2, 2), [0])


def test_fine_tune_trains_only_swapped_layers():
    m = gpt("sd")
    ids = torch.randint(0, V, (600,), generator=torch.Generator().manual_seed(3))
    lm = linearize(m, [0, 1], train_tokens=ids,
                   fine_tune=FineTune(steps=3, batch_size=2, seq_len=16, lr=1e-2))
    before = linearize(m, [0, 1]).state_dict()
    after = lm.state_dict()
    for n, p in after.items():
        changed = not torch.equal(p, before[n])
        assert changed == (n.startswith(("blocks.0.attn.", "blocks.1.attn."))), n
    assert all(p.requires_grad for p in lm.parameters())


def test_linearized_model_saves_loads_and_converts(tmp_path):
    m = linearize(gpt("sd", d_head=[4, 8, 6], normalization="none"), [0, 1])
    save_model(m, tmp_path / "lin")
    m2 = load_checkpoint(tmp_path / "lin").eval()
    t = toks()
    with torch.no_grad():
        assert torch.equal(m(t), m2(t))
    assert max_logit_diff(m, to_transformer_lens(m), t) < 1e-4


def windows(n=4, p=17, seed=1):
    return torch.randint(0, V, (n, p), generator=torch.Generator().manual_seed(seed))


def test_linearization_curve_endpoints_and_roundtrip(tmp_path):
    m = gpt("softmax")
    W = windows()
    c = linearization_curve(m, W, name="tiny")
    assert c.ks == [0, 1, 2, 3]
    assert c.base_ppl == pytest.approx(perplexity(m, W)["ppl"], rel=1e-12)
    assert c.ppl_zero_shot[-1] == pytest.approx(perplexity(linearize(m, [0, 1, 2]), W)["ppl"])
    assert c.rel_delta()[0] == 0.0 and c.ppl_fine_tuned is None
    c.save(tmp_path / "c.safetensors")
    c2 = LinearizationCurve.load(tmp_path / "c.safetensors")
    assert c2.ppl_zero_shot == c.ppl_zero_shot and c2.ks == c.ks
    assert len(c.to_rows()) == 4
    plot_collapse([c, c2])


def test_linearization_curve_with_fine_tune():
    m = gpt("sd", n_layers=2)
    ids = torch.randint(0, V, (400,), generator=torch.Generator().manual_seed(2))
    c = linearization_curve(m, windows(), ks=[1], train_tokens=ids,
                            fine_tune=FineTune(steps=2, batch_size=2, seq_len=16))
    assert c.ks == [0, 1] and len(c.ppl_fine_tuned) == 2
    assert c.ppl_fine_tuned[0] == c.base_ppl and math.isfinite(c.ppl_fine_tuned[1])
    assert c.max_k_within(1e9, "fine_tuned") == 1
    with pytest.raises(ValueError, match="control"):
        c.rel_delta("control")


def test_linearization_curve_control_is_the_same_fine_tune_without_swap(tmp_path):
    from tl_spectral.interventions.surgery import fine_tune_layers

    m = gpt("softmax", n_layers=2)
    ids = torch.randint(0, V, (400,), generator=torch.Generator().manual_seed(2))
    ft = FineTune(steps=3, batch_size=2, seq_len=16)
    W = windows()
    c = linearization_curve(m, W, ks=[2], train_tokens=ids, fine_tune=ft, control=True)
    m2 = load_model_copy(m, tmp_path)
    fine_tune_layers(m2, [0, 1], ids, ft)
    assert c.ppl_control == [c.base_ppl, pytest.approx(perplexity(m2, W)["ppl"], rel=1e-9)]
    lin = linearize(m, [0, 1], train_tokens=ids, fine_tune=ft)
    assert c.ppl_fine_tuned[1] == pytest.approx(perplexity(lin, W)["ppl"], rel=1e-9)
    assert c.rel_delta("fine_tuned_vs_control")[1] == pytest.approx(
        c.ppl_fine_tuned[1] / c.ppl_control[1] - 1)
    # the fine-tune moved the control (it is not the untouched model)
    assert c.ppl_control[1] != c.base_ppl
    c.save(tmp_path / "c.safetensors")
    assert LinearizationCurve.load(tmp_path / "c.safetensors").ppl_control == c.ppl_control
    assert "delta_fine_tuned_vs_control_%" in c.to_rows()[1]
    plot_collapse([c])
    with pytest.raises(ValueError, match="control=True compares fine-tunes"):
        linearization_curve(m, W, control=True)
    with pytest.raises(ValueError, match="which must be"):
        c.rel_delta("bogus")


def load_model_copy(m, tmp_path):
    save_model(m, tmp_path / "copy")
    return load_checkpoint(tmp_path / "copy")


@pytest.mark.parametrize("kind", ["softmax", "sd"])
def test_hook_curve_equals_native_curve(kind):
    m = gpt(kind)
    W = windows()
    native = linearization_curve(m, W)
    hooked = tl_linearization_curve(to_transformer_lens(m), W)
    for a, b in zip(native.ppl_zero_shot, hooked.ppl_zero_shot):
        assert a == pytest.approx(b, rel=1e-4)


@pytest.mark.parametrize("kind", ["softmax", "sd"])
def test_attention_param_count(kind):
    m = gpt(kind, d_head=[4, 6, 8])
    assert attention_param_count(m.cfg) == sum(p.numel() for b in m.blocks
                                               for p in b.attn.parameters())


@settings(max_examples=25, deadline=None)
@given(rank=st.lists(st.floats(0.5, 7.5), min_size=3, max_size=3),
       budget=st.floats(0.3, 1.0), multiple=st.sampled_from([1, 2, 4]))
def test_cascade_allocation_properties(rank, budget, multiple):
    m = gpt("sd", d_head=8)
    try:
        a = cascade_allocation(m, budget, multiple=multiple, rank=rank)
    except ValueError as e:
        assert "budget" in str(e)
        return
    assert a.params_allocated <= budget * a.params_uniform + 1e-9
    assert a.params_allocated == attention_param_count(m.cfg, a.d_head)
    for d, r in zip(a.d_head, rank):
        assert multiple <= d <= 8 and (d % multiple == 0 or d == 8)
        assert d >= min(r, 8) - 1e-9  # never below the measured rank
    # a larger rank never gets a smaller head
    order = sorted(range(3), key=lambda i: rank[i])
    assert all(a.d_head[order[i]] <= a.d_head[order[i + 1]] for i in range(2))


def test_cascade_allocation_from_measured_rank_and_conversion(tmp_path):
    for kind in ("softmax", "sd"):
        m = gpt(kind, d_head=8)
        a = cascade_allocation(m, 0.9, multiple=2, name=kind)
        assert len(a.rank) == 3 and a.saving >= 0.1 - 1e-9
        a.save(tmp_path / f"{kind}.safetensors")
        a2 = CascadeAllocation.load(tmp_path / f"{kind}.safetensors")
        cfg = a2.config()
        assert cfg.d_heads == a.d_head and cfg.attention == kind
        torch.manual_seed(0)
        re = GPT(cfg).eval()
        with torch.no_grad():
            for p in re.parameters():
                p.add_(0.2 * torch.randn_like(p))
        # reallocated models convert to TransformerLens with identical logits
        assert max_logit_diff(re, to_transformer_lens(re), toks()) < 1e-4
        a.plot()


def test_effective_routing_rank_of_sd_model_brute_force():
    """source='R' on an S–D model: the rank of the skew part of W_P (S − D) W_Pᵀ per head."""
    from tl_spectral.interventions.surgery import measured_routing_rank

    m = gpt("sd", d_head=4, normalization="none").double()
    rank = measured_routing_rank(m, source="R")
    for l, blk in enumerate(m.blocks):
        att = blk.attn
        h, d = att.n_heads, att.d_head
        W_P = att.proj.weight.detach().view(h, d, -1).transpose(1, 2)  # [head, d_model, d]
        K = att.kernel().detach()
        ranks = []
        for i in range(h):
            M = W_P[i] @ K[i] @ W_P[i].T
            sv = torch.linalg.svdvals((M - M.T) / 2)
            sv = sv[sv > 1e-12 * sv.max()]
            p_ = sv / sv.sum()
            ranks.append(math.exp(-(p_ * p_.log()).sum().item()))
        assert rank[l] == pytest.approx(sum(ranks) / h, rel=1e-6)
    # S itself is d_head × d_head; R lives in the residual space but has the same rank bound
    a = cascade_allocation(m, 1.0, multiple=1, source="R", name="sd")
    assert a.source == "R" and all(r <= 4 + 1e-6 for r in a.rank)
    with pytest.raises(ValueError, match="source"):
        measured_routing_rank(m, source="W")
    with pytest.raises(ValueError, match="source='S'"):
        measured_routing_rank(gpt("softmax"), source="S")


def test_cascade_allocation_bad_input():
    m = gpt("sd", d_head=8)
    with pytest.raises(ValueError, match="budget"):
        cascade_allocation(m, 0.0)
    with pytest.raises(ValueError, match="budget"):
        cascade_allocation(m, 0.1, rank=[7.9, 7.9, 7.9])
    with pytest.raises(ValueError, match="rank"):
        cascade_allocation(m, 0.5, rank=[1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="all 'sd' or all"):
        cascade_allocation(gpt(["sd", "softmax", "sd"]), 0.5)


def test_allocation_study_roundtrip(tmp_path):
    st_ = AllocationStudy(rows=[
        {"name": "uniform", "d_head": [8, 8], "attention_params": 100, "total_params": 1000,
         "ppl": 5.0, "loss": 1.6, "steps": 10},
        {"name": "cascade", "d_head": [2, 8], "attention_params": 60, "total_params": 960,
         "ppl": 5.2, "loss": 1.65, "steps": 10}], recipe={"steps": 10}, n_windows=4, seq_len=16)
    st_.save(tmp_path / "s.safetensors")
    st2 = AllocationStudy.load(tmp_path / "s.safetensors")
    rows = st2.to_rows()
    assert rows[1]["attn_params_%"] == pytest.approx(60.0)
    assert rows[1]["delta_ppl_%"] == pytest.approx(4.0)
    st2.plot()


def test_report_section_renders(tmp_path):
    from tl_spectral.model_view import ModelView
    from tl_spectral.viz.report import Report
    from tl_spectral.viz.sections import ReportContext
    from tl_spectral.viz.surgery_section import SurgerySection

    m = gpt("softmax")
    linearization_curve(m, windows(), name="tiny").save(tmp_path / "s" / "curve_tiny.safetensors")
    ctx = ReportContext(view=ModelView(to_transformer_lens(m)), tokens=windows(), tokenizer=None,
                        out_dir=tmp_path / "r", results_dir=tmp_path / "r" / "results")
    ctx.results_dir.mkdir(parents=True)
    rep = Report("t")
    sec = SurgerySection()
    assert sec.probes(ctx) == []
    sec.render(rep, {mp.key: mp.run(ctx) for mp in sec.passes(ctx)}, ctx)
    out = rep.write(tmp_path / "r")
    html = out.read_text()
    assert "Spectral surgery" in html and "curve" in html.lower()
    # only the analysed model: a stored study beside it is not shown (no report option names
    # one: ReportOptions refuses unknown names)
    assert "curve_tiny" not in html and "stored study" not in html


def test_study_quick_recheck_runs_and_writes_its_own_tables(tmp_path, capsys):
    """``tl-spectral study surgery --quick --out DIR`` (the re-check docs/surgery.md offers):
    the tables step reads the curves this command just wrote, not the committed run names."""
    from tl_spectral_studies import surgery

    assert surgery.main(["--quick", "--out", str(tmp_path / "s")]) == 0
    md = (tmp_path / "s" / "summary.md").read_text()
    for name in ("char-shakespeare-noln", "sd-char-shakespeare-noln"):
        assert (tmp_path / "s" / f"curve_{name}.safetensors").is_file()
        assert f"| {name} (zoo:{name}, 8 validation windows" in md
    assert "surgery/verdict" not in md  # no committed runs here: no claim rows to render


def test_surgery_verdict_rules_follow_the_numbers():
    """The claim-table labels of docs/surgery.md are computed: a changed number changes them."""
    from tl_spectral_studies.surgery import (
        collapse_k,
        collapse_label,
        depth_label,
        graceful_label,
        paper_range_label,
    )

    assert depth_label(4, 6, 7, 12).startswith("not comparable: 4 of 6 (67%")
    assert depth_label(7, 12, 7, 12) == "reproduced"
    assert depth_label(6, 12, 7, 12) == "**not reproduced**"
    ln, noln = [0, 0.01, 0.39, 4.08], [0, 0.0, 0.01, 0.013, 0.109, 9.16]
    assert (collapse_k(ln), collapse_k(noln)) == (3, 5)
    assert collapse_label(3, 5).startswith("reproduced with LayerNorm only")
    assert collapse_label(3, 3).startswith("reproduced (")
    assert collapse_label(4, None).startswith("**not reproduced**")
    assert "not distinguishable" in graceful_label(1, -0.1, 3.5)
    assert "S–D better by 4.0 points" in graceful_label(1, -4.0, 3.5)
    assert paper_range_label([5.4, 6.6], 3.9, 8.4) == "inside the paper's range for every seed"
    assert paper_range_label([10.7], 3.9, 8.4) == "outside the paper's range for every seed"
    assert paper_range_label([5.4, 10.7], 3.9, 8.4) == "inside the paper's range for 1 of 2 seeds"
