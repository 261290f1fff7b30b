"""Runs INSIDE a fresh Python with a real ComfyUI and diffusers: the cross-framework check of
tests/test_gguf_diffusers.py. One GGUF file (tests/gguf_helpers.CONFIG, Q8_0), loaded by ComfyUI's
`MiniMaxH3Model` (h3director.integrations.comfy_gguf) and by diffusers' `MiniMaxH3Transformer3DModel`
(h3director.integrations.diffusers_gguf), run on the same packed t2va layout (ComfyUI's `PackedLayout`
turned into diffusers' index arguments) in float32.

Usage: python gguf_diffusers_worker.py COMFYUI_DIR TMPDIR -> "H3GGUFX-RESULTS {case: {max_abs, max_ref, ...}}".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import dit_worker  # noqa: E402
import gguf_helpers as gh  # noqa: E402

dit_worker.CONFIG = gh.CONFIG


def diffusers_inputs(h3, x, timestep, context, shift_v=12.0, shift_a=3.0):
    """ComfyUI's t2va packed layout for `x = [video, audio]` as diffusers' forward arguments."""
    import torch

    video, audio = x
    layout = h3.PackedLayout(context.shape[1], video.shape[2], video.shape[3], video.shape[4], audio.shape[-1])
    sigma = float(timestep.flatten()[0]) / 1000.0
    t_v = float(1.0 - torch.tensor(sigma, dtype=torch.float32))
    t_a = float(1.0 - h3.time_shift_sigma(torch.tensor(sigma, dtype=torch.float32), shift_v, shift_a))
    unique = sorted({t_v, t_a})
    seg_t = {"text": t_v, "audio": t_a, "video": t_v}
    tags = {"text": 1, "audio": 2, "video": 0}
    ts_idx, tag_idx, index = [], [], {}
    for a, b, kind in layout.segments:
        ts_idx.append(torch.full((b - a,), unique.index(seg_t[kind]), dtype=torch.long))
        tag_idx.append(torch.full((b - a,), tags[kind], dtype=torch.long))
        index[kind] = torch.arange(a, b)
    return dict(hidden_states=h3.patchify_video(video.to(torch.float32))[None],
                audio_hidden_states=h3.pack_audio(audio.to(torch.float32))[None],
                encoder_hidden_states=context, timestep=torch.tensor(unique, dtype=torch.float32),
                timestep_indices=torch.cat(ts_idx), token_tags=torch.cat(tag_idx),
                position_ids=layout.position_ids, video_indices=index["video"], audio_indices=index["audio"],
                text_indices=index["text"], return_dict=False)


def run(root: str, tmp: str) -> dict:
    # diffusers first: its optional-dependency checks must not see the worker's torchvision stand-in
    import diffusers.loaders.single_file_model  # noqa: F401
    from diffusers import GGUFQuantizationConfig, MiniMaxH3Transformer3DModel  # noqa: F401

    h3 = dit_worker.import_comfy(root)
    import gguf
    import torch

    from h3director.integrations import comfy_gguf, diffusers_gguf

    out = {}
    cases = (("unpruned", False, torch.float32), ("curve-form", True, torch.float32),
             ("curve-form-bf16", True, torch.bfloat16))
    for label, curve, dtype in cases:
        sd = gh.comfy_state_dict(h3, seed=7, curve=curve)
        path = os.path.join(tmp, f"x-{label}.gguf")
        gh.write_gguf(path, sd, gguf.GGMLQuantizationType.Q8_0)
        comfy_model = comfy_gguf.load_gguf_dit(path, dtype=dtype)
        comfy_out = dit_worker.forward(comfy_model, dtype)
        model = diffusers_gguf.load_h3_transformer_gguf(path, torch_dtype=dtype)
        x, t, context, _ = dit_worker.inputs(dtype)
        with torch.no_grad():
            video, audio = model(**diffusers_inputs(h3, x, t, context))
        expected_video = h3.patchify_video(-comfy_out[0].to(torch.float32))[None]
        expected_audio = h3.pack_audio(-comfy_out[1].to(torch.float32))[None]
        video, audio = video.to(torch.float32), audio.to(torch.float32)
        diff = max(float((video - expected_video).abs().max()), float((audio - expected_audio).abs().max()))
        ref = max(float(expected_video.abs().max()), float(expected_audio.abs().max()))
        control = None
        if curve and dtype == torch.float32:  # a near miss: the nearest lower table row instead of the lerp must be far outside the bound
            table = model.time_embedder.adaln_t_table

            def floor_rows(t, table=table):
                pos = t.to(torch.float32).clamp(0.0, 1.0) * (table.shape[0] - 1)
                return table[pos.floor().long().clamp(max=table.shape[0] - 2)]
            model.time_embedder.forward = floor_rows
            with torch.no_grad():
                near, _ = model(**diffusers_inputs(h3, x, t, context))
            control = float((near - expected_video).abs().max())
        out[label] = {"control_max_abs": control, "max_abs": diff, "max_ref": ref, "shapes": [list(video.shape), list(expected_video.shape)],
                      "curve": getattr(model, "adaln_curve_grid", None),
                      "allclose": bool(torch.allclose(video, expected_video, rtol=1e-5, atol=1e-5)
                                       and torch.allclose(audio, expected_audio, rtol=1e-5, atol=1e-5))}
    return out


if __name__ == "__main__":
    print("H3GGUFX-RESULTS " + json.dumps(run(sys.argv[1], sys.argv[2])))
