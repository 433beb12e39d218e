"""One request served step by step, with what every target forward did.

vLLM's spec-decode counters are cumulative per process and its per-request metrics
(``per_request_spec_decode_metrics="detailed"``) list only the steps that carried drafts, so
neither says at which context length a draft was made when a proposer skips steps (n-gram).
Here the request is added to the engine and the engine stepped by hand, as ``LLM.generate``
does, with ``RequestOutputKind.DELTA``: each step's output holds the tokens that step added,
and the counters read after it (when the engine drafts) hold that step's drafts and accepted
tokens. With one request in the engine every step belongs to it, so each decode step gets:

- ``context``: the tokens in the sequence when its drafts were made (prompt + output so far);
- ``tokens``: the tokens it added (1 + accepted, less any cut by max_tokens or a stop token);
- ``drafted``: the draft tokens it verified (0: the proposer drafted nothing);
- ``accepted``: the draft tokens accepted (as vLLM counts them, before a cut at the end).

The first output token comes from the prefill and is no decode step. Steps that add no token
(a long prompt's prefill in chunks) are not decode steps either.

Reading the counters costs milliseconds a step. With the engine core in this process (the
CPU recipe: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the engine is idle meanwhile, so
``seconds`` leaves that time out and stays the request's own. With the engine core in its own
process (vLLM's default, on GPU) the core may run ahead during a read, so the time is kept
in: the drafter's speed is then understated by at most the reads, never overstated.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from eagle_train.engine.counters import SpecCounters, read_counters

_IDS = itertools.count()


@dataclass
class StepTrace:
    """Per decode step of one request, in order (parallel lists)."""

    context: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def as_record(self) -> dict[str, list[int]]:
        return {
            "step_context": self.context,
            "step_tokens": self.tokens,
            "step_drafted": self.drafted,
            "step_accepted": self.accepted,
        }


@dataclass
class Traced:
    tokens: list[int]
    counters: SpecCounters  # this request's deltas (the sum over its steps)
    seconds: float  # wall time, less the counter reads when the engine core is in process
    steps: StepTrace


def generate_traced(
    llm: Any, prompt: list[int], sampling: dict[str, Any], speculative: bool
) -> Traced:
    """Serve ``prompt`` alone on ``llm`` (a ``vllm.LLM`` with no other request in flight);
    ``speculative``: read the counters after every step (a target alone has none)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.core_client import InprocClient

    engine = llm.llm_engine
    in_process = isinstance(engine.engine_core, InprocClient)
    params = SamplingParams(**sampling, output_kind=RequestOutputKind.DELTA)
    tokens: list[int] = []
    trace = StepTrace()
    overhead = 0.0
    start = time.perf_counter()
    before = first = read_counters(llm) if speculative else SpecCounters()
    overhead += time.perf_counter() - start
    request_id = f"traced-{next(_IDS)}"
    engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, params)
    while engine.has_unfinished_requests():
        outputs = [out for out in engine.step() if out.request_id == request_id]
        new = [t for out in outputs for c in out.outputs for t in c.token_ids]
        if not new:
            continue
        t0 = time.perf_counter()
        after = read_counters(llm) if speculative else before
        overhead += time.perf_counter() - t0
        delta = after - before
        if tokens:  # the prefill's token is no decode step
            trace.context.append(len(prompt) + len(tokens))
            trace.tokens.append(len(new))
            trace.drafted.append(delta.draft_tokens)
            trace.accepted.append(delta.accepted)
        tokens += new
        before = after
    seconds = time.perf_counter() - start - (overhead if in_process else 0.0)
    return Traced(tokens, before - first, seconds, trace)
