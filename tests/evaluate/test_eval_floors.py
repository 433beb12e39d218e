"""eval-acceptance additions: the n-gram floor as a drafter, per-turn AL and greedy equality."""

from __future__ import annotations

from pathlib import Path

from transformers import LlamaConfig

from eagle_train.evaluate.drafter import inspect_drafter
from eagle_train.evaluate.harness import EvalRun
from eagle_train.evaluate.report import summarize, to_markdown
from eagle_train.evaluate.settings import EvalSettings


def test_ngram_is_served_as_vllm_prompt_lookup():
    info = inspect_drafter("ngram", LlamaConfig(), None)
    assert info.speculative_config() == {
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
        "method": "ngram",
        "model": "ngram",
        "num_speculative_tokens": 3,
    }
    assert inspect_drafter("ngram", LlamaConfig(), 5).num_speculative_tokens == 5


def _record(model, pid, turn, drafts, accepted, output):
    return {
        "model": model,
        "id": pid,
        "category": "writing",
        "turn": turn,
        "prompt_tokens": 10,
        "new_tokens": len(output),
        "seconds": 1.0,
        "drafts": drafts,
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "accepted_per_pos": [accepted, 0, 0],
        "output": output,
    }


def test_turns_and_greedy_equality():
    ngram = inspect_drafter("ngram", LlamaConfig(), 3)
    settings = EvalSettings(target=Path("t"), drafters=[Path("ngram")])
    run = EvalRun(settings=settings, drafters=[ngram])
    run.records = [
        _record("target", 1, 1, 0, 0, [5, 6, 7]),
        _record("target", 1, 2, 0, 0, [8, 9]),
        _record("target", 2, 1, 0, 0, [1]),
        _record("ngram", 1, 1, 4, 2, [5, 6, 7]),  # same tokens
        _record("ngram", 1, 2, 2, 0, [8, 8]),  # differs
        _record("ngram", 2, 1, 1, 1, [1]),  # same
    ]
    d = summarize(run)["drafters"]["ngram"]
    assert d["greedy_equal_to_target"] == {"equal": 2, "requests": 3}
    # turn 1: (2 + 1) accepted over (4 + 1) drafts; turn 2: 0 over 2
    assert d["turns"]["1"]["acceptance_length"] == 1 + 3 / 5
    assert d["turns"]["2"]["acceptance_length"] == 1.0
    assert d["overall"]["acceptance_length"] == 1 + 3 / 7
    text = to_markdown(summarize(run))
    (row,) = [line for line in text.splitlines() if line.startswith("| turn 1 |")]
    assert row.split(" | ")[4] == "1.600"  # the AL-over-drafted-steps column
    assert "Greedy outputs equal to the target alone's: 2 of 3 (bfloat16 logits tie" in text
    # an fp32 run names no bf16 ties; all equal: nothing to explain
    fp32 = EvalRun(settings=settings.model_copy(update={"dtype": "float32"}), drafters=[ngram])
    fp32.records = run.records
    text = to_markdown(summarize(fp32))
    assert "2 of 3 (verifying several tokens at once" in text and "bfloat16" not in text
    fp32.records = [r for r in run.records if r["output"] != [8, 8]]
    fp32.records += [_record("ngram", 1, 2, 2, 0, [8, 9])]
    assert "target alone's: 3 of 3\n" in to_markdown(summarize(fp32))
