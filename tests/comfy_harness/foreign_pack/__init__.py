"""A stand-in for another ComfyUI node pack that patches the H3 DiT blocks (tests only).

It patches through the interface ComfyUI gives every pack, as real H3 packs do (e.g. KJNodes' H3 chunk nodes):
`ModelPatcher.add_object_patch` on `diffusion_model.blocks.N.forward`, `.attn.forward` or `.mlp.forward` (a bound
method set on the module while the model runs), or `set_model_patch_replace(entry, "dit", "double_block", N)`.
Each patched forward runs the stock arithmetic (the class's own `forward`, or the stock MLP body) and counts its
calls in `CALLS`, so a test can tell whether this pack's code ran and compare outputs with the stock model.

The worker (tests/comfy_harness/dit_foreign_worker.py) loads this folder the way ComfyUI loads a custom node pack
(a module named after its path under a `custom_nodes` folder), so its patches' origin reads as this pack's folder.
"""

from __future__ import annotations

import types

PARTS = ("block", "attention", "ffn", "replace")
CALLS = {part: 0 for part in PARTS}


def reset() -> None:
    for part in PARTS:
        CALLS[part] = 0


def ffn_forward(self, x):
    """`MLP.forward`'s body (ComfyUI's H3), counted."""
    import comfy.ops

    CALLS["ffn"] += 1
    return comfy.ops.linear_input_act(self.fc2, self.fc1(x), "swiglu")


def attention_forward(self, x, rope_freqs=None, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
    CALLS["attention"] += 1
    return type(self).forward(self, x, rope_freqs=rope_freqs, transformer_options=transformer_options)


def block_forward(self, x, t_emb, mod_segments, rope_freqs, transformer_options={}):  # noqa: B006
    CALLS["block"] += 1
    return type(self).forward(self, x, t_emb, mod_segments, rope_freqs, transformer_options=transformer_options)


class BlockReplace:
    """A `patches_replace["dit"][("double_block", N)]` entry that runs the block it is given."""

    def __call__(self, args: dict, extra: dict) -> dict:
        CALLS["replace"] += 1
        return extra["original_block"](args)


def patch(model_patcher, parts):
    """A clone of `model_patcher` with this pack's patches on every H3 block for `parts` (of `PARTS`)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; known: {PARTS}")
    patched = model_patcher.clone()
    model = patched.get_model_object("diffusion_model")
    for i, block in enumerate(model.blocks):
        if "block" in parts:
            patched.add_object_patch(f"diffusion_model.blocks.{i}.forward", types.MethodType(block_forward, block))
        if "attention" in parts:
            patched.add_object_patch(f"diffusion_model.blocks.{i}.attn.forward",
                                     types.MethodType(attention_forward, block.attn))
        if "ffn" in parts:
            patched.add_object_patch(f"diffusion_model.blocks.{i}.mlp.forward", types.MethodType(ffn_forward, block.mlp))
        if "replace" in parts:
            patched.set_model_patch_replace(BlockReplace(), "dit", "double_block", i)
    return patched


class H3TestForeignPatch:
    """The node of this stand-in pack: its patches on every H3 block for one part (`patch`)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "part": (list(PARTS), {"default": "ffn"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "apply"
    CATEGORY = "testing"

    def apply(self, model, part):
        return (patch(model, [part]),)


NODE_CLASS_MAPPINGS = {"H3TestForeignPatch": H3TestForeignPatch}
