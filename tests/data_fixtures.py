"""Helpers for the data tests: a tiny byte-level BPE tokenizer, chat templates, a tiny Llama.

Everything is built locally (no hub access) and goes through save_pretrained/from_pretrained,
the code path real runs take.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|pad|>",
    "<|mask|>",
]

# Llama-3 style: bos from the template, headers, content trimmed, <|eot_id|> ends every turn.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# ChatML (Qwen2 style) without a default system message.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML with a default system message injected when the conversation has none (Qwen2.5).
CHATML_DEFAULT_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}" + CHATML_TEMPLATE
)
# Every assistant turn carries an empty think block that the model itself generates after
# "<|im_start|>assistant\n": it belongs to the assistant span.
CHATML_THINK_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n<think>\n\n"
    "</think>\n\n{{ m['content'] }}<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3 with thinking disabled: the generation prompt already holds the empty think block, so
# the assistant span is the content and <|im_end|> only.
CHATML_THINK_IN_PROMPT_TEMPLATE = CHATML_THINK_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}",
)
# Qwen3's real behaviour: the think block is rendered only for turns after the last user
# message, so an earlier turn renders differently once later turns exist (not prefix-consistent).
QWEN3_HISTORY_TEMPLATE = (
    "{% set ns = namespace(last_user=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if loop.index0 > ns.last_user %}<think>\n\n</think>\n\n{% endif %}{{ m['content'] }}"
    "<|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML with {% generation %} blocks around what the assistant generates. (transformers
# renders with trim_blocks, which eats a newline right after a block tag, hence {{ '\\n' }}.)
GENERATION_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A template that drops assistant messages entirely: it cannot mark them.
NO_ASSISTANT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] != 'assistant' %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORDS = (
    "the a an of to in is was for on that with as it by at from this be are or have not but "
    "what all were when we there can your which their said if do will each about how up out "
    "them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life "
    "enough took sometimes four head above kind began almost live page got earth need far hand "
    "high year mother light parts country father let night following picture being study "
    "second eyes soon times story boys since white days ever paper hard near sentence better "
    "best across during today others however sure means knew its try told young miles sun "
    "ways thing whole hear example heard several change answer room sea against top turned "
    "learn point city play toward five using himself usually hello assistant user system "
    "helpful think quick brown fox jumps lazy dog python code reverse sort numbers"
).split()


def corpus(num_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 14))
        words[0] = words[0].capitalize()
        lines.append(
            " ".join(words) + rng.choice([".", "?", "!", ",", ":"]) + f" {rng.randint(0, 999)}\n"
        )
    return lines


def build_tokenizer(
    out_dir: Path,
    chat_template: str = CHATML_TEMPLATE,
    vocab_size: int = 500,
    reserved_ids: int = 32_512,
) -> Any:
    """Train a byte-level BPE, wrap it as a fast HF tokenizer, save and load it back.

    ``reserved_ids`` unused ids sit below the learned pieces (eagle_train/demo/tokenizer.py):
    by default the learned pieces take ids above 32,767, as a real tokenizer's common tokens
    do, so an id kept in 16 bits wraps here too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from eagle_train.demo.tokenizer import reserve_ids

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    if reserved_ids:
        tok = reserve_ids(tok, reserved_ids, len(SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
        mask_token="<|mask|>",
        additional_special_tokens=SPECIAL_TOKENS[2:7],
    )
    wrapped.chat_template = chat_template
    wrapped.save_pretrained(str(out_dir))
    return AutoTokenizer.from_pretrained(str(out_dir))


def build_tiny_llama(out_dir: Path, tokenizer: Any, seed: int = 0, head_scale: float = 30.0) -> Any:
    """A random-init fp32 Llama (hidden 64, 2 layers) saved with its tokenizer beside it.

    ``head_scale`` multiplies lm_head: random init gives near-uniform logits whose top-2 gaps
    are small enough for float rounding (padding in a batch, another backend's kernels) to
    flip a greedy choice; a scaled head separates them so greedy outputs compare exactly.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def chat(*turns: str, system: str | None = None) -> list[dict[str, str]]:
    """Messages alternating user/assistant from ``turns`` (optionally after a system message)."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    roles = ("user", "assistant")
    messages += [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]
    return messages
