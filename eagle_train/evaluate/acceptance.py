"""Acceptance length of an exported drafter in vLLM, one request at a time, greedy.

This is the measurement the acceptance harness (eval-acceptance) builds on: the target and
its drafter in one engine, counters read as deltas around each request, plus the no-draft
run for token equality and speedup.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer

from eagle_train.evaluate.counters import SpecCounters
from eagle_train.export import serving_config
from eagle_train.serving import VllmEngine


@dataclass
class AcceptanceResult:
    counters: SpecCounters
    per_prompt_al: list[float]
    outputs: list[list[int]]
    seconds: float
    baseline_seconds: float | None = None
    identical_to_baseline: bool | None = None
    extra: dict = field(default_factory=dict)

    @property
    def acceptance_length(self) -> float:
        return self.counters.acceptance_length

    def summary(self) -> str:
        rates = ", ".join(f"{r:.3f}" for r in self.counters.per_position_rate)
        lines = [f"acceptance length {self.acceptance_length:.3f} over {len(self.outputs)} "
                 f"prompts ({self.counters.drafts} drafts); per-position acceptance [{rates}]"]
        if self.baseline_seconds is not None:
            lines.append(f"wall time {self.seconds:.2f}s with drafter vs {self.baseline_seconds:.2f}s"
                         f" without (speedup {self.baseline_seconds / self.seconds:.2f}x); "
                         f"greedy output identical: {self.identical_to_baseline}")
        return "\n".join(lines)


def chat_prompts(target: str | Path, chats_jsonl: str | Path, limit: int) -> list[list[int]]:
    """First user turn of each chat, rendered with the target's chat template."""
    tok = AutoTokenizer.from_pretrained(target)
    rows = [json.loads(line) for line in Path(chats_jsonl).read_text().splitlines() if line]
    return [
        tok.apply_chat_template(r["messages"][:1], add_generation_prompt=True, tokenize=True,
                                return_dict=True)["input_ids"]
        for r in rows[:limit]
    ]


def measure_acceptance(
    target: str | Path, drafter: str | Path, prompts: list[list[int]], max_new_tokens: int,
    dtype: str, num_speculative_tokens: int | None = None, baseline: bool = True,
    max_model_len: int = 2048, ignore_eos: bool = False,
) -> AcceptanceResult:
    """Greedy; generation stops at eos unless ``ignore_eos`` (fixed-length runs for tests)."""
    sampling = dict(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=ignore_eos)
    base_out, base_s = None, None
    if baseline:
        with VllmEngine(target, dtype=dtype, max_model_len=max_model_len) as engine:
            start = time.perf_counter()
            base_out = [r[0] for r in engine.generate_one_by_one(prompts, sampling)]
            base_s = time.perf_counter() - start
    spec = serving_config(drafter, num_speculative_tokens)
    with VllmEngine(target, dtype=dtype, max_model_len=max_model_len,
                    speculative_config=spec) as engine:
        start = time.perf_counter()
        results = engine.generate_one_by_one(prompts, sampling)
        seconds = time.perf_counter() - start
    total = SpecCounters()
    for _, delta in results:
        total = total + delta
    outputs = [r[0] for r in results]
    return AcceptanceResult(
        counters=total, per_prompt_al=[d.acceptance_length for _, d in results],
        outputs=outputs, seconds=seconds, baseline_seconds=base_s,
        identical_to_baseline=None if base_out is None else outputs == base_out,
    )
