"""scripts/plan_budget.py: the recipe's conversations sized from its calibration stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def calibration(tmp_path: Path, probe: bool = True) -> list[str]:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "run").mkdir(exist_ok=True)
    # calibrate-data ran twice (a rerun): the later time counts
    times = "calibrate-data\t999\t1.0\ncalibrate-data\t120\t1.9\ncalibrate-features\t50\t1.8\n"
    (tmp_path / "times.tsv").write_text(times + "calibrate-train\t80\t1.9\n")
    counts = {"rows": 100, "tokens": 28000, "assistant_tokens": 20000}
    # of the 120 s, 20 s started the engine: synthesis and answers took 25 + 75 s
    meta = {"counts": counts, "synthesis": {"seconds": 25.0}, "regeneration": {"seconds": 75.0}}
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    rows = [
        {"split": "train", "step": 6, "tokens_per_s": 500.0},  # warm-up: not counted
        {"split": "train", "step": 12, "tokens_per_s": 1000.0},
        {"split": "train", "step": 18, "tokens_per_s": 1200.0},
        *([{"split": "acceptance", "step": 24, "seconds": 40.0}] if probe else []),
    ]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "--times", str(tmp_path / "times.tsv"), "--data", str(tmp_path / "data"),
        "--run", str(tmp_path / "run"),
    ]  # fmt: skip


def plan(args: list[str]) -> subprocess.CompletedProcess:
    script = REPO / "scripts" / "plan_budget.py"
    return subprocess.run(
        [sys.executable, str(script), "size", *args], capture_output=True, text=True
    )


def test_the_plan_fills_the_budget_from_the_measured_costs(tmp_path: Path) -> None:
    result = plan(["--minutes", "90", "--spent", "300", *calibration(tmp_path)])
    assert result.returncode == 0, result.stderr
    got = dict(line.split("=") for line in result.stdout.split())
    # By hand: 1.0 s of generation per conversation ((25 + 75) s / 100), 280 tokens each at
    # 50 s per 28,000 tokens of features, 3 epochs at 1,100 tokens/s: 2.2636 s each.
    # Fixed: the engine's 20 s start, 32 held-out prompts' data, 4 probes of 40 s, 90 s: 302 s.
    # Room: 5,400 - 300 - 302 = 4,798 s -> 2,119.6 conversations, 2,112 in granules of 16.
    assert got["PROMPTS"] == "2112" and got["EPOCHS"] == "3"
    assert got["PLANNED_DATA_S"] == str(20 + 2112 + 32)
    assert got["PLANNED_TRAIN_S"] == str(round(3 * 2112 * 280 / 1100 + 160))
    assert abs(int(got["PLANNED_TOTAL_S"]) - 5400) < 2.3 * 16  # within one granule
    fewer = plan(["--minutes", "90", "--spent", "300", "--epochs", "6", *calibration(tmp_path)])
    # 6 epochs: 1.0 + 0.5 + 6 * 280 / 1100 = 3.0273 s each -> 1,584.9 -> 1,584
    assert "PROMPTS=1584\n" in fewer.stdout


def test_a_budget_too_small_or_a_run_without_a_probe_is_refused(tmp_path: Path) -> None:
    args = calibration(tmp_path, probe=False)
    no_probe = plan(["--minutes", "90", *args])
    assert no_probe.returncode == 2
    assert no_probe.stderr.strip().endswith("expected 2+ logged training steps and a probe")
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({"split": "acceptance", "step": 24, "seconds": 40.0}) + "\n"
        + "".join(json.dumps({"split": "train", "step": s, "tokens_per_s": 1e3}) + "\n"
                  for s in (6, 12))
    )  # fmt: skip
    small = plan(["--minutes", "8", "--spent", "300", *args])
    assert small.returncode == 2 and small.stdout == ""
    assert "MINUTES=8: after 300 s of calibration" in small.stderr
    assert "raise MINUTES" in small.stderr and "Traceback" not in small.stderr
