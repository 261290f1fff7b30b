"""HTTP routes on ComfyUI's server: live memory stats as JSON and the timeline plot as PNG.

    GET /h3director/stats?samples=N      current host/device sample, the slot pools, the shared store,
                                         the text cache, the last N (1..2000, default 120) timeline
                                         samples of the running (or last) monitor
    GET /h3director/report.png?width=W&height=H   the timeline plot (W, H in 320..3840 pixels)

The stats JSON (every key always present; null where nothing of that kind exists yet):

    now           [{"device": "host", ...host sample}, {...device sample}, ...]
    pools         {"cpu": PoolStats, "cuda:0": PoolStats, ...}: the process-wide slot pools the decodes
                  lease from (`h3director.core.pool.PoolStats` fields, bytes; fragmentation a ratio)
    shared_store  `StoreStats` of the nodes' shared store (entries, bytes_held, bytes_saved, hits, misses,
                  disk_hits, mutations_detected, references, spills, memory_budget_bytes), or null
                  before a node made it (a stats request never creates it)
    text_cache    {"hits", "misses", "bypassed", "bytes_saved"}: H3Director Cached Text Encode's counters
                  (misses = text encoder runs; bytes_saved = conditioning bytes served from the cache)
    timeline      the monitor's report (`to_dict()`, samples cut to the last N), or null

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


def _store_stats() -> dict[str, Any] | None:
    from h3director.comfy.nodes_shared import existing_store

    store = existing_store()
    return None if store is None else dataclasses.asdict(store.stats())


def _pools() -> dict[str, Any]:
    from h3director.core.pool_registry import held_pools

    return {device: dataclasses.asdict(pool.stats()) for device, pool in held_pools().items()}


def _text_cache() -> dict[str, int]:
    from h3director.comfy.nodes_textcache import text_cache_stats

    return text_cache_stats()


def stats_payload(samples: int) -> dict[str, Any]:
    """The JSON body of `/h3director/stats` (plain data)."""
    from h3director.comfy.live import running_report

    report = running_report()
    timeline = None
    if report is not None:
        data = report.to_dict()
        data["samples"] = data["samples"][-samples:]
        timeline = data
    return {"now": _device_now(), "pools": _pools(), "shared_store": _store_stats(), "text_cache": _text_cache(),
            "timeline": timeline}


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
