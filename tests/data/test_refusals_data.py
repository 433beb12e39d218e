"""Issue 59, data: inputs that printed a traceback, ran forever or trained on the wrong thing
are one line naming the file (and line or key) and what was expected, exit 2, nothing
written. Table-driven through prepare-data and train-draft in-process (typer's CliRunner)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from cli_runs import cli_args, run_sets
from refusal_checks import invoke, one_line_error
from run_configs import target_path

from eagle_train.chat_template import MAX_STEPS, STEPS_PER_MESSAGE
from eagle_train.cli import prepare_data_app, train_draft_app
from eagle_train.data.errors import DataError
from eagle_train.data.template_match import check_chat_template, target_template

CHAT = {
    "messages": [
        {"role": "user", "content": "Sort [3, 1, 2] in Python."},
        {"role": "assistant", "content": "sorted([3, 1, 2]) returns [1, 2, 3]."},
    ]
}
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def prepare(world: Path, out: Path, *extra: str):
    sets = [
        f"output_dir={out}",
        f"tokenizer={target_path(world)}",
        "max_length=64",
        *extra,
    ]
    return invoke(prepare_data_app, [x for s in sets for x in ("--set", s)])


def write_input(path: Path, kind: str) -> Path:
    if kind == "surrogate":  # a lone surrogate, as JSON writes it
        path.write_text(json.dumps(CHAT).replace("Sort", "Sort \\ud800") + "\n")
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind in ("big.parquet", "big.json", "big.arrow"):
        import datasets

        big = {"messages": [CHAT["messages"][0], {"role": "assistant", "content": "x" * 300_000}]}
        rows = datasets.Dataset.from_list([CHAT, big])
        if kind == "big.parquet":
            rows.to_parquet(str(path))
        elif kind == "big.json":
            path.write_text(json.dumps([CHAT, big]))
        else:
            rows.to_pandas()  # make sure the table is materialised
            import pyarrow as pa

            with pa.OSFile(str(path), "wb") as sink:
                with pa.ipc.new_stream(sink, rows.data.table.schema) as writer:
                    writer.write_table(rows.data.table)
    return path


@pytest.mark.parametrize(
    "name, kind, named",
    [
        (
            "chats.jsonl",
            "surrogate",
            "chats.jsonl:1: message 1 holds '\\ud800' at character 5, a lone",
        ),
        ("chats.parquet", "random", "chats.parquet: not a readable .parquet input"),
        ("chats.arrow", "random", "chats.arrow: not a readable .arrow input"),
        ("chats.parquet", "big.parquet", "chats.parquet:2: record of over"),
        ("chats.json", "big.json", "chats.json:2: record of over"),
        ("chats.arrow", "big.arrow", "chats.arrow:2: record of over"),
    ],
)
def test_bad_inputs_are_one_line(
    tiny_world: Path, tmp_path: Path, name: str, kind: str, named: str
):
    """Before: a UnicodeEncodeError from the tokenizer, pyarrow's traceback, and a 50 MB
    record in .parquet or .json tokenized whole (4.4 GB of memory): the byte limit of a
    JSON Lines record now holds for every format."""
    path = write_input(tmp_path / name, kind)
    out = tmp_path / "out"
    one_line_error(prepare(tiny_world, out, f"inputs=[{path}]"), named)
    assert not out.exists()


def test_a_binary_or_endless_chat_template(tiny_world: Path, tmp_path: Path):
    """Before: a UnicodeDecodeError traceback; two nested range(100000) loops rendered
    forever (later: for 10 s, on the main thread only)."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(CHAT) + "\n")
    binary = tmp_path / "binary.jinja"
    binary.write_bytes(b"\xff\xfe\x00{{ messages }}")
    out = tmp_path / "out"
    result = prepare(tiny_world, out, f"inputs=[{chats}]", f"chat_template={binary}")
    one_line_error(result, f"{binary}: not a chat template (byte 0 is not UTF-8 text)")
    endless = tmp_path / "endless.jinja"
    endless.write_text(LOOPS + "{% for m in messages %}{{ m.content }}{% endfor %}")
    result = prepare(tiny_world, out, f"inputs=[{chats}]", f"chat_template={endless}")
    one_line_error(
        result,
        f"{endless} (",
        f"the chat template takes over {MAX_STEPS + 2 * STEPS_PER_MESSAGE:,} steps",
        f"at most {MAX_STEPS:,} + {STEPS_PER_MESSAGE:,} per message",
    )
    assert not out.exists()


def copy_data(data: Path, tmp_path: Path) -> Path:
    out = tmp_path / "data"
    shutil.copytree(data, out)
    return out


def edit_json(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def test_names_in_a_dataset_stay_inside_it(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    """Before: a meta.json file name ../../etc/passwd made the error print that file's size,
    and a state.json naming an Arrow file elsewhere was trained on silently."""
    target = target_path(tiny_world)
    outside = tmp_path / "outside.arrow"
    for i, (file, change, named) in enumerate(
        [
            (
                "meta.json",
                lambda m: m["files"].update({"../../../../etc/passwd": 1}),
                "'../../../../etc/passwd' is not a relative path inside",
            ),
            (
                "meta.json",
                lambda m: m["token_counts"].update({"file": "/etc/passwd"}),
                "'/etc/passwd' is not a relative path",
            ),
            (
                "state.json",
                lambda s: s["_data_files"][0].update({"filename": str(outside)}),
                f"state.json: file name {str(outside)!r} is not a relative path",
            ),
        ]
    ):
        data = copy_data(tiny_llama_data, tmp_path / str(i))
        edit_json(data / file, change)
        if file == "state.json":  # meta.json records its size: keep that check passing
            edit_json(
                data / "meta.json",
                lambda m, d=data: m["files"].update(
                    {"state.json": (d / "state.json").stat().st_size}
                ),
            )
        run = tmp_path / f"run{i}"
        one_line_error(invoke(train_draft_app, cli_args(run_sets(target, data, run))), named)
        assert not run.exists()


def test_a_dataset_rendered_with_another_chat_template(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: train-draft trained on rows rendered with any template (meta.json records its
    sha256; nothing compared it)."""
    target = target_path(tiny_world)
    template = target_template(target)
    assert template is not None
    recorded = json.loads((tiny_llama_data / "meta.json").read_text())["chat_template"]["sha256"]
    assert recorded == hashlib.sha256(template.encode()).hexdigest()  # as prepare-data saw it
    check_chat_template([tiny_llama_data], target, allowed=False)  # the same: accepted
    data = copy_data(tiny_llama_data, tmp_path)
    edit_json(data / "meta.json", lambda m: m["chat_template"].update({"sha256": "ab" * 32}))
    run = tmp_path / "run"
    result = invoke(train_draft_app, cli_args(run_sets(target, data, run)))
    one_line_error(result, f"{data / 'meta.json'}: rendered with chat template sha256 abababababab")
    assert "data.allow_chat_template_mismatch: true" in result.output and not run.exists()
    check_chat_template([data], target, allowed=True)  # said to be intended: accepted
    with pytest.raises(DataError):
        check_chat_template([tiny_llama_data, data], target, allowed=False)
