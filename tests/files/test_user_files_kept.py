"""Issue 24, "nothing lost, round two": each test reproduces a user's mistake (or an
attacker's file) through the real command line and checks the one-line refusal (exit 2, the
path named) and that the user's files are byte-identical afterwards. Each docstring names
what the code did before the fix."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from cli_runs import (
    CONFIG,
    export_cli,
    one_line_error,
    refingerprint,
    run_sets,
    snapshot,
    train_cli,
)
from run_configs import target_path

from eagle_train.config import load_config
from eagle_train.ownership import RECORD
from eagle_train.run_config import RunConfig
from eagle_train.run_dir import check_run_directory, write_run_config

# --- 1. train-draft's output directory ------------------------------------------------------


def test_the_config_passed_to_c_inside_the_output_dir_is_never_rewritten(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: ``train-draft -c myexp/config.yaml --set train.output_dir=myexp`` replaced the
    user's config (comments and all) with the resolved one and trained into myexp."""
    exp = tmp_path / "myexp"
    exp.mkdir()
    user_config = exp / "config.yaml"
    user_config.write_bytes(b"# my experiment: lr sweep notes\n" + CONFIG.read_bytes())
    (exp / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 9}\n')
    before = snapshot(exp)
    target = target_path(tiny_world)
    result = train_cli(user_config, run_sets(target, tiny_llama_data, exp))
    one_line_error(result, f"train.output_dir {exp} holds config.yaml (not written by")
    assert snapshot(exp) == before


def test_a_user_file_in_a_run_dir_or_an_input_as_output_is_refused(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: train-draft wrote config.yaml, metrics.jsonl and checkpoints/ into any
    directory: the dataset's, the target's, or one holding the user's notes."""
    target = target_path(tiny_world)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    cases = [
        (notes, f"train.output_dir {notes} holds thesis.tex, which train-draft did not write"),
        (tiny_llama_data, f"train.output_dir {tiny_llama_data} is the dataset"),
        (tiny_llama_data / "run", "is inside the dataset"),
        (target, "is the target"),
        (tiny_world, "contains the target"),
    ]
    before = {p: snapshot(p) for p in (notes, tiny_llama_data, tiny_world)}
    for out, why in cases:
        result = train_cli(CONFIG, run_sets(target, tiny_llama_data, out))
        one_line_error(result, why)
    assert {p: snapshot(p) for p in before} == before
    assert not (tiny_llama_data / "run").exists()


def test_an_earlier_runs_own_config_is_recognised(tiny_llama_data: Path, tmp_path: Path):
    """train-draft's own config.yaml (header sha256 intact) marks an earlier run, which is
    resumed into; edited, it is the user's and refused."""
    cfg = load_config(RunConfig, CONFIG, run_sets("t", tiny_llama_data, tmp_path / "run"))
    out = tmp_path / "run"
    out.mkdir()
    write_run_config(cfg, out)
    (out / "metrics.jsonl").write_text("")
    check_run_directory(cfg, out)  # an earlier run: accepted
    assert load_config(RunConfig, out / "config.yaml") == cfg  # and it still loads
    text = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text(text.replace("max_steps: 4", "max_steps: 5  # mine"))
    with pytest.raises(Exception, match="config.yaml \\(not written by train-draft"):
        check_run_directory(cfg, out)
    (out / "config.yaml").unlink()
    with pytest.raises(Exception, match="holds metrics.jsonl but no config.yaml"):
        check_run_directory(cfg, out)


# --- 2. export-draft --overwrite replaces only what the earlier export wrote ---------------


def test_export_overwrite_keeps_a_file_the_user_added(trained: Path, tmp_path: Path):
    """Before: ``export-draft CKPT OLD_EXPORT --overwrite`` deleted a file the user had added
    inside the earlier export (its eval notes), and exited 0."""
    out = tmp_path / "drafter"
    assert export_cli(trained, out).exit_code == 0
    listed = json.loads((out / "eagle_train.json").read_text())["files"]
    assert sorted(p.name for p in out.iterdir() if p.name != RECORD) == listed
    (out / "my-eval-notes.md").write_text("AL 2.9 on my prompts")
    (out / "plots").mkdir()
    before = snapshot(out)
    result = export_cli(trained, out, "--overwrite")
    one_line_error(
        result, f"OUT_DIR {out} holds my-eval-notes.md, which export-draft did not write"
    )
    assert snapshot(out) == before
    (out / "my-eval-notes.md").unlink()
    (out / "plots").rmdir()
    assert export_cli(trained, out, "--overwrite").exit_code == 0  # only its own files: replaced


def test_a_run_with_its_drafter_exported_inside_resumes(
    trained: Path, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: ``export-draft RUN/checkpoints/step-N RUN/drafter`` (what real_target.sh does)
    made the next ``train-draft --resume auto`` into RUN refuse it as not a run. A directory
    that only looks like an export (no provenance) is still the user's."""
    out = tmp_path / "run"
    shutil.copytree(trained.parent.parent, out)
    assert export_cli(out / "checkpoints" / "step-0000002", out / "drafter").exit_code == 0
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, out, "train.max_steps=3")
    result = train_cli(CONFIG, [*sets, "train.resume=auto"])
    assert result.exit_code == 0, result.output
    assert (out / "checkpoints" / "step-0000003").is_dir()
    (out / "drafter" / "eagle_train.json").unlink()
    one_line_error(
        train_cli(CONFIG, [*sets, "train.resume=auto"]),
        f"train.output_dir {out} holds drafter, which train-draft did not write",
    )


# --- 3. a torn last line in metrics.jsonl ---------------------------------------------------


def test_resume_auto_survives_a_torn_metrics_line(
    trained: Path, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, caplog
):
    """Before: a crash mid-write left half a JSON line, and ``--resume auto`` failed with a
    JSONDecodeError traceback until the user edited metrics.jsonl by hand."""
    out = tmp_path / "run"
    shutil.copytree(trained.parent.parent, out)
    metrics = out / "metrics.jsonl"
    complete = metrics.read_bytes()
    assert complete.count(b"\n") == 1  # step 2, the last
    torn = b'{"split": "train", "step": 3, "loss": 4.1'
    metrics.write_bytes(complete + torn)
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, out, "train.max_steps=3")
    with caplog.at_level(logging.WARNING, logger="eagle_train.metrics"):
        result = train_cli(CONFIG, [*sets, "train.resume=auto"])
    assert result.exit_code == 0, result.output
    assert (out / "metrics.jsonl.torn-1").read_bytes() == torn  # kept where the user sees it
    lines = metrics.read_bytes().splitlines(keepends=True)
    assert len(lines) == 2 and lines[0] == complete and json.loads(lines[1])["step"] == 3
    assert [r.getMessage() for r in caplog.records if "torn" in r.getMessage()] == [
        f"{metrics}: 1 torn line(s) (a crash while writing) moved to {metrics}.torn-1; "
        "complete lines kept"
    ]


# --- 4. file names read from a manifest stay inside its directory --------------------------


def copy_checkpoint(trained: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "step-0000002"
    shutil.copytree(trained, ckpt)
    return ckpt


def test_a_checkpoint_naming_a_file_outside_itself_is_refused(trained: Path, tmp_path: Path):
    """Before: a trainer_state.json listing ``../../secret`` made export-draft (and resume)
    read and hash a file outside the checkpoint and print its size."""
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0")
    for how in ("dotdot", "absolute", "symlink"):
        ckpt = copy_checkpoint(trained, tmp_path / how)
        state_file = ckpt / "trainer_state.json"
        state = json.loads(state_file.read_text())
        entry = {"bytes": 10, "sha256": "0" * 64}
        if how == "dotdot":
            state["files"]["../../secret"] = entry
        elif how == "absolute":
            state["files"][str(secret)] = entry
        else:
            (ckpt / "scheduler.pt").unlink()
            (ckpt / "scheduler.pt").symlink_to(secret)
        state_file.write_text(json.dumps(state))
        before = snapshot(tmp_path / how)
        result = export_cli(ckpt, tmp_path / how / "out")
        expected = "leads outside" if how == "symlink" else "is not a relative path inside"
        one_line_error(result, str(state_file), expected)
        assert str(secret.stat().st_size) not in result.output.replace(str(tmp_path), "")
        assert snapshot(tmp_path / how) == before
    assert secret.read_text() == "root:x:0:0"


def test_an_export_manifest_naming_a_file_outside_is_refused(trained: Path, tmp_path: Path):
    """An eagle_train.json whose ``files`` names ``../x`` cannot widen what --overwrite
    may replace: the ownership record sees the edited file; an export from before the
    record (its ``files`` read instead) has each name confined."""
    out = tmp_path / "drafter"
    assert export_cli(trained, out).exit_code == 0
    provenance = json.loads((out / "eagle_train.json").read_text())
    provenance["files"].append("../notes")
    (out / "eagle_train.json").write_text(json.dumps(provenance))
    before = snapshot(tmp_path)
    result = export_cli(trained, out, "--overwrite")
    one_line_error(result, f"OUT_DIR {out} holds eagle_train.json (changed since it was written)")
    assert snapshot(tmp_path) == before
    (out / RECORD).unlink()  # as an export from before the record
    before = snapshot(tmp_path)
    result = export_cli(trained, out, "--overwrite")
    one_line_error(result, f"{out / 'eagle_train.json'}: file name '../notes'")
    assert snapshot(tmp_path) == before


# --- 5. corrupt feature-cache shards and checkpoint files are named ------------------------


def test_a_corrupt_checkpoint_file_is_named_at_resume(
    trained: Path, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """A checkpoint file changed after it was written (same size) is named, in one line."""
    ckpt = copy_checkpoint(trained, tmp_path)
    optimizer = ckpt / "optimizer.pt"
    data = bytearray(optimizer.read_bytes())
    data[100:164] = bytes(64)
    optimizer.write_bytes(bytes(data))
    before = snapshot(ckpt)
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, tmp_path / "run", f"train.resume={ckpt}")
    result = train_cli(CONFIG, sets)
    one_line_error(result, f"cannot resume from {ckpt}: {optimizer}: sha256 differs")
    assert snapshot(ckpt) == before


# --- 7. every failure one line ---------------------------------------------------------------


def rewrite_state(ckpt: Path, **changes) -> Path:
    state_file = ckpt / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state.update(changes)
    state_file.write_text(json.dumps(state))
    return state_file


@pytest.mark.parametrize(
    "change, why",
    [
        ({"step": "2"}, "'step' must be a non-negative integer, got '2'"),
        ({"files": ["draft.safetensors"]}, "'files' must map each file name"),
        ({"loader": 3}, "expected a JSON object with a 'loader' object"),
    ],
)
def test_a_wrong_typed_trainer_state_is_named(trained: Path, tmp_path: Path, change, why):
    """Before: a TypeError/AttributeError traceback from export-draft and resume."""
    ckpt = copy_checkpoint(trained, tmp_path)
    state_file = rewrite_state(ckpt, **change)
    before = snapshot(ckpt)
    result = export_cli(ckpt, tmp_path / "out")
    one_line_error(result, f"{state_file}: unreadable", why)
    assert snapshot(ckpt) == before and not (tmp_path / "out").exists()


def test_a_crafted_pickle_or_a_bad_header_in_a_checkpoint_is_one_line(
    trained: Path, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: an UnpicklingError / SafetensorError traceback (the manifest had been made to
    match the crafted files, so the hash check passed)."""
    import torch
    from cli_runs import _Payload

    target = target_path(tiny_world)
    marker = tmp_path / "payload-ran"
    ckpt = copy_checkpoint(trained, tmp_path / "pickle")
    torch.save({"state": {}, "evil": _Payload(marker)}, ckpt / "optimizer.pt")
    refingerprint(ckpt, "optimizer.pt")
    sets = run_sets(target, tiny_llama_data, tmp_path / "run", f"train.resume={ckpt}")
    one_line_error(train_cli(CONFIG, sets), f"{ckpt / 'optimizer.pt'}: refused")
    assert not marker.exists()
    ckpt = copy_checkpoint(trained, tmp_path / "header")
    (ckpt / "draft.safetensors").write_bytes(b"\xff" * 8 + b"{not json")
    refingerprint(ckpt, "draft.safetensors")
    result = export_cli(ckpt, tmp_path / "out")
    one_line_error(result, f"{ckpt / 'draft.safetensors'}: not a readable safetensors file")


def test_a_symlinked_checkpoint_is_not_rotated(
    trained: Path, tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: rotation called rmtree on a symlinked step-* directory: an OSError traceback
    at the end of the run (and, had it followed the link, the user's copy deleted)."""
    out = tmp_path / "run"
    shutil.copytree(trained.parent.parent, out)
    kept = copy_checkpoint(trained, tmp_path / "mine")
    (out / "checkpoints" / "step-0000001").symlink_to(kept, target_is_directory=True)
    before = snapshot(kept)
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, out, "train.max_steps=3", "train.keep_last=1")
    result = train_cli(CONFIG, [*sets, "train.resume=auto"])
    assert result.exit_code == 0, result.output
    assert (out / "checkpoints" / "step-0000001").is_symlink() and snapshot(kept) == before
    assert not (out / "checkpoints" / "step-0000002").exists()  # its own: rotated
