"""The one source of truth for MiniMax H3's frame grid and token counts.

Conventions (from diffusers' `AutoencoderKLMiniMaxH3` and ComfyUI's `MiniMaxH3VideoVAE`):

- The video VAE compresses space by 16 and time by 4. It encodes pixel video in clips of
  `clip_length` = 17 frames and drops `token_drop` = 3 trailing latent frames, so
  17n+5 pixel frames <-> 5n+2 latent frames ("on the grid").
- The decoder decodes clips of `tokens_chunk_size` = 5 latent frames plus `token_overlap` = 2
  following ones; each clip's first `frame_pre_padding` = 3 decoded frames are discarded and
  consecutive clips are cross-faded linearly over `frame_overlap` = 5 pixel frames.
- The DiT patchifies latents 2x2, so a latent frame of an HxW video is (H/32)*(W/32) tokens
  (1008 at 1344x768).
- Audio: 32 kHz, hop 800 -> 40 latent frames per second; video runs at 24 fps.

All counts are plain ints; sizes are in pixels unless the name says `latent`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from h3director.errors import InvalidInputError

SPATIAL_RATIO = 16          # VAE downsampling in height and width
TEMPORAL_RATIO = 4          # VAE downsampling in time
PATCH_SIZE = 2              # DiT spatial patch size on the latent grid
TOKEN_STRIDE = SPATIAL_RATIO * PATCH_SIZE   # 32 pixels per DiT token side
CLIP_LENGTH = 17            # pixel frames per encoder clip
TOKEN_DROP = 3              # trailing latent frames dropped per encoded clip
VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
AUDIO_SAMPLE_RATE = 32_000
AUDIO_HOP = 800
AUDIO_LATENTS_PER_SECOND = AUDIO_SAMPLE_RATE // AUDIO_HOP   # 40
VIDEO_FPS = 24


@dataclass(frozen=True)
class TemporalGeometry:
    """Temporal chunking of a video VAE, derived exactly as diffusers derives it.

    `clip_length` pixel frames per encoder clip, `temporal_ratio` pixel frames per latent frame,
    `token_drop` latent frames dropped per encoded clip.
    """

    clip_length: int = CLIP_LENGTH
    temporal_ratio: int = TEMPORAL_RATIO
    token_drop: int = TOKEN_DROP

    @property
    def frame_pre_padding(self) -> int:
        """Decoded frames discarded at the start of every clip (3 for H3)."""
        return (-self.clip_length) % self.temporal_ratio

    @property
    def tokens_chunk_size(self) -> int:
        """Latent frames that one decoded clip contributes (5 for H3)."""
        return math.ceil(self.clip_length / self.temporal_ratio)

    @property
    def token_overlap(self) -> int:
        """Extra latent frames decoded after each chunk to produce the cross-fade tail (2 for H3)."""
        return (-self.token_drop) % self.tokens_chunk_size

    @property
    def frame_overlap(self) -> int:
        """Pixel frames over which consecutive clips are cross-faded (5 for H3)."""
        return max(self.token_overlap * self.temporal_ratio - self.frame_pre_padding, 0)

    def latent_frames_for(self, frames: int) -> int:
        """Latent frames the encoder produces for `frames` pixel frames (17n+5 -> 5n+2)."""
        if frames < 1:
            raise InvalidInputError(f"frame count must be >= 1, got {frames}")
        if frames == 1:
            return 1
        clips = math.ceil(frames / self.clip_length)
        return clips * self.tokens_chunk_size - self.token_drop

    def frames_for_latents(self, latent_frames: int) -> int:
        """Pixel frames the reference decoder returns for `latent_frames` latent frames.

        Follows diffusers' `_decode` for every length >= 3 (on and off the 5n+2 grid). For 1 and 2
        latent frames diffusers raises; ComfyUI pads one extra clip, and so do we: see
        `reference_clip_count`.
        """
        if latent_frames < 1:
            raise InvalidInputError(f"latent frame count must be >= 1, got {latent_frames}")
        num_tokens = latent_frames + self.token_drop
        pad_tokens = (-num_tokens) % self.tokens_chunk_size
        chunks = self.reference_clip_count(latent_frames)
        full = chunks * (self.clip_length) + (self.frame_overlap if self.token_drop > 0 else 0)
        return full - self.pad_frames(latent_frames, pad_tokens)

    def reference_clip_count(self, latent_frames: int) -> int:
        """Decoder clips for `latent_frames`; at least one (ComfyUI's rule for 1-2 latent frames)."""
        num_tokens = latent_frames + self.token_drop
        pad_tokens = (-num_tokens) % self.tokens_chunk_size
        chunks = (num_tokens + pad_tokens) // self.tokens_chunk_size - int(self.token_drop > 0)
        return max(chunks, 1)

    def pad_frames(self, latent_frames: int, pad_tokens: int) -> int:
        """Trailing pixel frames produced by `pad_tokens` repeated latent frames (cut after decode)."""
        intra_tail = self.clip_length % self.temporal_ratio
        return sum(
            intra_tail if intra_tail and (latent_frames + k) % self.tokens_chunk_size == 0 else self.temporal_ratio
            for k in range(pad_tokens)
        )


H3_TEMPORAL = TemporalGeometry()


def is_on_grid(frames: int) -> bool:
    """True when `frames` is 17n+5 for some n >= 0 (the frame counts H3 was trained on)."""
    return frames >= 5 and (frames - 5) % CLIP_LENGTH == 0


def nearest_grid_frames(frames: int) -> tuple[int, int]:
    """The legal 17n+5 frame counts just below and just above `frames` (equal when on the grid)."""
    if frames <= 5:
        return 5, 5
    n_low = (frames - 5) // CLIP_LENGTH
    low = CLIP_LENGTH * n_low + 5
    high = low if low == frames else low + CLIP_LENGTH
    return low, high


def latent_frames_for(frames: int) -> int:
    """Latent frames for `frames` pixel frames with H3's VAE: 124 -> 37, 17n+5 -> 5n+2."""
    return H3_TEMPORAL.latent_frames_for(frames)


def frames_for_latents(latent_frames: int) -> int:
    """Pixel frames H3's decoder returns for `latent_frames`: 5n+2 -> 17n+5."""
    return H3_TEMPORAL.frames_for_latents(latent_frames)


def check_canvas(width: int, height: int) -> None:
    """Refuse a canvas the DiT cannot tokenize: each side must be a positive multiple of 32."""
    problems = []
    for name, value in (("width", width), ("height", height)):
        if value <= 0 or value % TOKEN_STRIDE:
            low = max(TOKEN_STRIDE, value // TOKEN_STRIDE * TOKEN_STRIDE)
            problems.append(f"{name} {value} is not a positive multiple of {TOKEN_STRIDE} (nearest: {low} or {low + TOKEN_STRIDE})")
    if problems:
        raise InvalidInputError("; ".join(problems))


def tokens_per_latent_frame(width: int, height: int) -> int:
    """DiT tokens per latent frame: (H/32) * (W/32); 1008 at 1344x768."""
    check_canvas(width, height)
    return (width // TOKEN_STRIDE) * (height // TOKEN_STRIDE)


def video_tokens(width: int, height: int, frames: int) -> int:
    """DiT video tokens for a clip: latent frames x tokens per latent frame (37 x 1008 at 124 frames, 1344x768)."""
    return latent_frames_for(frames) * tokens_per_latent_frame(width, height)


def audio_latent_frames_for(frames: int, fps: int = VIDEO_FPS) -> int:
    """Audio latent frames covering `frames` video frames: 5 audio latents per 3 video frames at 24 fps."""
    return math.ceil(frames * AUDIO_LATENTS_PER_SECOND / fps)


def audio_samples_for(audio_latent_frames: int) -> int:
    """Audio samples (per channel) decoded from `audio_latent_frames` latent frames (hop 800)."""
    return audio_latent_frames * AUDIO_HOP
