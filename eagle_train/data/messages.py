"""One message shape for every input format the peers read and write.

Accepted per turn (``where`` names the record, ``n`` the 1-based turn in errors):
- OpenAI / SpecForge / speculators: ``{"role", "content"}`` with roles system, developer (kept
  as system), user, assistant, tool; ``tool_calls`` on assistant turns (content may then be
  null), ``tool_call_id`` / ``name`` on tool turns;
- ShareGPT: ``{"from", "value"}`` (human/gpt/system/..., observation/function_response as tool);
- content as a string or a list of parts: text parts (``{"type": "text", "text": ...}`` or a
  bare string) are joined; any other part (image, audio, file) is a ``DataError`` with reason
  ``non_text_content``, which ``on_bad_record=skip`` counts;
- reasoning as ``reasoning_content`` (Qwen3, DeepSeek), ``thinking`` (gpt-oss) or
  ``reasoning``: kept under both ``reasoning_content`` and ``thinking``, the two names chat
  templates read, so a template that renders reasoning finds it and one that does not ignores it.

Keys a template does not know are never added: Llama-3 templates test ``'tool_calls' in
message``, so an empty ``tool_calls`` is dropped rather than passed on.
"""

from __future__ import annotations

import json
from typing import Any

from eagle_train.data.errors import DataError

Message = dict[str, Any]

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "tool": "tool",
    "ipython": "tool",
    "observation": "tool",
    "function_response": "tool",
}
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
TEXT_PART_TYPES = ("text", "input_text", "output_text")


def parse_turns(turns: Any, key: str, where: str) -> list[Message]:
    """The messages of one record's ``messages`` / ``conversations`` list."""
    if not isinstance(turns, list):
        raise DataError(f"{where}: '{key}' must be a list", reason="bad_format")
    return [parse_turn(turn, where, n) for n, turn in enumerate(turns, 1)]


def parse_turn(turn: Any, where: str, n: int) -> Message:
    if not isinstance(turn, dict):
        raise DataError(f"{where}: message {n} is not an object", reason="bad_format")
    sharegpt = "role" not in turn and "from" in turn
    speaker = turn.get("from") if sharegpt else turn.get("role")
    role = ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is None:
        key = "from" if sharegpt else "role"
        raise DataError(
            f"{where}: message {n}: unknown {key} {speaker!r} (expected one of "
            f"{', '.join(sorted(set(ROLES)))})",
            reason="unknown_role",
        )
    raw = turn.get("value") if sharegpt else turn.get("content")
    msg: Message = {"role": role}
    tool_calls = turn.get("tool_calls") if role == "assistant" else None
    if tool_calls:
        msg["tool_calls"] = _tool_calls(tool_calls, where, n)
    msg["content"] = "" if raw is None and tool_calls else content_text(raw, where, n)
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(turn.get(key), str):
                msg[key] = turn[key]
    if role == "assistant":
        reasoning = next((turn[k] for k in REASONING_KEYS if turn.get(k) is not None), None)
        if reasoning is not None:
            text = content_text(reasoning, where, n)
            msg["reasoning_content"] = text
            msg["thinking"] = text
    return msg


def content_text(value: Any, where: str, n: int) -> str:
    """A string, or the text parts of a list of parts joined; anything else is an error."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for k, part in enumerate(value, 1):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") in TEXT_PART_TYPES:
                text = part.get("text")
                if not isinstance(text, str):
                    raise DataError(
                        f"{where}: message {n}: content part {k} has no 'text' string",
                        reason="bad_format",
                    )
                texts.append(text)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise DataError(
                    f"{where}: message {n}: content part {k} is {kind!r}, not text (only text "
                    "is trained on; on_bad_record=skip skips such records)",
                    reason="non_text_content",
                )
        return "".join(texts)
    raise DataError(
        f"{where}: message {n}: content must be a string or a list of text parts, got "
        f"{type(value).__name__}",
        reason="non_string_content",
    )


def _tool_calls(calls: Any, where: str, n: int) -> list[dict[str, Any]]:
    """OpenAI ``tool_calls``: each ``{"type": "function", "function": {"name", "arguments"}}``.

    ``arguments`` given as a JSON string is parsed into an object, the shape HF chat templates
    expect (they serialise it with ``tojson``)."""
    if not isinstance(calls, list):
        raise DataError(f"{where}: message {n}: 'tool_calls' must be a list", reason="bad_format")
    out = []
    for k, call in enumerate(calls, 1):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DataError(
                f"{where}: message {n}: tool call {k} needs function.name", reason="bad_format"
            )
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise DataError(
                    f"{where}: message {n}: tool call {k}: arguments are not valid JSON",
                    reason="bad_format",
                ) from None
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": fn["name"], "arguments": args},
        }
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out
