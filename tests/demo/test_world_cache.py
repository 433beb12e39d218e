"""The stored tiny world (tests/world_cache.py): keyed by config and builder source, built
atomically once when two processes race, and each session's copy cannot touch the store."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import world_cache

REPO = Path(__file__).resolve().parents[2]


def test_the_key_covers_the_builders_sources_transitively() -> None:
    names = {str(p.relative_to(REPO)) for p in world_cache.builder_sources()}
    # demo/ itself, and what it imports from outside demo/ (hand-checked from the imports)
    assert {"eagle_train/demo/build.py", "eagle_train/demo/targets.py"} <= names
    assert {"eagle_train/fsutil.py", "eagle_train/config.py"} <= names
    assert "eagle_train/train.py" not in names  # the trainer does not build the world


def test_a_change_to_config_or_source_changes_the_key(monkeypatch, tmp_path) -> None:
    source = tmp_path / "builder.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(world_cache, "REPO", tmp_path)
    monkeypatch.setattr(world_cache, "builder_sources", lambda: [source])
    base = world_cache.world_key({"seed": 0})
    assert world_cache.world_key({"seed": 0}) == base
    assert world_cache.world_key({"seed": 1}) != base
    source.write_text("x = 2\n")
    assert world_cache.world_key({"seed": 0}) != base


def test_racing_builders_publish_one_whole_entry(monkeypatch, tmp_path) -> None:
    import eagle_train.demo.build as build

    monkeypatch.setenv("EAGLE_TRAIN_TEST_CACHE", str(tmp_path / "cache"))
    both_inside = threading.Barrier(2)
    builds = []

    def fake_build(cfg, out):  # both processes build before either publishes
        out.mkdir(parents=True)
        both_inside.wait(timeout=30)
        (out / "world.json").write_text(f"{threading.get_ident()}\n")
        builds.append(out)

    monkeypatch.setattr(build, "build_demo_world", fake_build)
    config = REPO / "configs" / "demo" / "tiny.yaml"
    got: list[Path] = []
    threads = [
        threading.Thread(target=lambda: got.append(world_cache.stored_world(config)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 2 and len(got) == 2 and got[0] == got[1]
    entries = list((tmp_path / "cache" / "tiny-worlds").iterdir())
    assert entries == [got[0]]  # no temporary left behind
    assert (got[0] / "world.json").read_text().strip().isdigit()
    # a later session finds it and builds nothing
    assert world_cache.stored_world(config) == got[0] and len(builds) == 2
    # the session's copy is its own: writing there leaves the store as it was
    copy = world_cache.world_copy(config, tmp_path / "copy")
    (copy / "world.json").write_text("changed\n")
    assert (got[0] / "world.json").read_text() != "changed\n"
    with pytest.raises(PermissionError) if _modes_bind() else _nothing():
        (got[0] / "new").write_text("x")


def _modes_bind() -> bool:
    import os

    return os.geteuid() != 0  # root ignores file modes; the copy protects the store then


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False
