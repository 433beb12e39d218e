"""House rule: the package's rooms (its top-level modules and folders) import each other in one
direction only, from the start of the pipeline up to its commands. Read from the source with
``ast`` (function-level imports included), so a lazy import cannot hide an arrow."""

from __future__ import annotations

import ast
import textwrap
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "eagle_train"

# Each room and the rooms it may import. A new room is declared here with its arrows.
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),  # the version string, which any room may read
    "errors": set(),  # UserError, the base of every user-facing error: any room may import it
    "config": set(),
    "fsutil": set(),
    # chat templates rendered as transformers renders them, within a step budget
    "chat_template": set(),
    # the record of the files a command wrote into its output, and the rule that --overwrite
    # removes only those (every command that writes an output directory)
    "ownership": {"fsutil"},
    "metrics": {"fsutil"},  # metrics.jsonl rewritten atomically
    "parallel": set(),
    "engine": set(),  # vLLM engine and its counters: below data and evaluate
    "preemption": set(),  # SIGTERM/SIGUSR1 -> checkpoint and exit 0
    # the memory a run will hold, from shapes (pure arithmetic) and what the device has free
    "memory_plan": set(),
    # fetch.py writes the converted real target atomically; a bad model path is a
    # ConfigError naming the key
    "target_model": {"config", "fsutil", "ownership"},
    "optim": {"config"},
    "demo": {"chat_template", "config", "fsutil", "ownership"},
    "data": {"chat_template", "config", "fsutil", "engine", "ownership"},
    "drafts": {"config", "data", "memory_plan", "target_model"},
    "evaluate": {
        "chat_template",
        "config",
        "drafts",
        "engine",
        "fsutil",
        "ownership",
        "target_model",
    },  # needs no training code
    "run_config": {"config", "drafts", "evaluate", "optim"},
    "checkpoint": {"config", "data", "fsutil", "run_config"},
    "model_card": {"drafts", "fsutil", "ownership"},  # an export's README.md (re-recorded)
    "export": {
        *("checkpoint", "drafts", "fsutil", "model_card", "ownership", "run_config"),
        "target_model",
    },
    # which target a run loads and where its features come from (online or a cache)
    "features": {"data", "drafts", "fsutil", "parallel", "run_config", "target_model"},
    # what train.output_dir may hold (exports and eval reports beside the run), and the run's
    # config.yaml
    "run_dir": {"checkpoint", "config", "evaluate", "export", "fsutil", "run_config"},
    "acceptance_probe": {"evaluate", "export", "run_config"},  # vLLM AL during training
    # train-draft's memory pre-flight: the plan of a run's components, checked on every rank
    "preflight": {"data", "drafts", "memory_plan", "parallel", "run_config", "target_model"},
    # the Run the loop is set up with: checks, run lock, resume point, components, draft
    # vocabulary, optimizer, metrics sink, acceptance probe
    "train_setup": {
        *("acceptance_probe", "checkpoint", "config", "data", "drafts", "features", "fsutil"),
        *("metrics", "optim", "parallel", "preemption", "preflight", "run_config", "run_dir"),
        "target_model",
    },
    # the loop: imports the Run from train_setup and never calls back into it
    "train": {
        *("checkpoint", "data", "drafts", "metrics", "parallel", "preemption", "run_config"),
        "train_setup",
    },
    # every setting of a schema with its type, default and description (eagle-train settings)
    "settings_reference": set(),
    # run_dir: which checkpoint of a run directory export-draft writes
    "cli": {
        *("config", "data", "demo", "evaluate", "export", "features", "fsutil"),
        *("model_card", "preemption", "run_config", "run_dir", "settings_reference"),
        *("target_model", "train"),
    },
}


DATA_FLOW_PAGE = PACKAGE.parent / "docs" / "data-flow.md"
LEVELS_MARK = "<!-- levels: generated from ALLOWED by python tests/repo/test_layering.py -->"


def levels(allowed: dict[str, set[str]]) -> list[list[str]]:
    """The rooms by level: a room's level is one more than the highest level it imports
    (0: it imports no other room), so each room imports only rooms of earlier levels."""
    level: dict[str, int] = {}

    def of(room: str) -> int:
        if room not in level:
            level[room] = 1 + max((of(dst) for dst in allowed[room]), default=-1)
        return level[room]

    for room in allowed:
        of(room)
    return [sorted(r for r in allowed if level[r] == n) for n in range(max(level.values()) + 1)]


def levels_block(allowed: dict[str, set[str]]) -> str:
    """The fenced block docs/data-flow.md shows: each level, each room with what it imports."""
    found = levels(allowed)
    width = max(len(r) for r in allowed)
    lines = ["level 0   " + ", ".join(found[0]) + "   (no project imports)"]
    for n, rooms in enumerate(found[1:], start=1):
        for i, room in enumerate(rooms):
            head = f"level {n:<2}  {room.ljust(width)}  imports " if i == 0 else ""
            head = head or f"{'':10}{room.ljust(width)}  imports "
            lines += textwrap.wrap(
                ", ".join(sorted(allowed[room])),
                width=95,
                initial_indent=head,
                subsequent_indent=" " * len(head),
            )
    return "```\n" + "\n".join(lines) + "\n```"


def room_of(module: str) -> str:
    """``eagle_train.data.loader`` -> ``data``; ``eagle_train`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "eagle_train":  # from eagle_train import data
                out.update(f"eagle_train.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return {m for m in out if m == "eagle_train" or m.startswith("eagle_train.")}


def arrows() -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the files that draw that arrow."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        src = "__init__" if rel == Path("__init__.py") else rel.with_suffix("").parts[0]
        for module in imported_modules(path):
            dst = room_of(module)
            if dst not in (src, "__init__", "errors"):
                found.setdefault((src, dst), []).append(str(rel))
    return found


def test_rooms_import_only_downward() -> None:
    bad = []
    for (src, dst), files in sorted(arrows().items()):
        if src not in ALLOWED:
            bad.append(f"{src} is not a declared room (add it to ALLOWED): {files}")
        elif dst not in ALLOWED[src]:
            bad.append(f"{src} -> {dst} is not allowed: {', '.join(files)}")
    assert not bad, "\n".join(bad)


def test_every_allowance_is_used() -> None:
    """An arrow no import draws is stale: it lets a later import up the pipeline pass
    unnoticed, and the table no longer says how the rooms depend on each other."""
    used = set(arrows())
    unused = [
        f"{src} -> {dst}"
        for src, dsts in ALLOWED.items()
        for dst in sorted(dsts)
        if (src, dst) not in used
    ]
    assert not unused, "allowed but no import uses it (remove it from ALLOWED): " + ", ".join(
        unused
    )


def test_declared_layers_have_no_cycle() -> None:
    try:
        order = list(TopologicalSorter(ALLOWED).static_order())
    except CycleError as exc:
        raise AssertionError(f"the allowed arrows form a cycle: {exc.args[1]}") from exc
    assert order.index("engine") < order.index("data") < order.index("drafts")
    assert order.index("engine") < order.index("evaluate") < order.index("run_config")


def test_levels_put_every_room_below_what_it_imports() -> None:
    allowed = {"c": {"a", "b"}, "b": {"a"}, "a": set(), "d": {"a"}}
    assert levels(allowed) == [["a"], ["b", "d"], ["c"]]
    level = {room: n for n, rooms in enumerate(levels(ALLOWED)) for room in rooms}
    assert level.keys() == ALLOWED.keys()
    assert all(level[dst] < level[src] for src, dsts in ALLOWED.items() for dst in dsts)


def test_the_data_flow_page_shows_these_levels() -> None:
    """docs/data-flow.md quotes the levels computed from ALLOWED (regenerate the block with
    ``python tests/repo/test_layering.py``)."""
    page = DATA_FLOW_PAGE.read_text()
    assert LEVELS_MARK in page, f"{DATA_FLOW_PAGE.name} lost its marker {LEVELS_MARK}"
    block = page.split(LEVELS_MARK, 1)[1].lstrip("\n")
    shown = block[: block.index("\n```", 3) + 4]
    assert shown == levels_block(ALLOWED), "docs/data-flow.md's levels differ from ALLOWED:\n" + (
        levels_block(ALLOWED)
    )


def module_graph() -> dict[str, set[str]]:
    """Each module of the package (``eagle_train.data.backends``; a package by its own name)
    and the package modules it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        graph[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = imported_modules(path)
    return {name: {m for m in found if m in graph and m != name} for name, found in graph.items()}


def test_modules_import_each_other_in_one_direction() -> None:
    """Inside a room too: two modules that import each other (once data/backends.py and
    data/engines.py, the second lazily) cannot be read or tested one without the other."""
    try:
        list(TopologicalSorter(module_graph()).static_order())
    except CycleError as exc:
        raise AssertionError(f"modules import each other: {' -> '.join(exc.args[1])}") from exc


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from eagle_train.drafts.base import StepResult\n")
    assert imported_modules(source) == {"eagle_train.drafts.base"}


def test_the_package_never_imports_the_lab() -> None:
    """benchmarks/ and research/ sit beside the package: their scripts import each other as
    plain modules (``from benchlib import ...``), and a package module that did the same would
    work in a checkout and break in an install."""
    lab = {
        p.stem
        for folder in ("benchmarks", "research")
        for p in (PACKAGE.parent / folder).glob("*.py")
    }
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] in lab]
    assert lab and not bad, "\n".join(bad)


if __name__ == "__main__":  # the block docs/data-flow.md shows under LEVELS_MARK
    print(levels_block(ALLOWED))
