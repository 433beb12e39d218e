"""Conversation records: reading JSONL / parquet / arrow / saved datasets into one shape.

Every record becomes ``Record(id, messages, source, line)`` with OpenAI-style messages
(``{"role": "system"|"user"|"assistant", "content": str}``). Two input shapes are detected per
record: OpenAI ``{"messages": [{"role", "content"}]}`` and ShareGPT
``{"conversations": [{"from", "value"}]}``. ``line`` is the 1-based line of a JSON Lines file, or
the 1-based row of a columnar file; the default ``id`` is ``"<file>:<line>"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_train.data.errors import BadRecordPolicy, DataError

OPENAI_ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DATASETS_FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json"}

Message = dict[str, str]


@dataclass(frozen=True)
class Record:
    """One conversation and where it came from (for error messages and resume)."""

    id: str
    messages: list[Message]
    source: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        """The OpenAI-format JSON object written for this record (readable by ``parse_record``)."""
        return {"id": self.id, "messages": self.messages, "source": self.where}


def parse_record(obj: Any, source: str, line: int) -> Record:
    """Validate one raw record (a parsed JSON object or a dataset row) into a ``Record``."""
    where = f"{source}:{line}"
    if not isinstance(obj, dict):
        raise DataError(
            f"{where}: expected a JSON object, got {type(obj).__name__}", reason="bad_format"
        )
    if obj.get("messages") is not None:
        messages = _parse_openai(obj["messages"], where)
    elif obj.get("conversations") is not None:
        messages = _parse_sharegpt(obj["conversations"], where)
    else:
        raise DataError(
            f"{where}: record has neither 'messages' (OpenAI) nor 'conversations' (ShareGPT)",
            reason="bad_format",
        )
    if not messages:
        raise DataError(f"{where}: empty conversation", reason="empty_conversation")
    raw_id = obj.get("id")
    record_id = where if raw_id is None or raw_id == "" else str(raw_id)
    return Record(id=record_id, messages=messages, source=source, line=line)


def _parse_openai(messages: Any, where: str) -> list[Message]:
    if not isinstance(messages, list):
        raise DataError(f"{where}: 'messages' must be a list", reason="bad_format")
    out = []
    for n, msg in enumerate(messages, 1):
        if not isinstance(msg, dict):
            raise DataError(f"{where}: message {n} is not an object", reason="bad_format")
        role = msg.get("role")
        if role not in OPENAI_ROLES:
            raise DataError(
                f"{where}: message {n}: unknown role {role!r} (expected one of {', '.join(OPENAI_ROLES)})",
                reason="unknown_role",
            )
        out.append({"role": role, "content": _content(msg.get("content"), where, n)})
    return out


def _parse_sharegpt(turns: Any, where: str) -> list[Message]:
    if not isinstance(turns, list):
        raise DataError(f"{where}: 'conversations' must be a list", reason="bad_format")
    out = []
    for n, turn in enumerate(turns, 1):
        if not isinstance(turn, dict):
            raise DataError(f"{where}: turn {n} is not an object", reason="bad_format")
        speaker = turn.get("from")
        role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise DataError(
                f"{where}: turn {n}: unknown role {speaker!r} (expected one of {', '.join(SHAREGPT_ROLES)})",
                reason="unknown_role",
            )
        out.append({"role": role, "content": _content(turn.get("value"), where, n)})
    return out


def _content(value: Any, where: str, n: int) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{where}: message {n}: content must be a string, got {type(value).__name__}",
            reason="non_string_content",
        )
    return value


def iter_raw(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, object)`` for every record of one input; a malformed line yields a DataError."""
    if path.is_dir():
        yield from _iter_saved_dataset(path)
    elif path.suffix in JSONL_SUFFIXES or (path.suffix == ".json" and _starts_with_object(path)):
        yield from _iter_jsonl(path)
    elif path.suffix in DATASETS_FORMATS:
        yield from _iter_datasets_file(path, DATASETS_FORMATS[path.suffix])
    else:
        raise DataError(
            f"{path}: unsupported input (expected .jsonl, .json, .parquet, .arrow or a saved dataset directory)",
            reason="unsupported_input",
        )


def _starts_with_object(path: Path) -> bool:
    # A .json file that starts with '{' is JSON Lines (read here, with line numbers); one that
    # starts with '[' is a JSON array and goes through `datasets`.
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"{")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield line_no, json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield (
                    line_no,
                    DataError(f"{path}:{line_no}: not UTF-8: {exc}", reason="bad_encoding"),
                )
            except json.JSONDecodeError as exc:
                yield (
                    line_no,
                    DataError(
                        f"{path}:{line_no}: malformed JSON: {exc.msg} (column {exc.colno})",
                        reason="malformed_json",
                    ),
                )


def _iter_datasets_file(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    import datasets

    # Streaming reads rows lazily and writes no cache copy of the input.
    rows = datasets.load_dataset(fmt, data_files=str(path), split="train", streaming=True)
    yield from enumerate(rows, 1)


def _iter_saved_dataset(path: Path) -> Iterator[tuple[int, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded and len(loaded) != 1:
            raise DataError(
                f"{path}: saved DatasetDict has splits {list(loaded)}; pass one split's directory",
                reason="unsupported_input",
            )
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    yield from enumerate(loaded, 1)


class RecordReader:
    """Iterates the valid records of several inputs, applying the bad-record policy.

    ``num_records`` counts every record consumed (valid or bad), so that
    ``num_records == valid records yielded + policy.num_skipped``; ``limit`` caps it.
    """

    def __init__(
        self, paths: Iterable[str | Path], policy: BadRecordPolicy, limit: int | None = None
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.policy = policy
        self.limit = limit
        self.num_records = 0

    def __iter__(self) -> Iterator[Record]:
        seen: dict[str, str] = {}
        for path in self.paths:
            if not path.exists():
                raise DataError(f"{path}: input not found", reason="missing_input")
            for line, obj in iter_raw(path):
                if self.limit is not None and self.num_records >= self.limit:
                    return
                self.num_records += 1
                record = self._parse(obj, str(path), line, seen)
                if record is not None:
                    yield record

    def _parse(self, obj: Any, source: str, line: int, seen: dict[str, str]) -> Record | None:
        try:
            if isinstance(obj, DataError):
                raise obj
            record = parse_record(obj, source, line)
            if record.id in seen:
                raise DataError(
                    f"{record.where}: duplicate id {record.id!r} (first at {seen[record.id]})",
                    reason="duplicate_id",
                )
        except DataError as err:
            self.policy.handle(err)
            return None
        seen[record.id] = record.where
        return record
