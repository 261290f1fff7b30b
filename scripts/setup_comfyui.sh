#!/usr/bin/env bash
# Prepares the vendored ComfyUI snapshot for the real-ComfyUI tests (tests/test_comfy_real.py).
# Called by scripts/setup.sh; safe to rerun (a rerun with nothing changed takes seconds).
#
#   .comfy/ComfyUI      the source tree, unpacked from ../shared/vendor/comfyui-783545f.tar.gz
#                       (or $H3_COMFYUI_TARBALL); unpacked again only when the tarball's SHA-256 changes.
#   .comfy/venv         the Python environment ComfyUI runs in, with the pinned packages of
#                       scripts/comfyui-requirements.txt (see there why it is not .venv). It is built
#                       once per machine outside the clone, in
#                       ${XDG_CACHE_HOME:-~/.cache}/h3director/comfyui-venv-<hash of the pins and Python>
#                       (or $H3_COMFYUI_VENV), and .comfy/venv links to it, so fresh clones reuse it.
#   .venv               gets the few packages ComfyUI's model code needs to import beside .venv's own
#                       torch (comfy-kitchen, comfy-aimdo, einops, torchsde; pins from the same file):
#                       the DiT tests import comfy.ldm.minimax in-process.
#   .comfy/ready        written last; the tests use .comfy only when it exists.
#   .comfy/unavailable  the reason, when there is no snapshot: the tests then skip with it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
TARBALL=${H3_COMFYUI_TARBALL:-$REPO/../shared/vendor/comfyui-783545f.tar.gz}
REQUIREMENTS=$REPO/scripts/comfyui-requirements.txt
STATE=$REPO/.comfy
mkdir -p "$STATE"
rm -f "$STATE/ready" "$STATE/unavailable"

sha256() {
    if command -v sha256sum >/dev/null; then sha256sum "$@" | cut -d' ' -f1; else shasum -a 256 "$@" | cut -d' ' -f1; fi
}

# 1. The source tree.
if [ -f "$TARBALL" ]; then
    sum=$(sha256 "$TARBALL")
    if [ ! -f "$STATE/ComfyUI/main.py" ] || [ "$(cat "$STATE/ComfyUI.sha256" 2>/dev/null)" != "$sum" ]; then
        echo "setup_comfyui: unpacking $TARBALL into .comfy/ComfyUI"
        rm -rf "$STATE/ComfyUI" "$STATE/ComfyUI.sha256" "$STATE/unpack"
        mkdir "$STATE/unpack"
        tar -xzf "$TARBALL" -C "$STATE/unpack"
        mv "$STATE/unpack/ComfyUI" "$STATE/ComfyUI"
        rm -rf "$STATE/unpack"
        echo "$sum" > "$STATE/ComfyUI.sha256"
    fi
elif [ -f "$STATE/ComfyUI/main.py" ] && [ -f "$STATE/ComfyUI.sha256" ]; then
    echo "setup_comfyui: no snapshot at $TARBALL; keeping the tree unpacked before in .comfy/ComfyUI"
else
    reason="no ComfyUI snapshot at $TARBALL (set H3_COMFYUI_TARBALL, or COMFYUI_DIR to a ComfyUI checkout)"
    echo "setup_comfyui: $reason; the real-ComfyUI tests will skip"
    echo "$reason" > "$STATE/unavailable"
    exit 0
fi

# 2. The Python environment, keyed by the pins (not the comments) and the interpreter.
key=$( { grep -v -e '^#' -e '^$' "$REQUIREMENTS"; "$PY" -c 'import platform, sys; print(sys.version, platform.machine())'; } \
       | sha256 /dev/stdin | cut -c1-16)
VENV=${H3_COMFYUI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/h3director/comfyui-venv-$key}
case "$VENV" in /*) ;; *) VENV=$REPO/$VENV ;; esac
mkdir -p "$(dirname "$VENV")"
MODULES="torch torchvision torchaudio torchsde numpy einops transformers tokenizers sentencepiece safetensors
aiohttp yarl yaml PIL scipy tqdm psutil alembic sqlalchemy filelock av comfy_kitchen comfy_aimdo requests
simpleeval blake3 matplotlib pydantic spandrel cv2"
importable() {
    [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.h3director-complete" 2>/dev/null)" = "$key" ] &&
        "$VENV/bin/python" -c "
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
assert not missing, missing
import torchaudio, torchvision  # their native parts must load beside this torch
" $MODULES 2>/dev/null
}
(
    # One build at a time per machine; a second set-up waits, then finds it done.
    if command -v flock >/dev/null; then flock 9; fi
    if ! importable; then
        if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
            echo "setup_comfyui: $VENV exists and is not a virtual environment; not touching it" >&2
            exit 1
        fi
        echo "setup_comfyui: installing ComfyUI's packages into $VENV (a few GB, minutes)"
        rm -rf "$VENV"
        "$PY" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q -r "$REQUIREMENTS"
        echo "$key" > "$VENV/.h3director-complete"
        importable || { echo "setup_comfyui: packages installed but not importable in $VENV" >&2; exit 1; }
    fi
) 9>"$VENV.lock"
if [ "$VENV" != "$STATE/venv" ]; then
    if [ -d "$STATE/venv" ] && [ ! -L "$STATE/venv" ]; then rm -rf "$STATE/venv"; fi
    ln -sfn "$VENV" "$STATE/venv"
fi

# 3. ComfyUI's model code importable in .venv.
if [ -x .venv/bin/python ] && ! .venv/bin/python -c "
import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in ('comfy_kitchen', 'comfy_aimdo', 'einops', 'torchsde')))"
then
    .venv/bin/python -m pip install -q $(grep -E '^(comfy-kitchen|comfy-aimdo|einops|torchsde)==' "$REQUIREMENTS")
fi

echo "$STATE/ComfyUI" > "$STATE/ready"
echo "setup_comfyui: ComfyUI ready in .comfy/ComfyUI (Python: .comfy/venv/bin/python)"
