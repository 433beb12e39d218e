"""Issue 24, "every failure one line": mistakes that printed a traceback (or ``error: ?:``)
now print one line naming the file, line, key or path, exit 2, and leave the user's files as
they were; torchrun ranks die with their launcher. Each docstring names the old behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import CONFIG, one_line_error, prepare_cli, run_sets, train_cli
from distributed_runs import _gone
from tmpfs import tmpfs
from typer.testing import CliRunner

from eagle_train.fsutil import UnsafePathError

# --- 6. an oversize record is refused before it is tokenized ---------------------------------


def test_an_oversize_jsonl_record_is_refused_before_tokenizing(
    tiny_world: Path, tmp_path: Path, monkeypatch
):
    """Before: one 50 MB record took 183 s and 20 GB of memory (the tokenizer ran over all of
    it) before prepare-data cut it to max_length."""
    from eagle_train.cli import prepare_data_app
    from eagle_train.data import prepare

    chats = (tiny_world / "data" / "train.jsonl").read_text().splitlines(keepends=True)[:3]
    answer = json.loads(chats[0])["messages"][-1]
    huge = {"messages": [{"role": "user", "content": "x" * 300_000}, answer]}
    data = tmp_path / "chats.jsonl"
    data.write_text(chats[0] + json.dumps(huge) + "\n" + chats[1])
    before = data.read_bytes()
    tokenized: list[int] = []
    real = prepare.ChatRenderer.tokenize_rows
    monkeypatch.setattr(
        prepare.ChatRenderer,
        "tokenize_rows",
        lambda self, messages, *a: (
            tokenized.append(len(json.dumps(messages))) or real(self, messages, *a)
        ),
    )
    target = tiny_world / "targets" / "llama" / "bf16"
    args = []
    for s in (f"inputs=[{data}]", f"output_dir={tmp_path / 'out'}", f"tokenizer={target}"):
        args += ["--set", s]
    result = CliRunner().invoke(prepare_data_app, [*args, "--set", "max_length=256"])
    limit = 64 * 256 + 65536
    one_line_error(result, f"{data}:2: record of", f"over the {limit} bytes")
    assert data.read_bytes() == before and not (tmp_path / "out").exists()
    assert max(tokenized) < 300_000  # the huge record never reached the tokenizer


def test_a_bad_tokenizer_is_one_line(tiny_world: Path, tmp_path: Path):
    """Before: a misspelled tokenizer path printed four chained OSErrors; a tokenizer that
    needs trust_remote_code a ValueError traceback."""
    data = tiny_world / "data" / "train.jsonl"
    custom = tmp_path / "custom-tok"
    custom.mkdir()
    (custom / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "MyTok", "auto_map": {"AutoTokenizer": ["tok.MyTok", None]}})
    )
    (custom / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (custom / "tok.py").write_text("raise SystemExit('custom code ran')\n")
    typo = tiny_world / "targets" / "llama" / "bf61"
    for tokenizer, why in [
        (typo, f"tokenizer {typo}: no such directory"),
        (custom, f"tokenizer {custom}: it needs trust_remote_code"),
    ]:
        result = prepare_cli(
            f"inputs=[{data}]", f"output_dir={tmp_path / 'out'}", f"tokenizer={tokenizer}"
        )
        one_line_error(result, why)
        assert not (tmp_path / "out").exists()


def test_a_binary_yaml_config_is_one_line(tmp_path: Path):
    """Before: a UnicodeDecodeError traceback (e.g. -c model.safetensors by mistake)."""
    config = tmp_path / "config.yaml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary")
    before = config.read_bytes()
    result = train_cli(config, [])
    one_line_error(result, f"{config}: not a YAML text file (byte 0 is not UTF-8)")
    assert config.read_bytes() == before


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
    target = tiny_world / "targets" / "llama" / "bf16"
    out = tmp_path / "out"
    result = prepare_cli(f"inputs=[{data}]", f"output_dir={out}", f"tokenizer={target}")
    one_line_error(result, f"{out}: no space left on device while writing the prepared data")
    assert list(tmp_path.iterdir()) == []  # the partial output was removed


# --- 8. ranks die with their launcher; a dead holder's lock is no lock -----------------------


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)
def test_a_rank_dies_with_its_launcher(tmp_path: Path):
    """Before: killing the torchrun launcher (kill -9) left its workers training for about
    25 s, holding the run lock. A "launcher" starts a "rank" the way torchrun does (its
    child, TORCHELASTIC_RUN_ID set), which joins through init_distributed, then is killed."""
    import os
    import signal

    rank = (
        "import time\n"
        "from eagle_train.parallel import init_distributed\n"
        "init_distributed('cpu', 60)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    launcher = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {rank!r}], stdout=subprocess.PIPE)\n"
        "assert child.stdout.readline() == b'ready\\n'\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.update(TORCHELASTIC_RUN_ID="test", WORLD_SIZE="1", RANK="0")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, env=env)
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(child, within_s=5), "the rank outlived its launcher"


def test_a_lock_held_by_a_killed_process_is_stale(tmp_path: Path):
    """The run lock of a process killed with -9 (its pid still written in the lock file) does
    not block the next run: the OS released its flock."""
    import os
    import signal

    from eagle_train.fsutil import hold_lock

    lock = tmp_path / ".train-draft.lock"
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from eagle_train.fsutil import hold_lock\n"
        f"with hold_lock(Path({str(lock)!r}), 'run directory'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline() == b"held\n"
    with pytest.raises(UnsafePathError, match=f"in use by another process \\(pid {proc.pid} "):
        with hold_lock(lock, "run directory"):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert f"pid {proc.pid}" in lock.read_text()  # left behind, naming the dead holder
    with hold_lock(lock, "run directory"):
        assert f"pid {os.getpid()}" in lock.read_text()


@pytest.mark.parametrize("ids", ["[1,2,99]", "[-1,2,3]"])
def test_aux_layer_ids_out_of_range_are_refused_before_anything_is_written(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, ids: str
):
    """Before: a good message inside a ValueError traceback, raised after the target loaded."""
    target = tiny_world / "targets" / "llama" / "bf16"
    out = tmp_path / "run"
    sets = run_sets(target, tiny_llama_data, out, f"draft.aux_layer_ids={ids}")
    result = train_cli(CONFIG, sets)
    shown = ids.replace(",", ", ")
    one_line_error(result, f"draft.aux_layer_ids {shown} must be distinct layer counts in 0..")
    assert not out.exists()


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
    target = tiny_world / "targets" / "llama" / "bf16"
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
