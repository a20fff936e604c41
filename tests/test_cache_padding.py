"""Issue 36 item 12: ``run_probes_on_cache`` on a padded batch passed without tokens or a
mask was silently wrong (pads counted as tokens: entropy off by up to 0.62 nats), where
``run_probes`` infers the padding and warns. The cache's ``hook_embed`` shows the pad
positions, so the same inference and the same warning apply; a cache without it warns that
the padding is unknown."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tl_spectral.probes import AttentionStatsProbe, SinkProbe, run_probes, run_probes_on_cache
from tl_spectral.probes.runner import PaddingInferredWarning, PaddingUnknownWarning


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """GPT-2-shaped, pad id 0 = BOS = EOS (a special token), as GPT-2 pads."""
    pytest.importorskip("transformer_lens.model_bridge")
    from _tiny_hf import tiny_bridge

    return tiny_bridge("gpt2", tmp_path_factory.mktemp("gpt2"), seed=3)


def _padded():
    g = torch.Generator().manual_seed(4)
    docs = [torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(1, 64, (n,), generator=g)])
            for n in (9, 6, 4)]
    tokens = torch.zeros(len(docs), 10, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, d in enumerate(docs):
        tokens[i, : len(d)], mask[i, : len(d)] = d, 1
    return tokens, mask


def _probes():
    return [AttentionStatsProbe(), SinkProbe()]


def _close(a, b):
    np.testing.assert_allclose(a["attention_stats"].entropy, b["attention_stats"].entropy,
                               atol=2e-5)
    np.testing.assert_allclose(a["attention_stats"].n_queries, b["attention_stats"].n_queries)


def test_a_padded_cache_without_tokens_or_mask_infers_the_padding(tiny_gpt2):
    tokens, mask = _padded()
    right = run_probes(tiny_gpt2, tokens, _probes(), progress=False, attention_mask=mask)
    _, cache = tiny_gpt2.run_with_cache(tokens)
    with pytest.warns(PaddingInferredWarning, match="hook_embed.*attention_mask") as rec:
        got = run_probes_on_cache(cache, _probes(), model=tiny_gpt2)
    assert len(rec) == 1
    _close(got, right)
    # teeth: the pads counted as tokens give other numbers
    counted = run_probes_on_cache(cache, _probes(), model=tiny_gpt2,
                                  attention_mask=torch.ones_like(tokens))
    with pytest.raises(AssertionError):
        _close(counted, right)


def test_a_cache_without_hook_embed_warns_that_the_padding_is_unknown(tiny_gpt2):
    tokens, _ = _padded()
    _, cache = tiny_gpt2.run_with_cache(tokens, names_filter=lambda n: "pattern" in n
                                        or n.endswith(("hook_v", "hook_z", "hook_attn_out",
                                                       "hook_resid_pre")))
    assert "hook_embed" not in cache.cache_dict
    with pytest.warns(PaddingUnknownWarning, match="attention_mask"):
        run_probes_on_cache(cache, [AttentionStatsProbe()], model=tiny_gpt2)


def test_an_unpadded_cache_and_a_given_mask_stay_silent(tiny_gpt2):
    tokens, mask = _padded()
    full = tokens.clone()
    full[full == 0] = 5
    full[:, 0] = 0  # every row starts with the BOS (the pad id): nothing is padded
    _, cache = tiny_gpt2.run_with_cache(full)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = run_probes_on_cache(cache, _probes(), model=tiny_gpt2)
        _, padded_cache = tiny_gpt2.run_with_cache(tokens)
        run_probes_on_cache(padded_cache, _probes(), model=tiny_gpt2, attention_mask=mask)
    _close(a, run_probes(tiny_gpt2, full, _probes(), progress=False,
                         attention_mask=torch.ones_like(full)))


def test_a_left_padded_cache_is_refused(tiny_gpt2):
    tokens, _ = _padded()
    left = torch.stack([torch.roll(r, int((r[1:] == 0).sum())) for r in tokens])
    _, cache = tiny_gpt2.run_with_cache(left)
    with pytest.raises(ValueError, match="left padding"):
        run_probes_on_cache(cache, _probes(), model=tiny_gpt2)
