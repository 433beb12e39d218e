"""engine/remote.py: a worker process answers calls, and dies with the process that started it
(a killed eval-acceptance must not leave vLLM engines spinning behind it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from eagle_train.engine.remote import Remote

# The worker is busy in a long call (as an engine generating), so it is not waiting on the
# pipe: only the parent-death signal can stop it.
PARENT = """
import threading, time
from eagle_train.engine.remote import Remote
remote = Remote(threading.Event)
remote.submit("wait", 600)
print(remote.proc.pid, flush=True)
time.sleep(600)
"""


class Journal:
    """An object that holds a file open until it is closed (as an engine holds its own)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w")  # noqa: SIM115 (closed by close)

    def note(self, text: str) -> None:
        self.file.write(text)

    def close(self) -> None:
        self.file.write(" closed")
        self.file.close()


def test_a_closed_worker_exits_at_once_after_closing_its_object(tmp_path) -> None:
    """The worker skips the interpreter's teardown once its object is closed: it exits 0
    by the time close() returns, and what the object wrote up to its close() is whole."""
    journal = tmp_path / "journal.txt"
    with Remote(Journal, str(journal)) as remote:
        remote.call("note", "a note")
    assert remote.proc.exitcode == 0
    assert journal.read_text() == "a note closed"


def test_calls_run_in_the_worker() -> None:
    with Remote(dict, [("a", 1)]) as remote:
        assert remote.call("get", "a") == 1
        assert remote.proc.pid != os.getpid()


def test_the_worker_keeps_vllms_engine_core_in_its_own_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker is daemonic and may not start children, so vLLM's V1 engine core must run
    in it (without this, eval-acceptance from a plain shell failed in every engine start)."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with Remote(os.getenv, "VLLM_ENABLE_V1_MULTIPROCESSING") as remote:
        assert remote.call("strip") == "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to reap it is gone
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_worker_dies_with_a_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    assert _alive(worker)
    parent.send_signal(signal.SIGKILL)  # no atexit, no daemon cleanup: only the kernel's signal
    parent.wait()
    deadline = time.monotonic() + 20
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = _alive(worker)
    if survived:
        os.kill(worker, signal.SIGKILL)  # leave nothing behind when this test fails
    assert not survived, "the worker outlived its parent"
