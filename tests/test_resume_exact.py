"""Exact resume and gradient accumulation, in one process.

A run stopped after its step-3 checkpoint and resumed must end bit for bit where the same run
uninterrupted ends: the draft (EAGLE-1, which draws input-feature noise every step, so the
RNG state matters), the optimizer, the LR schedule (warmup then cosine: the learning rate
changes every step) and the data position all have to come back. And ``grad_accum`` micro-
batches must average, not sum: over identical rows, two micro-batches of 2 take exactly the
step one micro-batch of 2 takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, draft_vocab_sets
from safetensors.torch import load_file

import eagle_train.train as loop
from eagle_train.config import load_config
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig


class Stop(Exception):
    pass


def config(world: Path, data: Path, out: Path, algorithm: str, *extra: str) -> RunConfig:
    sets = [
        f"target.path={world / 'targets' / 'llama' / 'bf16'}",
        f"data.train={data}",
        "data.val=null",
        "data.micro_batch_size=2",
        "data.max_length=48",
        "train.grad_accum=2",
        "train.max_steps=6",
        "train.save_every=3",
        "train.keep_last=5",
        "train.log_every=1",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=2",
        f"train.output_dir={out}",
        *draft_vocab_sets(algorithm),
        *extra,
    ]
    path = REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml"
    return load_config(RunConfig, path, sets)


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


def repeated_rows_data(world: Path, out: Path) -> Path:
    """A prepared dataset whose rows are all the same chat."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data

    first = json.loads((world / "data" / "train.jsonl").read_text().splitlines()[0])
    chats = out.parent / "same.jsonl"
    chats.write_text("".join(json.dumps({**first, "id": f"copy-{i}"}) + "\n" for i in range(8)))
    sets = [
        f"inputs=[{chats}]",
        f"output_dir={out}",
        f"tokenizer={world / 'targets' / 'llama' / 'bf16'}",
        "max_length=256",
    ]
    prepare_data(load_config(PrepareDataConfig, None, sets))
    return out


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
