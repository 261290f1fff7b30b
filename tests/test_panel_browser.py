"""The live memory panel in a real ComfyUI page, driven by a real headless Chromium.

Server: the vendored ComfyUI (see tests/test_comfy_real.py, whose helpers this reuses) on loopback with
`--cpu`, the pack, the tiny H3 VAE test nodes, a `H3TestHoldMemory` node
(fixtures/comfy_harness/panel_real_node) and ComfyUI's real web frontend (`.comfy/frontend`, the pinned
comfyui-frontend-package that scripts/setup_browser.sh installs). Config by environment: the monitor on
at 250 ms, a 1 GiB slot pool of 16 MiB slots. Browser: Debian's /usr/bin/chromium through
/usr/bin/chromedriver (selenium; nothing downloaded). When either is missing the test runs
scripts/setup_browser.sh once and skips, saying why, only if they are still missing.

Checks: the "H3 Memory" sidebar tab opens the panel; its numbers are present and the sample count
grows; a prompt queued with the page's client id (as the page itself queues) shows the running node's
title in the panel while it runs and leaves it marked in the recorded samples; the pool heatmap has one
cell per slot; three prompts of a node leaking 64 MiB each (fixtures/comfy_harness/ledger_real_node) show as a
leak in red in the panel's prompt ledger. A screenshot is kept in the test's folder, and copied to $H3DIRECTOR_PANEL_SCREENSHOT when set
(docs/img/panel.png was made that way). The route's own switches (monitor off, unknown parameters) are
checked in-process below, without a server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from comfy_harness.server import HARNESS, comfyui_server, prepare_base, write_tiny_vae_weights
from comfy_harness.server import http_get as _get
from comfy_harness.server import post_json as _post_json
from comfy_harness.vendored import why_unavailable

REPO = Path(__file__).resolve().parents[1]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FRONTEND = REPO / ".comfy" / "frontend" / "comfyui_frontend_package" / "static"
HOLD_TITLE = "Hold 256 MiB"
POOL_SLOTS = 64   # 1024 MiB pool / 16 MiB slots
real = [pytest.mark.comfyui, pytest.mark.slow, pytest.mark.skipif(not COMFYUI_DIR, reason=why_unavailable())]


def _browser_missing() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER, FRONTEND / "index.html") if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    return ", ".join(missing) or None


@pytest.fixture(scope="module")
def browser_ready():
    if _browser_missing():
        subprocess.run(["bash", str(REPO / "scripts/setup_browser.sh")], cwd=REPO, timeout=900, check=False)
    missing = _browser_missing()
    if missing:
        pytest.skip(f"{missing} missing and scripts/setup_browser.sh could not install it (needs root apt-get for "
                    "Debian's chromium and chromium-driver, and pip for the frontend package and selenium)")


@pytest.fixture(scope="module")
def panel_server(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-panel-base"), ["models/vae"],
                        {"h3director_test_nodes": HARNESS / "real_node",
                         "h3director_panel_nodes": HARNESS / "panel_real_node",
                         "h3director_ledger_test_nodes": HARNESS / "ledger_real_node"})
    vae_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", vae_nodes / "real_comfy.py")
    write_tiny_vae_weights(base, vae_nodes)
    import safetensors.torch

    latent = torch.randn(1, 24, 12, 8, 24, generator=torch.Generator().manual_seed(5))
    safetensors.torch.save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
                                str(base / "input" / "panel.latent"))
    env = {"H3_MONITOR__ENABLE_MONITOR": "true", "H3_MONITOR__UPDATE_INTERVAL_MS": "250",
           "H3_PRE_ALLOCATED_POOL_MB": "1024", "H3_POOL_SLOT_MB": "16"}
    with comfyui_server(base, env=env, front_end_root=FRONTEND if FRONTEND.is_dir() else None) as server:
        yield server


@pytest.fixture(scope="module")
def driver(browser_ready, tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")   # selenium manager: never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1500,950", f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield browser
    browser.quit()


def _wait(what: str, condition, timeout: float = 60.0, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def _text(driver, css: str) -> str:
    """The text of the first match, read in one script call (the panel redraws its DOM on every poll)."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css)


def _attributes(driver, css: str, name: str) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute("
                                 "arguments[1]))", css, name)


def _hold_workflow() -> dict:
    return {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": "panel.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "output": "images", "filename_prefix": "panel", "fps": 24.0,
            "crf": 18}},
        "4": {"class_type": "H3TestHoldMemory", "inputs": {"image": ["3", 0], "mib": 256, "seconds": 4.0},
              "_meta": {"title": HOLD_TITLE}},
    }


@pytest.mark.comfyui
@pytest.mark.slow
@pytest.mark.skipif(not COMFYUI_DIR, reason=why_unavailable())
def test_panel_shows_live_memory_and_marks_the_running_node(panel_server, driver, tmp_path):
    from selenium.webdriver.common.by import By

    driver.get(panel_server["url"])
    try:   # the frontend is large; on a busy 2-core machine its first load has taken over 2 minutes
        _wait("the pack's extension to poll the stats", lambda: driver.execute_script(
            "return window.h3directorPanel && window.h3directorPanel.polls > 0"), timeout=400, step=1)
    except AssertionError:
        driver.save_screenshot(str(tmp_path / "no-poll.png"))
        state = driver.execute_script("return [document.readyState, !!window.comfyAPI, !!window.h3directorPanel]")
        raise AssertionError(f"the panel never polled: readyState, comfyAPI, panel = {state}; browser log "
                             f"{driver.get_log('browser')[-10:]}; see {tmp_path}") from None
    def sidebar_button():
        return [b for b in driver.find_elements(By.CSS_SELECTOR, "button")
                if (b.get_attribute("aria-label") or "").startswith("H3 Director: live memory")]

    try:
        _wait("the H3 Memory sidebar button", sidebar_button, timeout=60)
    except AssertionError:
        driver.save_screenshot(str(tmp_path / "no-button.png"))
        labels = [(b.get_attribute("aria-label"), b.text) for b in driver.find_elements(By.CSS_SELECTOR, "button")]
        raise AssertionError(f"no H3 Memory sidebar button; buttons: {labels[:40]}; see {tmp_path}") from None
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def click_through_dialogs():   # the frontend may open its templates dialog over the page first
        try:
            sidebar_button()[0].click()
            return True
        except (ElementClickInterceptedException, StaleElementReferenceException, IndexError):
            ActionChains(driver).send_keys(Keys.ESCAPE).perform()
            return False

    _wait("a click on the sidebar button", click_through_dialogs, timeout=30, step=0.5)
    _wait("the panel", lambda: _text(driver, "#h3d-status").startswith("monitor on"))
    rss = int(_attributes(driver, ".h3d-host", "data-rss")[0])
    assert rss > 50 * 1024 * 1024, rss           # a ComfyUI server holds far more than 50 MiB
    assert "GiB" in _text(driver, "#h3d-now") and "no accelerator" in _text(driver, "#h3d-now")
    assert "none (CPU only)" in _text(driver, "#h3d-allocator")
    first = driver.execute_script("return window.h3directorPanel.polls")
    _wait("the numbers to update", lambda: driver.execute_script("return window.h3directorPanel.polls") > first + 2)

    client_id = driver.execute_script("return window.name || sessionStorage.getItem('clientId')")
    assert client_id
    prompt_id = _post_json(f"{panel_server['url']}/prompt",
                           {"prompt": _hold_workflow(), "client_id": client_id})["prompt_id"]
    _wait("the running node in the panel", lambda: HOLD_TITLE in _text(driver, "#h3d-running"), timeout=300)
    held_rss = _wait("the held memory in the panel", lambda: [
        int(v) for v in _attributes(driver, ".h3d-host", "data-rss") if int(v) > rss + 200 * 1024 * 1024], timeout=30)
    assert held_rss
    _wait("a few samples with the node marked", lambda: driver.execute_script(
        "return window.h3directorPanel.points.filter(p => p.node && p.node.includes(arguments[0])).length >= 6",
        HOLD_TITLE), timeout=60)
    shot = tmp_path / "panel.png"
    driver.save_screenshot(str(shot))
    if os.environ.get("H3DIRECTOR_PANEL_SCREENSHOT"):
        shutil.copy(shot, os.environ["H3DIRECTOR_PANEL_SCREENSHOT"])

    def finished():
        status, body = _get(f"{panel_server['url']}/history/{prompt_id}")
        return status == 200 and prompt_id in json.loads(body)

    _wait("the prompt to finish", finished, timeout=300, step=0.5)
    _wait("the panel to show idle", lambda: _text(driver, "#h3d-running") == "idle")
    marked = driver.execute_script("return window.h3directorPanel.points.map(p => p.node)")
    assert any(name and HOLD_TITLE in name for name in marked), sorted({str(n) for n in marked})
    states = _attributes(driver, '.h3d-heatmap[data-device="cpu"] [data-state]', "data-state")
    assert states.count("free") + states.count("leased") == POOL_SLOTS, states
    assert "fallbacks" in _text(driver, "#h3d-pools")


@pytest.mark.comfyui
@pytest.mark.slow
@pytest.mark.skipif(not COMFYUI_DIR, reason=why_unavailable())
def test_panel_shows_the_prompt_ledger_and_a_leak(panel_server, driver):
    """Runs after the test above, in its page: three prompts of a node that leaks 64 MiB each (the
    `ledger_real_node` test node) make the panel's prompt ledger list them and show the leak in red."""
    _wait("the panel's prompt ledger", lambda: "prompt ledger" in _text(driver, "#h3d-ledger"), timeout=120)
    for seed in range(3):
        prompt_id = _post_json(f"{panel_server['url']}/prompt", {"prompt": {
            "1": {"class_type": "H3TestLeak", "inputs": {"seed": seed, "mib": 64}}}})["prompt_id"]

        def finished(prompt_id=prompt_id):
            status, body = _get(f"{panel_server['url']}/history/{prompt_id}")
            return status == 200 and prompt_id in json.loads(body)

        _wait("the leaking prompt to finish", finished, timeout=120, step=0.5)
    leak = _wait("the leak in the panel", lambda: _text(driver, "#h3d-ledger .h3d-leak"), timeout=60)
    assert leak.startswith("LEAK host RSS") and "per prompt over 3 prompts" in leak and "LEAKED[" in leak, leak
    assert "(node H3TestLeak)" in leak, leak
    assert "H3TestLeak" in _text(driver, "#h3d-ledger .h3d-ledger-prompt")
    assert "cached outputs" in _text(driver, "#h3d-ledger-kept")


@pytest.mark.comfyui
@pytest.mark.slow
@pytest.mark.skipif(not COMFYUI_DIR, reason=why_unavailable())
def test_monitor_ops_log_toggle_names_the_nodes(panel_server):
    """Monitor Start with ops_log on: Stop's summary has the op table, phases named by the executing node
    (the hold node's `int(sum)` is a synchronising call; ComfyUI runs on the CPU, the job's device here)."""
    workflow = {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": "panel.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "H3DirectorMonitorStart", "inputs": {
            "interval_ms": 100, "label": "ops", "trigger": ["1", 0], "ops_log": True}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["3", 1], "vae": ["2", 0], "output": "images", "filename_prefix": "ops", "fps": 24.0,
            "crf": 18}},
        "5": {"class_type": "H3TestHoldMemory", "inputs": {"image": ["4", 0], "mib": 8, "seconds": 0.0}},
        "6": {"class_type": "H3DirectorMonitorStop", "inputs": {"monitor": ["3", 0], "trigger": ["5", 0]}},
    }
    prompt_id = _post_json(f"{panel_server['url']}/prompt", {"prompt": workflow, "client_id": "h3-ops"})["prompt_id"]

    def entry():
        status, body = _get(f"{panel_server['url']}/history/{prompt_id}")
        return json.loads(body).get(prompt_id) if status == 200 else None

    done = _wait("the ops prompt to finish", entry, timeout=300, step=0.5)
    assert done["status"]["status_str"] == "success", json.dumps(done["status"])[:3000]
    summary = done["outputs"]["6"]["text"][0]
    assert "op and transfer log (job device cpu)" in summary
    assert any(line.strip().startswith("#5 H3TestHoldMemory") and "sync" in line for line in summary.splitlines()), \
        summary
    again = _post_json(f"{panel_server['url']}/prompt", {"prompt": _hold_workflow() | {"4": {
        "class_type": "H3TestHoldMemory", "inputs": {"image": ["3", 0], "mib": 8, "seconds": 0.0}}},
        "client_id": "h3-ops"})["prompt_id"]
    prompt_id = again
    assert _wait("a prompt without the log", entry, timeout=300, step=0.5)["status"]["status_str"] == "success"


# In-process checks of the route's switches and inputs (ComfyUI stubs; no server, no browser).

def test_monitor_off_is_said_and_live_parts_are_null():
    from comfy_harness.loader import install_stubs

    install_stubs()
    from h3director.comfy.routes import stats_payload
    from h3director.core.config import validate_config

    off = stats_payload(5, validate_config({"monitor": {"enable_monitor": False}}))
    assert off["monitor"]["enabled"] is False and "monitor.enable_monitor is false" in off["monitor"]["reason"]
    assert off["now"] is None and off["pools"] is None and off["allocator"] is None
    on = stats_payload(5, validate_config({"monitor": {"enable_monitor": True, "show_pool_usage": False}}))
    assert on["monitor"]["reason"] is None and on["now"][0]["device"] == "host" and on["now"][0]["rss_bytes"] > 0
    assert on["pools"] is None and on["allocator"] == {}          # CPU only: no caching allocator
    assert on["schema"] == 1 and on["running"] is None            # outside ComfyUI nothing runs


def test_unknown_query_parameter_is_refused():
    from h3director.comfy.routes import STATS_QUERY, check_query_names
    from h3director.errors import InvalidInputError

    check_query_names({"samples": "3"}, STATS_QUERY)
    with pytest.raises(InvalidInputError, match="unknown query parameter 'sample'; this route takes samples"):
        check_query_names({"sample": "3"}, STATS_QUERY)
