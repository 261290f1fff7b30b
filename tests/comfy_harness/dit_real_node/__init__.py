"""Test-only ComfyUI custom node folder for tests/test_comfy_real_dit.py.

- `H3TestDiTConditioning`: H3's text encoder (Qwen3-VL) is far too large for a test, so this node makes the
  CONDITIONING a text encoder would: a seeded random `[1, length, dim]` float32 tensor, empty options;
- `H3TestDiTSaveLatent`: saves a LATENT's streams as safetensors;
- `H3TestDiTLoader`: loads a diffusion model file with ComfyUI's own `comfy.sd.load_diffusion_model` at a
  given dtype (float32 or bfloat16; UNETLoader offers no bfloat16 on the CPU);
- `H3TestVerifyKernels`: runs `h3director.dit.kernels.verify_kernels` inside the server (its torch, its
  thread count) at the MODEL's widths and the packed rows of the LATENT and CONDITIONING, filed in the
  server's kernel cache (its text output: the result, then the rows);
- `H3TestGuardReduce`: the Memory Guard's real `DIFFUSION_MODEL` wrapper (`make_guard_wrapper`, action
  reduce_batch) with a budget halfway between the ledger's need of the DiT Memory floor and of the next
  ladder tier at the packed rows of the LATENT and CONDITIONING. The guard's device reading is a constant 0 bytes in use (the one stand-in:
  the server's RSS moves by more than the tiny model's tier differences, which would make the test flaky).

Copied into a temporary ComfyUI base directory by the test; never installed with the pack.
"""


class H3TestDiTConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"length": ("INT", {"default": 7, "min": 1, "max": 512}),
                             "dim": ("INT", {"default": 48, "min": 1, "max": 8192}),
                             "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, length, dim, seed):
        import torch

        generator = torch.Generator().manual_seed(seed)
        return ([[torch.randn(1, length, dim, generator=generator), {}]],)


class H3TestDiTSaveLatent:
    """Saves a LATENT's tensors (each stream of an AV `NestedTensor`) as `output/tensors/<name>.safetensors`."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "name": ("STRING", {"default": "latent"})}}

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, samples, name):
        import os

        import folder_paths
        import safetensors.torch

        latent = samples["samples"]
        streams = latent.unbind() if getattr(latent, "is_nested", False) else [latent]
        folder = os.path.join(folder_paths.get_output_directory(), "tensors")
        os.makedirs(folder, exist_ok=True)
        tensors = {f"stream{i}": t.contiguous() for i, t in enumerate(streams)}
        safetensors.torch.save_file(tensors, os.path.join(folder, f"{name}.safetensors"))
        return {}


class H3TestDiTLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"unet_name": ("STRING", {"default": "h3_tiny_dit.safetensors"}),
                             "dtype": (["float32", "bfloat16"],)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, unet_name, dtype):
        import comfy.sd
        import folder_paths
        import torch

        path = folder_paths.get_full_path_or_raise("diffusion_models", unet_name)
        return (comfy.sd.load_diffusion_model(path, model_options={"dtype": getattr(torch, dtype)}),)


def _dtype_of(model):
    return model.model.get_dtype_inference()


def _packed_rows(model, latent, conditioning) -> int:
    """The packed rows a forward of `model` over `latent` with `conditioning` has (`comfy_dit.packed_rows`)."""
    from h3director.integrations.comfy_dit import packed_rows

    samples = latent["samples"]
    streams = list(samples.unbind()) if getattr(samples, "is_nested", False) else [samples]
    return packed_rows(model.model.diffusion_model, streams, conditioning[0][0], None)


_ROWS_INPUTS = {"model": ("MODEL",), "latent": ("LATENT",), "conditioning": ("CONDITIONING",)}


class H3TestVerifyKernels:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": dict(_ROWS_INPUTS)}

    RETURN_TYPES = ()
    FUNCTION = "verify"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def verify(self, model, latent, conditioning):
        from h3director.dit.kernels import verify_kernels
        from h3director.integrations.comfy_dit import kernel_widths

        rows = _packed_rows(model, latent, conditioning)
        report = verify_kernels("cpu", _dtype_of(model), rows=rows,
                                widths=kernel_widths(model.model.diffusion_model), cache=True)
        return {"ui": {"text": [f"verified {sorted(report.verified)} failed {sorted(report.failed)} "
                                f"threads {report.key['threads']}", str(rows)]}}


class H3TestGuardReduce:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": dict(_ROWS_INPUTS)}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "guard"
    CATEGORY = "testing"

    def guard(self, model, latent, conditioning):
        from comfy.patcher_extension import WrappersMP

        from h3director.comfy.nodes_guard import GUARD_KEY, dit_shape_of, make_guard_wrapper
        from h3director.core.guard import MemoryGuard
        from h3director.dit.capacity import ledger_cost_model
        from h3director.dit.tiers import escalation_ladder
        from h3director.integrations.comfy_dit import installed_handle

        handle = installed_handle(model)
        rows = _packed_rows(model, latent, conditioning)
        dm = model.model.diffusion_model
        cost = ledger_cost_model(dit_shape_of(dm), "comfy", device="cpu")
        ladder = escalation_ladder(handle.heads, rows)
        floor, cheaper = handle.floor, ladder[ladder.index(handle.floor) + 1]
        dtype = _dtype_of(model)
        budget = (cost(floor, rows, dtype) + cost(cheaper, rows, dtype)) // 2
        guard = MemoryGuard(budget, device="cpu", action="reduce_batch", device_reader=lambda device: 0,
                            cache_clearer=lambda device: None, enabled=True)
        patched = model.clone()
        patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, GUARD_KEY, make_guard_wrapper(guard, cost))
        return (patched,)


NODE_CLASS_MAPPINGS = {"H3TestDiTConditioning": H3TestDiTConditioning, "H3TestDiTSaveLatent": H3TestDiTSaveLatent,
                       "H3TestDiTLoader": H3TestDiTLoader, "H3TestVerifyKernels": H3TestVerifyKernels,
                       "H3TestGuardReduce": H3TestGuardReduce}
