"""Read out-of-memory errors in a log and explain each one.

The patterns are PyTorch's own message formats, taken from its source:

- ``c10/cuda/CUDACachingAllocator.cpp`` (native caching allocator), current form:
  "CUDA out of memory. Tried to allocate R. GPU N has a total capacity of T of which F is free.
  [Process P has X memory in use. | Including non-PyTorch memory, this process has X memory in
  use. ]... [L allowed; ]Of the allocated memory A is allocated by PyTorch, [with G allocated in
  private pools (e.g., CUDA Graphs), ]and U is reserved by PyTorch but unallocated. ..."
  (ROCm builds say "HIP out of memory"; 2.1 spelled "capacty"; the generic device allocator
  says "Out of memory. Tried to allocate").
- the same file before PyTorch 2.1: "CUDA out of memory. Tried to allocate R (GPU N; T total
  capacity; A already allocated; F free; [L allowed; ]V reserved in total by PyTorch)", and
  before 1.6 "... F free; C cached)".
- ``c10/cuda/CUDAMallocAsyncAllocator.cpp`` (``backend:cudaMallocAsync``): "Allocation on device
  N would exceed allowed memory. (out of memory)" then lines "Currently allocated : A",
  "Requested : R", "Device limit : T", "Free (according to CUDA): F", "PyTorch limit (set by
  user-supplied memory fraction) : L".
- ``aten/src/ATen/mps/MPSAllocator.mm``: "MPS backend out of memory (MPS allocated: A, other
  allocations: O[, max allowed: M]). Tried to allocate R on private|shared pool."
- ``c10/core/impl/alloc_cpu.cpp``: "DefaultCPUAllocator: can't allocate memory: you tried to
  allocate N bytes. Error code E (reason)" (posix_memalign) and "DefaultCPUAllocator: not enough
  memory: you tried to allocate N bytes." (Windows, Android).
- ``c10/cuda/CUDAException``: "CUDA error: out of memory" (a CUDA call outside the allocator).
- numpy's ``_ArrayMemoryError``: "Unable to allocate S for an array with shape (...) and data
  type D".

Sizes printed by PyTorch are rounded to two decimals of binary units ("KiB/MiB/GiB"; MPS writes
"KB/MB/GB" for the same powers of 1024), so parsed byte counts are exact only to that rounding.
A line that mentions running out of memory in any other form is reported as not understood:
nothing is guessed.

`is_out_of_memory(error)` is the one recogniser of allocator failures in exceptions: the decode's
clip retry (`h3director.video.scheduler`) and this parser read the same formats, so an error the
parser explains is one the retry acts on (a real CPU allocation failure included).
"""

from __future__ import annotations

import bisect
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from h3director.geometry import SPATIAL_RATIO, frames_for_latents
from h3director.units import GiB, format_size

# A size as PyTorch's format_size prints it (and numpy's, which may end in "." as in "16. GiB").
_SIZE = r"\d+(?:\.\d*)?\s*(?:bytes|[KMGT]i?B)"
_SIZE_UNITS = {"bytes": 1, "B": 1}
for _power, _letter in enumerate("KMGT", start=1):
    _SIZE_UNITS[f"{_letter}iB"] = _SIZE_UNITS[f"{_letter}B"] = 1024**_power


def parse_size_text(text: str) -> int:
    """``"3.78 GiB"`` -> bytes (binary units, also for MPS's "GB"); ``"512 bytes"`` -> 512. `ValueError`
    for anything else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(bytes|[KMGT]i?B)\s*", text)
    if not match:
        raise ValueError(f"not a PyTorch size: {text!r}")
    return int(round(float(match.group(1)) * _SIZE_UNITS[match.group(2)]))


def _lit(text: str) -> str:
    """Literal message text as a regex; any run of spaces matches any whitespace (logs wrap lines)."""
    return "".join(r"\s+" if piece.isspace() else re.escape(piece) for piece in re.split(r"( +)", text) if piece)


def _pattern(*parts: str) -> re.Pattern[str]:
    return re.compile("".join(parts))


def _size(name: str) -> str:
    return f"(?P<{name}>{_SIZE})"


_CUDA = _pattern(
    r"(?P<backend>CUDA|HIP|XPU)?\s?", r"[Oo]" + _lit("ut of memory. Tried to allocate "), _size("requested"),
    r"(?i:\.)\s+GPU\s+(?P<gpu>\d+)\s+has\s+a\s+total\s+(?:capacity|capacty)\s+of\s+", _size("total"),
    r"\s+of\s+which\s+", _size("free"), r"\s+is\s+free\.\s*",
    r"(?P<procs>(?:(?:Process\s+\d+|Including\s+non-PyTorch\s+memory,\s+this\s+process)\s+has\s+" + _SIZE
    + r"\s+memory\s+in\s+use\.\s*)*)",
    r"(?:" + _size("allowed") + r"\s+allowed;\s*)?",
    _lit("Of the allocated memory "), _size("allocated"), _lit(" is allocated by PyTorch, "),
    r"(?:with\s+" + _size("private") + r"\s+allocated\s+in\s+private\s+pools\s+\(e\.g\.,\s+CUDA\s+Graphs\),\s+)?",
    _lit("and "), _size("unallocated"), _lit(" is reserved by PyTorch but unallocated."),
)
_CUDA_PROCESS = re.compile(
    r"(?:Process\s+(?P<pid>\d+)|(?P<self>Including\s+non-PyTorch\s+memory,\s+this\s+process))\s+has\s+"
    + _size("used") + r"\s+memory\s+in\s+use\."
)
_CUDA_LEGACY = _pattern(
    r"(?P<backend>CUDA|HIP)\s", _lit("out of memory. Tried to allocate "), _size("requested"),
    r"\s+\(GPU\s+(?P<gpu>\d+);\s+", _size("total"), r"\s+total\s+capacity;\s+",
    _size("allocated"), r"\s+already\s+allocated;\s+", _size("free"), r"\s+free;\s+",
    r"(?:" + _size("allowed") + r"\s+allowed;\s+)?",
    r"(?:" + _size("reserved") + r"\s+reserved\s+in\s+total\s+by\s+PyTorch|" + _size("cached") + r"\s+cached)\)",
)
_CUDA_ASYNC = _pattern(
    r"Allocation\s+on\s+device\s+(?P<gpu>\d+)\s+would\s+exceed\s+allowed\s+memory\.\s+\(out\s+of\s+memory\)\s*",
    r"Currently\s+allocated\s*:\s*", _size("allocated"), r"\s*",
    r"Requested\s*:\s*", _size("requested"), r"\s*",
    r"Device\s+limit\s*:\s*", _size("total"), r"\s*",
    r"Free\s+\(according\s+to\s+CUDA\)\s*:\s*", _size("free"),
    r"(?:\s*PyTorch\s+limit\s+\(set\s+by\s+user-supplied\s+memory\s+fraction\)\s*:\s*" + _size("limit") + ")?",
)
_MPS = _pattern(
    _lit("MPS backend out of memory (MPS allocated: "), _size("allocated"), _lit(", other allocations: "), _size("other"),
    r"(?:,\s+max\s+allowed:\s+" + _size("max_allowed") + ")?",
    _lit("). Tried to allocate "), _size("requested"), r"\s+on\s+(?P<pool>private|shared)\s+pool\.",
)
_CPU = re.compile(
    r"DefaultCPUAllocator:\s+(?P<why>not\s+enough\s+memory|can't\s+allocate\s+memory):\s+you\s+tried\s+to\s+"
    r"allocate\s+(?P<requested>\d+)\s+bytes\.(?:\s+Error\s+code\s+(?P<errno>\d+)\s+\((?P<reason>[^)\n]*)\))?"
)
_CUDA_RUNTIME = re.compile(r"CUDA\s+error:\s+out\s+of\s+memory")
_NUMPY = re.compile(
    r"Unable\s+to\s+allocate\s+(?P<requested>" + _SIZE + r")\s+for\s+an\s+array\s+with\s+shape\s+"
    r"(?P<shape>\([^)]*\))\s+and\s+data\s+type\s+(?P<dtype>\w+)"
)
# Lines that speak of running out of memory; any not covered by a known format is "not understood".
_OOM_HINT = re.compile(
    r"out of memory|OutOfMemoryError:|not enough memory|can't allocate memory|cannot allocate memory"
    r"|Unable to allocate|\bOOM\b",
    re.IGNORECASE,
)

#: Lines that follow an error the parser read, written by ComfyUI's executor (execution.py) after an OOM: context,
#: not another error.
_FOLLOW_UPS = re.compile(r"Got an OOM, unloading all loaded models\.|This error means you ran out of memory on your GPU\.")

#: Accelerator error code of a failed allocation (cudaErrorMemoryAllocation), as ``torch.AcceleratorError.error_code``
#: carries it: what the cudaMallocAsync backend raises instead of ``torch.OutOfMemoryError``.
CUDA_ERROR_MEMORY_ALLOCATION = 2


def mentions_out_of_memory(text: str) -> bool:
    """True when ``text`` says an allocation failed: one of the formats `explain_log` reads, or a line it
    would report as a not-understood out-of-memory line."""
    return bool(_OOM_HINT.search(text)) or any(pattern.search(text) for pattern, _ in _PARSERS)


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocator failure worth retrying with less memory.

    That is: a ``torch.OutOfMemoryError`` (CUDA, XPU; what ``torch.cuda.OutOfMemoryError`` aliases);
    an accelerator error with CUDA's allocation-failure code; or a ``RuntimeError`` / ``MemoryError``
    whose message `mentions_out_of_memory` (MPS, the CPU allocator's "DefaultCPUAllocator: can't
    allocate memory", numpy's "Unable to allocate", "CUDA error: out of memory"). Other exception types
    (a ``ValueError`` whose text says "out of memory") and a bare ``MemoryError()`` are not.
    """
    torch = sys.modules.get("torch")  # no torch imported: no torch error can exist
    if torch is not None and isinstance(error, getattr(torch, "OutOfMemoryError", ())):
        return True
    if not isinstance(error, (RuntimeError, MemoryError)):
        return False
    if getattr(error, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION and isinstance(error, RuntimeError):
        return True
    return mentions_out_of_memory(str(error))


#: A request this much bigger than the device is a size bug, not a memory shortage.
ABSURD_REQUEST_BYTES = 1024**5  # 1 PiB
#: Frame size used to put a host allocation in H3 terms: 1344 x 768 RGB float32.
H3_FRAME_F32_BYTES = 1344 * 768 * 3 * 4


@dataclass
class OomError:
    """One out-of-memory error found in a log, with its numbers (bytes) and what they mean.

    ``kind``: "cuda" (caching allocator), "cuda-legacy" (PyTorch < 2.1 wording), "cuda-async"
    (cudaMallocAsync), "cuda-runtime" (a CUDA call outside the allocator), "mps", "cpu", "numpy".
    ``diagnosis``: "fragmentation", "tight" (would fit if the reserved-but-unallocated memory were
    usable), "other-processes", "limit" (a memory fraction / watermark cap), "too-large" (one request
    larger than the device), "shortage", "size-bug", or "unknown" when the message has no numbers.
    """

    kind: str
    line: int  # 1-based line where the message starts
    text: str
    device: str | None
    requested_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None  # by PyTorch (includes private pools)
    reserved_unallocated_bytes: int | None = None  # cached by PyTorch, not in use
    limit_bytes: int | None = None  # memory fraction / MPS high watermark
    this_process_bytes: int | None = None  # NVML: all of this process's GPU memory
    other_processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes (NVML)
    other_bytes: int | None = None  # MPS "other allocations"
    diagnosis: str = "unknown"
    explanation: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    phase: str | None = None  # "sampling", "decode", "text_encoding" from the traceback (`log_context`)
    node: str | None = None  # the failing ComfyUI node's class (or the candidates), when the log shows it
    node_id: str | None = None
    geometry: dict[str, int] | None = None  # {"width", "height", "frames"} when the log states them
    steps: list[str] = field(default_factory=list)  # the VRAM guide's steps with their settings (plan.oom_advice)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["other_processes"] = {str(pid): used for pid, used in self.other_processes.items()}
        return data


@dataclass
class NotUnderstood:
    """A line that mentions running out of memory in a form this parser does not know."""

    line: int
    text: str
    kind: str = "not-understood"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sizes(match: re.Match[str], *names: str) -> dict[str, int | None]:
    return {name: (parse_size_text(match.group(name)) if match.group(name) else None) for name in names}


def _fmt(value: int | None) -> str:
    return "?" if value is None else format_size(value)


#: What to set against fragmentation: expandable segments exist since PyTorch 2.1 (the new wording).
_EXPANDABLE = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts "
               "(h3_config: allocator.expandable_segments: true)")
_MAX_SPLIT = ("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 (h3_config: allocator.max_split_size_mb), "
              "or PyTorch >= 2.1 with expandable_segments:True")


def _diagnose_cuda(error: OomError, *, alloc_conf_hint: str | None = _EXPANDABLE) -> None:
    r, t, f = error.requested_bytes, error.total_bytes, error.free_bytes
    u = error.reserved_unallocated_bytes or 0
    others = sum(error.other_processes.values())
    cap = error.limit_bytes
    explain, advise = error.explanation, error.advice
    explain.append(
        f"requested {_fmt(r)} on {error.device}: total {_fmt(t)}, free {_fmt(f)}, "
        f"allocated by PyTorch {_fmt(error.allocated_bytes)}"
        + ("" if error.reserved_unallocated_bytes is None else f", reserved but unallocated {_fmt(u)}")
        + (f", limit {_fmt(cap)}" if cap else "")
    )
    if error.this_process_bytes is not None and error.allocated_bytes is not None:
        outside = error.this_process_bytes - error.allocated_bytes - u
        if outside > 0:
            explain.append(
                f"this process holds {_fmt(error.this_process_bytes)} in all; {_fmt(outside)} of it is outside "
                "PyTorch's allocator (CUDA context, cuBLAS/cuDNN workspaces, other libraries)"
            )
    if others:
        listed = ", ".join(f"PID {pid}: {_fmt(used)}" for pid, used in sorted(error.other_processes.items()))
        explain.append(f"other processes hold {_fmt(others)} ({listed})")

    if r is not None and r >= ABSURD_REQUEST_BYTES:
        error.diagnosis = "size-bug"
        explain.append("a single request this large cannot be real memory use: a shape or size computation overflowed")
        advise.append("check the tensor shape that is being allocated (a negative or overflowed dimension)")
    elif r is not None and t is not None and r > (cap or t):
        error.diagnosis = "too-large"
        explain.append(f"one request of {_fmt(r)} is larger than the whole {'limit' if cap else 'device'} ({_fmt(cap or t)})")
        advise.append("split the work: fewer tiles per call, shorter clips, smaller batch or resolution "
                      "(h3_config: video_decode.tiles_per_call; for DiT forwards the Memory Guard node's "
                      "memory_safety.action_on_exceed: reduce_batch)")
    elif r is not None and cap is not None and error.allocated_bytes is not None and error.allocated_bytes + r > cap \
            and (f is None or f >= r):
        error.diagnosis = "limit"
        explain.append(f"the device has {_fmt(f)} free, but the per-process memory fraction caps PyTorch at {_fmt(cap)}")
        advise.append("raise torch.cuda.set_per_process_memory_fraction(...) or lower the job's memory use")
    elif r is not None and u >= r:
        error.diagnosis = "fragmentation"
        explain.append(
            f"PyTorch already holds {_fmt(u)} reserved but unallocated, more than the {_fmt(r)} requested, "
            "but not as one contiguous block: the cache is fragmented"
        )
        if alloc_conf_hint:
            advise.append(f"set {alloc_conf_hint}")
        explain.append("(PyTorch releases wholly free cached segments before raising, so this memory sits in "
                       "segments partly in use: torch.cuda.empty_cache() cannot return it)")
        advise.append("allocate long-lived buffers (weights, output buffers) before transient ones, or reuse "
                      "fixed-size buffers (memory_optimization_level >= 1: the slot pool)")
    elif r is not None and f is not None and others and r <= f + others:
        error.diagnosis = "other-processes"
        explain.append(f"the request would fit if the other processes' {_fmt(others)} were free")
        advise.append("stop the other GPU processes (see nvidia-smi) or run on another GPU")
    elif r is not None and f is not None and r <= f + u:
        error.diagnosis = "tight"
        explain.append(
            f"free ({_fmt(f)}) plus reserved-but-unallocated ({_fmt(u)}) would cover the request, neither alone does"
        )
        if alloc_conf_hint:
            advise.append(f"against the fragmented part, set {alloc_conf_hint}")
        advise.append("lower the peak a little: fewer tiles per call or streaming decode (memory_optimization_level >= 1)")
    else:
        error.diagnosis = "shortage"
        if r is not None and f is not None:
            explain.append(f"a real shortage: {_fmt(max(r - f - u, 0))} more than free plus cached memory is needed")
        advise.append("reduce the peak: streaming decode into a .npy/.mp4 output (memory_optimization_level >= 1), "
                      "fewer tiles per call, offload weights not in use, or a smaller resolution/frame count; "
                      "`h3director plan` estimates what fits")


def _from_cuda(match: re.Match[str], line: int) -> OomError:
    sizes = _sizes(match, "requested", "total", "free", "allocated", "unallocated", "allowed")
    error = OomError(
        kind="cuda", line=line, text=match.group(0), device=f"cuda:{match.group('gpu')}",
        requested_bytes=sizes["requested"], total_bytes=sizes["total"], free_bytes=sizes["free"],
        allocated_bytes=sizes["allocated"], reserved_unallocated_bytes=sizes["unallocated"], limit_bytes=sizes["allowed"],
    )
    for process in _CUDA_PROCESS.finditer(match.group("procs") or ""):
        used = parse_size_text(process.group("used"))
        if process.group("self"):
            error.this_process_bytes = used
        else:
            error.other_processes[int(process.group("pid"))] = error.other_processes.get(int(process.group("pid")), 0) + used
    _diagnose_cuda(error)
    return error


def _from_cuda_legacy(match: re.Match[str], line: int) -> OomError:
    sizes = _sizes(match, "requested", "total", "allocated", "free", "allowed", "reserved", "cached")
    if sizes["reserved"] is not None:
        unallocated = max(sizes["reserved"] - (sizes["allocated"] or 0), 0)
    else:
        unallocated = sizes["cached"]
    error = OomError(
        kind="cuda-legacy", line=line, text=match.group(0), device=f"cuda:{match.group('gpu')}",
        requested_bytes=sizes["requested"], total_bytes=sizes["total"], free_bytes=sizes["free"],
        allocated_bytes=sizes["allocated"], reserved_unallocated_bytes=unallocated, limit_bytes=sizes["allowed"],
    )
    _diagnose_cuda(error, alloc_conf_hint=_MAX_SPLIT)
    error.explanation.append("PyTorch < 2.1 wording: other processes and private pools are not reported")
    return error


def _from_cuda_async(match: re.Match[str], line: int) -> OomError:
    sizes = _sizes(match, "allocated", "requested", "total", "free", "limit")
    limit = sizes["limit"]
    if limit is not None and sizes["total"] is not None and limit >= sizes["total"]:
        limit = None  # no fraction set: PyTorch prints the device size (or more) as its limit
    error = OomError(
        kind="cuda-async", line=line, text=match.group(0), device=f"cuda:{match.group('gpu')}",
        requested_bytes=sizes["requested"], total_bytes=sizes["total"], free_bytes=sizes["free"],
        allocated_bytes=sizes["allocated"], limit_bytes=limit,
    )
    _diagnose_cuda(error, alloc_conf_hint=None)
    if error.total_bytes is not None and error.free_bytes is not None and error.allocated_bytes is not None:
        elsewhere = error.total_bytes - error.free_bytes - error.allocated_bytes
        if elsewhere > 0:
            error.explanation.append(
                f"{_fmt(elsewhere)} of the device is used by neither free memory nor PyTorch tensors: the CUDA "
                "context, the async pool's cached blocks, other libraries or other processes"
            )
    error.explanation.append("backend cudaMallocAsync: torch.cuda.memory_reserved() is not meaningful here; "
                             "free memory comes from cudaMemGetInfo")
    return error


def _from_mps(match: re.Match[str], line: int) -> OomError:
    sizes = _sizes(match, "allocated", "other", "max_allowed", "requested")
    error = OomError(
        kind="mps", line=line, text=match.group(0), device="mps", requested_bytes=sizes["requested"],
        allocated_bytes=sizes["allocated"], other_bytes=sizes["other"], limit_bytes=sizes["max_allowed"],
    )
    a, o, r, m = sizes["allocated"], sizes["other"], sizes["requested"], sizes["max_allowed"]
    error.explanation.append(
        f"requested {_fmt(r)} on the {match.group('pool')} pool: PyTorch tensors {_fmt(a)}, other Metal "
        f"allocations of this process {_fmt(o)}" + (f", high-watermark limit {_fmt(m)}" if m else "")
    )
    if m is not None and r is not None and r > m:
        error.diagnosis = "too-large"
        error.advice.append("split the work (fewer tiles per call, shorter clips); one request exceeds the limit")
    elif m is not None and a is not None and o is not None and r is not None and a + o + r > m:
        error.diagnosis = "limit"
        error.explanation.append(
            f"{_fmt(a)} + {_fmt(o)} + {_fmt(r)} exceeds the high watermark {_fmt(m)} "
            "(PYTORCH_MPS_HIGH_WATERMARK_RATIO times the recommended working set)"
        )
        error.advice.append("lower the peak (streaming decode, fewer tiles per call, fp16 weights); raising "
                            "PYTORCH_MPS_HIGH_WATERMARK_RATIO risks swapping the whole system")
    else:
        error.diagnosis = "shortage"
        error.explanation.append("Metal could not allocate the buffer: unified memory is exhausted or too fragmented")
        error.advice.append("close other apps using unified memory, or lower the peak (streaming decode, uint8 sink)")
    if m is None:
        error.explanation.append("no high watermark in the message: the limit is disabled (ratio 0.0)")
    return error


def _host_advice(error: OomError, requested: int) -> None:
    if requested >= ABSURD_REQUEST_BYTES:
        error.diagnosis = "size-bug"
        error.explanation.append(f"{_fmt(requested)} in one allocation is not real data: a shape or size overflowed")
        error.advice.append("check the shape of the tensor being allocated")
        return
    error.diagnosis = "shortage"
    frames = requested / H3_FRAME_F32_BYTES
    error.explanation.append(
        f"host RAM: one allocation of {_fmt(requested)} ({requested:,} bytes) failed; that is "
        f"{frames:,.0f} float32 RGB frames at 1344x768"
    )
    if requested >= GiB:
        error.advice.append("keep whole videos out of float32 RAM: decode into a uint8 or memmap sink, or straight "
                            "to a video file (`h3director decode --out frames.npy | video.mp4`, or the decode node's "
                            "video_file output)")
    error.advice.append("check host memory with `h3director monitor -- <command>`; close other memory-heavy processes")


def _from_cpu(match: re.Match[str], line: int) -> OomError:
    requested = int(match.group("requested"))
    error = OomError(kind="cpu", line=line, text=match.group(0), device="cpu", requested_bytes=requested)
    _host_advice(error, requested)
    if match.group("errno"):
        error.explanation.append(f"posix_memalign failed with error {match.group('errno')} ({match.group('reason')})")
    return error


def _from_numpy(match: re.Match[str], line: int) -> OomError:
    requested = parse_size_text(match.group("requested"))
    error = OomError(kind="numpy", line=line, text=match.group(0), device="cpu", requested_bytes=requested)
    _host_advice(error, requested)
    error.explanation.append(f"numpy array of shape {match.group('shape')} and dtype {match.group('dtype')}")
    return error


def _from_cuda_runtime(match: re.Match[str], line: int) -> OomError:
    error = OomError(kind="cuda-runtime", line=line, text=match.group(0), device="cuda", diagnosis="unknown")
    error.explanation.append(
        "a CUDA call outside PyTorch's caching allocator ran out of memory (creating a context, a cuBLAS/cuDNN "
        "workspace, a library's own cudaMalloc); the message carries no sizes"
    )
    error.advice.append("leave headroom outside the allocator: a lower memory_safety.max_gpu_memory_mb than the card's "
                        "size, or fewer processes on the GPU")
    return error


_PARSERS = (
    (_CUDA, _from_cuda),
    (_CUDA_LEGACY, _from_cuda_legacy),
    (_CUDA_ASYNC, _from_cuda_async),
    (_MPS, _from_mps),
    (_CPU, _from_cpu),
    (_NUMPY, _from_numpy),
    (_CUDA_RUNTIME, _from_cuda_runtime),
)

# ----------------------------------------------------------------------------------------------- log context

_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>[\w<>]+)')
_TRACEBACK_START = "Traceback (most recent call last):"
#: Source files whose frames place an error in a phase (innermost match wins; ComfyUI and this pack).
PHASE_FILES = (
    ("decode", ("comfy/ldm/minimax/vae.py", "comfy/ldm/minimax/audio_vae.py", "h3director/video/",
                "h3director/integrations/comfy_vae.py", "h3director/comfy/nodes_decode.py")),
    ("sampling", ("comfy/ldm/minimax/model.py", "comfy/k_diffusion/", "comfy/samplers.py", "comfy/sample.py",
                  "h3director/dit/", "h3director/integrations/comfy_dit.py", "h3director/integrations/comfy_gguf.py",
                  "h3director/comfy/nodes_guard.py")),
    ("text_encoding", ("comfy/text_encoders/", "comfy/sd1_clip.py")),
)
#: (file name, function) of a node's entry point as ComfyUI's executor calls it -> the node class(es).
NODE_FUNCTIONS = {
    ("nodes.py", "sample"): "KSampler or KSamplerAdvanced",
    ("nodes.py", "decode"): "VAEDecode or VAEDecodeTiled",
    ("nodes.py", "encode"): "CLIPTextEncode",
    ("nodes_custom_sampler.py", "sample"): "SamplerCustom",
    ("nodes_custom_sampler.py", "execute"): "SamplerCustomAdvanced",
    ("nodes_decode.py", "execute"): "H3DirectorDecodeAVStreaming",
    ("nodes_upscale.py", "execute"): "H3DirectorUpscaleStreaming",
    ("nodes_stitch.py", "execute"): "H3DirectorStitch",
    ("nodes_textcache.py", "execute"): "H3DirectorCachedTextEncode",
}
_NODE_TYPE = re.compile(r"""["']node_type["']\s*:\s*["'](?P<type>[\w.-]+)["']""")
_NODE_ID = re.compile(r"""["']node_id["']\s*:\s*["'](?P<id>[\w:.-]+)["']""")
_GEOMETRY_TEXT = re.compile(r"(?P<w>\d{2,4})\s*x\s*(?P<h>\d{2,4})\s*[,;]?\s*(?:\(|at\s+)?(?P<f>\d{1,5})\s+frames")
_GEOMETRY_JSON = re.compile(r"""["']width["']\s*:\s*(?P<w>\d+)\s*,\s*["']height["']\s*:\s*(?P<h>\d+)\s*,"""
                            r"""\s*["'](?:length|frames)["']\s*:\s*(?P<f>\d+)""")
# An H3 video latent [B, 24, T, h, w] as torch prints a shape: frames from T, pixels from h, w (x16)
_H3_LATENT = re.compile(r"(?:torch\.Size\(\[|shape\s*[=:]?\s*[\[(])\s*\d+,\s*24,\s*(?P<t>\d+),\s*(?P<h>\d+),\s*(?P<w>\d+)\s*[\])]")


def _traceback_before(text: str, offset: int) -> str:
    """The traceback that ends at `offset` (from the last "Traceback (most recent call last):" before it), or ""
    when the error is not the end of a traceback (its last frame must be within a few lines: the frame's source
    line and the exception's name), so an earlier, unrelated traceback is never read."""
    start = text.rfind(_TRACEBACK_START, 0, offset)
    if start < 0:
        return ""
    tb = text[start:offset]
    frames = list(_FRAME.finditer(tb))
    if not frames or tb.count("\n", frames[-1].end()) > 3:
        return ""
    return tb


def log_context(text: str, offset: int) -> dict[str, Any]:
    """What the log says around the error at `offset`: {"phase", "node", "node_id", "geometry", "evidence"}
    (None / empty where it says nothing). `phase` from the innermost traceback frame in `PHASE_FILES`; `node`
    from a ``"node_type"`` in ComfyUI's error report near the error, else the frame ComfyUI's executor called
    (`NODE_FUNCTIONS`, outermost frame after execution.py); `geometry` {"width", "height", "frames"} from
    "WxH, N frames", a prompt's "width"/"height"/"length" inputs, or an H3 latent shape [B, 24, T, h, w]
    (`geometry.frames_for_latents`: 5n+2 -> 17n+5), the last one stated before the error."""
    tb = _traceback_before(text, offset)
    frames = [(m.group("path").replace("\\", "/"), m.group("func")) for m in _FRAME.finditer(tb)]
    found: dict[str, Any] = {"phase": None, "node": None, "node_id": None, "geometry": None, "evidence": []}
    for path, func in reversed(frames):
        phase = next((name for name, files in PHASE_FILES if any(f in path for f in files)), None)
        if phase:
            found["phase"] = phase
            found["evidence"].append(f"traceback frame {path.rsplit('/', 1)[-1]} in {func}")
            break
    after_executor = False
    for path, func in frames:
        name = path.rsplit("/", 1)[-1]
        if name == "execution.py":
            after_executor = True
            continue
        if after_executor and (name, func) in NODE_FUNCTIONS:
            found["node"] = NODE_FUNCTIONS[(name, func)]
            break
    near = text[max(0, offset - 20_000):offset + 20_000]
    node_type = list(_NODE_TYPE.finditer(near))
    if node_type:
        found["node"] = node_type[-1].group("type")
        node_id = list(_NODE_ID.finditer(near))
        found["node_id"] = node_id[-1].group("id") if node_id else None
    candidates = []
    for pattern in (_GEOMETRY_TEXT, _GEOMETRY_JSON):
        candidates += [(m.start(), int(m.group("w")), int(m.group("h")), int(m.group("f")))
                       for m in pattern.finditer(text, 0, offset)]
    for m in _H3_LATENT.finditer(text, 0, offset):
        t = int(m.group("t"))
        if t >= 2 and (t - 2) % 5 == 0:
            candidates.append((m.start(), SPATIAL_RATIO * int(m.group("w")), SPATIAL_RATIO * int(m.group("h")),
                               frames_for_latents(t)))
    if candidates:
        _, w, h, f = max(candidates)
        found["geometry"] = {"width": w, "height": h, "frames": f}
    return found


#: Largest log read (characters); a longer log is read from its end, where the error usually is.
MAX_LOG_CHARS = 64 * 1024 * 1024


def explain_log(text: str, *, dedupe: bool = True) -> list[OomError | NotUnderstood]:
    """Every out-of-memory error in ``text``, in order, plus the OOM-like lines nothing matched.

    With ``dedupe`` an identical message repeated (a traceback printed twice, a re-raised error)
    is reported once, at its first line.
    """
    line_starts = [0] + [newline.end() for newline in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_right(line_starts, offset)  # 1-based: the number of lines starting at or before it

    found: list[tuple[int, int, OomError]] = []
    for pattern, build in _PARSERS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(s <= start < e for s, e, _ in found):
                continue  # already explained by a more specific format (e.g. "CUDA error" inside a longer text)
            item = build(match, line_of(start))
            context = log_context(text, start)
            item.phase, item.node, item.node_id, item.geometry = (context["phase"], context["node"],
                                                                  context["node_id"], context["geometry"])
            found.append((start, end, item))
    covered_lines = set()
    for start, end, _ in found:
        covered_lines.update(range(line_of(start), line_of(max(end - 1, start)) + 1))
    unknown = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number not in covered_lines and _OOM_HINT.search(line) and not (found and _FOLLOW_UPS.search(line)):
            unknown.append(NotUnderstood(number, line.strip()))

    results: list[OomError | NotUnderstood] = [item for _, _, item in sorted(found, key=lambda x: x[0])]
    if dedupe:
        seen: dict[str, OomError] = {}
        unique = []
        for item in results:
            key = " ".join(item.text.split())
            if key not in seen:
                seen[key] = item
                unique.append(item)
                continue
            kept = seen[key]          # ComfyUI logs the message, then the traceback that ends in it: keep both's context
            for name in ("phase", "node", "node_id", "geometry"):
                if getattr(kept, name) is None:
                    setattr(kept, name, getattr(item, name))
        results = unique
    return sorted(results + unknown, key=lambda item: item.line)


def format_explanations(items: list[OomError | NotUnderstood]) -> str:
    """`explain_log`'s `items` as text for a person: one block per error or not-understood line, or "no
    out-of-memory errors found" for none."""
    if not items:
        return "no out-of-memory errors found"
    blocks = []
    for item in items:
        if isinstance(item, NotUnderstood):
            blocks.append(f"line {item.line}: not understood (mentions memory, but in no format this tool knows):\n"
                          f"  {item.text[:300]}")
            continue
        lines = [f"line {item.line}: {item.kind} out of memory on {item.device or '?'} -> {item.diagnosis}"]
        if item.phase or item.node:
            where = [f"phase {item.phase}"] if item.phase else []
            if item.node:
                where.append(f"node {item.node}" + (f" (id {item.node_id})" if item.node_id else ""))
            lines.append("  in " + ", ".join(where))
        lines += [f"  - {text}" for text in item.explanation]
        lines += [f"  advice: {text}" for text in item.advice]
        if item.steps:
            lines.append("  the five steps, in the planner's order (take the first one not done yet):")
            lines += [f"    {text}" for text in item.steps]
        blocks.append("\n".join(lines))
    understood = sum(isinstance(item, OomError) for item in items)
    blocks.append(f"{understood} out-of-memory error(s) explained, {len(items) - understood} line(s) not understood")
    return "\n\n".join(blocks)


__all__ = ["CUDA_ERROR_MEMORY_ALLOCATION", "MAX_LOG_CHARS", "NotUnderstood", "OomError", "explain_log",
           "format_explanations", "is_out_of_memory", "mentions_out_of_memory", "parse_size_text"]
