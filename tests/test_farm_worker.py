"""The farm worker (`FarmWorker`, as a plain object in this process under a real in-process Ray) with its
real ComfyUI server (the vendored snapshot, tiny H3 VAEs, --cpu): a server that died between jobs (the
kernel's OOM killer picks the process holding the models: the server, not the worker) is started again
for the next job instead of failing every job Ray places on that device."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import pytest
from comfy_harness.vendored import real_comfyui_marks

ray = pytest.importorskip("ray")
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()


def test_a_server_that_died_is_started_again_for_the_next_job(tmp_path):
    from comfy_harness.farm_base import DECODE_WORKFLOW, prepare_farm_base

    from h3director.farm.worker import FarmWorker, ServerConfig

    prepare_farm_base(tmp_path / "base")
    config = ServerConfig(python=os.environ.get("COMFYUI_PYTHON", sys.executable), comfyui_dir=COMFYUI_DIR,
                          base_dir=str(tmp_path / "base"), cpu=True, work_root=str(tmp_path))
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    worker = None
    try:
        worker = FarmWorker("w0", asdict(config))
        first = worker.server.process
        first.kill()                                    # as the kernel's OOM killer would
        first.wait()
        result = worker.run("after-the-crash", DECODE_WORKFLOW)
        assert result["status"] == "done", result["error"]
        assert [name.split("/")[-1] for name in result["files"]] == ["decode_00001_.mp4"]
        assert worker.server.alive() and worker.server.process.pid != first.pid
    finally:
        if worker is not None:
            worker._shutdown(worker.work)
        ray.shutdown()


def test_a_port_taken_before_the_server_binds_it_is_not_mistaken_for_ours(tmp_path, monkeypatch):
    """The free port a server is given can be taken (by another worker's server on this machine) before
    ComfyUI binds it, seconds later: the server that answers there is not ours; ours fails to bind and
    is started again on another port."""
    from comfy_harness.farm_base import prepare_farm_base

    from h3director.farm import comfy_server
    from h3director.farm.comfy_server import ComfyServer

    base = str(prepare_farm_base(tmp_path / "base"))
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    first = ComfyServer(python, COMFYUI_DIR, base, str(tmp_path / "first"), cpu=True)
    second = ComfyServer(python, COMFYUI_DIR, base, str(tmp_path / "second"), cpu=True)
    try:
        first.start()
        taken = int(first.url.rsplit(":", 1)[1])
        ports = iter([taken])
        real = comfy_server._free_port
        monkeypatch.setattr(comfy_server, "_free_port", lambda: next(ports, None) or real())
        second.start()
        assert second.url != first.url and second.alive()
        status, body = comfy_server._request(f"{second.url}/system_stats")
        assert status == 200 and str(second.output_dir) in json.loads(body)["system"]["argv"]
    finally:
        second.stop()
        first.stop()
