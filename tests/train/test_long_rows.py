"""Long rows trained whole: the tiny demo target with its context raised to 4,096 positions,
chats from build-long-prompts prepared at max_length 4,096 (rows past 2,048 tokens, of
lengths no block size divides), trained with packing online and from a feature cache (the
same losses), for EAGLE-3 and DFlash, then exported; a row longer than the target's context
is refused in one line before the target loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import draft_vocab_sets
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import export_draft_app, prepare_features_app, train_draft_app
from eagle_train.config import load_config
from eagle_train.data.config import PrepareDataConfig
from eagle_train.data.loader import BatchLoader
from eagle_train.data.mixture import open_training_data
from eagle_train.data.prepare import prepare_data
from eagle_train.data.store import load_prepared
from eagle_train.demo.long_context import LongContextConfig, build_long_context
from eagle_train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
CONTEXT = 4096


@pytest.fixture(scope="module")
def long_world(wide_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("long_rows")
    target = root / "target"
    shutil.copytree(target_path(wide_world), target)
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (target / "config.json").write_text(json.dumps(config))
    chats = root / "chats"
    build_long_context(
        LongContextConfig(
            tokenizer=target,
            num_prompts=1,
            num_train=5,  # each row's greedy tokens run the whole 33,024-row head
            ranges=[(2300, 3900)],
            answer_room=256,
            chunk_tokens=400,
        ),
        chats,
    )
    data = root / "data"
    sets = [
        f"inputs=[{chats / 'train.jsonl'}]",
        f"output_dir={data}",
        f"tokenizer={target}",
        f"max_length={CONTEXT}",
    ]
    prepare_data(load_config(PrepareDataConfig, None, sets))
    return {"root": root, "target": target, "data": data}


def _args(world: dict, out: Path, algo: str, *extra: str) -> list[str]:
    sets = [
        f"target.path={world['target']}",
        f"data.train={world['data']}",
        "data.val=null",
        f"data.max_length={CONTEXT}",
        "data.micro_batch_size=1",
        "data.packing=true",
        f"train.output_dir={out}",
        "train.max_steps=2",
        "train.log_every=1",
        "train.save_every=2",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=1",
        *draft_vocab_sets(algo),
        # DFlash's loss covers the whole vocabulary at every slot: 61 blocks per row (not
        # its 512) keep the two steps short, anchors still drawn over the whole row
        *(["draft.num_anchors=61"] if algo == "dflash" else []),
        *extra,
    ]
    config = REPO / "configs" / "train" / f"{algo}-llama-demo.yaml"
    return ["-c", str(config)] + [x for s in sets for x in ("--set", s)]


def test_rows_are_long_and_whole(long_world: dict) -> None:
    lengths = [len(r) for r in load_prepared(long_world["data"])["input_ids"]]
    # past 2,048 tokens, and lengths no block size (DFlash's 8, 16) divides
    assert len([n for n in lengths if n > 2048 and n % 8 and n % 16]) >= 2, lengths
    loader = BatchLoader(open_training_data(long_world["data"], CONTEXT), 1, 0, 0, CONTEXT)
    seen = sorted(int(loader.next().lengths.max()) for _ in range(len(lengths)))
    assert seen == sorted(lengths)  # every row in a batch of its own, uncropped


@pytest.mark.parametrize("algo", ["eagle3", "dflash"])
def test_long_rows_train_online_and_from_the_cache_then_export(
    long_world: dict, algo: str, tmp_path: Path
) -> None:
    losses = {}
    features = tmp_path / "features"
    result = CliRunner().invoke(
        prepare_features_app,
        [*_args(long_world, tmp_path / "unused", algo, f"data.features={features}"),
         "--shard-mib", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for mode, extra in (("online", []), ("cached", [f"data.features={features}"])):
        out = tmp_path / mode
        result = CliRunner().invoke(train_draft_app, _args(long_world, out, algo, *extra))
        assert result.exit_code == 0, result.output
        losses[mode] = [r["loss"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert len(losses["online"]) == 2 and all(torch.tensor(losses["online"]).isfinite())
    torch.testing.assert_close(
        torch.tensor(losses["cached"]), torch.tensor(losses["online"]), rtol=2e-3, atol=0.0
    )
    checkpoint = next((tmp_path / "online" / "checkpoints").glob("step-*"))
    result = CliRunner().invoke(export_draft_app, [str(checkpoint), str(tmp_path / "export")])
    assert result.exit_code == 0, result.output
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["max_position_embeddings"] == CONTEXT


def test_a_row_longer_than_the_targets_context_is_refused(
    long_world: dict, wide_world: Path, tmp_path: Path
) -> None:
    short = target_path(wide_world)  # max_position_embeddings 512
    args = _args(long_world, tmp_path / "run", "eagle3", f"target.path={short}")
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 2
    assert "data.max_length: rows of up to" in result.output
    assert "exceed the target's context (max_position_embeddings 512)" in result.output
    assert not (tmp_path / "run").exists()
