"""Issue 24, "real disk-full tests": prepare-data, prepare-features and export-draft on a
small real filesystem (a tmpfs; the test is skipped, with the reason, where none can be
mounted) that fills up mid-write: one line naming the path, exit 2, no partial file under a
final name, and the earlier output intact (byte-identical, or, for the feature cache whose
complete shards are kept, every shard present valid and reused by the run that finishes)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_runs import CONFIG, export_cli, one_line_error, prepare_cli, run_sets, snapshot, train_cli
from feature_runs import feature_run_args as feature_args
from run_configs import target_path
from safetensors.torch import load_file
from tmpfs import tmpfs
from typer.testing import CliRunner

from eagle_train.cli import prepare_features_app
from eagle_train.fsutil import UnsafePathError
from eagle_train.ownership import RECORD


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` so that about ``leave`` bytes stay free."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave))


def _no_temporaries(root: Path) -> None:
    # the record of the files an output's command wrote is the output's own (ownership.py)
    left = [p.name for p in root.rglob(".*") if p.name not in (".gitattributes", RECORD)]
    assert left == [], left


def test_a_full_disk_in_prepare_data_keeps_the_earlier_output(tiny_world: Path, tmp_path: Path):
    """The disk fills while a second prepare-data (overwrite=true) writes its temporary:
    one line naming output_dir, exit 2, the earlier dataset byte-identical, no temporary."""
    data = tiny_world / "data" / "train.jsonl"
    target = target_path(tiny_world)
    earlier = tmp_path / "earlier"
    sets = [f"inputs=[{data}]", f"tokenizer={target}", "max_length=256"]
    assert prepare_cli(*sets, f"output_dir={earlier}").exit_code == 0
    size = _size(earlier)
    with tmpfs(tmp_path / "disk", f"{4 * size // 1024 + 256}k") as disk:
        out = disk / "prepared"
        shutil.copytree(earlier, out)
        before = snapshot(out)
        _fill(disk, size // 2)
        result = prepare_cli(*sets, f"output_dir={out}", "overwrite=true")
        one_line_error(result, f"{out}: no space left on device while writing the prepared data")
        assert snapshot(out) == before
        (disk / "filler").unlink()
        _no_temporaries(disk)
        assert sorted(p.name for p in disk.iterdir()) == ["prepared"]


def test_a_full_disk_in_export_draft_keeps_the_earlier_export(
    trained: Path,  # noqa: F811
    tmp_path: Path,
):
    """The disk fills while ``export-draft --overwrite`` writes the new export: one line
    naming OUT_DIR, exit 2, the earlier export byte-identical, no temporary left."""
    earlier = tmp_path / "earlier"
    assert export_cli(trained, earlier).exit_code == 0
    size = _size(earlier)
    with tmpfs(tmp_path / "disk", f"{4 * size // 1024 + 256}k") as disk:
        out = disk / "drafter"
        shutil.copytree(earlier, out)
        before = snapshot(out)
        _fill(disk, size // 2)
        one_line_error(
            export_cli(trained, out, "--overwrite"), f"{out}: no space left on device while"
        )
        assert snapshot(out) == before
        (disk / "filler").unlink()
        _no_temporaries(disk)
        assert sorted(p.name for p in disk.iterdir()) == ["drafter"]


def test_a_full_disk_in_prepare_features_keeps_whole_shards_and_resumes(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """The disk fills part way through the shards: one line naming the split, exit 2; every
    shard left under its final name loads whole (no torn shard), no temporary; with room
    again the same command finishes and reuses the shards already written."""
    whole = tmp_path / "whole"
    args = feature_args(tiny_world, tiny_llama_data, whole, tmp_path / "run")
    shard = ["--shard-mib", "0.02"]
    runner = CliRunner()
    assert runner.invoke(prepare_features_app, [*args, *shard]).exit_code == 0
    size = _size(whole / "train")
    shards = len(list((whole / "train").glob("shard-*.safetensors")))
    assert shards >= 4
    with tmpfs(tmp_path / "disk", f"{2 * size // 1024 + 256}k") as disk:
        cache = disk / "features"
        args = feature_args(tiny_world, tiny_llama_data, cache, tmp_path / "run")
        _fill(disk, size // 2)
        result = runner.invoke(prepare_features_app, [*args, *shard])
        one_line_error(
            result, f"{cache / 'train'}: no space left on device while writing the feature cache"
        )
        (disk / "filler").unlink()
        _no_temporaries(disk)
        kept = sorted((cache / "train").glob("shard-*.safetensors"))
        assert 0 < len(kept) < shards
        for path in kept:  # whole: safetensors' own loader reads every tensor
            assert load_file(path).keys() == load_file(whole / "train" / path.name).keys()
        finished = runner.invoke(prepare_features_app, [*args, *shard])
        assert finished.exit_code == 0, finished.output
        assert f"({shards - len(kept)} written by this process)" in finished.output


def test_a_full_disk_in_prepare_data_names_the_output(
    tiny_world: Path, tmp_path: Path, monkeypatch
):
    """Before: ``error: ?: No space left on device`` (the OSError had no file name)."""
    import errno
    import os

    from eagle_train.data import store

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as Arrow's writer raises it

    monkeypatch.setattr(store.ExampleWriter, "finish", full)
    data = tiny_world / "data" / "train.jsonl"
    target = target_path(tiny_world)
    out = tmp_path / "out"
    result = prepare_cli(f"inputs=[{data}]", f"output_dir={out}", f"tokenizer={target}")
    one_line_error(result, f"{out}: no space left on device while writing the prepared data")
    assert list(tmp_path.iterdir()) == []  # the partial output was removed


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 640 KiB tmpfs: the draft of a tiny run fits, its optimizer state does not."""
    with tmpfs(tmp_path / "disk", "640k") as disk:
        yield disk


def test_a_really_full_disk_while_saving_the_optimizer_state(
    tiny_world: Path, tiny_llama_data: Path, small_disk: Path
):
    """Before: torch.save on a full disk raised ``RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos ...`` (no errno), a traceback, not the one line the
    ENOSPC path gives."""
    out = small_disk / "run"
    target = target_path(tiny_world)
    result = train_cli(CONFIG, run_sets(target, tiny_llama_data, out, "train.max_steps=2"))
    final = out / "checkpoints" / "step-0000002"
    one_line_error(result, f"no space left on device while writing {final}", "is none")
    assert list(out.glob("checkpoints/*")) == []  # partial removed (and the folder it made)
    assert (out / "metrics.jsonl").stat().st_size > 0  # the run's log of steps 1-2 is kept


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 64 KiB tmpfs."""
    with tmpfs(tmp_path / "disk", "64k") as disk:
        yield disk


def test_a_full_disk_in_tensorboards_writer_thread_is_one_named_error(tiny_disk: Path, capfd):
    """Before: "Exception in thread Thread-1: Traceback ... OSError: [Errno 28]" from
    TensorBoard's writer thread, then ``error: ?: No space left on device``."""
    from eagle_train.metrics import MetricLog

    sink = MetricLog(tiny_disk, tensorboard=True)
    (tiny_disk / "filler").write_bytes(b"x" * (60 << 10))
    with pytest.raises(UnsafePathError) as err:
        for step in range(1, 100_000):
            sink.write("train", step, {"loss": 1.0})
        sink.close()
    (tiny_disk / "filler").unlink()
    sink.close()  # with room again: closes cleanly and restores the thread hook
    assert str(err.value).startswith(f"{tiny_disk}: no space left on device while writing")
    assert "Traceback" not in capfd.readouterr().err
