"""Edges of the probe API (issue 30): stale weights, unmasked padding, frames of the model,
degenerate inputs, common API mistakes and notebook display."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_native
from tl_spectral.probes import (
    AttentionFieldProbe,
    AttentionStats,
    ContributionProbe,
    SinkProbe,
    run_probes,
)


def _same(a, b, atol=1e-5):
    """Two results hold the same values (every array field)."""
    da, db = a.to_dict(), b.to_dict()
    assert da.keys() == db.keys()
    for k in da:
        x, y = da[k], db[k]
        if isinstance(x, dict):
            assert x.keys() == y.keys(), k
            for kk in x:
                np.testing.assert_allclose(x[kk], y[kk], atol=atol, rtol=1e-4, err_msg=f"{k}.{kk}")
        elif isinstance(x, np.ndarray):
            np.testing.assert_allclose(x, y, atol=atol, rtol=1e-4, err_msg=k)


def _weight_probes():
    """Every shipped probe class that reads the model's weights."""
    return [ContributionProbe(rank_stride=1), SinkProbe(),
            AttentionFieldProbe(field="contribution", max_lag=6),
            AttentionFieldProbe(field="value_weighted", max_lag=6)]


# ----------------------------------------------------------------------------- item 1
def test_reused_probes_read_weights_edited_in_place_between_runs():
    model = make_native(n_layers=2, seed=5)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    probes = _weight_probes()
    run_probes(model, tokens, probes, progress=False)  # first run: caches any weights
    d_head = model.cfg.d_head
    with torch.no_grad():  # edit in place: zero head 1's rows of every layer's W_O
        for name, p in model.named_parameters():
            if name.endswith("attn.W_O"):  # HookedTransformer: [head, d_head, d_model]
                p[1] = 0
            elif name.endswith("attn._original_component.o._original_component.weight"):
                p[:, d_head : 2 * d_head] = 0  # bridge: nn.Linear [d_model, head·d_head]
    assert float(model.blocks[0].attn.W_O[1].detach().abs().max()) == 0.0
    again = run_probes(model, tokens, probes, progress=False)
    fresh = run_probes(model, tokens, _weight_probes(), progress=False)
    for name in fresh:
        _same(again[name], fresh[name])
