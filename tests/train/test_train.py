"""train-draft: one loop, metrics, checkpoints, and the precision guard it cannot bypass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_configs import run_config
from safetensors.torch import load_file
from train_runs import CONFIG, overrides
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.config import load_config
from eagle_train.metrics import read_metrics
from eagle_train.optim import PrecisionError
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]


def test_cli_trains_logs_and_checkpoints(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    out = tmp_path / "run"
    args = ["--config", str(CONFIG)]
    for o in overrides(tiny_world, tiny_llama_data, out, steps=24):
        args += ["--set", o]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    train = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in train] == [4, 8, 12, 16, 20, 24]
    for key in (
        "loss",
        "acc_0",
        "acc_1",
        "acc_2",
        "sim_accept_len",
        "cycle_accept_len",
        "lr",
        "grad_norm",
        "tokens_per_s",
    ):
        assert all(key in r for r in train), key
    assert train[-1]["loss"] < train[0]["loss"]
    assert train[-1]["sim_accept_len"] > train[0]["sim_accept_len"]  # 1 <= it <= K+1 always
    val = read_metrics(out / "metrics.jsonl", "val")
    assert [r["step"] for r in val] == [6, 12, 18, 24]
    # vLLM's cycles replayed on validation: pooled ratios, the raw weighted counts dropped
    assert all(1.0 <= r["cycle_accept_len"] <= 4.0 and "cycle_drafts" not in r for r in val)
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step-0000024"]  # keep_last=1, no temporaries left
    files = {p.name for p in (out / "checkpoints" / "step-0000024").iterdir()}
    assert {
        "draft.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "config.yaml",
        "trainer_state.json",
    } <= files
    assert any((out / "tensorboard").iterdir())
    state = torch.load(out / "checkpoints" / "step-0000024" / "optimizer.pt", weights_only=True)
    assert all(v["exp_avg"].dtype == torch.float32 for v in state["state"].values())
    assert all(v["master"].dtype == torch.float32 for v in state["state"].values())


def test_loop_refuses_an_optimizer_built_around_create_optimizer(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import eagle_train.train as loop
    import eagle_train.train_setup as setup

    monkeypatch.setattr(
        setup, "create_optimizer", lambda model, cfg: torch.optim.AdamW(model.parameters())
    )
    cfg = load_config(RunConfig, CONFIG, overrides(tiny_world, tiny_llama_data, tmp_path))
    with pytest.raises(PrecisionError):
        loop.train(cfg)
    assert not (tmp_path / "checkpoints").exists()


def poison_loss_at(monkeypatch: pytest.MonkeyPatch, calls: set[int]) -> None:
    """Make the loss of the given micro-batch calls (1-based) NaN."""
    import eagle_train.train as loop

    real, seen = loop.loss_parts, {"n": 0}

    def poisoned(*args, **kwargs):
        seen["n"] += 1
        parts, n = real(*args, **kwargs), seen["n"]

        def nan_part(part):
            result = part()
            result.loss = result.loss * float("nan")
            return result

        return [lambda p=p: nan_part(p) for p in parts] if n in calls else parts

    monkeypatch.setattr(loop, "loss_parts", poisoned)


def test_non_finite_loss_names_the_step_and_keeps_the_last_checkpoint(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import eagle_train.train as loop

    poison_loss_at(monkeypatch, {8})
    cfg = load_config(
        RunConfig,
        CONFIG,
        overrides(tiny_world, tiny_llama_data, tmp_path)
        + ["train.save_every=3", "train.keep_last=5"],
    )
    with pytest.raises(loop.NonFiniteLossError, match="at step 8"):
        loop.train(cfg)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-0000003",
        "step-0000006",
    ]


def test_non_finite_batches_are_skipped_and_counted(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import eagle_train.train as loop

    poison_loss_at(monkeypatch, {3, 5})
    cfg = load_config(
        RunConfig,
        CONFIG,
        overrides(tiny_world, tiny_llama_data, tmp_path, 8)
        + ["train.nonfinite=skip", "train.log_every=1"],
    )
    result = loop.train(cfg)
    assert result.skipped_steps == 2
    rows = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 1, 2, 2, 2, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows if r["step"] not in (3, 5))
    state = torch.load(
        tmp_path / "checkpoints" / "step-0000008" / "optimizer.pt", weights_only=True
    )
    assert {int(v["step"]) for v in state["state"].values()} == {6}  # 8 steps, 2 skipped

    poison_loss_at(monkeypatch, {1, 2})
    cfg = load_config(
        RunConfig,
        CONFIG,
        overrides(tiny_world, tiny_llama_data, tmp_path / "b", 8)
        + ["train.nonfinite=skip", "train.max_skipped_steps=1"],
    )
    with pytest.raises(loop.NonFiniteLossError, match="2 steps skipped"):
        loop.train(cfg)


def test_resolved_config_is_saved(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    import eagle_train.train as loop

    cfg = load_config(RunConfig, CONFIG, overrides(tiny_world, tiny_llama_data, tmp_path, 2))
    loop.train(cfg)
    again = load_config(RunConfig, tmp_path / "config.yaml")
    assert again == cfg
    assert (
        json.loads((tmp_path / "checkpoints" / "step-0000002" / "trainer_state.json").read_text())[
            "step"
        ]
        == 2
    )


def test_loop_backpropagates_each_segment_of_a_partitioned_draft(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A draft that splits each micro-batch into segments (P-EAGLE, num_segments=4) trains
    through the loop as one pass would: same losses and weights (fp32, allclose)."""
    import eagle_train.train as loop

    real, parts_seen = loop.loss_parts, []

    def counting(*args, **kwargs):
        parts = real(*args, **kwargs)
        parts_seen.append(len(parts))
        return parts

    monkeypatch.setattr(loop, "loss_parts", counting)
    finals = {}
    for segments in (1, 4):
        cfg = run_config(
            tiny_world,
            tiny_llama_data,
            tmp_path / str(segments),
            "data.micro_batch_size=2",
            "data.max_length=64",
            "train.max_steps=4",
            "train.log_every=1",
            "draft.mask_token_id=3",
            f"draft.num_segments={segments}",
            algo="peagle",
            dtype="fp32",
        )
        loop.train(cfg)
        losses = [r["loss"] for r in read_metrics(tmp_path / str(segments) / "metrics.jsonl")]
        weights = load_file(
            tmp_path / str(segments) / "checkpoints" / "step-0000004" / "draft.safetensors"
        )
        finals[segments] = losses, weights
    assert parts_seen == [1] * 4 + [4] * 4  # 4 steps each, one micro-batch per step
    assert finals[4][0] == pytest.approx(finals[1][0], rel=1e-5)
    for key, value in finals[1][1].items():
        torch.testing.assert_close(finals[4][1][key], value, rtol=1e-4, atol=1e-6)
