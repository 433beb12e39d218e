"""scripts/plan_budget.py: the recipe's conversations sized from its calibration stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def calibration(tmp_path: Path, probe: bool = True) -> list[str]:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "run").mkdir(exist_ok=True)
    # calibrate-data ran twice (a rerun): the later time counts
    times = "calibrate-data\t999\t1.0\ncalibrate-data\t120\t1.9\ncalibrate-features\t50\t1.8\n"
    (tmp_path / "times.tsv").write_text(times + "calibrate-train\t80\t1.9\n")
    counts = {"rows": 100, "tokens": 28000, "assistant_tokens": 20000}
    # of the 120 s, 20 s started the engine: synthesis and answers took 25 + 75 s; 125 of
    # the 200 samples passed the filters (100 kept), so a full run's prompt costs 0.2 s
    synthesis = {"seconds": 25.0, "requests": 200, "rejected": {"cut_at_limit": 50, "x": 25}}
    meta = {"format": "eagle-train-prepared", "format_version": 1, "tokenizer": "t",
            "max_length": 512, "counts": counts, "synthesis": synthesis,
            "regeneration": {"seconds": 75.0}}  # fmt: skip
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    # of the 50 s of calibrate-features, the shards took 18 + 22 s: 10 s loaded the target
    (tmp_path / "features" / "train").mkdir(parents=True, exist_ok=True)
    shards = [
        {"bytes": 1 << 20, "tokens": 13000, "seconds": 18.0},
        {"bytes": 1 << 20, "tokens": 15000, "seconds": 22.0},
    ]
    manifest = {"format_version": 2, "shards": [[0, 46], [46, 100]], "files": shards}
    (tmp_path / "features" / "train" / "manifest.json").write_text(json.dumps(manifest))
    rows = [
        {"split": "train", "step": 6, "tokens_per_s": 500.0},  # warm-up: not counted
        {"split": "train", "step": 12, "tokens_per_s": 1000.0},
        {"split": "train", "step": 18, "tokens_per_s": 1200.0},
        *([{"split": "acceptance", "step": 24, "seconds": 40.0}] if probe else []),
    ]
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "--times", str(tmp_path / "times.tsv"), "--data", str(tmp_path / "data"),
        "--features", str(tmp_path / "features"), "--run", str(tmp_path / "run"),
    ]  # fmt: skip


def plan(args: list[str], command: str = "size") -> subprocess.CompletedProcess:
    script = REPO / "scripts" / "plan_budget.py"
    return subprocess.run(
        [sys.executable, str(script), command, *args], capture_output=True, text=True
    )


def test_the_plan_fills_the_budget_from_the_measured_costs(tmp_path: Path) -> None:
    result = plan(["--minutes", "90", "--spent", "300", "--epochs", "3", *calibration(tmp_path)])
    assert result.returncode == 0, result.stderr
    got = dict(line.split("=") for line in result.stdout.split())
    # By hand: 0.2 + 0.75 s of generation per conversation (25 s / 125 passing prompts,
    # 75 s / 100 answered), 280 tokens each at 40 s per 28,000 tokens of features (0.4 s),
    # 3 epochs at 1,100 tokens/s: 2.1136 s each. Fixed: the engine's 20 s start, the target's
    # 10 s load, 32 held-out prompts' data, 4 probes of 40 s, 90 s: 310.4 s.
    # Room: 5,400 - 300 - 310.4 = 4,789.6 s -> 2,266.1 conversations, 2,256 in granules of 16.
    assert got["PROMPTS"] == "2256" and got["EPOCHS"] == "3"
    assert got["PLANNED_DATA_S"] == str(round(20 + (2256 + 32) * 0.95))
    assert got["PLANNED_FEATURES_S"] == str(round(10 + 2256 * 0.4))
    assert got["PLANNED_TRAIN_S"] == str(round(3 * 2256 * 280 / 1100 + 160))
    assert abs(int(got["PLANNED_TOTAL_S"]) - 5400) < 2.2 * 16  # within one granule
    fewer = plan(["--minutes", "90", "--spent", "300", "--epochs", "6", *calibration(tmp_path)])
    # 6 epochs: 0.95 + 0.4 + 6 * 280 / 1100 = 2.8773 s each -> 1,664.6 -> 1,664
    assert "PROMPTS=1664\n" in fewer.stdout


def test_without_recorded_seconds_the_stage_walls_count(tmp_path: Path) -> None:
    """Data and a cache from before prepare-data / prepare-features recorded their own
    seconds: the whole stage is per-conversation cost (the plan errs short, never long)."""
    args = calibration(tmp_path)
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    del meta["synthesis"], meta["regeneration"]
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    manifest = {
        "format_version": 2,
        "shards": [[0, 100]],
        "files": [{"bytes": 1 << 20, "tokens": 28000}],
    }
    (tmp_path / "features" / "train" / "manifest.json").write_text(json.dumps(manifest))
    result = plan(["--minutes", "90", "--spent", "300", "--epochs", "3", *args])
    assert result.returncode == 0, result.stderr
    # 1.2 s (120 s / 100) + 0.5 s (50 s / 28,000 tokens x 280) + 0.7636 s = 2.4636 s each;
    # fixed: 32 x 1.2 + 160 + 90 = 288.4 s -> (5,100 - 288.4) / 2.4636 = 1,953.1 -> 1,952
    assert "PROMPTS=1952\n" in result.stdout
    assert "no generation seconds" in result.stderr and "no extraction seconds" in result.stderr


def test_a_budget_too_small_or_a_run_without_a_probe_is_refused(tmp_path: Path) -> None:
    args = calibration(tmp_path, probe=False)
    no_probe = plan(["--minutes", "90", "--epochs", "3", *args])
    assert no_probe.returncode == 2
    assert no_probe.stderr.strip().endswith("expected 2+ logged training steps and a probe")
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({"split": "acceptance", "step": 24, "seconds": 40.0}) + "\n"
        + "".join(json.dumps({"split": "train", "step": s, "tokens_per_s": 1e3}) + "\n"
                  for s in (6, 12))
    )  # fmt: skip
    small = plan(["--minutes", "8", "--spent", "300", "--epochs", "3", *args])
    assert small.returncode == 2 and small.stdout == ""
    assert "MINUTES=8: after 300 s of calibration" in small.stderr
    assert "raise MINUTES" in small.stderr and "Traceback" not in small.stderr
    (tmp_path / "data" / "meta.json").unlink()  # the calibration's data gone: one line
    gone = plan(["--minutes", "90", "--epochs", "3", *args])
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1
    assert "not a prepared dataset" in gone.stderr


def test_training_takes_the_time_the_earlier_stages_left(tmp_path: Path) -> None:
    args = calibration(tmp_path)
    run = args[args.index("--run") + 1]
    cache = tmp_path / "run-features" / "train"
    cache.mkdir(parents=True)
    shards = [
        {"bytes": 1 << 20, "rows": 200, "tokens": 60000},
        {"bytes": 1 << 20, "rows": 200, "tokens": 52000},
    ]
    manifest = {"format_version": 2, "shards": [[0, 200], [200, 400]], "files": shards}
    (cache / "manifest.json").write_text(json.dumps(manifest))

    def steps(spent: str) -> subprocess.CompletedProcess:
        return plan(["--minutes", "90", "--spent", spent, "--features", str(cache.parent),
                     "--run", run, "--micro-batch-size", "4"], "steps")  # fmt: skip

    result = steps("4500")
    assert result.returncode == 0, result.stderr
    # By hand: 400 rows / 4 = 100 steps an epoch, 112,000 tokens -> 1,120 tokens a step.
    # Left: 5,400 - 4,500 - 4 probes x 40 s - 90 s fixed = 650 s at 1,100 tokens/s (the
    # calibration's steady windows) -> 638.4 steps -> 636 (four equal quarters), 647.6 s.
    assert result.stdout == "STEPS=636\nPLANNED_FILL_S=648\n"
    late = steps("5300")  # the earlier stages overran the budget: one epoch still trains
    assert late.returncode == 0 and late.stdout.startswith("STEPS=100\n")
    assert "one epoch instead" in late.stderr
