"""Out-of-memory recovery: an OOM on any clip is retried alone, the output stays bit-identical."""

import pytest
import torch
from decode_helpers import CollectingSink, h3_reference, single_thread  # noqa: F401 - fixture
from oom_injection import OomOnClip

from h3director.integrations.diffusers_h3 import H3VideoAdapter
from h3director.integrations.diffusers_wan import WanVideoAdapter
from h3director.video.decoder import ClipExecution
from h3director.video.faults import STAGE_MID, STAGE_START, is_out_of_memory
from h3director.video.scheduler import DecodeOutOfMemory, stream_decode

pytestmark = pytest.mark.usefixtures("single_thread")

LATENT_FRAMES = 17   # 3 clips


@pytest.fixture(scope="module")
def small_h3(tiny_h3):
    tiny_h3.enable_tiling(64, 64, 16, 16)
    yield tiny_h3
    tiny_h3.enable_tiling(256, 256, 64, 64)


@pytest.fixture(scope="module")
def latents():
    return torch.randn(1, 24, LATENT_FRAMES, 6, 7, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def expected(small_h3, latents):
    return h3_reference(small_h3, latents)


def run(adapter, z, injector, **kwargs):
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(adapter, z, sink, fault_injector=injector, **kwargs)
    return report, sink


@pytest.mark.parametrize("stage", [STAGE_START, STAGE_MID])
@pytest.mark.parametrize("clip", [0, 1, 2])
def test_oom_on_each_clip_is_retried_once(small_h3, latents, expected, clip, stage):
    injector = OomOnClip([clip], stage=stage)
    report, sink = run(H3VideoAdapter(small_h3), latents, injector)
    assert torch.equal(report.result, expected)
    assert len(injector.hits) == 1
    assert [retry.clip for retry in report.retries] == [clip]
    assert report.retries[0].failed == ClipExecution(None) and report.retries[0].retried_with == ClipExecution(1)
    assert "out of memory" in report.retries[0].error
    # frames before the failed clip were written once, before the failure, and never again
    assert [start for start, _ in sink.writes] == [0, 17, 34]


def test_oom_everywhere_fails_cleanly_and_aborts_the_sink(small_h3, latents):
    injector = OomOnClip([1], times=10)
    adapter = H3VideoAdapter(small_h3)
    sink = CollectingSink()
    with pytest.raises(DecodeOutOfMemory, match="clip 1") as failure, torch.no_grad():
        stream_decode(adapter, latents, sink, fault_injector=injector)
    assert sink.aborted and not sink.finished
    assert sink.writes == [(0, 17)]   # clip 0's frames were handed over before the failure
    assert "1 tile(s)/call" in str(failure.value)


def test_oom_retry_off_fails_on_first_oom(small_h3, latents):
    sink = CollectingSink()
    with pytest.raises(DecodeOutOfMemory, match="oom_retry is off"), torch.no_grad():
        stream_decode(H3VideoAdapter(small_h3), latents, sink, fault_injector=OomOnClip([0]), oom_retry=False)
    assert sink.aborted


def test_other_errors_propagate_unchanged(small_h3, latents):
    def broken(point):
        if point.clip == 1:
            raise ValueError("not a memory problem")

    sink = CollectingSink()
    with pytest.raises(ValueError, match="not a memory problem"), torch.no_grad():
        stream_decode(H3VideoAdapter(small_h3), latents, sink, fault_injector=broken)
    assert sink.aborted


@pytest.mark.parametrize("clip", [0, 2, 4])
def test_wan_cache_survives_a_mid_step_oom(tiny_wan, clip):
    """The OOM hits after the decoder already updated its feature cache: the snapshot must be restored."""
    z = torch.randn(1, 4, 5, 5, 6)
    mean = torch.tensor(tiny_wan.config.latents_mean).view(1, -1, 1, 1, 1)
    std = 1.0 / torch.tensor(tiny_wan.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        expected = tiny_wan.decode(z / std + mean).sample
    injector = OomOnClip([clip], stage=STAGE_MID)
    report, _ = run(WanVideoAdapter(tiny_wan), z, injector)
    assert torch.equal(report.result, expected)
    assert [retry.clip for retry in report.retries] == [clip]


def test_is_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(MemoryError())


def test_retry_ladder_on_the_cpu(small_h3):
    adapter = H3VideoAdapter(small_h3)
    assert adapter.cheaper(ClipExecution(None)) == ClipExecution(1)
    assert adapter.cheaper(ClipExecution(3)) == ClipExecution(1)
    assert adapter.cheaper(ClipExecution(1)) is None   # already on the CPU: nothing cheaper


def test_bottom_of_the_ladder_retries_the_same_execution_once(small_h3, latents, expected):
    injector = OomOnClip([2])
    report, _ = run(H3VideoAdapter(small_h3), latents, injector, tiles_per_call=1)
    assert torch.equal(report.result, expected)
    assert [(r.clip, r.failed, r.retried_with) for r in report.retries] == [(2, ClipExecution(1), ClipExecution(1))]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_decode_and_cpu_fallback(small_h3):
    vae = small_h3.to("cuda")
    try:
        z = torch.randn(1, 24, 12, 6, 7, device="cuda")
        mean = torch.tensor(vae.config.latents_mean, device="cuda").view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device="cuda").view(1, -1, 1, 1, 1)
        with torch.no_grad():
            expected = vae.decode(z * std + mean).sample
        report, _ = run(H3VideoAdapter(vae), z, None)
        assert torch.equal(report.result, expected.cpu()) and report.peak_bytes > 0
        # two OOMs on clip 1: streamed tiles, then the CPU; the decoder is moved back afterwards
        report, _ = run(H3VideoAdapter(vae), z, OomOnClip([1], times=2))
        assert [r.retried_with.device for r in report.retries] == [None, "cpu"]
        torch.testing.assert_close(report.result, expected.cpu(), rtol=0, atol=1e-4)
        assert vae.decoder.proj_out.weight.device.type == "cuda"
    finally:
        small_h3.to("cpu")


def test_resumed_job_decodes_only_the_unfinished_clips(small_h3, latents, tmp_path):
    """A job killed during clip 2 resumes from the memmap's progress: clip 1 again (only for the tail
    clip 2 is cross-faded with), then clip 2; the file equals an uninterrupted run."""
    import numpy as np

    from h3director.video.sinks import MemmapSink

    adapter = H3VideoAdapter(small_h3)

    def killed(point):
        if point.clip == 2:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        stream_decode(adapter, latents, MemmapSink(tmp_path / "v.npy", resume=True, job="j"), fault_injector=killed)
    assert not (tmp_path / "v.npy").exists()

    started = []
    with torch.no_grad():
        report = stream_decode(adapter, latents, MemmapSink(tmp_path / "v.npy", resume=True, job="j"),
                               fault_injector=lambda point: started.append((point.clip, point.stage)))
        stream_decode(adapter, latents, MemmapSink(tmp_path / "full.npy"))
    assert report.resumed_frames == 34 and report.clips_decoded == 2
    assert [clip for clip, stage in started if stage == STAGE_START] == [1, 2]
    assert np.array_equal(np.load(tmp_path / "v.npy"), np.load(tmp_path / "full.npy"))


def test_accelerator_allocation_failures_count_as_out_of_memory():
    # cudaMallocAsync reports allocation failures as torch.AcceleratorError with CUDA's error code 2
    from h3director.video.faults import is_out_of_memory

    allocation = torch.AcceleratorError("CUDA error: an allocation failed")
    allocation.error_code = 2
    other = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    other.error_code = 700
    assert is_out_of_memory(allocation)
    assert not is_out_of_memory(other)
    assert not is_out_of_memory(ValueError("out of memory"))


class _FirstCallAllocatesTooMuch(H3VideoAdapter):
    """The real H3 adapter whose first clip attempt makes a real host allocation that fails (4 PiB)."""

    def __init__(self, vae):
        super().__init__(vae)
        self.attempts = []

    def open(self, latents, *, denormalize=True):
        session = super().open(latents, denormalize=denormalize)
        decode_clip = session.decode_clip

        def hungry(clip, execution, checkpoint=None):
            self.attempts.append((clip.index, execution))
            if len(self.attempts) == 1:
                torch.empty(2**50)  # DefaultCPUAllocator: can't allocate memory
            return decode_clip(clip, execution, checkpoint)

        session.decode_clip = hungry
        return session


def test_a_real_cpu_allocation_failure_is_retried(small_h3, latents, expected):
    adapter = _FirstCallAllocatesTooMuch(small_h3)
    report, _ = run(adapter, latents, None)
    assert torch.equal(report.result, expected)
    assert [retry.clip for retry in report.retries] == [0]
    assert "DefaultCPUAllocator" in report.retries[0].error
    assert adapter.attempts[:2] == [(0, ClipExecution(None)), (0, ClipExecution(1))]


def test_the_retry_frees_caches_through_the_one_core_helper(monkeypatch, small_h3, latents, expected):
    from h3director.video import scheduler

    freed = []
    monkeypatch.setattr(scheduler, "free_caches", freed.append)
    report, _ = run(H3VideoAdapter(small_h3), latents, OomOnClip([1]))
    assert torch.equal(report.result, expected)
    assert freed == [torch.device("cpu")]
