"""A target vLLM cannot serve the chosen algorithm's drafts next to is refused before training."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.drafts.registry import DRAFTS
from eagle_train.target.vllm_support import serving_problem

REPO = Path(__file__).resolve().parents[1]


def test_serving_problem_table():
    # vLLM 0.32: LlamaForCausalLM / Qwen3ForCausalLM implement SupportsEagle3, Gemma2 does not;
    # method "eagle" reads no auxiliary layers, so it is not restricted.
    assert serving_problem(["LlamaForCausalLM"], "eagle3", True) is None
    assert serving_problem(["Qwen3ForCausalLM"], "dflash", True) is None
    assert serving_problem(["Gemma2ForCausalLM"], "eagle", False) is None
    problem = serving_problem(["Gemma2ForCausalLM"], "eagle3", True)
    assert problem is not None and "architecture Gemma2ForCausalLM" in problem
    assert "method='eagle3'" in problem
    assert serving_problem([], "dflash", True) is not None
    # The flag each draft declares: the ones that read several target layers.
    flags = {name: spec.reads_aux_hidden_states for name, spec in DRAFTS.items()}
    assert flags == {"eagle1": False, "eagle3": True, "peagle": True, "dflash": True}


def test_train_draft_refuses_before_any_work(tmp_path):
    target = tmp_path / "gemma"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Gemma2ForCausalLM"]}))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        train_draft_app,
        [
            "-c",
            str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml"),
            "--set",
            f"target.path={target}",
            "--set",
            f"train.output_dir={out}",
        ],
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {target / 'config.json'}: vLLM 0.32")
    assert "Gemma2ForCausalLM" in lines[0] and "Traceback" not in result.output
    assert not out.exists()  # nothing written
