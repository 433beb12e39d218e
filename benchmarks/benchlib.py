"""What the training benchmarks share: time a training step and measure its peak memory."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

import torch

from eagle_train.target_model import FrozenTarget

# Random targets of a real model's shape (no download): ``--target llama3-8b``. The
# "-mini" one keeps the architecture at toy size for CPU dry runs.
SHAPES = {
    "llama3-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    # SmolLM2-135M-Instruct's config.json (the real target of docs/real-target.md), for
    # machines that cannot download it: the same throughput, random weights.
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama3-8b-mini": dict(
        hidden_size=256,
        intermediate_size=896,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=4096,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}


def load_target(
    path: str | None,
    family: str,
    device: torch.device,
    max_positions: int = 2048,
    num_layers: int | None = None,
) -> FrozenTarget:
    """A bf16 target: ``path`` through from_pretrained, a random target of a named shape
    (``SHAPES``, built on ``device``; ``num_layers`` of its decoder layers when given, for
    a benchmark that never runs the target), else the default demo target's architecture
    (``family``) with random weights, covering ``max_positions``."""
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3ForCausalLM,
    )

    if path in SHAPES:
        sizes = {**SHAPES[path], **({"num_hidden_layers": num_layers} if num_layers else {})}
        config = LlamaConfig(**sizes, max_position_embeddings=max(8192, max_positions))
        with torch.device(device):
            model = LlamaForCausalLM(config).to(torch.bfloat16)
        return FrozenTarget(model)

    from eagle_train.config import load_config
    from eagle_train.demo.build import DemoConfig
    from eagle_train.demo.targets import target_config

    if path:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    else:
        shape = load_config(DemoConfig, "configs/demo/default.yaml").shape
        positions = max(shape.max_position_embeddings, max_positions)
        shape = shape.model_copy(update={"max_position_embeddings": positions})
        model_cls = LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM
        model = model_cls(target_config(family, shape, 2048, 1, 2, 0)).bfloat16()
    return FrozenTarget(model.to(device))


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
