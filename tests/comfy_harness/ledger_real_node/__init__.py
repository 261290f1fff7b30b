"""Test-only ComfyUI custom node folder for tests/test_comfy_real_ledger.py (never installed with the pack).

- `H3TestLeak` (seed, mib -> INT; an output node): appends `mib` MiB of new tensors (ones: every page
  resident) to the module-level list `LEAKED` on every run. A leak: nothing ComfyUI keeps holds them.
- `H3TestBigOutput` (seed, mib -> H3_TEST_BLOB): returns a new `mib` MiB tensor. ComfyUI caches the output of
  every executed node, so with a cache that keeps old entries (`--cache-lru N`) each new seed adds `mib` MiB
  that ComfyUI keeps on purpose.
- `H3TestBlobSink` (H3_TEST_BLOB -> INT; an output node): reports the blob's size in bytes.

`seed` only makes ComfyUI run the node again (a changed input); the bytes do not depend on it.
"""

import torch

MiB = 1024 * 1024
LEAKED = []


class Leak:
    CATEGORY = "H3 Director test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "leak"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31}),
                             "mib": ("INT", {"default": 64, "min": 1, "max": 4096})}}

    def leak(self, seed, mib):
        LEAKED.append(torch.ones(mib * MiB, dtype=torch.uint8))
        return {"ui": {"text": (str(len(LEAKED)),)}, "result": (len(LEAKED),)}


class BigOutput:
    CATEGORY = "H3 Director test"
    RETURN_TYPES = ("H3_TEST_BLOB",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31}),
                             "mib": ("INT", {"default": 32, "min": 1, "max": 4096})}}

    def make(self, seed, mib):
        return (torch.ones(mib * MiB, dtype=torch.uint8),)


class BlobSink:
    CATEGORY = "H3 Director test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "size"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"blob": ("H3_TEST_BLOB",)}}

    def size(self, blob):
        nbytes = blob.numel() * blob.element_size()
        return {"ui": {"text": (str(nbytes),)}, "result": (nbytes,)}


NODE_CLASS_MAPPINGS = {"H3TestLeak": Leak, "H3TestBigOutput": BigOutput, "H3TestBlobSink": BlobSink}
