"""H3Director DiT Memory: run ComfyUI's H3 DiT blocks with exact activation chunking (MODEL -> MODEL).

The node clones the MODEL and installs `h3director.integrations.comfy_dit` through ComfyUI's own hooks
(a `patches_replace["dit"]` entry per block and a `DIFFUSION_MODEL` wrapper); the input MODEL is not
changed. Before each forward the wrapper picks the tier (`mode`), runs it, and logs the tier that ran
with its exactness ("H3 Director DiT memory: <tier> (<exactness>, verified / not verified on this
device) for <rows> rows"). The node's own text output shows what was installed, the device's
`verify-kernels` status, and (when the prompt re-runs on a MODEL it already patched) the last forward.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.units import GiB

MODES = ["auto", "exact only", "fixed"]


def install_summary(handle, device, dtype) -> str:
    """The node's report: settings, exactness class, and which kernel properties are verified here."""
    from h3director.integrations.comfy_dit import verified_here

    floor = handle.floor
    verified = verified_here(device, dtype)
    needs = set(floor.relies_on)
    lines = [f"H3Director DiT Memory on {handle.blocks} blocks ({handle.heads} heads), mode {handle.mode}",
             f"settings: {floor.describe()} ({floor.exactness.value})",
             "budget: " + (f"{handle.budget_bytes / GiB:.2f} GiB" if handle.budget_bytes else "the device's")]
    if not needs:
        lines.append("exactness: exact by construction (only lifetimes change)")
    elif needs <= verified:
        lines.append(f"exactness: verified exact on {device} ({dtype}) by verify-kernels")
    else:
        lines.append(f"exactness: NOT verified on {device} ({dtype}): {', '.join(sorted(needs - verified))}; "
                     "run `h3director verify-kernels` on this machine"
                     + ("; 'exact only' will not use these techniques" if handle.mode == "exact only" else ""))
    lines.append("the tier each forward runs is logged as 'H3 Director DiT memory: ...'")
    return "\n".join(lines)


def check_exact_only(floor, device, dtype) -> None:
    """'exact only' starts from settings whose kernel properties `verify-kernels` passed here, or refuses."""
    from h3director.errors import InvalidInputError
    from h3director.integrations.comfy_dit import verified_here

    missing = sorted(set(floor.relies_on) - verified_here(device, dtype))
    if missing:
        raise InvalidInputError(
            f"mode 'exact only' with {floor.describe()} relies on {', '.join(missing)}, not verified on {device} "
            f"({dtype}): run `h3director verify-kernels` on this machine, use head_chunks=1 and ffn_chunks=1 (exact by "
            "construction), or mode auto / fixed")


class DiTMemoryNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorDiTMemory",
            display_name="H3Director DiT Memory",
            category="H3 Director/memory",
            description="Runs the H3 DiT blocks with fewer live activations: frees what the stock block keeps "
                        "alive, and optionally projects/attends head groups and runs the FFN in row chunks, with "
                        "the same ops in the same order. 'auto' escalates to a cheaper setting when the forward "
                        "would not fit; 'exact only' uses only techniques verify-kernels passed on this device.",
            inputs=[io.Model.Input("model"),
                    io.Combo.Input("mode", options=MODES, default="auto",
                                   tooltip="fixed: exactly these settings; auto: these or cheaper when needed; "
                                           "exact only: like auto, through verified techniques only"),
                    io.Int.Input("head_chunks", default=1, min=1, max=128,
                                 tooltip="attention head groups (must divide the model's heads; H3: 56)"),
                    io.Int.Input("ffn_chunks", default=1, min=1, max=1024, tooltip="FFN row chunks"),
                    io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                                   tooltip="activation budget for the capacity check; 0 = what the device can give")],
            outputs=[io.Model.Output(display_name="model")],
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
        if mode == "exact only":
            check_exact_only(handle.floor, model.load_device, dtype)
        summary = install_summary(handle, model.load_device, dtype)
        return io.NodeOutput(patched, ui={"text": (summary,)})
