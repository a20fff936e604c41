"""Tiny random-weight Hugging Face models of the families TransformerLens users analyse,
saved to a folder with a small character tokenizer and booted through
``TransformerBridge.boot_transformers`` (eager attention, so patterns are exposed).

Shared by tests/test_architectures.py, tests/test_precision.py and benchmarks/real_size.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

FAMILIES = ("gpt2", "gpt_neox", "llama", "qwen2", "gemma2", "bert")
ROTARY = ("gpt_neox", "llama", "qwen2", "gemma2")
VOCAB = 64
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n-"


def hf_config(family: str, *, n_layers: int = 2, d_model: int = 32, n_heads: int = 4,
              n_ctx: int = 64, vocab: int = VOCAB, d_mlp: int | None = None) -> Any:
    """A small random config of ``family`` (grouped-query with 2 kv heads for llama/qwen2/gemma2)."""
    import transformers as tr

    d_mlp = d_mlp or 2 * d_model
    d_head = d_model // n_heads
    if family == "gpt2":
        return tr.GPT2Config(vocab_size=vocab, n_positions=n_ctx, n_embd=d_model,
                             n_layer=n_layers, n_head=n_heads, n_inner=d_mlp,
                             bos_token_id=0, eos_token_id=0)
    if family == "gpt_neox":
        return tr.GPTNeoXConfig(vocab_size=vocab, hidden_size=d_model,
                                num_hidden_layers=n_layers, num_attention_heads=n_heads,
                                intermediate_size=d_mlp, max_position_embeddings=n_ctx,
                                rotary_pct=0.25, bos_token_id=0, eos_token_id=0)
    kv = max(1, n_heads // 2)
    if family == "llama":
        return tr.LlamaConfig(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_mlp,
                              num_hidden_layers=n_layers, num_attention_heads=n_heads,
                              num_key_value_heads=kv, max_position_embeddings=n_ctx,
                              bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "qwen2":
        return tr.Qwen2Config(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_mlp,
                              num_hidden_layers=n_layers, num_attention_heads=n_heads,
                              num_key_value_heads=kv, max_position_embeddings=n_ctx,
                              bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gemma2":
        return tr.Gemma2Config(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_mlp,
                               num_hidden_layers=n_layers, num_attention_heads=n_heads,
                               num_key_value_heads=kv, head_dim=d_head,
                               max_position_embeddings=n_ctx, sliding_window=n_ctx,
                               bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "bert":
        return tr.BertConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=n_layers,
                             num_attention_heads=n_heads, intermediate_size=d_mlp,
                             max_position_embeddings=n_ctx, pad_token_id=0)
    raise ValueError(f"unknown family {family!r}; pick one of {FAMILIES}")


def char_tokenizer(vocab: int = VOCAB):
    """A fast character-level tokenizer with ``vocab`` ids (id 0 = <pad>/<unk>/bos/eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(_ALPHABET)[: vocab - 1]
    v = {"<pad>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab=v, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<pad>", pad_token="<pad>",
                                   bos_token="<pad>", eos_token="<pad>")


def save_tiny(family: str, folder: str | Path, *, seed: int = 0, init_std: float = 0.2,
              **cfg_kw: Any) -> Path:
    """Save a random ``family`` model (norm weights randomised too) and the tokenizer."""
    import transformers as tr

    folder = Path(folder)
    cfg = hf_config(family, **cfg_kw)
    torch.manual_seed(seed)
    cls = tr.BertForMaskedLM if family == "bert" else tr.AutoModelForCausalLM
    model = cls.from_config(cfg) if cls is tr.AutoModelForCausalLM else cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith(("ln_1.weight", "ln_2.weight",
                                                        "ln_f.weight")):
                # non-trivial gains (and for Gemma's 1 + w, a non-zero w) so folding is tested
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if family == "gemma2" else 1.0))
            elif p.dim() >= 2:
                p.normal_(0.0, init_std)
            else:
                p.normal_(0.0, 0.05)
    model.save_pretrained(folder)
    char_tokenizer(cfg.vocab_size).save_pretrained(folder)
    return folder


def boot(folder: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """TransformerBridge of the saved model with eager attention."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(
        str(folder), device=device, dtype=dtype,
        hf_config_overrides={"attn_implementation": "eager"})


def tiny_bridge(family: str, folder: str | Path, *, dtype: torch.dtype = torch.float32,
                seed: int = 0, **cfg_kw: Any):
    save_tiny(family, folder, seed=seed, **cfg_kw)
    return boot(folder, dtype=dtype)


def save_smol_shape(folder: str | Path, *, n_layers: int = 30, d_mlp: int = 1536,
                    seed: int = 0) -> Path:
    """A random-weight LlamaForCausalLM shaped like SmolLM2-135M — 30 layers, 9 query / 3
    key-value heads, d_model 576, RoPE (θ 100,000), tied embeddings — with Hugging Face's own
    initialisation (std 0.02) and the 64-token character tokenizer, saved to ``folder``.
    ``d_mlp`` smaller than the real 1,536 keeps a test's folder small (the MLP does not
    touch the attention analyses' shapes). Shared by tests/test_report_depth.py and
    benchmarks/report_stages.py."""
    import transformers as tr

    folder = Path(folder)
    cfg = tr.LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=d_mlp,
                         num_hidden_layers=n_layers, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=2048,
                         rope_theta=100000.0, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    tr.LlamaForCausalLM(cfg).save_pretrained(folder)
    char_tokenizer(VOCAB).save_pretrained(folder)
    return folder
