"""Readers: OpenAI / ShareGPT JSONL, datasets files, ids and sources, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from data_fixtures import write_jsonl

from eagle_train.data import BadRecordPolicy, DataError, RecordReader

OPENAI = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
SHAREGPT = {
    "id": "sg-1",
    "conversations": [
        {"from": "system", "value": "be nice"},
        {"from": "human", "value": "a"},
        {"from": "gpt", "value": "b"},
        {"from": "user", "value": "c"},
        {"from": "chatgpt", "value": "d"},
        {"from": "human", "value": "e"},
        {"from": "bard", "value": "f"},
        {"from": "human", "value": "g"},
        {"from": "assistant", "value": "h"},
    ],
}


def read(paths, mode="error", limit=None):
    policy = BadRecordPolicy(mode)
    reader = RecordReader(paths, policy, limit)
    return list(reader), reader, policy


def test_openai_and_sharegpt_are_detected_per_record(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [OPENAI, SHAREGPT, {**OPENAI, "id": 17}])
    records, reader, _ = read([path])
    assert [r.id for r in records] == [f"{path}:1", "sg-1", "17"]
    assert [(r.source, r.line) for r in records] == [(str(path), 1), (str(path), 2), (str(path), 3)]
    assert records[0].messages == OPENAI["messages"]
    roles = [m["role"] for m in records[1].messages]
    assert roles == ["system"] + ["user", "assistant"] * 4
    assert [m["content"] for m in records[1].messages] == list("be nice,a,b,c,d,e,f,g,h".split(","))
    assert reader.num_records == 3


def test_blank_lines_keep_line_numbers(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text("\n" + json.dumps(OPENAI) + "\n\n  \n" + json.dumps(OPENAI) + "\n")
    records, reader, _ = read([path])
    assert [r.line for r in records] == [2, 5]
    assert reader.num_records == 2


@pytest.mark.parametrize("fmt", ["parquet", "json_array", "arrow", "saved"])
def test_datasets_formats(tmp_path, fmt):
    rows = [
        {"messages": OPENAI["messages"], "id": None},
        {"messages": OPENAI["messages"], "id": "b"},
    ]
    ds = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        path = tmp_path / "d.parquet"
        ds.to_parquet(str(path))
    elif fmt == "json_array":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows))
    else:
        path = tmp_path / "saved"
        ds.save_to_disk(str(path))
        if fmt == "arrow":
            path = next(path.glob("*.arrow"))
    records, _, _ = read([path])
    assert [r.id for r in records] == [f"{path}:1", "b"]
    assert [r.line for r in records] == [1, 2]
    assert records[1].messages == OPENAI["messages"]


def test_limit_counts_records_across_files(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [OPENAI] * 3)
    b = write_jsonl(tmp_path / "b.jsonl", [OPENAI] * 3)
    records, reader, _ = read([a, b], limit=4)
    assert [(r.source, r.line) for r in records][-1] == (str(b), 1)
    assert reader.num_records == 4


BAD = {
    "malformed_json": ('{"messages": [', "malformed JSON"),
    "unknown_role": (
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        "unknown role 'robot'",
    ),
    "unknown_sharegpt_role": (
        json.dumps({"conversations": [{"from": "function_call", "value": "x"}]}),
        "unknown from 'function_call'",
    ),
    "empty_conversation": (json.dumps({"messages": []}), "empty conversation"),
    "non_string_content": (
        json.dumps({"messages": [{"role": "user", "content": 42}]}),
        "content must be a string or a list of text parts, got int",
    ),
    "text_part_without_text": (
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        "message 1: content part 1 has no 'text' string",
    ),
    "image_part": (
        json.dumps(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            {"type": "image_url", "image_url": {"url": "x.png"}},
                        ],
                    }
                ]
            }
        ),
        "message 1: content part 2 is 'image_url', not text",
    ),
    "bad_tool_arguments": (
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    },
                ]
            }
        ),
        "message 2: tool call 1: arguments are not valid JSON",
    ),
    "null_content": (
        json.dumps({"conversations": [{"from": "human", "value": None}]}),
        "got NoneType",
    ),
    "no_conversation": (json.dumps({"text": "hello"}), "neither 'messages'"),
    "not_an_object": ("[1, 2]", "expected a JSON object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_record_error_names_file_and_line(tmp_path, case):
    line, message = BAD[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(OPENAI) + "\n\n" + line + "\n")
    with pytest.raises(DataError) as info:
        read([path])
    assert str(info.value).startswith(f"{path}:3: ")
    assert message in str(info.value)


def test_skip_mode_counts_each_reason(tmp_path):
    lines = [json.dumps(OPENAI)] + [BAD[c][0] for c in sorted(BAD)] + [json.dumps(OPENAI)]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records, reader, policy = read([path], mode="skip")
    assert [r.line for r in records] == [1, len(lines)]
    assert policy.skipped == {
        "malformed_json": 1,
        "unknown_role": 2,
        "empty_conversation": 1,
        "non_string_content": 2,
        "non_text_content": 1,
        "bad_format": 4,
    }
    assert reader.num_records == len(records) + policy.num_skipped == len(lines)


def test_duplicate_ids(tmp_path):
    path = write_jsonl(
        tmp_path / "dup.jsonl", [{**OPENAI, "id": "x"}, OPENAI, {**OPENAI, "id": "x"}]
    )
    with pytest.raises(DataError, match=f"{path}:3: duplicate id 'x' \\(first at {path}:1\\)"):
        read([path])
    records, _, policy = read([path], mode="skip")
    assert len(records) == 2 and policy.skipped == {"duplicate_id": 1}


def test_missing_and_unsupported_inputs(tmp_path):
    with pytest.raises(DataError, match="input not found"):
        read([tmp_path / "nope.jsonl"])
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported input"):
        read([tmp_path / "x.csv"])


def test_a_folder_of_jsonl_files_reads_every_record_in_path_order(tiny_world: Path, tmp_path: Path):
    """Before: prepare-data given a folder of .jsonl files failed with FileNotFoundError."""
    lines = (tiny_world / "data" / "train.jsonl").read_text().splitlines()
    folder = tmp_path / "chats"
    (folder / "b").mkdir(parents=True)
    (folder / "a.jsonl").write_text("\n".join(lines[:5]) + "\n")
    (folder / "b" / "c.jsonl").write_text("\n".join(lines[5:9]) + "\n")
    (folder / "notes.txt").write_text("not data")
    records = list(RecordReader([folder], BadRecordPolicy("error")))
    ids = [json.loads(x)["id"] for x in lines[:9]]  # the demo chats carry ids
    assert [r.id for r in records] == ids
    assert [r.source for r in records] == [str(folder / "a.jsonl")] * 5 + [
        str(folder / "b" / "c.jsonl")
    ] * 4
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no data files"):
        list(RecordReader([empty], BadRecordPolicy("error")))
