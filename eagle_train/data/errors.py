"""Bad-input handling shared by every data step: one error type and one skip policy.

A bad record either stops the run with a ``DataError`` that names its file and line, or, under
``on_bad_record: skip``, is counted under a short reason. It is never passed on with a guessed
fix, because a silently wrong loss mask trains the draft on the wrong tokens.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from eagle_train.errors import UserError

logger = logging.getLogger(__name__)

OnBadRecord = Literal["error", "skip"]


class DataError(UserError, ValueError):
    """A user mistake in the data (or in the chat template for that data).

    ``reason`` is a short snake_case key used to tally skips; the message names the source.
    """

    def __init__(self, message: str, *, reason: str = "bad_record") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class BadRecordPolicy:
    """Raises bad-record errors (``mode="error"``) or counts them by reason (``mode="skip"``)."""

    mode: OnBadRecord = "error"
    skipped: Counter[str] = field(default_factory=Counter)
    max_logged: int = 20

    def handle(self, err: DataError) -> None:
        if self.mode == "error":
            raise err
        self.count(err.reason, str(err))

    def count(self, reason: str, message: str) -> None:
        """Count a skip that is allowed in every mode (e.g. nothing left to train on)."""
        self.skipped[reason] += 1
        # Log the first few in full so a systematic problem is visible without flooding the log.
        if self.num_skipped <= self.max_logged:
            logger.warning("skipping record: %s", message)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())
