"""H3Director Plan: the planner's per-phase estimate and recommendation for a latent on this device, with the
recommended settings as outputs a workflow can wire into the nodes that apply them."""

from __future__ import annotations

from dataclasses import dataclass

from comfy_api.latest import io

from h3director.comfy.latents import split_av_latent
from h3director.geometry import SPATIAL_RATIO, frames_for_latents
from h3director.units import GiB, format_size


@dataclass(frozen=True)
class WiredSettings:
    """The settings the node outputs: attention head groups and FFN row chunks (H3DirectorDiTMemory), DiT blocks
    kept in host RAM (H3DirectorBlockSwap), and the decode phase's device need in GiB (the decode node's
    ``budget_gb``). The stock values (1, 1, 0, 0.0 = the node's own budget) when nothing was recommended."""

    head_chunks: int = 1
    ffn_chunks: int = 1
    blocks_offloaded: int = 0
    budget_gb: float = 0.0


def wired_settings(recommendation) -> WiredSettings:
    """The `WiredSettings` of a `plan.recommend.Recommendation`, read from the capability registry's
    `applied_settings` for ComfyUI (the same values a written workflow sets)."""
    import math

    from h3director.plan.capabilities import applied_settings

    values: dict = {}
    for setting in applied_settings(recommendation.request, "comfyui"):
        if setting.capability in ("dit.chunking", "dit.block_offload"):
            values.update({k: int(v) for k, v in setting.values.items()})
    decode = next(p for p in recommendation.estimate.phases if p.name == "decode")
    return WiredSettings(head_chunks=values.get("head_chunks", 1), ffn_chunks=values.get("ffn_chunks", 1),
                         blocks_offloaded=values.get("blocks_offloaded", 0),
                         budget_gb=math.ceil(decode.device_bytes / GiB * 100) / 100)


def device_budget_bytes() -> tuple[int | None, str]:
    """Total memory of ComfyUI's torch device (host RAM on the CPU) and its name."""
    from h3director.comfy import runtime

    device = runtime.torch_device()
    return runtime.total_bytes(device), str(device)


def plan_for(width: int, height: int, frames: int, budget_bytes: int | None,
             device_name: str) -> tuple[str, WiredSettings]:
    """Per-phase estimate and recommendation as text (the planner's own tables), and the recommended settings
    (the stock `WiredSettings` when there is no budget or nothing fits, which the text says)."""
    from h3director.errors import BudgetError
    from h3director.plan import PlanRequest, estimate, recommend
    from h3director.plan.recommend import DIT_FORMATS
    from h3director.plan.workflow_comfy import loadable_formats

    request = PlanRequest(width=width, height=height, frames=frames)
    lines = [f"H3 {width}x{height}, {frames} frames on {device_name}"
             + (f" (budget {format_size(budget_bytes)})" if budget_bytes else ""),
             estimate(request).summary_table()]
    settings = WiredSettings()
    if budget_bytes:
        try:
            import psutil

            advice = recommend(request, budget_bytes, host_bytes=psutil.virtual_memory().total,
                               formats=loadable_formats(DIT_FORMATS, "comfyui"))
            lines.append(advice.summary())
            if advice.long_form is None:
                settings = wired_settings(advice)
            else:
                lines.append("outputs: the stock settings (the plan is long-form: one pass does not fit)")
        except BudgetError as error:  # "nothing fits" is an answer, shown as such
            lines.append(f"no settings fit: {error}")
    lines.append(f"outputs: head_chunks {settings.head_chunks}, ffn_chunks {settings.ffn_chunks}, "
                 f"blocks_offloaded {settings.blocks_offloaded}, budget_gb {settings.budget_gb}")
    return "\n".join(lines), settings


class PlanNode(io.ComfyNode):
    """Node `H3DirectorPlan`: an H3 LATENT + `budget_gb` (GiB; 0 = this device's memory) -> `plan`
    (STRING: per-phase estimate and recommendation) and the recommended settings to wire on: `head_chunks`,
    `ffn_chunks`, `blocks_offloaded` (INT) and `budget_gb` (FLOAT, GiB, for the streaming decode)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorPlan",
            display_name="H3Director Plan",
            category="H3 Director/plan",
            description="Estimates memory per phase (weights, DiT, decode, host buffers) for this latent and "
                        "recommends settings that fit this device (or `budget_gb`). The recommended settings are "
                        "outputs: wire head_chunks / ffn_chunks into H3Director DiT Memory (mode fixed), "
                        "blocks_offloaded into the block swap node, budget_gb into the streaming decode.",
            inputs=[io.Latent.Input("samples"),
                    io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                                   tooltip="0 = this device's total memory")],
            outputs=[io.String.Output(display_name="plan"),
                     io.Int.Output(display_name="head_chunks", tooltip="attention head groups (DiT Memory)"),
                     io.Int.Output(display_name="ffn_chunks", tooltip="FFN row chunks (DiT Memory)"),
                     io.Int.Output(display_name="blocks_offloaded", tooltip="DiT blocks kept in host RAM"),
                     io.Float.Output(display_name="budget_gb",
                                     tooltip="the decode phase's device need, GiB (the streaming decode's budget)")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, samples, budget_gb) -> io.NodeOutput:
        video = split_av_latent(samples).video
        frames = frames_for_latents(video.shape[2])
        if budget_gb:
            budget, name = int(budget_gb * GiB), "the given budget"
        else:
            budget, name = device_budget_bytes()
        text, s = plan_for(video.shape[4] * SPATIAL_RATIO, video.shape[3] * SPATIAL_RATIO, frames, budget, name)
        return io.NodeOutput(text, s.head_chunks, s.ffn_chunks, s.blocks_offloaded, s.budget_gb, ui={"text": (text,)})


__all__ = ["PlanNode", "WiredSettings"]
