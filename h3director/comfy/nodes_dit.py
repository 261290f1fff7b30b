"""H3Director DiT Memory: run ComfyUI's H3 DiT blocks with exact activation chunking (MODEL -> MODEL).

The node clones the MODEL and installs `h3director.integrations.comfy_dit` through ComfyUI's own hooks
(a `patches_replace["dit"]` entry per block and a `DIFFUSION_MODEL` wrapper); the input MODEL is not
changed. Before each forward the wrapper picks the tier (`mode`), runs it, and logs the tier that ran
with its exactness ("H3 Director DiT memory: <tier> (<class>; exact (verified: ...) | approximate: max
difference X measured at <shape> | unverified: ...) for <rows> rows"). The node's own text output
(`DiTMemoryHandle.summary`) shows what was installed and the device's `verify-kernels` status, and other
packs' patches found on the blocks (the director steps aside for the parts they patched;
`h3director.integrations.comfy_dit_foreign`). A pack that patches the blocks after this node is found at
the forward: the warning is logged and shown on the node as its progress text. The tier
choice itself is `h3director.dit.memory`'s.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.dit.capacity import MODES
from h3director.units import GiB


def foreign_lines(handle) -> str:
    """The node text's lines on other packs' patches found at install ("" when none)."""
    if not handle.foreign_at_install:
        return ""
    from h3director.integrations.comfy_dit_foreign import describe_patches

    lines = ["other packs' patches on this MODEL's H3 blocks (their code runs there; the director's tier steps "
             "aside for those parts):"] + [f"  {line}" for line in describe_patches(handle.foreign_at_install)]
    return "\n" + "\n".join(lines)


def progress_text_sender(node_id, summary: str):
    """A function that shows `summary` and a forward's warning on node `node_id` (ComfyUI's progress text), for
    other packs' patches found after the node ran; None outside a ComfyUI server or without a node id."""
    if node_id is None:
        return None
    try:
        from server import PromptServer
    except ImportError:
        return None

    def send(text: str) -> None:
        server = getattr(PromptServer, "instance", None)
        if server is not None:
            server.send_progress_text(f"{summary}\n{text}", node_id)
    return send


class DiTMemoryNode(io.ComfyNode):
    """MODEL -> MODEL (a clone whose H3 DiT blocks run the memory tiers; the input is unchanged).

    Inputs: `mode` (h3director.dit.capacity.MODES), `head_chunks` (must divide the model's heads),
    `ffn_chunks` (>= 1), `budget_gb` (GiB for the capacity check; 0 = what the device can give). Outputs the
    install summary as the node's text. Raises InvalidInputError, before anything is patched, for a negative
    budget, chunks that do not fit the model, or another pack's patches on the H3 blocks."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorDiTMemory",
            display_name="H3Director DiT Memory",
            category="H3 Director/memory",
            description="Runs the H3 DiT blocks with fewer live activations: frees what the stock block keeps "
                        "alive, and optionally projects/attends head groups and runs the FFN in row chunks, with "
                        "the same ops in the same order. 'auto' escalates to a cheaper setting when the forward "
                        "would not fit; 'exact only' uses a technique only where verify-kernels passed it on this "
                        "device for the forward's row count class, else keeps the stock op for that part.",
            inputs=[io.Model.Input("model"),
                    io.Combo.Input("mode", options=list(MODES), default="auto",
                                   tooltip="fixed: exactly these settings; auto: these or cheaper when needed; "
                                           "exact only: like auto, through verified techniques only"),
                    io.Int.Input("head_chunks", default=1, min=1, max=128,
                                 tooltip="attention head groups (must divide the model's heads; H3: 56)"),
                    io.Int.Input("ffn_chunks", default=1, min=1, max=1024, tooltip="FFN row chunks"),
                    io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                                   tooltip="activation budget for the capacity check; 0 = what the device can give")],
            outputs=[io.Model.Output(display_name="model")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, mode, head_chunks, ffn_chunks, budget_gb) -> io.NodeOutput:
        from h3director.errors import InvalidInputError
        from h3director.integrations.comfy_dit import install

        if budget_gb < 0:
            raise InvalidInputError(f"budget_gb must be >= 0 (0 = the device), got {budget_gb}")
        budget = int(budget_gb * GiB) if budget_gb else None
        patched, handle = install(model, head_chunks=int(head_chunks), ffn_chunks=int(ffn_chunks), mode=mode,
                                  budget_bytes=budget)
        inner = getattr(model, "model", None)
        dtype = inner.get_dtype_inference() if hasattr(inner, "get_dtype_inference") else None
        summary = handle.summary(model.load_device, dtype) + foreign_lines(handle)
        handle.notify = progress_text_sender(getattr(cls.hidden, "unique_id", None), summary)
        return io.NodeOutput(patched, ui={"text": (summary,)})


__all__ = ["DiTMemoryNode"]
