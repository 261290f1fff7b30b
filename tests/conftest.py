"""Shared pytest set-up: tests run on the CPU, deterministic, with small thread counts."""

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _seed_torch():
    import torch

    torch.manual_seed(0)
    yield
