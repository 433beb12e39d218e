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

Templates that rewrite earlier turns once later ones exist (Qwen3 drops ``<think>`` from past
assistant turns) do not render prefix-consistently: the full rendering does not start with
``S_i``. Then each assistant turn becomes its own training row, ``S_i`` with the span
``[len(P_i), len(S_i))``: the conversation up to that turn exactly as the template renders it
when the target answers that turn at serving time (the peers' per-turn samples). gpt-oss
(harmony) is such a template: earlier final messages end in ``<|end|>`` and the last in
``<|return|>``, and analysis (``thinking``) is dropped from earlier turns.

A template whose prompt changes once the answer exists (``S_i`` does not start with ``P_i``:
Mistral-Nemo writes the system message into the last user turn only; harmony keeps a tool
call's analysis in the prompt until a final message follows it) gives the row ``P_i`` + the
turn as the template writes it after the generation prompt. The turn is located in a rendering
with markers in place of the message's content and reasoning: it starts after the last
occurrence of the generation prompt (``P_i`` minus ``render(messages[:i])``, e.g.
``<|start|>assistant``) before the first marker, so what the template writes there (harmony's
``<|channel|>analysis<|message|>...`` and ``<|channel|>final<|message|>``) is supervised; a
template without a generation prompt (Mistral), or whose turns do not repeat it, supervises
from the content on. Either way the row is exactly what the target is asked and generates at
serving time.

``template_kwargs`` (``chat_template_kwargs``, e.g. ``enable_thinking``) reach every rendering,
so a ``<think></think>`` block the template writes into the generation prompt is prompt, not
supervised, and one the model generates is inside the span.

Either way each row's text is tokenized once with offsets, and a token is masked when its
characters lie inside a span. A token that straddles a span boundary means the tokenizer merges
prompt and response text, so no per-token mask is right: that is a ``DataError``
(reason ``token_straddles_span``), never a guess.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import jinja2

from eagle_train.chat_template import render_chat
from eagle_train.data.errors import DataError
from eagle_train.data.messages import REASONING_KEYS, Message

MARKER = "\x00CONTENT\x00"
# What a template raises on a conversation it cannot render: a DataError naming the record.
TEMPLATE_FAILURES = (jinja2.TemplateError, TypeError, KeyError, AttributeError, ArithmeticError)


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

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        source: str = "chat template",
    ) -> None:
        """``source`` names the template in errors (its file, or the tokenizer's path)."""
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
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.source = source
        self.uses_generation_blocks = bool(GENERATION_TAG.search(template))
        self.template_sha256 = hashlib.sha256(template.encode()).hexdigest()

    def render(
        self, messages: list[Message], *, add_generation_prompt: bool = False, where: str = ""
    ) -> str:
        return self._render(messages, add_generation_prompt, where, None)

    def _render(
        self,
        messages: list[Message],
        add_generation_prompt: bool,
        where: str,
        spans: list[Span] | None,
    ) -> str:
        """As ``apply_chat_template`` renders (its variables: the special tokens, then the
        template kwargs), within the step budget of ``eagle_train.chat_template``."""
        variables = {**self.tokenizer.special_tokens_map, **self.template_kwargs}
        try:
            return render_chat(
                self.template,
                list(messages),
                variables,
                add_generation_prompt=add_generation_prompt,
                source=f"{self.source} ({where})" if where else self.source,
                spans=spans,
            )
        except TEMPLATE_FAILURES as exc:
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

    def training_rows(self, messages: list[Message], where: str) -> list[tuple[str, list[Span]]]:
        """Texts to train on, each with the character spans of its assistant turns: the whole
        conversation as one row, or one row per assistant turn (see the module docstring)."""
        if self.uses_generation_blocks:
            rows = [self._generation_spans(messages, where)]
        else:
            rows = self._prefix_rows(messages, where)
        if not any(spans for _, spans in rows) and any(m["role"] == "assistant" for m in messages):
            raise DataError(
                f"{where}: chat template does not mark any assistant span",
                reason="no_assistant_spans",
            )
        return rows

    def _generation_spans(self, messages: list[Message], where: str) -> tuple[str, list[Span]]:
        spans: list[Span] = []
        rendered = self._render(messages, False, where, spans)
        return rendered, [(s, e) for s, e in spans if e > s]

    def _prefix_rows(self, messages: list[Message], where: str) -> list[tuple[str, list[Span]]]:
        full = self.render(messages, where=where)
        turns: list[tuple[str, Span, bool]] = []  # (row text, span, row is S_i) per turn
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            if i == 0:
                raise DataError(
                    f"{where}: the conversation starts with an assistant turn (no prompt for it)",
                    reason="assistant_first",
                )
            prompt, generated, exact = self.served_turn(messages, i, where)
            text = prompt + generated
            end = len(text.rstrip())
            if end <= len(prompt):
                raise DataError(
                    f"{where}: chat template renders nothing for assistant message {i + 1}",
                    reason="no_assistant_spans",
                )
            turns.append((text, (len(prompt), end), exact))
        if all(exact and full.startswith(text) for text, _, exact in turns):
            return [(full, [span for _, span, _ in turns])]
        # The template rewrites earlier turns: one row per turn, as served.
        return [(text, [span]) for text, span, _ in turns]

    def served_turn(self, messages: list[Message], i: int, where: str) -> tuple[str, str, bool]:
        """Assistant message ``i`` at serving time: the prompt ``P_i``, the text the target
        generates after it (as the template writes the turn), and whether ``S_i`` starts with
        ``P_i`` (see the module docstring)."""
        prompt = self.render(messages[:i], add_generation_prompt=True, where=where)
        turn = self.render(messages[: i + 1], where=where)
        exact = turn.startswith(prompt)
        generated = turn[len(prompt) :] if exact else self._generated_text(messages, i, where)
        return prompt, generated, exact

    def _generated_text(self, messages: list[Message], i: int, where: str) -> str:
        """Assistant message ``i`` as the template writes it after the generation prompt, for
        templates whose prompt changes once the answer exists (see the module docstring)."""
        before = self.render(messages[:i], where=where)
        prompt = self.render(messages[:i], add_generation_prompt=True, where=where)
        opener = prompt[len(before) :] if prompt.startswith(before) else ""
        turn = self.render(messages[: i + 1], where=where)
        message = messages[i]
        data = [k for k in ("content", *REASONING_KEYS) if isinstance(message.get(k), str)]
        data = [k for k in data if message[k]]
        if opener and data:
            # The turn opens with the generation prompt, before the message's first data.
            opening = self._opening(messages, i, data, turn, where)
            start = opening.rfind(opener)
            if start >= 0:
                return turn[start + len(opener) :]
        # No generation prompt (Mistral), or turns that do not repeat it: from the content on.
        # Reasoning written before the content is then not generated (e.g. thinking disabled).
        return turn[len(self._opening(messages, i, ["content"], turn, where)) :]

    def _opening(
        self, messages: list[Message], i: int, keys: list[str], turn: str, where: str
    ) -> str:
        """``turn`` up to the first of message ``i``'s ``keys``, found by rendering markers there."""
        probe = [*messages[:i], {**messages[i], **dict.fromkeys(keys, MARKER)}]
        opening, found, _ = self.render(probe, where=where).partition(MARKER)
        if not found or not turn.startswith(opening):
            raise DataError(
                f"{where}: assistant message {i + 1}: the chat template's generation prompt "
                "is not the start of the rendered turn, so what the target generates cannot "
                "be marked",
                reason="template_not_prefix_consistent",
            )
        return opening

    def tokenize_rows(
        self, messages: list[Message], max_length: int, where: str
    ) -> list[TokenizedChat]:
        """Render, tokenize each row once, mask assistant tokens, truncate to ``max_length``."""
        out = []
        for text, spans in self.training_rows(messages, where):
            enc = self.tokenizer(
                text, add_special_tokens=self._add_special_tokens(text), return_offsets_mapping=True
            )
            ids = list(enc["input_ids"])
            mask = mask_from_offsets(enc["offset_mapping"][:max_length], spans, where)
            out.append(
                TokenizedChat(
                    input_ids=ids[:max_length], loss_mask=mask, truncated=len(ids) > max_length
                )
            )
        return out

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
