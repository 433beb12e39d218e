"""The acceptance arithmetic on hand-made engine counters, against vLLM's own spec-decode
metric code (``vllm/v1/spec_decode/metrics.py``: the scheduler's per-draft bookkeeping and
the logger's mean acceptance length and per-position rates) and hand-counted decode traces:
AL, per-position acceptance, per-request deltas of cumulative counters summed over engines,
tokens per target step and the drafted-step share. No engine is started."""

from __future__ import annotations

import pytest

from eagle_train.engine.counters import SpecCounters, read_counters
from eagle_train.evaluate.steps import (
    drafted_step_share,
    pooled_tokens_per_step,
    request_steps,
    request_tokens_per_step,
)

K = 3


class FakeLLM:
    """What ``LLM.get_metrics()`` returns: vLLM's reader objects, one label set per engine."""

    def __init__(self, stats: list) -> None:
        self.stats = stats

    def get_metrics(self):
        from vllm.v1.metrics.reader import Counter, Vector

        out = []
        for i, s in enumerate(self.stats):
            labels = {"engine": str(i)}
            out += [
                Counter("vllm:spec_decode_num_drafts", labels, s.num_drafts),
                Counter("vllm:spec_decode_num_draft_tokens", labels, s.num_draft_tokens),
                Counter("vllm:spec_decode_num_accepted_tokens", labels, s.num_accepted_tokens),
                Vector(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    labels,
                    list(s.num_accepted_tokens_per_pos),
                ),
                Counter("vllm:prompt_tokens", labels, 999),  # not a spec-decode counter
            ]
        return out


def test_al_and_per_position_rates_equal_vllms_own_arithmetic() -> None:
    from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingStats

    engines = [SpecDecodingStats.new(K), SpecDecodingStats.new(K)]
    engines[0].observe_draft(K, 1)  # earlier traffic: the counters are cumulative
    llm = FakeLLM(engines)
    before = read_counters(llm)
    # one request's drafts, spread over two engines (accepted tokens of K drafted)
    request = {0: [3, 0, 2], 1: [1, 3]}
    logging = SpecDecodingLogging()
    for engine, accepted in request.items():
        step = SpecDecodingStats.new(K)
        for a in accepted:
            engines[engine].observe_draft(K, a)
            step.observe_draft(K, a)
        logging.observe(step)
    delta = read_counters(llm) - before

    # by hand: 5 drafts of 3, 9 accepted; position i accepted when a > i
    assert (delta.drafts, delta.draft_tokens, delta.accepted) == (5, 15, 9)
    assert delta.accepted_per_pos == [4, 3, 2]
    assert delta.acceptance_length == pytest.approx(2.8)
    assert delta.per_position_rate == pytest.approx([0.8, 0.6, 0.4])
    # vLLM's logger on the same drafts
    logged: list = []
    logging.log(lambda fmt, *args: logged.extend(args))
    mean_al, rates = logged[0], logged[5]
    assert delta.acceptance_length == pytest.approx(mean_al)
    assert [f"{r:.3f}" for r in delta.per_position_rate] == rates.split(", ")


def test_counters_without_drafts() -> None:
    empty = SpecCounters(accepted_per_pos=[0, 0, 0])
    assert empty.acceptance_length == 1.0
    assert empty.per_position_rate == [0.0, 0.0, 0.0]


# Hand-made decode traces, K = 3: per decode step the accepted count, or None where the
# proposer drafted nothing (an n-gram miss). Tokens: 1 from the prefill, then 1 + accepted
# per decode step.
TRACES = {
    "every step": [3, 0, 2, 1],
    "skips": [3, None, 0, 2, None],
    "no decode": [],
}


def row(trace: list[int | None]) -> dict:
    drafted = [a for a in trace if a is not None]
    new_tokens = 1 + sum(1 + (a or 0) for a in trace)
    return {"new_tokens": new_tokens, "drafts": len(drafted), "accepted": sum(drafted)}


def test_tokens_per_target_step_on_hand_traces() -> None:
    rows = {name: row(trace) for name, trace in TRACES.items()}
    assert rows["every step"] == {"new_tokens": 11, "drafts": 4, "accepted": 6}
    assert rows["skips"] == {"new_tokens": 11, "drafts": 3, "accepted": 5}
    assert [request_steps(r) for r in rows.values()] == [4, 5, 0]
    assert request_tokens_per_step(rows["every step"]) == 10 / 4
    assert request_tokens_per_step(rows["skips"]) == 10 / 5  # AL over drafts says 1 + 5/3
    assert request_tokens_per_step(rows["no decode"]) == 1.0
    assert pooled_tokens_per_step(rows.values()) == 20 / 9
    assert drafted_step_share(rows.values()) == 7 / 9
    # a proposer that drafts every step: tokens per target step is its AL
    counters = SpecCounters(drafts=4, draft_tokens=12, accepted=6)
    assert request_tokens_per_step(rows["every step"]) == counters.acceptance_length
