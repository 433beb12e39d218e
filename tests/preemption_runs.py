"""Runs interrupted and resumed: a short run's arguments, waiting for a step, and the bitwise
comparison of two runs' final checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from distributed_runs import train_args
from safetensors.torch import load_file

from eagle_train.metrics import read_metrics

STEPS = 12


def args_for(world: Path, data: Path, out: Path, nproc: int, *sets: str) -> list[str]:
    """One global batch of 2 sequences per step (2 ranks x 1, or 1 process x accumulation
    2), a checkpoint only at the end unless a signal asks for one."""
    args = train_args(world, data, out, 1, 1 if nproc == 2 else 2)
    for s in (f"train.max_steps={STEPS}", "train.save_every=1000", *sets):
        args += ["--set", s]
    return args


def wait_for_step(proc, metrics: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics.is_file() and any(r["step"] >= step for r in read_metrics(metrics))):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "training did not reach the step"
        time.sleep(0.05)


def final(run: Path) -> tuple[dict[str, torch.Tensor], dict]:
    ckpt = run / "checkpoints" / f"step-{STEPS:07d}"
    return load_file(ckpt / "draft.safetensors"), torch.load(
        ckpt / "optimizer.pt", weights_only=True
    )


def assert_bitwise_equal(a: Path, b: Path) -> None:
    (draft_a, opt_a), (draft_b, opt_b) = final(a), final(b)
    assert draft_a.keys() == draft_b.keys()
    for key in draft_a:
        assert torch.equal(draft_a[key], draft_b[key]), key
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for name, state in opt_a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, opt_b["state"][name][key]), (name, key)
