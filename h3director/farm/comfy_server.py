"""One ComfyUI server on loopback, started and driven over HTTP (ComfyUI's own code is never imported).

`ComfyServer` starts ComfyUI's ``main.py`` in the given Python through `h3director.farm.serve` (the
server exits when this process dies), over a base folder (models, custom nodes with this pack) with
its own output, temp, user and (empty) web folders in `work_dir`. `run(workflow)` queues an API workflow, waits
for its history entry, reads the files it saved, and samples the server's memory meanwhile with the
core `Monitor` (``server.gpu_bytes`` from NVML where there is a GPU, ``server.rss_bytes`` always):
`RunResult.peak_bytes` is the sampled peak (GPU bytes when known, else resident host bytes), a lower
bound like every sampled peak.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from h3director.errors import H3DirectorError

START_TIMEOUT_S = 300
PORT_TRIES = 3
POLL_S = 0.05
REPO = Path(__file__).resolve().parents[2]


class ServerError(H3DirectorError):
    """The ComfyUI server did not start, died, or answered what it should not."""


@dataclass
class RunResult:
    """How one prompt ended: ``status`` "done", "oom" or "error"; `files` {relative name: bytes};
    `peak_bytes`/`peak_series` the sampled memory peak and which series it is; `error` the
    exception type and message for a failure."""

    status: str
    files: dict[str, bytes] = field(default_factory=dict)
    peak_bytes: int | None = None
    peak_series: str | None = None
    error: str | None = None
    seconds: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def is_oom_failure(exception_type: str, message: str) -> bool:
    """Whether a ComfyUI execution error is an allocator failure (the `h3director oom` formats)."""
    from h3director.core.oom import mentions_out_of_memory

    return exception_type.endswith("OutOfMemoryError") or mentions_out_of_memory(message)


class ComfyServer:
    """ComfyUI over `base_dir` on a free loopback port; `python` is the Python with ComfyUI's
    requirements, `comfyui_dir` the ComfyUI source tree (read only)."""

    def __init__(self, python: str, comfyui_dir: str, base_dir: str, work_dir: str, *, cpu: bool = False,
                 extra_args: tuple[str, ...] = ()):
        for name, path in (("ComfyUI folder", comfyui_dir), ("base folder", base_dir)):
            if not Path(path).is_dir():
                raise ServerError(f"{name} {path!r} does not exist on this node")
        if not Path(comfyui_dir, "main.py").is_file():
            raise ServerError(f"{comfyui_dir!r} has no main.py: not a ComfyUI source tree")
        self.python, self.comfyui_dir, self.base_dir = python, comfyui_dir, base_dir
        self.work_dir = Path(work_dir)
        self.cpu, self.extra_args = cpu, extra_args
        self.process: subprocess.Popen | None = None
        self.url = ""

    @property
    def output_dir(self) -> Path:
        return self.work_dir / "output"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "comfyui.log"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ComfyServer:
        """Start the server and wait until it answers. The free port it is given can be taken before
        ComfyUI binds it (seconds later, at the end of its start): then it starts again on a new port."""
        for _ in range(PORT_TRIES):
            if self._start_on(_free_port(), timeout_s):
                return self
        raise ServerError(f"ComfyUI found its loopback port taken {PORT_TRIES} times:\n" + self.log_tail())

    def _is_ours(self, body: bytes) -> bool:
        """Whether a ``/system_stats`` answer comes from this server (its argv names our output folder)."""
        try:
            return str(self.output_dir) in json.loads(body)["system"]["argv"]
        except (ValueError, KeyError, TypeError):
            return False

    def _start_on(self, port: int, timeout_s: float) -> bool:
        """Start on `port`; True once it answers, False when the port turned out to be taken."""
        for sub in ("output", "temp", "user", "web"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        args = ["--listen", "127.0.0.1", "--port", str(port), "--base-directory", self.base_dir,
                "--output-directory", str(self.work_dir / "output"), "--temp-directory", str(self.work_dir / "temp"),
                "--user-directory", str(self.work_dir / "user"), "--disable-auto-launch",
                "--front-end-root", str(self.work_dir / "web"),   # the farm drives the API; no web page
                "--database-url", "sqlite:///:memory:", *(("--cpu",) if self.cpu else ()), *self.extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [self.python, "-m", "h3director.farm.serve", str(os.getpid()), self.comfyui_dir, *args],
                cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "address already in use" in self.log_tail().lower():
                    return False
                raise ServerError(f"ComfyUI exited with code {self.process.returncode} while starting:\n"
                                  + self.log_tail())
            try:
                status, body = _request(f"{self.url}/system_stats", timeout=5)
                if status == 200:
                    if self._is_ours(body):
                        return True
                    self.stop()                 # another server holds the port: ours cannot bind it
                    return False
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"ComfyUI did not answer within {timeout_s:.0f} s:\n" + self.log_tail())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def node_classes(self) -> set[str]:
        status, body = _request(f"{self.url}/object_info", timeout=120)
        if status != 200:
            raise ServerError(f"/object_info answered {status}")
        return set(json.loads(body))

    def _collect(self, outputs: dict) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for node_output in outputs.values():
            for items in node_output.values():
                if not isinstance(items, list):
                    continue
                for item in items:
                    if isinstance(item, dict) and item.get("type") == "output" and "filename" in item:
                        relative = Path(item.get("subfolder") or "") / item["filename"]
                        files[relative.as_posix()] = (self.output_dir / relative).read_bytes()
        return files

    def run(self, workflow: dict, timeout_s: float = 24 * 3600) -> RunResult:
        """Queue `workflow`, wait for it, collect its saved files and the memory peak."""
        from h3director.core.monitor import Monitor, ProcessTree

        if not self.alive():
            raise ServerError("the ComfyUI server is not running:\n" + self.log_tail())
        tree = ProcessTree(self.process.pid)
        monitor = Monitor(interval_ms=50, devices=())
        monitor.add_series("server.rss_bytes", tree.rss_bytes)
        monitor.add_series("server.gpu_bytes", tree.gpu_bytes)
        started = time.perf_counter()
        with monitor:
            status, body = _request(f"{self.url}/prompt", {"prompt": workflow, "client_id": str(uuid.uuid4())})
            if status != 200:
                return RunResult("error", error=f"ComfyUI refused the workflow ({status}): {body.decode()[:2000]}")
            prompt_id = json.loads(body)["prompt_id"]
            deadline = time.monotonic() + timeout_s
            entry = None
            while time.monotonic() < deadline:
                code, raw = _request(f"{self.url}/history/{prompt_id}")
                history = json.loads(raw) if code == 200 else {}
                if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
                    entry = history[prompt_id]
                    break
                if not self.alive():
                    raise ServerError("the ComfyUI server died during the job:\n" + self.log_tail())
                time.sleep(POLL_S)
        peaks = monitor.report().peaks
        series = "server.gpu_bytes" if peaks.get("server.gpu_bytes") else "server.rss_bytes"
        peak = int(peaks[series]) if peaks.get(series) else None
        seconds = time.perf_counter() - started
        if entry is None:
            return RunResult("error", peak_bytes=peak, peak_series=series, error=f"no result within {timeout_s} s",
                             seconds=seconds)
        if entry["status"].get("status_str") != "success":
            kind, message = "error", json.dumps(entry["status"])[:4000]
            for name, data in entry["status"].get("messages", []):
                if name == "execution_error":
                    exc_type, exc_message = data.get("exception_type", ""), data.get("exception_message", "")
                    kind = "oom" if is_oom_failure(exc_type, exc_message) else "error"
                    message = f"{exc_type} in node {data.get('node_id')} ({data.get('node_type')}): {exc_message}"
            return RunResult(kind, peak_bytes=peak, peak_series=series, error=message.strip(), seconds=seconds)
        return RunResult("done", files=self._collect(entry.get("outputs", {})), peak_bytes=peak,
                         peak_series=series, seconds=seconds)


__all__ = ["ComfyServer", "RunResult", "ServerError"]
