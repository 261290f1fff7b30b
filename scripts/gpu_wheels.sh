#!/usr/bin/env bash
# Wheels for the lent GPU machine (Python 3.12, x86_64; its image has CUDA PyTorch, numpy, psutil, pyyaml,
# safetensors, transformers, accelerate, einops, but not the packages below): downloaded into .whl/ (ignored
# by git, about 10 MB), installed there by bench/gpu/run_all.sh. Versions are the ones this project's set-up
# installs here. Not included: ComfyUI's comfy-kitchen (a 58 MB wheel that ComfyUI's attention module imports),
# which with ComfyUI's source tree (31 MB) exceeds what one device call carries (64 MiB): run_all.sh's dit_12gb
# check therefore runs only on a machine that has them, and is recorded as failed elsewhere.
#   bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pins() {
    for name in diffusers gguf pydantic pydantic-core annotated-types typing-inspection importlib-metadata; do
        echo "$name==$(version "$name")"
    done
    # spandrel (the upscale recipe's models) lives in the ComfyUI test environment, not in .venv
    .comfy/venv/bin/python -c "import importlib.metadata as m; print('spandrel==' + m.version('spandrel'))" 2>/dev/null || true
}
mkdir -p .whl
platforms=()
for n in 17 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
for pin in $(pins); do
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d .whl "$pin"
done
ls -la .whl
