"""Acceptance by the context length at which the tokens were drafted.

Every decode step of a request is traced (``engine/trace.py``): the tokens in the sequence
when its drafts were made (``step_context``), the tokens it added, the draft tokens it
verified and how many were accepted. A step falls in the bucket of its context length;
buckets are given by their upper edges (``EvalSettings.context_buckets``, by default
<1k, 1-2k, 2-4k, 4-8k, ..., >=128k, with 1k = 1,024 tokens).

Per bucket, as the overall figures are made (``steps.py``):

- tokens per target step: the tokens the bucket's decode steps added over their number,
  pooled over the requests, and its mean over the requests with steps in the bucket;
- per-position acceptance: of the bucket's drafted steps, the share whose draft k was
  accepted (vLLM's per-position rate), and the share of decode steps that were drafted;
- between drafters: the paired per-request difference in the bucket's tokens per target
  step, over the requests both served with steps in the bucket (``stats.paired_summary``).

A request of 3,000 prompt tokens and 2,000 new ones counts in 2-4k and in 4-8k.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle_train.evaluate.stats import paired_line, paired_summary

Row = Mapping[str, Any]  # a per_prompt.jsonl record with its step_* lists


def _short(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """``[1024, 2048]`` -> ``["<1k", "1-2k", ">=2k"]``."""
    labels = [f"<{_short(edges[0])}"]
    for low, high in zip(edges, edges[1:], strict=False):
        low_s, high_s = _short(low), _short(high)
        if low_s.endswith("k") and high_s.endswith("k"):
            labels.append(f"{low_s[:-1]}-{high_s}")
        else:
            labels.append(f"{low_s}-{high_s}")
    return labels + [f">={_short(edges[-1])}"]


@dataclass
class BucketCounts:
    steps: int = 0
    tokens: int = 0  # tokens the steps added
    drafts: int = 0  # drafted steps
    accepted_per_pos: list[int] = field(default_factory=list)

    def add_step(self, tokens: int, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.tokens += tokens
        if drafted:
            self.drafts += 1
            width = max(drafted, len(self.accepted_per_pos))
            self.accepted_per_pos += [0] * (width - len(self.accepted_per_pos))
            for k in range(accepted):
                self.accepted_per_pos[k] += 1

    def merge(self, other: BucketCounts) -> None:
        self.steps += other.steps
        self.tokens += other.tokens
        self.drafts += other.drafts
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        self.accepted_per_pos += [0] * (width - len(self.accepted_per_pos))
        for k, a in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[k] += a

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 1.0


def has_steps(row: Row) -> bool:
    return "step_context" in row


def request_buckets(row: Row, edges: Sequence[int]) -> dict[int, BucketCounts]:
    """One request's decode steps counted per bucket index (absent: no step there)."""
    out: dict[int, BucketCounts] = {}
    steps = zip(
        row["step_context"],
        row["step_tokens"],
        row["step_drafted"],
        row["step_accepted"],
        strict=True,
    )
    for context, tokens, drafted, accepted in steps:
        out.setdefault(bisect.bisect_right(edges, context), BucketCounts()).add_step(
            tokens, drafted, accepted
        )
    return out


def by_context(rows: Iterable[Row], edges: Sequence[int]) -> list[dict[str, Any]]:
    """Per bucket with decode steps, in order: requests, steps, tokens per target step
    (pooled and its per-request mean), drafted-step share and per-position acceptance."""
    pooled: dict[int, BucketCounts] = {}
    per_request: dict[int, list[float]] = {}
    for row in rows:
        for index, counts in request_buckets(row, edges).items():
            pooled.setdefault(index, BucketCounts()).merge(counts)
            per_request.setdefault(index, []).append(counts.tokens_per_step)
    labels = bucket_labels(edges)
    out = []
    for index in sorted(pooled):
        c, values = pooled[index], per_request[index]
        out.append(
            {
                "bucket": labels[index],
                "requests": len(values),
                "decode_steps": c.steps,
                "tokens_per_target_step": c.tokens_per_step,
                "mean_request_tokens_per_target_step": sum(values) / len(values),
                "drafted_step_share": c.drafts / c.steps,
                "drafts": c.drafts,
                "per_position_rate": [
                    a / c.drafts if c.drafts else 0.0 for a in c.accepted_per_pos
                ],
            }
        )
    return out


def paired_by_context(
    a_rows: Iterable[Row], b_rows: Iterable[Row], edges: Sequence[int]
) -> list[dict[str, Any]]:
    """Per bucket: the paired statistics of b - a in the bucket's per-request tokens per
    target step, over the requests (prompt id, turn) both have steps in."""
    a = {(r["id"], r["turn"]): request_buckets(r, edges) for r in a_rows}
    b = {(r["id"], r["turn"]): request_buckets(r, edges) for r in b_rows}
    labels = bucket_labels(edges)
    out = []
    indices = sorted({i for buckets in (*a.values(), *b.values()) for i in buckets})
    for index in indices:
        keys = sorted(k for k in a.keys() & b.keys() if index in a[k] and index in b[k])
        if not keys:
            continue
        stats = paired_summary(
            [a[k][index].tokens_per_step for k in keys],
            [b[k][index].tokens_per_step for k in keys],
        )
        out.append({"bucket": labels[index], **stats})
    return out


def markdown_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A drafter's table by context length."""
    if not rows:
        return []
    lines = [
        "By context length at which the tokens were drafted:",
        "",
        "| context | requests | decode steps | tokens per target step | mean per request "
        "| drafted steps | per-position acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        rates = ", ".join(f"{r:.2f}" for r in row["per_position_rate"]) or "-"
        lines.append(
            f"| {row['bucket']} | {row['requests']} | {row['decode_steps']} | "
            f"{row['tokens_per_target_step']:.3f} | "
            f"{row['mean_request_tokens_per_target_step']:.3f} | "
            f"{row['drafted_step_share']:.0%} | {rates} |"
        )
    return lines + [""]


def paired_markdown_lines(paired: list[dict[str, Any]]) -> list[str]:
    return [f"- context {p['bucket']} ({p['n']} requests): {paired_line(p)}" for p in paired]
