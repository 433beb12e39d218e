"""prepare-data's tokenizer, loaded with one-line errors: a path that does not exist, a
folder without a tokenizer, and a tokenizer that needs ``trust_remote_code`` are named as
``tokenizer <path>: ...`` instead of transformers' chain of OSErrors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle_train.data.errors import DataError


def load_tokenizer(path: Path | str) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; a local-looking path must exist. Custom
    tokenizer code is never run (no ``trust_remote_code``)."""
    from transformers import AutoTokenizer

    text = str(path)
    local = Path(text).expanduser()
    if not local.exists() and (local.is_absolute() or text.startswith((".", "~")) or _nested(text)):
        raise DataError(f"tokenizer {text}: no such directory", reason="config")
    try:
        # False, not unset: unset, transformers asks on the terminal whether to run the code
        return AutoTokenizer.from_pretrained(text, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        if "trust_remote_code" in str(exc):
            why = (
                "it needs trust_remote_code (custom tokenizer code), which eagle-train does "
                "not run: save it as a fast tokenizer (tokenizer.json) and pass that folder"
            )
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            why = f"cannot load a tokenizer from it ({first[:300]})"
        raise DataError(f"tokenizer {text}: {why}", reason="config") from None


def _nested(text: str) -> bool:
    """More than one '/' cannot be a hub id (``org/name``): it is a local path."""
    return text.count("/") > 1
