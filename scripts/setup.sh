#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with H3 Director and
# everything its demo, benchmarks and tests need (CPU build of PyTorch). Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# PyTorch is pinned so pip takes the CPU build instead of resolving a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==${H3_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
# The vendored ComfyUI for the real-ComfyUI tests (skipped with a message when ../shared/vendor is absent).
bash scripts/setup_comfyui.sh
