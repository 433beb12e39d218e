"""Issue 24, "batches with no supervised token log loss 0 and simulated AL 0 into the
averages": the training window and validation average only batches with supervised slots
(weighted by them); a window or validation with none logs no loss or acceptance at all,
rather than a made-up 0. The loop runs for real; the loader (or the validation batches) has
the loss mask of chosen micro-batches zeroed, and each micro-batch's own loss is recorded
from the draft's compute_loss, so the logged mean is checked against a hand computation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from cli_runs import CONFIG, run_sets
from run_configs import target_path

from eagle_train import train_setup
from eagle_train.config import load_config
from eagle_train.data.loader import BatchLoader
from eagle_train.drafts.registry import get_draft
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig
from eagle_train.train import train


def _unsupervised(batch):
    return dataclasses.replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))


@pytest.fixture
def per_batch(monkeypatch) -> list[tuple[bool, float, float, int]]:
    """(training?, loss, sim_accept_len, weight) of every micro-batch the draft computes."""
    spec_type = type(get_draft("eagle3"))
    real = spec_type.compute_loss
    seen: list[tuple[bool, float, float, int]] = []

    def recording(self, draft, features, batch, cfg):
        result = real(self, draft, features, batch, cfg)
        m = result.metrics
        seen.append((draft.training, m["loss"], m["sim_accept_len"], result.weight))
        return result

    monkeypatch.setattr(spec_type, "compute_loss", recording)
    return seen


def test_unsupervised_micro_batches_are_left_out_of_the_averages(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch, per_batch
):
    """Step 1: micro-batch 0 normal, micro-batch 1 with an all-zero loss mask: the logged
    loss and simulated AL are micro-batch 0's alone. Step 2: both unsupervised: no loss and
    no AL in its record (before: 0 and 0). Validation: the first of two batches
    unsupervised: the logged values are the second's."""
    calls = {"n": 0}
    real_next = BatchLoader.next

    def next_batch(self):
        calls["n"] += 1
        batch = real_next(self)
        return batch if calls["n"] == 1 else _unsupervised(batch)

    monkeypatch.setattr(BatchLoader, "next", next_batch)
    real_val = train_setup.validation_batches
    monkeypatch.setattr(
        train_setup,
        "validation_batches",
        lambda cfg, pad_id: [
            _unsupervised(b) if i == 0 else b for i, b in enumerate(real_val(cfg, pad_id))
        ],
    )
    out = tmp_path / "run"
    sets = run_sets(
        target_path(tiny_world), tiny_llama_data, out,
        f"data.val={tiny_llama_data}", "train.val_batches=2", "train.val_every=1",
        "train.grad_accum=2", "train.log_every=1", "train.max_steps=2",
    )  # fmt: skip
    train(load_config(RunConfig, CONFIG, sets))
    trained = [b for b in per_batch if b[0]]
    assert len(trained) == 4 and [b[3] > 0 for b in trained] == [True, False, False, False]
    step1, step2 = read_metrics(out / "metrics.jsonl", "train")
    _, loss0, al0, _ = trained[0]
    assert math.isclose(step1["loss"], loss0, rel_tol=1e-6)  # not (loss0*w0 + 0)/(w0 + w1)
    assert math.isclose(step1["sim_accept_len"], al0, rel_tol=1e-6)
    assert "loss" not in step2 and "sim_accept_len" not in step2 and "lr" in step2
    val = [b for b in per_batch if not b[0]]
    assert [b[3] > 0 for b in val] == [False, True, False, True]  # two validations of 2
    records = read_metrics(out / "metrics.jsonl", "val")
    for record, (_, loss, al, _) in zip(records, val[1::2], strict=True):
        assert math.isclose(record["loss"], loss, rel_tol=1e-6)
        assert math.isclose(record["sim_accept_len"], al, rel_tol=1e-6)
