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


# ----------------------------------------------------------------------------- item 4
@pytest.fixture(scope="module")
def small():
    return make_native(n_layers=2, seed=7)


def test_one_token_documents_get_a_clear_error(small):
    from tl_spectral.probes.faithfulness import faithfulness
    from tl_spectral.probes.sinks import zero_sink_value

    one = torch.tensor([[3], [4]])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        faithfulness(small, one, fractions=[0, 0.5])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        zero_sink_value(small, one)
    # one 1-token document among longer ones is fine, and finite
    r = zero_sink_value(small, [[3], [4, 5, 6, 7]])
    assert torch.isfinite(r.delta).all()


def test_zero_sink_value_warns_when_not_finite(small, monkeypatch):
    import tl_spectral.probes.faithfulness as F
    from tl_spectral.probes.sinks import zero_sink_value

    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    real = F._Metric.run

    def run(self, tokens, mask, hooks, *, attn_mask):  # a model whose logits overflow
        inf = ("ln_final.hook_normalized", lambda t, hook: t * float("inf"))
        return real(self, tokens, mask, hooks + [inf], attn_mask=attn_mask)

    monkeypatch.setattr(F._Metric, "run", run)
    with pytest.warns(RuntimeWarning, match="NaN or inf"):
        zero_sink_value(small, tokens)


def test_faithfulness_frame_has_both_settings(small):
    from tl_spectral.probes.faithfulness import faithfulness

    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    r = faithfulness(small, tokens, fractions=[0, 0.5], layer=1)
    df = r.to_frame()
    assert len(df) == 2 * len(r.measures) == 10
    assert list(df.columns[:2]) == ["setting", "measure"]
    assert list(df["setting"].unique()) == ["all layers", "layer 1"]
    for si in range(2):
        sub = df[df["setting"] == r.settings[si]]
        np.testing.assert_allclose(sub["comprehensiveness_area"].to_numpy(),
                                   r.comprehensiveness_area[si].numpy(), rtol=1e-6)
    html = r._repr_html_()
    assert "<th>setting</th>" in html and "layer 1" in html


# ----------------------------------------------------------------------------- item 14
def _fake_ipython(monkeypatch):
    """IPython with a live shell whose display() records what it is given."""
    import sys
    import types

    shown: list = []
    ip = types.ModuleType("IPython")
    ip.get_ipython = lambda: object()
    disp = types.ModuleType("IPython.display")
    disp.display = lambda obj: shown.append(obj)
    ip.display = disp
    monkeypatch.setitem(sys.modules, "IPython", ip)
    monkeypatch.setitem(sys.modules, "IPython.display", disp)
    return shown


def test_show_displays_once_and_returns_none(small, monkeypatch):
    import matplotlib.pyplot as plt

    from tl_spectral.probes.sinks import zero_sink_value

    shown = _fake_ipython(monkeypatch)
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    plt.close("all")
    fig_result = zero_sink_value(small, tokens)  # figure-based: no circuitsvis view
    assert fig_result.show() is None  # nothing for Jupyter to display a second time
    assert len(shown) == 1 and callable(getattr(shown[0], "savefig", None))
    assert plt.get_fignums() == []  # closed: the inline backend adds no copy
    stats = run_probes(small, tokens, [AttentionStats()], progress=False)["attention_stats"]
    assert stats.show() is None  # its circuitsvis view, displayed once
    assert len(shown) == 2 and hasattr(shown[1], "local_src")
    assert plt.get_fignums() == []


def test_show_outside_a_notebook_says_how_to_save(small):
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    stats = run_probes(small, tokens, [AttentionStats()], progress=False)["attention_stats"]
    with pytest.warns(UserWarning, match="view"):
        assert stats.show() is None
