"""Tokens per target forward step: the fair comparison across proposers
(docs/serving-and-evaluation.md).

AL over drafted steps (1 + accepted / drafts) leaves out the decode steps on which a proposer
drafted nothing, so a proposer that skips steps (vLLM's n-gram) is overstated by it. Per
request the first new token comes from the prefill; every later target forward (decode step)
yields one token plus the draft tokens it accepted, so

    decode steps S = (new_tokens - 1) - accepted,  tokens per target step = (new_tokens - 1) / S.

vLLM counts the last step's accepted tokens before max_tokens or a stop token cuts them, so
on a request whose last drafts ran past the end the formula can fall below the drafted steps
(the perfect drafter at 16 new tokens and K = 3: 15 - 12 = 3 against 4 drafted steps); every
drafted step is a decode step, so S is at least ``drafts``. That makes S exact for a
proposer that drafts on every step and a lower bound (off by at most K) on a request of a
skipping proposer whose last drafts were cut. A request with no decode step (a single new
token) counts 1.0, as AL does for a request without drafts.

The counters are per request: deltas of vLLM's cumulative counters around the request
(``VllmEngine.generate_measured``), never the cumulative values themselves. The harness
also traces every decode step (``engine/trace.py``); a record with that trace counts its
steps exactly instead of by the formula above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Row = Mapping[str, Any]  # a per_prompt.jsonl record: new_tokens, drafts, accepted


def decode_steps(new_tokens: int, accepted: int, drafts: int) -> int:
    """Target forwards after the prefill that produced a request's ``new_tokens``."""
    return max(new_tokens - 1 - accepted, drafts, 0)


def request_steps(row: Row) -> int:
    """Exact when the request's steps were traced (``step_tokens``, ``engine/trace.py``),
    else from its counters."""
    if "step_tokens" in row:
        return len(row["step_tokens"])
    return decode_steps(row["new_tokens"], row["accepted"], row["drafts"])


def _decoded(row: Row) -> int:
    """New tokens the decode steps produced (all but the prefill's)."""
    return max(row["new_tokens"] - 1, 0)


def request_tokens_per_step(row: Row) -> float:
    """(new_tokens - 1) / S of one request; 1.0 when it had no decode step."""
    steps = request_steps(row)
    return _decoded(row) / steps if steps else 1.0


def pooled_tokens_per_step(rows: Iterable[Row]) -> float:
    """Sum of (new_tokens - 1) over sum of S (each request weighted by its steps)."""
    rows = list(rows)
    steps = sum(request_steps(r) for r in rows)
    return sum(_decoded(r) for r in rows) / steps if steps else 1.0


def mean_request_tokens_per_step(rows: Iterable[Row]) -> float:
    values = [request_tokens_per_step(r) for r in rows]
    return sum(values) / len(values) if values else 1.0


def drafted_step_share(rows: Iterable[Row]) -> float:
    """Drafted steps over decode steps: 1.0 for a proposer that drafts on every step."""
    rows = list(rows)
    steps = sum(request_steps(r) for r in rows)
    return sum(r["drafts"] for r in rows) / steps if steps else 0.0
