"""The model columns of the claims registry: one entry per model.

Adding a model is one :func:`add_model` call here: its results folder (written by its
command) and, for the paper layout, its file stems per study. A model without results yet
(``results=None``) is a column of "not yet measured".
"""

from __future__ import annotations

from tl_spectral_studies.claims.registry import STANDARD, Model, add_model

REAL_DECODER_SAMPLES = ("8 windows of 128 tokens for sinks and interventions, 6 of 32 for "
                        "faithfulness (Wikipedia excerpt, Austen), N = 150 windows of 128 for "
                        "the scale POD; weight geometry over all heads")

add_model(Model(
    "char-shakespeare", "char-shakespeare", STANDARD, "paper", "docs/results/contributions",
    "tl-spectral study contributions --model char-shakespeare …; tl-spectral study routing …",
    "6-layer 1.2 M-parameter char model, Tiny Shakespeare",
    slugs={"contributions": "char_shakespeare", "routing": "char-shakespeare"}))
add_model(Model(
    "minilm", "MiniLM", STANDARD, "paper", "docs/results/contributions",
    "tl-spectral study contributions --model minilm …; tl-spectral study routing …",
    "MiniLM-L12 (22 M, encoder), Wikipedia sentences",
    slugs={"contributions": "minilm", "routing": "minilm"}))
add_model(Model(
    "smollm2-135m", "SmolLM2-135M", STANDARD, "real_decoder", "docs/results/real_decoder",
    "tl-spectral study real-decoder --data-dir ../shared/data --out docs/results/real_decoder",
    "SmolLM2-135M-Instruct (Q4_1 dequantized to float32; 30 layers × 9 heads); "
    + REAL_DECODER_SAMPLES))
add_model(Model(
    "gemma-3-270m", "Gemma-3-270M", STANDARD, "real_decoder", None,
    "tl-spectral study real-decoder --model gemma-3-270m … (not yet run)",
    "Gemma-3-270M: not yet measured"))
