"""House rule for the tests themselves: every test file lives in the folder of the package
area it covers (tests/data/, tests/drafts/, tests/train/, ...; docs/testing.md), never in
tests/ itself; no two share a name (pytest imports them by basename); and no test file
imports another: what several share lives in a helper module at tests/ (or conftest.py)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def all_test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def imported_test_modules(source: str) -> list[str]:
    """The ``test_*`` modules ``source`` imports, at any depth (a function's own import too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0].startswith("test_")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0].startswith("test_"):
                found.append(node.module)
    return found


def test_the_import_check_sees_every_form() -> None:
    source = (
        "import os\nfrom test_a import x\nimport test_b as b\n"
        "def f():\n    from test_c.sub import y\n"
        "from realistic import tests_of\nfrom eagle_train.test_util import z\n"
    )
    assert imported_test_modules(source) == ["test_a", "test_b", "test_c.sub"]


def test_no_test_file_imports_another() -> None:
    offenders = [
        f"{path.relative_to(TESTS)} imports {module}"
        for path in all_test_files()
        for module in imported_test_modules(path.read_text())
    ]
    assert not offenders, "move what they share into a helper module:\n" + "\n".join(offenders)


def test_every_test_file_lives_in_an_area_folder() -> None:
    files = all_test_files()
    assert len(files) > 100, files  # the glob found the suite
    at_root = [p.name for p in files if p.parent == TESTS]
    assert not at_root, f"test files in tests/ itself, not an area folder: {at_root}"
    for folder in {p.parent for p in files}:
        assert not (folder / "__init__.py").exists(), folder  # basenames import as top-level
    twice = [name for name, n in Counter(p.name for p in files).items() if n > 1]
    assert not twice, f"test file names used in two folders: {twice}"
