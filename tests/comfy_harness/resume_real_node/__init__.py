"""Test-only ComfyUI custom node folder for tests/test_comfy_real_resume.py: `H3TestResumeGate`.

`H3TestResumeGate` returns a clone of the MODEL with a `model_function_wrapper` that, when the server was
started with `H3_TEST_GATE_DIR` and `H3_TEST_GATE_STEP` in its environment, blocks forever in the model
call of that step (0-based, found in the run's `sample_sigmas`) after touching `<dir>/reached`: the test
then SIGKILLs the server at a known point. Without the variables it only passes the call through, so the
same workflow runs to the end on a server started without them. Copied into a temporary ComfyUI base
directory by the test; never installed with the pack.
"""


def _gate(apply_model, args):
    import os
    import time

    gate_dir, gate_step = os.environ.get("H3_TEST_GATE_DIR"), os.environ.get("H3_TEST_GATE_STEP")
    if gate_dir and gate_step:
        sigmas = args["c"]["transformer_options"]["sample_sigmas"]
        sigma = args["timestep"].flatten()[0].to(sigmas.device, sigmas.dtype)
        steps = (sigmas == sigma).nonzero().flatten().tolist()
        if steps and steps[0] == int(gate_step):
            with open(os.path.join(gate_dir, "reached"), "w") as marker:
                marker.write(str(os.getpid()))
            while True:  # the test kills this process here
                time.sleep(0.05)
    return apply_model(args["input"], args["timestep"], **args["c"])


class H3TestResumeGate:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "gate"
    CATEGORY = "testing"

    def gate(self, model):
        gated = model.clone()
        gated.set_model_unet_function_wrapper(_gate)
        return (gated,)


NODE_CLASS_MAPPINGS = {"H3TestResumeGate": H3TestResumeGate}
