"""Every command flushes subnormal floats to zero on the CPU, in every thread of torch's pool
(a trained draft's activations hold enough of them to halve CPU training speed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

# A parallel multiply over subnormal inputs, after (or without) the command's first step,
# with two threads so that the pool's worker computes part of it: prints the nonzero count.
SCRIPT = """
import sys, torch
from eagle_train import cli
if sys.argv[1] == "start":
    cli._start(False)
torch.set_num_threads(2)
x = torch.full((1 << 22,), 1e-39)
print(int(((x * 1.5) != 0).sum()))
"""


def nonzero(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def test_commands_flush_subnormals_in_every_thread() -> None:
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals")
    assert nonzero("plain") == 1 << 22  # the arithmetic keeps them by default
    assert nonzero("start") == 0
