"""A vLLM engine set up the way users serve: on CUDA vLLM's defaults, on CPU the CPU recipe.

vLLM is an optional dependency: it is imported only when an engine is opened. On CUDA the
engine keeps vLLM's defaults (CUDA graphs, ``gpu_memory_utilization`` sizing the KV cache,
its separate engine-core process); an explicit ``kv_cache_memory_bytes`` still wins. On CPU
it runs eager with an explicit KV cache size (vLLM would take ~7 GiB). The dtype is always
explicit (``"auto"`` would silently run an fp32 checkpoint in bf16). The environment is the
user's: the CPU test recipe (in-process engine core, offline hub) is set by the tests and
the CPU scripts, not here.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from eagle_train.engine.counters import SpecCounters, read_counters
from eagle_train.engine.trace import StepTrace, generate_traced

logger = logging.getLogger(__name__)

# The one KV-cache default: on CPU vLLM would otherwise reserve ~7 GiB; 256 MiB holds several
# thousand tokens of a small target. On GPU None lets vLLM size the cache from free memory.
CPU_KV_CACHE_BYTES = 256 * 2**20


# Sequences a CPU engine schedules at once when nothing else is asked. On 2 cores with bf16
# units (AMX) throughput still rose from 64 to 128 (758 -> 948 tokens/s; 32 gave 557); on 2
# cores without them it was flat from 8 to 64 (docs/results/2026-12-01-data-speed.md,
# 2026-12-03-smollm2-amx.md). The cache is sized to hold them all (preemption_free_size).
CPU_MAX_NUM_SEQS = 128
KV_BLOCK_TOKENS = 128  # vLLM's CPU block size; a request holds whole blocks
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes_per_token(model: str | Path, dtype: str) -> int:
    """KV-cache bytes one token of ``model`` takes (keys and values, every layer)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model))
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


class EngineSize(NamedTuple):
    max_num_seqs: int | None  # None: vLLM's default
    kv_cache_memory_bytes: int | None  # None: vLLM's sizing (CUDA)


def preemption_free_size(
    max_num_seqs: int | None,
    kv_cache_memory_bytes: int | None,
    request_tokens: int,
    bytes_per_token: int,
    cuda: bool,
) -> EngineSize:
    """An engine in which ``max_num_seqs`` requests of ``request_tokens`` (prompt + answer)
    fit the KV cache together, so vLLM never preempts and recomputes a sequence (on 2 cores
    that costs 10-40x: 10-20 tokens/s with the cache full against 600+ with it half full).

    Neither given: on CUDA vLLM's own sizing; on CPU ``CPU_MAX_NUM_SEQS`` and the cache
    sized for them (at least ``CPU_KV_CACHE_BYTES``, at most a quarter of the memory). One
    given: the other follows from it. Both given: kept as asked."""
    if max_num_seqs is not None and kv_cache_memory_bytes is not None:
        return EngineSize(max_num_seqs, kv_cache_memory_bytes)
    if cuda and kv_cache_memory_bytes is None:
        return EngineSize(max_num_seqs, None)
    blocks = -(-request_tokens // KV_BLOCK_TOKENS)
    per_request = blocks * KV_BLOCK_TOKENS * bytes_per_token
    if kv_cache_memory_bytes is not None:
        return EngineSize(max(1, kv_cache_memory_bytes // per_request), kv_cache_memory_bytes)
    seqs = max_num_seqs or CPU_MAX_NUM_SEQS
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    seqs = max(1, min(seqs, budget // per_request))
    return EngineSize(seqs, max(CPU_KV_CACHE_BYTES, seqs * per_request))


def resolve_kv_cache_bytes(requested: int | None, cuda: bool | None = None) -> int | None:
    """``requested`` if set; else the CPU default without CUDA, else None (vLLM's sizing)."""
    if requested is not None:
        return requested
    if cuda is None:
        cuda = cuda_available()
    return None if cuda else CPU_KV_CACHE_BYTES


class Measured(NamedTuple):
    tokens: list[int]
    counters: SpecCounters
    seconds: float
    steps: StepTrace | None = None  # per decode step (trace.py); None: not traced


def vllm_available() -> bool:
    """Whether vLLM can be imported here (a broken install raises more than ImportError)."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        logger.info("vLLM not usable (%s: %s)", type(exc).__name__, exc)
        return False
    return True


def engine_starts_here() -> bool:
    """Whether a vLLM engine can start in this process.

    On CPU (no Triton) vLLM 0.32 registers its kernel fallbacks by reading ``vars(x)`` of every
    module attribute as a dict (``vllm/triton_utils/dispatcher.py``). Once llvmlite is loaded
    (numba loads it; vLLM's n-gram proposer imports numba), its library wrapper answers that
    with a function wrapper, and every later engine in the process fails to start with
    "'_lib_fn_wrapper' object has no attribute 'get'". Such a process starts its engines in
    a fresh one (``evaluate.harness.EngineProcess``)."""
    if "llvmlite.binding.ffi" not in sys.modules:
        return True
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


def opens_numba(speculative_config: dict[str, Any] | None) -> bool:
    """Whether an engine with this speculative config loads numba (the n-gram proposer),
    after which no further engine starts in the process (``engine_starts_here``)."""
    return bool(speculative_config) and speculative_config.get("method") == "ngram"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_defaults(cuda: bool, kv_cache_memory_bytes: int | None) -> dict[str, Any]:
    """The device-dependent engine arguments: none on CUDA (CUDA graphs, KV cache from
    ``gpu_memory_utilization``) unless a KV size is given; eager and a KV size on CPU."""
    out: dict[str, Any] = {} if cuda else {"enforce_eager": True}
    kv_bytes = resolve_kv_cache_bytes(kv_cache_memory_bytes, cuda)
    if kv_bytes is not None:
        out["kv_cache_memory_bytes"] = kv_bytes
    return out


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
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int | None = None,  # sequences scheduled at once; None: vLLM's default
    ) -> None:
        if dtype == "auto":
            raise ValueError("pass an explicit dtype: vLLM's 'auto' downcasts fp32 checkpoints")
        self.model = str(model)
        self.kwargs: dict[str, Any] = dict(
            model=self.model,
            dtype=dtype,
            seed=seed,
            disable_log_stats=False,  # get_metrics() needs stats
        )
        self.kwargs.update(engine_defaults(cuda_available(), kv_cache_memory_bytes))
        if gpu_memory_utilization is not None:  # engines sharing a GPU split it
            self.kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_num_seqs is not None:
            self.kwargs["max_num_seqs"] = max_num_seqs
        if tensor_parallel_size != 1:
            self.kwargs["tensor_parallel_size"] = tensor_parallel_size
        if max_model_len is not None:  # None: the model's own limit
            self.kwargs["max_model_len"] = max_model_len
        if speculative_config is not None:
            self.kwargs["speculative_config"] = speculative_config
        if tokenizer is not None:
            self.kwargs["tokenizer"] = str(tokenizer)
        self.llm: Any = None

    def open(self) -> VllmEngine:
        from vllm import LLM

        if not engine_starts_here():
            raise RuntimeError(
                "vLLM cannot start an engine in a process that has loaded llvmlite "
                "(numba, the n-gram proposer): open it in its own process "
                "(eagle_train.evaluate.harness.EngineProcess)"
            )
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
        """One request alone: its tokens, spec-decode counter deltas, wall time and what each
        decode step did (``trace.py``: the engine stepped by hand)."""
        # vLLM's own config, not our kwargs: a speculators-format drafter served as the model
        # brings its speculative config with it (its counters then count too).
        speculative = self.llm.llm_engine.vllm_config.speculative_config is not None
        out = generate_traced(self.llm, prompt, sampling, speculative)
        return Measured(out.tokens, out.counters, out.seconds, out.steps)

    def generate_one_by_one(
        self, prompts: list[list[int]], sampling: dict[str, Any], seeds: list[int] | None = None
    ) -> list[Measured]:
        """One request at a time (concurrency 1), each measured; ``seeds``: one per request
        (sampled decoding), into its ``SamplingParams``."""
        if seeds is None:
            return [self.generate_measured(p, sampling) for p in prompts]
        return [
            self.generate_measured(p, {**sampling, "seed": s})
            for p, s in zip(prompts, seeds, strict=True)
        ]

    def generate_greedy(
        self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool = False
    ) -> list[list[int]]:
        sampling = dict(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=ignore_eos)
        return self.generate(prompts, sampling)
