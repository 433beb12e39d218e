"""What regenerating assistant turns asks of a generation backend (``data/backends.py``
holds the backends): the settings, a per-call sampling override, the protocol, and the cut
after the first stop token every backend applies.

A backend takes token-id prompts (never text: a tokenizer would add a second bos to a
rendered prompt that already has one) and returns the generated ids, cut after the first
stop token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

BackendName = Literal["auto", "vllm", "transformers"]


@dataclass(frozen=True)
class GenerationSettings:
    dtype: str
    temperature: float
    top_p: float
    seed: int
    stop_token_ids: tuple[int, ...]
    pad_token_id: int
    max_model_len: int
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int | None = None  # None: as many as the KV cache holds (VllmBackend)
    tensor_parallel_size: int = 1  # GPUs one engine spans
    data_parallel_size: int = 1  # engines, each in its own process on its own GPU(s)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Sampling:
    """Sampling for one call, instead of the backend's configured one (prompt synthesis)."""

    temperature: float
    top_p: float


class GenerationBackend(Protocol):
    name: str

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        seeds: list[int],
        sampling: Sampling | None = None,
    ) -> list[list[int]]:
        """Generated ids per prompt: at most ``max_new_tokens[i]``, ending at a stop token if any."""
        ...

    def close(self) -> None: ...


def cut_at_stop(ids: list[int], stop_ids: tuple[int, ...], limit: int) -> list[int]:
    """Ids up to and including the first stop token, at most ``limit`` of them."""
    stops = set(stop_ids)
    for i, token in enumerate(ids[:limit]):
        if token in stops:
            return ids[: i + 1]
    return ids[:limit]
