"""The feature cache: prepare-features stores what the target computes, the trainer reads it
back instead of running the target (same losses), refuses a cache made for something else,
and a killed extraction resumes to the same bytes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from feature_runs import feature_run_args as run_sets
from old_formats import write_feature_cache_format_1
from realistic import assert_shapes_like_real_use, vocab_ids
from run_configs import target_path
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from eagle_train.cli import prepare_features_app, train_draft_app
from eagle_train.config import load_config
from eagle_train.data.config import PrepareDataConfig
from eagle_train.data.loader import BatchLoader, PreparedData
from eagle_train.data.prepare import prepare_data
from eagle_train.features import prepare_features
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget
from eagle_train.target_model.cache import (
    CacheChain,
    FeatureCache,
    FeatureCacheError,
    verify_cache,
)
from eagle_train.target_model.extract import ExtractSettings
from eagle_train.target_model.source import CachedFeatures
from eagle_train.target_model.weights import load_target_head

REPO = Path(__file__).resolve().parents[2]
# subprocesses use this process's thread count: bf16 kernels then round alike
THREADS = str(torch.get_num_threads())


def config(args: list[str]) -> RunConfig:
    sets = [args[i + 1] for i in range(2, len(args), 2)]
    return load_config(RunConfig, Path(args[1]), sets)


@pytest.fixture(scope="module")
def cache(wide_world: Path, few_llama_data: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("features") / "llama"
    args = run_sets(wide_world, few_llama_data, out, out / "unused", val=few_llama_data)
    # small shards: several of them, rows split across shard boundaries are read back whole
    result = CliRunner().invoke(prepare_features_app, [*args, "--shard-mib", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_cached_rows_equal_the_targets_own_features(wide_world, few_llama_data, cache):
    cfg = config(run_sets(wide_world, few_llama_data, cache, cache / "unused"))
    whole = FrozenTarget.from_pretrained(cfg.target.path)
    manifest = json.loads((cache / "train" / "manifest.json").read_text())
    assert len(manifest["files"]) > 1 and manifest["layer_ids"] == [1, 2, 3]
    # each shard's own seconds, which scripts/plan_budget.py sizes the feature stage from
    assert all(f["seconds"] > 0 for f in manifest["files"])
    assert verify_cache(cache / "train") == []
    head = load_target_head(cfg.target.path, torch.bfloat16, torch.device("cpu"))
    source = CachedFeatures(
        FeatureCache(cache / "train"), head.lm_head(), [3, 1], torch.device("cpu")
    )
    data = PreparedData(few_llama_data)
    loader = BatchLoader(data, 3, seed=1, pad_id=0, max_length=96)
    last_row = len(data) - 1
    batches = [loader.next() for _ in range(3)] + [loader.collate([last_row, 0])]
    for batch in batches:
        got = source.for_batch(batch)
        want = whole.features(batch.input_ids, batch.attention_mask, [3, 1])
        real = batch.attention_mask.bool()
        for name in ("aux", "final", "logits"):
            a, b = getattr(got, name)[real].float(), getattr(want, name)[real].float()
            # the same target, batched differently at extraction: bf16 rounding at most
            torch.testing.assert_close(a, b, atol=0.02, rtol=0.02)
        assert got.aux.shape == want.aux.shape and got.logits.dtype == want.logits.dtype
        assert not got.final[~real].any()  # padding is zeros, never another row's tokens


def test_cached_greedy_tokens_and_vocabulary_logits_are_transformers_own(
    wide_world, few_llama_data, cache, tmp_path
):
    # The reference is transformers' own forward of the target (not FrozenTarget): the argmax
    # greedy verification accepts, and the logits of the rows a draft vocabulary asks for.
    path = target_path(wide_world)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    head = load_target_head(path, torch.bfloat16, torch.device("cpu")).lm_head()
    ids = vocab_ids(path, 7, seed=3)  # a draft vocabulary's rows, both sides of 32,767
    data = PreparedData(few_llama_data)
    batch = BatchLoader(data, 3, seed=2, pad_id=0, max_length=96).next()
    real = batch.attention_mask.bool()
    with torch.no_grad():
        ref = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    ref = ref.float()
    top2 = ref.topk(2, dim=-1).values
    clear = real & (top2[..., 0] - top2[..., 1] > 0.05)  # no near-tie bf16 batching can flip
    assert clear.sum() > 0.8 * real.sum()
    # the target's greedy tokens hold ids above 32,767, where a 16-bit id would wrap
    assert_shapes_like_real_use(ref.argmax(-1)[clear], "transformers' greedy tokens")

    # format 2 stores the greedy tokens; a format 1 cache, written as its own code wrote it
    # (shards without them), is read as before: the greedy tokens recomputed from the logits
    old = write_feature_cache_format_1(
        FrozenTarget(model), path, few_llama_data, tmp_path / "v1" / "train", [1, 2, 3]
    )
    with safe_open(old / "shard-00000.safetensors", framework="pt") as shard:
        assert "greedy" not in shard.keys()  # safe_open has no __contains__
    new = FeatureCache(cache / "train")
    # a mixture of a format 2 and a format 1 source: the second's rows, read through the chain
    mixed = (CacheChain([new, FeatureCache(old)]), new.num_rows, False)
    for split, shift, stored in ((new, 0, True), (FeatureCache(old), 0, False), mixed):
        got = CachedFeatures(split, head, [1, 2, 3], torch.device("cpu"))
        assert batch.rows is not None
        features = got.for_batch(replace(batch, rows=batch.rows + shift))
        assert (features.stored_greedy is not None) == stored
        assert torch.equal(features.greedy[clear], ref.argmax(-1)[clear])
        torch.testing.assert_close(
            features.logits_of(ids)[real].float(), ref[..., ids][real], atol=0.05, rtol=0.02
        )
        # with the greedy tokens stored, the full (B, T, V) logits are never computed
        assert ("logits" in features.__dict__) != stored


def test_head_only_target_holds_no_decoder_weights(wide_world):
    path = target_path(wide_world)
    head = load_target_head(path, torch.bfloat16, torch.device("cpu"))
    whole = FrozenTarget.from_pretrained(path)
    assert torch.equal(head.lm_head().weight, whole.lm_head().weight)
    assert torch.equal(head.embed_tokens().weight, whole.embed_tokens().weight)
    layer = head.model.get_decoder().layers[0].self_attn.q_proj.weight
    assert layer.device.type == "meta"


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["eagle3", "eagle1"])
def test_training_from_the_cache_gives_the_online_losses(
    wide_world, few_llama_data, cache, tmp_path, algo
):
    # eagle1 reads only the final feature: the same cache (a superset) serves it
    runs, val = {}, {}
    for mode, features in (("online", None), ("cached", cache)):
        out = tmp_path / mode
        args = run_sets(wide_world, few_llama_data, features, out, algo, val=few_llama_data)
        result = CliRunner().invoke(train_draft_app, args)
        assert result.exit_code == 0, result.output
        runs[mode] = [r["loss"] for r in read_metrics(out / "metrics.jsonl", "train")]
        val[mode] = [r["loss"] for r in read_metrics(out / "metrics.jsonl", "val")]
    assert len(runs["online"]) == 6 and len(val["online"]) == 2
    torch.testing.assert_close(
        torch.tensor(val["cached"]), torch.tensor(val["online"]), rtol=2e-3, atol=0.0
    )
    # same batches, features equal up to bf16 rounding of a differently batched forward
    torch.testing.assert_close(
        torch.tensor(runs["cached"]), torch.tensor(runs["online"]), rtol=2e-3, atol=0.0
    )


def test_refuses_a_cache_for_another_target_layer_set_or_dataset(
    wide_world, few_llama_data, cache, tmp_path
):
    other = tmp_path / "elsewhere"
    another_dataset(wide_world, few_llama_data, other)
    base = run_sets(wide_world, few_llama_data, cache, tmp_path / "r")
    cases = {
        "target": ["--set", f"target.path={target_path(wide_world, 'llama', 'fp32')}"],
        "layer set": ["--set", "draft.aux_layer_ids=[0, 2, 3]"],
        "dataset": ["--set", f"data.train={other}"],
    }
    for what, extra in cases.items():
        result = CliRunner().invoke(train_draft_app, base + extra)
        assert result.exit_code == 2, result.output
        assert what in result.output and "made for something else" in result.output


def another_dataset(world: Path, data: Path, out: Path) -> None:
    """prepare-data, as a user runs it, on ``data``'s chats with one answer's words in another
    order: the same tokens and counts, other rows. Its meta.json is then ``data``'s own (they
    differed only in the chats file's path and the time), so the rows alone tell them apart."""
    chats = [json.loads(line) for line in (data.parent / f"{data.name}-chats.jsonl").open()]
    answer = next(m for m in chats[0]["messages"] if m["role"] == "assistant")
    words = answer["content"].split(" ")
    assert len(set(words)) > 1
    answer["content"] = " ".join(words[1:] + words[:1])
    edited = out.parent / "edited-chats.jsonl"
    edited.write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    prepare_data(
        load_config(
            PrepareDataConfig,
            None,
            [
                f"inputs=[{edited}]",
                f"output_dir={out}",
                "max_length=256",
                "regenerate.enabled=false",
            ]
            + [f"tokenizer={target_path(world)}"],
        )
    )
    ours, theirs = (json.loads((d / "meta.json").read_text()) for d in (data, out))
    differ = {k for k in ours if ours[k] != theirs[k]}
    assert differ <= {"sources", "created"} and ours["counts"] == theirs["counts"]
    shutil.copyfile(data / "meta.json", out / "meta.json")
    assert PreparedData(out).rows["input_ids"][0] != PreparedData(data).rows["input_ids"][0]
    assert PreparedData(out).rows["input_ids"][1:] == PreparedData(data).rows["input_ids"][1:]


def test_an_incomplete_cache_is_refused(wide_world, few_llama_data, cache, tmp_path):
    partial = tmp_path / "partial" / "train"
    partial.mkdir(parents=True)
    (partial / "identity.json").write_text((cache / "train" / "identity.json").read_text())
    with pytest.raises(FeatureCacheError, match="incomplete"):
        FeatureCache(partial)


@pytest.mark.slow
def test_kill_9_then_rerun_finishes_with_the_same_bytes(
    wide_world, few_llama_data, cache, tmp_path
):
    out = tmp_path / "killed"
    args = run_sets(wide_world, few_llama_data, out, tmp_path / "unused")
    cmd = [sys.executable, "-m", "eagle_train.cli", "prepare-features", *args]
    # ~70 shards (caught midway); every row its own forward, as the reference below
    cmd += ["--shard-mib", "0.2", "--batch-tokens", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
    first = out / "train" / "shard-00000.json"
    deadline = time.time() + 240
    while not first.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first.exists() and not (out / "train" / "manifest.json").exists()
    done_before = sorted(p.name for p in (out / "train").glob("shard-*.json"))
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    total = len(json.loads((out / "train" / "identity.json").read_text())["shards"])
    assert f"({total - len(done_before)} written by this process)" in result.stdout
    assert verify_cache(out / "train") == [] and not list((out / "train").glob(".shard-*"))
    # every row, those written before the kill and after, is the target's own forward of it
    got = FeatureCache(out / "train")
    whole = FrozenTarget.from_pretrained(target_path(wide_world))
    names = ["hidden.1", "hidden.2", "hidden.3", "final"]
    for row, ids in enumerate(PreparedData(few_llama_data).rows["input_ids"]):
        ids = torch.tensor([ids])
        feats = whole.features(ids, torch.ones_like(ids), [1, 2, 3])
        h = feats.final.shape[-1]
        want = [feats.aux[0, :, i * h : (i + 1) * h] for i in range(3)] + [feats.final[0]]
        for a, b in zip(got.row(row, ids.shape[1], names), want, strict=True):
            assert torch.equal(a, b), row


def test_prepare_features_refuses_a_directory_made_for_another_layer_set(
    wide_world, few_llama_data, cache, tmp_path
):
    args = run_sets(wide_world, few_llama_data, cache, tmp_path / "unused")
    result = CliRunner().invoke(
        prepare_features_app, [*args, "--set", "draft.aux_layer_ids=[0, 1, 2]"]
    )
    assert result.exit_code == 2
    assert "layer set" in result.output and "another data.features directory" in result.output
    assert "Traceback" not in result.output


def test_prepare_features_needs_an_output(wide_world, few_llama_data, tmp_path):
    cfg = config(run_sets(wide_world, few_llama_data, None, tmp_path / "r"))
    with pytest.raises(FeatureCacheError, match="data.features"):
        prepare_features(cfg, ExtractSettings())


def test_device_map_extraction_writes_the_same_cache(wide_world, few_llama_data, cache, tmp_path):
    """--device-map auto takes the input device from the loaded model, not the rank's. On a
    CPU-only machine transformers places the whole target on the CPU (no multi-device
    dispatch is exercised here): the path must run and the bytes must not change."""
    out = tmp_path / "mapped"
    args = run_sets(wide_world, few_llama_data, out, tmp_path / "unused", val=few_llama_data)
    result = CliRunner().invoke(
        prepare_features_app, [*args, "--shard-mib", "1", "--device-map", "auto"]
    )
    assert result.exit_code == 0, result.output
    for split in ("train", "val"):
        want = json.loads((cache / split / "manifest.json").read_text())["files"]
        got = json.loads((out / split / "manifest.json").read_text())["files"]
        assert [f["sha256"] for f in got] == [f["sha256"] for f in want]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_split_the_shards_and_write_the_same_cache(
    wide_world, few_llama_data, cache, tmp_path
):
    out = tmp_path / "two"
    args = run_sets(wide_world, few_llama_data, out, tmp_path / "unused", val=few_llama_data)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "eagle_train.cli", "prepare-features", *args, "--shard-mib", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": THREADS, "PYTHONPATH": str(REPO)}
    result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for split in ("train", "val"):
        want = json.loads((cache / split / "manifest.json").read_text())["files"]
        got = json.loads((out / split / "manifest.json").read_text())["files"]
        assert [f["sha256"] for f in got] == [f["sha256"] for f in want]
    # rank 0 wrote the even shards only: the odd ones came from rank 1
    assert f"({(len(want) + 1) // 2} written by this process)" in result.stdout
