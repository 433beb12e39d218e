"""In-process runs stopped and resumed: the run config of a resumable short run and a dataset whose
rows are all one chat."""

from __future__ import annotations

import json
from pathlib import Path

from run_configs import run_config, target_path

from eagle_train.config import load_config
from eagle_train.run_config import RunConfig


class Stop(Exception):
    pass


def config(world: Path, data: Path, out: Path, algorithm: str, *extra: str) -> RunConfig:
    return run_config(
        world,
        data,
        out,
        "data.micro_batch_size=2",
        "data.max_length=48",
        "train.grad_accum=2",
        "train.max_steps=6",
        "train.save_every=3",
        "train.keep_last=5",
        "train.log_every=1",
        "optim.warmup_steps=2",
        *extra,
        algo=algorithm,
    )


def repeated_rows_data(world: Path, out: Path) -> Path:
    """A prepared dataset whose rows are all the same chat."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data

    first = json.loads((world / "data" / "train.jsonl").read_text().splitlines()[0])
    chats = out.parent / "same.jsonl"
    chats.write_text("".join(json.dumps({**first, "id": f"copy-{i}"}) + "\n" for i in range(8)))
    sets = [
        f"inputs=[{chats}]",
        f"output_dir={out}",
        f"tokenizer={target_path(world)}",
        "max_length=256",
    ]
    prepare_data(load_config(PrepareDataConfig, None, sets))
    return out
