"""Shared test fixtures: tiny random targets of several families, and drafters with controllable quality."""

from __future__ import annotations

import os

import pytest
import torch

# No GPU here: run the Triton tree-attention kernel in Triton's interpreter. Triton fixes the mode when first
# imported (transformers imports it below), so this must come first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny models: one thread is fastest (OpenMP spin-waiting on 2 busy cores made them 30x slower).
torch.set_num_threads(1)

from helpers import TARGET_FAMILIES, make_target  # noqa: E402


@pytest.fixture(params=TARGET_FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture
def tiny_target(family):
    return make_target(family, seed=0)
