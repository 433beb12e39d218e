"""The demo world: deterministic, loadable through from_pretrained, prompt-dependent data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from realistic import HIGH_ID, assert_shapes_like_real_use, high_ids, vocab_size
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle_train.config import load_config
from eagle_train.demo.build import DemoConfig, build_demo_world, target_dir
from eagle_train.demo.tokenizer import BOS, EOS, MASK, PAD, ROLE_TOKENS
from eagle_train.fsutil import UnsafePathError
from eagle_train.ownership import RECORD


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_world_layout_and_summary(tiny_world: Path) -> None:
    summary = json.loads((tiny_world / "world.json").read_text())
    assert set(summary["targets"]) == {"llama", "qwen3"}
    for family in ("llama", "qwen3"):
        for dtype in ("fp32", "bf16"):
            assert (target_dir(tiny_world, family, dtype) / "model.safetensors").is_file()
    train = read_jsonl(tiny_world / "data" / "train.jsonl")
    val = read_jsonl(tiny_world / "data" / "val.jsonl")
    assert len(train) == summary["num_train_chats"] and len(val) == summary["num_val_chats"]
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    roles = {m["role"] for r in train for m in r["messages"]}
    assert roles == {"user", "assistant"}
    assert any(r["id"].startswith("stdlib-") for r in train)
    assert any(r["id"].startswith("task-") for r in train)


def test_tokenizer_special_tokens_and_template(tiny_world: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_world / "tokenizer")
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token) == (BOS, EOS, PAD, MASK)
    for special in (BOS, EOS, PAD, MASK, *ROLE_TOKENS):
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, f"{special} must be a single token"
    messages = [{"role": "user", "content": "Add: 1 + 2"}, {"role": "assistant", "content": "3"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == f"{BOS}<|user|>\nAdd: 1 + 2{EOS}\n<|assistant|>\n3{EOS}\n"
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert text.startswith(prompt) and prompt.endswith("<|assistant|>\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE is lossless
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_targets_round_trip_from_pretrained(tiny_world: Path, family: str) -> None:
    fp32 = AutoModelForCausalLM.from_pretrained(target_dir(tiny_world, family, "fp32"))
    bf16 = AutoModelForCausalLM.from_pretrained(target_dir(tiny_world, family, "bf16"))
    assert fp32.config.model_type == family
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(fp32.state_dict().items(), bf16.state_dict().items(), strict=True):
        assert torch.equal(a.to(torch.bfloat16), b), name
    tok = AutoTokenizer.from_pretrained(target_dir(tiny_world, family, "fp32"))
    assert fp32.config.vocab_size == len(tok)
    assert fp32.generation_config.eos_token_id == tok.eos_token_id


def test_the_wide_world_holds_ids_a_16_bit_integer_cannot(wide_world: Path) -> None:
    """The world the id tests run on is shaped like a real target: a vocabulary past 32,767
    ids, its chats' tokens and its target's greedy tokens on both sides of it (a token id
    stored in 16 bits would wrap on real rows, so it must wrap here too)."""
    path = target_dir(wide_world, "llama", "fp32")
    assert vocab_size(path) > HIGH_ID
    tok = AutoTokenizer.from_pretrained(path)
    chats = read_jsonl(wide_world / "data" / "val.jsonl")[:7]
    ids = [tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False) for c in chats]
    flat = [i for row in ids for i in row]
    assert_shapes_like_real_use(flat, "the val chats' tokens")
    assert high_ids(flat) > len(flat) / 4  # the common tokens, not a stray one
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        greedy = model(torch.tensor([ids[0]])).logits.argmax(-1)
    assert_shapes_like_real_use(greedy, "the target's greedy tokens")


def test_pretraining_lowers_the_loss(tiny_world: Path) -> None:
    summary = json.loads((tiny_world / "world.json").read_text())
    vocab = summary["tokenizer_vocab"]
    for family, info in summary["targets"].items():
        # A uniform guess costs ln(V); the short pretraining must be clearly below it.
        assert info["final_pretrain_loss"] < 0.85 * torch.log(torch.tensor(vocab)).item(), family


def file_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("world.json", RECORD)  # both hold build_seconds
    }


def test_build_is_deterministic_and_atomic(
    tiny_world: Path, tiny_world_config: Path, tmp_path: Path
) -> None:
    cfg = load_config(DemoConfig, tiny_world_config, ["families=[llama]"])
    again = tmp_path / "again"
    build_demo_world(cfg, again)
    ours = {k: v for k, v in file_digest(tiny_world).items() if "qwen3" not in k}
    assert file_digest(again) == ours
    with pytest.raises(UnsafePathError, match="--overwrite"):
        build_demo_world(cfg, again)
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # no temporary left behind


def test_prepare_data_regenerates_demo_answers_with_the_target(tiny_world: Path, tmp_path: Path):
    """prepare-data on the demo chats: the assistant turns become the target's greedy output
    (checked against transformers generate), and the loss mask covers exactly them."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data
    from eagle_train.data.store import load_prepared

    target = target_dir(tiny_world, "llama", "fp32")
    out = tmp_path / "prepared"
    cfg = load_config(
        PrepareDataConfig,
        None,
        [
            f"inputs=[{tiny_world / 'data' / 'val.jsonl'}]",
            f"output_dir={out}",
            f"tokenizer={target}",
            "limit=4",
            "regenerate.enabled=true",
            "regenerate.backend=transformers",
            "regenerate.dtype=float32",
            "regenerate.max_new_tokens=24",
        ],
    )
    report = prepare_data(cfg)
    assert report.num_examples == 4
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    chats = read_jsonl(tiny_world / "data" / "val.jsonl")[:4]
    rows = load_prepared(out)
    for chat, row in zip(chats, rows, strict=True):
        prompt = tok.apply_chat_template(
            chat["messages"][:1], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )[0, len(prompt) :].tolist()
        if tok.eos_token_id in gen:  # the answer ends at (and includes) the end of turn
            gen = gen[: gen.index(tok.eos_token_id) + 1]
        ids, mask = row["input_ids"], row["loss_mask"]
        assert ids[: len(prompt)] == prompt
        masked = [t for t, m in zip(ids, mask, strict=True) if m]
        assert masked[: len(gen)] == gen  # a second turn's answer may follow
        if len(chat["messages"]) == 2:
            assert masked == gen
