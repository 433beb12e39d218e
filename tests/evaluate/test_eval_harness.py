"""eval-acceptance end to end in vLLM: a drafter perfect by construction measures exactly
K+1, a random one about 1.0; both turns, per-category tables, plot, paired statistics."""

from __future__ import annotations

import json

import pytest
from perfect_drafter import build_identity_target, build_perfect_eagle3, build_random_eagle3
from transformers import AutoTokenizer

from eagle_train.evaluate.harness import EvalSettings, run_eval
from eagle_train.evaluate.report import write_report

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
K = 3


def _target(root):
    """The identity target with a chat template that joins the turns by spaces (words are
    tokens)."""
    target = build_identity_target(root / "target")
    tok = AutoTokenizer.from_pretrained(target)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("harness")
    target = _target(root)
    prompts = root / "prompts.jsonl"
    rows = [
        {"id": "a", "category": "walk", "turns": ["t5 t17 t40", "t9"]},
        {"id": "b", "category": "jump", "turns": ["t90 t3", "t60 t61"]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    perfect = build_perfect_eagle3(target, root / "perfect", K)
    random = build_random_eagle3(target, root / "random", K)
    settings = EvalSettings(
        target=target,
        drafters=[perfect, random],
        prompts=str(prompts),
        turns=2,
        max_new_tokens=16,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        ignore_eos=True,
        context_buckets=[8, 16],  # these short prompts cross both edges
    )
    run = run_eval(settings)
    summary = write_report(run, root / "out")
    return {
        "run": run,
        "summary": summary,
        "out": root / "out",
        "perfect": perfect,
        "random": random,
    }


def test_perfect_drafter_measures_k_plus_one(evaluated: dict) -> None:
    d = evaluated["summary"]["drafters"][str(evaluated["perfect"])]
    assert d["num_speculative_tokens"] == K
    assert d["overall"]["acceptance_length"] == K + 1
    assert d["overall"]["per_position_rate"] == [1.0] * K
    # 16 new tokens: the prefill's, then 4 drafted steps (the last cut by max_tokens)
    assert d["overall"]["tokens_per_target_step"] == 15 / 4
    assert set(d["categories"]) == {"walk", "jump"}
    assert all(c["acceptance_length"] == K + 1 for c in d["categories"].values())


def test_random_drafter_measures_about_one(evaluated: dict) -> None:
    d = evaluated["summary"]["drafters"][str(evaluated["random"])]
    assert 1.0 <= d["overall"]["acceptance_length"] < 1.1


def test_both_turns_use_the_targets_own_first_answer(evaluated: dict) -> None:
    records = evaluated["run"].records
    target = [r for r in records if r["model"] == "target"]
    assert [(r["id"], r["turn"]) for r in target] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    for first, second in ((target[0], target[2]), (target[1], target[3])):
        # turn 2 = turn-1 prompt + the 16 answer tokens + the second user message
        assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"]
    for name in (evaluated["perfect"], evaluated["random"]):  # greedy: lossless
        outs = [r["output"] for r in records if r["model"] == str(name)]
        assert outs == [r["output"] for r in target]
        d = evaluated["summary"]["drafters"][str(name)]
        assert d["greedy_equal_to_target"] == {"equal": 4, "requests": 4}


def test_target_and_drafters_are_timed_in_alternating_rounds(evaluated: dict) -> None:
    # 2 prompts per turn, rounds of 8 requests: one round per turn and drafter, each
    # timing both engines on the same requests (the target alone is re-timed per drafter).
    run = evaluated["run"]
    for name in (evaluated["perfect"], evaluated["random"]):
        rounds = run.rounds[str(name)]
        assert [(r.index, r.target_first) for r in rounds] == [(0, True), (1, True)]
        assert all(r.target_tokens == r.drafter_tokens == 2 * 16 for r in rounds)
        speed = evaluated["summary"]["drafters"][str(name)]["speedup"]
        assert speed["rounds"] == 2 and speed["median"] > 0
        overall = evaluated["summary"]["drafters"][str(name)]["overall"]
        assert speed["tokens_per_target_step"] == overall["tokens_per_target_step"]


def test_report_files_and_paired_statistics(evaluated: dict) -> None:
    out = evaluated["out"]
    lines = (out / "per_prompt.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 4  # target + 2 drafters, 2 prompts x 2 turns
    assert (out / "acceptance.png").stat().st_size > 5000
    md = (out / "summary.md").read_text()
    assert (
        "| walk |" in md
        and "| **overall** |" in md
        and "Paired difference in tokens per target step" in md
    )
    (paired,) = evaluated["summary"]["paired"]
    assert paired["n"] == 4 and paired["mean"] < -2.5
    assert paired["ci_high"] < 0
    assert evaluated["summary"]["baseline_tokens_per_s"] > 0


def test_acceptance_only_serves_the_target_once(tmp_path) -> None:
    """interleave=False: the target alone once (both turns), then the drafter on the same
    requests; the same acceptance as the interleaved run, no rounds."""
    target = _target(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "turns": ["t5 t17 t40", "t9"]}) + "\n")
    perfect = build_perfect_eagle3(target, tmp_path / "perfect", K)
    settings = EvalSettings(
        target=target,
        drafters=[perfect],
        prompts=str(prompts),
        turns=2,
        max_new_tokens=16,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=64 * 2**20,
        ignore_eos=True,
        interleave=False,
    )
    run = run_eval(settings)
    assert [(r["model"], r["turn"]) for r in run.records] == [
        ("target", 1),
        ("target", 2),
        (str(perfect), 1),
        (str(perfect), 2),
    ]
    assert run.rounds == {}
    target_out = [r["output"] for r in run.records if r["model"] == "target"]
    assert [r["output"] for r in run.records if r["model"] == str(perfect)] == target_out
    assert all(r["acceptance_length"] == K + 1 for r in run.records if r["drafts"])


def test_steps_traced_and_split_by_context_length(evaluated: dict) -> None:
    """Every request's decode steps are traced (contexts follow the tokens each step added,
    the counters are their sums) and the summary splits them by context length: the perfect
    drafter accepts every draft in every bucket."""
    for r in evaluated["run"].records:
        assert r["step_context"][0] == r["prompt_tokens"] + 1
        ends = [c + t for c, t in zip(r["step_context"], r["step_tokens"], strict=True)]
        assert r["step_context"][1:] == ends[:-1]
        assert sum(r["step_tokens"]) == r["new_tokens"] - 1 == 15  # 16 new tokens
        assert len(r["step_tokens"]) == r["decode_steps"]
        assert sum(r["step_accepted"]) == r["accepted"]
        assert sum(d > 0 for d in r["step_drafted"]) == r["drafts"]
    perfect = evaluated["summary"]["drafters"][str(evaluated["perfect"])]["context"]
    assert [row["bucket"] for row in perfect] == ["<8", "8-16", ">=16"]
    for row in perfect:
        assert row["per_position_rate"] == [1.0] * K and row["drafted_step_share"] == 1.0
    (paired,) = evaluated["summary"]["paired"]
    assert [p["bucket"] for p in paired["context"]] == ["<8", "8-16", ">=16"]
    assert (
        "By context length at which the tokens were drafted"
        in (evaluated["out"] / "summary.md").read_text()
    )
