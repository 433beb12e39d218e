"""Issue 18, "nothing lost": no command destroys a file it did not write, outputs appear
whole (fsynced, readable), and bad input is one line with exit code 2. Each test names the
behaviour of the code before the fix that it catches."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from cli_runs import CONFIG, _Payload, cli_args, run_sets
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.checkpoint import CheckpointError, checkpoint_problems, load_for_resume
from eagle_train.cli import export_draft_app, train_draft_app
from eagle_train.config import load_config
from eagle_train.export import PROVENANCE_FILE
from eagle_train.fsutil import (
    UnsafePathError,
    atomic_directory,
    check_output_path,
    remove_stale_temporaries,
    remove_stale_temporaries_in,
)
from eagle_train.run_config import RunConfig
from eagle_train.train import train

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tiny_world: Path, tiny_llama_data: Path, tmp_path_factory) -> Path:
    """A finished run trained from the world's parent directory with *relative* paths, as a
    user in their project directory would."""
    out = tmp_path_factory.mktemp("lost") / "run"
    here = Path.cwd()
    os.chdir(tiny_world.parent)
    try:
        rel_target = Path(tiny_world.name) / "targets" / "llama" / "bf16"
        train(load_config(RunConfig, CONFIG, run_sets(rel_target, tiny_llama_data, out)))
    finally:
        os.chdir(here)
    return out


def checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step-0000004"


def export(ckpt: Path, out: Path, *extra: str):
    return CliRunner().invoke(export_draft_app, [str(ckpt), str(out), *extra])


# --- 1. export-draft --overwrite replaces only an earlier export --------------------------


@pytest.mark.slow  # trains a run
def test_export_overwrite_refuses_what_it_did_not_write(run_dir: Path, tmp_path: Path):
    """Before: --overwrite deleted any OUT: a user's directory, the run holding the checkpoint
    (every checkpoint, metrics and evals), or the checkpoint itself, and exited 0."""
    ckpt = checkpoint(run_dir)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    user = tmp_path / "notes"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    cases = [
        (user, "holds thesis.tex (and no record of the files export-draft wrote"),
        (run_dir, "contains the checkpoint"),
        (ckpt, "is the checkpoint"),
        (ckpt / "drafter", "is inside the checkpoint"),
    ]
    for out, why in cases:
        result = export(ckpt, out, "--overwrite")
        assert result.exit_code == 2, (out, result.output)
        assert why in result.output and "Traceback" not in result.output
    assert (user / "thesis.tex").read_text() == "years of work"
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert checkpoint_problems(ckpt) == []
    # An earlier export (and an empty directory) is replaced.
    out = tmp_path / "drafter"
    out.mkdir()
    assert export(ckpt, out, "--overwrite").exit_code == 0
    result = export(ckpt, out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / PROVENANCE_FILE).is_file()
    (out / "notes.md").write_text("mine")  # a file the user added: refused (issue 24)
    assert export(ckpt, out, "--overwrite").exit_code == 2
    assert (out / "notes.md").read_text() == "mine"


@pytest.mark.slow  # trains a run
def test_export_from_another_directory(run_dir: Path, tmp_path: Path, monkeypatch):
    """Before: the checkpoint stored the relative target.path the run was started with, so
    export-draft from any other directory failed to find the target."""
    monkeypatch.chdir(tmp_path)
    result = export(checkpoint(run_dir), tmp_path / "drafter")
    assert result.exit_code == 0, result.output
    stored = load_config(RunConfig, checkpoint(run_dir) / "config.yaml")
    assert stored.target.path.is_absolute() and stored.data.train.is_absolute()


def test_export_from_a_missing_checkpoint(tmp_path: Path):
    """Before: "incomplete (no trainer_state.json; the writer was interrupted)"."""
    result = export(tmp_path / "no-such-step", tmp_path / "out")
    assert result.exit_code == 2
    assert f"{tmp_path / 'no-such-step'}: does not exist" in result.output
    assert "interrupted" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.slow  # trains a run
def test_export_files_are_readable_like_the_rest(run_dir: Path, tmp_path: Path):
    """Before: model.safetensors was 0600 beside 0644 files (safetensors' own mode), so a
    vLLM server under another account could not read the export."""
    old = os.umask(0o022)
    try:
        assert export(checkpoint(run_dir), tmp_path / "drafter").exit_code == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "drafter").iterdir()}
    assert modes == {
        "config.json": 0o644,
        "model.safetensors": 0o644,
        PROVENANCE_FILE: 0o644,
        "README.md": 0o644,  # the model card
        ".eagle-train-files.json": 0o644,  # the record of what export-draft wrote
    }
    ckpt_modes = {stat.S_IMODE(p.stat().st_mode) for p in checkpoint(run_dir).iterdir()}
    assert ckpt_modes == {0o644}  # the run used the same umask (pytest's default 022)


# --- files are flushed before they are published ------------------------------------------


def test_atomic_directory_fsyncs_files_and_directories_before_the_rename(
    tmp_path: Path, monkeypatch
):
    """Before: nothing was fsynced, so after a power loss a renamed checkpoint or export
    could hold empty or partial files."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self: Path, target):
        events.append(("rename", str(target)))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    final = tmp_path / "out"
    with atomic_directory(final) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "a.bin").write_bytes(b"a")
        (tmp / "sub" / "b.bin").write_bytes(b"b")
    renamed = events.index(("rename", str(final)))
    synced_before = {Path(p).name for kind, p in events[:renamed] if kind == "fsync"}
    assert {"a.bin", "b.bin", "sub", tmp.name} <= synced_before
    assert ("fsync", str(tmp_path)) in events[renamed:]  # the rename itself is made durable


def test_only_a_killed_writers_temporaries_are_removed(tmp_path: Path):
    """Before: resume removed every ``.step-*`` entry of checkpoints/, whatever it was."""
    names = [".step-0000010.tmp-1a2b3c4d", ".step-0000020.old-5e6f7a8b", ".out[1].tmp-00000000"]
    kept = [".step-notes", "step-0000010", ".stepx.tmp-1", ".export.tmp-9", "notes.tmp-1"]
    for name in names + kept:
        (tmp_path / name).mkdir()
    (tmp_path / ".step-0000030.tmp-file").write_text("a file, not a writer's directory")
    removed = remove_stale_temporaries_in(tmp_path, "step-*")
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert remove_stale_temporaries(tmp_path / "out[1]") == [tmp_path / names[2]]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*kept, ".step-0000030.tmp-file"])


# --- 4. empty or root-like output paths ----------------------------------------------------


@pytest.mark.parametrize("value", ["", ".", "/", "~"])
def test_root_like_output_paths_are_refused(value: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePathError, match="train.output_dir"):
        check_output_path(Path(value), "train.output_dir")
    assert check_output_path(tmp_path / "run", "train.output_dir") == tmp_path / "run"


def test_an_unset_output_dir_does_not_train_into_the_current_directory(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch
):
    """Before: ``--set train.output_dir=$OUT`` with $OUT unset trained into the current
    directory (config.yaml, metrics.jsonl, checkpoints/ among the user's files)."""
    monkeypatch.chdir(tmp_path)
    target = target_path(tiny_world)
    result = CliRunner().invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, "")))
    assert result.exit_code == 2, result.output
    assert "train.output_dir is empty" in result.output
    assert list(tmp_path.iterdir()) == []


# --- errors, not tracebacks ----------------------------------------------------------------


@pytest.mark.slow  # trains a run
def test_a_full_disk_during_a_checkpoint(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch
):
    """Before: the OSError escaped as a traceback. Now: one line naming the last intact
    checkpoint; the partial directory is removed, the earlier checkpoint kept."""
    real_save, calls = torch.save, []

    def full_disk(obj, f, *args, **kwargs):
        name = Path(getattr(f, "name", str(f))).name
        calls.append(name)
        if name == "optimizer.pt" and calls.count(name) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    target = target_path(tiny_world)
    result = CliRunner().invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, out)))
    assert result.exit_code == 2, result.output
    first = out / "checkpoints" / "step-0000002"
    assert "no space left on device while writing" in result.output
    assert f"the last intact checkpoint is {first}" in result.output
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000002"]
    assert checkpoint_problems(first) == []


# --- security: no pickle code runs from a checkpoint ---------------------------------------


@pytest.mark.slow  # trains a run
def test_a_pickle_payload_in_optimizer_pt_is_refused(run_dir: Path, tmp_path: Path, monkeypatch):
    """Before: torch.load without weights_only; with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 in
    the environment a crafted optimizer.pt ran its payload on resume."""
    ckpt = tmp_path / "step"
    shutil.copytree(checkpoint(run_dir), ckpt)
    marker = tmp_path / "payload-ran"
    torch.save({"state": {}, "evil": _Payload(marker)}, ckpt / "optimizer.pt")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="optimizer.pt: refused.*Weights only load failed"):
        load_for_resume(ckpt)
    assert not marker.exists()
    # The truth about the variable: it turns a call that leaves weights_only unset into a
    # full unpickle, which runs the payload; only an explicit weights_only=True is safe.
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        torch.load(ckpt / "optimizer.pt")
    assert marker.exists()


@pytest.mark.slow  # trains a run
def test_resume_reads_checkpoints_with_weights_only(run_dir: Path):
    resumed = load_for_resume(checkpoint(run_dir))
    assert resumed.state.step == 4 and resumed.optimizer["state"]


def test_a_read_only_output_directory(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    """Before: a PermissionError traceback. (Tests run as root here, which chmod does not
    stop, so the output goes under /sys, a filesystem no one may create directories in.)"""
    out = Path("/sys/eagle-train-test-run")
    try:
        out.mkdir()
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    else:
        out.rmdir()
        pytest.skip("/sys is writable here")
    target = target_path(tiny_world)
    result = CliRunner().invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, out)))
    assert result.exit_code == 2, result.output
    assert f"train.output_dir {out}: cannot create it" in result.output
    assert "Traceback" not in result.output


# --- eval-acceptance ------------------------------------------------------------------------


# --- preemption signals (the training runs are in test_preemption.py) ------------------------
