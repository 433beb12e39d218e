"""Regeneration on several GPUs: one vLLM engine per GPU, each in its own process.

``data_parallel_size=N`` starts N worker processes (``eagle_train.engine.remote``); worker i sees
only its own GPUs (``CUDA_VISIBLE_DEVICES``, on a machine with GPUs) and opens an ordinary
``VllmBackend``, tensor-parallel over ``tensor_parallel_size`` GPUs when a target needs that
(worker i takes GPUs i*tp .. i*tp+tp-1). Each call splits the prompts into N contiguous
shards and returns the outputs in the caller's order. Greedy decoding, and sampling with a
seed per request, do not depend on which engine serves a request, so the output equals one
engine's.
"""

from __future__ import annotations

from pathlib import Path

from eagle_train.data.backends import GenerationSettings, Sampling, VllmBackend
from eagle_train.engine.remote import Remote


class DataParallelVllmBackend:
    name = "vllm"

    def __init__(
        self, model: Path, tokenizer: Path, settings: GenerationSettings, num_engines: int
    ) -> None:
        import torch

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
