"""A config's mistakes are one line, before anything is written: a binary YAML file, aux_layer_ids out of the target's range (issue 24)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import CONFIG, one_line_error, run_sets, train_cli
from run_configs import target_path


def test_a_binary_yaml_config_is_one_line(tmp_path: Path):
    """Before: a UnicodeDecodeError traceback (e.g. -c model.safetensors by mistake)."""
    config = tmp_path / "config.yaml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary")
    before = config.read_bytes()
    result = train_cli(config, [])
    one_line_error(result, f"{config}: not a YAML text file (byte 0 is not UTF-8)")
    assert config.read_bytes() == before


@pytest.mark.parametrize("ids", ["[1,2,99]", "[-1,2,3]"])
def test_aux_layer_ids_out_of_range_are_refused_before_anything_is_written(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, ids: str
):
    """Before: a good message inside a ValueError traceback, raised after the target loaded."""
    target = target_path(tiny_world)
    out = tmp_path / "run"
    sets = run_sets(target, tiny_llama_data, out, f"draft.aux_layer_ids={ids}")
    result = train_cli(CONFIG, sets)
    shown = ids.replace(",", ", ")
    one_line_error(result, f"draft.aux_layer_ids {shown} must be distinct layer counts in 0..")
    assert not out.exists()
