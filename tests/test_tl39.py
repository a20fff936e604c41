"""TransformerLens 3.9 only: HookedEncoder through ModelView and run_probes.

Run by the light CI job (TL 3.9.0 installed beside the main environment); skipped on 4.x,
which has no HookedEncoder.
"""

from __future__ import annotations

import pytest
import torch

try:
    from transformer_lens import HookedEncoder  # noqa: F401
except ImportError:
    pytest.skip("HookedEncoder exists only up to TransformerLens 3.9", allow_module_level=True)

from tl_spectral.model_view import ModelView  # noqa: E402
from tl_spectral.probes import AttentionStatsProbe, run_probes  # noqa: E402


@pytest.fixture(scope="module")
def encoder():
    from transformer_lens import HookedEncoder, HookedTransformerConfig

    cfg = HookedTransformerConfig(d_model=64, d_head=16, n_layers=2, n_ctx=32, n_heads=4,
                                  d_vocab=50, act_fn="gelu", attention_dir="bidirectional",
                                  d_mlp=128, seed=0)
    model = HookedEncoder(cfg)
    # HookedEncoder leaves its weights uninitialised (it expects from_pretrained)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln.w", "ln1.w", "ln2.w", ".w")) and p.dim() == 1:
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.mark.tl39
def test_hooked_encoder_view(encoder):
    v = ModelView(encoder)
    assert v.backend == "hooked_encoder" and not v.causal
    assert v.weights(1).W_Q.shape == (4, 64, 16)
    assert torch.equal(v.weights(1).W_O, encoder.W_O[1].detach().float())
    v.check_patterns()


@pytest.mark.tl39
def test_hooked_encoder_padding_invariance(encoder):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 50, (5,), generator=g), torch.randint(0, 50, (11,), generator=g)
    alone = run_probes(encoder, [a], [AttentionStatsProbe()], progress=False)["attention_stats"]
    only_b = run_probes(encoder, [b], [AttentionStatsProbe()], progress=False)["attention_stats"]
    both = run_probes(encoder, [a, b], [AttentionStatsProbe()], batch_size=2,
                      progress=False)["attention_stats"]
    mixed = (alone.entropy * 5 + only_b.entropy * 11) / 16
    torch.testing.assert_close(both.entropy, mixed, atol=1e-5, rtol=1e-4)
