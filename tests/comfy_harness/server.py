"""A real ComfyUI server on loopback for the real-ComfyUI test modules (standard library and pytest only).

`COMFYUI_DIR` is the ComfyUI source tree (read only) and `COMFYUI_PYTHON` the Python with its
requirements (tests/conftest.py points both at the vendored tree `scripts/setup.sh` prepared). Everything a
test writes (custom nodes, models, input, output) goes to a temporary `--base-directory` made by
`prepare_base`, with this repository linked in as the custom node `H3-Director`.

- `prepare_base(base, folders, node_dirs)`: the base directory, the pack, and test-only node folders;
- `write_tiny_vae_weights(base, node_dir)` / `write_tiny_dit_checkpoint(base)`: random weights of ComfyUI's own
  H3 classes at small widths (`real_comfy.py`, `dit_worker.py`), written by ComfyUI's Python;
- `comfyui_server(base, ...)`: starts `main.py --cpu` on a free port, waits for `/system_stats`, yields
  `{"url", "base", "log", "server"}` and stops the server; a server that does not start fails the test with its log;
- `submit(comfy, workflow)`: queues an API-format workflow and returns its history entry once it finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "comfy_harness"
START_TIMEOUT_S = 180
PROMPT_TIMEOUT_S = 300


def comfyui_dir() -> str | None:
    return os.environ.get("COMFYUI_DIR")


def comfyui_python() -> str:
    return os.environ.get("COMFYUI_PYTHON", sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET; HTTP errors come back as their status, not as exceptions."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"POST {url} -> {error.code}: {error.read().decode()[:2000]}") from error


def prepare_base(base: Path, folders: Iterable[str], node_dirs: dict[str, Path] | None = None) -> Path:
    """Make `base` (custom_nodes, input, output, temp, user, web and `folders`), link this repository in as the
    pack and copy each `node_dirs` source folder in as a custom node under its key."""
    for folder in ("custom_nodes", "input", "output", "temp", "user", "web", *folders):
        (base / folder).mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / "H3-Director").symlink_to(REPO, target_is_directory=True)
    for name, source in (node_dirs or {}).items():
        shutil.copytree(source, base / "custom_nodes" / name)
    return base


def write_tiny_vae_weights(base: Path, node_dir: Path) -> None:
    """ComfyUI's H3 video and audio VAEs at small widths, random weights, into `base/models/vae/`
    (`h3_tiny_video.safetensors`, `h3_tiny_audio.safetensors`). `node_dir` holds `real_comfy.py`."""
    (base / "models" / "vae").mkdir(parents=True, exist_ok=True)
    code = (f"import sys; sys.path.insert(0, {comfyui_dir()!r}); sys.path.insert(0, {str(node_dir)!r});"
            "sys.argv = ['main.py', '--cpu']; import comfy.options; comfy.options.enable_args_parsing();"
            "import real_comfy;"
            f"real_comfy.write_tiny_weights({str(base / 'models/vae/h3_tiny_video.safetensors')!r},"
            f" {str(base / 'models/vae/h3_tiny_audio.safetensors')!r})")
    subprocess.run([comfyui_python(), "-c", code], check=True, cwd=comfyui_dir(), timeout=300)


def write_tiny_dit_checkpoint(base: Path) -> Path:
    """A tiny random H3 DiT in ComfyUI's key layout (`dit_worker.tiny_state_dict`), which `UNETLoader` detects,
    as `base/models/diffusion_models/h3_tiny_dit.safetensors`."""
    weights = base / "models" / "diffusion_models" / "h3_tiny_dit.safetensors"
    weights.parent.mkdir(parents=True, exist_ok=True)
    code = (f"import sys; sys.path.insert(0, {str(HARNESS)!r}); import dit_worker;"
            f"h3 = dit_worker.import_comfy({comfyui_dir()!r}); import safetensors.torch;"
            "sd = {k: v.contiguous() for k, v in dit_worker.tiny_state_dict(h3).items()};"
            f"safetensors.torch.save_file(sd, {str(weights)!r})")
    subprocess.run([comfyui_python(), "-c", code], check=True, cwd=REPO, timeout=300,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    return weights


@contextlib.contextmanager
def comfyui_server(base: Path, *, extra_args: Iterable[str] = (), env: dict[str, str] | None = None,
                   front_end_root: Path | None = None) -> Iterator[dict]:
    """ComfyUI (`--cpu`) on a free loopback port over `base`; yields {"url", "base", "log" (a Path), "server"
    (the `subprocess.Popen`)}."""
    port = free_port()
    log_path = base / "comfyui.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [comfyui_python(), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
             "--base-directory", str(base), "--disable-auto-launch",
             "--front-end-root", str(front_end_root or base / "web"), *extra_args],
            cwd=comfyui_dir(), stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and server.poll() is None:
                try:
                    if http_get(f"{url}/system_stats")[0] == 200:
                        break
                except OSError:
                    time.sleep(1)
            else:
                log.flush()
                pytest.fail("ComfyUI did not start:\n" + log_path.read_text()[-4000:])
            yield {"url": url, "base": base, "log": log_path, "server": server}
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def submit(comfy: dict, workflow: dict, client_id: str | None = None) -> dict:
    """Queue `workflow` and return its history entry once it finished (success or error)."""
    body = {"prompt": workflow, "client_id": client_id or str(uuid.uuid4())}
    prompt_id = post_json(f"{comfy['url']}/prompt", body)["prompt_id"]
    deadline = time.monotonic() + PROMPT_TIMEOUT_S
    while time.monotonic() < deadline:
        status, raw = http_get(f"{comfy['url']}/history/{prompt_id}")
        history = json.loads(raw) if status == 200 else {}
        if prompt_id in history:
            return history[prompt_id]
        time.sleep(0.5)
    raise AssertionError("prompt did not finish:\n" + comfy["log"].read_text()[-4000:])
