"""vLLM's speculative-decoding counters, read as deltas around each request.

AL = 1 + accepted / drafts (the bonus token included); the per-position rate is
``accepted_per_pos[i] / drafts``. The counters are cumulative per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def per_position_rate(self) -> list[float]:
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_pos]

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, 1)

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, -1)

    def _combine(self, other: SpecCounters, sign: int) -> SpecCounters:
        return SpecCounters(
            drafts=self.drafts + sign * other.drafts,
            draft_tokens=self.draft_tokens + sign * other.draft_tokens,
            accepted=self.accepted + sign * other.accepted,
            accepted_per_pos=_add_vectors(self.accepted_per_pos, other.accepted_per_pos, sign),
        )


def _add_vectors(a: list[int], b: list[int], sign: int = 1) -> list[int]:
    width = max(len(a), len(b))
    a, b = a + [0] * (width - len(a)), b + [0] * (width - len(b))
    return [x + sign * y for x, y in zip(a, b, strict=True)]


_NAMES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}


def read_counters(llm: Any) -> SpecCounters:
    """Sum the counters over all their label sets (vLLM keeps one per engine)."""
    out = SpecCounters()
    for metric in llm.get_metrics():
        if metric.name in _NAMES:
            attr = _NAMES[metric.name]
            setattr(out, attr, getattr(out, attr) + int(metric.value))
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out.accepted_per_pos = _add_vectors(out.accepted_per_pos, list(metric.values))
    return out
