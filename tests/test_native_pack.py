"""pack_frames: byte-identical to the PyTorch reference expression, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from native_helpers import backend_params

from h3director import native
from h3director.errors import InvalidInputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -0.0, 0.0, 1e-42]


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


def reference(x: torch.Tensor, layout: str, mean=None, std=None) -> np.ndarray:
    """The expression the contract names, then permuted to [F, H, W, C]."""
    cfhw = x if layout == "CFHW" else x.permute(1, 0, 2, 3)
    if mean is None:
        y = (((cfhw.float() + 1) / 2).clamp(0, 1) * 255).round().to(torch.uint8)
    else:
        m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1, 1)
        y = ((cfhw.float() * s + m).clamp(0, 1) * 255).round().to(torch.uint8)
    return y.permute(1, 2, 3, 0).contiguous().numpy()


def _video(shape, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    flat = x.view(-1)
    flat[: len(SPECIALS)] = torch.tensor(SPECIALS, dtype=torch.float32)
    flat[-len(SPECIALS):] = torch.tensor(SPECIALS, dtype=torch.float32)
    return x


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["CFHW", "FCHW"]
AFFINES = ["imagenet", "plus_one_half"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("affine", AFFINES)
def test_matches_torch_expression(backend, dtype, layout, affine):
    shape = (3, 5, 9, 37) if layout == "CFHW" else (5, 3, 9, 37)
    # A fixed seed per case (hash() of a string changes with every process's PYTHONHASHSEED).
    seed = (DTYPES.index(dtype) * len(LAYOUTS) + LAYOUTS.index(layout)) * len(AFFINES) + AFFINES.index(affine)
    x = _video(shape, seed=seed).to(dtype)
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if affine == "imagenet" else (None, None)
    got = native.pack_frames(x, layout=layout, mean=mean, std=std, backend=backend)
    assert got.dtype == np.uint8 and got.shape == (5, 9, 37, 3)
    np.testing.assert_array_equal(got, reference(x, layout, mean, std))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_16_bit_value_matches_torch(backend, dtype):
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).reshape(1, 1, 256, 256)
    for mean, std in ((0.0, 1.0), (None, None), (0.25, 3.0)):
        m = None if mean is None else (mean,)
        s = None if std is None else (std,)
        got = native.pack_frames(x, mean=m, std=s, backend=backend)
        np.testing.assert_array_equal(got, reference(x, "CFHW", m, s))


def test_ties_round_half_to_even(backend):
    # Inputs whose float32 product with 255 lands exactly on k + 0.5.
    candidates = np.float32((np.arange(255) + 0.5) / 255)
    nudged = np.concatenate([candidates + np.float32(d) * np.spacing(candidates) for d in range(-3, 4)])
    ties = nudged[(nudged * np.float32(255)) % 1 == 0.5]
    assert ties.size > 50
    x = torch.from_numpy(ties.astype(np.float32)).reshape(1, 1, 1, -1)
    got = native.pack_frames(x, mean=(0.0,), std=(1.0,), backend=backend)
    want = reference(x, "CFHW", (0.0,), (1.0,))
    np.testing.assert_array_equal(got, want)
    assert (got.reshape(-1) % 2 == 0).all()  # every tie went to the even neighbour


def test_nan_maps_to_zero_and_infinities_saturate(backend):
    x = torch.tensor([np.nan, -np.nan, np.inf, -np.inf], dtype=torch.float32).reshape(1, 1, 1, 4)
    got = native.pack_frames(x, mean=(0.5,), std=(0.5,), backend=backend)
    assert got.reshape(-1).tolist() == [0, 0, 255, 0]
    np.testing.assert_array_equal(got, reference(x, "CFHW", (0.5,), (0.5,)))


def test_strided_views_numpy_inputs_and_threads(backend):
    base = _video((2, 3, 6, 10, 24), seed=7)
    views = {
        "batch item": base[1],
        "every other column": base[0, :, :, :, ::2],
        "transposed hw": base[0].transpose(2, 3),
    }
    for name, view in views.items():
        for threads in (1, 3):
            got = native.pack_frames(view, threads=threads, backend=backend)
            np.testing.assert_array_equal(got, reference(view, "CFHW"), err_msg=name)
    arr = base[0].numpy()[:, ::-1, :, ::-1]  # negative strides
    got = native.pack_frames(arr, mean=IMAGENET_MEAN, std=IMAGENET_STD, backend=backend)
    np.testing.assert_array_equal(got, reference(torch.from_numpy(arr.copy()), "CFHW", IMAGENET_MEAN, IMAGENET_STD))
    swapped = base[0].numpy().astype(">f4")  # big-endian input is converted, not misread
    np.testing.assert_array_equal(native.pack_frames(swapped, backend=backend), reference(base[0], "CFHW"))
    with np.errstate(over="ignore"):
        half = base[0].numpy().astype(np.float16)
    np.testing.assert_array_equal(native.pack_frames(half, backend=backend), reference(torch.from_numpy(half), "CFHW"))


def test_channel_counts_other_than_three(backend):
    for channels in (1, 2, 4, 7):
        x = _video((channels, 2, 3, 5), seed=channels)
        np.testing.assert_array_equal(native.pack_frames(x, backend=backend), reference(x, "CFHW"))


def test_fills_out_arrays_and_tensors(backend):
    x = _video((3, 2, 4, 6), seed=1)
    want = reference(x, "CFHW")
    out = np.full((2, 4, 6, 3), 7, np.uint8)
    assert native.pack_frames(x, out=out, backend=backend) is out
    np.testing.assert_array_equal(out, want)
    out_t = torch.zeros((2, 4, 6, 3), dtype=torch.uint8)
    assert native.pack_frames(x, out=out_t, backend=backend) is out_t
    np.testing.assert_array_equal(out_t.numpy(), want)


def test_input_is_not_modified(backend):
    x = _video((3, 2, 4, 6), seed=2)
    before = x.clone()
    native.pack_frames(x, backend=backend)
    assert torch.equal(x.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize(
    "x, kwargs, error, message",
    [
        (torch.zeros(3, 2, 4), {}, InvalidInputError, "4-D"),
        (torch.zeros(3, 2, 4, 4, dtype=torch.int32), {}, InvalidInputError, "float32, float16 or bfloat16"),
        (np.zeros((3, 2, 4, 4), np.float64), {}, InvalidInputError, "float32, float16 or bfloat16"),
        (torch.zeros(3, 2, 4, 4), {"layout": "HWC"}, InvalidInputError, "layout"),
        (torch.zeros(3, 2, 4, 4), {"mean": (0.1, 0.2)}, InvalidInputError, "both mean and std"),
        (torch.zeros(3, 2, 4, 4), {"mean": (0.1, 0.2), "std": (1, 1)}, InvalidInputError, "one per channel"),
        (torch.zeros(3, 2, 4, 4), {"threads": 0}, InvalidInputError, "threads"),
        (torch.zeros(3, 2, 4, 4), {"out": np.zeros((2, 4, 4, 4), np.uint8)}, InvalidInputError, "expected"),
        (torch.zeros(3, 2, 4, 4), {"out": np.zeros((2, 4, 4, 3), np.float32)}, InvalidInputError, "dtype"),
        ([[1.0]], {}, TypeError, "numpy array or a torch tensor"),
    ],
)
def test_bad_arguments_raise(backend, x, kwargs, error, message):
    with pytest.raises(error, match=message):
        native.pack_frames(x, backend=backend, **kwargs)


def test_empty_video(backend):
    assert native.pack_frames(torch.zeros(3, 0, 4, 4), backend=backend).shape == (0, 4, 4, 3)
