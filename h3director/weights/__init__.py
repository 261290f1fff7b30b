"""Weight files: validated GGUF reading, dequantisation dispatch, H3 key recognition.

At the height of `core/`: imports native, core's leaf helpers, errors and units only; never the planner,
diffusers or ComfyUI. `gguf_file.open_gguf` maps a validated GGUF, `dequant.dequantize_tensor` decodes one
tensor (native core on the CPU, torch kernels on other devices), `h3_keys.detect_h3` recognises H3 DiT keys.
"""

__all__: list[str] = []
