#!/usr/bin/env bash
# The routing/filtering study of docs/routing_filtering.md (SPEC part B), exactly as run.
#
# 1. Trainings (CPU, one thread each, niced; every run checkpoints every 100 steps — 50 for
#    the BPE runs — and resumes from its last checkpoint when the same command is re-run).
#    The two softmax char models are the reference runs of scripts/train_reference.sh
#    (configs/char-shakespeare.json, configs/char-shakespeare-noln.json).
# 2. The study: QK geometry of every model (MiniLM included), S–D geometry, routing rank
#    over training (every checkpoint), SPEC B.4 ablations with ΔPPL; results in
#    runs/routing_study/ (summary.json + .safetensors), figures in docs/figures/routing_*.png.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- S–D char models (same recipe as configs/char-shakespeare*.json, attention "sd").
# Note: launched with "steps": 1500 and switched to 1000 in the config at the step-200
# checkpoint (end of warm-up; the learning rate before that does not depend on "steps"),
# so the runs are exactly 1000-step runs.
for name in sd-char-shakespeare sd-char-shakespeare-noln; do
  mkdir -p "runs/$name"
  OMP_NUM_THREADS=1 nohup nice -n 15 tl-spectral train \
    --config "configs/$name.json" --no-progress >> "runs/$name/stdout.log" 2>&1 &
done

# --- subword pair: Austen + Wikipedia, GPT-2 BPE truncated to the 4096 most frequent
# training tokens (the rest -> one <unk> id), no LayerNorm, 6 layers.
# Note: launched with "steps": 1000; stopped after the step-150 checkpoint, the config set to
# 600 steps and the same command re-run (it resumed from step 150), so from step 150 on the
# cosine schedule is the 600-step one (lr 1.490e-3 -> 1.467e-3 at the switch).
for name in bpe-sd-noln bpe-softmax-noln; do
  mkdir -p "runs/$name"
  OMP_NUM_THREADS=1 nohup nice -n 15 tl-spectral study routing train-bpe \
    --config "configs/$name.json" --data-dir ../shared/data --no-progress >> "runs/$name/stdout.log" 2>&1 &
done
wait

# --- the study. Run in three parts as the runs finished (each part merges into
# runs/routing_study/summary.json; the figures are rebuilt from everything saved there);
# one call without --models does the same at once.
OMP_NUM_THREADS=1 nice -n 15 tl-spectral study routing --out runs/routing_study \
  --runs-dir runs --data-dir ../shared/data --fig-dir docs/figures --windows 64 --models char-shakespeare char-shakespeare-noln
OMP_NUM_THREADS=1 nice -n 15 tl-spectral study routing --out runs/routing_study \
  --runs-dir runs --data-dir ../shared/data --fig-dir docs/figures --windows 64 --no-minilm --models bpe-softmax-noln bpe-sd-noln
OMP_NUM_THREADS=1 nice -n 15 tl-spectral study routing --out runs/routing_study \
  --runs-dir runs --data-dir ../shared/data --fig-dir docs/figures --windows 64 --no-minilm --models sd-char-shakespeare sd-char-shakespeare-noln
# the tables of docs/routing_filtering.md
tl-spectral study routing tables runs/routing_study/summary.json

# --- ship the S–D char models
for name in sd-char-shakespeare sd-char-shakespeare-noln; do
  mkdir -p "tl_spectral/models/checkpoints/$name"
  cp "runs/$name/final/model.safetensors" "runs/$name/final/config.json" \
     "tl_spectral/models/checkpoints/$name/"
done
