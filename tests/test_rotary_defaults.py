"""Issue 36 item 13: ``model_rotary_geometry`` averaged over the model's whole context by
default (8,192 positions for SmolLM2: 133 s) and had no ``layers=``. The default window is
now ``min(model context, DEFAULT_ROTARY_CTX)`` (the caller passes the analysed window), and
``layers=[...]`` gives exactly those layers' rows of the full result."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tl_spectral.geometry.model import DEFAULT_ROTARY_CTX, model_rotary_geometry
from tl_spectral.models import GPT, GPTConfig


def _rotary(n_ctx=12, n_layers=3, seed=0):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=20, n_layers=n_layers, n_heads=2, d_model=16, d_head=8,
                    n_ctx=n_ctx, d_mlp=32, positional="rotary", rotary_base=100.0)
    return GPT(cfg).eval()


def test_layers_are_the_rows_of_the_full_result():
    m = _rotary()
    full = model_rotary_geometry(m, progress=False)
    sub = model_rotary_geometry(m, layers=[0, 2], progress=False)
    assert sub.layer_names == ["L0", "L2"] and full.layer_names == ["L0", "L1", "L2"]
    assert full.mean_eff_rank_exact and sub.mean_eff_rank_exact
    compared = 0
    for f in dataclasses.fields(full):
        a, b = getattr(full, f.name), getattr(sub, f.name)
        if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == 3:
            torch.testing.assert_close(b, a[[0, 2]], rtol=1e-12, atol=1e-12, msg=f.name)
            compared += 1
        elif f.name == "d_head":
            assert b == [a[0], a[2]]
        elif f.name not in ("layer_names",):
            assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), f.name
    assert compared >= 15
    assert list(sub.to_frame()["layer_name"].unique()) == ["L0", "L2"]


@pytest.mark.parametrize("bad", [[3], [-1], [0, 0], [], 1, ["0"]])
def test_bad_layers_are_one_line_errors(bad):
    with pytest.raises(ValueError, match="layer"):
        model_rotary_geometry(_rotary(), layers=bad, progress=False)


def test_the_default_window_is_capped_and_an_explicit_one_wins():
    assert DEFAULT_ROTARY_CTX == 1024
    big = _rotary(n_ctx=2 * DEFAULT_ROTARY_CTX, n_layers=1)
    g = model_rotary_geometry(big, average_ranks=False, progress=False)
    assert g.dist_offsets.numel() == DEFAULT_ROTARY_CTX  # causal Δ in {−1023, …, 0}
    assert int(g.offsets.min()) == -(DEFAULT_ROTARY_CTX - 1)
    same = model_rotary_geometry(big, n_ctx=DEFAULT_ROTARY_CTX, average_ranks=False,
                                 progress=False)
    torch.testing.assert_close(g.mean_routing_fraction, same.mean_routing_fraction)
    own = model_rotary_geometry(big, n_ctx=64, average_ranks=False, progress=False)
    assert own.dist_offsets.numel() == 64
    small = model_rotary_geometry(_rotary(n_ctx=12, n_layers=1), average_ranks=False,
                                  progress=False)
    assert small.dist_offsets.numel() == 12  # a context below the cap: the whole context
