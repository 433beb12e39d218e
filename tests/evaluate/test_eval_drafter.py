"""eval-acceptance reads every drafter before vLLM starts and names what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from exported_drafts import export_random
from run_configs import target_path
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from eagle_train.cli import eval_acceptance_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    import eagle_train.evaluate.harness as harness

    def refuse(*args, **kwargs):
        raise AssertionError("vLLM must not start for a bad drafter")

    monkeypatch.setattr(harness, "VllmEngine", refuse)


def run_cli(target: Path, drafter: Path, tmp_path: Path):
    return CliRunner().invoke(
        eval_acceptance_app,
        ["--target", str(target), "--draft", str(drafter), "--out", str(tmp_path / "eval")],
    )


def test_missing_tensor(tiny_world: Path, tmp_path: Path, no_vllm: None) -> None:
    drafter = export_random(tiny_world, "llama", tmp_path / "d")
    tensors = load_file(str(drafter / "model.safetensors"))
    del tensors["layers.0.hidden_norm.weight"]
    save_file(tensors, str(drafter / "model.safetensors"))
    result = run_cli(target_path(tiny_world), drafter, tmp_path)
    assert result.exit_code == 2
    assert "missing tensor layers.0.hidden_norm.weight" in result.output
    assert str(drafter) in result.output


def test_drafter_for_another_target(tiny_world: Path, tmp_path: Path, no_vllm: None) -> None:
    drafter = export_random(tiny_world, "llama", tmp_path / "d")
    config = json.loads((drafter / "config.json").read_text())
    config["target_hidden_size"] = 2 * config["target_hidden_size"]
    (drafter / "config.json").write_text(json.dumps(config))
    result = run_cli(target_path(tiny_world), drafter, tmp_path)
    assert result.exit_code == 2
    assert "target_hidden_size 128 != the target's hidden size 64" in result.output


def test_unknown_method(tiny_world: Path, tmp_path: Path, no_vllm: None) -> None:
    drafter = export_random(tiny_world, "llama", tmp_path / "d")
    (drafter / "eagle_train.json").unlink()
    config = json.loads((drafter / "config.json").read_text())
    for key in ("eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states"):
        del config[key]
    config["architectures"] = ["MysteryDrafter"]
    (drafter / "config.json").write_text(json.dumps(config))
    result = run_cli(target_path(tiny_world), drafter, tmp_path)
    assert result.exit_code == 2
    assert "unknown drafter method" in result.output and "MysteryDrafter" in result.output


def test_missing_directory_files(tmp_path: Path, tiny_world: Path, no_vllm: None) -> None:
    (tmp_path / "empty").mkdir()
    result = run_cli(target_path(tiny_world), tmp_path / "empty", tmp_path)
    assert result.exit_code == 2 and "missing config.json" in result.output


def test_a_good_drafter_passes_the_checks(tiny_world: Path, tmp_path: Path) -> None:
    from eagle_train.evaluate.drafter import inspect_drafter
    from eagle_train.target_model import load_target_description

    drafter = export_random(tiny_world, "qwen3", tmp_path / "d")
    info = inspect_drafter(drafter, load_target_description(target_path(tiny_world, "qwen3")))
    assert info.speculative_config() == {
        "method": "eagle3",
        "model": str(drafter),
        "num_speculative_tokens": 3,
    }
