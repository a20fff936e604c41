"""The model columns of the claims registry: one entry per model.

Adding a model is one :func:`add_model` call here: its results folder (written by its
command) and, for the paper layout, its file stems per study; for a real decoder, its evidence
panel's summary (``evidence=``: absent until ``tl-spectral study evidence`` writes it) and its
depth-thirds result (``depth=``, ``tl-spectral study pod-depth``). A model without results yet
(``results=None``) is a column of "not yet measured".
"""

from __future__ import annotations

from tl_spectral_studies.claims.registry import STANDARD, Model, add_model

REAL_DECODER_SAMPLES = ("8 windows of 128 tokens for sinks and interventions, 6 of 32 for "
                        "faithfulness (Wikipedia excerpt, Austen), N = 150 windows of 128 for "
                        "the scale POD; weight geometry over all heads; bands and H* by "
                        "depth thirds from tl-spectral study pod-depth (its own windows, in its "
                        "records)")

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
    + REAL_DECODER_SAMPLES,
    evidence="docs/results/real_decoder/evidence/smollm2-135m/summary.json",
    depth="docs/results/real_decoder/pod_depth/pod_depth_smollm2-135m.json"))
GEMMA_SAMPLES = ("weight geometry over all 72 heads; N = 150 windows of 128 for the scale POD, "
                 "8 of 128 for the interventions and the sinks (Wikipedia excerpt, <bos> "
                 "first); faithfulness not run yet; bands and H* by depth thirds from tl-spectral "
                 "study pod-depth (its own windows, in its records)")

add_model(Model(
    "gemma-3-270m", "Gemma-3-270M", STANDARD, "real_decoder",
    "docs/results/real_decoder/gemma3-270m",
    "tl-spectral study real-decoder --model gemma3-270m --data-dir ../shared/data --out "
    "docs/results/real_decoder --step routing --step scales --step interventions --step sinks",
    "Gemma-3-270M base model (Q4_K_M dequantized to float32; 18 layers × 4 query heads "
    "sharing 1 key-value head, d_head 256, QK-norm; 15 sliding-window layers (512) and 3 "
    "global ones); " + GEMMA_SAMPLES,
    evidence="docs/results/real_decoder/evidence/gemma3-270m/summary.json",
    depth="docs/results/real_decoder/pod_depth/pod_depth_gemma3-270m.json",
    framing={"interventions": "Wikipedia excerpt, <bos> first"}))
