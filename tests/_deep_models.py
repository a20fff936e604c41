"""Random-weight models at real depth for the report's legibility and findings tests
(issue 40): a Gemma-3-shaped model of 18 layers (sliding-window attention in 15 layers, full
attention in layers 5, 11 and 17, multi-query, QK-norm) saved with the 64-token character
tokenizer of :mod:`_tiny_hf`; the 30-layer SmolLM2 shape is ``_tiny_hf.save_smol_shape``."""

from __future__ import annotations

from pathlib import Path

import torch
from _tiny_hf import VOCAB, char_tokenizer


def gemma3_layer_types(n_layers: int = 18, every: int = 6) -> list[str]:
    """Gemma-3's pattern: every ``every``-th layer (5, 11, 17, …) full attention, the rest
    sliding-window."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
            for i in range(n_layers)]


def save_gemma3_shape(folder: str | Path, *, n_layers: int = 18, d_model: int = 64,
                      head_dim: int = 32, sliding_window: int = 16, seed: int = 0) -> Path:
    """A random Gemma3ForCausalLM of ``n_layers`` layers (4 query heads, 1 key-value head,
    QK-norm, local/global layers as Gemma-3), small width, saved to ``folder``."""
    import transformers as tr

    folder = Path(folder)
    cfg = tr.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=d_model, intermediate_size=2 * d_model,
        num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=1,
        head_dim=head_dim, max_position_embeddings=512, sliding_window=sliding_window,
        layer_types=gemma3_layer_types(n_layers), bos_token_id=0, eos_token_id=0,
        pad_token_id=0)
    torch.manual_seed(seed)
    tr.Gemma3ForCausalLM(cfg).save_pretrained(folder)
    char_tokenizer(VOCAB).save_pretrained(folder)
    return folder
