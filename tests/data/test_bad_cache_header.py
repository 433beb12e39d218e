"""Issue 24, "a cache file with a bad safetensors header" printed a traceback. A shard whose
header is garbage but whose manifest entry was rewritten to match (so the sha256 check on
first read passes) is named in one line by train-draft, and the cache is left as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

from cli_runs import (
    one_line_error,
    snapshot,
)
from feature_runs import feature_run_args as feature_sets
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app


def test_a_shard_with_a_bad_header_and_a_matching_manifest_is_one_line(
    wide_world: Path,
    few_llama_data: Path,
    cache: Path,  # noqa: F811
    tmp_path: Path,
):
    copy = tmp_path / "features"
    shutil.copytree(cache, copy)
    manifest_path = copy / "train" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    shards = sorted((copy / "train").glob("shard-*.safetensors"))
    for index, shard in enumerate(shards):
        data = bytearray(shard.read_bytes())
        data[:8] = struct.pack("<Q", 2**40)  # a header length past the end of the file
        shard.write_bytes(bytes(data))
        manifest["files"][index]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    before = snapshot(copy)
    args = feature_sets(wide_world, few_llama_data, copy, tmp_path / "run")
    result = CliRunner().invoke(train_draft_app, args)
    one_line_error(result, "not a readable safetensors file")
    named = result.output.split("error: ")[1].split(":")[0]
    assert Path(named) in shards
    assert snapshot(copy) == before
    assert not (tmp_path / "run").exists()  # the failed run left nothing


def test_a_corrupt_cache_shard_is_named_on_its_first_read(
    wide_world: Path, few_llama_data: Path, cache: Path, tmp_path: Path
):
    """Before: a shard with 4 KiB overwritten (same size) trained 40 steps on garbage, then
    stopped with "non-finite loss" without naming the cache."""
    copy = tmp_path / "features"
    shutil.copytree(cache, copy)
    shards = sorted((copy / "train").glob("shard-*.safetensors"))
    for shard in shards:  # whichever the first batch reads
        data = bytearray(shard.read_bytes())
        data[-4096:] = bytes(4096)
        shard.write_bytes(bytes(data))
    before = snapshot(copy)
    args = feature_sets(wide_world, few_llama_data, copy, tmp_path / "run")
    result = CliRunner().invoke(train_draft_app, args)
    one_line_error(result, "sha256 differs from the one", "(corrupt)")
    named = result.output.split("error: ")[1].split(":")[0]
    assert Path(named) in shards
    assert snapshot(copy) == before
    shard = shards[0]
    # a symlink that leads a shard out of the cache is refused before it is read
    shard.unlink()
    shard.symlink_to(tmp_path / "elsewhere.safetensors")
    result = CliRunner().invoke(train_draft_app, args)
    one_line_error(result, "'shard-00000.safetensors' leads outside")
