"""HeadScoresProbe against a brute force built from TransformerLens' own head-detector patterns,
on a model with a planted previous-token head (layer 0) and a planted induction head
(layer 1), weights constructed by hand."""

from __future__ import annotations

import pytest
import torch

V, N = 8, 24  # vocabulary, context
C = 40.0  # score of a planted match (after the 1/sqrt(d_head) scaling)


def planted_model():
    """Attention-only, no normalization, 2 layers × 2 heads, residual = [token one-hot (V) |
    position one-hot (N) | previous token one-hot (V)]. L0H0 attends from i to i − 1 and
    writes the previous token into the third block; L1H0 attends from i to every key j whose
    previous token equals t_i (induction). Heads 1 are zero (uniform attention)."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    d = V + N + V
    cfg = TransformerBridgeConfig(n_layers=2, d_model=d, n_ctx=N, d_head=N, n_heads=2,
                                  d_vocab=V, attn_only=True, normalization_type=None,
                                  act_fn="relu", seed=0)
    m = TransformerBridge.boot_native(cfg)
    s = C * N ** 0.5
    W = {k: torch.zeros(2, 2, d, N) for k in "QKV"}  # [layer, head, d_model, d_head]
    WO = torch.zeros(2, 2, N, d)
    for i in range(N):
        W["Q"][0, 0, V + i, i] = s
        if i + 1 < N:
            W["K"][0, 0, V + i, i + 1] = 1.0
    for t in range(V):
        W["V"][0, 0, t, t] = 1.0
        WO[0, 0, t, V + N + t] = 1.0
        W["Q"][1, 0, t, t] = s
        W["K"][1, 0, V + N + t, t] = 1.0
    params = dict(m.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.zero_()
        params["tok_embed._original_component.weight"][:, :V] = torch.eye(V)
        params["pos._original_component.weight"][:, V:V + N] = torch.eye(N)
        for layer in range(2):
            pre = f"layers.{layer}._original_component.attn._original_component."
            for k in "QKV":  # nn.Linear [heads · d_head, d_model], heads in blocks of rows
                params[pre + f"{k.lower()}._original_component.weight"].copy_(
                    W[k][layer].permute(0, 2, 1).reshape(2 * N, d))
            params[pre + "o._original_component.weight"].copy_(
                WO[layer].reshape(2 * N, d).T)
    return m


def _patterns(model, seq):
    """[layer][head, q, k] patterns of one sequence, through the ModelView hooks."""
    from tl_spectral.model_view import ModelView

    view = ModelView(model)
    cap = {}

    def hook_for(layer):
        def hook(t, hook=None):
            cap[layer] = t[0].detach().double()
            return t
        return hook

    with torch.no_grad():
        view.run(seq[None], fwd_hooks=[(view.hook_pattern(la), hook_for(la)) for la in range(2)],
                 return_type=None)
    return cap


def brute_force(model, tokens):
    """Per (layer, head), TransformerLens' detection-pattern score ("mul") of each sequence,
    averaged over the sequences (equal lengths)."""
    from transformer_lens.head_detector import (
        compute_head_attention_similarity_score,
        get_duplicate_token_head_detection_pattern,
        get_induction_head_detection_pattern,
        get_previous_token_head_detection_pattern,
    )

    pats = {"previous_token": get_previous_token_head_detection_pattern,
            "duplicate_token": get_duplicate_token_head_detection_pattern,
            "induction": get_induction_head_detection_pattern}
    out = {k: torch.zeros(2, 2, dtype=torch.float64) for k in (*pats, "first_token")}
    for seq in tokens:
        cap = _patterns(model, seq)
        for layer in range(2):
            pat = cap[layer]
            for h in range(2):
                for k, f in pats.items():
                    out[k][layer, h] += compute_head_attention_similarity_score(
                        pat[h].clone(), f(seq[None].cpu()).double(), exclude_bos=False,
                        exclude_current_token=False, error_measure="mul")
                first = torch.zeros(len(seq), len(seq), dtype=torch.float64)
                first[:, 0] = 1
                out["first_token"][layer, h] += compute_head_attention_similarity_score(
                    pat[h].clone(), first, exclude_bos=False, exclude_current_token=False,
                    error_measure="mul")
    return {k: v / len(tokens) for k, v in out.items()}


@pytest.fixture(scope="module")
def model():
    return planted_model()


def test_head_scores_match_transformer_lens_and_find_the_planted_heads(model):
    from tl_spectral.probes import HeadScoresProbe, run_probes
    from tl_spectral.probes.head_scores import repeated_random_tokens

    g = torch.Generator().manual_seed(0)
    corpus = torch.randint(0, V, (5, 20), generator=g)
    rep = repeated_random_tokens(range(V), 4, 10, seed=1)
    for toks in (corpus, rep):
        res = run_probes(model, toks, [HeadScoresProbe()], progress=False, batch_size=2)["head_scores"]
        want = brute_force(model, toks)
        for k, w in want.items():
            torch.testing.assert_close(getattr(res, k).double(), w, atol=1e-5, rtol=0, msg=k)
    # the planted heads: L0H0 previous-token, L1H0 induction on the repeated sequences
    assert float(res.previous_token[0, 0]) > 0.9
    # on a block repeated once only the second half's queries have an earlier copy: an
    # induction head's score sits near one half (plus random repeats inside the blocks)
    assert float(res.induction[1, 0]) > 0.45
    assert float(res.previous_token[0, 1]) < 0.3 and float(res.induction[1, 1]) < 0.2
    assert res.top("induction", 1)[0][:2] == (1, 0)
    assert res.top("previous_token", 1)[0][:2] == (0, 0)


def test_token_sets_and_padding(model):
    """Token-set mass against a direct sum; right padding does not change the scores of the
    real tokens."""
    from tl_spectral.probes import HeadScoresProbe, run_probes

    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, V, (3, 16), generator=g)
    res = run_probes(model, toks, [HeadScoresProbe(token_sets={"low": [0, 1]})],
                     progress=False)["head_scores"]
    want = torch.zeros(2, 2, dtype=torch.float64)
    for seq in toks:
        cap = _patterns(model, seq)
        for layer in range(2):
            pat = cap[layer]  # [h, q, k]
            want[layer] += pat[..., (seq <= 1)].sum(-1).mean(-1)
    torch.testing.assert_close(res.set_mass["low"].double(), want / 3, atol=1e-5, rtol=0)
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[1, 10:] = False
    padded = run_probes(model, toks, [HeadScoresProbe()], attention_mask=mask,
                        progress=False)["head_scores"]
    short = [toks[0], toks[1, :10], toks[2]]
    # pooled over real queries: (Σ scores·n) / Σ n over the three documents
    num = torch.zeros(2, 2, dtype=torch.float64)
    for seq in short:
        w = brute_force(model, seq[None])
        num += w["previous_token"] * len(seq)
    torch.testing.assert_close(padded.previous_token.double(), num / 42, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="empty"):
        HeadScoresProbe(token_sets={"x": []})
