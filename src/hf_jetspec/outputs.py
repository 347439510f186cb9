"""What a decoding call returns: `DecodingStats` and `JetSpecGenerateOutput`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

# GenerateDecoderOnlyOutput names its cache field `cache` in transformers >= 5.24, `past_key_values` before.
OUTPUT_CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


@dataclass
class DecodingStats:
    """Per-call statistics. ``accept_lengths[i]``: tokens committed by the i-th target forward after prefill
    (accepted draft tokens + the target's own token), so ``tau`` is tokens per target forward."""

    accept_lengths: list[int] = field(default_factory=list)
    new_tokens: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    target_time: float = 0.0
    total_time: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def target_forwards(self) -> int:
        return len(self.accept_lengths)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def overhead_share(self) -> float:
        """Share of decode-loop time spent outside the target and draft forwards."""
        loop = self.total_time - self.prefill_time
        return max(0.0, loop - self.draft_time - self.target_time) / loop if loop > 0 else 0.0


@dataclass
class JetSpecGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``accept_lengths`` (tokens per target forward, one entry per step) and
    ``stats`` (`DecodingStats`)."""

    accept_lengths: list[int] | None = None
    stats: DecodingStats | None = None


class Timer:
    """Accumulating wall-clock timer; synchronises CUDA so GPU work is attributed to the right phase."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
