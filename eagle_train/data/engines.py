"""Regeneration on several GPUs: one vLLM engine per GPU, each in its own process.

``data_parallel_size=N`` starts N worker processes (spawned, so no CUDA state is inherited);
worker i sees only GPU i (``CUDA_VISIBLE_DEVICES``; on CPU every worker sees the host) and
opens an ordinary ``VllmBackend``, tensor-parallel over ``tensor_parallel_size`` GPUs of its
own when a target needs that (worker i then takes GPUs i*tp .. i*tp+tp-1). Each call splits
the prompts into N contiguous shards and returns the outputs in the caller's order. Greedy
decoding, and sampling with a seed per request, do not depend on which engine serves a
request, so the output equals one engine's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from pathlib import Path
from typing import Any

from eagle_train.data.backends import GenerationSettings


def _worker(conn: Any, rank: int, model: Path, tokenizer: Path, settings: Any) -> None:
    tp = settings.tensor_parallel_size
    if os.environ.get("EAGLE_TRAIN_DP_PIN_GPUS", "1") == "1" and _has_cuda_devices():
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(rank * tp + j) for j in range(tp))
    try:
        from eagle_train.data.backends import VllmBackend

        backend = VllmBackend(model, tokenizer, settings)
        conn.send(("ready", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        job = conn.recv()
        if job is None:
            backend.close()
            return
        try:
            conn.send(("ok", backend.generate(*job)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _has_cuda_devices() -> bool:
    import torch

    return torch.cuda.device_count() > 0


class DataParallelVllmBackend:
    name = "vllm"

    def __init__(
        self, model: Path, tokenizer: Path, settings: GenerationSettings, num_engines: int
    ) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for rank in range(num_engines):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker, args=(child, rank, model, tokenizer, settings), daemon=True
            )
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        try:
            for conn in self.conns:
                self._receive(conn)
        except Exception:
            self.close()
            raise

    @staticmethod
    def _receive(conn: Any) -> Any:
        try:
            status, payload = conn.recv()
        except EOFError:
            raise RuntimeError("a regeneration engine process died") from None
        if status == "error":
            raise RuntimeError(f"a regeneration engine failed:\n{payload}")
        return payload

    def generate(
        self, prompts: list[list[int]], max_new_tokens: list[int], seeds: list[int]
    ) -> list[list[int]]:
        n = len(self.conns)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        busy = []
        for conn, lo, hi in zip(self.conns, bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                conn.send((prompts[lo:hi], max_new_tokens[lo:hi], seeds[lo:hi]))
                busy.append(conn)
        out: list[list[int]] = []
        errors = []
        for conn in busy:  # drain every busy engine even after a failure
            try:
                out.extend(self._receive(conn))
            except RuntimeError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return out

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        self.conns, self.procs = [], []
