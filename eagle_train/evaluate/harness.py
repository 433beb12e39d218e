"""The acceptance-length harness: target alone, then each drafter, same prompts, greedy,
one request at a time, counters read as deltas around every request.

Turn 2 of a multi-turn prompt is asked with the target's own first answer in the context
(taken from the no-draft run; greedy speculative decoding would produce the same answer).
Every drafter is read and checked against vLLM's contract before any engine starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import AutoConfig, AutoTokenizer

from eagle_train.evaluate.drafter import DrafterInfo, inspect_drafter
from eagle_train.evaluate.prompts import EvalPrompt, load_prompts
from eagle_train.serving import VllmEngine

log = logging.getLogger(__name__)


@dataclass
class EvalSettings:
    target: Path
    drafters: list[Path]
    prompts: str = "mt_bench"
    turns: int = 2  # 1: first turn only; 2: both turns
    max_new_tokens: int = 256
    num_speculative_tokens: int | None = None  # None: what each export was trained for
    dtype: str = "bfloat16"
    limit: int | None = None
    max_model_len: int | None = None  # None: the target's own limit
    # vLLM's KV cache; None lets vLLM size it (GPU). On CPU set it (vLLM would take ~7 GiB).
    kv_cache_memory_bytes: int | None = None
    ignore_eos: bool = False
    baseline: bool = True  # also run the target alone (needed for speedup and for turn 2)


@dataclass
class Request:
    prompt: EvalPrompt
    turn: int  # 1-based
    token_ids: list[int]


@dataclass
class EvalRun:
    settings: EvalSettings
    drafters: list[DrafterInfo]
    records: list[dict[str, Any]] = field(default_factory=list)


def run_eval(settings: EvalSettings) -> EvalRun:
    if settings.turns not in (1, 2):
        raise ValueError(f"turns must be 1 or 2, got {settings.turns}")
    if settings.turns == 2 and not settings.baseline:
        raise ValueError("turn 2 is asked with the target's own first answer: keep the baseline")
    target_config = AutoConfig.from_pretrained(settings.target)
    infos = [
        inspect_drafter(d, target_config, settings.num_speculative_tokens)
        for d in settings.drafters
    ]
    tokenizer = AutoTokenizer.from_pretrained(settings.target)
    prompts = load_prompts(settings.prompts, settings.limit)
    run = EvalRun(settings=settings, drafters=infos)
    first = [Request(p, 1, _render(tokenizer, p, [])) for p in prompts]
    second: list[Request] = []
    if settings.baseline:
        with _engine(settings, None) as engine:
            _warm_up(engine, first[0])
            answers = _serve(engine, first, "target", run.records, settings)
            second = [
                Request(
                    p, 2, _render(tokenizer, p, [tokenizer.decode(a, skip_special_tokens=True)])
                )
                for p, a in zip(prompts, answers, strict=True)
                if settings.turns == 2 and len(p.turns) > 1
            ]
            _serve(engine, second, "target", run.records, settings)
    for info in infos:
        with _engine(settings, info) as engine:
            _warm_up(engine, first[0])
            _serve(engine, first + second, str(info.path), run.records, settings)
    return run


def _engine(settings: EvalSettings, drafter: DrafterInfo | None) -> VllmEngine:
    return VllmEngine(
        settings.target,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        speculative_config=drafter.speculative_config() if drafter else None,
    )


def _warm_up(engine: VllmEngine, request: Request) -> None:
    """One untimed request: the first one of an engine pays one-off setup costs."""
    engine.generate([request.token_ids], dict(temperature=0.0, max_tokens=8))


def _render(tokenizer: Any, prompt: EvalPrompt, answers: list[str]) -> list[int]:
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for i, answer in enumerate(answers):
        messages += [
            {"role": "user", "content": prompt.turns[i]},
            {"role": "assistant", "content": answer},
        ]
    messages.append({"role": "user", "content": prompt.turns[len(answers)]})
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


def _serve(
    engine: VllmEngine,
    requests: list[Request],
    name: str,
    records: list[dict[str, Any]],
    settings: EvalSettings,
) -> list[list[int]]:
    sampling = dict(
        temperature=0.0, max_tokens=settings.max_new_tokens, ignore_eos=settings.ignore_eos
    )
    outputs = []
    for req in tqdm(requests, desc=f"{Path(name).name}", leave=False):
        tokens, delta, seconds = engine.generate_measured(req.token_ids, sampling)
        outputs.append(tokens)
        records.append(
            {
                "model": name,
                "id": req.prompt.id,
                "category": req.prompt.category,
                "turn": req.turn,
                "prompt_tokens": len(req.token_ids),
                "new_tokens": len(tokens),
                "seconds": seconds,
                "drafts": delta.drafts,
                "accepted": delta.accepted,
                "acceptance_length": delta.acceptance_length,
                "accepted_per_pos": delta.accepted_per_pos,
                "output": tokens,
            }
        )
    return outputs
