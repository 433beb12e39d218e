"""Config loading: every shipped YAML validates; bad keys and values name file, line, key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from eagle_train.config import ConfigError, StrictModel, apply_overrides, load_config
from eagle_train.data.config import PrepareDataConfig
from eagle_train.demo.build import DemoConfig
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
# Which model validates the YAML files of each folder under configs/.
CONFIG_KINDS: dict[str, type[StrictModel]] = {
    "demo": DemoConfig,
    "data": PrepareDataConfig,
    "train": RunConfig,
}


def all_config_files() -> list[Path]:
    return sorted((REPO / "configs").rglob("*.yaml")) + sorted((REPO / "configs").rglob("*.yml"))


def test_configs_exist() -> None:
    kinds = {p.relative_to(REPO / "configs").parts[0] for p in all_config_files()}
    assert {"demo", "data"} <= kinds


@pytest.mark.parametrize("path", all_config_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_validates(path: Path) -> None:
    kind = path.relative_to(REPO / "configs").parts[0]
    assert kind in CONFIG_KINDS, f"{path}: no config model registered for folder {kind!r}"
    load_config(CONFIG_KINDS[kind], path)


class Inner(StrictModel):
    lr: float = 1e-3
    steps: int = 10


class Outer(StrictModel):
    name: str = "x"
    optim: Inner = Inner()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_key_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\noptim:\n  lr: 0.1\n  stpes: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(Outer, path)
    assert f"{path}:4" in str(err.value)
    assert "unknown key 'optim.stpes'" in str(err.value)


def test_mistyped_value_names_expected_type(tmp_path: Path) -> None:
    path = write(tmp_path, "optim:\n  steps: many\n")
    with pytest.raises(ConfigError) as err:
        load_config(Outer, path)
    msg = str(err.value)
    assert f"{path}:2" in msg and "'optim.steps'" in msg and "integer" in msg and "'many'" in msg


class Cat(StrictModel):
    kind: Literal["cat"] = "cat"
    lives: int = Field(default=9, ge=1)


class Dog(StrictModel):
    kind: Literal["dog"] = "dog"


class Owner(StrictModel):
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


def test_errors_inside_a_discriminated_union_name_the_written_key(tmp_path: Path) -> None:
    path = write(tmp_path, "pet:\n  kind: cat\n  lives: 0\n  colour: red\n")
    with pytest.raises(ConfigError) as err:
        load_config(Owner, path)
    msg = str(err.value)
    assert f"{path}:3: key 'pet.lives'" in msg and f"{path}:4: unknown key 'pet.colour'" in msg
    with pytest.raises(ConfigError) as err:
        load_config(Owner, write(tmp_path, "pet:\n  kind: cat\n"), ["pet.lives=-1"])
    assert "--set 'pet.lives=-1': key 'pet.lives'" in str(err.value)


def test_overrides_are_typed_and_nested(tmp_path: Path) -> None:
    path = write(tmp_path, "optim:\n  lr: 0.1\n")
    cfg = load_config(Outer, path, ["optim.steps=7", "optim.lr=3e-4", "name=run"])
    assert cfg.optim.steps == 7 and cfg.optim.lr == pytest.approx(3e-4) and cfg.name == "run"


def test_unknown_override_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "optim:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(Outer, path, ["optim.lrr=1"])
    assert "--set 'optim.lrr=1': unknown key 'optim.lrr'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(Outer, path, ["optim.steps=x"])
    assert "--set 'optim.steps=x': key 'optim.steps'" in str(err.value)


@pytest.mark.parametrize("bad", ["optim.lr", "=3", "optim..lr=3"])
def test_malformed_override(bad: str) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_overrides({}, [bad])


def test_override_through_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match="'name' is a value"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Outer, write(tmp_path, "- 1\n- 2\n"))


def test_draft_union_errors_name_the_key_without_the_algorithm_tag(tmp_path: Path) -> None:
    text = (REPO / "configs" / "train" / "peagle-llama-demo.yaml").read_text()
    path = write(tmp_path, text.replace("keep_ratio: 0.8", "keep_ratio: 1.8"))
    line = text.splitlines().index("  keep_ratio: 0.8") + 1
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, path, ["draft.bogus=1"])
    assert f"{path}:{line}: key 'draft.keep_ratio'" in str(err.value)
    assert "--set 'draft.bogus=1': unknown key 'draft.bogus'" in str(err.value)


def test_a_check_across_keys_names_the_key_it_is_about(tmp_path: Path) -> None:
    """A validator that compares two keys reports the one it refuses, at its line in the file
    or on the --set that made it: not at the section (it once read ``key 'draft.peagle'``, then
    ``key 'draft'``), nor at another --set of the same section."""
    text = (REPO / "configs" / "train" / "peagle-llama-demo.yaml").read_text()
    line = text.splitlines().index("  min_keep_ratio: 0.2") + 1
    bad = write(tmp_path, text.replace("min_keep_ratio: 0.2", "min_keep_ratio: 0.9"))
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, bad)
    assert f"{bad}:{line}: key 'draft.min_keep_ratio': must not exceed draft.keep_ratio" in str(
        err.value
    )
    good = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, good, ["draft.min_keep_ratio=0.9", "draft.parallel_steps=2"])
    assert "--set 'draft.min_keep_ratio=0.9': key 'draft.min_keep_ratio': must not" in str(
        err.value
    )
    demo = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    sets = ["target.path=t", "data.train=d", "data.max_tokens_per_batch=512", "data.seed=1"]
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, demo, sets)
    assert "--set 'data.max_tokens_per_batch=512': key 'data.max_tokens_per_batch': " in str(
        err.value
    )
    with pytest.raises(ConfigError) as err:  # from the file, when the --set changed another key
        load_config(RunConfig, demo, ["target.path=t", "data.train=d", "draft.algorithm=eagle1"])
    vocab_line = (
        demo.read_text()
        .splitlines()
        .index(
            "  draft_vocab_size: 1024   # the 1024 most frequent trained tokens (of the target's 2048)"
        )
        + 1
    )
    assert f"{demo}:{vocab_line}: key 'draft.draft_vocab_size': the eagle1 draft has no" in str(
        err.value
    )


def test_an_unknown_section_made_by_a_set_is_blamed_on_the_set(tmp_path: Path) -> None:
    """issue 18: ``--set foo.bar=1`` was reported at the config file, which has no ``foo``."""
    path = write(tmp_path, "name: a\n")
    with pytest.raises(ConfigError) as err:
        load_config(Outer, path, ["foo.bar=1"])
    assert "--set 'foo.bar=1': unknown key 'foo'" in str(err.value)
    assert str(path) not in str(err.value)


def test_a_duplicate_key_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    """issue 18: PyYAML keeps the last of two equal keys, so a second ``optim:`` section
    silently dropped the first one's settings."""
    path = write(tmp_path, "optim:\n  lr: 0.1\nname: a\noptim:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: duplicate key 'optim' \(first at line 1\)"):
        load_config(Outer, path)
    nested = write(tmp_path, "optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r":3: duplicate key 'lr'"):
        load_config(Outer, nested)
