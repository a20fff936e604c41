#!/usr/bin/env bash
# Train the two shipped reference checkpoints (the exact commands used for the shipped weights).
# Each run uses one CPU thread; both run in parallel. A killed run resumes from its last
# checkpoint (every 100 steps in runs/<name>/checkpoints) when the same command is re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
for name in char-shakespeare char-shakespeare-noln; do
  mkdir -p "runs/$name"
  OMP_NUM_THREADS=1 nohup nice -n 5 tl-spectral train \
    --config "configs/$name.json" --no-progress >> "runs/$name/stdout.log" 2>&1 &
done
wait
# Ship: copy runs/<name>/final/{model.safetensors,config.json} to
# tl_spectral/models/checkpoints/<name>/ (see docs/models.md).
for name in char-shakespeare char-shakespeare-noln; do
  mkdir -p "tl_spectral/models/checkpoints/$name"
  cp "runs/$name/final/model.safetensors" "runs/$name/final/config.json" \
     "tl_spectral/models/checkpoints/$name/"
done
