"""The demo tokenizer: a byte-level BPE trained with `tokenizers`, saved as a HF tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD, MASK = "<|bos|>", "<|end|>", "<|pad|>", "<|mask|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, MASK, *ROLE_TOKENS)

# One turn: role token, newline, content, end-of-turn (= eos, so generation stops there).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, reserved_ids: int = 0
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it with bos/eos/pad/mask and the template.

    ``reserved_ids``: that many ids the tokenizer never produces, placed between the byte
    alphabet and the learned pieces (as real tokenizers keep reserved or unused ids), so the
    learned pieces, the tokens most text is made of, take ids from ``263 + reserved_ids`` up:
    with 32,512 of them they sit above 32,767, where a 16-bit id would wrap, as most of a
    real target's do (SmolLM2 49,152 ids, Llama-3 128,256)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if reserved_ids:
        tok = reserve_ids(tok, reserved_ids, len(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        mask_token=MASK,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def reserved_range(count: int, num_special: int = len(SPECIAL_TOKENS)) -> range:
    """The ids ``reserve_ids`` gives its ``count`` reserved pieces."""
    first = num_special + len(pre_tokenizers.ByteLevel.alphabet())
    return range(first, first + count)


def reserve_ids(tok: Tokenizer, count: int, num_special: int) -> Tokenizer:
    """``tok`` (a byte-level BPE trained with ``num_special`` special tokens first) with
    ``count`` unreachable pieces (``<|reserved_K|>``: no merge makes them) inserted before its
    first learned piece; the learned pieces' ids move up by ``count``."""
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    first = reserved_range(count, num_special).start
    moved = {piece: i + count if i >= first else i for piece, i in vocab.items()}
    moved.update({f"<|reserved_{k}|>": first + k for k in range(count)})
    spec["model"]["vocab"] = moved
    return Tokenizer.from_str(json.dumps(spec))


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    tokenizer.save_pretrained(path)
