#!/usr/bin/env bash
# Set up the environment if missing, then run the whole test suite:
#   1. the main suite on TransformerLens 4.x (TransformerBridge);
#   2. a light job against TransformerLens 3.9.0's HookedTransformer / HookedEncoder
#      (tests marked tl39: ModelView, probes, converter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# passive OpenMP waits: spinning threads make small linear algebra crawl on a busy machine
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
echo "== main suite (TransformerLens 4.x) =="
.venv/bin/python -m pytest "$@"
echo "== light job (TransformerLens 3.9.0: HookedTransformer / HookedEncoder) =="
TL_SPECTRAL_BACKEND=hooked PYTHONPATH="$PWD/.venv39${PYTHONPATH:+:$PYTHONPATH}" \
  .venv/bin/python -m pytest -m tl39 -p no:warnings -p no:cacheprovider -q \
    tests/test_model_view.py tests/test_probes.py tests/test_distributed.py tests/test_tl39.py \
    tests/test_convert.py tests/test_runner_api.py
