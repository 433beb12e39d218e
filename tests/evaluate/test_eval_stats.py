"""Paired statistics against scipy's reference, and prompt loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from eagle_train.evaluate.prompts import load_prompts
from eagle_train.evaluate.stats import paired_difference


def test_paired_difference_matches_scipy() -> None:
    a = [1.8, 2.1, 2.4, 1.9, 2.2, 2.0, 2.6, 1.7]
    b = [2.0, 2.3, 2.3, 2.2, 2.5, 2.1, 2.9, 1.9]
    ours = paired_difference(a, b)
    ref = stats.ttest_rel(b, a)
    assert ours.t == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (ours.ci_low, ours.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert ours.mean == pytest.approx(0.1875)  # diffs .2 .2 -.1 .3 .3 .1 .3 .2


def test_paired_difference_degenerate_and_bad_input() -> None:
    same = paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert same.mean == pytest.approx(0.5) and same.ci_low == same.ci_high == pytest.approx(0.5)
    with pytest.raises(ValueError, match=">= 2"):
        paired_difference([1.0], [2.0])


def test_mt_bench_ships_with_the_package() -> None:
    prompts = load_prompts()
    assert len(prompts) == 80
    assert {p.category for p in prompts} == {
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    }
    assert all(len(p.turns) == 2 for p in prompts)


def test_custom_prompt_files(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "hi"},
        {"id": "x", "category": "c", "turns": ["a", "b"]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = load_prompts(path)
    assert [p.turns for p in got] == [("hi",), ("a", "b"), ("u",)]
    assert got[1].id == "x" and got[1].category == "c" and got[2].system == "s"
    path.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: expected one of the keys"):
        load_prompts(path)
