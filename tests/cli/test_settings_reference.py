"""Every setting describes itself in its schema (the docstring under its field), and the CLI
shows it: ``eagle-train settings [SECTION]`` lists a command's settings with type, default and
meaning, ``--print-config`` prints a run's fully resolved config, and docs/settings.md is
written from the same source."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from eagle_train.cli import app, config_schemas
from eagle_train.config import StrictModel, load_config
from eagle_train.drafts.registry import DRAFTS  # noqa: F401 (imports every draft's config)
from eagle_train.run_config import RunConfig
from eagle_train.settings_reference import list_settings, to_markdown

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "settings.md"


def reachable(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[type]:
    """``model`` and every schema its fields hold (nested, in lists, in unions)."""
    seen = set() if seen is None else seen
    if model in seen:
        return seen
    seen.add(model)

    def walk(annotation: object) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            reachable(annotation, seen)
        for arg in typing.get_args(annotation):
            walk(arg)

    for field in model.model_fields.values():
        walk(field.annotation)
    return seen


def undescribed(models: set[type]) -> list[str]:
    return sorted(
        f"{m.__module__}.{m.__qualname__}.{name}"
        for m in models
        for name, field in m.model_fields.items()
        if not (field.description or "").strip()
    )


def every_strict_model() -> set[type]:
    found: set[type] = set()
    todo = [StrictModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("eagle_train.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_field_of_every_schema_has_a_description() -> None:
    schemas = set().union(*(reachable(s) for s in config_schemas().values()))
    assert RunConfig in schemas and len(schemas) >= 20
    bases = {base for m in schemas for base in m.__mro__}  # DraftConfigBase, Sampling, ...
    orphans = every_strict_model() - schemas - bases
    assert not orphans, "a schema no command reads: " + ", ".join(m.__qualname__ for m in orphans)
    missing = undescribed(schemas | every_strict_model())
    assert not missing, "fields without a description (a docstring under the field):\n" + (
        "\n".join(missing)
    )


def test_the_check_sees_a_field_without_a_description() -> None:
    class Inner(StrictModel):
        size: int = 3
        """Described."""
        bare: int = 1

    class Outer(StrictModel):
        inner: list[Inner] | None = None
        """Described too."""

    assert undescribed(reachable(Outer)) == [f"{__name__}.{Inner.__qualname__}.bare"]


def test_settings_lists_a_section_with_type_default_and_meaning() -> None:
    result = CliRunner().invoke(app, ["settings", "optim"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "optim: section"
    assert "optim.lr: float = 0.0001" in lines
    assert "optim.warmup_steps: int = 0" in lines
    assert any("Peak learning rate" in line for line in lines)
    assert not any(line.startswith(("train.", "data.")) for line in lines)
    draft = CliRunner().invoke(app, ["settings", "draft.ttt_steps"]).output
    assert "[draft.algorithm=eagle3]" in draft and "draft.ttt_steps: int = 7" in draft
    data = CliRunner().invoke(app, ["settings", "synthesize", "--command", "prepare-data"])
    assert "synthesize.num_prompts: int = 256" in data.output


def test_settings_refuses_an_unknown_section_or_command() -> None:
    result = CliRunner().invoke(app, ["settings", "optimizer"])
    assert result.exit_code == 2
    assert "train-draft has no setting 'optimizer'; its sections and keys: target" in result.output
    result = CliRunner().invoke(app, ["settings", "--command", "export-draft"])
    assert result.exit_code == 2 and "expected one of train-draft" in result.output


def test_the_settings_page_is_up_to_date() -> None:
    """docs/settings.md is what `eagle-train settings --markdown` writes (rewrite it with
    `eagle-train settings --markdown > docs/settings.md`)."""
    expected = to_markdown(config_schemas())
    assert PAGE.read_text() == expected, "docs/settings.md is stale: rewrite it (see docstring)"
    result = CliRunner().invoke(app, ["settings", "--markdown"])
    assert result.output == expected
    for row in list_settings(RunConfig):
        assert f"| `{row.key}` |" in expected or f"### `{row.key}`" in expected


def test_print_config_shows_every_default_and_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    sets = ["--set", "target.path=t", "--set", "data.train=d", "--set", f"train.output_dir={out}"]
    result = CliRunner().invoke(app, ["train-draft", "-c", str(config), *sets, "--print-config"])
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.output)
    given = yaml.safe_load(config.read_text())
    assert "eps" not in given["optim"] and printed["optim"]["eps"] == 1e-8  # a default
    assert printed["train"]["acceptance"]["num_prompts"] == 16  # a nested default
    assert printed["target"]["path"] == "t"  # an override
    resolved = load_config(RunConfig, config, [s for s in sets if s != "--set"])
    assert RunConfig.model_validate(printed) == resolved
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "args", "key"),
    [
        ("prepare-data", ["-c", "configs/data/demo.yaml"], "regenerate"),
        ("eval-acceptance", ["--target", "t", "--draft", "ngram"], "round_size"),
        ("build-demo-world", ["-c", "configs/demo/default.yaml"], "pretrain"),
        ("prepare-features", ["-c", "configs/train/dflash-llama-demo.yaml"], "draft"),
    ],
)
def test_every_command_with_a_config_prints_it(command: str, args: list[str], key: str) -> None:
    sets = ["--set", "target.path=t", "--set", "data.train=d"] if command.endswith("es") else []
    result = CliRunner().invoke(
        app,
        [
            command,
            *[str(REPO / a) if a.startswith("configs") else a for a in args],
            *sets,
            "--print-config",
        ],  # fmt: skip
    )
    assert result.exit_code == 0, result.output
    assert key in yaml.safe_load(result.output)
