"""Interleaved speed measurement: the target alone and a drafter take turns, round by round.

A load change on a shared machine then hits both sides of a round alike, so the per-round
ratio of tokens/s survives it where one long baseline followed by one long drafter run does
not. Round r runs the target first when r is even and the drafter first when r is odd (a
drift inside a round cancels over two rounds). The speedup reported is the median of the
per-round ratios, with its quartiles and range.

A drafter cannot be faster than its tokens per target step (``steps.py``: every decode step
costs at least one target forward), so a speedup above it is flagged as a measurement fault.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Protocol

from eagle_train.engine import Measured


class MeasuringEngine(Protocol):
    def generate_one_by_one(
        self, prompts: list[list[int]], sampling: dict[str, Any], seeds: list[int] | None = None
    ) -> list[Measured]: ...


@dataclass
class Round:
    index: int
    target_first: bool
    target_tokens: int
    target_seconds: float
    drafter_tokens: int
    drafter_seconds: float

    @property
    def ratio(self) -> float:
        target = self.target_tokens / self.target_seconds
        return (self.drafter_tokens / self.drafter_seconds) / target


def interleave(
    target: MeasuringEngine,
    drafter: MeasuringEngine,
    prompts: list[list[int]],
    sampling: dict[str, Any],
    round_size: int,
    seeds: list[int] | None = None,
) -> tuple[list[Measured], list[Measured], list[Round]]:
    """Serve ``prompts`` (one request at a time) on both engines in rounds of ``round_size``
    requests, alternating which engine goes first; ``seeds``: each request's (sampled runs,
    the same on both engines). Returns each engine's measurements in prompt order and the
    rounds."""
    target_out: list[Measured] = []
    drafter_out: list[Measured] = []
    rounds: list[Round] = []
    for r, start in enumerate(range(0, len(prompts), round_size)):
        chunk = prompts[start : start + round_size]
        chunk_seeds = None if seeds is None else seeds[start : start + round_size]
        target_first = r % 2 == 0
        order = [target, drafter] if target_first else [drafter, target]
        results = {
            id(engine): engine.generate_one_by_one(chunk, sampling, chunk_seeds) for engine in order
        }
        t, d = results[id(target)], results[id(drafter)]
        target_out += t
        drafter_out += d
        rounds.append(
            Round(
                index=len(rounds),
                target_first=target_first,
                target_tokens=sum(len(m.tokens) for m in t),
                target_seconds=sum(m.seconds for m in t),
                drafter_tokens=sum(len(m.tokens) for m in d),
                drafter_seconds=sum(m.seconds for m in d),
            )
        )
    return target_out, drafter_out, rounds


def speedup_summary(rounds: list[Round], tokens_per_target_step: float) -> dict[str, Any]:
    """Median per-round speedup with quartiles and range; ``fault`` when the median exceeds
    the measured tokens per target step (what no drafter can beat)."""
    ratios = sorted(r.ratio for r in rounds if r.target_seconds > 0 and r.drafter_seconds > 0)
    if not ratios:
        return {"rounds": 0, "median": None, "fault": None}
    if len(ratios) >= 2:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    else:
        q1 = q3 = ratios[0]
    median = statistics.median(ratios)
    fault = median > tokens_per_target_step
    out: dict[str, Any] = {
        "rounds": len(ratios),
        "median": median,
        "q1": q1,
        "q3": q3,
        "min": ratios[0],
        "max": ratios[-1],
        "tokens_per_target_step": tokens_per_target_step,
        "fault": fault,
    }
    if fault:
        out["fault_reason"] = (
            f"median speedup {median:.2f}x exceeds the {tokens_per_target_step:.2f} tokens per "
            "target step this drafter achieved: the timing is disturbed (load on the machine "
            "changed between the engines' turns), not a real speedup"
        )
    return out
