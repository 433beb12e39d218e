"""Acceptance by context length against hand-counted step traces: each decode step falls in
the bucket of the context it was drafted at (the 4,095/4,096 edge included), a request that
crosses an edge counts in both buckets, tokens per target step and per-position acceptance
per bucket are pooled and per request, and the paired statistics between drafters are per
bucket; the summary, the Markdown and the plot carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_train.evaluate.context import bucket_labels, by_context, paired_by_context
from eagle_train.evaluate.drafter import DrafterInfo
from eagle_train.evaluate.harness import EvalRun
from eagle_train.evaluate.report import summarize, to_markdown, write_report
from eagle_train.evaluate.settings import EvalSettings
from eagle_train.evaluate.steps import pooled_tokens_per_step, request_steps

EDGES = [1024, 2048, 4096]  # <1k, 1-2k, 2-4k, >=4k


def traced(model: str, pid: str, prompt: int, steps: list[tuple[int, int, int, int]]) -> dict:
    """A per_prompt.jsonl record; ``steps``: (context, tokens, drafted, accepted) per decode
    step, contexts written out by hand (prompt + 1 prefill token + the tokens before)."""
    drafted = [s for s in steps if s[2]]
    accepted = sum(s[3] for s in steps)
    return {
        "model": model,
        "id": pid,
        "category": "code",
        "turn": 1,
        "round": None,
        "prompt_tokens": prompt,
        "new_tokens": 1 + sum(s[1] for s in steps),
        "seconds": 1.0,
        "drafts": len(drafted),
        "accepted": accepted,
        "acceptance_length": 1 + accepted / len(drafted) if drafted else 1.0,
        "accepted_per_pos": [sum(s[3] > k for s in drafted) for k in range(3)],
        "output": [],
        "step_context": [s[0] for s in steps],
        "step_tokens": [s[1] for s in steps],
        "step_drafted": [s[2] for s in steps],
        "step_accepted": [s[3] for s in steps],
    }


# "every" drafts on every step (K = 3); "skip" drafts on some (as n-gram does), same outputs.
EVERY = [
    # p1: prompt 1018, first decode step at 1019; crosses 1k after two steps
    traced("every", "p1", 1018, [(1019, 4, 3, 3), (1023, 2, 3, 1), (1025, 1, 3, 0),
                                 (1026, 3, 3, 2), (1029, 4, 3, 3)]),
    traced("every", "p2", 3000, [(3001, 4, 3, 3), (3005, 4, 3, 3), (3009, 2, 3, 1)]),
    # p3: its first step drafts at 4,095 tokens (2-4k), its second at 4,096 (>=4k)
    traced("every", "p3", 4094, [(4095, 1, 3, 0), (4096, 4, 3, 3)]),
]  # fmt: skip
SKIP = [
    traced("skip", "p1", 1018, [(1019, 1, 0, 0), (1020, 1, 0, 0), (1021, 4, 3, 3),
                                (1025, 1, 3, 0), (1026, 1, 0, 0), (1027, 4, 3, 3),
                                (1031, 1, 0, 0), (1032, 1, 0, 0)]),
    traced("skip", "p2", 3000, [(3001, 1, 0, 0), (3002, 4, 3, 3), (3006, 4, 3, 3),
                                (3010, 1, 0, 0)]),
    traced("skip", "p3", 4094, [(4095, 1, 3, 0), (4096, 4, 3, 3)]),
]  # fmt: skip


def _run(records: list[dict]) -> EvalRun:
    settings = EvalSettings(
        target=Path("t"), drafters=[Path("every"), Path("skip")], context_buckets=EDGES
    )
    infos = [
        DrafterInfo(Path("every"), None, "eagle3", 3),
        DrafterInfo(Path("skip"), None, "ngram", 3),
    ]
    return EvalRun(settings=settings, drafters=infos, records=list(records))


def test_bucket_labels() -> None:
    assert bucket_labels(EDGES) == ["<1k", "1-2k", "2-4k", ">=4k"]
    assert bucket_labels([500, 1024, 3000]) == ["<500", "500-1k", "1k-3000", ">=3000"]


def test_buckets_counted_by_hand() -> None:
    rows = {r["bucket"]: r for r in by_context(EVERY, EDGES)}
    assert list(rows) == ["<1k", "1-2k", "2-4k", ">=4k"]
    # <1k: p1's steps at 1019 and 1023: 6 tokens / 2 steps; accepted 3 and 1 of 3
    low = rows["<1k"]
    assert (low["requests"], low["decode_steps"]) == (1, 2)
    assert low["tokens_per_target_step"] == 3.0
    assert low["per_position_rate"] == [1.0, 0.5, 0.5]
    # 1-2k: p1's steps at 1025, 1026, 1029: 8 tokens / 3 steps; accepted 0, 2, 3
    mid = rows["1-2k"]
    assert mid["tokens_per_target_step"] == pytest.approx(8 / 3)
    assert mid["per_position_rate"] == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    # 2-4k: p2's 3 steps (10 tokens) and p3's first (1 token): pooled 11 / 4, per request
    # the mean of 10/3 and 1
    two = rows["2-4k"]
    assert (two["requests"], two["decode_steps"]) == (2, 4)
    assert two["tokens_per_target_step"] == pytest.approx(11 / 4)
    assert two["mean_request_tokens_per_target_step"] == pytest.approx((10 / 3 + 1) / 2)
    # accepted 3, 3, 1 (p2) and 0 (p3): position 1 on 3 of 4 steps, 2 and 3 on 2 of 4
    assert two["per_position_rate"] == pytest.approx([3 / 4, 2 / 4, 2 / 4])
    assert rows[">=4k"]["tokens_per_target_step"] == 4.0
    assert all(r["drafted_step_share"] == 1.0 for r in rows.values())


def test_a_proposer_that_skips_steps_by_bucket() -> None:
    rows = {r["bucket"]: r for r in by_context(SKIP, EDGES)}
    # <1k: steps at 1019, 1020 (not drafted), 1021 (3 accepted): 6 tokens / 3 steps
    low = rows["<1k"]
    assert low["tokens_per_target_step"] == 2.0
    assert low["drafted_step_share"] == pytest.approx(1 / 3)
    assert (low["drafts"], low["per_position_rate"]) == (1, [1.0, 1.0, 1.0])
    # 1-2k: 1025 (0 of 3), 1026, 1027 (3 of 3), 1031, 1032: 8 tokens / 5 steps, 2 drafted
    mid = rows["1-2k"]
    assert mid["tokens_per_target_step"] == pytest.approx(8 / 5)
    assert mid["per_position_rate"] == [0.5, 0.5, 0.5]
    assert rows["2-4k"]["tokens_per_target_step"] == pytest.approx((10 + 1) / (4 + 1))


def test_paired_statistics_per_bucket() -> None:
    paired = {p["bucket"]: p for p in paired_by_context(EVERY, SKIP, EDGES)}
    # <1k: p1 alone, every 3.0 against skip 2.0: too few to pair, skip worse on it
    assert paired["<1k"]["n"] == 1 and paired["<1k"]["mean"] is None
    assert (paired["<1k"]["b_better"], paired["<1k"]["b_worse"]) == (0, 1)
    # 2-4k: p2 10/3 -> 10/4 = 2.5 (-5/6), p3 1 -> 1 (0): mean -5/12; the differences'
    # sd is 5/12 * sqrt(2), sem 5/12, t = -1
    two = paired["2-4k"]
    assert two["n"] == 2 and two["mean"] == pytest.approx(-5 / 12)
    assert two["t"] == pytest.approx(-1.0)
    assert (two["b_better"], two["b_worse"]) == (0, 1)
    assert paired[">=4k"]["mean"] is None and paired[">=4k"]["b_worse"] == 0


def test_traced_steps_count_exactly_where_the_formula_bounds() -> None:
    # A skipping proposer whose last drafts are cut by max_tokens: 1 undrafted step, one
    # with 3 accepted, then one whose 3 accepted drafts only 2 of fit (3 tokens): 8 tokens
    # in 3 decode steps. The counters' formula gives 8 - 6 = 2 steps (a lower bound).
    row = traced("skip", "cut", 10, [(11, 1, 0, 0), (12, 4, 3, 3), (16, 3, 3, 3)])
    assert request_steps(row) == 3
    assert pooled_tokens_per_step([row]) == pytest.approx(8 / 3)
    formula = {k: v for k, v in row.items() if not k.startswith("step_")}
    assert request_steps(formula) == 2


def test_summary_markdown_and_plot(tmp_path: Path) -> None:
    summary = write_report(_run(EVERY + SKIP), tmp_path / "eval")
    every = summary["drafters"]["every"]
    assert [r["bucket"] for r in every["context"]] == ["<1k", "1-2k", "2-4k", ">=4k"]
    assert summary["context_buckets"] == EDGES
    (paired,) = summary["paired"]
    assert [p["bucket"] for p in paired["context"]] == ["<1k", "1-2k", "2-4k", ">=4k"]
    md = (tmp_path / "eval" / "summary.md").read_text()
    assert "By context length at which the tokens were drafted" in md
    assert "| 2-4k | 2 | 4 | 2.750 | 2.167 | 100% | 0.75, 0.50, 0.50 |" in md
    assert "- context 2-4k (2 requests): mean -0.417" in md
    assert (tmp_path / "eval" / "acceptance.png").stat().st_size > 5000
    assert to_markdown(summarize(_run(EVERY + SKIP))) == md


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        EvalSettings(target=Path("t"), drafters=[Path("d")], context_buckets=[2048, 1024])
