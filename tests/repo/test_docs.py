"""The documentation points at things that exist: every relative link (and its #anchor) and
every repository path named in backticks or code blocks of README.md, docs/**/*.md and the
READMEs of scripts/, benchmarks/ and research/; the README stays a front door (under 11,000
bytes); every script of those folders is listed in its README; no page names a path of the
machine it was written on; the README's test command is the one CI runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LIMIT = 11_000
TOOL_FOLDERS = ("scripts", "benchmarks", "research")
# A path of one machine: a home, a scratch or mount folder, the checkout's own absolute path.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:root|home|tmp|work|mnt|scratch|data|Users)/[\w.\-]")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
TOKEN = re.compile(r"[A-Za-z0-9_./\-]+")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")  # <name>, globs, $VAR, ...


def doc_files() -> list[Path]:
    docs = sorted((REPO / "docs").rglob("*.md"))
    tools = [REPO / folder / "README.md" for folder in TOOL_FOLDERS]
    return [REPO / "README.md", *tools, *docs]


def tracked_roots() -> set[str]:
    """Top-level names the repository tracks (eagle_train, tests, configs, ...): a named path
    starting with one of them is a repository path; runs/, data/ and the like are outputs."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return {line.split("/")[0] for line in out.stdout.splitlines()}
    return {p.name for p in REPO.iterdir() if p.name not in {"runs", ".git", ".venv"}}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def broken_links(path: Path) -> list[str]:
    bad = []
    text = path.read_text()
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{shown(path)}: link {target!r}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{shown(path)}: link {target!r}: no such heading")
    return bad


def named_paths(text: str, roots: set[str]) -> set[str]:
    """Repository paths named in code spans and fenced blocks."""
    chunks = FENCE.findall(text) + CODE_SPAN.findall(FENCE.sub("", text))
    found = set()
    for chunk in chunks:
        for word in re.split(r"[\s'\"=,;:()\[\]]+", chunk):
            if not word or PLACEHOLDER.search(word):
                continue
            match = TOKEN.fullmatch(word.rstrip("."))
            if match is None:
                continue
            name = match.group(0)
            head = name.split("/")[0]
            if head in roots and ("/" in name or "." in name):
                found.add(name.rstrip("/"))
    return found


def missing_paths(path: Path, roots: set[str]) -> list[str]:
    names = named_paths(path.read_text(), roots)
    return [
        f"{shown(path)}: names {name!r}, which is not in the repository"
        for name in sorted(names)
        if not (REPO / name).exists()
    ]


def test_every_relative_link_and_anchor_exists():
    bad = [problem for path in doc_files() for problem in broken_links(path)]
    assert not bad, "\n".join(bad)


def test_every_named_repository_path_exists():
    roots = tracked_roots()
    bad = [problem for path in doc_files() for problem in missing_paths(path, roots)]
    assert not bad, "\n".join(bad)


def test_readme_stays_a_front_door():
    size = len((REPO / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize("folder", TOOL_FOLDERS)
def test_every_script_is_listed_in_its_folders_index(folder: str):
    index = (REPO / folder / "README.md").read_text()
    listed = set(re.findall(r"^- `([^`]+)`", index, re.M))
    present = {
        p.name for p in (REPO / folder).iterdir() if p.is_file() and p.suffix in (".py", ".sh")
    }
    assert present - listed == set(), f"{folder}/README.md does not list {present - listed}"
    assert listed - present == set(), f"{folder}/README.md lists missing {listed - present}"


def machine_paths(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def test_no_page_names_a_path_of_one_machine():
    """A reader reruns a page's commands from the repository root or with the variables the
    page defines; /root/..., /tmp/x or /work/... names a folder of the machine it ran on."""
    bad = [f"{shown(p)}: {hit}" for p in doc_files() for hit in machine_paths(p.read_text())]
    assert not bad, "\n".join(bad)


def test_no_test_asset_records_a_path_of_one_machine():
    """An asset's config names its target by a name, not by the folder it was made from: on a
    machine where that folder exists the drafter's target check compares with it, and the
    tests would pass or fail by what the machine holds."""
    assets = Path(__file__).parents[1] / "assets"
    bad = [
        f"{p.relative_to(assets)}: {hit}"
        for p in sorted(assets.rglob("*.json"))
        for hit in machine_paths(p.read_text())
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ran in /work/main/runs/real", ["/work/m"]),
        ("`/tmp/tt/eval`", ["/tmp/t"]),
        ("cache in $RUNS/real and runs/x, https://host/tmp/y", []),
    ],
)
def test_the_machine_path_check(text: str, found: list[str]):
    assert machine_paths(text) == found


def test_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    command = re.search(r"^\.venv/bin/python -m pytest .*$", ci, re.M)
    assert command is not None
    readme = (REPO / "README.md").read_text()
    assert command.group(0) in readme
    assert "bash scripts/setup_cpu.sh" in ci and "bash scripts/setup_cpu.sh" in readme


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see [x](nope.md)", "link 'nope.md': no such file"),
        ("see [x](other.md#no-such-heading)", "no such heading"),
        ("see [x](other.md#where-to-go-next) and [y](https://example.com/z)", None),
    ],
)
def test_the_link_check_fails_on_a_broken_link(tmp_path, text, expected):
    (tmp_path / "other.md").write_text("# Title\n\n## Where to go next\n")
    page = tmp_path / "page.md"
    page.write_text(text + "\n")
    found = broken_links(page)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found


def test_the_path_check_finds_a_missing_file():
    text = "Run `scripts/no_such_script.py` and read `eagle_train/train.py`; `runs/x` is output."
    assert named_paths(text, tracked_roots()) == {
        "scripts/no_such_script.py",
        "eagle_train/train.py",
    }
