"""HTTP routes on ComfyUI's server: live memory stats as JSON and the timeline plot as PNG.

    GET /h3director/stats?samples=N      what the live panel shows (schema below); N (1..2000, default
                                         120) cuts the Monitor nodes' timeline to its last N samples
    GET /h3director/report.png?width=W&height=H   the timeline plot (W, H in 320..3840 pixels)

Any other query parameter is refused (400 naming the known ones); an invalid pack config answers 500
with {"error": the config problems}. The schema, versioned by
``schema`` and documented with examples in docs/COMFYUI.md ("Live memory panel"): every key is
always present; null where nothing of that kind exists, or where the ``monitor`` config section
switches it off.

    schema        1
    monitor       {"enabled", "update_interval_ms", "show_pool_usage", "show_fragmentation", "reason"}:
                  the pack's ``monitor`` config section; ``reason`` says why live data is off (null when on)
    running       {"prompt_id", "node_id", "class_type", "title"} of the node ComfyUI executes now
                  (known when the prompt was queued with a client_id, as the page does), or null when idle
    now           [{"device": "host", ...HostSample}, {...DeviceSample}, ...] (bytes; null when the monitor
                  is off)
    allocator     {"cuda:0": {"reserved_bytes", "allocated_bytes", "inactive_bytes",
                  "largest_inactive_run_bytes", "segments", "fragmentation"} or {"error": reason}} for the
                  caching allocator of each accelerator; {} on a CPU-only server; null when off or
                  show_fragmentation is false
    pools         {"cpu": {...PoolStats, "heatmap": {"rows": [[0|1|2|3, ...], ...], "legend": {...}}}}: the
                  slot pools the decodes lease from (bytes; fragmentation a ratio 0..1; heatmap cells
                  0 free (yellow), 1 leased (green), 2 fallback outside the pool (red), 3 padding); null
                  when off or show_pool_usage is false
    shared_store  `StoreStats` of the nodes' shared store (entries, bytes_held, bytes_saved, hits, misses,
                  disk_hits, mutations_detected, references, spills, memory_budget_bytes), or null
                  before a node made it (a stats request never creates it)
    text_cache    {"hits", "misses", "bypassed", "bytes_saved"}: H3Director Cached Text Encode's counters
                  (misses = text encoder runs; bytes_saved = conditioning bytes served from the cache)
    timeline      the Monitor nodes' report (`to_dict()`, samples cut to the last N), or null before
                  any Monitor node ran (the nodes are an explicit request: the config switch leaves them)
    ledger        the per-prompt memory ledger (`h3director.comfy.prompt_ledger.ledger_payload`: the leak
                  rule, the last 10 prompts' readings at start and end with what ComfyUI keeps on purpose,
                  every leak found), or null when ``monitor.prompt_ledger`` is off

The plot is rendered in a temporary folder inside ComfyUI's output folder and deleted after it is
read: no route writes anywhere else.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from h3director.errors import ConfigError, InvalidInputError

ROUTE_PREFIX = "/h3director"
SCHEMA_VERSION = 1
MAX_SAMPLES = 2000
DEFAULT_SAMPLES = 120
PLOT_PIXELS = (320, 3840)
STATS_QUERY = ("samples",)
REPORT_QUERY = ("width", "height")
MAX_HEATMAP_CELLS = 4096
MONITOR_OFF = ("monitor.enable_monitor is false in {source}: set it to true (or H3_MONITOR__ENABLE_MONITOR=true) "
               "and restart ComfyUI for live host and device memory")


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


def check_query_names(query: dict[str, str], known: tuple[str, ...]) -> None:
    """`InvalidInputError` naming the first unknown parameter and the known ones."""
    unknown = sorted(set(query) - set(known))
    if unknown:
        raise InvalidInputError(f"unknown query parameter {unknown[0]!r}; this route takes {', '.join(known)}")


def _device_now() -> list[dict[str, Any]]:
    from h3director.comfy.live import default_devices
    from h3director.core.devices import sample_device, sample_host

    samples = [{"device": "host", **sample_host().to_dict()}]
    samples += [sample_device(d).to_dict() for d in default_devices() if d != "cpu"]
    return samples


def _allocator() -> dict[str, Any]:
    """Caching-allocator fragmentation per accelerator (CUDA's native allocator has segments to read)."""
    from h3director.comfy.live import default_devices
    from h3director.core.allocator_snapshot import cuda_allocator_fragmentation
    from h3director.core.devices import parse_device

    result: dict[str, Any] = {}
    for device in default_devices():
        kind, index = parse_device(device)
        if kind == "cpu":
            continue
        if kind != "cuda":
            result[device] = {"error": f"{kind} has no caching-allocator segment list to read"}
            continue
        try:
            frag = cuda_allocator_fragmentation(index)
        except InvalidInputError as error:
            result[device] = {"error": str(error)}
            continue
        result[device] = {k: v for k, v in dataclasses.asdict(frag).items() if k not in ("free_runs", "device")}
    return result


def _store_stats() -> dict[str, Any] | None:
    from h3director.comfy.nodes_shared import existing_store

    store = existing_store()
    return None if store is None else dataclasses.asdict(store.stats())


def _pools() -> dict[str, Any]:
    from h3director.core.pool_heatmap import COLORS, EMPTY, FALLBACK, FREE, LEASED, pool_heatmap
    from h3director.core.pool_registry import held_pools

    legend = {str(FREE): ["free", COLORS[FREE]], str(LEASED): ["leased", COLORS[LEASED]],
              str(FALLBACK): ["fallback outside the pool", COLORS[FALLBACK]], str(EMPTY): ["padding", COLORS[EMPTY]]}
    pools = {}
    for device, pool in held_pools().items():
        data = dataclasses.asdict(pool.stats())
        heatmap = None
        if pool.slot_count <= MAX_HEATMAP_CELLS:
            cells = pool_heatmap(pool)
            heatmap = {"rows": [list(row) for row in cells.rows], "legend": legend}
        data["heatmap"] = heatmap
        pools[device] = data
    return pools


def _text_cache() -> dict[str, int]:
    from h3director.comfy.nodes_textcache import text_cache_stats

    return text_cache_stats()


def monitor_settings(config) -> dict[str, Any]:
    """The ``monitor`` section as the panel needs it, with the reason live data is off (or None)."""
    section = config.monitor
    reason = None if section.enable_monitor else MONITOR_OFF.format(source=config.source)
    return {"enabled": section.enable_monitor, "update_interval_ms": section.update_interval_ms,
            "show_pool_usage": section.show_pool_usage, "show_fragmentation": section.show_fragmentation,
            "reason": reason}


def stats_payload(samples: int, config=None, server: Any = None) -> dict[str, Any]:
    """The JSON body of `/h3director/stats` (plain data); ``config`` defaults to the pack's."""
    from h3director.comfy.live import running_report
    from h3director.comfy.prompt_ledger import ledger_payload
    from h3director.comfy.runtime import running_node

    if config is None:
        from h3director.comfy.settings import pack_config

        config = pack_config()
    monitor = monitor_settings(config)
    report = running_report()
    timeline = None
    if report is not None:
        data = report.to_dict()
        data["samples"] = data["samples"][-samples:]
        timeline = data
    live = monitor["enabled"]
    return {"schema": SCHEMA_VERSION, "monitor": monitor, "running": running_node(server),
            "now": _device_now() if live else None,
            "allocator": _allocator() if live and monitor["show_fragmentation"] else None,
            "pools": _pools() if live and monitor["show_pool_usage"] else None,
            "shared_store": _store_stats(), "text_cache": _text_cache(), "timeline": timeline,
            "ledger": ledger_payload(config)}


def render_report_png(output_dir: Path, width: int, height: int) -> bytes:
    """PNG bytes, `width` x `height` pixels, of the running (or last) monitor's timeline, drawn in a
    temporary folder inside `output_dir`; `InvalidInputError` when no monitor has recorded a sample."""
    from h3director.comfy.live import report_rgb, running_report

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
        query = dict(request.rel_url.query)
        try:
            check_query_names(query, STATS_QUERY)
            samples = int_query(query, "samples", DEFAULT_SAMPLES, 1, MAX_SAMPLES)
        except InvalidInputError as error:
            return bad_request(error)
        try:
            body = stats_payload(samples)
        except ConfigError as error:   # the pack's config (file or H3_ variables) is invalid: say so, not a bare 500
            return web.json_response({"error": f"H3 Director config: {error}"}, status=500)
        return web.Response(text=json.dumps(body, default=str), content_type="application/json")

    @routes.get(f"{ROUTE_PREFIX}/report.png")
    async def report_png(request):
        from h3director.comfy import runtime

        query = dict(request.rel_url.query)
        try:
            check_query_names(query, REPORT_QUERY)
            width = int_query(query, "width", 1280, *PLOT_PIXELS)
            height = int_query(query, "height", 720, *PLOT_PIXELS)
            body = render_report_png(runtime.output_directory(), width, height)
        except InvalidInputError as error:
            return bad_request(error)
        return web.Response(body=body, content_type="image/png")


__all__ = ["STATS_QUERY", "check_query_names", "int_query", "register_routes", "render_report_png", "stats_payload"]
