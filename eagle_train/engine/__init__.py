"""The vLLM engine room: an in-process engine set up for CPU and GPU, and vLLM's
speculative-decoding counters. Below both ``data`` (regeneration) and ``evaluate``
(acceptance length); it imports nothing else of the project. vLLM itself is imported only
when an engine opens."""

from eagle_train.engine.counters import SpecCounters, read_counters
from eagle_train.engine.vllm_engine import (
    CPU_KV_CACHE_BYTES,
    EngineSize,
    Measured,
    VllmEngine,
    cuda_available,
    kv_bytes_per_token,
    preemption_free_size,
    resolve_kv_cache_bytes,
    vllm_available,
)

__all__ = [
    "CPU_KV_CACHE_BYTES",
    "EngineSize",
    "Measured",
    "SpecCounters",
    "VllmEngine",
    "cuda_available",
    "kv_bytes_per_token",
    "preemption_free_size",
    "read_counters",
    "resolve_kv_cache_bytes",
    "vllm_available",
]
