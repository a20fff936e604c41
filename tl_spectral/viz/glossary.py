"""Definitions of every column name that appears in a report table (header tooltips and the
glossary at the end of the report). ``tests/test_report.py`` checks that no column is left
undefined."""

from __future__ import annotations

GLOSSARY: dict[str, str] = {
    # shared
    "layer": "layer index (0 = first block)",
    "head": "head index within the layer",
    "uniform_entropy_bound": "mean over real queries of log(#visible keys): the entropy of "
                             "attention spread evenly, where every head of an untrained model "
                             "sits",
    "heads": "heads of the model (layers × heads per layer)",
    "heads_near_uniform": "heads whose mean entropy is at least 98% of the uniform bound",
    "entropy_min": "lowest mean entropy of any head (nats)",
    "entropy_max": "highest mean entropy of any head (nats)",
    "score": "which head score (previous_token, duplicate_token, induction)",
    "planted_head": "the score of a planted head on the same inputs: the share of queries whose "
                    "detection pattern marks any key (a head that attends only there)",
    "counted_from": "a head counts as doing the job from half the planted score (this "
                    "report's rule)",
    "best": "the best head's score",
    "best_layer": "layer of the best head",
    "best_head": "head (within its layer) of the best head",
    "model_ppl": "next-token perplexity of the model on the report's first windows",
    "random_weights_ppl": "the same on the same architecture with random weights (N(0, 0.02²) "
                          "matrices, gains 1, biases 0; seeded)",
    "unigram_ppl": "exp of the entropy of the predicted tokens' frequencies in those windows: "
                   "the perplexity of a unigram model fitted on them",
    "vocabulary": "the model's vocabulary size (the perplexity of uniform guessing)",
    "windows": "windows of the check",
    "predicted_tokens": "next-token predictions the model's and the unigram perplexities "
                        "average over",
    "random_weights_windows": "windows the random-weight perplexity reads (the first of the "
                              "check's: a reference of magnitude)",
    "random_weights_tokens": "next-token predictions the random-weight perplexity averages over",
    "attention": "the layer's attention: 'global' (full attention over every earlier "
                 "token) or 'local' (within a sliding window), from the model's layer_types",
    "k": "number of leading layers whose attention is replaced by linear attention",
    # attention statistics
    "entropy": "mean over real queries of the attention entropy −Σ_j α_ij log α_ij (nats); "
               "low = focused, log(#keys) = uniform",
    "distance": "mean over real queries of Σ_j α_ij |i − j|: how far back (or ahead) a head "
                "looks, in tokens",
    "first_token_mass": "mean attention on position 0, α_i0 (the first token; [CLS] for "
                        "encoders): a sink indicator",
    # scale POD
    "dominant_scales": "Morlet scales a* (tokens) at the peaks of the layer's scale energy E(a)",
    "E_fine": "share of the scale energy Σ_a E(a) at fine scales a ≤ 7 tokens",
    "E_medium": "share of the scale energy at medium scales 7 < a < 20 tokens",
    "E_coarse": "share of the scale energy at coarse scales a ≥ 20 tokens",
    "T_spec": "spectral concentration 1/β of the POD eigen-spectrum λ_k ∝ k^−β (whole field): "
              "large = energy in few modes",
    "beta": "exponent β of the power-law fit λ_k ∝ k^−β over the modes holding 99% of the energy",
    "tspec_r2": "R² of that power-law fit (log-log)",
    "H_star": "effective rank H*(ε=0.1): modes needed for 90% of the field's energy "
              "('≥ N−1' = saturated by the number of documents)",
    "H_star_str": "H* as text ('≥ N−1' when saturated)",
    "H_star_bounded": "H* bounded by the number of documents N: at or above the H* of a 1/k "
                      "spectrum over the N − 1 modes (docs/scale_pod.md, 'When N bounds H*'); "
                      "such an H* reports N, not the layer, and gives no head advice",
    "bounded": "H* bounded by the number of documents N (see H_star_bounded)",
    "advice": "heads recommended for the layer ∝ H* — only when no layer's H* is bounded "
              "by N (else none: '—')",
    "saturated": "H* reached N−1 (more documents would be needed to resolve it)",
    "share": "H* of the layer over the sum of H* over layers",
    "quota": "head budget × share (before rounding)",
    "recommended": "heads ∝ H* for the layer (at least 1, summing to the budget): the "
                   "arithmetic, advice only when no layer's H* is bounded by N (see advice)",
    "recommended_heads": "heads recommended for the layer (∝ H*, at least 1, summing to the "
                         "model's head count); '—' when H* is bounded by N in any layer (the "
                         "shares of a sum with a lower bound in it are not advice)",
    "uniform": "heads the model has in that layer",
    "uniform_heads": "heads the model has in that layer",
    # QK geometry
    "d_head": "head dimension of the layer",
    "capacity": "largest possible routing rank min(2·d_head, d_model)",
    "routing_fraction": "routing budget ‖R‖²/‖M‖² of M = W_Q W_Kᵀ (mean over heads); "
                        "R = (M − Mᵀ)/2; 0.5 = no preference, 1 − it = filtering",
    "rank_R": "entropy effective rank of the routing part R (mean over heads); one rotation "
              "plane = 2",
    "rank_R_std": "standard deviation of rank_R over the layer's heads",
    "rank_F": "entropy effective rank of the filtering part F = (M + Mᵀ)/2 (mean over heads)",
    "unstable_share": "share of heads whose M has an eigenvalue with positive real part",
    "positive_eig_share": "share of M's nonzero eigenvalues with positive real part (mean "
                          "over heads)",
    "rank_S": "entropy effective rank of S in S–D attention (mean over heads)",
    "rank_S_std": "standard deviation of rank_S over heads",
    "rank_S_min": "smallest rank_S over heads",
    "rank_S_max": "largest rank_S over heads",
    "stable_share": "share of S–D heads that are stable",
    # contributions
    "neg_pair_share": "share of (query, source) pairs whose token-level contribution C_ij is "
                      "negative beyond round-off: C_ij < −τ_i with τ_i = 1e-6 · Σ_j |C_ij|",
    "neg_pair_share_tau0": "the same share counted at τ = 0 (includes pairs that are "
                           "negative only by float round-off)",
    "neg_mass_share": "negative contribution mass Σ|C⁻| / Σ|C| (token level)",
    "C_on_first_token": "mean token-level contribution C_i0 of position 0 to a query's output "
                        "(share of the output the first token supplies)",
    "attn_on_first_token": "mean attention α_i0 on position 0 (head mean)",
    "spearman_attention_vs_c": "Spearman rank correlation between raw attention α and the "
                               "contribution c over a query's sources (mean over queries)",
    "spearman_value_weighted_vs_c": "Spearman rank correlation between α‖ṽ‖ and c",
    "spearman_output_normalized_vs_c": "Spearman rank correlation between α‖ṽ‖/‖o‖ and c",
    # sinks
    "sink_rate": "mean over queries and heads of α_i0, the attention on the sink position 0",
    "max_head_sink_rate": "largest per-head sink rate in the layer",
    "last_token_rate": "mean attention on the last real token (head mean)",
    "sink_head_share": "share of the layer's heads whose Gu key score of position 0 exceeds "
                       "the threshold (sink heads)",
    "cos_v0_s": "mean cosine between the sink's value ṽ_0 and the semantic vector s_i (the "
                "output without the sink); negative = anti-aligned",
    "rho_star_clamped": "mean optimal sink rate ρ* (the α_i0 that minimises the output norm "
                        "change), clamped to [0, 1]",
    "alpha_i0_same_q": "mean observed α_i0 over the same queries as rho_star_clamped",
    "rho_star_in_0_1": "share of queries with 0 < ρ* < 1",
    "over_sink_share": "share of queries with α_i0 > clamp(ρ*, 0, 1): more sink attention "
                       "than optimal",
    "v0_over_sbar": "mean ratio ‖ṽ_0‖ / ‖s̄_i‖ of the sink's value norm to the mean "
                    "semantic vector norm (ρ* → 1 as it → 0)",
    "rel_delta_norm": "relative change of the layer output norm when the sink's value is "
                      "zeroed (analytic)",
    "delta_cos": "cosine between the layer output before and after zeroing the sink value",
    # surgery
    "ppl_zero_shot": "perplexity with the first k layers linearized, no fine-tuning",
    "delta_zero_shot_%": "relative perplexity change vs k = 0, in percent",
    "ppl_fine_tuned": "perplexity after fine-tuning the linearized model",
    "delta_fine_tuned_%": "relative perplexity change after fine-tuning, in percent",
    "ppl_control": "perplexity of the control fine-tuning (no linearization)",
    "delta_control_%": "relative perplexity change of the control, in percent",
    "delta_fine_tuned_vs_control_%": "fine-tuned vs control, in percent",
    # faithfulness
    "measure": "attribution measure (attention, value-weighted, output-normalized, "
               "contribution)",
    "comprehensiveness_area": "area under the curve of the output change when removing the "
                              "top-ranked sources (higher = more faithful)",
    "sufficiency_area": "area under the curve of the output change when keeping only the "
                        "top-ranked sources (lower = more faithful)",
    # head scores (TransformerLens' head detector, error measure "mul")
    "previous_token": "mean over real queries of the attention on the previous token, α_i,i−1",
    "induction": "mean over real queries of the attention on keys j whose previous token "
                 "equals the current one (t_j−1 = t_i, j ≤ i), on the report's windows",
    "induction_repeated": "the induction score on repeated random sequences (a random block "
                          "then the same block again): about 0.5 for an induction head (only "
                          "the second block's queries have an earlier copy)",
    "duplicate_token": "mean over real queries of the attention on earlier occurrences of the "
                       "current token (t_j = t_i, j < i)",
    "first_token": "mean attention on position 0 (the same number as first_token_mass)",
    "mass_on_CLS": "mean attention on the [CLS] token",
    "mass_on_SEP": "mean attention on the [SEP] token",
    "mass_on_punctuation": "mean attention on punctuation tokens",
    # rotary geometry
    "routing_fraction_at_0": "head-mean routing fraction ‖R‖²/‖M‖² of the kernel at offset "
                             "Δ = 0",
    "mean_routing_fraction": "head-mean routing fraction averaged over the offset "
                             "distribution (ratio of the averaged energies)",
    "min_over_offsets": "smallest head-mean routing fraction over the reported offsets",
    "max_over_offsets": "largest head-mean routing fraction over the reported offsets",
    # uncertainty
    "H_star_interval": "95% delete-a-group jackknife interval over documents of H*",
    "T_spec_interval": "95% delete-a-group jackknife interval over documents of T_spec",
    "recommended_range": "smallest–largest recommended heads over all documents and the "
                         "jackknife replicates",
    # --baseline random
    "H_star_random": "H* of the same configuration with re-initialised weights (--baseline "
                     "random), same windows",
    "T_spec_random": "T_spec of the re-initialised reference (--baseline random)",
    "E_fine_random": "fine-band scale-energy share of the re-initialised reference "
                     "(--baseline random)",
}
