#!/usr/bin/env bash
# Set up the environment if missing, then run the main job on the bundled defaults:
# the shipped char-shakespeare model on the bundled Tiny Shakespeare. Prints the report path.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/tl-spectral analyze --out "${OUT:-tl_spectral_report}" "$@"
