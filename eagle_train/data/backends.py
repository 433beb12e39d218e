"""The generation backends that regenerate assistant turns (``data/generation.py`` says what
one is): transformers ``generate``, one vLLM engine, or one vLLM engine per GPU in processes
of their own; ``create_backend`` picks one from the ``regenerate`` settings."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import torch

from eagle_train.data.generation import (
    BackendName,
    GenerationBackend,
    GenerationSettings,
    Sampling,
    cut_at_stop,
)
from eagle_train.engine import (
    VllmEngine,
    cuda_available,
    kv_bytes_per_token,
    preemption_free_size,
    vllm_available,
)
from eagle_train.engine.remote import Remote

logger = logging.getLogger(__name__)


def create_backend(
    name: BackendName, model: Path, tokenizer: Path, settings: GenerationSettings
) -> GenerationBackend:
    if name == "auto":
        name = "vllm" if vllm_available() else "transformers"
    logger.info("regenerating with the %s backend (%s, dtype %s)", name, model, settings.dtype)
    if name == "vllm":
        if settings.data_parallel_size > 1:
            return DataParallelVllmBackend(model, tokenizer, settings, settings.data_parallel_size)
        return VllmBackend(model, tokenizer, settings)
    if settings.data_parallel_size > 1 or settings.tensor_parallel_size > 1:
        raise ValueError(
            "regenerate.data_parallel_size / tensor_parallel_size need the vllm backend"
        )
    return TransformersBackend(model, settings)


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


class DataParallelVllmBackend:
    """Regeneration on several GPUs: one vLLM engine per GPU, each in its own process.

    ``data_parallel_size=N`` starts N worker processes (``eagle_train.engine.remote``);
    worker i sees only its own GPUs (``CUDA_VISIBLE_DEVICES``, on a machine with GPUs) and
    opens an ordinary ``VllmBackend``, tensor-parallel over ``tensor_parallel_size`` GPUs
    when a target needs that (worker i takes GPUs i*tp .. i*tp+tp-1). Each call splits the
    prompts into N contiguous shards and returns the outputs in the caller's order. Greedy
    decoding, and sampling with a seed per request, do not depend on which engine serves a
    request, so the output equals one engine's."""

    name = "vllm"

    def __init__(
        self, model: Path, tokenizer: Path, settings: GenerationSettings, num_engines: int
    ) -> None:
        tp = settings.tensor_parallel_size
        pin = torch.cuda.device_count() > 0
        self.engines: list[Remote] = []
        try:
            for rank in range(num_engines):
                gpus = ",".join(str(rank * tp + j) for j in range(tp))
                env = {"CUDA_VISIBLE_DEVICES": gpus} if pin else {}
                self.engines.append(Remote(VllmBackend, model, tokenizer, settings, env=env))
        except Exception:
            self.close()
            raise

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        seeds: list[int],
        sampling: Sampling | None = None,
    ) -> list[list[int]]:
        n = len(self.engines)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        busy = []
        for engine, lo, hi in zip(self.engines, bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                engine.submit(
                    "generate", prompts[lo:hi], max_new_tokens[lo:hi], seeds[lo:hi], sampling
                )
                busy.append(engine)
        out: list[list[int]] = []
        errors = []
        for engine in busy:  # collect from every busy engine even after a failure
            try:
                out.extend(engine.result())
            except RuntimeError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return out

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
        self.engines = []
