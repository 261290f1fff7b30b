"""The V3 `ComfyExtension` of the pack: the node list; on load, the HTTP routes and the per-prompt memory ledger."""

from __future__ import annotations

import logging

from comfy_api.latest import ComfyExtension, io

from h3director.comfy.nodes_avsync import AVSyncMeasure
from h3director.comfy.nodes_blockswap import BlockSwapNode
from h3director.comfy.nodes_decode import DecodeAVStreaming
from h3director.comfy.nodes_dit import DiTMemoryNode
from h3director.comfy.nodes_frames import FrameOffset
from h3director.comfy.nodes_gguf import GGUFDiTLoader
from h3director.comfy.nodes_guard import MemoryGuardNode
from h3director.comfy.nodes_keyframes import KeyframeMerge, KeyframeSelect
from h3director.comfy.nodes_monitor import MonitorStart, MonitorStop
from h3director.comfy.nodes_placement import DevicePlacement
from h3director.comfy.nodes_plan import PlanNode
from h3director.comfy.nodes_resume import ResumableSampler
from h3director.comfy.nodes_shared import SharedRead, SharedWrite
from h3director.comfy.nodes_staged import DraftToAV, VideoOnlyLatent, VideoStream
from h3director.comfy.nodes_stitch import Stitch
from h3director.comfy.nodes_textcache import CachedTextEncode
from h3director.comfy.nodes_upscale import UpscaleStreaming

NODES: list[type[io.ComfyNode]] = [
    DecodeAVStreaming, MonitorStart, MonitorStop, MemoryGuardNode, SharedWrite, SharedRead, FrameOffset, PlanNode,
    DiTMemoryNode, GGUFDiTLoader, CachedTextEncode, Stitch,
    AVSyncMeasure, KeyframeSelect, KeyframeMerge, DevicePlacement, UpscaleStreaming, BlockSwapNode,
    VideoOnlyLatent, VideoStream, DraftToAV, ResumableSampler,
]


class H3DirectorExtension(ComfyExtension):
    """The pack's `ComfyExtension`: `get_node_list` returns `NODES`; `on_load`, inside ComfyUI's server,
    registers the `/h3director/*` routes and the per-prompt ledger (a ledger that cannot be installed is
    logged, and ComfyUI still starts)."""

    async def on_load(self) -> None:
        try:
            from server import PromptServer
        except ImportError:  # loaded outside ComfyUI's server (tests): no routes
            return
        if PromptServer.instance is None:
            return
        from h3director.comfy.prompt_ledger import install
        from h3director.comfy.routes import register_routes
        from h3director.comfy.settings import pack_config

        register_routes(PromptServer.instance.routes)
        logging.info("H3 Director: routes /h3director/stats and /h3director/report.png registered")
        try:
            if await install(pack_config()):
                logging.info("H3 Director: per-prompt memory ledger on (monitor.prompt_ledger)")
        except Exception as error:  # an invalid config or an older ComfyUI without the hook: ComfyUI still starts
            logging.warning("H3 Director: per-prompt memory ledger not installed: %s", error)

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


__all__ = ["H3DirectorExtension"]
