"""Small media files for the upscale tests (PyAV): a video with an AAC soundtrack, its audio packets, its frames."""

from __future__ import annotations

import numpy as np


def video_with_audio(path, frames: np.ndarray, fps: int = 12, rate: int = 16000, crf: int = 18) -> None:
    """H.264 `frames` (uint8 [F, H, W, 3]) at `fps` with a mono AAC 440 Hz tone as long as the picture
    (`fixtures.synthetic_av.write_clip`)."""
    from fixtures.synthetic_av import write_clip

    t = np.arange(int(rate * len(frames) / fps), dtype=np.float32) / rate
    write_clip(path, frames, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), fps, rate, crf=crf)


def audio_payloads(path) -> list[bytes]:
    """The bytes of every non-empty packet of the first audio stream, in order."""
    import av

    with av.open(str(path)) as container:
        return [bytes(p) for p in container.demux(container.streams.audio[0]) if p.size]


def decode_rgb(path) -> np.ndarray:
    """Every frame of the first video stream as uint8 [F, H, W, 3]."""
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def yuv420_roundtrip(frames: np.ndarray) -> np.ndarray:
    """`frames` (uint8 [F, H, W, 3]) through FFmpeg's rgb24 -> yuv420p -> rgb24 conversion (what a lossless H.264
    file of them decodes to)."""
    import av

    out = []
    for pixels in frames:
        picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24").reformat(format="yuv420p")
        out.append(picture.to_ndarray(format="rgb24"))
    return np.stack(out)
