"""H3Director Block Swap: keep N of the H3 DiT's blocks in host RAM, each copied in just before it runs (MODEL -> MODEL).

The node clones the MODEL and installs `h3director.integrations.comfy_blockswap` through ComfyUI's own hooks (a
`DIFFUSION_MODEL` wrapper that chains the offloaded blocks' `patches_replace["dit"]` entries per forward, and
ON_LOAD / ON_DETACH callbacks); the input MODEL is not changed. Mechanism and the reasons for it: the adapter's
docstring. Exactness: exact by construction (only placement changes). `blocks_offloaded` is the planner's
"N of 50 blocks offloaded" (`PlanRequest.offload_blocks`); a count above the model's blocks is refused before
anything loads. Composes with H3Director DiT Memory (either order), the GGUF DiT loader and LoRA.
"""

from __future__ import annotations

from comfy_api.latest import io

MAX_BLOCKS = 100  # the planner's MAX_DIT_LAYERS; the connected model's own count is checked in execute


class BlockSwapNode(io.ComfyNode):
    """Node `H3DirectorBlockSwap`: MODEL + `blocks_offloaded` (count of DiT blocks kept in host RAM) -> a
    clone of the MODEL with `integrations.comfy_blockswap` installed; the input MODEL is unchanged. A count
    above the model's blocks raises InvalidInputError before anything loads. Exact by construction."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorBlockSwap",
            display_name="H3Director Block Swap",
            category="H3 Director/memory",
            description="Keeps the chosen number of H3 DiT blocks in host RAM (pinned on CUDA) and copies each onto "
                        "the GPU just before it runs, the next one arriving on a side stream while the current one "
                        "computes. The blocks run on bit copies of the loaded weights (LoRA included): the output is "
                        "identical to all blocks resident.",
            inputs=[io.Model.Input("model"),
                    io.Int.Input("blocks_offloaded", default=0, min=0, max=MAX_BLOCKS,
                                 tooltip="DiT blocks kept in host RAM (0 to the model's blocks; H3: 50), e.g. the "
                                         "count `h3director plan` recommends")],
            outputs=[io.Model.Output(display_name="model")],
        )

    @classmethod
    def execute(cls, model, blocks_offloaded) -> io.NodeOutput:
        from h3director.integrations.comfy_blockswap import install, summary

        patched, handle = install(model, int(blocks_offloaded))
        return io.NodeOutput(patched, ui={"text": (summary(handle, model.load_device),)})


__all__ = ["BlockSwapNode"]
