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
    def clip_latent_frames(self) -> int:
        """Latent frames one decoder call sees: `tokens_chunk_size + token_overlap` (7 for H3)."""
        return self.tokens_chunk_size + self.token_overlap

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

        Follows diffusers' `_decode` for every length >= 3 (on and off the 5n+2 grid) and ComfyUI's
        `MiniMaxH3VideoVAE.decode` for the shortest ones (1 -> 1 frame, 2 -> 5 frames), where
        diffusers raises: see `decode_schedule`.
        """
        return self.decode_schedule(latent_frames).frames

    def reference_clip_count(self, latent_frames: int) -> int:
        """Decoder clips for `latent_frames`; at least one (ComfyUI's rule for 1-2 latent frames)."""
        return len(self.decode_schedule(latent_frames).clips)

    def pad_frames(self, latent_frames: int, pad_tokens: int) -> int:
        """Trailing pixel frames produced by `pad_tokens` copies of the last latent frame (cut after decode).

        `latent_frames` is the length before padding. A chunk's last latent frame covers only
        `clip_length % temporal_ratio` pixel frames, every other one `temporal_ratio`.
        """
        intra_tail = self.clip_length % self.temporal_ratio
        return sum(
            intra_tail if intra_tail and (latent_frames + k) % self.tokens_chunk_size == 0 else self.temporal_ratio
            for k in range(pad_tokens)
        )

    def padding_tokens(self, latent_frames: int) -> tuple[int, int]:
        """`(pad_tokens, clip_count)` for `latent_frames` >= 2, the references' temporal chunking.

        diffusers and ComfyUI agree for >= 3 latent frames. Below one clip's worth (2 latent frames)
        diffusers decodes no clip at all and fails; ComfyUI pads one more chunk of copies of the last
        latent frame (`_decode_temporal_chunks`), which is the rule followed here.
        """
        num_tokens = latent_frames + self.token_drop
        pad_tokens = (-num_tokens) % self.tokens_chunk_size
        clips = (num_tokens + pad_tokens) // self.tokens_chunk_size - int(self.token_drop > 0)
        if clips < 1:
            pad_tokens += self.tokens_chunk_size
            clips += 1
        return pad_tokens, clips

    def decode_schedule(self, latent_frames: int) -> DecodeSchedule:
        """The clip-by-clip decode plan for `latent_frames` latent frames (see `DecodeSchedule`).

        Reproduces the references step for step. For >= 2 latent frames: append `pad_tokens` copies
        of the last latent frame; clip i decodes padded latents
        ``[i * tokens_chunk_size, i * tokens_chunk_size + tokens_chunk_size + token_overlap)``; of its
        decoded frames, ``[frame_pre_padding, chunk)`` is the body (chunk = tokens_chunk_size *
        temporal_ratio) and ``[chunk + frame_pre_padding, 2 * chunk)`` the tail; each body after the
        first is cross-faded with the previous clip's tail over `frame_overlap` frames; the last
        clip's tail follows the last body; the trailing frames made by the padding are cut.
        For 1 latent frame (ComfyUI's `decode` special case): decode it alone and keep only the last
        decoded frame.
        """
        if latent_frames < 1:
            raise InvalidInputError(f"latent frame count must be >= 1, got {latent_frames}")
        if latent_frames == 1:
            clip = ClipStep(index=0, latent_start=0, latent_stop=1, body_start=self.temporal_ratio - 1,
                            body_stop=self.temporal_ratio, tail_start=0, tail_stop=0, blend_frames=0, out_start=0)
            return DecodeSchedule(latent_frames=1, pad_tokens=0, clips=(clip,), frames=1, frame_overlap=0)

        pad_tokens, clip_count = self.padding_tokens(latent_frames)
        padded = latent_frames + pad_tokens
        chunk = self.tokens_chunk_size * self.temporal_ratio
        has_tail = self.token_drop > 0
        clips = []
        out_start = 0
        previous_tail = 0
        for index in range(clip_count):
            latent_start = index * self.tokens_chunk_size
            latent_stop = min(latent_start + self.tokens_chunk_size + self.token_overlap, padded)
            decoded = max(latent_stop - latent_start, 0) * self.temporal_ratio
            body_start = min(self.frame_pre_padding, min(chunk, decoded))
            body_stop = min(chunk, decoded)
            tail_start = tail_stop = 0
            if has_tail:
                tail_stop = min(2 * chunk, decoded)
                tail_start = min(chunk + self.frame_pre_padding, max(tail_stop, chunk))
                tail_stop = max(tail_stop, tail_start)
            body = body_stop - body_start
            blend = min(previous_tail, body, self.frame_overlap) if index > 0 and has_tail else 0
            clips.append(ClipStep(index=index, latent_start=latent_start, latent_stop=latent_stop,
                                  body_start=body_start, body_stop=body_stop, tail_start=tail_start,
                                  tail_stop=tail_stop, blend_frames=blend, out_start=out_start))
            out_start += body
            previous_tail = tail_stop - tail_start
        raw_frames = out_start + (previous_tail if has_tail else 0)
        frames = raw_frames - self.pad_frames(latent_frames, pad_tokens)
        return DecodeSchedule(latent_frames=latent_frames, pad_tokens=pad_tokens, clips=tuple(clips),
                              frames=frames, frame_overlap=self.frame_overlap if has_tail else 0)


@dataclass(frozen=True)
class ClipStep:
    """One decoder call of a temporal decode schedule. Frame indices are half-open ranges.

    `latent_start:latent_stop` index the PADDED latent sequence (`DecodeSchedule.pad_tokens` copies
    of the last latent frame appended). The decoder returns `(latent_stop - latent_start) *
    temporal_ratio` frames for the clip; of those, `body_start:body_stop` become output frames
    starting at `out_start` (the first `blend_frames` of them cross-faded with the previous clip's
    tail), and `tail_start:tail_stop` are kept for the next clip's cross-fade (or appended after the
    last body). Invariant: once this clip is decoded, output frames `[out_start, out_start + body)`
    are final.
    """

    index: int
    latent_start: int
    latent_stop: int
    body_start: int
    body_stop: int
    tail_start: int
    tail_stop: int
    blend_frames: int
    out_start: int

    @property
    def latent_length(self) -> int:
        """Latent frames this clip decodes."""
        return self.latent_stop - self.latent_start

    @property
    def body_length(self) -> int:
        """Output frames this clip's body contributes."""
        return self.body_stop - self.body_start

    @property
    def tail_length(self) -> int:
        """Frames kept for the cross-fade with the next clip (0 when the decoder has no overlap)."""
        return self.tail_stop - self.tail_start

    @property
    def out_stop(self) -> int:
        """One past the last output frame of this clip's body (before the final trim)."""
        return self.out_start + self.body_length


@dataclass(frozen=True)
class DecodeSchedule:
    """The whole temporal decode plan of a latent video: what each clip decodes and what becomes final.

    `frames` is the output length after the padding frames are cut; `frame_overlap` the nominal
    cross-fade length (the actual one per clip is `ClipStep.blend_frames`, as the reference's
    `min(tail, body, frame_overlap)`). `stateful`: clips must be decoded in order from the first
    (a causal decoder's cache); otherwise each clip depends on its own latents only.
    """

    latent_frames: int
    pad_tokens: int
    clips: tuple[ClipStep, ...]
    frames: int
    frame_overlap: int
    stateful: bool = False

    @property
    def padded_latent_frames(self) -> int:
        """Latent frames after appending the `pad_tokens` copies of the last one."""
        return self.latent_frames + self.pad_tokens

    def final_range(self, clip: ClipStep) -> tuple[int, int]:
        """Output frames `[start, stop)` that become final when `clip` is decoded (clipped to `frames`).

        The body of every clip; for the last clip also its tail, which follows the body.
        """
        stop = clip.out_stop
        if clip.index == len(self.clips) - 1:
            stop += clip.tail_length
        return min(clip.out_start, self.frames), min(stop, self.frames)

    def first_clip_for(self, done_frames: int) -> int:
        """The first clip to decode when output frames `[0, done_frames)` already exist (a resumed job).

        The first clip with a frame still missing, or the one before it when its body is cross-faded
        with that clip's tail; 0 for stateful (causal) decoders, whose state needs every earlier
        clip; `len(clips)` when nothing is missing.
        """
        if self.stateful:
            return 0
        for clip in self.clips:
            if self.final_range(clip)[1] > done_frames:
                return clip.index - 1 if clip.index and clip.blend_frames else clip.index
        return len(self.clips)


def causal_schedule(latent_frames: int, temporal_ratio: int) -> DecodeSchedule:
    """The `DecodeSchedule` of a causal decoder with a feature cache (Wan-style VAEs): one clip per latent
    frame of `latent_frames`, latent frame 0 giving 1 pixel frame and each later one `temporal_ratio`.
    `InvalidInputError` for `latent_frames` < 1.

    Latent frame 0 decodes to 1 pixel frame, every later one to `temporal_ratio` frames; no overlap,
    no cross-fade, no padding: ``1 + temporal_ratio * (latent_frames - 1)`` frames.
    """
    if latent_frames < 1:
        raise InvalidInputError(f"latent frame count must be >= 1, got {latent_frames}")
    clips = []
    out_start = 0
    for index in range(latent_frames):
        produced = 1 if index == 0 else temporal_ratio
        clips.append(ClipStep(index=index, latent_start=index, latent_stop=index + 1, body_start=0,
                              body_stop=produced, tail_start=0, tail_stop=0, blend_frames=0, out_start=out_start))
        out_start += produced
    return DecodeSchedule(latent_frames=latent_frames, pad_tokens=0, clips=tuple(clips), frames=out_start,
                          frame_overlap=0, stateful=True)


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
    """Return None when `width` and `height` (pixels) are both positive multiples of 32, the DiT's token
    stride; else raise `InvalidInputError` naming each bad side and its nearest multiples."""
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
    """Audio latent frames that go with `frames` video frames: the clip's duration times 40, rounded
    to the nearest integer, as ComfyUI's H3 nodes size the audio latent (124 frames -> 207)."""
    return round(frames / fps * AUDIO_LATENTS_PER_SECOND)


def audio_samples_for(audio_latent_frames: int) -> int:
    """Audio samples (per channel) decoded from `audio_latent_frames` latent frames (hop 800)."""
    return audio_latent_frames * AUDIO_HOP


CHAIN_OVERLAP = CLIP_LENGTH + 5
"""Frames two consecutive segments of a long-form chain share (22 = 17 + 5): the next segment is
conditioned on the previous one's last 22 frames (one encoder clip plus the grid's 5, 7 latent frames)."""


def chain_segments(frames: int, max_segment_frames: int, overlap: int = CHAIN_OVERLAP) -> tuple[int, ...]:
    """Segment lengths of the shortest chain that renders exactly `frames` frames, every length on the grid.
    `InvalidInputError` for `frames`, `max_segment_frames` or `overlap` off the 17n+5 grid, or segments no
    longer than the overlap.

    Consecutive segments share `overlap` frames, so the chain's length is ``sum(segments) - (k - 1) * overlap``
    and equals `frames` exactly. With all three of `frames`, `overlap` and every segment on the 17n+5 grid
    that sum is on the grid too: segments ``17 n_i + 5`` and overlap ``17 m + 5`` give
    ``17 (sum(n_i) - (k - 1) m) + 5``. `k` is the fewest segments of at most `max_segment_frames` frames
    that cover `frames`; the grid steps are spread evenly (lengths differ by at most 17, longer ones first),
    so 362 frames with segments of up to 294 give (192, 192), not (294, 90). A request that fits in one
    segment gives ``(frames,)``. Every segment is longer than `overlap`.
    """
    for name, value in (("frames", frames), ("max_segment_frames", max_segment_frames), ("overlap", overlap)):
        if not is_on_grid(value):
            low, high = nearest_grid_frames(value)
            raise InvalidInputError(f"chain {name} {value} is off H3's 17n+5 grid (nearest: {low} or {high})")
    if frames <= max_segment_frames:
        return (frames,)
    if max_segment_frames <= overlap:
        raise InvalidInputError(f"chain segments of at most {max_segment_frames} frames cannot advance past an "
                                f"overlap of {overlap} frames: a segment must be longer than the overlap")
    m = (overlap - 5) // CLIP_LENGTH
    n_total = (frames - 5) // CLIP_LENGTH
    k = math.ceil((frames - overlap) / (max_segment_frames - overlap))
    steps = n_total + (k - 1) * m                       # sum of the segments' n
    base, extra = divmod(steps, k)
    return tuple(CLIP_LENGTH * (base + (1 if i < extra else 0)) + 5 for i in range(k))


__all__ = ["AUDIO_LATENTS_PER_SECOND", "AUDIO_LATENT_CHANNELS", "AUDIO_SAMPLE_RATE", "CHAIN_OVERLAP",
           "CLIP_LENGTH", "H3_TEMPORAL", "PATCH_SIZE", "SPATIAL_RATIO", "TOKEN_STRIDE", "VIDEO_FPS",
           "VIDEO_LATENT_CHANNELS", "ClipStep", "DecodeSchedule", "TemporalGeometry",
           "audio_latent_frames_for", "audio_samples_for", "causal_schedule", "chain_segments",
           "check_canvas", "frames_for_latents", "is_on_grid", "latent_frames_for", "nearest_grid_frames",
           "tokens_per_latent_frame", "video_tokens"]
