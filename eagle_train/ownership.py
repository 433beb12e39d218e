"""One ownership rule for every output directory a command writes.

A command that writes an output directory (prepare-data, export-draft, eval-acceptance's
report, build-demo-world, fetch-real-target) builds it in a temporary sibling and, before the
rename, writes a record of exactly the files and directories it wrote (``RECORD``: each
file's size, and the sha256 of the small ones a user may edit: cards, configs, notes).
``--overwrite`` (or ``overwrite: true``) replaces such a directory only while it holds
nothing but what its record lists, unchanged; anything else (a user's ``NOTES.txt``, a
feature cache written into a dataset, an edited model card) is refused in one line naming
the first such path, and nothing is removed. The check is made before any work, and again
under the output's lock just before the replacement, which then removes the recorded files
one by one (never a whole tree).

Directories written before the record existed are recognised by each command's own listing
(``legacy``: an export's ``files``, a dataset's ``meta.json`` sizes, a report's fixed file
names), or refused.

A single-file output (prepare-data's synthesized prompts) follows the same rule with its
record beside it, ``.<name>.eagle-train-files.json`` (``owned_file``, ``check_owned_file``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle_train.fsutil import (
    UnsafePathError,
    atomic_write_text,
    fsync_dir,
    publish_tree,
    remove_empty_dirs,
    topmost_missing,
)

RECORD = ".eagle-train-files.json"
_TMP = ".tmp-"
_OLD = ".old-"
# Files up to this size are hashed (a card or config a user may edit in place); larger ones
# (weights, Arrow files) are checked by size alone.
HASHED_BYTES = 1 << 20

Legacy = Callable[[Path], "set[str] | None"]


def write_record(root: Path, command: str) -> None:
    """Record every file and directory under ``root`` as written by ``command``."""
    root = Path(root)
    files: dict[str, dict[str, Any]] = {}
    dirs: list[str] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == RECORD:
            continue
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            raise UnsafePathError(f"{path}: {command} wrote a link or special file; not recorded")
        if path.is_dir():
            dirs.append(rel)
            continue
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if entry["size"] <= HASHED_BYTES:
            entry["sha256"] = _sha256(path)
        files[rel] = entry
    record = {"written_by": command, "files": files, "dirs": dirs}
    (root / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def record_rewrite(root: Path, names: list[str], command: str) -> None:
    """After ``command`` rewrote ``names`` (relative paths) in its own output ``root``, record
    their new sizes and hashes, so a later ``--overwrite`` still recognises them as the
    tool's. Only files the record already lists are taken (``root`` must be ``command``'s
    output); a user's edit made before the rewrite is the caller's to preserve."""
    record = read_record(root)
    if record is None or record["written_by"] != command:
        return
    for name in names:
        if name not in record["files"]:
            raise UnsafePathError(f"{Path(root) / name}: not a file {command} wrote here")
        path = Path(root) / name
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if entry["size"] <= HASHED_BYTES:
            entry["sha256"] = _sha256(path)
        record["files"][name] = entry
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write_text(Path(root) / RECORD, text)


def read_record(root: Path) -> dict[str, Any] | None:
    """The record in ``root`` (None: there is none), checked for shape."""
    return _load_record(Path(root) / RECORD)


def _load_record(path: Path) -> dict[str, Any] | None:
    if not path.exists() and not path.is_symlink():
        return None
    problem = f"{path}: not a record of written files"
    if path.is_symlink() or not path.is_file():
        raise UnsafePathError(f"{problem} (a link or directory): remove it or choose another path")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        raise UnsafePathError(f"{problem} (unreadable JSON)") from None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("written_by"), str)
        and isinstance(record.get("files"), dict)
        and isinstance(record.get("dirs"), list)
        and all(
            isinstance(v, dict) and isinstance(v.get("size"), int) for v in record["files"].values()
        )
        and all(isinstance(d, str) for d in record["dirs"])
    )
    if not ok:
        raise UnsafePathError(f"{problem} (expected written_by, files and dirs)")
    return record


def first_foreign(root: Path, record: dict[str, Any]) -> str | None:
    """The first path under ``root`` (sorted) that ``record`` does not list as it was
    written: a new file or directory, a link, or a listed file whose size or hash changed."""
    root = Path(root)
    files, dirs = record["files"], set(record["dirs"])
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == RECORD:
            continue
        if path.is_symlink():
            return f"{rel} (a link)"
        if path.is_dir():
            if rel not in dirs:
                return rel
            continue
        entry = files.get(rel)
        if entry is None or not path.is_file():
            return rel
        if not _as_written(path, entry):
            return f"{rel} (changed since it was written)"
    return None


def _as_written(path: Path, entry: dict[str, Any]) -> bool:
    """The file at ``path`` has the size (and, where recorded, the hash) its entry records."""
    if path.stat().st_size != entry["size"]:
        return False
    return "sha256" not in entry or _sha256(path) == entry["sha256"]


def unchanged(root: Path, names: list[str], command: str) -> list[str]:
    """Those of ``names`` (relative paths) that ``root``'s record lists as ``command`` wrote
    them and that still are: what a rewrite may re-record without taking in a user's edit."""
    record = read_record(root)
    if record is None or record["written_by"] != command:
        return []
    out = []
    for name in names:
        path, entry = Path(root) / name, record["files"].get(name)
        if entry is not None and path.is_file() and not path.is_symlink():
            if _as_written(path, entry):
                out.append(name)
    return out


def _legacy_foreign(root: Path, listed: set[str]) -> str | None:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink() or (path.is_file() and rel not in listed):
            return rel
        if path.is_dir() and not any(name.startswith(rel + "/") for name in listed):
            return rel
    return None


def check_owned(
    path: Path,
    key: str,
    overwrite: bool,
    command: str,
    what: str,
    hint: str = "pass --overwrite",
    legacy: Legacy | None = None,
) -> None:
    """An existing ``path`` is replaced only with ``overwrite``, and only when it is empty or
    holds nothing but what ``command`` recorded writing there; refused in one line otherwise,
    naming the first path that is not the command's."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise UnsafePathError(f"{key} {path} exists and is not a directory; choose another path")
    if not overwrite:
        raise UnsafePathError(f"{path} already exists; {hint} to replace it")
    if not any(path.iterdir()):
        return
    foreign = foreign_in(path, command, what, legacy)
    if foreign is not None:
        raise UnsafePathError(
            f"{key} {path} holds {foreign}, which {command} did not write: refusing to replace "
            f"it (only {what} holding nothing but its own files is replaced); move it out or "
            "choose another path"
        )


def foreign_in(path: Path, command: str, what: str, legacy: Legacy | None) -> str | None:
    """What in ``path`` is not ``command``'s own (None: everything is)."""
    record = read_record(path)
    if record is not None:
        if record["written_by"] != command:
            return f"{RECORD} of {record['written_by']}"
        return first_foreign(path, record)
    listed = legacy(path) if legacy is not None else None
    if listed is None:
        first = min(p.name for p in path.iterdir())
        return f"{first} (and no record of the files {command} wrote: not {what})"
    return _legacy_foreign(path, listed)


@contextmanager
def owned_directory(
    final: Path, command: str, what: str, legacy: Legacy | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling of ``final``; when the block completes, record its files as
    ``command``'s and rename it to ``final``. An existing ``final`` is checked again (nothing
    but its record's files), moved aside, and its recorded files removed one by one. On any
    error the temporary is removed and ``final`` is untouched. Callers check ``overwrite``
    (``check_owned``) and hold the output's lock."""
    final = Path(final)
    made = topmost_missing(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}{_TMP}{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        yield tmp
        write_record(tmp, command)
        publish_tree(tmp)
        if final.exists() or final.is_symlink():
            check_owned(final, str(final), True, command, what, legacy=legacy)
            old = final.parent / f".{final.name}{_OLD}{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            fsync_dir(final.parent)
            remove_written(old, legacy)
        else:
            tmp.rename(final)
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_dirs(final.parent, made)
        raise


def remove_written(root: Path, legacy: Legacy | None = None) -> None:
    """Remove what the record in ``root`` (or the ``legacy`` listing) names, deepest first,
    then ``root`` if that left it empty; anything else stays where it is."""
    record = read_record(root)
    if record is not None:
        files, dirs = list(record["files"]), list(record["dirs"])
    else:
        files = sorted((legacy(root) if legacy is not None else None) or set())
        dirs = sorted({p.as_posix() for f in files for p in Path(f).parents} - {"."})
    for name in files:
        path = root / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    for name in sorted(dirs, key=lambda d: -d.count("/")):
        try:
            (root / name).rmdir()
        except OSError:
            pass
    (root / RECORD).unlink(missing_ok=True)
    try:
        root.rmdir()
    except OSError:
        pass


def file_record(path: Path) -> Path:
    """Where the record of the single-file output ``path`` lives: a hidden sibling."""
    return Path(path).with_name(f".{Path(path).name}{RECORD}")


def check_owned_file(
    path: Path, key: str, overwrite: bool, command: str, hint: str = "pass --overwrite"
) -> None:
    """A single-file output: an existing ``path`` is replaced only with ``overwrite`` and only
    when its record (``file_record``) says ``command`` wrote it as it is; refused in one line
    otherwise (a user's file, an edited one, a directory or a link)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_file():
        raise UnsafePathError(f"{key} {path} exists and is not a file; choose another path")
    if not overwrite:
        raise UnsafePathError(f"{key} {path} already exists; {hint} to replace it")
    record = _load_record(file_record(path))
    if record is None:
        foreign = "a file with no record of being written by it"
    elif record["written_by"] != command:
        foreign = f"a file {record['written_by']} wrote"
    elif path.name not in record["files"] or not _as_written(path, record["files"][path.name]):
        foreign = "a file changed since it was written"
    else:
        return
    raise UnsafePathError(
        f"{key} {path} is {foreign}, not {command}'s own: refusing to replace it; move it out "
        "or choose another path"
    )


@contextmanager
def owned_file(final: Path, key: str, command: str) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` to write; when the block completes, check
    ``final`` again (absent, or ``command``'s own as written), rename the temporary over it
    and record it as ``command``'s. On any error the temporary is removed and ``final`` is
    untouched. Callers check ``overwrite`` first (``check_owned_file``)."""
    final = Path(final)
    made = topmost_missing(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}{_TMP}{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        check_owned_file(final, key, True, command)
        entry: dict[str, Any] = {"size": tmp.stat().st_size}
        if entry["size"] <= HASHED_BYTES:
            entry["sha256"] = _sha256(tmp)
        tmp.rename(final)
        record = {"written_by": command, "files": {final.name: entry}, "dirs": []}
        atomic_write_text(file_record(final), json.dumps(record, indent=1, sort_keys=True) + "\n")
        fsync_dir(final.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        remove_empty_dirs(final.parent, made)
        raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
