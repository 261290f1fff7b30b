"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: the DiT memory checks of tests/test_dit_comfy.py.

Why a separate process: the pack's other tests put stand-in `comfy` modules on sys.path
(tests/comfy_harness/stubs); the real ComfyUI cannot share a process with them.

Usage: python dit_worker.py COMFYUI_DIR  -> prints one JSON object {check name: {"ok": bool, "detail": str}}.

The model is ComfyUI's own `MiniMaxH3Model`, detected and built by `comfy.sd.load_diffusion_model_state_dict`
from a small random state dict in ComfyUI's key layout (2 blocks, 4 heads of 16, FFN 96), run on the CPU
with attention forced to PyTorch SDPA (`attention_pytorch`; the default sub-quadratic attention picks its
chunk sizes from free memory). The packed sequence has text, audio and video rows and two timesteps
(audio runs on its shifted schedule); one case adds a denoise mask so video rows carry per-token mod rows.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

CONFIG = dict(hidden_size=64, num_layers=2, token_refiner_num_layers=1, num_attention_heads=4, attention_head_dim=16,
              ffn_hidden_size=96, text_dim=48, timestep_input_dim=32, time_embed_hidden_size=64, time_embed_dim=32,
              rope_inv_freq_len=2)


class _Unavailable(types.ModuleType):
    """Stand-in for torchvision/torchaudio when absent: ComfyUI imports them at module level for models
    these checks never build (cosmos, cascade, LTX audio); any use raises."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} is not installed in this test environment")


class _UnavailableFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Unavailable(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def import_comfy(root: str):
    import importlib.util

    missing = [name for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name) is None]
    if missing:
        sys.meta_path.insert(0, _UnavailableFinder(missing))
    sys.path.insert(0, root)
    sys.argv = ["main.py", "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.ldm.minimax.model as h3
    from comfy.ldm.modules.attention import attention_pytorch

    h3.optimized_attention = attention_pytorch
    return h3


def tiny_state_dict(h3, seed: int = 0, **overrides):
    """Random weights in ComfyUI's key layout for `CONFIG` (with `overrides`, e.g. num_layers=4)."""
    import comfy.ops
    import torch

    model = h3.MiniMaxH3Model(**{**CONFIG, **overrides}, dtype=torch.float32, operations=comfy.ops.disable_weight_init)
    generator = torch.Generator().manual_seed(seed)
    sd = {k: 0.2 * torch.randn(v.shape, generator=generator) for k, v in model.state_dict().items()}
    sd["rope.inv_freq"] = 1.0 / (10000 ** (torch.arange(CONFIG["rope_inv_freq_len"], dtype=torch.float32) / 2))
    return sd


def load(sd, dtype):
    import comfy.sd

    patcher = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"dtype": dtype})
    assert patcher is not None, "ComfyUI did not detect the tiny state dict as a model"
    return patcher


def inputs(dtype, mask: bool = False):
    import torch

    generator = torch.Generator().manual_seed(1)
    video = torch.randn(1, 24, 3, 20, 18, generator=generator)
    audio = torch.randn(1, 32, 2, 9, generator=generator)
    context = torch.randn(1, 7, CONFIG["text_dim"], generator=generator).to(dtype)
    kwargs = {}
    if mask:
        levels = torch.tensor([0.25, 0.5, 1.0])
        m = levels[torch.randint(0, 3, (1, 1, 3, 20, 18), generator=generator)]
        kwargs["denoise_mask"] = m
    return [video, audio], torch.tensor([600.0]), context, kwargs


def forward(patcher, dtype, mask=False, extra_options=None):
    """One diffusion-model forward with the transformer_options the sampler would build for `patcher`
    (model_options clone + `prepare_model_patcher`, which merges the patcher's wrappers)."""
    import comfy.model_management
    import comfy.model_patcher
    import comfy.sampler_helpers
    import torch

    comfy.model_management.load_models_gpu([patcher])
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    comfy.sampler_helpers.prepare_model_patcher(patcher, {}, options)
    to = options["transformer_options"]
    to.update(extra_options or {})
    x, t, context, kwargs = inputs(dtype, mask)
    with torch.no_grad():
        return patcher.model.diffusion_model([v.clone() for v in x], t, context, transformer_options=to, **kwargs)


def lora_patches(state_dict, keys, seed: int) -> dict:
    """`ModelPatcher.add_patches` input: for each of `keys` (in order), one full-weight difference of
    0.05 x standard normal noise shaped like `state_dict[key]`, drawn from one generator seeded `seed`."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {k: (0.05 * torch.randn(state_dict[k].shape, generator=generator),) for k in keys}


def equal(a, b) -> bool:
    import torch

    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


PLANS = [dict(), dict(head_chunks=2), dict(head_chunks=4), dict(ffn_chunks=3), dict(ffn_chunks=7),
         dict(head_chunks=2, ffn_chunks=4), dict(head_chunks=2, query_chunks=3), dict(head_chunks=4, query_chunks=2,
                                                                                       ffn_chunks=5)]


def run_checks(root: str) -> dict:
    h3 = import_comfy(root)
    import comfy.model_patcher
    import comfy.ops
    import comfy.patcher_extension
    import comfy.sampler_helpers
    import torch
    from comfy.ldm.modules.attention import attention_pytorch
    from worker_checks import Checks

    from h3director.errors import InvalidInputError
    from h3director.integrations import comfy_dit

    checks = Checks()
    results, check = checks.results, checks.check

    sd = tiny_state_dict(h3)
    blocks = CONFIG["num_layers"]
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        base = load(sd, dtype)
        for mask in (False, True):
            reference = forward(base, dtype, mask)
            for plan in PLANS:
                def exact(plan=plan, mask=mask, reference=reference, base=base, dtype=dtype):
                    patched, handle = comfy_dit.install(base, **plan)
                    out = forward(patched, dtype, mask)
                    kinds = {comfy_dit.linear_kind(base.model.diffusion_model.blocks[0].mlp.fc1)[0]}
                    ok = equal(reference, out) and handle.block_calls == blocks and handle.last_report["forward"] == 1
                    return ok, {"calls": handle.block_calls, "report": handle.last_report, "kinds": sorted(kinds)}
                label = "-".join(f"{k}{v}" for k, v in plan.items()) or "lifetime"
                check(f"exact/{dtype_name}/{'mask' if mask else 'plain'}/{label}", exact)

    base = load(sd, torch.float32)
    reference = forward(base, torch.float32)

    def weight_paths():
        casts = load(sd, torch.bfloat16).model.diffusion_model.blocks[0].mlp.fc1
        plain = base.model.diffusion_model.blocks[0].mlp.fc1
        return (comfy_dit.linear_kind(plain)[0] == "plain" and comfy_dit.linear_kind(casts)[0] == "cast",
                (comfy_dit.linear_kind(plain), comfy_dit.linear_kind(casts)))
    check("weights/plain-and-cast-paths-both-covered", weight_paths)

    def lora():
        patched_base = base.clone()
        keys = ["diffusion_model.blocks.0.attn.qkv_proj.weight", "diffusion_model.blocks.1.mlp.fc1.weight"]
        added = patched_base.add_patches(lora_patches(base.model.state_dict(), keys, seed=5))
        stock = forward(patched_base, torch.float32)
        ours, handle = comfy_dit.install(patched_base, head_chunks=2, ffn_chunks=3)
        out = forward(ours, torch.float32)
        forward(base, torch.float32)  # unpatches the weights again
        return (len(added) == 2 and not equal(stock, reference) and equal(stock, out) and handle.block_calls == blocks,
                f"patched keys {added}; lora changes output: {not equal(stock, reference)}")
    check("lora/add_patches-applies-through-tier", lora)

    def lora_lowvram():
        # patches applied on the fly (lowvram: weight_function on the modules) go through cast_bias_weight
        patched_base = base.clone()
        keys = ["diffusion_model.blocks.0.attn.qkv_proj.weight", "diffusion_model.blocks.0.mlp.fc2.weight"]
        patched_base.add_patches(lora_patches(base.model.state_dict(), keys, seed=6))
        ours, handle = comfy_dit.install(patched_base, head_chunks=2, ffn_chunks=3)
        stock_out = forward(patched_base, torch.float32)
        model = ours.model
        ours.unpatch_model()
        ours.patch_model(lowvram_model_memory=1, load_weights=True)
        fc2 = model.diffusion_model.blocks[0].mlp.fc2
        on_the_fly = bool(fc2.weight_function) and comfy_dit.linear_kind(fc2)[0] == "cast"
        options = comfy.model_patcher.create_model_options_clone(ours.model_options)
        comfy.sampler_helpers.prepare_model_patcher(ours, {}, options)
        x, t, context, kwargs = inputs(torch.float32)
        with torch.no_grad():
            out = model.diffusion_model(x, t, context, transformer_options=options["transformer_options"])
        ours.unpatch_model()
        return on_the_fly and equal(stock_out, out), f"fc2 patched on the fly through cast_bias_weight: {on_the_fly}"
    check("lora/lowvram-weight-function-applies", lora_lowvram)

    def override():
        calls = {"n": 0}

        def counting(func, *args, **kwargs):
            calls["n"] += 1
            return func(*args, **kwargs)
        ours, _ = comfy_dit.install(base, head_chunks=2, query_chunks=3)
        out = forward(ours, torch.float32, extra_options={"optimized_attention_override": counting})
        expected = blocks * 2 * 3 + CONFIG["token_refiner_num_layers"]  # the refiner's stock attention too
        return equal(reference, out) and calls["n"] == expected, f"override calls {calls['n']}, expected {expected}"
    check("attention/override-still-acts", override)

    def containers():
        taken = {"n": 0}

        def consumer(func, *args, **kwargs):
            raise AssertionError("a container consumer must be called through container_function")

        def container_function(q, k, v, *args, **kwargs):
            taken["n"] += 1
            assert isinstance(q, h3.AttentionTensorContainer)
            kwargs = {k: v for k, v in kwargs.items() if k not in ("_inside_attn_wrapper", "transformer_options")}
            return attention_pytorch.__wrapped__(q.take(), k.take(), v.take(), *args, **kwargs)
        consumer.container_function = container_function
        results_ok = []
        for plan in (dict(), dict(head_chunks=2, ffn_chunks=2)):
            ours, _ = comfy_dit.install(base, **plan)
            out = forward(ours, torch.float32, extra_options={"optimized_attention_override": consumer})
            results_ok.append(equal(reference, out))
        refiner = CONFIG["token_refiner_num_layers"]
        expected = (blocks * 1 + refiner) + (blocks * 2 + refiner)
        return all(results_ok) and taken["n"] == expected, f"{results_ok}, container calls {taken['n']} of {expected}"
    check("attention/container-consumer-gets-containers", containers)

    def stock_kept_ops():
        # fp8_ops.Linear overrides the cast forward (fp8 matmul when weights are fp8): never sliced
        import comfy.sd
        patcher = comfy.sd.load_diffusion_model_state_dict(
            dict(sd), model_options={"dtype": torch.float32, "custom_operations": comfy.ops.fp8_ops})
        stock = forward(patcher, torch.float32)
        ours, handle = comfy_dit.install(patcher, head_chunks=2, ffn_chunks=3)
        out = forward(ours, torch.float32)
        kept = handle.last_report["kept_stock"]
        return (equal(stock, out) and any("qkv_proj" in k for k in kept) and any("mlp.fc1" in k for k in kept),
                kept)
    check("quantised/unsliceable-ops-kept-stock-and-reported", stock_kept_ops)

    def options_snapshot(p):
        to = p.model_options.get("transformer_options", {})
        return (repr(sorted(to.get("patches_replace", {}).get("dit", {}))), repr(p.wrappers), repr(p.object_patches))

    def conflicts():
        # other packs' patches are not refused: found at install and stepped aside for at each forward
        # (tests/test_dit_comfy_foreign.py runs them); the input MODEL is not changed
        foreign = base.clone()
        foreign.set_model_patch_replace(lambda args, extra: extra["original_block"](args), "dit", "double_block", 1)
        before = options_snapshot(foreign)
        _, replaced = comfy_dit.install(foreign, head_chunks=2)
        objects = base.clone()
        objects.add_object_patch("diffusion_model.blocks.0", torch.nn.Identity())
        _, patched = comfy_dit.install(objects)
        found = [(p.block, p.part, p.target) for p in replaced.foreign_at_install + patched.foreign_at_install]
        ok = (found == [(1, "block", "patches_replace['dit'][('double_block', 1)]"), (0, "block", "blocks.0")]
              and options_snapshot(foreign) == before)
        return ok, found
    check("install/foreign-patches-found-not-refused", conflicts)

    def ours_twice():
        ours, first = comfy_dit.install(base, head_chunks=2)
        again, second = comfy_dit.install(ours, ffn_chunks=3)
        out = forward(again, torch.float32)
        wrappers = again.get_wrappers(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, comfy_dit.WRAPPER_KEY)
        return (equal(reference, out) and len(wrappers) == 1 and second.block_calls == blocks
                and first.block_calls == 0, f"wrappers {len(wrappers)}")
    check("install/reinstall-replaces-own-patches", ours_twice)

    def bad_inputs():
        before = options_snapshot(base)
        cases = {"head_chunks=3": dict(head_chunks=3), "mode": dict(mode="fast"), "budget": dict(budget_bytes=0),
                 "ffn_chunks=0": dict(ffn_chunks=0), "capacity": dict(mode="auto", capacity=object()),
                 "capacity and budget": dict(mode="auto", capacity=types.SimpleNamespace(choose=print),
                                             budget_bytes=1 << 30)}
        messages = {}
        for name, kwargs in cases.items():
            try:
                comfy_dit.install(base, **kwargs)
                messages[name] = None
            except InvalidInputError as error:
                messages[name] = str(error)
        other = comfy.model_patcher.ModelPatcher(torch.nn.Linear(2, 2), torch.device("cpu"), torch.device("cpu"))
        try:
            comfy_dit.install(other)
            messages["other model"] = None
        except InvalidInputError as error:
            messages["other model"] = str(error)
        too_many, _ = comfy_dit.install(base, ffn_chunks=100000)
        try:
            forward(too_many, torch.float32)
            messages["ffn rows"] = None
        except InvalidInputError as error:
            messages["ffn rows"] = str(error)
        ok = (all(messages.values()) and "[1, 2, 4]" in messages["head_chunks=3"]
              and "torch.nn.modules.linear.Linear" in messages["other model"]
              and "exceeds the" in messages["ffn rows"] and options_snapshot(base) == before)
        return ok, messages
    check("refuse/bad-input", bad_inputs)

    def untouched():
        before = options_snapshot(base)
        ours, handle = comfy_dit.install(base, head_chunks=2, ffn_chunks=2)
        after = options_snapshot(base)
        plain = forward(base, torch.float32)
        copy = ours.clone()
        out = forward(copy, torch.float32)
        return (before == after and equal(reference, plain) and handle.block_calls == blocks
                and equal(reference, out) and comfy_dit.installed_handle(base) is None
                and comfy_dit.installed_handle(copy) is handle), (before, after)
    check("install/original-untouched-clone-keeps-tier", untouched)

    def node():
        from h3director.comfy.nodes_dit import DiTMemoryNode

        schema = DiTMemoryNode.GET_SCHEMA()
        output = DiTMemoryNode.execute(base, "fixed", 2, 3, 0.0)
        patched = output.result[0]
        handle = comfy_dit.installed_handle(patched)
        out = forward(patched, torch.float32)
        text = output.ui["text"][0]
        refused = unverified = None
        try:
            DiTMemoryNode.execute(base, "auto", 3, 1, 0.0)
        except InvalidInputError as error:
            refused = str(error)
        # the test runs with an empty kernel cache (H3_KERNEL_CACHE): nothing is verified, so "exact only"
        # keeps the stock op for the head groups and says so
        unverified_output = DiTMemoryNode.execute(base, "exact only", 2, 1, 0.0)
        unverified_handle = comfy_dit.installed_handle(unverified_output.result[0])
        unverified_out = forward(unverified_output.result[0], torch.float32)
        unverified = "; ".join(unverified_handle.last_report["kept_stock_unverified"])
        exact_only = DiTMemoryNode.execute(base, "exact only", 1, 1, 0.0).result[0]
        ok = (schema.node_id == "H3DirectorDiTMemory" and schema.display_name == "H3Director DiT Memory"
              and equal(reference, out) and handle.last_report["tier"] == "2 head groups, 3 FFN row chunks"
              and "2 head groups, 3 FFN row chunks" in text and refused and "head_chunks=3" in refused
              and handle.last_report["need_bytes"] > 0 and handle.last_report["have_bytes"] > 0
              and handle.last_report["reclaimable_bytes"] == 0  # not a Dynamic VRAM patcher on the CPU
              and "head groups (2) not verified for this shape" in unverified
              and unverified_handle.last_report["tier"] == "lifetime frees only"
              and unverified_handle.last_report["exactness_detail"].startswith("exact (by construction")
              and equal(reference, unverified_out)
              and handle.last_report["exactness_detail"].startswith("unverified: ")
              and equal(reference, forward(exact_only, torch.float32))
              and comfy_dit.installed_handle(base) is None)
        return ok, {"text": text, "refused": refused, "unverified": unverified, "report": handle.last_report}
    check("node/installs-reports-and-refuses", node)

    def node_path():
        # one node execution, followed call by call: each module the node calls into is entered once (the
        # adapter installs, the handle reports), and nothing calls back into the adapter
        from h3director.comfy import nodes_dit

        entries = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_back is not None:
                callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
                if callee != caller and callee.startswith("h3director.") and caller.startswith("h3director."):
                    entries.append((caller, callee))
        sys.setprofile(profile)
        try:
            nodes_dit.DiTMemoryNode.execute(base, "auto", 2, 3, 0.0)
        finally:
            sys.setprofile(None)
        from_node = [callee for caller, callee in entries if caller == nodes_dit.__name__]
        into_adapter = [caller for caller, callee in entries if callee == comfy_dit.__name__]
        ok = (sorted(from_node) == ["h3director.dit.memory", comfy_dit.__name__]
              and into_adapter == [nodes_dit.__name__])
        return ok, {"from the node": from_node, "into the adapter from": into_adapter}
    check("node/visits-each-module-once", node_path)

    def capacity():
        # the real CapacityCheck and planner ledger; the device side is a fixed sample so "have" is known
        from h3director.core.devices import DeviceSample
        from h3director.dit.capacity import CapacityCheck, ledger_cost_model
        from h3director.dit.tiers import LIFETIME_ONLY, DiTMemoryPlan
        from h3director.errors import BudgetError

        dm = base.model.diffusion_model
        x, _, context, _ = inputs(torch.float32)
        rows = comfy_dit.packed_rows(dm, x, context, None)
        cost = ledger_cost_model(comfy_shape(dm), framework="comfy", attention="flash", device="cpu")

        def check_with(free):
            sample = DeviceSample("cpu", "cpu", 0, None, None, free, free, 0.0)
            return CapacityCheck(cost, "cpu", reader=lambda device: sample)
        probe = check_with(1)
        need_floor = probe.need_bytes(LIFETIME_ONLY, rows, torch.float32)
        need_ffn2 = probe.need_bytes(DiTMemoryPlan(ffn_chunks=2), rows, torch.float32)
        auto, handle = comfy_dit.install(base, mode="auto", capacity=check_with(need_ffn2))
        out = forward(auto, torch.float32)
        report = dict(handle.last_report)
        messages = []
        for mode in ("auto", "fixed"):
            refusing, _ = comfy_dit.install(base, mode=mode, capacity=check_with(1))
            try:
                forward(refusing, torch.float32)
            except BudgetError as error:
                messages.append(str(error))
        ok = (need_ffn2 < need_floor and equal(reference, out) and report["escalated"]
              and report["tier"] == "2 FFN row chunks" and report["need_bytes"] == need_ffn2
              and len(messages) == 2 and all(m.startswith("[Director Safety] CPU memory limit exceeded")
                                             for m in messages))
        return ok, {"report": report, "needs": (need_floor, need_ffn2), "messages": messages}
    from h3director.integrations.comfy_dit import comfy_shape
    check("capacity/auto-escalates-and-refuses", capacity)

    def released_on_error():
        # every offloadable cast run_block makes is uncast even when a projection or a cast raises (an OOM,
        # simulated: the real op raises when called from comfy_dit for the named weight)
        casting = load(sd, torch.bfloat16)
        real_cast, real_uncast, real_linear = comfy.ops.cast_bias_weight, comfy.ops.uncast_bias_weight, F.linear
        counts, fail = {}, {}

        def ours() -> bool:  # called from comfy_dit (the frame above the wrapper's caller)
            return sys._getframe(2).f_globals.get("__name__") == comfy_dit.__name__

        def cast(layer, *args, **kwargs):
            if fail.get("cast") is layer and ours():
                fail.clear()
                raise RuntimeError("simulated out of memory in a cast")
            result = real_cast(layer, *args, **kwargs)
            counts["cast"] += bool(kwargs.get("offloadable"))
            return result

        def uncast(*args, **kwargs):
            counts["uncast"] += 1
            return real_uncast(*args, **kwargs)

        def linear(x, weight, bias=None):
            if fail.get("linear") == sys._getframe(1).f_code.co_name and ours():
                fail.clear()
                raise RuntimeError("simulated out of memory in a projection")
            return real_linear(x, weight, bias)
        fc2 = casting.model.diffusion_model.blocks[0].mlp.fc2
        # the F.linear to fail, by the comfy_dit function that calls it
        cases = {"fused qkv": (dict(), {"linear": "_attention"}), "head group": (dict(head_chunks=2), {"linear": "<genexpr>"}),
                 "ffn chunk": (dict(ffn_chunks=2), {"linear": "apply"}), "fc2 cast": (dict(ffn_chunks=2), {"cast": fc2})}
        seen = {}
        comfy.ops.cast_bias_weight, comfy.ops.uncast_bias_weight, F.linear = cast, uncast, linear
        try:
            for name, (plan, failure) in cases.items():
                patched, _ = comfy_dit.install(casting, **plan)
                counts.update(cast=0, uncast=0)
                fail.clear()
                fail.update(failure)
                try:
                    forward(patched, torch.bfloat16)
                    raised = False
                except RuntimeError as error:
                    raised = "simulated" in str(error)
                seen[name] = {"raised": raised, **counts}
        finally:
            comfy.ops.cast_bias_weight, comfy.ops.uncast_bias_weight, F.linear = real_cast, real_uncast, real_linear
        ok = all(s["raised"] and s["cast"] > 0 and s["cast"] == s["uncast"] for s in seen.values())
        return ok, seen
    import torch.nn.functional as F
    check("weights/released-when-a-projection-raises", released_on_error)
    return results


if __name__ == "__main__":
    from worker_checks import emit

    emit("H3DIT-RESULTS", run_checks(sys.argv[1]))
