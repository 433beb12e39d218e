"""One schema per setting: the KV-cache default, the acceptance settings shared by
eval-acceptance and train.acceptance, and the draft-vocabulary knob a draft must honour."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eagle_train.cli import app
from eagle_train.config import ConfigError, load_config
from eagle_train.engine import VllmEngine, resolve_kv_cache_bytes
from eagle_train.evaluate.settings import AcceptanceSettings, EvalSettings, TrainAcceptance
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU default")
def test_one_kv_cache_default_on_cpu() -> None:
    assert resolve_kv_cache_bytes(None) == 256 * 2**20
    assert resolve_kv_cache_bytes(1234) == 1234
    assert VllmEngine("m", dtype="float32").kwargs["kv_cache_memory_bytes"] == 256 * 2**20
    for model in (AcceptanceSettings, TrainAcceptance):
        assert model().kv_cache_memory_bytes is None  # i.e. the engine's default


def test_train_acceptance_is_the_eval_schema_nested() -> None:
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        ["target.path=t", "data.train=d", "train.acceptance.every=5"],
    )
    shared = set(AcceptanceSettings.model_fields)
    assert shared < set(TrainAcceptance.model_fields) and shared < set(EvalSettings.model_fields)
    assert cfg.train.acceptance.every == 5
    assert cfg.train.acceptance.max_new_tokens == AcceptanceSettings().max_new_tokens == 256
    with pytest.raises(ConfigError, match="train.acceptance.turns"):
        load_config(
            RunConfig,
            REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
            ["target.path=t", "data.train=d", "train.acceptance.turns=2"],
        )


@pytest.mark.parametrize("algorithm", ["eagle1", "dflash"])
def test_a_draft_without_a_draft_vocabulary_refuses_the_knob(algorithm: str) -> None:
    path = REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml"
    sets = ["target.path=t", "data.train=d", "data.draft_vocab_size=64"]
    with pytest.raises(ConfigError, match="data.draft_vocab_size is set, but the"):
        load_config(RunConfig, path, sets)
    eagle3 = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    assert load_config(RunConfig, eagle3, sets).data.draft_vocab_size == 64


def test_eval_acceptance_takes_config_and_set(tmp_path: Path) -> None:
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("target: t\ndrafters: [d]\nmax_new_tokens: 64\n")
    result = CliRunner().invoke(app, ["eval-acceptance", "-c", str(cfg), "--set", "turns=3"])
    assert result.exit_code == 2
    assert "turns" in result.output and "Traceback" not in result.output
