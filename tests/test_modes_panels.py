"""The mode mosaic's panels: queries and lags averaged in blocks to at most ``max_rows`` /
``max_cols`` (a T = 1,024 report keeps panels no wider than a figure shows), checked
against a direct block average; narrow panels unchanged."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tl_spectral.viz.multiples import modes_figure, modes_panels


def _pod(T: int, n_lags: int, seed: int = 0):
    """A stand-in ScalePODResult: one layer, its whole-field first mode only."""
    g = torch.Generator().manual_seed(seed)
    mode = torch.randn(1, T, n_lags, generator=g, dtype=torch.float64)
    lay = SimpleNamespace(layer=0, full_modes=mode, lags=torch.arange(n_lags), bands=[],
                          band_modes={}, band_lags={})
    return SimpleNamespace(layers=[lay]), mode[0].numpy()


def _brute_blocks(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Block means by explicit loops (the last block padded with the edge value)."""
    fr = max(1, math.ceil(a.shape[0] / rows))
    fc = max(1, math.ceil(a.shape[1] / cols))
    out = np.zeros((math.ceil(a.shape[0] / fr), math.ceil(a.shape[1] / fc)))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            vals = [a[min(i * fr + di, a.shape[0] - 1), min(j * fc + dj, a.shape[1] - 1)]
                    for di in range(fr) for dj in range(fc)]
            out[i, j] = np.mean(vals)
    return out


@pytest.mark.parametrize("T,n_lags,max_cols", [(64, 300, 64), (40, 37, 8), (16, 16, 256)])
def test_panels_are_block_means_of_the_mode(T, n_lags, max_cols):
    pod, mode = _pod(T, n_lags)
    data = modes_panels(pod, max_rows=12, max_cols=max_cols)
    m = data["lags"]
    assert 8 <= m <= n_lags
    want = _brute_blocks(mode[:, :m], 12, max_cols)
    want = want / np.abs(want).max()
    got = data["panels"][0, 0]
    assert got.shape == want.shape and got.shape[1] <= max_cols
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert data["lag_block"] == max(1, math.ceil(m / max_cols))


def test_narrow_panels_keep_every_lag_and_the_label_says_when_lags_are_pooled():
    import matplotlib.pyplot as plt

    pod, _ = _pod(32, 100)
    narrow = modes_panels(pod, max_cols=256)
    assert narrow["lag_block"] == 1 and narrow["panels"].shape[-1] == narrow["lags"]
    wide = modes_panels(pod, max_cols=10)
    assert wide["lag_block"] > 1
    for data, pooled in ((narrow, False), (wide, True)):
        fig = modes_figure(data)
        label = fig.axes[0].get_xlabel()
        assert f"lag 0–{data['lags'] - 1}" in label
        assert ("lags per column" in label) is pooled
        plt.close(fig)
