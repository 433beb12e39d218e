"""Data pipeline: conversations -> (target-regenerated) chats -> tokens + assistant loss masks.

Order of the steps, one module each: ``records`` (read JSONL / parquet / arrow), ``chat``
(render with the chat template, mask assistant tokens), ``regenerate`` + ``backends`` (the
target rewrites the assistant turns; ``generation`` says what a backend is), ``vocab``
(draft vocabulary), ``store`` (atomic output, ``load_prepared``), ``prepare`` (the
``prepare-data`` step tying them together).
"""

from eagle_train.data.chat import ChatRenderer, TokenizedChat, mask_from_offsets
from eagle_train.data.config import PrepareDataConfig, RegenerateConfig, VocabConfig
from eagle_train.data.errors import BadRecordPolicy, DataError
from eagle_train.data.prepare import PrepareReport, prepare_data
from eagle_train.data.records import Record, RecordReader, parse_record
from eagle_train.data.regenerate import RegenerationReport
from eagle_train.data.store import PreparedDataError, load_prepared, read_meta
from eagle_train.data.vocab import (
    TokenCounter,
    VocabMapping,
    build_vocab_mapping,
    load_token_counts,
    load_vocab_mapping,
    save_token_counts,
    save_vocab_mapping,
)

__all__ = [
    "BadRecordPolicy",
    "ChatRenderer",
    "DataError",
    "PrepareDataConfig",
    "PrepareReport",
    "PreparedDataError",
    "Record",
    "RecordReader",
    "RegenerateConfig",
    "RegenerationReport",
    "TokenCounter",
    "TokenizedChat",
    "VocabConfig",
    "VocabMapping",
    "build_vocab_mapping",
    "load_prepared",
    "load_token_counts",
    "load_vocab_mapping",
    "mask_from_offsets",
    "parse_record",
    "prepare_data",
    "read_meta",
    "save_token_counts",
    "save_vocab_mapping",
]
