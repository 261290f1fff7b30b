"""The OOM parser on messages built exactly as PyTorch builds them, with realistic numbers.

The builders below follow the argument order of the TORCH_CHECK calls in PyTorch's
c10/cuda/CUDACachingAllocator.cpp (current and pre-2.1 wording), c10/cuda/CUDAMallocAsyncAllocator.cpp,
aten/src/ATen/mps/MPSAllocator.mm and c10/core/impl/alloc_cpu.cpp, and its two format_size
functions (CUDA: KiB/MiB/GiB; MPS: KB/MB/GB, both powers of 1024, two decimals).
"""

from __future__ import annotations

import pytest

from h3director.core.oom import NotUnderstood, OomError, explain_log, format_explanations, parse_size_text
from h3director.units import GiB, KiB, MiB


def torch_format_size(size: int, units: tuple[str, str, str] = ("KiB", "MiB", "GiB")) -> str:
    """PyTorch's format_size: bytes up to 1024, then two decimals of KiB/MiB/GiB (MPS spells them KB/MB/GB)."""
    if size <= 1024:
        return f"{size} bytes"
    for power, unit in enumerate(units, start=1):
        if size <= 1024 ** (power + 1) or unit == units[-1]:
            return f"{size / 1024.0**power:.2f} {unit}"
    raise AssertionError("unreachable")


def cuda_format_size(size: int) -> str:
    return torch_format_size(size)


def mps_format_size(size: int) -> str:
    return torch_format_size(size, ("KB", "MB", "GB"))


NEW_TAIL = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
            " to avoid fragmentation.  See documentation for Memory Management "
            " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
OLD_TAIL = (" If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  "
            "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def cuda_oom(requested, total, free, allocated, unallocated, *, gpu=0, processes=(), allowed=None, private=0,
             prefix="CUDA out of memory", capacity="capacity", tail=NEW_TAIL) -> str:
    """PyTorch >= 2.1 wording. ``processes``: (pid or None for this process, bytes) as NVML lists them."""
    proc_info = "".join(
        ("Including non-PyTorch memory, this process" if pid is None else f"Process {pid}")
        + f" has {cuda_format_size(used)} memory in use. "
        for pid, used in processes
    )
    allowed_info = f"{cuda_format_size(allowed)} allowed; " if allowed is not None else ""
    private_msg = f"with {cuda_format_size(private)} allocated in private pools (e.g., CUDA Graphs), " if private else ""
    return (f"{prefix}. Tried to allocate {cuda_format_size(requested)}. GPU {gpu} has a total {capacity} of "
            f"{cuda_format_size(total)} of which {cuda_format_size(free)} is free. {proc_info}{allowed_info}"
            f"Of the allocated memory {cuda_format_size(allocated + private)} is allocated by PyTorch, {private_msg}"
            f"and {cuda_format_size(unallocated)} is reserved by PyTorch but unallocated.{tail}")


def cuda_oom_legacy(requested, total, allocated, free, reserved, *, gpu=0, allowed=None, cached=False) -> str:
    """PyTorch 1.6-2.0 wording ("reserved in total by PyTorch"); ``cached=True`` for the pre-1.6 form."""
    allowed_info = f"{cuda_format_size(allowed)} allowed; " if allowed is not None else ""
    held = f"{cuda_format_size(reserved)} cached)" if cached else f"{cuda_format_size(reserved)} reserved in total by PyTorch)"
    return (f"CUDA out of memory. Tried to allocate {cuda_format_size(requested)} (GPU {gpu}; "
            f"{cuda_format_size(total)} total capacity; {cuda_format_size(allocated)} already allocated; "
            f"{cuda_format_size(free)} free; {allowed_info}{held}{'' if cached else OLD_TAIL}")


def cuda_async_oom(allocated, requested, total, free, limit, *, gpu=0) -> str:
    return (f"Allocation on device {gpu} would exceed allowed memory. (out of memory)"
            f"\nCurrently allocated     : {cuda_format_size(allocated)}"
            f"\nRequested               : {cuda_format_size(requested)}"
            f"\nDevice limit            : {cuda_format_size(total)}"
            f"\nFree (according to CUDA): {cuda_format_size(free)}"
            f"\nPyTorch limit (set by user-supplied memory fraction)"
            f"\n                        : {cuda_format_size(limit)}")


def mps_oom(allocated, other, requested, *, max_allowed=None, pool="private") -> str:
    if max_allowed is not None:
        return (f"MPS backend out of memory (MPS allocated: {mps_format_size(allocated)}, other allocations: "
                f"{mps_format_size(other)}, max allowed: {mps_format_size(max_allowed)}). Tried to allocate "
                f"{mps_format_size(requested)} on {pool} pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable "
                "upper limit for memory allocations (may cause system failure).")
    return (f"MPS backend out of memory (MPS allocated: {mps_format_size(allocated)}, other allocations: "
            f"{mps_format_size(other)}). Tried to allocate {mps_format_size(requested)} on {pool} pool.")


def cpu_oom_posix(nbytes: int, line: int = 127) -> str:
    return (f"[enforce fail at alloc_cpu.cpp:{line}] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
            f"to allocate {nbytes} bytes. Error code 12 (Cannot allocate memory)")


def cpu_oom_windows(nbytes: int) -> str:
    return (f"[enforce fail at C:\\actions-runner\\_work\\pytorch\\pytorch\\c10\\core\\impl\\alloc_cpu.cpp:114] data. "
            f"DefaultCPUAllocator: not enough memory: you tried to allocate {nbytes} bytes.")


def only(text: str) -> OomError:
    items = explain_log(text)
    assert len(items) == 1, items
    assert isinstance(items[0], OomError), items[0]
    return items[0]


def close(parsed: int | None, actual: int) -> bool:
    """Equal up to format_size's two-decimal rounding (half a unit in the last place)."""
    unit = 1 if actual <= 1024 else KiB if actual <= MiB else MiB if actual <= GiB else GiB
    return parsed is not None and abs(parsed - actual) <= 0.005 * unit + 1


def test_sizes_parse_in_both_unit_spellings():
    for size in (512, 3 * KiB + 7, 123_456_789, 17 * GiB + 12345):
        assert close(parse_size_text(cuda_format_size(size)), size)
        assert close(parse_size_text(mps_format_size(size)), size)
    with pytest.raises(ValueError):
        parse_size_text("12 parsecs")


def test_cuda_fragmentation_is_recognised_and_numbers_are_read():
    numbers = dict(requested=2 * GiB, total=int(23.64 * GiB), free=int(1.1 * GiB), allocated=int(17.9 * GiB),
                   unallocated=int(4.2 * GiB))
    text = "Traceback ...\ntorch.OutOfMemoryError: " + cuda_oom(
        **numbers, processes=[(None, int(22.4 * GiB))]) + "\n"
    error = only(text)
    assert (error.kind, error.device, error.line, error.diagnosis) == ("cuda", "cuda:0", 2, "fragmentation")
    assert close(error.requested_bytes, numbers["requested"])
    assert close(error.total_bytes, numbers["total"])
    assert close(error.free_bytes, numbers["free"])
    assert close(error.allocated_bytes, numbers["allocated"])
    assert close(error.reserved_unallocated_bytes, numbers["unallocated"])
    assert close(error.this_process_bytes, int(22.4 * GiB))
    assert error.other_processes == {}
    assert any("expandable_segments:True" in advice for advice in error.advice)


def test_cuda_other_processes_are_named():
    text = cuda_oom(3 * GiB, int(23.64 * GiB), 512 * MiB, 13 * GiB, 200 * MiB, gpu=1,
                    processes=[(4321, 9 * GiB), (None, int(13.6 * GiB))])
    error = only(text)
    assert error.device == "cuda:1"
    assert error.diagnosis == "other-processes"
    assert list(error.other_processes) == [4321] and close(error.other_processes[4321], 9 * GiB)
    assert any("PID 4321" in line for line in error.explanation)


def test_cuda_real_shortage_and_tight_and_too_large():
    shortage = only(cuda_oom(6 * GiB, int(15.7 * GiB), 300 * MiB, int(14.9 * GiB), 100 * MiB))
    assert shortage.diagnosis == "shortage"
    assert any("real shortage" in line for line in shortage.explanation)
    tight = only(cuda_oom(1 * GiB, int(15.7 * GiB), 600 * MiB, int(14.2 * GiB), 700 * MiB))
    assert tight.diagnosis == "tight"
    huge = only(cuda_oom(40 * GiB, int(23.64 * GiB), 20 * GiB, 2 * GiB, 10 * MiB))
    assert huge.diagnosis == "too-large"


def test_cuda_private_pools_and_memory_fraction():
    text = cuda_oom(2 * GiB, int(79.1 * GiB), 60 * GiB, int(10.5 * GiB), 50 * MiB, private=1 * GiB,
                    allowed=12 * GiB, processes=[(None, 13 * GiB)])
    error = only(text)
    assert close(error.allocated_bytes, int(11.5 * GiB))  # PyTorch counts private pools in "allocated"
    assert close(error.limit_bytes, 12 * GiB)
    assert error.diagnosis == "limit"


def test_rocm_and_pytorch_2_1_spelling():
    text = cuda_oom(448 * MiB, int(79.1 * GiB), 364 * MiB, int(72.1 * GiB), int(3.8 * GiB),
                    prefix="HIP out of memory", capacity="capacty", tail=OLD_TAIL)
    error = only(text)
    assert error.kind == "cuda" and error.diagnosis == "fragmentation"
    generic = only(cuda_oom(1 * GiB, 16 * GiB, 10 * MiB, 15 * GiB, 20 * MiB, prefix="Out of memory"))
    assert generic.diagnosis == "shortage"


def test_cuda_legacy_wordings():
    error = only("RuntimeError: " + cuda_oom_legacy(20 * MiB, int(15.9 * GiB), int(14.97 * GiB), int(13.75 * MiB),
                                                     int(15.12 * GiB)))
    assert error.kind == "cuda-legacy"
    # reserved - allocated, each rounded to 0.01 GiB by PyTorch
    assert abs(error.reserved_unallocated_bytes - (int(15.12 * GiB) - int(14.97 * GiB))) <= 0.01 * GiB
    assert error.diagnosis == "fragmentation"
    assert any("max_split_size_mb" in advice for advice in error.advice)
    old = only(cuda_oom_legacy(12 * MiB, int(10.92 * GiB), int(8.57 * GiB), int(9.28 * MiB), int(1.9 * GiB), cached=True))
    assert close(old.reserved_unallocated_bytes, int(1.9 * GiB))
    fraction = only(cuda_oom_legacy(2 * GiB, 24 * GiB, 9 * GiB, 12 * GiB, int(9.5 * GiB), allowed=10 * GiB))
    assert close(fraction.limit_bytes, 10 * GiB) and fraction.diagnosis == "limit"


def test_cuda_malloc_async_message_over_several_lines():
    text = "torch.OutOfMemoryError: " + cuda_async_oom(int(9.43 * GiB), 640 * MiB, int(11.59 * GiB), int(7.1 * MiB),
                                                       int(11.59 * GiB)) + "\nnext line\n"
    error = only(text)
    assert error.kind == "cuda-async"
    assert close(error.requested_bytes, 640 * MiB) and close(error.allocated_bytes, int(9.43 * GiB))
    assert error.limit_bytes is None  # no fraction set: PyTorch prints the device size as its limit
    assert error.diagnosis == "shortage"
    assert error.reserved_unallocated_bytes is None
    assert any("memory_reserved" in line for line in error.explanation)
    capped = only(cuda_async_oom(7 * GiB, 2 * GiB, 24 * GiB, 15 * GiB, 8 * GiB))
    assert capped.diagnosis == "limit" and close(capped.limit_bytes, 8 * GiB)


def test_mps_with_and_without_watermark():
    limited = only("RuntimeError: " + mps_oom(int(17.59 * GiB), int(388.45 * MiB), 256 * MiB,
                                              max_allowed=int(18.13 * GiB)))
    assert (limited.kind, limited.device, limited.diagnosis) == ("mps", "mps", "limit")
    assert close(limited.allocated_bytes, int(17.59 * GiB))  # "GB" in MPS messages is GiB
    assert close(limited.other_bytes, int(388.45 * MiB))
    assert close(limited.limit_bytes, int(18.13 * GiB))
    unlimited = only(mps_oom(30 * GiB, 2 * GiB, 4 * GiB, pool="shared"))
    assert unlimited.limit_bytes is None and unlimited.diagnosis == "shortage"


def test_cpu_allocator_both_platform_wordings_and_a_size_bug():
    linux = only("RuntimeError: " + cpu_oom_posix(16_414_801_920))
    assert (linux.kind, linux.device, linux.requested_bytes) == ("cpu", "cpu", 16_414_801_920)
    assert linux.diagnosis == "shortage"
    assert any("uint8" in advice for advice in linux.advice)
    assert any("error 12" in line for line in linux.explanation)
    windows = only(cpu_oom_windows(8_589_934_592))
    assert windows.requested_bytes == 8 * GiB
    bug = only(cpu_oom_posix(2**50))
    assert bug.diagnosis == "size-bug"


def test_numpy_and_cuda_runtime_messages():
    array = only("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 14.3 GiB for an array with shape "
                 "(362, 768, 1344, 3) and data type float32")
    assert array.kind == "numpy" and close(array.requested_bytes, int(14.3 * GiB))
    runtime = only("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported")
    assert runtime.kind == "cuda-runtime" and runtime.requested_bytes is None


def test_unknown_or_truncated_text_is_not_understood_never_guessed():
    text = "\n".join([
        "INFO loading model",
        "ERROR: the worker ran out of memory while loading",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",  # cut off by the logger
        cpu_oom_posix(4 * GiB),
    ])
    items = explain_log(text)
    assert [type(item) for item in items] == [NotUnderstood, NotUnderstood, OomError]
    assert [item.line for item in items] == [2, 3, 4]
    assert "not understood" in format_explanations(items)
    assert explain_log("all good, 3 frames decoded\n") == []
    assert format_explanations([]) == "no out-of-memory errors found"


def test_repeated_messages_are_reported_once_and_wrapped_ones_are_read():
    message = cuda_oom(2 * GiB, 24 * GiB, 1 * GiB, 18 * GiB, 3 * GiB)
    items = explain_log(f"{message}\nduring handling...\n{message}\n")
    assert len(items) == 1 and items[0].line == 1
    assert len(explain_log(f"{message}\n{message}\n", dedupe=False)) == 2
    wrapped = message.replace(" of which ", "\n of which ").replace(" is allocated by", "\n    is allocated by")
    assert only(wrapped).diagnosis == "fragmentation"


def test_every_kind_in_one_log_in_order():
    log = "\n".join([
        cuda_oom(2 * GiB, 24 * GiB, 1 * GiB, 18 * GiB, 3 * GiB),
        cuda_oom_legacy(20 * MiB, 16 * GiB, 15 * GiB, 10 * MiB, int(15.1 * GiB)),
        cuda_async_oom(9 * GiB, 1 * GiB, 12 * GiB, 5 * MiB, 12 * GiB),
        mps_oom(10 * GiB, 1 * GiB, 1 * GiB, max_allowed=12 * GiB),
        cpu_oom_windows(1024),
    ])
    kinds = [item.kind for item in explain_log(log)]
    assert kinds == ["cuda", "cuda-legacy", "cuda-async", "mps", "cpu"]
    assert all(item.to_dict()["kind"] for item in explain_log(log))


def _real_cpu_allocation_failure() -> RuntimeError:
    """What torch raises when the host allocator really fails: 4 PiB is beyond any address space."""
    import torch

    try:
        torch.empty(2**50)
    except RuntimeError as error:
        return error
    raise AssertionError("a 4 PiB allocation succeeded")


def test_a_real_cpu_allocation_failure_is_recognised_and_explained():
    from h3director.core.oom import is_out_of_memory

    error = _real_cpu_allocation_failure()
    assert is_out_of_memory(error)
    [found] = explain_log(str(error))
    assert isinstance(found, OomError) and found.kind == "cpu" and found.requested_bytes == 4 * 2**50
    assert found.diagnosis == "size-bug"


def test_the_retry_and_the_parser_agree_on_every_format():
    import torch

    from h3director.core.oom import is_out_of_memory

    messages = [
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1048576 bytes.",
        "MPS backend out of memory (MPS allocated: 1.00 GB, other allocations: 0 bytes). Tried to allocate "
        "2.00 GB on private pool.",
        "CUDA error: out of memory",
        "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated : 1.00 GiB",
    ]
    for message in messages:
        assert explain_log(message), message
        assert is_out_of_memory(RuntimeError(message)), message
    assert is_out_of_memory(torch.OutOfMemoryError(""))  # the type alone says it
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocator's exception type
    assert not is_out_of_memory(MemoryError())  # no message: nothing to read
