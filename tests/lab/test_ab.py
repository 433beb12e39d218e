"""The paired A/B table and the RMSNorm gain statistics of research/ab_experiment.py, against
hand-computed values."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

RESEARCH = Path(__file__).resolve().parents[2] / "research"
sys.path.insert(0, str(RESEARCH))  # the tools import each other as plain modules

from ab import norm_gain_stats, paired_table, table_markdown  # noqa: E402


def rec(model: str, pid: str, cat: str, drafts: int, accepted: int, new_tokens: int) -> dict:
    return {
        "model": model,
        "id": pid,
        "turn": 1,
        "category": cat,
        "new_tokens": new_tokens,
        "drafts": drafts,
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts,
    }


# decode steps S = new - 1 - accepted (at least the drafts); tokens per target step (new-1)/S
RECORDS = [
    rec("target", "p1", "x", 1, 0, 21),  # the no-draft baseline: ignored
    rec("A", "p1", "x", 10, 5, 21),  # S 15: 20/15; AL 1.5
    rec("A", "p2", "x", 10, 10, 21),  # S 10: 2.0; AL 2.0
    rec("A", "p3", "y", 4, 2, 9),  # S 6: 8/6; AL 1.5
    rec("A", "p4", "y", 5, 0, 6),  # S 5: 1.0; AL 1.0
    rec("B", "p2", "x", 10, 12, 23),  # S 10: 2.2 (order differs from A's)
    rec("B", "p1", "x", 8, 8, 21),  # S 12 (4 steps undrafted): 20/12 while AL says 2.0
    rec("B", "p3", "y", 4, 4, 9),  # S 4: 2.0
    rec("B", "p4", "y", 5, 5, 11),  # S 5: 2.0
]


def test_paired_table_per_category_and_overall() -> None:
    x, y, overall = paired_table(RECORDS, "A", "B")
    # x: per request 20/15, 2.0 vs 20/12, 2.2: differences 1/3, .2: mean 4/15, sem 1/15, t 4
    assert (x.category, x.n) == ("x", 2)
    assert x.diff == pytest.approx(4 / 15) and x.t == pytest.approx(4.0)
    assert (x.mean_a, x.mean_b) == pytest.approx(((4 / 3 + 2) / 2, (5 / 3 + 2.2) / 2))
    assert x.ci_low == pytest.approx(4 / 15 - 12.7062 / 15, abs=1e-3)
    assert x.tps_a == pytest.approx(40 / 25) and x.tps_b == pytest.approx(42 / 22)  # pooled
    assert x.al_a == pytest.approx(1.75) and x.al_b == pytest.approx(1 + 20 / 18)
    # y: 8/6, 1.0 vs 2.0, 2.0: differences 2/3, 1: mean 5/6, sem 1/6, t 5
    assert y.diff == pytest.approx(5 / 6) and y.t == pytest.approx(5.0)
    assert y.tps_a == pytest.approx(13 / 11) and y.tps_b == pytest.approx(18 / 9)
    assert y.al_a == pytest.approx(1 + 2 / 9) and y.al_b == pytest.approx(2.0)
    # overall: differences 1/3, .2, 2/3, 1: mean .55, sum of squared deviations
    # (.55-1/3)^2 + .35^2 + (2/3-.55)^2 + .45^2 = 0.385556, var /3, t_.975,3 = 3.1824
    sem = (0.3855556 / 3 / 4) ** 0.5
    assert overall.n == 4 and overall.diff == pytest.approx(0.55)
    assert overall.t == pytest.approx(0.55 / sem, rel=1e-5)
    assert (overall.ci_low, overall.ci_high) == pytest.approx(
        (0.55 - 3.18245 * sem, 0.55 + 3.18245 * sem), abs=1e-4
    )
    assert overall.tps_a == pytest.approx(53 / 36) and overall.tps_b == pytest.approx(60 / 31)
    assert overall.al_a == pytest.approx(1 + 17 / 29) and overall.al_b == pytest.approx(1 + 29 / 27)


def test_unpaired_requests_are_an_error() -> None:
    with pytest.raises(ValueError, match="one drafter only"):
        paired_table(RECORDS[:-1], "A", "B")


def test_norm_gain_stats_count_moved_elements() -> None:
    state = {
        "layers.0.input_layernorm.weight": torch.tensor([1.0, 1.0, 0.99609375]).bfloat16(),
        "norm.weight": torch.tensor([1.0078125, 1.0]).bfloat16(),
        "fc.weight": torch.full((2, 2), 3.0),  # not a gain
        "layers.0.self_attn.q_proj.weight": torch.ones(2, 2),
    }
    got = norm_gain_stats(state)
    assert got["tensors"] == 2 and got["elements"] == 5 and got["moved"] == 2
    assert got["max_abs_change"] == 0.0078125
    assert got["mean_abs_change"] == pytest.approx((0.00390625 + 0.0078125) / 5)


def test_markdown_shows_the_means_the_difference_is_of() -> None:
    text = table_markdown(paired_table(RECORDS, "A", "B"), "A", "B")
    assert "| mean tokens/step A | mean tokens/step B | diff (B - A) |" in text
    assert "| AL over drafted steps A | AL over drafted steps B |" in text
    # overall: means (4/3+2+4/3+1)/4 and (5/3+2.2+2+2)/4, difference +0.55, pooled 53/36
    # and 60/31, AL 1 + 17/29 and 1 + 29/27
    assert "| **overall** | 4 | 1.417 | 1.967 | +0.550 |" in text
    assert text.rstrip().endswith("| 1.472 | 1.935 | 1.586 | 2.074 |")


def test_an_arm_trains_with_its_own_checkout(tmp_path, monkeypatch) -> None:
    """Before: ``python -m`` put the working directory (the repository) first on sys.path, so
    the "before" arm of a code comparison silently trained with the current code."""
    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "ab_experiment", repo / "research/ab_experiment.py"
    )
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    checkout = tmp_path / "before"
    (checkout / "eagle_train").mkdir(parents=True)
    (checkout / "eagle_train" / "__init__.py").write_text("")
    (checkout / "eagle_train" / "cli.py").write_text(
        "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text(__file__)\n"
    )
    monkeypatch.chdir(repo)  # where the experiments are run from
    ab.cli(checkout, str(tmp_path / "ran"))
    assert (tmp_path / "ran").read_text() == str(checkout / "eagle_train" / "cli.py")


def test_ab_experiment_takes_the_same_sampling_settings() -> None:
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ab_sampling", Path(__file__).resolve().parents[2] / "research/ab_experiment.py"
    )
    ab = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ab)  # type: ignore[union-attr]

    def flags(**kw):
        return argparse.Namespace(**{"temperature": None, "top_p": None, "top_k": None,
                                     "seed": None, **kw})  # fmt: skip

    assert ab.sampling_sets(flags()) == []
    assert ab.sampling_sets(flags(temperature=0.8, top_k=5)) == ["temperature=0.8", "top_k=5"]
    with pytest.raises(ValueError, match="top_p applies only when sampling"):
        ab.sampling_sets(flags(top_p=0.9))  # refused before anything trains
    with pytest.raises(ValueError, match="seed applies only when sampling"):
        ab.sampling_sets(flags(seed=1))  # a seed would change nothing at temperature 0
    with pytest.raises(ValueError, match="--top-k"):
        ab.sampling_sets(flags(temperature=1.0, top_k=0))
