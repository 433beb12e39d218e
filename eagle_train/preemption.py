"""Preemption: SIGTERM (what SLURM and Kubernetes send before a kill) or SIGUSR1 (what some
clusters send ahead of a time limit) asks the run to stop cleanly. The handler only sets a
flag; the loop checks it after each optimizer step, all ranks agree on it, a checkpoint is
written and the process exits 0 with the command that resumes.

The same signal arriving again within ``duplicate_window_s`` is the same notice (a
scheduler signals every process of a job, and torchrun forwards the signal it got to its
workers as well); a later one stops the process at once with the signal's default action.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preemption:
    """Context manager that installs the handlers for the block and restores the old ones."""

    def __init__(self, duplicate_window_s: float = 2.0, announce: bool = True) -> None:
        self.signum: int | None = None
        self._first = 0.0
        self._window = duplicate_window_s
        self._announce = announce
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def __enter__(self) -> Preemption:
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                break
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._first = signum, now
            if self._announce:
                name = signal.Signals(signum).name
                os.write(
                    2,
                    f"received {name}: finishing this step, then writing a checkpoint "
                    f"(another {name} stops at once)\n".encode(),
                )
            return
        if now - self._first < self._window:
            return  # the same notice, delivered twice
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run: this one with ``--resume auto``."""
    argv = list(sys.argv if argv is None else argv)
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            args.append(arg)
    prog = Path(argv[0]).name if argv else "train-draft"
    if prog in ("cli.py", "__main__.py"):
        prog = "python -m eagle_train.cli"
    command = f"{prog} {shlex.join([*args, '--resume', 'auto'])}"
    if "TORCHELASTIC_RUN_ID" in os.environ:  # launched by torchrun: relaunch the same way
        return f"the same torchrun (or scripts/launch.sh) launch of: {command}"
    return command
