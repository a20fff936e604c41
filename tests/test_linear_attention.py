"""Linear attention (SPEC B.5): O(T) path vs quadratic reference, pattern view, conversion."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_spectral.models import GPT, GPTConfig, make_attention, to_transformer_lens
from tl_spectral.models.attention import causal_linear_attention, linear_attention_pattern
from tl_spectral.models.convert import max_logit_diff


def reference(q, k, v):
    """Brute force, one query at a time: o_i = Σ_{j<=i} φ(q_i)·φ(k_j) v_j / Σ_{j<=i} ..."""
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(q.shape[-2]):
        w = (phi(q[..., i:i + 1, :]) * phi(k[..., :i + 1, :])).sum(-1)  # [..., i+1]
        out[..., i, :] = (w.unsqueeze(-1) * v[..., :i + 1, :]).sum(-2) / w.sum(-1, keepdim=True)
    return out


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 40), chunk=st.integers(1, 17), d=st.integers(1, 6),
       dv=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_chunked_equals_quadratic_reference(p, chunk, d, dv, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, p, d, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    v = torch.randn(2, 3, p, dv, generator=g, dtype=torch.float64)
    ref = reference(q, k, v)
    torch.testing.assert_close(causal_linear_attention(q, k, v, chunk_size=chunk), ref)
    torch.testing.assert_close(linear_attention_pattern(q, k) @ v, ref)


@pytest.mark.parametrize("chunk", [1, 2])  # 300 and 150 chunks: past the matmul limit
def test_many_chunks_take_the_cumsum_prefix_and_agree(chunk):
    from tl_spectral.models import attention as A

    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 300, 3, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 2, 300, 2, generator=g, dtype=torch.float64)
    assert 300 // chunk > A._PREFIX_MATMUL_MAX
    ref = linear_attention_pattern(q, k) @ v
    torch.testing.assert_close(causal_linear_attention(q, k, v, chunk_size=chunk), ref)


@given(n=st.integers(1, 300), rest=st.integers(1, 4), seed=st.integers(0, 1000))
@settings(max_examples=20, deadline=None)
def test_exclusive_prefix_both_paths(n, rest, seed):
    from tl_spectral.models.attention import _exclusive_prefix

    x = torch.randn(2, n, rest, 3, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    brute = torch.stack([x[:, :m].sum(1) for m in range(n)], dim=1)
    torch.testing.assert_close(_exclusive_prefix(x, dim=1), brute)
    torch.testing.assert_close(_exclusive_prefix(x, dim=-3), brute)


def test_pattern_is_causal_and_normalised():
    q, k = torch.randn(2, 5, 9, 4, dtype=torch.float64), torch.randn(2, 5, 9, 4, dtype=torch.float64)
    a = linear_attention_pattern(q, k)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 5, 9, dtype=torch.float64))
    lower = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (a[..., ~lower] == 0).all() and (a[..., lower] > 0).all()


def test_chunked_gradients_match_reference():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 13, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    w = torch.randn(1, 2, 13, 3, dtype=torch.float64)
    ga = torch.autograd.grad((causal_linear_attention(q, k, v, chunk_size=4) * w).sum(), (q, k, v))
    gb = torch.autograd.grad((reference(q, k, v) * w).sum(), (q, k, v))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


def test_module_pattern_view_reproduces_output():
    torch.manual_seed(0)
    att = make_attention("linear", 16, 4, 5, 64).double()
    for p_ in att.parameters():
        p_.data.normal_(0, 0.5)
    x = torch.randn(3, 50, 16, dtype=torch.float64)
    fast = att(x)
    out, pattern = att(x, return_pattern=True)
    torch.testing.assert_close(fast, out)
    assert pattern.shape == (3, 4, 50, 50)
    # the pattern alone, through v and W_O, gives the output (SPEC B.5: it is attention)
    w = att.weights()
    v = torch.einsum("bpm,hmd->bhpd", x, w["W_V"]) + w["b_V"][None, :, None]
    manual = torch.einsum("bhqk,bhkd,hdm->bqm", pattern, v, w["W_O"]) + w["b_O"]
    torch.testing.assert_close(manual, fast)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="chunk_size"):
        causal_linear_attention(torch.ones(1, 2, 3), torch.ones(1, 2, 3), torch.ones(1, 2, 3),
                                chunk_size=0)
    with pytest.raises(ValueError, match="equal shape"):
        causal_linear_attention(torch.ones(1, 2, 3), torch.ones(1, 3, 3), torch.ones(1, 2, 3))


def _random_gpt(attention, d_head=None, normalization="ln", seed=0):
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=13, n_layers=len(attention), n_heads=2, d_model=16, n_ctx=32,
                      d_head=d_head, attention=attention, normalization=normalization)).eval()
    with torch.no_grad():
        for p_ in m.parameters():
            p_.add_(0.2 * torch.randn_like(p_))
    return m


@pytest.mark.parametrize("d_head,norm", [(None, "ln"), ([4, 8, 6], "none")])
def test_converted_linear_layers_same_logits_and_patterns(d_head, norm):
    m = _random_gpt(["linear", "sd", "linear"], d_head=d_head, normalization=norm)
    tl = to_transformer_lens(m)
    toks = torch.randint(0, 13, (2, 20))
    assert max_logit_diff(m, tl, toks) < 1e-4
    # a probe's hook (registered after the permanent ones) sees the linear pattern
    got = {}

    def cap(t, hook=None):
        got[hook.name] = t.detach().clone()
        return t

    with torch.no_grad():
        _, native = m(toks, return_patterns=True)
        tl.run_with_hooks(toks, fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", cap)
                                           for l in range(3)])
    for l in range(3):
        torch.testing.assert_close(got[f"blocks.{l}.attn.hook_pattern"], native[l],
                                   atol=1e-5, rtol=1e-4)
    tl.reset_hooks()  # permanent hooks survive
    assert max_logit_diff(m, tl, toks) < 1e-4


def test_probes_read_linear_patterns():
    from tl_spectral.model_view import ModelView
    from tl_spectral.probes import AttentionStatsProbe, run_probes

    m = _random_gpt(["linear", "softmax"])
    tl = to_transformer_lens(m)
    toks = torch.randint(0, 13, (3, 16))
    res = run_probes(ModelView(tl), toks, [AttentionStatsProbe()], batch_size=3, progress=False)
    stats = res["attention_stats"]
    with torch.no_grad():
        _, pats = m(toks, return_patterns=True)
    # entropy of layer 0 from the native linear pattern, mean over every query
    p = pats[0].double()
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1).mean((0, 2))
    torch.testing.assert_close(stats.entropy[0].double(), ent, atol=1e-4, rtol=1e-4)
