"""Chat rendering and the assistant-only loss mask.

The mask marks exactly the tokens the target generates after a generation prompt: each
assistant turn's content plus its end-of-turn token (``<|im_end|>``, ``<|eot_id|>``...).

Two ways to find those character spans in the rendered text:
- the template has ``{% generation %}`` blocks: the spans are what those blocks enclose (as
  reported by transformers' template renderer, the same one ``apply_chat_template(...,
  return_assistant_tokens_mask=True)`` uses);
- otherwise, prefix differences: for assistant message i, ``P_i = render(messages[:i],
  add_generation_prompt=True)`` and ``S_i = render(messages[:i+1])``; the full rendering must
  start with ``S_i`` and ``S_i`` with ``P_i``, and the span is ``[len(P_i), len(S_i))`` with
  trailing whitespace stripped.

Either way the full text is tokenized once with offsets, and a token is masked when its
characters lie inside a span. A token that straddles a span boundary means the tokenizer merges
prompt and response text, so no per-token mask is right: that is a ``DataError``
(reason ``token_straddles_span``), never a guess.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, cast

import jinja2

from eagle_train.data.errors import DataError
from eagle_train.data.records import Message

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
Span = tuple[int, int]


@dataclass(frozen=True)
class TokenizedChat:
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool

    @property
    def num_assistant_tokens(self) -> int:
        return sum(self.loss_mask)


class ChatRenderer:
    """Renders conversations with one chat template and tokenizes them with a loss mask."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(
                "a fast tokenizer is needed (offsets map tokens to characters)", reason="config"
            )
        template = chat_template if chat_template is not None else tokenizer.chat_template
        if isinstance(template, dict):  # tokenizers that ship several named templates
            template = template.get("default")
        if not template:
            raise DataError(
                "the tokenizer has no chat template; set chat_template to a .jinja file",
                reason="config",
            )
        self.tokenizer = tokenizer
        self.template: str = template
        self.uses_generation_blocks = bool(GENERATION_TAG.search(template))
        self.template_sha256 = hashlib.sha256(template.encode()).hexdigest()

    def render(
        self, messages: list[Message], *, add_generation_prompt: bool = False, where: str = ""
    ) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.TemplateError as exc:
            raise DataError(
                f"{where}: chat template failed: {exc}", reason="template_error"
            ) from None

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text, as a prompt for generation (same rule as training data)."""
        return self.tokenizer(text, add_special_tokens=self._add_special_tokens(text))["input_ids"]

    def _add_special_tokens(self, text: str) -> bool:
        # Templates that emit bos themselves must not get a second one from the tokenizer.
        bos = self.tokenizer.bos_token
        return not (bos and text.startswith(bos))

    def assistant_spans(self, messages: list[Message], where: str) -> tuple[str, list[Span]]:
        """The full rendering and the character spans of its assistant turns."""
        if self.uses_generation_blocks:
            text, spans = self._generation_spans(messages, where)
        else:
            text, spans = self._prefix_spans(messages, where)
        if not spans and any(m["role"] == "assistant" for m in messages):
            raise DataError(
                f"{where}: chat template does not mark any assistant span",
                reason="no_assistant_spans",
            )
        return text, spans

    def _generation_spans(self, messages: list[Message], where: str) -> tuple[str, list[Span]]:
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            rendered, indices = cast(
                tuple[list[str], list[list[Span]]],
                render_jinja_template(
                    conversations=[messages],
                    chat_template=self.template,
                    return_assistant_tokens_mask=True,
                    **self.tokenizer.special_tokens_map,
                ),
            )
        except jinja2.TemplateError as exc:
            raise DataError(
                f"{where}: chat template failed: {exc}", reason="template_error"
            ) from None
        return rendered[0], [(s, e) for s, e in indices[0] if e > s]

    def _prefix_spans(self, messages: list[Message], where: str) -> tuple[str, list[Span]]:
        full = self.render(messages, where=where)
        spans = []
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            if i == 0:
                raise DataError(
                    f"{where}: the conversation starts with an assistant turn (no prompt for it)",
                    reason="assistant_first",
                )
            prompt = self.render(messages[:i], add_generation_prompt=True, where=where)
            turn = self.render(messages[: i + 1], where=where)
            if not (full.startswith(turn) and turn.startswith(prompt)):
                raise DataError(
                    "chat template does not render this conversation prefix-consistently, so "
                    f"assistant spans cannot be marked: {where} (assistant message {i + 1})",
                    reason="template_not_prefix_consistent",
                )
            end = len(turn.rstrip())
            if end <= len(prompt):
                raise DataError(
                    f"{where}: chat template renders nothing for assistant message {i + 1}",
                    reason="no_assistant_spans",
                )
            spans.append((len(prompt), end))
        return full, spans

    def tokenize(self, messages: list[Message], max_length: int, where: str) -> TokenizedChat:
        """Render once, tokenize once, mask assistant tokens, truncate to ``max_length``."""
        text, spans = self.assistant_spans(messages, where)
        enc = self.tokenizer(
            text, add_special_tokens=self._add_special_tokens(text), return_offsets_mapping=True
        )
        ids = list(enc["input_ids"])
        offsets = enc["offset_mapping"][:max_length]
        mask = mask_from_offsets(offsets, spans, where)
        return TokenizedChat(
            input_ids=ids[:max_length], loss_mask=mask, truncated=len(ids) > max_length
        )

    def end_of_turn_text(self) -> str:
        """What the template writes after an assistant's content (e.g. ``<|im_end|>``), or ``""``."""
        probe = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "\x00MARK\x00"},
        ]
        try:
            prompt = self.render(probe[:1], add_generation_prompt=True)
            turn = self.render(probe)
        except DataError:
            return ""
        tail = turn[len(prompt) :] if turn.startswith(prompt) else ""
        _, found, after = tail.partition("\x00MARK\x00")
        return after.strip() if found else ""


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[Span], where: str) -> list[int]:
    """1 for tokens whose characters lie inside a span, 0 for tokens outside every span.

    ``spans`` are sorted and disjoint. Tokens without characters (bos added by the tokenizer)
    are 0. A token partly inside a span raises ``DataError`` (see the module docstring).
    """
    mask = []
    k = 0
    for start, end in offsets:
        if end <= start:
            mask.append(0)
            continue
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if k == len(spans) or end <= spans[k][0]:
            mask.append(0)
        elif spans[k][0] <= start and end <= spans[k][1]:
            mask.append(1)
        else:
            raise DataError(
                f"{where}: token at characters {start}..{end} straddles the assistant span "
                f"{spans[k][0]}..{spans[k][1]} (the tokenizer merges prompt and response text)",
                reason="token_straddles_span",
            )
    return mask
