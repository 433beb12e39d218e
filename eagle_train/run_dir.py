"""The run directory of ``train-draft`` (``train.output_dir``): what may be in it, and its
``config.yaml``.

A run directory is written into only when it is new, empty, or recognisably an earlier
``train-draft`` run: every entry is one train-draft writes, and its ``config.yaml`` is one
train-draft wrote and nobody edited since (its first line holds the sha256 of the rest).
Drafters that export-draft wrote and reports of eval-acceptance may sit beside them.
Anything else (the config file passed to ``-c``, a user's notes, another tool's output) is
refused in one line naming it, and so is an output that is, holds or lies inside one of the
run's inputs. So ``train-draft -c myexp/config.yaml --set train.output_dir=myexp`` never
rewrites the user's config, and never appends to a ``metrics.jsonl`` that is not the run's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from eagle_train.checkpoint import STATE_FILE, CheckpointError, list_checkpoints, newest_intact
from eagle_train.config import config_text
from eagle_train.fsutil import (
    UnsafePathError,
    atomic_write_text,
    check_no_overlap,
    remove_empty_dirs,
    topmost_missing,
)
from eagle_train.run_config import RunConfig

CONFIG_FILE = "config.yaml"
LOCK_FILE = ".train-draft.lock"
BEST_DIR = "best"  # the checkpoint the acceptance probe measured best (train.acceptance)
CHECKPOINTS_DIR = "checkpoints"
# Every top-level entry a run writes (the loop, the checkpoints, the acceptance probe, the
# lock), and what a killed writer may leave (fsutil temporaries, a torn metrics line).
RUN_ENTRIES = frozenset(
    {CONFIG_FILE, LOCK_FILE, "metrics.jsonl", "checkpoints", "best", "tensorboard", "acceptance"}
)
RUN_PATTERNS = (
    "metrics.jsonl.torn-*",
    "metrics.jsonl.tmp",
    ".metrics.jsonl*.tmp-*",
    f".{CONFIG_FILE}.tmp-*",
)
_HEADER = "# Written by train-draft: the resolved config of this run (sha256 {}). Edit a copy.\n"
_PREFIX = _HEADER.split("{}")[0]


def run_inputs(cfg: RunConfig) -> list[tuple[str, Path | None]]:
    """(name, path) of every input a run reads, which its output may not overlap."""
    train = cfg.data.train
    sources = [train] if isinstance(train, Path) else [s.path for s in train]
    caches = [] if isinstance(train, Path) else [s.features for s in train]
    return [
        *(("dataset", path) for path in sources),
        ("validation dataset", cfg.data.val),
        ("feature cache", cfg.data.features),
        *(("feature cache", path) for path in caches),
        ("target", cfg.target.path),
        ("warm-start drafter", getattr(cfg.draft, "init_from", None)),
    ]


def check_run_directory(cfg: RunConfig, out: Path) -> None:
    """Refuse ``out`` (``train.output_dir``, resolved) when it overlaps an input or holds
    anything that is not an earlier train-draft run's, naming what is there."""
    check_no_overlap(out, "train.output_dir", run_inputs(cfg))
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UnsafePathError(f"train.output_dir {out} exists and is not a directory")
    problem = run_directory_problem(out)
    if problem:
        raise UnsafePathError(
            f"train.output_dir {out} {problem}: it is not an earlier train-draft run; choose a "
            "new or empty directory (a config file passed to -c belongs outside the run "
            "directory)"
        )


def run_directory_problem(out: Path) -> str | None:
    """What in ``out`` shows it is not an earlier train-draft run (None: new, empty, or an
    earlier run: only entries a run writes, its config.yaml (or a checkpoint) among them)."""
    if not out.is_dir():
        return None
    names = sorted(p.name for p in out.iterdir())
    foreign = [
        n
        for n in names
        if n not in RUN_ENTRIES and not _is_leftover(n) and not _is_tool_output(out / n)
    ]
    if CONFIG_FILE in names and not is_run_config(out / CONFIG_FILE):
        foreign.insert(0, f"{CONFIG_FILE} (not written by train-draft, or edited since)")
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        return f"holds {', '.join(foreign[:5])}{more}, which train-draft did not write"
    written = [n for n in names if n != LOCK_FILE and not _is_leftover(n)]
    if written and CONFIG_FILE not in names and not list_checkpoints(out / "checkpoints"):
        return f"holds {', '.join(written)} but no {CONFIG_FILE} or checkpoint of a run"
    return None


def _is_tool_output(path: Path) -> bool:
    """An export-draft drafter or an eval-acceptance report kept beside the run (e.g.
    ``RUN/drafter``, as scripts/real_target.sh exports): the tools' own, not the user's."""
    from eagle_train.evaluate.report import is_report_dir
    from eagle_train.export import is_export

    return path.is_dir() and not path.is_symlink() and (is_export(path) or is_report_dir(path))


def _is_leftover(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in RUN_PATTERNS)


def checkpoint_to_export(path: Path) -> tuple[Path, str]:
    """The checkpoint ``export-draft PATH`` writes, and why it was chosen. PATH is a
    checkpoint directory (exported as it is) or a run directory: its ``best/``, where the
    acceptance probe kept one (the draft vLLM measured best during training), else its newest
    intact checkpoint (a damaged or cut-off one is skipped with a warning)."""
    path = Path(path)
    is_run = not (path / STATE_FILE).is_file() and any(
        (path / name).is_dir() for name in (BEST_DIR, CHECKPOINTS_DIR)
    )
    if not is_run:
        return path, "the checkpoint given"
    best = newest_intact(path / BEST_DIR)
    if best is not None:
        return best, "the run's best by acceptance length (best/)"
    newest = newest_intact(path / CHECKPOINTS_DIR)
    if newest is not None:
        return newest, "the run's newest intact checkpoint (no intact best/)"
    raise CheckpointError(f"{path}: a run directory without an intact checkpoint to export")


def write_run_config(cfg: RunConfig, out: Path) -> None:
    """Write (atomically) the run's resolved config as ``out/config.yaml``, with the header
    that marks it as train-draft's own."""
    body = config_text(cfg)
    atomic_write_text(out / CONFIG_FILE, _HEADER.format(_sha256(body)) + body)


def is_run_config(path: Path) -> bool:
    """True when ``path`` is a config train-draft wrote and nobody changed: its header's
    sha256 matches the rest, or (a run from before the header) it equals the config stored
    in one of the run's checkpoints."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    first, _, body = text.partition("\n")
    if first.startswith(_PREFIX):
        return first + "\n" == _HEADER.format(_sha256(body))
    stored = [*path.parent.glob("checkpoints/step-*/config.yaml")]
    stored += path.parent.glob("best/step-*/config.yaml")
    return any(p.is_file() and p.read_bytes() == text.encode() for p in stored)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@contextmanager
def nothing_left_if_failed(
    out: Path, is_main: bool, held: AbstractContextManager[object]
) -> Iterator[None]:
    """Enter ``held`` (the run lock, which creates ``out``) for the block. When the block
    fails before the run wrote a metrics line or a checkpoint, what this command created is
    removed: ``out`` itself (and the parents made with it) when it did not exist, or the
    run's entries in it when it was empty. A directory that existed with anything in it, an
    entry a run does not write, and a run that made progress are left as they are."""
    created = topmost_missing(out) if is_main else None
    was_empty = is_main and created is None and out.is_dir() and not any(out.iterdir())
    try:
        with held:
            try:
                yield
            except BaseException:
                if (created is not None or was_empty) and not _made_progress(out):
                    _remove_run_entries(out)
                raise
    except BaseException:
        if created is not None:
            remove_empty_dirs(out, created)
        raise


def _made_progress(out: Path) -> bool:
    """A metrics line, a checkpoint, a best draft or an acceptance record: worth keeping."""
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return True
    return any(
        (out / name).is_dir() and any(p.is_file() for p in (out / name).rglob("*"))
        for name in ("checkpoints", "best", "acceptance")
    )


def _remove_run_entries(out: Path) -> None:
    """Remove the entries a run writes (not its lock, released after), nothing else."""
    if out.is_symlink() or not out.is_dir():
        return
    for entry in out.iterdir():
        if entry.name == LOCK_FILE or not (entry.name in RUN_ENTRIES or _is_leftover(entry.name)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
