"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check runs on CPU at toy sizes and
prints its figures, so the script cannot rot while no GPU is at hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "PY": sys.executable}
    out = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run", "--out", str(tmp_path / "check")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    assert "failed steps: 0" in log
    for figure in (
        "tok/s",  # training throughput (bench_train)
        "marginal memory per unit",  # bench_memory against its bound
        "regenerated",  # vLLM regeneration tokens/s
        "Interleaved speedup",  # eval-acceptance with the target alone timed in rounds
        "Greedy outputs equal to the target alone's",
    ):
        assert figure in log, figure
    steps = (
        "2 train (real target)",
        "3 train",
        "3b memory",
        "4 optimizer",
        "5 DDP",
        "7 acceptance",
    )
    for step in steps:
        assert f"--- {step}" in log and f"--- {step}: FAILED" not in log


def test_gpu_check_refuses_unknown_arguments() -> None:
    out = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dryrun"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "unknown argument '--dryrun'" in out.stderr
