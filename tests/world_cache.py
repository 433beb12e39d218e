"""The tiny demo world, built once per machine and reused: keyed by a hash of its config, of
the source of every eagle_train module that builds it (eagle_train/demo/ and what it imports,
followed transitively) and of the library versions; a change to any of them builds a new one.

The store lives under ``$EAGLE_TRAIN_TEST_CACHE`` (default ``.pytest_cache/`` in the repo).
An entry is built in a temporary directory and renamed into place, so two pytest processes
racing both end with one whole entry (the loser's build is discarded). Entries are made
read-only, and each session gets its own copy: a test cannot change what the next one reads
(the copy also protects the store where the tests run as root and modes do not bind).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "eagle_train"
BUILDER_ROOTS = ("eagle_train/demo",)


def _module_file(module: str) -> Path | None:
    base = REPO / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(file: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def builder_sources() -> list[Path]:
    """Every eagle_train source file the world's builder runs: the builder's folders and
    the modules they import, transitively (package __init__ files included)."""
    todo = [f for root in BUILDER_ROOTS for f in sorted((REPO / root).rglob("*.py"))]
    seen: set[Path] = set()
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        for module in _imported_modules(file):
            parts = module.split(".")
            for i in range(1, len(parts) + 1):  # a.b.c imports a, a.b and a.b.c
                target = _module_file(".".join(parts[:i]))
                if target is not None and target not in seen:
                    todo.append(target)
    return sorted(seen)


def world_key(config: dict) -> str:
    import tokenizers
    import torch
    import transformers

    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True).encode())
    for file in builder_sources():
        digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes() + b"\0")
    versions = (torch.__version__, transformers.__version__, tokenizers.__version__)
    digest.update(repr(versions).encode())
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE_TRAIN_TEST_CACHE", REPO / ".pytest_cache"))


def _set_tree_mode(root: Path, writable: bool) -> None:
    add = stat.S_IWUSR if writable else 0
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        path.chmod(mode | add)


def _discard(path: Path) -> None:
    if path.exists():
        _set_tree_mode(path, writable=True)
        shutil.rmtree(path)


def stored_world(config_file: Path, overrides: Sequence[str] = ()) -> Path:
    """The read-only stored world for ``config_file`` with ``overrides`` (``key=value``, as
    ``--set`` takes them) applied (built here if no entry matches)."""
    from eagle_train.config import load_config
    from eagle_train.demo.build import DemoConfig, build_demo_world

    cfg = load_config(DemoConfig, config_file, list(overrides))
    root = cache_root() / "tiny-worlds"
    final = root / f"{config_file.stem}-{world_key(cfg.model_dump(mode='json'))}"
    if (final / "world.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        build_demo_world(cfg, tmp / "world")
        _set_tree_mode(tmp / "world", writable=False)
        try:
            (tmp / "world").rename(final)
        except OSError:  # another process published the same entry first: use that one
            if not (final / "world.json").is_file():
                raise
    finally:
        _discard(tmp)
    return final


def world_copy(config_file: Path, out: Path, overrides: Sequence[str] = ()) -> Path:
    """A writable copy of the stored world at ``out`` (this session's own)."""
    shutil.copytree(stored_world(config_file, overrides), out, copy_function=shutil.copy)
    _set_tree_mode(out, writable=True)
    return out
