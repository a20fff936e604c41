"""The worked example of docs/probes.md runs and is right."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tl_spectral.probes import AttentionStatsProbe

DOC = Path(__file__).resolve().parents[1] / "docs" / "probes.md"


def test_probes_md_worked_example(native_gqa):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    code = blocks[-1]
    ns = {"model": native_gqa, "windows": torch.randint(0, 50, (5, 12)),
          "AttentionStatsProbe": AttentionStatsProbe}
    exec(compile(code, str(DOC), "exec", dont_inherit=True), ns)
    res = ns["results"]["head_output_norm"]
    assert res.mean_norm.shape == (3, 4) and (res.mean_norm > 0).all()
    # the user's hook on the last layer ran once, on the real batch; the logits came back
    assert ns["seen"] == [(5, 12, 64)]
    assert ns["logits"].shape == (5, 12, 50)
    # brute force for layer 0, head 1 with explicit per-source d_model vectors
    from tl_spectral.model_view import ModelView

    v = ModelView(native_gqa)
    got = {}
    hooks = [(v.hook_pattern(0), lambda t, hook: got.__setitem__("p", t)),
             (v.hook_v(0), lambda t, hook: got.__setitem__("v", v.repeat_kv(t, 2)))]
    v.run(ns["windows"], fwd_hooks=hooks, return_type=None)
    W_O = v.weights(0).W_O
    vt = torch.einsum("bkd,dm->bkm", got["v"][:, :, 1], W_O[1])
    o = torch.einsum("bqk,bkm->bqm", got["p"][:, 1], vt)
    torch.testing.assert_close(res.mean_norm[0, 1], o.norm(dim=-1).mean(), rtol=1e-5, atol=1e-6)
