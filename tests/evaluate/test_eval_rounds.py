"""Interleaved speed measurement with fake engines whose timings the test controls."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle_train.engine import Measured
from eagle_train.engine.counters import SpecCounters
from eagle_train.evaluate.drafter import DrafterInfo
from eagle_train.evaluate.harness import EvalRun, EvalSettings
from eagle_train.evaluate.report import summarize, to_markdown
from eagle_train.evaluate.rounds import Round, interleave, speedup_summary


class Machine:
    """A shared clock: every request served on it advances the request counter; requests
    numbered in ``busy`` run ``slowdown`` times slower (another job on the machine)."""

    def __init__(self, busy: range, slowdown: float) -> None:
        self.served = 0
        self.busy, self.slowdown = busy, slowdown
        self.log: list[str] = []


class FakeEngine:
    def __init__(self, name: str, machine: Machine, seconds_per_token: float) -> None:
        self.name, self.machine, self.spt = name, machine, seconds_per_token

    def generate_one_by_one(self, prompts, sampling, seeds=None):
        out = []
        self.machine.log.append(self.name)
        for p in prompts:
            n = sampling["max_tokens"]
            load = self.machine.slowdown if self.machine.served in self.machine.busy else 1.0
            self.machine.served += 1
            out.append(Measured(list(p) + [0] * (n - len(p)), SpecCounters(), n * self.spt * load))
        return out


def test_rounds_alternate_and_the_median_ignores_a_load_burst():
    # Drafter twice as fast as the target. A burst slows requests 16..23 down 5x: in a
    # sequential measurement (16 target requests, then 16 drafter ones) it would hit only
    # the drafter and report 0.4x; interleaved it hits one turn of one round.
    machine = Machine(busy=range(16, 24), slowdown=5.0)
    target = FakeEngine("target", machine, 0.010)
    drafter = FakeEngine("drafter", machine, 0.005)
    prompts = [[i] for i in range(16)]
    t, d, rounds = interleave(target, drafter, prompts, {"max_tokens": 4}, round_size=4)
    assert machine.log == ["target", "drafter", "drafter", "target"] * 2
    assert [m.tokens[0] for m in t] == [m.tokens[0] for m in d] == list(range(16))
    assert [r.target_first for r in rounds] == [True, False, True, False]
    ratios = [r.ratio for r in rounds]
    # round 2 (requests 16..19 target, 20..23 drafter): both slowed, ratio 2; the others 2.
    assert ratios == pytest.approx([2.0, 2.0, 2.0, 2.0])
    machine = Machine(busy=range(16, 20), slowdown=5.0)  # only round 2's target turn
    _, _, rounds = interleave(
        FakeEngine("target", machine, 0.010),
        FakeEngine("drafter", machine, 0.005),
        prompts,
        {"max_tokens": 4},
        round_size=4,
    )
    assert [r.ratio for r in rounds] == pytest.approx([2.0, 2.0, 10.0, 2.0])
    s = speedup_summary(rounds, tokens_per_target_step=3.0)
    assert s["median"] == pytest.approx(2.0)
    assert (s["min"], s["max"]) == pytest.approx((2.0, 10.0))
    assert s["q1"] == pytest.approx(2.0) and s["q3"] == pytest.approx(4.0)
    assert s["fault"] is False


def test_speedup_above_tokens_per_target_step_is_a_fault():
    rounds = [Round(i, i % 2 == 0, 100, 1.0, 100, 1.0 / 1.96) for i in range(3)]
    s = speedup_summary(rounds, tokens_per_target_step=1.24)
    assert s["median"] == pytest.approx(1.96)
    assert s["fault"] is True and "exceeds the 1.24 tokens per target step" in s["fault_reason"]
    assert speedup_summary(rounds, tokens_per_target_step=2.0)["fault"] is False
    assert speedup_summary([], 2.0)["median"] is None


def record(model, pid, turn, output, seconds, drafts=0, accepted=0):
    return {
        "model": model,
        "id": pid,
        "category": "c",
        "turn": turn,
        "round": 0,
        "prompt_tokens": 3,
        "new_tokens": len(output),
        "seconds": seconds,
        "drafts": drafts,
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "accepted_per_pos": [accepted],
        "output": output,
    }


def test_report_counts_equal_greedy_outputs_and_flags_faults():
    info = DrafterInfo(Path("d"), None, "eagle3", 1)  # type: ignore[arg-type]
    run = EvalRun(EvalSettings(target=Path("t"), drafters=[Path("d")]), [info])
    run.records = [
        record("target", "a", 1, [1, 2, 3, 4], 4.0),
        record("target", "b", 1, [5, 6, 7, 8], 4.0),
        record("d", "a", 1, [1, 2, 3, 4], 1.0, drafts=2, accepted=2),  # equal
        record("d", "b", 1, [5, 6, 9, 9], 1.0, drafts=2, accepted=2),  # differs at token 3
    ]
    # AL = 1 + 4/4 = 2 tokens per target step, but the rounds say 4x: a fault.
    run.rounds = {"d": [Round(0, True, 8, 8.0, 8, 2.0)]}
    summary = summarize(run)
    d = summary["drafters"]["d"]
    assert d["greedy_equal_to_target"] == {"equal": 1, "requests": 2}
    assert d["overall"]["acceptance_length"] == 2.0
    assert d["overall"]["speedup"] == pytest.approx(4.0)  # 8 tok / 2 s vs 8 tok / 8 s
    assert d["speedup"]["median"] == pytest.approx(4.0) and d["speedup"]["fault"] is True
    md = to_markdown(summary)
    assert "MEASUREMENT FAULT" in md and "equal to the target alone's: 1 of 2" in md
