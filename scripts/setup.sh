#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with H3 Director and
# everything its demo, benchmarks and tests need. Safe to rerun.
#   bash scripts/setup.sh         everything, including what only the tests need (the vendored ComfyUI and
#                                 its environment, headless Chromium for the panel test)
#   bash scripts/setup.sh core    the package and its Python dependencies only (enough for the demo and the CLI)
set -euo pipefail
case "${1:-all}" in
    all|core) ;;
    *) echo "usage: bash scripts/setup.sh [core]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# PyTorch is pinned to a version (H3_TORCH_VERSION overrides it), not to a build: pip installs the build the
# configured package index serves for that version. The build machine's index serves the CPU build
# (2.13.0+cpu). The default package index serves the CUDA build (with NVIDIA's libraries, a much larger
# download) on Linux x86_64, which is the one a CUDA machine needs, and the MPS-capable build on macOS.
# For the CPU build there, point pip at PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL) before running this.
.venv/bin/python -m pip install -q "torch==${H3_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
[ "${1:-all}" = core ] && exit 0
# The vendored ComfyUI for the real-ComfyUI tests (skipped with a message when ../shared/vendor is absent).
bash scripts/setup_comfyui.sh
# Headless Chromium, chromedriver and ComfyUI's web frontend for the live-panel browser test.
bash scripts/setup_browser.sh
