"""Exact resume and gradient accumulation, in one process.

A run stopped after its step-3 checkpoint and resumed must end bit for bit where the same run
uninterrupted ends: the draft (EAGLE-1, which draws input-feature noise every step, so the
RNG state matters), the optimizer, the LR schedule (warmup then cosine: the learning rate
changes every step) and the data position all have to come back. And ``grad_accum`` micro-
batches must average, not sum: over identical rows, two micro-batches of 2 take exactly the
step one micro-batch of 2 takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from resume_runs import Stop, config, repeated_rows_data
from safetensors.torch import load_file

import eagle_train.train as loop
from eagle_train.metrics import read_metrics


def final_draft(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / "step-0000006" / "draft.safetensors"))


def test_resumed_run_equals_the_uninterrupted_run_bitwise(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    loop.train(config(tiny_world, tiny_llama_data, whole, "eagle1"))

    real_save = loop._save

    def save_then_stop(run, root, keep_last):
        real_save(run, root, keep_last)
        if run.state.step == 3:
            raise Stop  # as if the job were killed right after the checkpoint

    cut = tmp_path / "cut"
    monkeypatch.setattr(loop, "_save", save_then_stop)
    with pytest.raises(Stop):
        loop.train(config(tiny_world, tiny_llama_data, cut, "eagle1"))
    monkeypatch.setattr(loop, "_save", real_save)
    loop.train(config(tiny_world, tiny_llama_data, cut, "eagle1", "train.resume=auto"))

    a, b = final_draft(whole), final_draft(cut)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed draft differs from uninterrupted"
    steps = {m["step"]: m for m in read_metrics(whole / "metrics.jsonl") if "loss" in m}
    resumed = {m["step"]: m for m in read_metrics(cut / "metrics.jsonl") if "loss" in m}
    for step in (4, 5, 6):
        assert resumed[step]["loss"] == steps[step]["loss"]
        assert resumed[step]["lr"] == steps[step]["lr"]


def test_accumulated_micro_batches_average(tiny_world: Path, tmp_path: Path) -> None:
    data = repeated_rows_data(tiny_world, tmp_path / "same")
    runs = {}
    for accum in (1, 2):
        out = tmp_path / f"accum{accum}"
        cfg = config(
            tiny_world,
            data,
            out,
            "eagle3",
            f"train.grad_accum={accum}",
            "train.max_steps=1",
            "train.save_every=1",
            "draft.ttt_steps=1",
        )
        loop.train(cfg)
        metrics = [m for m in read_metrics(out / "metrics.jsonl") if "grad_norm" in m]
        runs[accum] = metrics[0]["grad_norm"]
    # (g/2 + g/2) == g exactly; a sum instead of a mean would double the norm.
    assert runs[2] == pytest.approx(runs[1], rel=1e-6)
