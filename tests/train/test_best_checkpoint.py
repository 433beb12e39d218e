"""Which checkpoint the acceptance probe keeps as ``best/``, and whether a resumed run
remembers the best value so far. vLLM's measurement is replaced by a script of values (its
own tests check the measurement, tests/drafts/test_eagle3_vllm.py); everything between the value
and the directory a user opens (the training loop, the probe's choice, the trainer state
in the checkpoint, resume) is the real code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_configs import run_config
from safetensors.torch import load_file

from eagle_train.acceptance_probe import AcceptanceProbe
from eagle_train.metrics import read_metrics
from eagle_train.train import train

# Tokens per target step by step: the best (2.25, step 4) is neither the first nor the last
# probe, and both probes after the resume (steps 8 and 10) are below it but above the rest.
SCRIPT = {2: 1.50, 4: 2.25, 6: 1.75, 8: 2.00, 10: 1.90}


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    measured: list[int] = []

    def measure(self, step: int, draft_state: dict) -> dict[str, float]:
        measured.append(step)
        value = SCRIPT[step]
        return {
            "tokens_per_target_step": value,
            "mean_request_tokens_per_target_step": value,
            "acceptance_length": value,
            "seconds": 0.0,
        }

    monkeypatch.setattr(AcceptanceProbe, "measure", measure)
    return measured


def config(world: Path, data: Path, out: Path, steps: int, *extra: str):
    return run_config(
        world,
        data,
        out,
        "data.micro_batch_size=2",
        "data.max_length=48",
        "draft.ttt_steps=1",
        f"train.max_steps={steps}",
        "train.save_every=2",
        "train.keep_last=5",
        "train.acceptance.every=2",
        *extra,
    )


def best(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "best").iterdir())


def test_best_holds_the_highest_probe_and_a_resumed_run_remembers_it(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, scripted: list[int]
) -> None:
    out = tmp_path / "run"
    train(config(tiny_world, tiny_llama_data, out, 6))
    assert scripted == [2, 4, 6]
    assert best(out) == ["step-0000004"]
    # best/ holds the draft as it was at step 4, the same as that step's checkpoint
    model = "draft.safetensors"
    kept = load_file(out / "best" / "step-0000004" / model)
    at_4 = load_file(out / "checkpoints" / "step-0000004" / model)
    assert kept.keys() == at_4.keys()
    assert all(torch.equal(kept[k], at_4[k]) for k in kept)

    # Resumed to step 10: steps 8 and 10 measure below step 4's 2.25, so best/ stays; a run
    # that forgot the best so far would take step 8's 2.00 as its best.
    train(config(tiny_world, tiny_llama_data, out, 10, "train.resume=auto"))
    assert scripted == [2, 4, 6, 8, 10]
    assert best(out) == ["step-0000004"]
    logged = [r["step"] for r in read_metrics(out / "metrics.jsonl", "acceptance")]
    assert logged == [2, 4, 6, 8, 10]
