"""Test-only ComfyUI custom node folder for tests/test_comfy_real_switches.py.

`H3TestCountedCLIP` supplies a CLIP object with ComfyUI's CLIP surface (`cond_stage_model`, `patcher`
with `patches_uuid`/`patches`, `layer_idx`, `tokenize`, `encode_from_tokens_scheduled`) around a small
real torch encoder (embedding + linear, weights from `seed`); H3's real text encoder is far too large
for a test. Every encoder forward is counted in `output/encoder_forwards.txt`. A new CLIP object with a
new module is built each time the node runs (as a loader does under `--cache-none`).
`H3TestUseConditioning` consumes a CONDITIONING and a `length` (the input a user nudges) and records
the conditioning's sum in `output/conditioning_<length>.txt`. Copied into a temporary ComfyUI base
directory by the test; never installed with the pack.
"""

import os
import uuid


def _output(name):
    import folder_paths

    return os.path.join(folder_paths.get_output_directory(), name)


def _count_forward():
    path = _output("encoder_forwards.txt")
    count = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as handle:
        handle.write(str(count + 1))


def _encoder(seed):
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            generator = torch.Generator().manual_seed(seed)
            self.embed = torch.nn.Embedding(256, 32)
            self.proj = torch.nn.Linear(32, 32)
            with torch.no_grad():
                for parameter in self.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator))

        def forward(self, ids):
            _count_forward()
            return self.proj(self.embed(ids))

    return Encoder()


class _Patcher:
    def __init__(self):
        self.patches_uuid = uuid.uuid4()
        self.patches = {}
        self.forced_hooks = None


class CountedClip:
    def __init__(self, seed):
        self.cond_stage_model = _encoder(seed)
        self.patcher = _Patcher()
        self.layer_idx = None

    def tokenize(self, text):
        import torch

        data = text.encode()[:16].ljust(16, b"\0")
        return torch.tensor(list(data)).view(1, -1)

    def encode_from_tokens_scheduled(self, tokens):
        import torch

        with torch.no_grad():
            cond = self.cond_stage_model(tokens)
        return [[cond, {"pooled_output": cond.mean(1)}]]


class H3TestCountedCLIP:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1})}}

    RETURN_TYPES = ("CLIP",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, seed):
        return (CountedClip(seed),)


class H3TestUseConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"conditioning": ("CONDITIONING",),
                             "length": ("INT", {"default": 22, "min": 1, "max": 10000})}}

    RETURN_TYPES = ()
    FUNCTION = "use"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def use(self, conditioning, length):
        with open(_output(f"conditioning_{length}.txt"), "w") as handle:
            handle.write(repr(float(conditioning[0][0].double().sum())))
        return {}


NODE_CLASS_MAPPINGS = {"H3TestCountedCLIP": H3TestCountedCLIP, "H3TestUseConditioning": H3TestUseConditioning}
