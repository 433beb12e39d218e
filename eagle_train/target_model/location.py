"""Where a model comes from: a local directory (checked before any loader runs) or a
Hugging Face hub id. A missing directory, one without ``config.json``, or a hub id that
cannot be fetched is one ``ConfigError`` line naming the key and the path, instead of a
loader's traceback that ends in "couldn't connect to huggingface.co"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from eagle_train.config import ConfigError

# "org/name" or "name": what the hub accepts as a repository id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_path(path: str | Path, key: str, need_config: bool = True) -> None:
    """Refuse a local model path that does not exist or lacks ``config.json``; a string
    that can only be a hub id (and is no local path) is left to the loader."""
    text = str(path)
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ConfigError(f"{key} {text!r}: not a directory (expected a model directory)")
        if need_config and not (local / "config.json").is_file():
            raise ConfigError(
                f"{key} {text!r}: no config.json in this directory (expected a Hugging Face "
                "model directory, as save_pretrained writes it)"
            )
        return
    if not _HUB_ID.match(text):
        where = "" if local.is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigError(f"{key} {text!r}: no such directory{where}")


def from_pretrained(
    loader: Any, path: str | Path, key: str, need_config: bool = True, **kwargs: Any
) -> Any:
    """``loader.from_pretrained(path, **kwargs)`` after ``check_model_path``; a hub id that
    cannot be loaded (offline, unknown, gated) is one line naming ``key``."""
    check_model_path(path, key, need_config)
    try:
        return loader.from_pretrained(str(path), **kwargs)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{key} {str(path)!r}: not a local directory, and loading it from the Hugging Face "
            f"hub failed: {first}"
        ) from None
