"""``train-draft`` as the distributed tests launch it (directly or under torchrun), with two
test-only hooks set through the environment:

- ``EAGLE_TEST_PID_DIR``: each process writes ``rank-R.pid`` there, so a test can kill or
  watch every rank;
- ``EAGLE_TEST_FAIL_AT=R:N``: rank R raises at the end of optimizer step N, after writing
  the time into ``fault.time`` in the pid directory;
- ``EAGLE_TEST_NAN_AT=R:N``: rank R's loss is NaN in its N-th micro-batch (1-based);
- ``EAGLE_TEST_STEP_SLEEP=S``: every rank sleeps S seconds after each optimizer step (a
  slower run that a test can signal mid-way; the numbers are unchanged).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import eagle_train.train as loop
from eagle_train.cli import train_draft_app
from eagle_train.optim import PrecisionGuard

RANK = int(os.environ.get("RANK", "0"))

if "EAGLE_TEST_PID_DIR" in os.environ:
    Path(os.environ["EAGLE_TEST_PID_DIR"], f"rank-{RANK}.pid").write_text(str(os.getpid()))

if "EAGLE_TEST_FAIL_AT" in os.environ:
    fail_rank, fail_step = map(int, os.environ["EAGLE_TEST_FAIL_AT"].split(":"))
    after_step = PrecisionGuard.after_step

    def failing(self, optimizer, step):  # type: ignore[no-untyped-def]
        after_step(self, optimizer, step)
        if RANK == fail_rank and step == fail_step:
            Path(os.environ["EAGLE_TEST_PID_DIR"], "fault.time").write_text(str(time.time()))
            raise RuntimeError(f"injected fault on rank {RANK} at step {step}")

    PrecisionGuard.after_step = failing  # type: ignore[method-assign]

if "EAGLE_TEST_STEP_SLEEP" in os.environ:
    pause = float(os.environ["EAGLE_TEST_STEP_SLEEP"])
    stepped = PrecisionGuard.after_step

    def slow(self, optimizer, step):  # type: ignore[no-untyped-def]
        stepped(self, optimizer, step)
        time.sleep(pause)

    PrecisionGuard.after_step = slow  # type: ignore[method-assign]

if "EAGLE_TEST_NAN_AT" in os.environ:
    nan_rank, nan_call = map(int, os.environ["EAGLE_TEST_NAN_AT"].split(":"))
    real_parts, calls = loop.loss_parts, [0]

    def poisoned(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        parts = real_parts(*args, **kwargs)
        if RANK != nan_rank or calls[0] != nan_call:
            return parts

        def nan(part):  # type: ignore[no-untyped-def]
            result = part()
            result.loss = result.loss * float("nan")
            return result

        return [lambda p=p: nan(p) for p in parts]

    loop.loss_parts = poisoned

if __name__ == "__main__":
    sys.exit(train_draft_app(sys.argv[1:]))
