"""Fault injection with real processes (issue 18): the run-directory lock held against a
second run and released by kill -9, and SIGTERM (one process; 2 ranks under torchrun)
ending a run with a checkpoint of the last finished step, after which ``--resume auto``
is bitwise equal to a run that was never interrupted."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from distributed_runs import finish, launch
from preemption_runs import STEPS, args_for, assert_bitwise_equal, wait_for_step

from eagle_train.checkpoint import find_resumable
from eagle_train.metrics import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_a_second_run_is_refused_while_the_first_holds_the_directory(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: both runs trained into one directory (every step logged twice, checkpoints
    replaced by the other run's), and a starting ``--resume auto`` removed the live run's
    save in progress."""
    out = tmp_path / "run"
    args = args_for(
        tiny_world, tiny_llama_data, out, 1, "train.max_steps=100000", "train.save_every=2"
    )
    first = launch(args, 1, tmp_path / "p1", EAGLE_TEST_STEP_SLEEP="0.2")
    second = None
    try:
        wait_for_step(first, out / "metrics.jsonl", 2)
        in_progress = out / "checkpoints" / ".step-0000099.tmp-live0000"  # a save under way
        in_progress.mkdir(parents=True)
        users = out / "checkpoints" / ".step-notes"  # the user's, not a save's temporary
        users.mkdir()
        second = launch([*args, "--resume", "auto"], 1, tmp_path / "p2")
        output, _ = second.communicate(timeout=300)
        holder = int((tmp_path / "p1" / "rank-0.pid").read_text())
        assert second.returncode == 2, output[-3000:]
        error = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and f"in use by another process (pid {holder} on" in error[0]
        assert "Traceback" not in output
        assert in_progress.is_dir()
        # kill -9 leaves no stale lock: the OS released it with the process.
        wait_for_step(first, out / "metrics.jsonl", 4)  # step 2 is saved by now
    finally:  # never leave an endless run behind, whatever failed
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == list(range(1, len(steps) + 1))  # one writer: each step once
    newest = find_resumable(out / "checkpoints")
    assert newest is not None, "the first run saved no checkpoint before it was killed"
    resumed_to = int(newest.name[5:]) + 2
    sets = ["--resume", "auto", "--set", f"train.max_steps={resumed_to}"]
    finish(launch([*args, *sets], 1, tmp_path / "p3"))
    assert not in_progress.exists()  # its writer is dead: removed under the lock
    assert users.is_dir()
    assert (out / "checkpoints" / f"step-{resumed_to:07d}").is_dir()


@pytest.fixture(scope="module")
def references(tiny_world: Path, tiny_llama_data: Path, tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("preempt")
    runs = {}
    for nproc in (1, 2):
        runs[nproc] = root / f"reference-{nproc}"
        args = args_for(tiny_world, tiny_llama_data, runs[nproc], nproc)
        finish(launch(args, nproc, root / f"pids-{nproc}"))
    return runs


@pytest.mark.parametrize("nproc, whom", [(1, "process"), (2, "launcher"), (2, "group")])
def test_sigterm_saves_the_last_step_and_resume_is_bitwise_equal(
    references, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, nproc: int, whom: str
):
    """Before: SIGTERM killed the run at once and lost every step since the last
    ``save_every``. ``launcher``: SIGTERM to torchrun alone, which forwards it to its
    workers; ``group``: SIGTERM to torchrun and every worker at once, as SLURM's scancel
    and time limit do (each worker gets it twice: the same notice, not a second one)."""
    out = tmp_path / "run"
    args = args_for(tiny_world, tiny_llama_data, out, nproc)
    # torchrun gives its workers 30 s after forwarding the signal, then SIGKILLs them: more
    # here, so that a loaded test machine does not turn the test into a kill -9 one.
    proc = launch(
        args,
        nproc,
        tmp_path / "pids",
        EAGLE_TEST_STEP_SLEEP="0.3",
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT="300",
    )
    wait_for_step(proc, out / "metrics.jsonl", 3)
    os.kill(proc.pid, signal.SIGTERM)
    if whom == "group":  # SLURM signals every process of the step, whatever its group
        for rank in range(nproc):
            os.kill(int((tmp_path / "pids" / f"rank-{rank}.pid").read_text()), signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    if nproc == 1:
        assert proc.returncode == 0, output[-3000:]
    else:
        # torchrun re-raises the signal it got as an error once its workers have exited
        # (measured: exit code 1 and a SignalException), whatever the workers returned;
        # the workers themselves finished the step, saved and returned normally.
        assert proc.returncode != 0, output[-3000:]
        assert "SignalException" in output, output[-3000:]
    stopped = [line for line in output.splitlines() if "stopped by SIGTERM after step" in line]
    assert len(stopped) == 1, output[-3000:]
    assert "Resume with:" in stopped[0] and "--resume auto" in stopped[0]
    assert "stopped by SIGTERM; resume with:" in output  # the CLI returned normally
    saved = find_resumable(out / "checkpoints")
    logged = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert saved is not None and 3 <= int(saved.name[5:]) < STEPS
    assert logged == list(range(1, int(saved.name[5:]) + 1))  # no finished step is lost

    finish(launch([*args, "--resume", "auto"], nproc, tmp_path / "pids"))
    assert_bitwise_equal(references[nproc], out)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
