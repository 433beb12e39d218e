"""build-long-prompts: prompts that quote real standard-library files verbatim, sized in the
target's tokens and spread over the length ranges, the same for a seed; its training chats
go through prepare-data whole (rows past 2,048 tokens, none cropped) with every answer the
file's real continuation; eval-acceptance's prompt loader reads the prompts."""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from eagle_train.config import load_config
from eagle_train.data.config import PrepareDataConfig
from eagle_train.data.prepare import prepare_data
from eagle_train.data.store import load_prepared
from eagle_train.demo.long_context import LongContextConfig, build_long_context
from eagle_train.evaluate.prompts import load_prompts

STDLIB = Path(sysconfig.get_paths()["stdlib"])
RANGES = [(256, 512), (512, 1024), (1024, 2048), (2048, 4096)]
ROOM = 128


def _config(tokenizer: Path, seed: int = 0) -> LongContextConfig:
    return LongContextConfig(
        tokenizer=tokenizer,
        seed=seed,
        num_prompts=20,
        num_train=8,
        ranges=RANGES,
        answer_room=ROOM,
        chunk_tokens=256,
    )


@pytest.fixture(scope="module")
def built(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tokenizer = tiny_world / "targets" / "llama" / "bf16"
    root = tmp_path_factory.mktemp("long")
    build_long_context(_config(tokenizer), root / "a")
    build_long_context(_config(tokenizer), root / "b")
    build_long_context(_config(tokenizer, seed=1), root / "c")
    return {"root": root, "tokenizer": tokenizer}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_set_other_seed_other_set(built: dict) -> None:
    root = built["root"]
    for name in ("prompts.jsonl", "train.jsonl", "manifest.json"):
        assert (root / "a" / name).read_bytes() == (root / "b" / name).read_bytes()
    assert (root / "a" / "prompts.jsonl").read_bytes() != (
        root / "c" / "prompts.jsonl"
    ).read_bytes()


def _quoted(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_prompts_quote_real_files_and_are_measured_in_target_tokens(built: dict) -> None:
    tok = AutoTokenizer.from_pretrained(built["tokenizer"])
    prompts = _rows(built["root"] / "a" / "prompts.jsonl")
    assert {p["category"] for p in prompts} == {
        "explain", "find", "modify", "continue", "conversation"
    }  # fmt: skip
    for p in prompts:
        rel, span = p["source"].rsplit(":", 1)
        first, last = map(int, span.split("-"))
        lines = (STDLIB / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        code = "".join(q for turn in p["turns"] for q in _quoted(turn))
        assert code == "".join(lines[first - 1 : last])  # whole lines, verbatim, in order
        messages = [{"role": "user", "content": p["turns"][0]}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        assert p["prompt_tokens"] == len(ids["input_ids"] if "input_ids" in ids else ids)
        if p["category"] == "conversation":
            assert len(p["turns"]) == 2
    # prompt i in range i mod 4, kind i mod 5: each kind once in every range (the
    # conversation's first turn holds about half of its code, so only the single-turn kinds
    # are held to their range)
    for i, (lo, hi) in enumerate(RANGES):
        in_range = prompts[i :: len(RANGES)]
        assert len({p["category"] for p in in_range}) == 5
        group = [p for p in in_range if p["category"] != "conversation"]
        assert all(0.8 * lo <= p["prompt_tokens"] < hi - ROOM for p in group), (lo, hi, group)
    loaded = load_prompts(built["root"] / "a" / "prompts.jsonl")
    assert [q.id for q in loaded] == [p["id"] for p in prompts]


def test_training_chats_go_through_prepare_data_whole(built: dict, tmp_path: Path) -> None:
    chats = _rows(built["root"] / "a" / "train.jsonl")
    conversations = [c for c in chats if len(c["messages"]) > 1]
    questions = [c for c in chats if len(c["messages"]) == 1]
    assert conversations and questions
    for c in conversations:  # the answers are the file's lines that follow, in order
        first = _quoted(c["messages"][0]["content"])[0]
        rel = re.search(r"start of `([^`]+)`", c["messages"][0]["content"]).group(1)
        text = (STDLIB / rel).read_text(encoding="utf-8")
        answers = "".join(
            _quoted(m["content"])[0] for m in c["messages"] if m["role"] == "assistant"
        )
        assert first + answers in text
        assert [m["content"] for m in c["messages"][2::2]] == ["Continue."] * (
            len(c["messages"]) // 2 - 1
        )
    out = tmp_path / "data"
    cfg = load_config(
        PrepareDataConfig,
        None,
        [
            f"inputs=[{built['root'] / 'a' / 'train.jsonl'}]",
            f"output_dir={out}",
            f"tokenizer={built['tokenizer']}",
            "max_length=8192",
        ],
    )
    report = prepare_data(cfg)
    assert report.num_truncated == 0
    lengths = sorted(len(ids) for ids in load_prepared(out)["input_ids"])
    manifest = json.loads((built["root"] / "a" / "manifest.json").read_text())
    whole = sorted(
        n for c, n in zip(chats, manifest["train_tokens"], strict=True) if len(c["messages"]) > 1
    )
    # every conversation is one row, uncropped (a template may add a token or two that the
    # manifest's rendering without special tokens leaves out)
    assert len(lengths) == len(whole)
    # chat i takes range (i // 2) mod 4 and stays below its top, template and turns included
    for i, c in enumerate(chats):
        if len(c["messages"]) > 2:
            assert manifest["train_tokens"][i] < RANGES[i // 2 % len(RANGES)][1], (i, c["id"])
    assert all(abs(a - b) <= 2 for a, b in zip(lengths, whole, strict=True)), (lengths, whole)
    assert max(lengths) > 2048


def test_training_chats_alone_but_not_nothing(tiny_world: Path) -> None:
    tokenizer = tiny_world / "targets" / "llama" / "bf16"
    assert LongContextConfig(tokenizer=tokenizer, num_prompts=0).num_train == 200
    with pytest.raises(ValueError, match="num_prompts and num_train are both 0"):
        LongContextConfig(tokenizer=tokenizer, num_prompts=0, num_train=0)


def test_a_bad_tokenizer_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    from eagle_train.errors import UserError

    with pytest.raises(UserError, match="tokenizer: .*missing: not a tokenizer"):
        build_long_context(_config(tmp_path / "missing"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
