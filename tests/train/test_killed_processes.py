"""What a killed process leaves behind: a rank dies with its launcher, and a run-directory lock held by a killed process is stale (issue 24)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from distributed_runs import _gone

from eagle_train.fsutil import UnsafePathError, hold_lock


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)
def test_a_rank_dies_with_its_launcher(tmp_path: Path):
    """Before: killing the torchrun launcher (kill -9) left its workers training for about
    25 s, holding the run lock. A "launcher" starts a "rank" the way torchrun does (its
    child, TORCHELASTIC_RUN_ID set), which joins through init_distributed, then is killed."""

    rank = (
        "import time\n"
        "from eagle_train.parallel import init_distributed\n"
        "init_distributed('cpu', 60)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    launcher = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {rank!r}], stdout=subprocess.PIPE)\n"
        "assert child.stdout.readline() == b'ready\\n'\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.update(TORCHELASTIC_RUN_ID="test", WORLD_SIZE="1", RANK="0")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, env=env)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(child, within_s=5), "the rank outlived its launcher"


def test_a_lock_held_by_a_killed_process_is_stale(tmp_path: Path):
    """The run lock of a process killed with -9 (its pid still written in the lock file) does
    not block the next run: the OS released its flock."""

    lock = tmp_path / ".train-draft.lock"
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from eagle_train.fsutil import hold_lock\n"
        f"with hold_lock(Path({str(lock)!r}), 'run directory'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline() == b"held\n"
    with pytest.raises(UnsafePathError, match=f"in use by another process \\(pid {proc.pid} "):
        with hold_lock(lock, "run directory"):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert f"pid {proc.pid}" in lock.read_text()  # left behind, naming the dead holder
    with hold_lock(lock, "run directory"):
        assert f"pid {os.getpid()}" in lock.read_text()
