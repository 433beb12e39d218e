"""prepare_data end to end (no regeneration): output layout, meta, atomicity, skips, vocab."""

from __future__ import annotations

import json

import pytest
import torch
from data_fixtures import (
    LLAMA3_TEMPLATE,
    QWEN3_HISTORY_TEMPLATE,
    build_tokenizer,
    chat,
    write_jsonl,
)

from eagle_train.config import ConfigError, load_config
from eagle_train.data import (
    ChatRenderer,
    DataError,
    PrepareDataConfig,
    PreparedDataError,
    load_prepared,
    load_token_counts,
    prepare_data,
    read_meta,
)
from eagle_train.data import prepare as prepare_module

# QWEN3_HISTORY_TEMPLATE plus Qwen3's enable_thinking=false generation prompt.
QWEN3_GEN_TEMPLATE = QWEN3_HISTORY_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
    "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
CHATS = [
    {"id": "a", "messages": chat("Hello there", "Hi! How can I help?", "Sort 3 1 2", "1 2 3")},
    {
        "conversations": [
            {"from": "human", "value": "Tell me a story"},
            {"from": "gpt", "value": "Once upon a time."},
        ]
    },
    {"messages": chat("What is the sun?", "A star.", system="Be brief.")},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


@pytest.fixture
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def make_cfg(tmp_path, tokenizer_dir, records=CHATS, **kw):
    inputs = kw.pop("inputs", None) or [str(write_jsonl(tmp_path / "in.jsonl", records))]
    return PrepareDataConfig(
        inputs=inputs, output_dir=tmp_path / "out", tokenizer=tokenizer_dir, **kw
    )


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_prepare_round_trip(tmp_path, tokenizer_dir, tokenizer):
    cfg = make_cfg(tmp_path, tokenizer_dir)
    report = prepare_data(cfg)
    assert (report.num_records, report.num_examples, report.num_skipped, report.num_failed) == (
        3,
        3,
        0,
        0,
    )
    ds = load_prepared(cfg.output_dir)
    assert ds.column_names == ["input_ids", "loss_mask", "id"]
    assert str(ds.features["input_ids"].feature.dtype) == "int32"
    assert str(ds.features["loss_mask"].feature.dtype) == "int8"
    assert ds["id"] == ["a", f"{cfg.inputs[0]}:2", f"{cfg.inputs[0]}:3"]
    # Each row is exactly what the renderer produces for that conversation.
    renderer = ChatRenderer(tokenizer)
    sharegpt = chat("Tell me a story", "Once upon a time.")
    for row, messages in zip(
        ds, [CHATS[0]["messages"], sharegpt, CHATS[2]["messages"]], strict=True
    ):
        expected = renderer.tokenize_rows(messages, cfg.max_length, "x:1")[0]
        assert (row["input_ids"], row["loss_mask"]) == (expected.input_ids, expected.loss_mask)
    meta = read_meta(cfg.output_dir)
    assert meta["tokenizer"] == str(tokenizer_dir.resolve())
    assert meta["chat_template"]["sha256"] == renderer.template_sha256
    assert meta["chat_template"]["method"] == "prefix_diff"
    assert meta["max_length"] == 2048
    assert meta["counts"]["examples"] == 3 and meta["counts"]["records"] == 3
    assert meta["sources"] == [str(cfg.inputs[0].resolve())]
    assert meta["regeneration"] is None
    # The counts equal an independent count of the masked tokens, over the whole vocabulary.
    counts = load_token_counts(report.counts_path)
    expected_counts = torch.zeros(len(tokenizer), dtype=torch.int64)
    for row in ds:
        for token, m in zip(row["input_ids"], row["loss_mask"], strict=True):
            expected_counts[token] += m
    assert torch.equal(counts, expected_counts)
    assert meta["token_counts"] == {
        "file": "token_counts.safetensors",
        "target_vocab_size": len(tokenizer),
        "supervised_tokens": int(expected_counts.sum()),
    }
    assert meta["files"]["token_counts.safetensors"] == report.counts_path.stat().st_size
    assert leftovers(tmp_path) == []
    assert "prepared 3 examples from 3 records" in report.summary()


def test_template_override_and_target_vocab_from_model_config(tmp_path, tokenizer_dir):
    template = tmp_path / "llama3.jinja"
    template.write_text(LLAMA3_TEMPLATE)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 33_152}))
    cfg = make_cfg(
        tmp_path,
        tokenizer_dir,
        chat_template=template,
        regenerate={"model": tmp_path / "model"},  # not enabled: only read for the target's V
    )
    report = prepare_data(cfg)
    ds = load_prepared(cfg.output_dir)
    assert all(
        row[0] == 0 and row.count(0) == 1 for row in ds["input_ids"]
    )  # one bos, from the template
    meta = read_meta(cfg.output_dir)
    assert meta["chat_template"]["source"] == str(template.resolve())
    assert meta["token_counts"]["target_vocab_size"] == 33_152
    assert load_token_counts(report.counts_path).shape == (33_152,)


def test_truncation_and_prompt_only_skip(tmp_path, tokenizer_dir):
    long_prompt = {"id": "long", "messages": chat("word " * 300, "short answer")}
    cfg = make_cfg(tmp_path, tokenizer_dir, records=CHATS + [long_prompt], max_length=44)
    report = prepare_data(cfg)
    assert report.skipped == {"no_assistant_tokens": 1}
    assert report.num_examples == 3 and report.num_records == 4
    ds = load_prepared(cfg.output_dir)
    assert all(len(r) <= 44 for r in ds["input_ids"])
    assert [len(m) for m in ds["loss_mask"]] == [len(r) for r in ds["input_ids"]]
    assert report.num_truncated == sum(len(r) == 44 for r in ds["input_ids"]) >= 1


def test_bad_records_error_mode_leaves_nothing(tmp_path, tokenizer_dir):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHATS) + '{"messages": [}\n')
    cfg = make_cfg(tmp_path, tokenizer_dir, inputs=[str(path)])
    with pytest.raises(DataError, match=f"{path}:4: malformed JSON"):
        prepare_data(cfg)
    assert not cfg.output_dir.exists() and leftovers(tmp_path) == []


def test_bad_records_skip_mode_counts(tmp_path, tokenizer_dir):
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_HISTORY_TEMPLATE)  # multi-turn chats train as one row per turn
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in CHATS] + [
        "not json",
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        json.dumps({"messages": []}),
        json.dumps({"messages": [{"role": "user", "content": 3}]}),
        json.dumps({"messages": chat("only a question")}),
    ]
    path.write_text("\n".join(lines) + "\n")
    cfg = make_cfg(
        tmp_path, tokenizer_dir, inputs=[str(path)], on_bad_record="skip", chat_template=template
    )
    report = prepare_data(cfg)
    assert report.skipped == {
        "malformed_json": 1,
        "unknown_role": 1,
        "empty_conversation": 1,
        "non_string_content": 1,
        "no_assistant_tokens": 1,
    }
    assert (report.num_examples, report.num_rows) == (3, 4)  # CHATS[0]: two turns, two rows
    assert report.num_examples + report.num_skipped + report.num_failed == report.num_records == 8
    assert read_meta(cfg.output_dir)["counts"]["skipped"] == dict(sorted(report.skipped.items()))


def test_failure_midway_leaves_no_partial_output(tmp_path, tokenizer_dir, monkeypatch):
    cfg = make_cfg(tmp_path, tokenizer_dir)
    original = prepare_module.write_meta

    def crash(out_dir, meta):
        original(out_dir, meta)
        assert (out_dir / "meta.json").exists() and any(out_dir.glob("*.arrow"))
        raise RuntimeError("disk full")

    monkeypatch.setattr(prepare_module, "write_meta", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_data(cfg)
    assert not cfg.output_dir.exists() and leftovers(tmp_path) == []


def test_existing_output_needs_overwrite(tmp_path, tokenizer_dir):
    cfg = make_cfg(tmp_path, tokenizer_dir)
    cfg.output_dir.mkdir()
    (cfg.output_dir / "old.txt").write_text("old")
    with pytest.raises(DataError, match="already exists; set overwrite=true"):
        prepare_data(cfg)
    # issue 18: overwrite replaces an earlier prepared dataset, never a user's directory.
    cfg.overwrite = True
    with pytest.raises(
        DataError, match="holds old.txt .and no record of the files prepare-data wrote"
    ):
        prepare_data(cfg)
    assert (cfg.output_dir / "old.txt").read_text() == "old"
    (cfg.output_dir / "old.txt").unlink()  # an empty directory is taken
    prepare_data(cfg)
    (cfg.output_dir / "notes.txt").write_text("mine")  # issue 59: never removed
    with pytest.raises(DataError, match="holds notes.txt, which prepare-data did not write"):
        prepare_data(cfg)
    assert (cfg.output_dir / "notes.txt").read_text() == "mine"
    (cfg.output_dir / "notes.txt").unlink()
    prepare_data(cfg)  # an earlier prepared dataset, nothing but its own files: replaced
    assert len(load_prepared(cfg.output_dir)) == 3 and leftovers(tmp_path) == []


def test_no_usable_examples_is_an_error(tmp_path, tokenizer_dir):
    cfg = make_cfg(tmp_path, tokenizer_dir, records=[{"messages": chat("question only")}])
    with pytest.raises(DataError, match="no usable examples"):
        prepare_data(cfg)
    assert not cfg.output_dir.exists() and leftovers(tmp_path) == []


def test_config_mistakes_fail_before_any_work(tmp_path, tokenizer_dir, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("should have failed before reading or generating")

    monkeypatch.setattr(prepare_module, "run_regeneration", no_work)
    monkeypatch.setattr(prepare_module, "RecordReader", no_work)
    cfg = make_cfg(tmp_path, tokenizer_dir, regenerate={"enabled": True})
    cfg.vocab.target_vocab_size = 32_000
    with pytest.raises(
        DataError, match="the tokenizer has 33012 tokens but the target vocabulary is 32000"
    ):
        prepare_data(cfg)
    cfg.inputs = [tmp_path / "missing.jsonl"]
    with pytest.raises(DataError, match="inputs not found: .*missing.jsonl"):
        prepare_data(cfg)


def test_load_prepared_validates(tmp_path, tokenizer_dir):
    cfg = make_cfg(tmp_path, tokenizer_dir)
    prepare_data(cfg)
    meta_path = cfg.output_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    with pytest.raises(PreparedDataError, match="no meta.json"):
        load_prepared(tmp_path)
    meta_path.write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(PreparedDataError, match="format_version 99"):
        load_prepared(cfg.output_dir)
    meta_path.write_text(json.dumps({**meta, "counts": {**meta["counts"], "rows": 5}}))
    with pytest.raises(PreparedDataError, match="3 rows but meta.json says 5"):
        load_prepared(cfg.output_dir)
    meta_path.write_text(json.dumps({**meta, "vocab": {"file": "vocab.safetensors"}}))
    with pytest.raises(PreparedDataError, match="vocab.safetensors, which is missing"):
        load_prepared(cfg.output_dir)
    counts = cfg.output_dir / "token_counts.safetensors"
    meta_path.write_text(json.dumps(meta))
    counts.write_bytes(counts.read_bytes()[:-8])  # cut short: named by its recorded size
    with pytest.raises(PreparedDataError, match="token_counts.safetensors: .* bytes, meta.json"):
        load_prepared(cfg.output_dir)
    counts.unlink()
    with pytest.raises(PreparedDataError, match="token_counts.safetensors: missing"):
        load_prepared(cfg.output_dir)


def test_config_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "prepare.yaml"
    path.write_text(
        "inputs: [a.jsonl, b.parquet]\noutput_dir: out\ntokenizer: tok\n"
        "regenerate:\n  enabled: true\n  temperature: 0.7\nvocab:\n  target_vocab_size: 32000\n"
    )
    cfg = load_config(PrepareDataConfig, path, ["max_length=4096", "regenerate.backend=vllm"])
    assert cfg.max_length == 4096 and cfg.regenerate.backend == "vllm"
    assert cfg.regenerate.temperature == 0.7 and cfg.regenerate.model is None
    assert cfg.vocab.target_vocab_size == 32000 and cfg.on_bad_record == "error"
    with pytest.raises(ConfigError, match="unknown key 'regenerate.temprature'"):
        load_config(PrepareDataConfig, path, ["regenerate.temprature=1"])
    with pytest.raises(ConfigError, match="on_bad_record"):
        load_config(PrepareDataConfig, path, ["on_bad_record=ignore"])


def test_per_turn_rows_with_template_kwargs(tmp_path, tokenizer_dir, tokenizer):
    # Qwen3 drops <think> from earlier turns: record "a" (2 answers) becomes 2 rows; with
    # enable_thinking=false the empty think block is prompt, so the masked tokens are exactly
    # each answer and <|im_end|>.
    template = tmp_path / "qwen3.jinja"
    template.write_text(QWEN3_GEN_TEMPLATE)
    cfg = make_cfg(
        tmp_path,
        tokenizer_dir,
        chat_template=template,
        chat_template_kwargs={"enable_thinking": False},
    )
    report = prepare_data(cfg)
    assert (report.num_examples, report.num_rows) == (3, 4)
    ds = load_prepared(cfg.output_dir)
    assert ds["id"] == ["a#turn1", "a#turn2", f"{cfg.inputs[0]}:2", f"{cfg.inputs[0]}:3"]
    masked = [
        tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True)
    ]
    assert masked == [
        "Hi! How can I help?<|im_end|>",
        "1 2 3<|im_end|>",
        "Once upon a time.<|im_end|>",
        "A star.<|im_end|>",
    ]
    assert read_meta(cfg.output_dir)["counts"]["rows"] == 4


def test_an_output_that_holds_its_inputs_is_refused(tmp_path, tokenizer_dir):
    """issue 18: with the shipped ``overwrite: true`` and an output_dir that held its own
    inputs, prepare-data deleted the inputs (and everything else there)."""
    home = tmp_path / "project"
    home.mkdir()
    cfg = make_cfg(home, tokenizer_dir, overwrite=True)
    cfg.output_dir = home  # the directory the input lives in
    before = {p.name: p.read_bytes() for p in home.iterdir()}
    with pytest.raises(DataError, match=r"output_dir .*project contains the input .*in.jsonl"):
        prepare_data(cfg)
    assert {p.name: p.read_bytes() for p in home.iterdir()} == before
    cfg.output_dir = tokenizer_dir / "prepared"  # inside the tokenizer: refused too
    with pytest.raises(DataError, match="is inside the tokenizer"):
        prepare_data(cfg)
    assert not cfg.output_dir.exists()


def test_regeneration_never_truncates_an_input(tmp_path, tokenizer_dir):
    """issue 18: ``regenerate.output_path`` equal to an input with ``resume=false``
    truncated the input to 0 bytes before anything was generated."""
    cfg = make_cfg(tmp_path, tokenizer_dir)
    source = cfg.inputs[0]
    content = source.read_bytes()
    cfg.regenerate.enabled = True
    cfg.regenerate.resume = False
    cfg.regenerate.output_path = source
    with pytest.raises(DataError, match=r"regenerate.output_path .*in.jsonl is the input"):
        prepare_data(cfg)
    assert source.read_bytes() == content
    # Not an input, but not an earlier regeneration either: kept as well.
    other = tmp_path / "notes.jsonl"
    other.write_text("my notes\n")
    cfg.regenerate.output_path = other
    for resume in (False, True):  # resuming named "other regeneration settings" instead
        cfg.regenerate.resume = resume
        with pytest.raises(DataError, match="notes.jsonl exists and was not written by a regen"):
            prepare_data(cfg)
        assert other.read_text() == "my notes\n"


def test_temporaries_of_a_killed_run_are_removed_but_not_a_live_one(tmp_path, tokenizer_dir):
    """issue 18: the hidden temporary directory a killed prepare-data left beside its output
    stayed forever; the next run removes it, unless a live run holds the output."""
    from eagle_train.fsutil import hold_lock

    cfg = make_cfg(tmp_path, tokenizer_dir)
    stale = tmp_path / ".out.tmp-0badf00d"
    (stale / ".scratch").mkdir(parents=True)
    (stale / ".scratch" / "examples.arrow").write_bytes(b"half")
    with hold_lock(tmp_path / ".out.lock", "a live run"):
        with pytest.raises(DataError, match="in use by another process"):
            prepare_data(cfg)
        assert stale.is_dir()
    prepare_data(cfg)
    assert not stale.exists() and leftovers(tmp_path) == []
    assert len(load_prepared(cfg.output_dir)) == 3
