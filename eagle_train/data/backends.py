"""Generation backends for regenerating assistant turns: vLLM, or transformers ``generate``.

Both take token-id prompts (never text: a tokenizer would add a second bos to a rendered
prompt that already has one) and return the generated ids, cut after the first stop token.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from eagle_train.engine import (
    VllmEngine,
    cuda_available,
    kv_bytes_per_token,
    preemption_free_size,
    vllm_available,
)

logger = logging.getLogger(__name__)

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


def create_backend(
    name: BackendName, model: Path, tokenizer: Path, settings: GenerationSettings
) -> GenerationBackend:
    if name == "auto":
        name = "vllm" if vllm_available() else "transformers"
    logger.info("regenerating with the %s backend (%s, dtype %s)", name, model, settings.dtype)
    if name == "vllm":
        if settings.data_parallel_size > 1:
            from eagle_train.data.engines import DataParallelVllmBackend

            return DataParallelVllmBackend(model, tokenizer, settings, settings.data_parallel_size)
        return VllmBackend(model, tokenizer, settings)
    if settings.data_parallel_size > 1 or settings.tensor_parallel_size > 1:
        raise ValueError(
            "regenerate.data_parallel_size / tensor_parallel_size need the vllm backend"
        )
    return TransformersBackend(model, settings)


def cut_at_stop(ids: list[int], stop_ids: tuple[int, ...], limit: int) -> list[int]:
    """Ids up to and including the first stop token, at most ``limit`` of them."""
    stops = set(stop_ids)
    for i, token in enumerate(ids[:limit]):
        if token in stops:
            return ids[: i + 1]
    return ids[:limit]


class TransformersBackend:
    name = "transformers"

    def __init__(self, model: Path, settings: GenerationSettings) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.settings = settings
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            str(model), dtype=getattr(torch, settings.dtype)
        )
        self.model.to(self.device).eval()
        # Blank the model's own generation defaults (top_k, repetition_penalty, ...), so that the
        # configured sampling is the only one, as it is for vLLM.
        self.model.generation_config = GenerationConfig()
        # top_k=0 turns off any top-k filtering; vLLM's default does the same.
        sampling = (
            {}
            if settings.greedy
            else {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
        )
        self.sampling = {
            "do_sample": not settings.greedy,
            "eos_token_id": list(settings.stop_token_ids),
            "pad_token_id": settings.pad_token_id,
            **sampling,
        }

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        seeds: list[int],
        sampling: Sampling | None = None,
    ) -> list[list[int]]:
        from transformers import GenerationConfig

        kwargs = self.sampling
        if sampling is not None:
            kwargs = {
                **kwargs,
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": 0,
            }
        width = max(len(p) for p in prompts)
        pad = self.settings.pad_token_id
        # Left padding keeps every prompt's last token at the same position for generation.
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device
        )
        if kwargs["do_sample"]:
            torch.manual_seed(seeds[0])  # sampled output depends on the batch composition here
        config = GenerationConfig(max_new_tokens=max(max_new_tokens), **kwargs)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=attention, generation_config=config
            )
        rows = out[:, width:].tolist()
        # Greedy decoding is causal, so cutting a longer generation at a row's own limit gives
        # exactly what generating that many tokens would.
        return [
            cut_at_stop(r, self.settings.stop_token_ids, n)
            for r, n in zip(rows, max_new_tokens, strict=True)
        ]

    def close(self) -> None:
        del self.model
        gc.collect()


class VllmBackend:
    name = "vllm"

    def __init__(self, model: Path, tokenizer: Path, settings: GenerationSettings) -> None:
        self.settings = settings
        # As many sequences at once as fit the KV cache whole (max_model_len each), so the
        # engine batches the whole stream continuously and never preempts.
        size = preemption_free_size(
            settings.max_num_seqs,
            settings.kv_cache_memory_bytes,
            settings.max_model_len,
            kv_bytes_per_token(model, settings.dtype),
            cuda_available(),
        )
        logger.info(
            "vLLM engine: %s sequences at once, KV cache %s",
            size.max_num_seqs or "vLLM's default",
            f"{size.kv_cache_memory_bytes / 2**20:.0f} MiB"
            if size.kv_cache_memory_bytes
            else "sized by vLLM",
        )
        # The project's engine setup (eager, explicit dtype, in-process engine core).
        self.engine = VllmEngine(
            model,
            dtype=settings.dtype,
            max_model_len=settings.max_model_len,
            kv_cache_memory_bytes=size.kv_cache_memory_bytes,
            max_num_seqs=size.max_num_seqs,
            seed=settings.seed,
            tokenizer=tokenizer,
            tensor_parallel_size=settings.tensor_parallel_size,
        ).open()

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        seeds: list[int],
        sampling: Sampling | None = None,
    ) -> list[list[int]]:
        from vllm import SamplingParams, TokensPrompt

        s = self.settings
        temperature = s.temperature if sampling is None else sampling.temperature
        top_p = s.top_p if sampling is None else sampling.top_p
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_tokens=n,
                seed=None if temperature == 0.0 else seed,
                stop_token_ids=list(s.stop_token_ids),
            )
            for n, seed in zip(max_new_tokens, seeds, strict=True)
        ]
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = self.engine.llm.generate(inputs, params, use_tqdm=False)
        return [
            cut_at_stop(list(o.outputs[0].token_ids), s.stop_token_ids, n)
            for o, n in zip(outputs, max_new_tokens, strict=True)
        ]

    def close(self) -> None:
        self.engine.close()
