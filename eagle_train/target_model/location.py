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
    local = Path(str(path)).expanduser()
    try:
        return loader.from_pretrained(str(path), **kwargs)
    except (ValueError, TypeError, KeyError) as exc:
        if not local.is_dir():
            raise
        # a local folder a loader cannot read (no tokenizer files, a config of another kind)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{key} {str(path)!r}: {loader.__name__} cannot load this directory: {first[:300]}"
        ) from None
    except OSError as exc:
        if local.is_dir():
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"{key} {str(path)!r}: {loader.__name__} cannot load this directory: {first[:300]}"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{key} {str(path)!r}: not a local directory, and loading it from the Hugging Face "
            f"hub failed: {first}"
        ) from None


def check_weights(path: str | Path, key: str) -> None:
    """A local model directory whose weights are safetensors: one holding only pickled
    ``*.bin`` files is refused (never unpickled), in one line naming it."""
    local = Path(str(path)).expanduser()
    if not local.is_dir() or any(local.glob("*.safetensors")):
        return
    bins = sorted(p.name for p in local.glob("*.bin"))
    if bins:
        raise ConfigError(
            f"{key} {str(path)!r}: holds only {', '.join(bins[:3])} (pickled weights, which "
            "this tool does not unpickle): save the model with safetensors "
            "(save_pretrained(..., safe_serialization=True))"
        )
    raise ConfigError(f"{key} {str(path)!r}: no *.safetensors weights in this directory")
