"""The signals that stop a run: SIGUSR1 is a preemption notice (a duplicate is not a second one), a second SIGTERM stops at once (issue 18)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import REPO


def test_sigusr1_is_a_preemption_notice_and_a_duplicate_is_not_a_second_one():
    import signal

    from eagle_train.preemption import Preemption

    before = signal.getsignal(signal.SIGUSR1)
    with Preemption(announce=False) as preemption:
        assert not preemption.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # e.g. torchrun forwarding what the job got
        assert preemption.requested and preemption.name == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_second_sigterm_stops_at_once(tmp_path: Path):
    """The first SIGTERM asks for a checkpoint; one sent later (an impatient operator, or a
    scheduler's final notice) ends the process with the signal's default action."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import time\n"
        "from eagle_train.preemption import Preemption\n"
        "with Preemption(announce=False):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    time.sleep(3)  # past the window in which a repeat is the same notice
    assert proc.poll() is None  # the first one only set the flag
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
