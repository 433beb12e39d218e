"""What the training benchmarks share: time a training step and measure its peak memory."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

import torch


def measure_steps(
    step: Callable[[], Any], num_steps: int, device: torch.device
) -> tuple[Any, float, float]:
    """(first step's result, peak bytes above the pre-step baseline, seconds per step).

    One warm-up step (it also allocates the optimizer's fp32 masters and moments, so they
    count), then ``num_steps`` timed ones. Peak memory: on CUDA max_memory_allocated, on CPU
    the process's peak RSS, each minus the same measure just before the first step."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    first = step()
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return first, peak, (time.perf_counter() - start) / num_steps
