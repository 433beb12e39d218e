"""Engine arguments by device: vLLM's defaults on CUDA, the CPU recipe on CPU, env untouched."""

from __future__ import annotations

import os
import sys
import types

from eagle_train.engine.vllm_engine import (
    CPU_KV_CACHE_BYTES,
    VllmEngine,
    engine_defaults,
    vllm_available,
)


def test_cuda_keeps_vllm_defaults():
    # CUDA graphs on (no enforce_eager) and the KV cache from gpu_memory_utilization.
    assert engine_defaults(True, None) == {}
    assert engine_defaults(True, 2**30) == {"kv_cache_memory_bytes": 2**30}


def test_cpu_is_eager_with_explicit_kv_cache():
    assert engine_defaults(False, None) == {
        "enforce_eager": True,
        "kv_cache_memory_bytes": 256 * 2**20,
    }
    assert CPU_KV_CACHE_BYTES == 256 * 2**20
    assert engine_defaults(False, 2**26) == {"enforce_eager": True, "kv_cache_memory_bytes": 2**26}


def test_engine_arguments_and_environment(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("eagle_train.engine.vllm_engine.cuda_available", lambda: True)
    engine = VllmEngine("org/model", dtype="bfloat16", tensor_parallel_size=2)
    assert engine.kwargs["tensor_parallel_size"] == 2
    assert "enforce_eager" not in engine.kwargs and "kv_cache_memory_bytes" not in engine.kwargs
    seen = {}
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kwargs: seen.update(kwargs)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    assert vllm_available()
    engine.open()
    assert seen["model"] == "org/model" and seen["tensor_parallel_size"] == 2
    # Opening an engine leaves the user's environment alone (a hub id must stay servable,
    # and GPU runs keep vLLM's separate engine-core process).
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    assert "HF_HUB_OFFLINE" not in os.environ
