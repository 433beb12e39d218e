"""The per-step trace of one request (engine/trace.py) against vLLM's own per-request
metrics (``per_request_spec_decode_metrics="detailed"``: accepted and drafted per drafted
step), with a proposer that drafts on some steps only: vLLM's n-gram lookup on the identity
target, whose prompt holds the first part of the answer (drafted and accepted) but not the
rest (nothing to look up: steps without drafts)."""

from __future__ import annotations

import pytest
import torch
from perfect_drafter import build_identity_target
from transformers import AutoModelForCausalLM

from eagle_train.engine import VllmEngine
from eagle_train.engine.remote import Remote
from eagle_train.engine.trace import generate_traced

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
K = 3


def _cycle(target, start: int, length: int) -> list[int]:
    """The identity target's greedy walk from ``start`` (by transformers)."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        nxt = model(torch.arange(model.config.vocab_size)[:, None]).logits[:, 0].argmax(-1)
    out = [start]
    while len(out) < length:
        out.append(int(nxt[out[-1]]))
    return out


def test_trace_matches_vllms_per_request_metrics(tmp_path) -> None:
    target = build_identity_target(tmp_path / "target")
    walk = _cycle(target, 7, 40)
    # The prompt: the walk's first 12 tokens, then 3 unrelated ones, then the walk's start
    # again: the answer repeats tokens 1..11 (n-gram drafts them), then goes where the
    # prompt never went (no draft).
    prompt = walk[:12] + [walk[30], walk[35], walk[25]] + walk[:1]
    spec = {
        "method": "ngram",
        "model": "ngram",
        "num_speculative_tokens": K,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 2,
    }
    sampling = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    # In its own process: the n-gram proposer loads numba, after which vLLM 0.32 starts no
    # other engine in the process (vllm_engine.engine_starts_here), and this worker runs more.
    job = Remote(_TraceJob, target, prompt, spec, sampling)
    try:
        traced, tokens, per_step = job.call("result")
    finally:
        job.close()
    assert traced.tokens == tokens == walk[1:25]
    steps = traced.steps
    drafted = [(d, a) for d, a in zip(steps.drafted, steps.accepted, strict=True) if d]
    assert drafted == per_step
    assert 0 < len(drafted) < len(steps.tokens)  # some steps drafted, some not
    # contexts: the prompt, the prefill's token, then each step's tokens
    assert steps.context[0] == len(prompt) + 1
    for i in range(1, len(steps.context)):
        assert steps.context[i] == steps.context[i - 1] + steps.tokens[i - 1]
    assert sum(steps.tokens) == len(traced.tokens) - 1
    assert traced.counters.drafts == len(drafted)
    assert traced.counters.accepted == sum(a for _, a in drafted)


class _TraceJob:
    """The request traced by engine/trace.py and by vLLM's own per-request metrics, in the
    process that builds it."""

    def __init__(self, target, prompt: list[int], spec: dict, sampling: dict) -> None:
        from vllm import SamplingParams

        engine = VllmEngine(target, "float32", 256, 64 * 2**20, speculative_config=spec)
        engine.kwargs["per_request_spec_decode_metrics"] = "detailed"
        with engine:
            self.traced = generate_traced(engine.llm, prompt, sampling, speculative=True)
            params = SamplingParams(**sampling)
            (own,) = engine.llm.generate([{"prompt_token_ids": prompt}], params)
        completion = own.outputs[0]
        metrics = completion.spec_decode_metrics
        self.tokens = list(completion.token_ids)
        self.per_step = list(zip(metrics.per_step_drafted, metrics.per_step_accepted, strict=True))

    def result(self) -> tuple:
        return self.traced, self.tokens, self.per_step
