"""The prepared dataset on disk: written atomically, read back with its metadata checked.

Layout of a prepared directory (``datasets.load_from_disk`` reads it directly):
- the ``save_to_disk`` files, columns ``input_ids`` (int32 list), ``loss_mask`` (int8 list), ``id``;
- ``meta.json``: how it was made (tokenizer, template hash, max_length, counts, sources, ...);
- ``vocab.safetensors`` (optional): the draft vocabulary mapping (``d2t``, ``t2d``, ``counts``).

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

from eagle_train.data.errors import DataError
from eagle_train.fsutil import atomic_directory

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


class PreparedDataError(DataError):
    """A prepared directory that is missing, incomplete or from another format version."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="prepared_data")


def check_output_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise DataError(f"{path} already exists; set overwrite=true to replace it", reason="config")


@contextmanager
def atomic_output_dir(final: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``final`` only if the block completes."""
    check_output_dir(final, overwrite)
    with atomic_directory(final) as tmp:
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
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")


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
    dataset = datasets.load_from_disk(str(path))
    if not isinstance(dataset, datasets.Dataset):
        raise PreparedDataError(f"{path}: expected a single Dataset, got {type(dataset).__name__}")
    for name, feature in FEATURES.items():
        if dataset.features.get(name) != feature:
            raise PreparedDataError(
                f"{path}: column {name!r} is {dataset.features.get(name)}, expected {feature}"
            )
    expected = meta["counts"].get("examples")
    if expected != dataset.num_rows:
        raise PreparedDataError(f"{path}: {dataset.num_rows} rows but meta.json says {expected}")
    if meta.get("vocab") and not (Path(path) / meta["vocab"]["file"]).is_file():
        raise PreparedDataError(
            f"{path}: meta.json names {meta['vocab']['file']}, which is missing"
        )
    return dataset
