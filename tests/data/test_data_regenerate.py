"""Regeneration of assistant turns by the target: scripted backend, tiny Llama, resume, vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from data_fixtures import build_tiny_llama, build_tokenizer, chat, write_jsonl

from eagle_train.data import DataError, PrepareDataConfig, load_prepared, prepare_data, read_meta
from eagle_train.data import prepare as prepare_module
from eagle_train.data.generation import cut_at_stop

CONVERSATIONS = [
    {"id": "two-turns", "messages": chat("Hello there", "old answer", "Sort 3 1 2", "old 1 2 3")},
    {
        "conversations": [
            {"from": "human", "value": "Tell me a story"},
            {"from": "gpt", "value": "old story"},
        ]
    },
    {"id": "sys", "messages": chat("What is the sun?", "old star", system="Be brief.")},
    {"id": "trailing-user", "messages": chat("Reverse abc", "old cba", "And xyz?")},
    {"id": "three-turns", "messages": chat("one", "old 1", "two", "old 2", "three", "old 3")},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer(path)
    build_tiny_llama(path, tokenizer)
    return path


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def make_cfg(tmp_path, model_dir, records=CONVERSATIONS, **regen):
    inputs = [write_jsonl(tmp_path / "in.jsonl", records)]
    options = {"enabled": True, "backend": "transformers", "dtype": "float32", "max_new_tokens": 8}
    return PrepareDataConfig(
        inputs=inputs,
        output_dir=tmp_path / "out",
        tokenizer=model_dir,
        regenerate={**options, **regen},
    )


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class ScriptedBackend:
    """Answers "reply to N" where N is the prompt length: each reply depends on all earlier turns."""

    name = "scripted"

    def __init__(self, tokenizer, fail_if_longer_than=10**9):
        self.tokenizer = tokenizer
        self.stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.fail_if_longer_than = fail_if_longer_than
        self.batches: list[list[list[int]]] = []

    def generate(self, prompts, max_new_tokens, seeds):
        self.batches.append(prompts)
        if any(len(p) > self.fail_if_longer_than for p in prompts):
            raise RuntimeError("scripted failure")
        replies = [self.tokenizer.encode(f"reply to {len(p)}") + [self.stop] for p in prompts]
        return [
            cut_at_stop(r, (self.stop,), n) for r, n in zip(replies, max_new_tokens, strict=True)
        ]

    def close(self):
        pass


def expected_scripted(tokenizer, messages):
    """The regenerated conversation, computed independently of the pipeline."""
    messages = [dict(m) for m in messages]
    if messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": ""})
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant":
            prompt = tokenizer.apply_chat_template(
                messages[:i], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            msg["content"] = f"reply to {len(prompt)}"
    return messages


def test_turns_in_order_batched_and_counted(tmp_path, model_dir, tokenizer, monkeypatch):
    backend = ScriptedBackend(tokenizer, fail_if_longer_than=60)
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    records = CONVERSATIONS + [
        {"id": "bad", "messages": [{"role": "robot", "content": "x"}]},
        {"id": "long", "messages": chat("word " * 80, "old")},  # prompt > max_model_len
        {"id": "system-only", "messages": [{"role": "system", "content": "nothing to answer"}]},
    ]
    cfg = make_cfg(tmp_path, model_dir, records, batch_size=3, max_model_len=70)
    cfg.on_bad_record = "skip"
    report = prepare_data(cfg)
    regen = report.regeneration
    assert (regen.done, regen.num_records) == (5, 8)
    assert regen.skipped == {"unknown_role": 1, "no_assistant_turn": 1}
    assert regen.failed == {"prompt_too_long": 1}
    assert (
        regen.done + sum(regen.skipped.values()) + sum(regen.failed.values()) == regen.num_records
    )
    assert report.num_examples + report.num_skipped + report.num_failed == report.num_records == 8
    # Valid conversations are batched 3 at a time; turn i of a batch is one generate call
    # ("long" fails before generating, "system-only" has nothing to generate).
    assert [len(b) for b in backend.batches] == [3, 1, 2, 2, 1]
    out = {r["id"]: r for r in read_jsonl(regen.path)}
    sharegpt_id = f"{cfg.inputs[0]}:2"
    assert sorted(out) == sorted(["two-turns", sharegpt_id, "sys", "trailing-user", "three-turns"])
    originals = {r.get("id", sharegpt_id): r for r in records}
    for record_id, record in out.items():
        source = originals[record_id]
        messages = source.get("messages") or chat("Tell me a story", "old story")
        assert record["messages"] == expected_scripted(tokenizer, messages)
    assert out["trailing-user"]["messages"][-1]["role"] == "assistant"  # answered
    ds = load_prepared(cfg.output_dir)
    assert len(ds) == 5
    meta = read_meta(cfg.output_dir)
    assert meta["regeneration"]["path"] == str(regen.path.resolve())
    assert meta["regeneration"]["settings"]["max_model_len"] == 70
    assert 0 <= meta["regeneration"]["seconds"] < 60  # the generation time a recipe plans by
    assert meta["counts"]["failed"] == {"prompt_too_long": 1}


HARMONY_TOKENS = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>"]


class HarmonyBackend:
    """Answers like gpt-oss: analysis, then the final message, then <|return|>."""

    name = "scripted-harmony"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.replies: list[list[int]] = []

    def generate(self, prompts, max_new_tokens, seeds):
        stop = self.tokenizer.convert_tokens_to_ids("<|return|>")
        for p in prompts:
            text = (
                f"<|channel|>analysis<|message|>think {len(p)}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>reply to {len(p)}"
            )
            self.replies.append(self.tokenizer.encode(text) + [stop])
        return self.replies[-len(prompts) :]

    def close(self):
        pass


def test_harmony_answers_train_as_generated(tmp_path, monkeypatch):
    # gpt-oss refuses channel tags in the content: the generated turn becomes thinking +
    # content, the next prompt holds it as the template writes history (analysis dropped), and
    # each row supervises exactly the tokens the target generated, <|return|> included.
    template = Path(__file__).parents[1] / "assets" / "chat_templates" / "gpt_oss.jinja"
    tok_dir = tmp_path / "harmony-tok"
    tokenizer = build_tokenizer(tok_dir, chat_template=template.read_text())
    tokenizer.add_tokens(HARMONY_TOKENS, special_tokens=True)
    tokenizer.save_pretrained(str(tok_dir))
    backend = HarmonyBackend(tokenizer)
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    records = [{"id": "h", "messages": chat("one", "old 1", "two", "old 2")}]
    report = prepare_data(make_cfg(tmp_path, tok_dir, records, max_new_tokens=64))
    assert report.regeneration.done == 1 and report.num_examples == 1

    def prompt_len(messages):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return len(ids)

    def answer(n):
        return {"role": "assistant", "content": f"reply to {n}", "thinking": f"think {n}"}

    n1 = prompt_len(chat("one"))
    n2 = prompt_len([*chat("one"), answer(n1), {"role": "user", "content": "two"}])
    expected = [*chat("one"), answer(n1), {"role": "user", "content": "two"}, answer(n2)]
    for m in expected[1::2]:
        m["reasoning_content"] = m["thinking"]
    assert read_jsonl(report.regeneration.path)[0]["messages"] == expected
    rows = load_prepared(make_cfg(tmp_path, tok_dir).output_dir)
    assert len(rows) == 2  # one per answer: the template rewrites earlier turns
    for row, reply, n in zip(rows, backend.replies, (n1, n2), strict=True):
        assert len(row["input_ids"]) == n + len(reply)
        assert row["input_ids"][n:] == reply  # the prompt, then what the target generated
        assert row["loss_mask"] == [0] * n + [1] * len(reply)


def test_generation_error_fails_only_its_record(tmp_path, model_dir, tokenizer, monkeypatch):
    backend = ScriptedBackend(tokenizer, fail_if_longer_than=40)
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    report = prepare_data(make_cfg(tmp_path, model_dir, batch_size=5))
    regen = report.regeneration
    assert regen.failed == {"generation_error:RuntimeError": 3}
    assert regen.done == 2 and regen.num_records == 5


def _greedy(model, tokenizer, messages, max_new_tokens):
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops,
        pad_token_id=tokenizer.pad_token_id,
    )[0, len(ids) :].tolist()
    if out and out[-1] in stops:
        out = out[:-1]
    return tokenizer.decode(out, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_transformers_backend_matches_greedy_generate(tmp_path, model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(tmp_path, model_dir, batch_size=2)  # batches of 2: left padding in play
    report = prepare_data(cfg)
    assert report.regeneration.done == 5 and report.num_examples == 5
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    records = read_jsonl(report.regeneration.path)
    contents = set()
    for record in records:
        messages = record["messages"]
        for i, msg in enumerate(messages):
            if msg["role"] == "assistant":
                assert msg["content"] == _greedy(model, tokenizer, messages[:i], 8)
                assert not msg["content"].startswith("old")
                contents.add(msg["content"])
    assert len(contents) > 1  # outputs depend on the prompt
    # The prepared rows are the regenerated conversations.
    ds = load_prepared(cfg.output_dir)
    assert ds["id"] == [r["id"] for r in records]
    first = tokenizer.apply_chat_template(records[0]["messages"], tokenize=True, return_dict=False)
    assert ds[0]["input_ids"] == first


def test_resume_skips_done_ids(tmp_path, model_dir, tokenizer, monkeypatch):
    cfg = make_cfg(tmp_path, model_dir, batch_size=2)
    cfg.limit = 3
    first = prepare_data(cfg).regeneration
    assert first.done == 3 and first.resumed == 0
    first_ids = [r["id"] for r in read_jsonl(first.path)]
    # A crash mid-write leaves a torn last line: it is dropped and that record redone.
    with first.path.open("a") as f:
        f.write('{"id": "three-turns", "messages": [{"ro')
    cfg.limit, cfg.overwrite = None, True
    backend = ScriptedBackend(tokenizer)
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    report = prepare_data(cfg)
    second = report.regeneration
    assert (second.done, second.resumed, second.num_records) == (5, 3, 5)
    # Only the two records not done before: trailing-user (2 turns), three-turns (3 turns).
    assert sum(len(b) for b in backend.batches) == 2 + 3
    records = read_jsonl(second.path)
    assert [r["id"] for r in records[:3]] == first_ids
    assert len(records) == len({r["id"] for r in records}) == 5
    assert report.num_examples + report.num_skipped + report.num_failed == report.num_records == 5
    # Other settings cannot reuse the file.
    cfg.regenerate.max_new_tokens = 9
    with pytest.raises(DataError, match="other regeneration settings \\(max_new_tokens: 8 -> 9\\)"):
        prepare_data(cfg)
    cfg.regenerate.resume = False
    assert prepare_data(cfg).regeneration.resumed == 0


@pytest.mark.vllm
def test_vllm_backend_matches_transformers(tmp_path, model_dir):
    """Same greedy text from vLLM as from transformers (fp32, explicit dtype).

    The tiny target's lm_head is scaled (see build_tiny_llama) so that no greedy step is a
    near-tie that float differences between the two backends' kernels could flip.
    """
    # conftest.py sets the vLLM environment (in-process engine, offline, cache directory)
    # and skips vllm-marked tests when vLLM is not installed; a broken install fails here.
    cfg = make_cfg(tmp_path, model_dir, max_new_tokens=16, kv_cache_memory_bytes=64 * 2**20)
    # an answer of reserved ids re-renders as their long "<|reserved_N|>" texts: room for it
    cfg.max_length = 1024
    reports = {}
    for backend in ("transformers", "vllm"):
        cfg.output_dir = tmp_path / backend / "out"
        cfg.regenerate.backend = backend
        reports[backend] = prepare_data(cfg)
    jsonl = {
        b: [(r["id"], r["messages"]) for r in read_jsonl(rep.regeneration.path)]
        for b, rep in reports.items()
    }
    assert jsonl["vllm"] == jsonl["transformers"]
    assert len(jsonl["vllm"]) == 5
    assert read_meta(tmp_path / "vllm" / "out")["regeneration"]["backend"] == "vllm"


@pytest.mark.vllm
@pytest.mark.slow
def test_data_parallel_vllm_engines_match_transformers(tmp_path, model_dir):
    """Two vLLM engines, each in its own process (one per GPU on a GPU machine), split the
    prompts and return them in order: the same greedy text as transformers. A shard
    returned out of order or a prompt lost between engines fails it."""
    cfg = make_cfg(tmp_path, model_dir, max_new_tokens=16, kv_cache_memory_bytes=64 * 2**20)
    # an answer of reserved ids re-renders as their long "<|reserved_N|>" texts: room for it
    cfg.max_length = 1024
    cfg.output_dir = tmp_path / "hf" / "out"
    expected = [r["messages"] for r in read_jsonl(prepare_data(cfg).regeneration.path)]
    cfg.output_dir = tmp_path / "dp" / "out"
    cfg.regenerate.backend = "vllm"
    cfg.regenerate.data_parallel_size = 2
    cfg.regenerate.batch_size = 5  # one batch of 5 prompts: shards of 2 and 3
    report = prepare_data(cfg)
    assert [r["messages"] for r in read_jsonl(report.regeneration.path)] == expected


def test_parallel_regeneration_needs_vllm(tmp_path, model_dir):
    cfg = make_cfg(tmp_path, model_dir, data_parallel_size=2)
    with pytest.raises(ValueError, match="data_parallel_size / tensor_parallel_size need the vllm"):
        prepare_data(cfg)


def test_a_synthesized_follow_up_record_gets_both_answers(
    tmp_path, model_dir, tokenizer, monkeypatch
):
    # synthesize.follow_ups writes [user, assistant "", user]: the empty turn is answered
    # first, then the follow-up with that answer in its prompt.
    backend = ScriptedBackend(tokenizer)
    monkeypatch.setattr(prepare_module, "create_backend", lambda *a, **k: backend)
    messages = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Can you make your answer shorter?"},
    ]
    cfg = make_cfg(tmp_path, model_dir, [{"id": "synth-000000", "messages": messages}])
    regen = prepare_data(cfg).regeneration
    (out,) = read_jsonl(regen.path)
    assert out["messages"] == expected_scripted(tokenizer, messages)
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [len(b) for b in backend.batches] == [1, 1]
