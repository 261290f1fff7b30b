"""Place H3's components on several devices so that one render fits: text encoder, DiT, video VAE, audio VAE.

`parse_devices("cuda:0=24GB,cuda:1=12GB")` reads the devices (capacities as cards are sold: "24GB" is
24 GiB); `place(request, devices, host_bytes=...)` returns a `Placement`: which device hosts which
component, the settings each component runs with, and each device's predicted peak per phase. Plain
Python: no torch, no framework.

Numbers. Every byte comes from the planner's single-device estimate (`estimate.estimate`) of the chosen
settings, split per component by phase: the text encoder is the `text_encoding` phase (weights +
activations), the DiT the `sampling` phase (resident weights + activations + latents), the video VAE the
`decode` phase of the same request without audio, and the audio VAE the difference the audio makes to the
decode weights plus its own working set (`audio.audio_decode_working_set_bytes`) and the latents. Settings
per component are searched with the recommender's own choices (`recommend.choose_dit`,
`recommend.choose_decode`, `recommend.TEXT_ENCODER_CHOICES`), each against the room its device has left.
The DiT is placed whole on one device (its blocks may be offloaded to host RAM, as on one device); it is
never split across accelerators.

Residency policy (`Placement.policy`), stated per placement:

- "resident": every component is loaded once and stays on its device for the whole render. A device's
  bytes in a phase = the weights of every component placed on it + the working set of the components
  active in that phase. What `h3director.integrations.diffusers_placement.apply_placement` does (a
  diffusers pipeline keeps its components where they were moved).
- "phased": a component is on its device only during its own phase (text encode, then sampling, then
  decode) and is unloaded to host RAM after it. A device's bytes in a phase = the active components'
  weights + working set. ComfyUI behaves so when memory is short: before loading a model on a device it
  unloads other models from THAT device until the new one fits (`model_management.free_memory(required,
  device)`), and keeps them loaded when there is room; so a placement that fits "phased" runs in ComfyUI
  (reloading the unloaded component on the next render), and one that fits "resident" runs without reloads.

`place(..., policy="auto")` tries both and keeps the better settings (resident on a tie). A text encoder
placed on "cpu" runs from host RAM (the recommender's fallback); in the resident policy its weights stay in
host RAM for the whole render.

Every device is checked like a single-device `recommend.Budget`: usable = capacity x (1 - margin) - reserve.
Host RAM: each phase's host bytes (offloaded DiT blocks, latents, outputs, a text encoder on the CPU) must fit
host RAM x (1 - margin). Like the single-device plan, they do not count the weights of a component that is not
loaded on its device (before its phase, or parked in host RAM after it under "phased").
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from h3director.errors import BudgetError, InvalidInputError
from h3director.plan.activations import DiTShape
from h3director.plan.estimate import (
    PlanEstimate,
    PlanRequest,
    audio_working_set,
    clip_working_set,
    estimate,
    model_config_key,
    packed_geometry,
)
from h3director.plan.recommend import (
    DECODE_TILES,
    DEFAULT_MARGIN,
    DEFAULT_RESERVE,
    DIT_FORMATS,
    SINK_ORDER,
    TEXT_ENCODER_CHOICES,
    Budget,
    choose_decode,
    choose_dit,
    chunkings,
    dit_memory_settings,
    recommend,
)
from h3director.units import format_size, parse_size

COMPONENTS = ("text_encoder", "dit", "video_vae", "audio_vae")
PHASES = ("text_encoding", "sampling", "decode")
PHASE_OF = {"text_encoder": "text_encoding", "dit": "sampling", "video_vae": "decode", "audio_vae": "decode"}
# What a placement string may call a component: the plan's names and ComfyUI's socket names.
ALIASES = {"model": "dit", "transformer": "dit", "clip": "text_encoder", "vae": "video_vae"}
POLICIES = ("resident", "phased")
HOST = "cpu"
MAX_DEVICES = 8
_CUDA_RE = re.compile(r"^cuda:(\d+)$")
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator the planner may use: `name` ("cuda:N") and its memory in bytes."""

    name: str
    capacity_bytes: int


def parse_devices(text: str) -> tuple[DeviceSpec, ...]:
    """Read "cuda:0=24GB,cuda:1=12GB" into `DeviceSpec`s, in the given order.

    Sizes follow `units.parse_size(binary_gb=True)` ("24GB" = 24 GiB, as cards are sold; "512MiB" too).
    Refused with `InvalidInputError` naming the entry: an empty spec, an entry without "=", a device that
    is not "cuda:N" (the host is not a device here: host RAM is `--ram`), an unknown unit, a zero
    capacity, the same device twice, more than `MAX_DEVICES` devices."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("--devices is empty: give DEVICE=SIZE entries, e.g. cuda:0=24GB,cuda:1=12GB")
    specs: list[DeviceSpec] = []
    for raw in text.split(","):
        entry = raw.strip()
        if "=" not in entry:
            raise InvalidInputError(f"device entry {entry!r} has no size: write DEVICE=SIZE, e.g. cuda:0=24GB")
        name, size = (part.strip() for part in entry.split("=", 1))
        name = _canonical_device(name.lower())
        if not _CUDA_RE.match(name):
            hint = " (the host is not a device here: give host RAM with --ram)" if name == HOST else \
                " (write the index, e.g. cuda:0)" if name == "cuda" else ""
            raise InvalidInputError(f"device {name!r} in {entry!r} is not a CUDA device 'cuda:N'{hint}")
        try:
            capacity = parse_size(size, binary_gb=True)
        except InvalidInputError as error:
            raise InvalidInputError(f"device entry {entry!r}: {error}") from None
        if capacity <= 0:
            raise InvalidInputError(f"device entry {entry!r}: the capacity must be above zero")
        if any(spec.name == name for spec in specs):
            raise InvalidInputError(f"device {name} is given twice in {text!r}")
        specs.append(DeviceSpec(name, capacity))
    if len(specs) > MAX_DEVICES:
        raise InvalidInputError(f"at most {MAX_DEVICES} devices are planned, got {len(specs)}")
    return tuple(specs)


def parse_placement(text: str) -> dict[str, str]:
    """Read a placement string such as "text_encoder=cuda:1,dit=cuda:0,video_vae=cuda:1,audio_vae=cuda:1"
    (what `Placement.spec()` prints) into {component: device}.

    Components: `COMPONENTS`, or the aliases model/transformer (dit), clip (text_encoder), vae (video_vae).
    Devices: "cpu", "cuda", "cuda:N" or "mps" (whether the device exists is the applier's check). Entries may
    be left out (that component is left where it is); an empty string places nothing. Refused with
    `InvalidInputError`: an entry without "=", an unknown component, a malformed device, a component twice."""
    placement: dict[str, str] = {}
    if not isinstance(text, str):
        raise InvalidInputError(f"a placement must be text like 'dit=cuda:0,text_encoder=cuda:1', got {text!r}")
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if "=" not in entry:
            raise InvalidInputError(f"placement entry {entry!r} is not COMPONENT=DEVICE "
                                    "(e.g. dit=cuda:0)")
        key, device = (part.strip().lower() for part in entry.split("=", 1))
        device = _canonical_device(device)
        component = ALIASES.get(key, key)
        if component not in COMPONENTS:
            raise InvalidInputError(f"unknown component {key!r} in {entry!r}: use one of "
                                    f"{', '.join(COMPONENTS)} (or {', '.join(ALIASES)})")
        if not _DEVICE_RE.match(device):
            raise InvalidInputError(f"device {device!r} in {entry!r} is not cpu, cuda, cuda:N or mps")
        if component in placement:
            raise InvalidInputError(f"component {component} is placed twice in {text!r}")
        placement[component] = device
    return placement


def _canonical_device(name: str) -> str:
    """"cuda:N" with N read as a number ("cuda:01" is "cuda:1", the name torch and the appliers use)."""
    match = _CUDA_RE.match(name)
    return f"cuda:{int(match.group(1))}" if match else name


@dataclass(frozen=True)
class ComponentNeed:
    """One component's bytes on its device while it is loaded: `weights_bytes` and, during its phase,
    `working_bytes` (activations, decode clip, latents)."""

    component: str
    device: str
    weights_bytes: int
    working_bytes: int
    detail: str = ""


@dataclass(frozen=True)
class Placement:
    """A placement that fits: `assignment` {component: device} ("cpu" = host RAM, text encoder only),
    `request` the settings every component runs with, `policy` ("resident" or "phased", see the module
    docstring), `needs` per component, `device_phase_bytes` {device: {phase: predicted bytes}},
    `host_phase_bytes` {phase: bytes}, and the usable bytes each device and the host were checked against."""

    request: PlanRequest
    devices: tuple[DeviceSpec, ...]
    assignment: Mapping[str, str]
    policy: str
    needs: tuple[ComponentNeed, ...]
    device_phase_bytes: Mapping[str, Mapping[str, int]]
    host_phase_bytes: Mapping[str, int]
    device_usable: Mapping[str, int]
    host_usable: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def spec(self) -> str:
        """The placement string the node and `apply_placement` take (see `parse_placement`)."""
        return ",".join(f"{c}={self.assignment[c]}" for c in COMPONENTS if c in self.assignment)

    def peak_bytes(self, device: str) -> int:
        return max(self.device_phase_bytes[device].values())

    def settings(self) -> dict:
        r = self.request
        return {"weights": r.weights, "offload_blocks": r.offload_blocks, "head_chunks": r.head_chunks,
                "ffn_chunks": r.ffn_chunks, "text_encoder": f"{r.text_encoder_weights} on {self.assignment['text_encoder']}",
                "decode_tiles_per_call": r.decode_tiles_per_call, "sink": r.sink,
                "dit_memory": dit_memory_settings(r.head_chunks, r.ffn_chunks)}

    def apply(self) -> dict:
        """How to apply it: the ComfyUI node and its input, ComfyUI's own selector nodes, the diffusers call."""
        spec = self.spec()
        comfy_names = {"dit": "Select Model Device", "text_encoder": "Select CLIP Device",
                       "video_vae": "Select VAE Device", "audio_vae": "Select VAE Device (audio VAE)"}
        return {
            "placement": spec,
            "node": f'H3Director Device Placement: placement "{spec}"',
            "comfy_builtin": [f"{comfy_names[c]}: {_comfy_option(d)}" + (" (not offered there for VAEs)"
                              if d == HOST and c.endswith("vae") else "") for c, d in self.assignment.items()],
            "diffusers": f'apply_placement(pipe, "{spec}")',
            "dit_memory": self.settings()["dit_memory"]["advice"],
        }

    def to_dict(self) -> dict:
        return {
            "fits": True,
            "policy": self.policy,
            "placement": dict(self.assignment),
            "spec": self.spec(),
            "devices": [{"name": d.name, "capacity_bytes": d.capacity_bytes, "usable_bytes": self.device_usable[d.name],
                         "phase_bytes": dict(self.device_phase_bytes[d.name]), "peak_bytes": self.peak_bytes(d.name)}
                        for d in self.devices],
            "host": {"usable_bytes": self.host_usable, "phase_bytes": dict(self.host_phase_bytes)},
            "components": [dataclasses.asdict(n) for n in self.needs],
            "settings": self.settings(),
            "apply": self.apply(),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        """The placement as text: component -> device, then each device's predicted bytes per phase."""
        lines = [f"Placement across {len(self.devices)} devices (policy {self.policy}: "
                 + ("every component stays loaded on its device" if self.policy == "resident" else
                    "each component is loaded for its phase and unloaded after it") + "):"]
        for need in self.needs:
            lines.append(f"  {need.component:<13} -> {need.device:<7} weights {format_size(need.weights_bytes):>10}, "
                         f"working {format_size(need.working_bytes):>10}  {need.detail}")
        lines.append(f"{'device':<9}{'capacity':>11}{'usable':>11}" + "".join(f"{p:>15}" for p in PHASES)
                     + f"{'peak':>11}")
        for d in self.devices:
            phases = self.device_phase_bytes[d.name]
            lines.append(f"{d.name:<9}{_gib(d.capacity_bytes):>11}{_gib(self.device_usable[d.name]):>11}"
                         + "".join(f"{_gib(phases[p]):>15}" for p in PHASES) + f"{_gib(self.peak_bytes(d.name)):>11}")
        lines.append(f"{'host RAM':<9}{'':>11}{_gib(self.host_usable):>11}"
                     + "".join(f"{_gib(self.host_phase_bytes[p]):>15}" for p in PHASES)
                     + f"{_gib(max(self.host_phase_bytes.values())):>11}")
        s = self.settings()
        apply = self.apply()
        lines += [
            "Settings:",
            f"  DiT               {s['weights']}, {s['offload_blocks']} of "
            f"{DiTShape.from_config(self.request.dit_config).layers} blocks offloaded to host RAM, "
            f"{s['head_chunks']} head / {s['ffn_chunks']} FFN chunks; {apply['dit_memory']}",
            f"  text encoder      {s['text_encoder']}",
            "  decode            " + ("reference tiled path" if s["decode_tiles_per_call"] is None
                                      else f"streamed tiling, {s['decode_tiles_per_call']} tile(s) per call")
            + f", sink {s['sink']}",
            "Apply:",
            f"  ComfyUI           node {apply['node']}",
            f"  (or ComfyUI's own {'; '.join(apply['comfy_builtin'])})",
            f"  diffusers         h3director.integrations.diffusers_placement.{apply['diffusers']}",
        ]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}G"


def _comfy_option(device: str) -> str:
    """ComfyUI's selector nodes name GPUs "gpu:N" (the Nth torch device) and the host "cpu"."""
    match = _CUDA_RE.match(device)
    return f"gpu:{match.group(1)}" if match else device


def _phase(plan: PlanEstimate, name: str):
    return next(p for p in plan.phases if p.name == name)


@dataclass(frozen=True)
class _Needs:
    """Bytes per component for one request (see the module docstring)."""

    te: ComponentNeed
    te_host: int
    dit: ComponentNeed
    video: ComponentNeed
    audio: ComponentNeed | None
    decode_combined: tuple[int, int]           # (weights, working) of both VAEs on one device
    host: dict[str, int]                        # per phase, as the single-device estimate counts it
    dit_offloaded: int = 0                      # the DiT's offloaded blocks, in host RAM while it is loaded


def _needs(request: PlanRequest, assignment: Mapping[str, str]) -> _Needs:
    plan = estimate(request)
    te, sampling, decode = (_phase(plan, p) for p in PHASES)
    video = _phase(estimate(dataclasses.replace(request, audio=False)), "decode")
    # the estimator's own (cached) per-clip working set; the rest of the video decode's working set is the latents
    clip = clip_working_set(model_config_key(request.vae_config), request.height, request.width,
                             request.decode_tiles_per_call, request.vae_dtype)
    latents = video.working_bytes - clip
    audio = None
    if request.audio:
        geo = packed_geometry(request.width, request.height, request.frames, text_tokens=request.text_tokens,
                              refs=request.refs, keyframes=request.keyframes)
        audio = ComponentNeed("audio_vae", assignment["audio_vae"], decode.weights_bytes - video.weights_bytes,
                              audio_working_set(model_config_key(request.audio_config), geo.audio_latents) + latents,
                              "audio VAE fp32 (decoder and latents)")
    if request.text_encoder_device == "cpu":      # its bytes are host bytes; show what it holds there
        te = _phase(estimate(dataclasses.replace(request, text_encoder_device="gpu")), "text_encoding")
        te = dataclasses.replace(te, detail=te.detail.replace(" on gpu", " on cpu"))
    return _Needs(
        te=ComponentNeed("text_encoder", assignment["text_encoder"], te.weights_bytes, te.working_bytes, te.detail),
        te_host=_phase(plan, "text_encoding").host_bytes,
        dit=ComponentNeed("dit", assignment["dit"], sampling.weights_bytes, sampling.working_bytes, sampling.detail),
        video=ComponentNeed("video_vae", assignment["video_vae"], video.weights_bytes, video.working_bytes,
                            video.detail),
        audio=audio,
        decode_combined=(decode.weights_bytes, decode.working_bytes),
        host={p.name: p.host_bytes for p in plan.phases},
        dit_offloaded=sampling.host_bytes - latents,    # the sampling phase's host bytes: offloaded blocks + latents
    )


def _device_bytes(needs: _Needs, policy: str, devices: Sequence[str]) -> dict[str, dict[str, int]]:
    """{device: {phase: bytes}} for `needs` under `policy` (the text encoder on "cpu" counts on no device)."""
    parts = [needs.te, needs.dit, needs.video] + ([needs.audio] if needs.audio else [])
    out = {}
    for device in devices:
        here = [n for n in parts if n.device == device]
        resident = sum(n.weights_bytes for n in here) if policy == "resident" else 0
        phases = {}
        for phase in PHASES:
            active = [n for n in here if PHASE_OF[n.component] == phase]
            if not active:
                phases[phase] = resident
                continue
            if len(active) == 2:                       # both VAEs here: they decode one after the other
                weights, working = needs.decode_combined
            else:
                weights, working = active[0].weights_bytes, active[0].working_bytes
            phases[phase] = (resident if policy == "resident" else weights) + working
        out[device] = phases
    return out


def _host_bytes(needs: _Needs, policy: str) -> dict[str, int]:
    host = dict(needs.host)
    if policy == "resident":        # the DiT is loaded before the text encoding: its offloaded blocks are in host RAM
        host["text_encoding"] += needs.dit_offloaded
    if policy == "resident" and needs.te.device == HOST:     # the encoder stays in host RAM after its phase
        for phase in ("sampling", "decode"):
            host[phase] += needs.te_host
    return host


class _Search:
    """The search state for one `place` call: budgets, memoised per-device component choices."""

    def __init__(self, request: PlanRequest, devices: Sequence[DeviceSpec], host_bytes: int, margin: float,
                 reserve: int, formats: Sequence[str]):
        self.request = request
        self.devices = tuple(devices)
        self.capacity = {d.name: d.capacity_bytes for d in devices}
        self.host_bytes = host_bytes
        self.margin = margin
        self.reserve = reserve
        self.formats = tuple(formats)
        self._dit: dict = {}
        self._decode: dict = {}

    def budget(self, device: str, taken: int = 0) -> Budget:
        """`device`'s budget with `taken` bytes already held by other resident components."""
        return Budget(self.capacity[device], self.host_bytes, "cuda", margin=self.margin,
                      reserve_bytes=self.reserve + taken)

    def usable(self, device: str) -> int:
        return self.budget(device).device_usable

    def dit(self, request: PlanRequest, device: str, taken: int) -> PlanRequest | None:
        """The recommender's DiT choice on `device` (the sampling phase does not depend on the text encoder's
        settings, so one search serves every text encoder choice; the result carries `request`'s)."""
        key = (device, taken)
        if key not in self._dit:
            self._dit[key] = choose_dit(request, self.budget(device, taken), self.formats)
        found = self._dit[key]
        return None if found is None else dataclasses.replace(
            found, text_encoder_device=request.text_encoder_device, text_encoder_weights=request.text_encoder_weights)

    def decode(self, request: PlanRequest, device: str, taken: int) -> PlanRequest | None:
        """The recommender's decode choice on `device`; the decode phase depends on the DiT settings only
        through the offloaded blocks held in host RAM."""
        key = (device, taken, request.weights, request.offload_blocks, request.audio)
        if key not in self._decode:
            self._decode[key] = choose_decode(request, self.budget(device, taken))
        return self._decode[key]


def _score(request: PlanRequest, formats: Sequence[str], te_choice: int, policy: str, shared: int,
           slack: int) -> tuple:
    """Lower is better: DiT format, offloaded blocks, chunking (the recommender's order), then the resident
    policy (nothing reloaded per render), the text encoder's choice, the decode path, the fewest pairs of
    components sharing an accelerator (fewer unloads when phased), and the most room left on the fullest device."""
    decode_rank = SINK_ORDER.index(request.sink) * len(DECODE_TILES) + DECODE_TILES.index(request.decode_tiles_per_call)
    return _dit_rank(request, formats) + (POLICIES.index(policy), te_choice, decode_rank, shared, -slack)


def _dit_rank(request: PlanRequest, formats: Sequence[str]) -> tuple:
    order = chunkings(DiTShape.from_config(request.dit_config).heads, request.weights, request.target)
    return formats.index(request.weights), request.offload_blocks, order.index((request.head_chunks, request.ffn_chunks))


def _try(search: _Search, base: PlanRequest, assignment: dict[str, str], te_choice: tuple[str, str],
         policy: str, bound: tuple | None) -> tuple[PlanRequest, _Needs, dict, dict] | None:
    """The best settings for one assignment, text encoder choice and policy, or None if they do not fit
    or their DiT settings and policy rank worse than `bound` (the best found so far)."""
    te_device, te_fmt = te_choice
    request = dataclasses.replace(base, text_encoder_device=te_device, text_encoder_weights=te_fmt)
    resident = policy == "resident"
    first = _needs(request, assignment)            # weights that do not depend on the DiT or decode settings
    te_weights = first.te.weights_bytes if assignment["text_encoder"] != HOST else 0
    vae_weights = {assignment["video_vae"]: first.video.weights_bytes}
    if first.audio:
        vae_weights[assignment["audio_vae"]] = vae_weights.get(assignment["audio_vae"], 0) + first.audio.weights_bytes

    def others(device: str, *, dit: int = 0, te: bool = True, vae: bool = True) -> int:
        if not resident:
            return 0
        taken = dit if assignment["dit"] == device else 0
        if te and assignment["text_encoder"] == device:
            taken += te_weights
        if vae:
            taken += vae_weights.get(device, 0)
        return taken

    chosen = search.dit(request, assignment["dit"], others(assignment["dit"]))
    if chosen is None or (bound is not None
                           and _dit_rank(chosen, search.formats) + (POLICIES.index(policy),) > bound):
        return None
    dit_resident = _phase(estimate(chosen), "sampling").weights_bytes
    video_device = assignment["video_vae"]
    together = first.audio is not None and assignment["audio_vae"] == video_device
    # The decode choice is priced on the VAE device alone: with audio when both VAEs share it.
    probe = chosen if together else dataclasses.replace(chosen, audio=False)
    taken = others(video_device, dit=dit_resident, vae=False) + (0 if together or not resident
                                                                  else vae_weights.get(video_device, 0)
                                                                  - first.video.weights_bytes)
    decoded = search.decode(probe, video_device, taken)
    if decoded is None:
        return None
    chosen = dataclasses.replace(chosen, decode_tiles_per_call=decoded.decode_tiles_per_call, sink=decoded.sink,
                                 keep_dit_during_decode=False)
    needs = _needs(chosen, assignment)
    names = [d.name for d in search.devices]
    per_device = _device_bytes(needs, policy, names)
    host = _host_bytes(needs, policy)
    if any(max(per_device[d].values()) > search.usable(d) for d in names):
        return None
    if max(host.values()) > search.budget(names[0]).host_usable:
        return None
    return chosen, needs, per_device, host


def _canonical(devices_for: Sequence[str], capacity: Mapping[str, int]) -> tuple:
    """`devices_for` with each device replaced by (capacity, order of first use among its equals)."""
    first_use: dict[str, int] = {}
    out = []
    for device in devices_for:
        if device not in capacity:
            out.append(device)
            continue
        if device not in first_use:
            first_use[device] = sum(1 for d in first_use if capacity[d] == capacity[device])
        out.append((capacity[device], first_use[device]))
    return tuple(out)


def place(request: PlanRequest, devices: Sequence[DeviceSpec], *, host_bytes: int, margin: float = DEFAULT_MARGIN,
          reserve_bytes: int = DEFAULT_RESERVE, formats: Sequence[str] | None = None,
          policy: str = "auto") -> Placement:
    """Place `request`'s components on `devices` (from `parse_devices`) with `host_bytes` of host RAM.

    `formats`: the DiT weight formats allowed, best first (default `recommend.DIT_FORMATS`); `policy`:
    "resident", "phased" or "auto" (both, the better settings win; see the module docstring). Every
    assignment of the components to the devices (the text encoder also to "cpu") is priced with the
    recommender's choices against the room left on each device; the one with the best DiT settings wins
    (then the text encoder's, the decode path's, resident before phased, most room left).
    Raises `BudgetError` when no assignment fits, with each device's numbers and what the planner would
    run on the largest device alone (`refusal_message`)."""
    request.validate()
    if not devices:
        raise InvalidInputError("no devices to place on: give at least one, e.g. cuda:0=24GB")
    if policy not in POLICIES + ("auto",):
        raise InvalidInputError(f"policy must be resident, phased or auto, got {policy!r}")
    if not 0 <= margin < 1:
        raise InvalidInputError(f"margin must be in [0, 1), got {margin}")
    formats = tuple(formats or DIT_FORMATS)
    search = _Search(request, devices, int(host_bytes), margin, reserve_bytes, formats)
    names = [d.name for d in devices]
    components = COMPONENTS if request.audio else COMPONENTS[:3]
    choices = {"text_encoder": names + [HOST], "dit": names, "video_vae": names, "audio_vae": names}
    best = None
    for policy_name in (POLICIES if policy == "auto" else (policy,)):
        seen = set()
        for devices_for in itertools.product(*(choices[c] for c in components)):
            shape = _canonical(devices_for, search.capacity)
            if shape in seen:        # the same as one already tried, up to swapping devices of equal capacity
                continue
            seen.add(shape)
            assignment = dict(zip(components, devices_for, strict=True))
            te_choices = [(i, c) for i, c in enumerate(TEXT_ENCODER_CHOICES)
                          if (c[0] == "cpu") == (assignment["text_encoder"] == HOST)]
            for te_rank, te_choice in te_choices:
                found = _try(search, request, assignment, te_choice, policy_name,
                             None if best is None else best[0][:4])
                if found is None:
                    continue
                chosen, needs, per_device, host = found
                slack = min(search.usable(d) - max(per_device[d].values()) for d in names)
                on_devices = [d for d in assignment.values() if d != HOST]
                shared = sum(on_devices.count(d) * (on_devices.count(d) - 1) // 2 for d in set(on_devices))
                key = _score(chosen, formats, te_rank, policy_name, shared, slack)
                if best is None or key < best[0]:
                    best = (key, chosen, assignment, policy_name, needs, per_device, host)
    if best is None:
        raise BudgetError(refusal_message(request, devices, host_bytes=int(host_bytes), margin=margin,
                                          reserve_bytes=reserve_bytes, formats=formats))
    _, chosen, assignment, policy_name, needs, per_device, host = best
    parts = (needs.te, needs.dit, needs.video) + ((needs.audio,) if needs.audio else ())
    notes = []
    if policy_name == "phased":
        notes.append("phased: components are unloaded after their phase; ComfyUI does this on demand, a diffusers "
                     "pipeline keeps its components loaded (apply_placement refuses a phased placement)")
    if chosen.offload_blocks:
        notes.append(f"the DiT offloads {chosen.offload_blocks} blocks to host RAM: in diffusers call "
                     "transformer.enable_group_offload(onload_device="
                     f"\"{assignment['dit']}\", offload_type=\"block_level\", num_blocks_per_group=1) before "
                     "apply_placement, which then leaves the transformer where group offload keeps it (it would "
                     "otherwise move the whole DiT to the device; group offload streams every block, not only these)")
    return Placement(request=chosen, devices=tuple(devices), assignment=assignment, policy=policy_name,
                     needs=parts, device_phase_bytes=per_device, host_phase_bytes=host,
                     device_usable={d: search.usable(d) for d in names},
                     host_usable=search.budget(names[0]).host_usable, notes=tuple(notes))


def refusal_message(request: PlanRequest, devices: Sequence[DeviceSpec], *, host_bytes: int,
                    margin: float = DEFAULT_MARGIN, reserve_bytes: int = DEFAULT_RESERVE,
                    formats: Sequence[str] | None = None) -> str:
    """Why no placement fits: each device's usable bytes, each component's smallest need (the most
    compressed formats, full chunking, every DiT block offloaded, one decode tile per call), and what the
    single-device recommender would run on the largest device (possibly long-form chunks)."""
    formats = tuple(formats or DIT_FORMATS)
    shape = DiTShape.from_config(request.dit_config)
    heads, ffn = chunkings(shape.heads, formats[-1], request.target)[-1]
    smallest = dataclasses.replace(request, weights=formats[-1], head_chunks=heads, ffn_chunks=ffn,
                                   offload_blocks=shape.layers, text_encoder_weights=TEXT_ENCODER_CHOICES[-1][1],
                                   decode_tiles_per_call=1, sink=SINK_ORDER[-1])
    largest = max(devices, key=lambda d: d.capacity_bytes)
    needs = _needs(smallest, {c: largest.name for c in COMPONENTS})
    lines = [f"no placement of H3 {request.width}x{request.height}x{request.frames} fits these devices "
             "in one pass:"]
    for d in devices:
        usable = Budget(d.capacity_bytes, host_bytes, "cuda", margin=margin, reserve_bytes=reserve_bytes).device_usable
        lines.append(f"  {d.name}: {format_size(d.capacity_bytes)}, usable {format_size(usable)} "
                     f"(after the {margin:.0%} margin and {format_size(reserve_bytes)} reserve)")
    lines.append("smallest need per component (alone on a device):")
    for need in (needs.te, needs.dit, needs.video) + ((needs.audio,) if needs.audio else ()):
        lines.append(f"  {need.component}: {format_size(need.weights_bytes + need.working_bytes)} "
                     f"({format_size(need.weights_bytes)} weights + {format_size(need.working_bytes)} working)")
    host_usable = Budget(largest.capacity_bytes, host_bytes, "cuda", margin=margin).host_usable
    lines.append(f"  host RAM: {format_size(max(needs.host.values()))} at most per phase; usable "
                 f"{format_size(host_usable)}")
    try:
        advice = recommend(request, Budget(largest.capacity_bytes, host_bytes, "cuda", margin=margin,
                                           reserve_bytes=reserve_bytes), formats=formats)
    except BudgetError as error:
        lines.append(f"on {largest.name} alone the planner refuses too: {error}")
    else:
        s = advice.settings()
        what = (f"long-form in {advice.long_form.chunks} segments of up to {advice.long_form.chunk_frames} frames"
                if advice.long_form else "one pass")
        lines.append(f"what fits: on {largest.name} alone, {what} with DiT {s['weights']}, {s['offload_blocks']} "
                     f"blocks offloaded, {s['head_chunks']} head / {s['ffn_chunks']} FFN chunks, text encoder "
                     f"{s['text_encoder']} (`{_plan_command(request, largest, host_bytes, margin, formats)}` shows it)")
    return "\n".join(lines)


def _plan_command(request: PlanRequest, device: DeviceSpec, host_bytes: int, margin: float,
                  formats: Sequence[str]) -> str:
    """The `h3director plan` command that plans `request` on `device` alone with this host RAM."""
    parts = [f"h3director plan --width {request.width} --height {request.height} --frames {request.frames}",
             f"--vram {device.capacity_bytes / 2**30:g}GB --ram {host_bytes / 2**30:g}GB"]
    defaults = PlanRequest(request.width, request.height, request.frames)
    for name in ("refs", "keyframes", "text_tokens", "attention"):
        if getattr(request, name) != getattr(defaults, name):
            parts.append(f"--{name.replace('_', '-')} {getattr(request, name)}")
    if request.dit_config and "num_layers" in request.dit_config:
        parts.append(f"--dit-layers {request.dit_config['num_layers']}")
    if not request.audio:
        parts.append("--no-audio")
    if len(formats) == 1:
        parts.append(f"--weights {formats[0]}")
    if margin != DEFAULT_MARGIN:
        parts.append(f"--margin {margin:g}")
    return " ".join(parts)


__all__ = ["COMPONENTS", "ComponentNeed", "DeviceSpec", "Placement", "parse_devices", "parse_placement",
           "place"]
