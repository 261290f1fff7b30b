#!/usr/bin/env bash
# What tests/test_panel_browser.py needs beyond scripts/setup_comfyui.sh; called by scripts/setup.sh,
# safe to rerun (a rerun with everything present only checks). A failed install is reported, not fatal:
# the browser test then skips and says what is missing.
#
#   /usr/bin/chromium, /usr/bin/chromedriver   Debian's chromium and chromium-driver packages (apt-get;
#                        skipped when both exist; needs root, or the test skips and says how to install)
#   .comfy/frontend      ComfyUI's web frontend package at the version the vendored ComfyUI's
#                        requirements.txt pins, installed with pip --target (not into any venv); the
#                        test serves it with --front-end-root
#   selenium             in .venv (the test extra of pyproject.toml lists it too)
# No browser is downloaded by selenium: the test points it at /usr/bin/chromium and /usr/bin/chromedriver.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    :
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup_browser: installing chromium and chromium-driver (apt-get)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
            >/dev/null; }; then
        echo "setup_browser: apt-get could not install them; the panel browser test will skip" >&2
    fi
else
    echo "setup_browser: no /usr/bin/chromium + /usr/bin/chromedriver and no root apt-get here;" \
         "the panel browser test will skip (install Debian's chromium and chromium-driver to run it)"
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import selenium" 2>/dev/null; then
    .venv/bin/python -m pip install -q "selenium>=4.20" ||
        echo "setup_browser: pip could not install selenium; the panel browser test will skip" >&2
fi

REQ=$REPO/.comfy/ComfyUI/requirements.txt
if [ -f "$REQ" ]; then
    pin=$(grep -E '^comfyui-frontend-package==' "$REQ" | head -1 || true)
    if [ -n "$pin" ]; then
        if [ "$(cat .comfy/frontend/.h3director-pin 2>/dev/null)" != "$pin" ] ||
           [ ! -f .comfy/frontend/comfyui_frontend_package/static/index.html ]; then
            echo "setup_browser: installing $pin into .comfy/frontend"
            rm -rf .comfy/frontend
            if .venv/bin/python -m pip install -q --no-deps --target .comfy/frontend "$pin"; then
                echo "$pin" > .comfy/frontend/.h3director-pin
            else
                echo "setup_browser: pip could not install $pin; the panel browser test will skip" >&2
                rm -rf .comfy/frontend
            fi
        fi
    fi
fi
