"""HTTP routes on ComfyUI's server: live memory stats as JSON and the timeline plot as PNG.

    GET /h3director/stats?samples=N      current host/device sample, pool and fragmentation, the last
                                         N (1..2000, default 120) timeline samples of the running (or
                                         last) monitor
    GET /h3director/report.png?width=W&height=H   the timeline plot (W, H in 320..3840 pixels)

Query values are validated (400 with the reason otherwise). The plot is rendered in a temporary
folder inside ComfyUI's output folder and deleted after it is read: no route writes anywhere else.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from h3director.errors import InvalidInputError

ROUTE_PREFIX = "/h3director"
MAX_SAMPLES = 2000
DEFAULT_SAMPLES = 120
PLOT_PIXELS = (320, 3840)


def int_query(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """`query[name]` as an int in [low, high], or `default`; `InvalidInputError` otherwise."""
    text = query.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit():
        raise InvalidInputError(f"{name} must be a whole number in {low}..{high}, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise InvalidInputError(f"{name} must be in {low}..{high}, got {value}")
    return value


def _device_now() -> list[dict[str, Any]]:
    from h3director.comfy.live import default_devices
    from h3director.core.devices import sample_device, sample_host

    samples = [{"device": "host", **sample_host().to_dict()}]
    samples += [sample_device(d).to_dict() for d in default_devices() if d != "cpu"]
    return samples


def _pool_stats() -> dict[str, Any] | None:
    try:
        from h3director.comfy.nodes_shared import shared_store

        stats = shared_store().stats()
    except (ImportError, AttributeError):
        return None
    return dataclasses.asdict(stats)


def stats_payload(samples: int) -> dict[str, Any]:
    """The JSON body of `/h3director/stats` (plain data)."""
    from h3director.comfy.live import running_report

    report = running_report()
    timeline = None
    if report is not None:
        data = report.to_dict()
        data["samples"] = data["samples"][-samples:]
        timeline = data
    return {"now": _device_now(), "shared_store": _pool_stats(), "timeline": timeline}


def render_report_png(output_dir: Path, width: int, height: int) -> bytes:
    """PNG bytes of the running (or last) monitor's timeline; `InvalidInputError` when there is none."""
    from h3director.comfy.live import running_report
    from h3director.comfy.nodes_monitor import report_rgb

    report = running_report()
    if report is None or not report.samples:
        raise InvalidInputError("no memory monitor has run yet: add H3Director Memory Monitor nodes to a prompt")
    label = report.metadata.get("label") if isinstance(report.metadata, dict) else None
    image = report_rgb(report, "H3 Director memory" + (f": {label}" if label else ""), folder=output_dir)
    buffer = io.BytesIO()
    image.resize((width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def register_routes(routes) -> None:
    """Add the routes to an aiohttp `RouteTableDef` (ComfyUI's `PromptServer.instance.routes`)."""
    from aiohttp import web

    def bad_request(error: Exception):
        return web.json_response({"error": str(error)}, status=400)

    @routes.get(f"{ROUTE_PREFIX}/stats")
    async def stats(request):
        try:
            samples = int_query(dict(request.rel_url.query), "samples", DEFAULT_SAMPLES, 1, MAX_SAMPLES)
        except InvalidInputError as error:
            return bad_request(error)
        return web.Response(text=json.dumps(stats_payload(samples), default=str), content_type="application/json")

    @routes.get(f"{ROUTE_PREFIX}/report.png")
    async def report_png(request):
        from h3director.comfy import runtime

        query = dict(request.rel_url.query)
        try:
            width = int_query(query, "width", 1280, *PLOT_PIXELS)
            height = int_query(query, "height", 720, *PLOT_PIXELS)
            body = render_report_png(runtime.output_directory(), width, height)
        except InvalidInputError as error:
            return bad_request(error)
        return web.Response(body=body, content_type="image/png")
