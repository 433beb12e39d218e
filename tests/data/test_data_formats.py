"""The input formats people have: SpecForge/speculators `conversations` with role/content,
ShareGPT from/value, OpenAI tool calls, content parts, reasoning fields, datasets by id."""

from __future__ import annotations

import json

import pytest
from data_fixtures import write_jsonl

from eagle_train.data import BadRecordPolicy, DataError, RecordReader, parse_record
from eagle_train.data.config import HubDataset


def test_conversations_with_role_content_and_top_level_system():
    rec = parse_record(
        {
            "id": "sf-1",
            "system": "Be kind.",
            "conversations": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ],
        },
        "specforge.jsonl",
        4,
    )
    assert rec.id == "sf-1"
    assert rec.messages == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]


def test_sharegpt_with_observation_as_tool():
    rec = parse_record(
        {
            "conversations": [
                {"from": "human", "value": "Weather?"},
                {"from": "gpt", "value": "Checking."},
                {"from": "observation", "value": "22C"},
                {"from": "gpt", "value": "22C."},
            ]
        },
        "sharegpt.jsonl",
        1,
    )
    assert [m["role"] for m in rec.messages] == ["user", "assistant", "tool", "assistant"]
    assert rec.id == "sharegpt.jsonl:1"


def test_openai_tool_calls_content_parts_and_reasoning():
    rec = parse_record(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Weather "}, "in Paris?"],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "I need the tool.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
                {"role": "assistant", "content": "It is 22C.", "thinking": "Easy."},
            ]
        },
        "tools.jsonl",
        2,
    )
    assert rec.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    "id": "call_1",
                }
            ],
            "content": "",
            "reasoning_content": "I need the tool.",
            "thinking": "I need the tool.",
        },
        {"role": "tool", "content": "22C", "tool_call_id": "call_1"},
        {
            "role": "assistant",
            "content": "It is 22C.",
            "reasoning_content": "Easy.",
            "thinking": "Easy.",
        },
    ]


def test_no_tool_calls_key_when_empty():
    # Llama-3 templates branch on `'tool_calls' in message`: an empty list must not appear.
    rec = parse_record(
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "tool_calls": []},
            ]
        },
        "x.jsonl",
        1,
    )
    assert rec.messages[1] == {"role": "assistant", "content": "Hello"}


def test_image_parts_are_counted_skips(tmp_path):
    image = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]},
            {"role": "assistant", "content": "A cat."},
        ]
    }
    text = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    path = write_jsonl(tmp_path / "mixed.jsonl", [text, image, text | {"id": "b"}])
    policy = BadRecordPolicy("skip")
    records = list(RecordReader([path], policy))
    assert [r.line for r in records] == [1, 3]
    assert policy.skipped == {"non_text_content": 1}
    with pytest.raises(DataError, match=r"mixed.jsonl:2: message 1: content part 1 is 'image_url'"):
        list(RecordReader([path], BadRecordPolicy("error")))


def test_dataset_by_id_from_a_local_folder(tmp_path):
    folder = tmp_path / "my_chats"
    folder.mkdir()
    rows = [
        {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
        for i in range(5)
    ]
    write_jsonl(folder / "train.jsonl", rows[:3])
    write_jsonl(folder / "test.jsonl", rows[3:])
    for streaming in (False, True):
        spec = HubDataset(name=str(folder), split="test", streaming=streaming)
        records = list(RecordReader([spec], BadRecordPolicy()))
        assert [r.messages[0]["content"] for r in records] == ["q3", "q4"]
        assert [r.id for r in records] == [f"{folder}/test:1", f"{folder}/test:2"]


def test_dataset_saved_with_save_to_disk(tmp_path):
    import datasets

    rows = {"messages": [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    records = list(RecordReader([tmp_path / "saved"], BadRecordPolicy()))
    assert records[0].messages == rows["messages"][0]


def test_dataset_id_not_available_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = HubDataset(name="no-such-org/no-such-chats", split="train")
    with pytest.raises(DataError) as info:
        list(RecordReader([spec], BadRecordPolicy()))
    message = str(info.value)
    assert message.startswith("dataset no-such-org/no-such-chats/train: cannot be loaded (")
    assert "\n" not in message and info.value.reason == "missing_input"


def test_prepare_config_needs_some_input(tmp_path):
    from eagle_train.config import ConfigError, load_config
    from eagle_train.data.config import PrepareDataConfig

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"output_dir": "o", "tokenizer": "t"}))
    with pytest.raises(ConfigError, match="give inputs, datasets, or synthesize.enabled"):
        load_config(PrepareDataConfig, path, [])
    with pytest.raises(ConfigError, match="synthesize.enabled needs regenerate.enabled"):
        load_config(PrepareDataConfig, path, ["synthesize.enabled=true"])
