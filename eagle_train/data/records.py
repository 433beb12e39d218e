"""Conversation records: reading JSONL / parquet / arrow / saved datasets into one shape.

Every record becomes ``Record(id, messages, source, line)`` with OpenAI-style messages
(``messages.py``: roles system/user/assistant/tool, tool calls, reasoning). A record holds its
turns under ``messages`` or ``conversations``, each turn either ``{"role", "content"}`` or
ShareGPT ``{"from", "value"}``; a top-level ``system`` string becomes the system message. ``line`` is the 1-based line of a JSON Lines file, or
the 1-based row of a columnar file; the default ``id`` is ``"<file>:<line>"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_train.data.config import HubDataset
from eagle_train.data.errors import BadRecordPolicy, DataError
from eagle_train.data.messages import Message, parse_turns

JSONL_SUFFIXES = (".jsonl", ".ndjson")
DATASETS_FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json"}


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
    key = next((k for k in ("messages", "conversations") if obj.get(k) is not None), None)
    if key is None:
        raise DataError(
            f"{where}: record has neither 'messages' (OpenAI) nor 'conversations' (ShareGPT)",
            reason="bad_format",
        )
    messages = parse_turns(obj[key], key, where)
    _check_text(messages, where)
    if not messages:
        raise DataError(f"{where}: empty conversation", reason="empty_conversation")
    system = obj.get("system")
    if isinstance(system, str) and system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})  # ShareGPT-style sets
    raw_id = obj.get("id")
    record_id = where if raw_id is None or raw_id == "" else str(raw_id)
    return Record(id=record_id, messages=messages, source=source, line=line)


def _check_text(messages: list[Message], where: str) -> None:
    """Every string of every message is text: a lone surrogate (JSON ``"\\ud800"``) is not,
    and would fail deep in the tokenizer."""
    for n, message in enumerate(messages, 1):
        todo: list[Any] = [message]
        while todo:
            value = todo.pop()
            if isinstance(value, dict):
                todo.extend(value.values())
            elif isinstance(value, list):
                todo.extend(value)
            elif isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise DataError(
                        f"{where}: message {n} holds {value[exc.start]!r} at character "
                        f"{exc.start}, a lone surrogate, not text",
                        reason="bad_encoding",
                    ) from None


def record_byte_limit(max_length: int) -> int:
    """The largest JSON Lines record (bytes) worth parsing for rows of ``max_length`` tokens.
    A token is rarely more than 64 bytes of JSON: about 4 bytes of English text per token,
    at most 12 for an escaped non-BMP character (``\\ud83d\\ude00``), so 64 leaves a 5x
    margin; 64 KiB more covers keys, roles and metadata. A longer record would be cut to
    max_length after tokenizing all of it, which for one 50 MB line took minutes and
    gigabytes: it is refused before it is even parsed."""
    return 64 * max_length + (64 << 10)


def read_records(path: Path) -> Iterator[Record]:
    """Every record of one input, in order; the first malformed one raises its DataError."""
    for line, obj in iter_raw(path):
        if isinstance(obj, DataError):
            raise obj
        yield parse_record(obj, str(path), line)


def iter_raw(path: Path, max_bytes: int | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, object)`` for every record of one input; a malformed line (or a JSON
    Lines record over ``max_bytes``) yields a DataError."""
    if path.is_dir():
        yield from bounded_rows(_readable(_iter_saved_dataset(path), path), str(path), max_bytes)
    elif path.suffix in JSONL_SUFFIXES or (path.suffix == ".json" and _starts_with_object(path)):
        yield from _iter_jsonl(path, max_bytes)
    elif path.suffix in DATASETS_FORMATS:
        rows = _iter_datasets_file(path, DATASETS_FORMATS[path.suffix])
        yield from bounded_rows(_readable(rows, path), str(path), max_bytes)
    else:
        raise DataError(
            f"{path}: unsupported input (expected .jsonl, .json, .parquet, .arrow or a saved dataset directory)",
            reason="unsupported_input",
        )


def _readable(rows: Iterator[tuple[int, Any]], path: Path) -> Iterator[tuple[int, Any]]:
    """``rows``, with a file ``datasets``/pyarrow cannot read (random bytes named .parquet,
    a cut .arrow) as one DataError naming it, not the library's traceback."""
    try:
        yield from rows
    except DataError:
        raise
    except Exception as exc:  # pyarrow and datasets raise many types for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"{path}: not a readable {path.suffix or 'saved dataset'} input ({first[:200]})",
            reason="unsupported_input",
        ) from None


def bounded_rows(
    rows: Iterable[tuple[int, Any]], source: str, max_bytes: int | None
) -> Iterator[tuple[int, Any]]:
    """The byte limit of a JSON Lines record (``record_byte_limit``) for rows of every other
    format (parquet, arrow, a JSON array, a saved or hub dataset): a row whose text is
    longer becomes a DataError naming its row, before anything tokenizes it."""
    for line, obj in rows:
        size = text_bytes(obj, max_bytes) if max_bytes else 0
        if max_bytes and size > max_bytes:
            obj = DataError(
                f"{source}:{line}: record of over {max_bytes} bytes of text, over what a record "
                "of max_length tokens can need (64 per token): split or drop it",
                reason="oversize_record",
            )
        yield line, obj


def text_bytes(obj: Any, limit: int) -> int:
    """About the JSON size of ``obj`` (its strings' lengths and a few bytes per value),
    counted until it passes ``limit``."""
    total, todo = 0, [obj]
    while todo and total <= limit:
        value = todo.pop()
        if isinstance(value, str):
            total += len(value) + 2
        elif isinstance(value, dict):
            todo.extend(value.keys())
            todo.extend(value.values())
        elif isinstance(value, (list, tuple)):
            todo.extend(value)
            total += 2
        else:
            total += 8
    return total


def _starts_with_object(path: Path) -> bool:
    # A .json file that starts with '{' is JSON Lines (read here, with line numbers); one that
    # starts with '[' is a JSON array and goes through `datasets`.
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"{")


def _iter_jsonl(path: Path, max_bytes: int | None = None) -> Iterator[tuple[int, Any]]:
    limit = max_bytes or -1
    with path.open("rb") as f:
        for line_no, raw in enumerate(
            iter(lambda: f.readline(limit + 1 if limit > 0 else -1), b""), 1
        ):
            if limit > 0 and len(raw) > limit:
                size = len(raw) + _skip_line(f)  # never held in memory whole
                yield (
                    line_no,
                    DataError(
                        f"{path}:{line_no}: record of {size} bytes, over the {limit} bytes a "
                        "record of max_length tokens can need (64 per token): split or drop it",
                        reason="oversize_record",
                    ),
                )
                continue
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


def _skip_line(f: Any) -> int:
    """Read past the rest of the current line in bounded chunks; its byte count."""
    skipped = 0
    while chunk := f.readline(1 << 20):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


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


def iter_hub(spec: HubDataset) -> Iterator[tuple[int, Any]]:
    """Rows of a Hugging Face dataset by id (or a local dataset folder / script), 1-based."""
    import datasets

    try:
        rows = datasets.load_dataset(
            spec.name, spec.config, split=spec.split, streaming=spec.streaming
        )
    except Exception as exc:  # datasets raises many types: hub, offline, missing config/split
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"dataset {spec.label}: cannot be loaded ({type(exc).__name__}: {first}); offline, "
            "a hub id must already be in the datasets cache (HF_DATASETS_OFFLINE=1) or be a "
            "local folder",
            reason="missing_input",
        ) from None
    yield from enumerate(rows, 1)


def expand_folders(paths: list[Path | HubDataset]) -> list[Path | HubDataset]:
    """Each folder that is not a saved dataset becomes its data files (.jsonl, .ndjson,
    .json, .parquet, .arrow, in sorted path order, subfolders included)."""
    suffixes = {*JSONL_SUFFIXES, *DATASETS_FORMATS}
    out: list[Path | HubDataset] = []
    for path in paths:
        if not isinstance(path, Path) or not path.is_dir() or _is_saved_dataset(path):
            out.append(path)
            continue
        files = sorted(
            f
            for f in path.rglob("*")
            if f.is_file() and f.suffix in suffixes and not f.name.startswith(".")
        )
        if not files:
            raise DataError(
                f"{path}: a folder with no data files ({', '.join(sorted(suffixes))}) that is "
                "not a saved dataset either",
                reason="missing_input",
            )
        out.extend(files)
    return out


def _is_saved_dataset(path: Path) -> bool:
    """What ``datasets``' ``save_to_disk`` leaves: a Dataset's or a DatasetDict's index."""
    return any((path / name).is_file() for name in ("state.json", "dataset_dict.json"))


class RecordReader:
    """Iterates the valid records of several inputs, applying the bad-record policy.

    Inputs are paths (JSONL, parquet, arrow, saved dataset) or ``HubDataset`` entries.
    ``num_records`` counts every record consumed (valid or bad), so that
    ``num_records == valid records yielded + policy.num_skipped``; ``limit`` caps it.
    """

    def __init__(
        self,
        paths: Iterable[str | Path | HubDataset],
        policy: BadRecordPolicy,
        limit: int | None = None,
        max_record_bytes: int | None = None,
    ) -> None:
        self.paths = expand_folders([p if isinstance(p, HubDataset) else Path(p) for p in paths])
        self.policy = policy
        self.limit = limit
        self.max_record_bytes = max_record_bytes
        self.num_records = 0

    def __iter__(self) -> Iterator[Record]:
        seen: dict[str, str] = {}
        for path in self.paths:
            if isinstance(path, HubDataset):
                source = path.label
                rows = bounded_rows(iter_hub(path), source, self.max_record_bytes)
            else:
                if not path.exists():
                    raise DataError(f"{path}: input not found", reason="missing_input")
                source, rows = str(path), iter_raw(path, self.max_record_bytes)
            for line, obj in rows:
                if self.limit is not None and self.num_records >= self.limit:
                    return
                self.num_records += 1
                record = self._parse(obj, source, line, seen)
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
