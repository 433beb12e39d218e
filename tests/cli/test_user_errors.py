"""Issue 23: one base class for the user-facing errors, caught once by the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle_train.cli import prepare_data_app
from eagle_train.errors import UserError
from eagle_train.evaluate.prompts import PromptError, load_prompts

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_train"
# Errors that are bugs, not the user's to fix: they keep their traceback.
NOT_USER_ERRORS = {"PrecisionError"}


def error_classes() -> list[tuple[str, str]]:
    """(module, class) of every ``class XError(...)`` the package defines, read from source."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                rel = path.relative_to(PACKAGE.parent).with_suffix("")
                found.append((".".join(rel.parts), node.name))
    return found


def test_every_user_error_class_derives_from_user_error():
    """Before: seven unrelated classes (ValueError or RuntimeError), each listed in each
    command's except clause; a new one missing from a list printed a traceback."""
    import importlib

    classes = error_classes()
    assert len(classes) >= 12
    for module, name in classes:
        cls = getattr(importlib.import_module(module), name)
        if name in NOT_USER_ERRORS:
            assert not issubclass(cls, UserError), name
        else:
            assert issubclass(cls, UserError), f"{module}.{name} does not derive from UserError"


def test_the_cli_prints_any_user_error_as_one_line(monkeypatch, tmp_path: Path):
    class NewError(UserError):
        pass

    def fail(cfg):
        raise NewError(f"{tmp_path / 'x.jsonl'}: expected a JSON object per line")

    monkeypatch.setattr("eagle_train.data.prepare.prepare_data", fail)
    data = tmp_path / "x.jsonl"
    data.write_text("{}\n")
    result = CliRunner().invoke(
        prepare_data_app,
        [
            "--set",
            f"inputs=[{data}]",
            "--set",
            f"output_dir={tmp_path / 'out'}",
            "--set",
            "tokenizer=x",
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {data}: expected a JSON object per line"


def test_a_prompts_file_that_is_not_utf8_is_named(tmp_path: Path):
    """Before: 'utf-8 codec can't decode byte 0xff in position 12' with no file name."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(PromptError, match=f"{path}: not UTF-8"):
        load_prompts(path)
