"""Short runs through the commands a user types (train-draft, export-draft, prepare-data) on the
demo config, and the checks of what they refuse: one line, exit 2, the user's files unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from conftest import REPO, draft_vocab_sets
from typer.testing import CliRunner

from eagle_train.cli import export_draft_app, train_draft_app

CONFIG = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"


def run_sets(target: Path | str, data: Path | str, out: Path | str, *extra: str) -> list[str]:
    return [
        f"target.path={target}",
        f"data.train={data}",
        "data.val=null",
        "data.micro_batch_size=2",
        "data.max_length=48",
        "draft.ttt_steps=1",
        *draft_vocab_sets("eagle3"),
        "train.max_steps=4",
        "train.save_every=2",
        "train.progress=false",
        "train.tensorboard=false",
        f"train.output_dir={out}",
        *extra,
    ]


def cli_args(sets: list[str], *extra: str) -> list[str]:
    args = ["-c", str(CONFIG)]
    for s in sets:
        args += ["--set", s]
    return [*args, *extra]


class _Payload:
    """Unpickling this creates ``path``: what a crafted optimizer.pt could run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes): what must be unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def train_cli(config: Path, sets: list[str]):
    args = ["-c", str(config)]
    for s in sets:
        args += ["--set", s]
    return CliRunner().invoke(train_draft_app, args)


def one_line_error(result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    # progress bars (tqdm) may come first; the error is one line, the last
    lines = [line for line in result.output.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert result.output.strip().endswith(lines[0]), result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])


def export_cli(ckpt: Path, out: Path, *extra: str):
    return CliRunner().invoke(export_draft_app, [str(ckpt), str(out), *extra])


def refingerprint(ckpt: Path, name: str) -> None:
    """Record ``name``'s new size and sha256 in the manifest, as a crafted checkpoint would."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    data = (ckpt / name).read_bytes()
    state["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))


def prepare_cli(*sets: str):
    from eagle_train.cli import prepare_data_app

    return CliRunner().invoke(prepare_data_app, [x for s in sets for x in ("--set", s)])
