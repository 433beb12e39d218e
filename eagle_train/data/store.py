"""The prepared dataset on disk: written atomically, read back with its metadata checked.

Layout of a prepared directory (``datasets.load_from_disk`` reads it directly):
- the ``save_to_disk`` files, columns ``input_ids`` (int32 list), ``loss_mask`` (int8 list), ``id``;
- ``meta.json``: how it was made (tokenizer, template hash, max_length, counts, sources, ...);
- ``token_counts.safetensors``: the supervised (assistant) token counts over the whole target
  vocabulary (``counts``, int64 [V]); the trainer builds the draft vocabulary from them.
  Datasets from before it was added may instead hold ``vocab.safetensors`` (a mapping of a
  fixed size whose ``counts`` are the same vector), still read for its counts.

Everything is written to a hidden sibling directory that is renamed into place at the end, so a
run that fails midway leaves no half-written output behind.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
from datasets.arrow_writer import ArrowWriter

from eagle_train.data.config import PrepareDataConfig
from eagle_train.data.errors import DataError
from eagle_train.fsutil import (
    UnsafePathError,
    check_no_overlap,
    check_output_path,
    confined,
    hold_lock,
    remove_empty_dirs,
    remove_stale_temporaries,
    topmost_missing,
)
from eagle_train.ownership import check_owned, check_owned_file, owned_directory

FORMAT = "eagle-train-prepared"
FORMAT_VERSION = 1
META_FILE = "meta.json"
FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("int8")),
        "id": datasets.Value("string"),
    }
)
_SCRATCH = ".scratch"
COMMAND, WHAT = "prepare-data", "a prepared dataset"


class PreparedDataError(DataError):
    """A prepared directory that is missing, incomplete or from another format version."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="prepared_data")


def regenerated_path(cfg: PrepareDataConfig) -> Path:
    """Where regenerated conversations go: configured, else beside ``output_dir``."""
    out = cfg.output_dir
    return cfg.regenerate.output_path or out.with_name(out.name + ".regenerated.jsonl")


def synthesized_path(cfg: PrepareDataConfig) -> Path:
    """Where synthesized prompts go: configured, else beside ``output_dir``."""
    out = cfg.output_dir
    return cfg.synthesize.output_path or out.with_name(out.name + ".prompts.jsonl")


def check_outputs(cfg: PrepareDataConfig) -> None:
    """Before any work: the outputs are named, apart from every input (an output that
    holds, is or lies inside an input would destroy it), and replaceable; temporaries a
    killed run left beside ``output_dir`` are removed."""
    files = [*(("input", p) for p in cfg.inputs), ("chat_template", cfg.chat_template)]
    models = [("tokenizer", cfg.tokenizer), ("regenerate.model", cfg.regenerate.model)]
    try:
        out = check_output_path(cfg.output_dir, "output_dir")
        check_no_overlap(out, "output_dir", files + models)
        if cfg.regenerate.enabled:
            jsonl = regenerated_path(cfg)
            check_no_overlap(jsonl, "regenerate.output_path", [*files, ("output_dir", out)])
        if cfg.synthesize.enabled:
            prompts = synthesized_path(cfg)
            check_no_overlap(prompts, "synthesize.output_path", [*files, ("output_dir", out)])
            hint = "set overwrite=true"
            check_owned_file(prompts, "synthesize.output_path", cfg.overwrite, COMMAND, hint)
    except UnsafePathError as exc:
        raise DataError(str(exc), reason="config") from None
    with output_lock(cfg.output_dir):
        check_output_dir(cfg.output_dir, cfg.overwrite)


def check_output_dir(path: Path, overwrite: bool) -> None:
    """An existing ``path`` is replaced only with ``overwrite``, and only when it is empty or
    holds nothing but the files an earlier prepare-data recorded writing (``ownership``):
    never a directory of the user's own, a note or a feature cache put inside a dataset."""
    try:
        check_owned(
            path, "output_dir", overwrite, COMMAND, WHAT, "set overwrite=true", legacy_files
        )
    except UnsafePathError as exc:
        raise DataError(str(exc), reason="config") from None


def legacy_files(path: Path) -> set[str] | None:
    """What a dataset prepared before the ownership record holds of its own: the files its
    ``meta.json`` lists, and ``meta.json`` (None: not a prepared dataset)."""
    try:
        meta = read_meta(path)
    except PreparedDataError:
        return None
    files = meta.get("files")
    return {*files, META_FILE} if isinstance(files, dict) else None


@contextmanager
def output_lock(final: Path) -> Iterator[None]:
    """Hold ``final`` against another prepare-data run; the temporaries a killed run left
    beside it are removed (no live writer can own them while the lock is held)."""
    made = topmost_missing(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        with hold_lock(final.parent / f".{final.name}.lock", f"output_dir {final}"):
            remove_stale_temporaries(final)
            yield
    except UnsafePathError as exc:
        raise DataError(str(exc), reason="config") from None
    finally:  # a failed run leaves no parent directory it made
        if not final.exists():
            remove_empty_dirs(final.parent, made)


@contextmanager
def atomic_output_dir(final: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``final`` only if the block completes."""
    with output_lock(final):
        check_output_dir(final, overwrite)
        with owned_directory(final, COMMAND, WHAT, legacy_files) as tmp:
            yield tmp
            shutil.rmtree(tmp / _SCRATCH, ignore_errors=True)


class ExampleWriter:
    """Streams examples to an Arrow file, so memory does not grow with the dataset."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        (out_dir / _SCRATCH).mkdir()
        self._path = out_dir / _SCRATCH / "examples.arrow"
        self._writer = ArrowWriter(features=FEATURES, path=str(self._path))
        self.num_examples = 0

    def write(self, record_id: str, input_ids: list[int], loss_mask: list[int]) -> None:
        self._writer.write({"input_ids": input_ids, "loss_mask": loss_mask, "id": record_id})
        self.num_examples += 1

    def finish(self) -> None:
        """Write the ``save_to_disk`` layout into ``out_dir``."""
        self._writer.finalize()
        self._writer.close()
        dataset = datasets.Dataset.from_file(str(self._path))
        dataset.save_to_disk(str(self.out_dir))


def write_meta(out_dir: Path, meta: dict[str, Any]) -> None:
    """``meta.json``, with the size of every other file: a truncated one is named on load."""
    files = {
        str(p.relative_to(out_dir)): p.stat().st_size
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and _SCRATCH not in p.relative_to(out_dir).parts
    }
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta, "files": files}
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")


def _confined(root: str | Path, name: object, source: Path) -> Path:
    """``root / name`` for a name read from ``source``, refused unless it stays inside
    ``root`` (the rule for checkpoints and caches: no ``..``, no absolute path, no symlink
    leading out), so a crafted meta.json cannot make a command read or describe a file
    elsewhere."""
    try:
        return confined(Path(root), name, source)
    except UnsafePathError as exc:
        raise PreparedDataError(str(exc)) from None


def _check_data_files(path: Path) -> None:
    """The Arrow files ``datasets`` would read (``state.json``'s ``_data_files``) lie inside
    ``path``: one naming an absolute path would train on a file outside the dataset."""
    state = path / "state.json"
    try:
        info = json.loads(state.read_text())
    except FileNotFoundError:
        return  # datasets names what is missing
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PreparedDataError(f"{state}: unreadable ({exc})") from None
    entries = info.get("_data_files") if isinstance(info, dict) else None
    if not isinstance(entries, list):
        raise PreparedDataError(f"{state}: expected '_data_files', a list of Arrow files")
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        _confined(path, name, state)


def read_meta(path: str | Path) -> dict[str, Any]:
    """``meta.json`` of a prepared directory, checked for format and version."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise PreparedDataError(f"{path}: not a prepared dataset (no {META_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise PreparedDataError(f"{meta_path}: malformed JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PreparedDataError(f"{meta_path}: not an {FORMAT} file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PreparedDataError(
            f"{meta_path}: format_version {meta.get('format_version')}, this code reads {FORMAT_VERSION}; "
            "prepare the data again"
        )
    for key in ("tokenizer", "max_length", "counts"):
        if key not in meta:
            raise PreparedDataError(f"{meta_path}: missing key {key!r}")
    return meta


def load_prepared(path: str | Path) -> datasets.Dataset:
    """Load a prepared dataset after checking its metadata, columns, size and vocab file."""
    meta = read_meta(path)
    files = meta.get("files", {})
    if not isinstance(files, dict):
        raise PreparedDataError(f"{Path(path) / META_FILE}: 'files' must map file names to sizes")
    for name, size in files.items():
        file = _confined(path, name, Path(path) / META_FILE)
        found = file.stat().st_size if file.is_file() else None
        if found != size:
            why = "missing" if found is None else f"{found} bytes, meta.json records {size}"
            raise PreparedDataError(f"{file}: {why} (truncated or damaged; prepare it again)")
    _check_data_files(Path(path))
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as exc:  # pyarrow and datasets raise many types for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreparedDataError(f"{path}: unreadable dataset files ({first})") from None
    if not isinstance(dataset, datasets.Dataset):
        raise PreparedDataError(f"{path}: expected a single Dataset, got {type(dataset).__name__}")
    for name, feature in FEATURES.items():
        if dataset.features.get(name) != feature:
            raise PreparedDataError(
                f"{path}: column {name!r} is {dataset.features.get(name)}, expected {feature}"
            )
    # One row per example, except for templates that train one row per assistant turn.
    expected = meta["counts"].get("rows", meta["counts"].get("examples"))
    if expected != dataset.num_rows:
        raise PreparedDataError(f"{path}: {dataset.num_rows} rows but meta.json says {expected}")
    for key in ("token_counts", "vocab"):  # "vocab": a dataset prepared before the counts
        entry = meta.get(key)
        if entry and not isinstance(entry, dict):
            raise PreparedDataError(f"{Path(path) / META_FILE}: {key!r} must be an object")
        if entry and not _confined(path, entry.get("file"), Path(path) / META_FILE).is_file():
            raise PreparedDataError(
                f"{path}: meta.json names {meta[key]['file']}, which is missing"
            )
    return dataset
