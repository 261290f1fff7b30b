"""H3Director Plan: the planner's per-phase estimate and recommendation for a latent on this device."""

from __future__ import annotations

from comfy_api.latest import io

from h3director.comfy.latents import split_av_latent
from h3director.geometry import SPATIAL_RATIO, frames_for_latents
from h3director.units import GiB, format_size


def device_budget_bytes() -> tuple[int | None, str]:
    """Total memory of ComfyUI's torch device (host RAM on the CPU) and its name."""
    from h3director.comfy import runtime

    device = runtime.torch_device()
    return runtime.total_bytes(device), str(device)


def plan_text(width: int, height: int, frames: int, budget_bytes: int | None, device_name: str) -> str:
    """Per-phase estimate and recommendation as text (the planner's own tables)."""
    from h3director.errors import BudgetError
    from h3director.plan import PlanRequest, estimate, recommend

    request = PlanRequest(width=width, height=height, frames=frames)
    lines = [f"H3 {width}x{height}, {frames} frames on {device_name}"
             + (f" (budget {format_size(budget_bytes)})" if budget_bytes else ""),
             estimate(request).summary_table()]
    if budget_bytes:
        try:
            import psutil

            lines.append(recommend(request, budget_bytes, host_bytes=psutil.virtual_memory().total).summary())
        except BudgetError as error:  # "nothing fits" is an answer, shown as such
            lines.append(f"no settings fit: {error}")
    return "\n".join(lines)


class PlanNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorPlan",
            display_name="H3Director Plan",
            category="H3 Director/plan",
            description="Estimates memory per phase (weights, DiT, decode, host buffers) for this latent and "
                        "recommends settings that fit this device (or `budget_gb`).",
            inputs=[io.Latent.Input("samples"),
                    io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                                   tooltip="0 = this device's total memory")],
            outputs=[io.String.Output(display_name="plan")],
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
        text = plan_text(video.shape[4] * SPATIAL_RATIO, video.shape[3] * SPATIAL_RATIO, frames, budget, name)
        return io.NodeOutput(text, ui={"text": (text,)})
