"""One ownership rule for every output directory (issue 59, eagle_train/ownership.py): a
command recognises its own earlier output by the record of exactly the files it wrote,
``--overwrite`` removes only those, and anything else there is refused in one line naming it;
no output overlaps an input (resolved paths, symlinks followed).

Each per-command test reproduces one of the issue's "ways to lose a file" through the real
command line, hashes the user's file before and after, and names what the code did before."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from cli_runs import cli_args, one_line_error, run_sets
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import (
    build_demo_app,
    eval_acceptance_app,
    export_draft_app,
    fetch_real_target_app,
    prepare_data_app,
    prepare_features_app,
    train_draft_app,
)
from eagle_train.fsutil import UnsafePathError
from eagle_train.ownership import (
    RECORD,
    check_owned,
    check_owned_file,
    file_record,
    owned_directory,
    owned_file,
    read_record,
)

REPO = Path(__file__).resolve().parents[2]
NOTES = b"my notes: lr 3e-4 diverged at step 900\n"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def with_notes(folder: Path, name: str = "NOTES.txt") -> tuple[Path, str]:
    (folder / name).write_bytes(NOTES)
    return folder / name, digest(folder / name)


def invoke(app, args: list[str]):
    return CliRunner().invoke(app, [str(a) for a in args])


def set_args(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


# --- the mechanism --------------------------------------------------------------------------


def write_owned(out: Path, files: dict[str, bytes], command: str = "test-cmd") -> None:
    with owned_directory(out, command, "a test output") as tmp:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)


def test_the_record_lists_exactly_what_was_written(tmp_path: Path):
    out = tmp_path / "out"
    write_owned(out, {"a.txt": b"a", "sub/b.bin": b"b" * 10})
    record = read_record(out)
    assert record is not None and record["written_by"] == "test-cmd"
    assert set(record["files"]) == {"a.txt", "sub/b.bin"} and record["dirs"] == ["sub"]
    assert record["files"]["a.txt"]["sha256"] == hashlib.sha256(b"a").hexdigest()
    check_owned(out, "OUT", True, "test-cmd", "a test output")  # its own: replaceable


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda out: (out / "NOTES.txt").write_text("mine"), "NOTES.txt, which"),
        (lambda out: (out / "sub" / "deep.txt").write_text("mine"), "sub/deep.txt, which"),
        (lambda out: (out / "a.txt").write_text("edited"), "a.txt (changed since it was written)"),
        (lambda out: (out / "empty").mkdir(), "empty, which"),
        (lambda out: (out / "link").symlink_to(out / "a.txt"), "link (a link)"),
        (lambda out: (out / RECORD).write_text("{"), f"{RECORD}: not a record"),
    ],
)
def test_anything_else_in_an_owned_output_is_refused(tmp_path: Path, change, named: str):
    out = tmp_path / "out"
    write_owned(out, {"a.txt": b"a", "sub/b.bin": b"b"})
    change(out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UnsafePathError) as info:
        check_owned(out, "OUT", True, "test-cmd", "a test output")
    assert named in str(info.value)
    with pytest.raises(UnsafePathError):  # and the replacement itself refuses too
        write_owned(out, {"a.txt": b"new"})
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left


def test_another_commands_output_is_not_replaced(tmp_path: Path):
    out = tmp_path / "out"
    write_owned(out, {"a.txt": b"a"}, command="prepare-data")
    with pytest.raises(UnsafePathError, match=f"holds {RECORD} of prepare-data"):
        check_owned(out, "OUT", True, "export-draft", "an export")


def test_a_file_added_between_the_check_and_the_rename_survives(tmp_path: Path):
    """The check is made again just before the replacement: a file the user saves while the
    command runs is not removed with the old output."""
    out = tmp_path / "out"
    write_owned(out, {"a.txt": b"a"})
    check_owned(out, "OUT", True, "test-cmd", "a test output")
    with pytest.raises(UnsafePathError, match="NOTES.txt"):
        with owned_directory(out, "test-cmd", "a test output") as tmp:
            (tmp / "a.txt").write_bytes(b"new")
            with_notes(out)  # saved by the user while the command worked
    assert (out / "NOTES.txt").read_bytes() == NOTES and (out / "a.txt").read_bytes() == b"a"


def test_replacing_removes_the_recorded_files_only(tmp_path: Path):
    out = tmp_path / "out"
    write_owned(out, {"a.txt": b"a", "sub/b.bin": b"b"})
    write_owned(out, {"c.txt": b"c"})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [RECORD, "c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- one test per command: the refusal, the user's file byte for byte -----------------------


def prepare_sets(world: Path, out: Path) -> list[str]:
    """prepare-data of the world's chats onto ``out`` with overwrite: what replaced an
    earlier dataset whole before the fix."""
    return [
        f"inputs=[{world / 'data' / 'val.jsonl'}]",
        f"output_dir={out}",
        f"tokenizer={target_path(world)}",
        "max_length=256",
        "overwrite=true",
    ]


def test_prepare_data_keeps_a_note_in_an_earlier_dataset(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Issue 59, way 3: prepare-data with overwrite onto an earlier dataset deleted the
    user's NOTES.txt in it."""
    data = tmp_path / "data"
    shutil.copytree(tiny_llama_data, data)
    notes, before = with_notes(data)
    result = invoke(prepare_data_app, set_args(prepare_sets(tiny_world, data)))
    one_line_error(result, f"output_dir {data} holds NOTES.txt, which prepare-data did not write")
    assert digest(notes) == before


def test_prepare_features_never_writes_into_its_inputs(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Issue 59, way 1: data.features equal to the dataset folder (or inside the target's)
    was accepted; a later prepare-data onto that dataset deleted the whole cache."""
    data = tmp_path / "data"
    shutil.copytree(tiny_llama_data, data)
    target = target_path(tiny_world)
    link = tmp_path / "link-to-data"
    link.symlink_to(data)
    a_file = tmp_path / "file.bin"
    a_file.write_bytes(b"x")
    cases = [
        (data, f"data.features {data} is the dataset"),
        (link / "cache", "is inside the dataset"),  # through a symlink: resolved
        (target / "cache", "is inside the target"),
        (tmp_path, "contains the dataset"),
        (a_file, f"data.features {a_file} is a file"),
    ]
    before = {p: digest(p) for p in data.rglob("*") if p.is_file()}
    for features, why in cases:
        sets = run_sets(target, data, tmp_path / "run", f"data.features={features}")
        result = invoke(prepare_features_app, cli_args(sets))
        one_line_error(result, why)
    assert {p: digest(p) for p in data.rglob("*") if p.is_file()} == before
    assert not (target / "cache").exists() and not (data / "train").exists()


def test_prepare_data_keeps_a_cache_someone_wrote_into_the_dataset(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Way 1's second half: a folder written into a dataset is not the dataset's, so
    preparing the dataset again refuses instead of deleting it."""
    data = tmp_path / "data"
    shutil.copytree(tiny_llama_data, data)
    (data / "train").mkdir()
    shard, before = with_notes(data / "train", "shard-00000.safetensors")
    result = invoke(prepare_data_app, set_args(prepare_sets(tiny_world, data)))
    one_line_error(result, f"output_dir {data} holds train, which prepare-data did not write")
    assert digest(shard) == before


def test_build_demo_world_keeps_a_note_in_an_earlier_world(tiny_world: Path, tmp_path: Path):
    """Issue 59, way 4: build-demo-world OUT --overwrite deleted NOTES.txt in an earlier
    world (it recognised a world by world.json alone)."""
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    notes, before = with_notes(world)
    config = REPO / "configs" / "demo" / "tiny.yaml"
    result = invoke(build_demo_app, [world, "-c", config, "--overwrite"])
    one_line_error(result, f"OUT {world} holds NOTES.txt, which build-demo-world did not write")
    assert digest(notes) == before
    notes.unlink()
    (world / "world.json").write_text("{}")  # an edited file is the user's too
    result = invoke(build_demo_app, [world, "-c", config, "--overwrite"])
    one_line_error(result, "holds world.json (changed since it was written)")


def test_eval_report_keeps_a_note(tiny_world: Path, tmp_path: Path, no_vllm: None):  # noqa: F811
    """Issue 59, way 5: eval-acceptance --out REP --overwrite deleted NOTES.txt in an
    earlier report."""
    report = tmp_path / "report"
    write_owned(report, {"summary.json": b"{}", "per_prompt.jsonl": b""}, "eval-acceptance")
    notes, before = with_notes(report)
    target = target_path(tiny_world)
    args = ["--target", target, "--draft", "ngram", "--out", report, "--overwrite"]
    result = invoke(eval_acceptance_app, args)
    one_line_error(result, f"--out {report} holds NOTES.txt, which eval-acceptance did not write")
    assert digest(notes) == before


def test_fetch_real_target_keeps_the_users_fetch_json(tmp_path: Path):
    """Issue 59, way 6: fetch-real-target DIR wrote into any folder and renamed its manifest
    over the user's fetch.json; nothing is downloaded before the refusal."""
    folder = tmp_path / "mine"
    folder.mkdir()
    notes, before = with_notes(folder, "fetch.json")
    cache = tmp_path / "cache"
    result = invoke(fetch_real_target_app, [folder, "--cache-dir", cache])
    one_line_error(result, f"OUT_DIR {folder} holds fetch.json (and no record of the files")
    assert digest(notes) == before and not cache.exists()
    a_file = tmp_path / "cache-file"
    a_file.write_bytes(b"x")
    result = invoke(fetch_real_target_app, [tmp_path / "new", "--cache-dir", a_file])
    one_line_error(result, f"--cache-dir {a_file} exists and is not a directory")
    result = invoke(fetch_real_target_app, [tmp_path / "new", "--cache-dir", tmp_path / "new/c"])
    one_line_error(result, "is inside the OUT_DIR")


def test_export_keeps_an_edited_card(tiny_world: Path, tmp_path: Path):
    """export-draft --overwrite replaced a drafter whose README.md the user had edited (only
    added files were caught): the card is theirs now."""
    from exported_drafts import export_random

    drafter = export_random(tiny_world, "llama", tmp_path / "drafter")
    card = drafter / "README.md"
    card.write_text(card.read_text() + "\n## My measurements\nAL 3.1 on our prompts\n")
    before = digest(card)
    result = invoke(export_draft_app, [tmp_path / "ckpt", drafter, "--overwrite"])
    one_line_error(result, f"OUT_DIR {drafter} holds README.md (changed since it was written)")
    assert digest(card) == before


def test_train_draft_keeps_a_note_in_its_output_dir(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    run = tmp_path / "run"
    run.mkdir()
    notes, before = with_notes(run)
    target = target_path(tiny_world)
    result = invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, run)))
    one_line_error(result, f"train.output_dir {run} holds NOTES.txt, which train-draft did not")
    assert digest(notes) == before


def test_a_rewrite_by_the_tool_itself_is_recorded(tmp_path: Path):
    """A tool that rewrites one of its own files (a card it regenerates) records it again,
    so --overwrite still replaces the output; a user's file is never taken in."""
    from eagle_train.ownership import record_rewrite

    out = tmp_path / "out"
    write_owned(out, {"README.md": b"card"})
    (out / "README.md").write_bytes(b"card, regenerated by the tool")
    record_rewrite(out, ["README.md"], "test-cmd")
    check_owned(out, "OUT", True, "test-cmd", "a test output")
    with_notes(out)
    with pytest.raises(UnsafePathError, match="NOTES.txt: not a file test-cmd wrote here"):
        record_rewrite(out, ["NOTES.txt"], "test-cmd")


# --- single-file outputs ----------------------------------------------------------------------


def write_owned_file(path: Path, data: bytes, command: str = "test-cmd") -> None:
    with owned_file(path, "key", command) as tmp:
        tmp.write_bytes(data)


def test_a_single_file_output_is_replaced_only_as_it_was_written(tmp_path: Path):
    out = tmp_path / "deep" / "prompts.jsonl"
    write_owned_file(out, b"first\n")
    assert out.read_bytes() == b"first\n" and file_record(out).is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == [file_record(out).name, out.name]
    check_owned_file(out, "key", True, "test-cmd")  # its own, as written: replaceable
    write_owned_file(out, b"second\n")
    assert out.read_bytes() == b"second\n"
    for refused, named in [
        (lambda: check_owned_file(out, "key", False, "test-cmd"), "already exists"),
        (lambda: check_owned_file(out, "key", True, "other-cmd"), "a file test-cmd wrote"),
    ]:
        with pytest.raises(UnsafePathError, match=named):
            refused()
    out.write_bytes(b"edited by the user\n")
    with pytest.raises(UnsafePathError, match="a file changed since it was written"):
        write_owned_file(out, b"third\n")
    assert out.read_bytes() == b"edited by the user\n"
    assert sorted(p.name for p in out.parent.iterdir()) == [file_record(out).name, out.name]


def test_a_failed_single_file_write_leaves_nothing(tmp_path: Path):
    out = tmp_path / "new" / "prompts.jsonl"
    with pytest.raises(RuntimeError):
        with owned_file(out, "key", "test-cmd") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("generation failed")
    assert not (tmp_path / "new").exists()


def synthesize_sets(world: Path, out: Path, prompts: Path, overwrite: bool) -> list[str]:
    return [
        f"output_dir={out}",
        f"tokenizer={target_path(world)}",
        "synthesize.enabled=true",
        "regenerate.enabled=true",
        f"synthesize.output_path={prompts}",
        f"overwrite={str(overwrite).lower()}",
    ]


@pytest.mark.parametrize("overwrite", [False, True])
def test_prepare_data_keeps_a_users_file_where_synthesized_prompts_go(
    tiny_world: Path, tmp_path: Path, overwrite: bool
):
    """Before: the synthesized prompts were renamed over synthesize.output_path whatever it
    held (a user's notes, their own prompts), with or without overwrite."""
    notes, before = with_notes(tmp_path)
    out = tmp_path / "data"
    result = invoke(prepare_data_app, set_args(synthesize_sets(tiny_world, out, notes, overwrite)))
    if overwrite:
        named = f"synthesize.output_path {notes} is a file with no record of being written by it"
    else:
        named = f"synthesize.output_path {notes} already exists; set overwrite=true"
    one_line_error(result, named)
    assert digest(notes) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NOTES.txt"]
