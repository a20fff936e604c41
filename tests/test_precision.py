"""Half-precision models are probed: bfloat16 / float16 boots of tiny random models of
each family against the float32 boot of the same weights.

Captures are cast to float32 by the runner, so the differences below come from the model's
own forward pass in half precision. Bounds, in units of the dtype's machine epsilon
(eps = 7.8e-3 for bfloat16, 9.8e-4 for float16), on these models (2 layers, d_model 32,
T = 16, 4 documents; measured worst case over the six families in brackets, bf16 / fp16):

* pattern statistics — AttentionStatsProbe first-token mass, mean pattern, distance / T,
  SinkProbe sink rate and key score, AttentionFieldProbe fields and mean — and entropy
  (nats): max abs difference ≤ 4 eps  [1.1 / 1.6 eps];
* SinkProbe mean anti-alignment cos(ṽ_0, s_i) and mean clamped ρ*: ≤ 8 eps  [1.0 / 0.5];
* ContributionProbe mean contribution by source and by lag: ≤ 4 eps  [0.4 / 0.3];
  negative-pair fraction: ≤ 4 eps  [1.0 / 1.8] (pairs near 0 may change sign);
* per-pair contribution maps (kept documents), relative to their largest |c|: ≤ 16 eps
  [6.0 / 3.7]: ``c_ij = α_ij ⟨o_i, ṽ_j⟩ / ‖o_i‖²`` amplifies the error by ‖ṽ_j‖ / ‖o_i‖.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _tiny_hf import FAMILIES, boot, save_tiny  # noqa: E402

from tl_spectral.model_view import ModelView  # noqa: E402
from tl_spectral.probes import (  # noqa: E402
    AttentionFieldProbe,
    AttentionStatsProbe,
    ContributionProbe,
    SinkProbe,
    run_probes,
)
from tl_spectral.probes.runner import UnderflowWarning  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16)
TOKENS = torch.randint(1, 60, (4, 16), generator=torch.Generator().manual_seed(0))


def _probes():
    return [AttentionStatsProbe(), ContributionProbe(keep_docs=[0], rank_queries=2), SinkProbe(),
            AttentionFieldProbe()]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            folder = tmp_path_factory.mktemp(f"prec_{family}")
            save_tiny(family, folder, seed=10 + FAMILIES.index(family))
            ref = run_probes(boot(folder), TOKENS, _probes(), batch_size=2, progress=False)
            cache[family] = (folder, ref)
        return cache[family]

    return get


def _d(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_probes_close_to_float32(family, dtype, folders):
    folder, ref = folders(family)
    model = boot(folder, dtype=dtype)
    view = ModelView(model)
    assert view.dtype == dtype
    assert view.tolerance == pytest.approx(8 * torch.finfo(dtype).eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnderflowWarning)  # a few far pairs may underflow
        res = run_probes(model, TOKENS, _probes(), batch_size=2, progress=False)
    eps = torch.finfo(dtype).eps
    A, A0 = res["attention_stats"], ref["attention_stats"]
    S, S0 = res["sinks"], ref["sinks"]
    F, F0 = res["attention_fields"], ref["attention_fields"]
    C, C0 = res["contributions"], ref["contributions"]
    # every result is float32 (analyses computed in float32), on the CPU
    for t in (A.entropy, A.mean_pattern, S.sink_rate, S.anti_mean, C.source_mean,
              F.fields["0"], F.mean["0"]):
        assert t.dtype == torch.float32 and t.device.type == "cpu"
    T = TOKENS.shape[1]
    pattern_level = {
        "entropy": _d(A.entropy, A0.entropy),
        "first_token_mass": _d(A.first_token_mass, A0.first_token_mass),
        "mean_pattern": _d(A.mean_pattern, A0.mean_pattern),
        "distance/T": _d(A.distance, A0.distance) / T,
        "sink_rate": _d(S.sink_rate, S0.sink_rate),
        "key_score": _d(S.key_score, S0.key_score),
        "fields": max(_d(F.fields[k], F0.fields[k]) for k in F0.fields),
        "field_mean": max(_d(F.mean[k], F0.mean[k]) for k in F0.mean),
        "source_mean": _d(C.source_mean, C0.source_mean),
        "lag_mean": _d(C.lag_mean, C0.lag_mean),
        "negative_fraction": _d(C.negative_fraction, C0.negative_fraction),
    }
    for name, err in pattern_level.items():
        assert err <= 4 * eps, (family, dtype, name, err / eps)
    for name, err in {"anti_mean": _d(S.anti_mean, S0.anti_mean),
                      "rho_mean": _d(S.rho_mean, S0.rho_mean)}.items():
        assert err <= 8 * eps, (family, dtype, name, err / eps)
    for key, c0 in C0.kept_maps.items():
        if key.endswith((".contribution", ".token")):
            rel = _d(C.kept_maps[key], c0) / float(c0.abs().max())
            assert rel <= 16 * eps, (family, dtype, key, rel / eps)


def test_underflow_in_half_softmax_warns(tmp_path):
    """Sharp float16 attention rounds small weights to exactly 0: the runner says so."""
    save_tiny("gpt2", tmp_path, seed=3, init_std=1.5)
    m16 = boot(tmp_path, dtype=torch.float16)
    tokens = torch.randint(1, 60, (2, 24), generator=torch.Generator().manual_seed(1))
    with pytest.warns(UnderflowWarning, match="underflow to exactly 0"):
        res = run_probes(m16, tokens, [AttentionStatsProbe()], progress=False)
    assert torch.isfinite(res["attention_stats"].entropy).all()
    with warnings.catch_warnings():  # the same weights in float32: nothing to say
        warnings.simplefilter("error", UnderflowWarning)
        run_probes(boot(tmp_path), tokens, [AttentionStatsProbe()], progress=False)


def test_pattern_check_tolerance_scales_with_dtype(monkeypatch):
    """A float32 model whose pattern rows miss 1 by 1e-2 is refused (tolerance 1e-3)."""
    from conftest import make_native

    m = make_native(n_layers=1, d_model=32, n_heads=2, d_head=16, n_ctx=16)
    view = ModelView(m)
    assert view.tolerance == pytest.approx(1e-3)

    def skew(t, hook):
        return t * 1.01

    tokens = torch.randint(0, 50, (1, 8))
    with m.hooks(fwd_hooks=[(view.hook_pattern(0), skew)]):
        with pytest.raises(FloatingPointError, match="within 1.0e-03"):
            run_probes(m, tokens, [AttentionStatsProbe()], progress=False)
