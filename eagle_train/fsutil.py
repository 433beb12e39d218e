"""File safety shared by every command that writes: nothing a user wrote is ever lost.

- ``atomic_directory``: a directory appears whole or not at all (temporary sibling, every
  file and directory fsynced, renamed, parent fsynced), its files readable like the rest
  (safetensors writes 0600; here every file gets the umask's default mode).
- ``check_output_path`` / ``check_no_overlap``: an output that is empty or root-like, or that
  overlaps an input, is refused with one line naming the path and why (what an output may
  replace: ``eagle_train/ownership.py``).
- ``hold_lock``: an exclusive ``flock`` that names its holder; the OS releases it when the
  process dies (``kill -9`` leaves no stale lock).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import glob
import os
import shutil
import socket
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle_train.errors import UserError

_TMP = ".tmp-"
_OLD = ".old-"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# OSErrors that are the user's to fix (permissions, a read-only or full filesystem).
USER_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, *DISK_FULL)


class UnsafePathError(UserError, ValueError):
    """An output that would destroy or mix with files this tool did not write, or one that
    cannot be written (read-only, in use by another process)."""


@contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` that is renamed to ``final`` only if the block
    completes; an existing ``final`` is replaced (moved aside first, so there is never a
    moment with neither). Callers decide whether ``final`` may be replaced. On any error the
    temporary is removed and ``final`` is untouched."""
    final = Path(final)
    made = topmost_missing(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}{_TMP}{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        yield tmp
        publish_tree(tmp)
        if final.exists():
            old = final.parent / f".{final.name}{_OLD}{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            fsync_dir(final.parent)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_dirs(final.parent, made)
        raise


def topmost_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist (None: it exists):
    what a ``mkdir(parents=True)`` of it would create."""
    missing = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def remove_empty_dirs(path: Path, made: Path | None) -> None:
    """Undo a ``mkdir(parents=True)`` that created ``made`` (``topmost_missing`` before it):
    ``path`` and its parents up to ``made``, each only while it is empty."""
    if made is None:
        return
    for p in (path, *path.parents):
        try:
            p.rmdir()
        except OSError:
            return
        if p == made:
            return


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary sibling, fsync it, and rename it over ``path``."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary sibling, fsync it, and rename it over ``path``."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def publish_tree(root: Path) -> None:
    """Give every file under ``root`` the default mode (0666 less the umask) and flush
    every file and directory to disk, deepest first, so a rename that follows publishes
    complete data even across a power loss."""
    mode = 0o666 & ~current_umask()
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, mode)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Remove the temporary siblings ``atomic_directory`` left for ``final`` when its writer
    was killed. Only call this while holding the lock that every writer of ``final`` holds,
    so no live writer's directory is among them."""
    final = Path(final)
    return remove_stale_temporaries_in(final.parent, glob.escape(final.name))


def remove_stale_temporaries_in(parent: Path, pattern: str) -> list[Path]:
    """Remove what killed ``atomic_directory`` writers left in ``parent`` for every final
    directory whose name matches ``pattern`` (fnmatch, e.g. ``step-*``); nothing else, however
    it is named. Same lock rule as ``remove_stale_temporaries``."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    stale = []
    for path in parent.iterdir():
        for marker in (_TMP, _OLD):
            base, found, _ = path.name.rpartition(marker)
            if found and base.startswith(".") and fnmatch.fnmatchcase(base[1:], pattern):
                if path.is_dir():
                    stale.append(path)
                break
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def check_output_path(path: Path | str, key: str) -> Path:
    """``path`` resolved; refused when empty (an unset ``$OUT``), the current directory, the
    home directory or a filesystem root: writing there mixes outputs with whatever is there."""
    text = str(path).strip()
    if text in ("", "."):
        raise UnsafePathError(
            f"{key} is empty ({str(path)!r}, e.g. an unset variable): name a directory of its own"
        )
    resolved = Path(text).expanduser().resolve()
    if resolved == Path(resolved.anchor):
        why = "a filesystem root"
    elif resolved == Path.home().resolve():
        why = "the home directory"
    elif resolved == Path.cwd().resolve():
        why = "the current directory"
    else:
        return resolved
    raise UnsafePathError(f"{key} {text!r} is {why}: name a directory of its own")


def overlaps(a: Path | str, b: Path | str) -> bool:
    """True when ``a`` and ``b`` are the same path or one lies inside the other."""
    ra, rb = Path(a).expanduser().resolve(), Path(b).expanduser().resolve()
    return ra == rb or ra in rb.parents or rb in ra.parents


def check_no_overlap(output: Path, key: str, inputs: Iterable[tuple[str, Path | None]]) -> None:
    """Refuse an output that is, contains or lies inside one of ``inputs`` (name, path)."""
    for name, path in inputs:
        if path is None or not overlaps(output, path):
            continue
        out, inp = Path(output).resolve(), Path(path).resolve()
        how = "is" if out == inp else "contains" if out in inp.parents else "is inside"
        raise UnsafePathError(
            f"{key} {output} {how} the {name} {path}: choose an output apart from its inputs"
        )


@contextmanager
def hold_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if needed, removed on release)
    for the block. Another holder: ``UnsafePathError`` naming its pid and host. The OS drops
    the lock when the process dies, so a killed holder never blocks the next run."""
    fd = _acquire(Path(path), what)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)  # after the unlink: a waiter that opened the old file retries


def _acquire(path: Path, what: str) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UnsafePathError(
                f"{path}: cannot create the lock of {what}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UnsafePathError(
                f"{what} is in use by another process ({holder}, lock {path}): wait for it "
                "to finish or stop it"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and flock: again
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


def confined(root: Path, name: object, source: Path | str) -> Path:
    """``root / name`` for a file name read from ``source`` (a manifest or state file inside
    ``root``): refused unless it is a relative name that stays inside ``root`` with symlinks
    followed, so a crafted manifest cannot make a command read (or hash, or replace) a file
    elsewhere."""
    root = Path(root)
    if (
        not isinstance(name, str)
        or not name
        or Path(name).is_absolute()
        or ".." in Path(name).parts
    ):
        raise UnsafePathError(
            f"{source}: file name {name!r} is not a relative path inside {root}: refusing it"
        )
    path = root / name
    real_root, real = root.resolve(), path.resolve()
    if real != real_root and real_root not in real.parents:
        raise UnsafePathError(
            f"{source}: {name!r} leads outside {root} (a symlink to {real}): refusing to read it"
        )
    return path


@contextmanager
def naming_disk_full(path: Path | str, what: str) -> Iterator[None]:
    """A full disk inside the block, however it surfaced (an ``OSError`` without a file name,
    a library's ``RuntimeError``), as one line naming ``path``: what was being written."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, UserError) or not is_disk_full(exc):
            raise
        raise UnsafePathError(
            f"{path}: no space left on device while writing {what} (a partial write is "
            "removed or redone): free space and run again"
        ) from None


def is_disk_full(exc: BaseException) -> bool:
    """An error that means the filesystem is full (or over quota), however it surfaced."""
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return True
    return any(os.strerror(code) in str(exc) for code in DISK_FULL)


def describe_os_error(exc: OSError) -> str:
    """One line for an OSError: the path and the reason, without a traceback."""
    where = exc.filename if exc.filename is not None else "?"
    return f"{where}: {exc.strerror or exc}"
