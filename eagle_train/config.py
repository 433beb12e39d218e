"""Typed configuration: strict pydantic models, YAML files, ``--set a.b=c`` overrides.

Every config section is a ``StrictModel`` (unknown keys are errors). ``load_config`` reads a
YAML file, applies overrides and validates; a bad key or value raises ``ConfigError`` naming
the file, the line, the dotted key and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from eagle_train.errors import UserError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, fields are validated on set,
    and no number is inf or nan (``lr=inf`` would train to NaN after one step)."""

    # Every field's description is the docstring under it (use_attribute_docstrings): what
    # eagle-train settings, --print-config and docs/settings.md show (docs/training.md).
    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,
    )


class ConfigError(UserError, ValueError):
    """A user mistake in a config file or an override."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key repeated in one mapping is an error (the
    plain loader silently keeps the last value, so a duplicated section loses settings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"optim.lr=3e-4"`` -> ``(["optim", "lr"], 3e-4)``; the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. optim.lr=3e-4"
        )
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: value is not valid YAML: {exc}") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``a.b=c`` override set (creating sections as needed)."""
    out = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def load_config(
    model: type[M], path: str | Path | None = None, overrides: list[str] | None = None
) -> M:
    """Read ``path`` (YAML, optional), apply ``overrides``, validate into ``model``."""
    data: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    source = "<overrides>"
    if path is not None:
        source = str(path)
        data, lines = read_yaml(Path(path))
    overrides = list(overrides or [])
    return validate_config(model, apply_overrides(data, overrides), source, lines, overrides)


def validate_config(
    model: type[M],
    data: dict[str, Any],
    source: str,
    lines: dict[tuple[str, ...], int],
    overrides: list[str] | None = None,
) -> M:
    """``data`` (read from ``source``, keys at ``lines``) validated into ``model``; an error is
    one ConfigError naming the file, line (or override) and key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        overridden = {tuple(parse_override(text)[0]): text for text in overrides or []}
        raise ConfigError(format_validation_error(exc, source, lines, overridden, data)) from None


class SettingError(UserError, ValueError):
    """A validator's error about one key below the field it checks (``key`` relative to it):
    reported at that key, its line and its --set, not at the whole section. A ValueError, so
    pydantic reports it as a validation error of that field."""

    def __init__(self, key: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.key = key


def refuse_moved_key(data: Any, key: str, message: str) -> Any:
    """For a ``mode="before"`` validator: ``data`` as it is, or ``ValueError(message)`` when
    it holds ``key``, a key that has no effect in this section (``message`` says why)."""
    if isinstance(data, dict) and key in data:
        raise ValueError(message)
    return data


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Parse a YAML mapping and remember the line of every key (for error messages)."""
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a YAML text file (byte {exc.start} is not UTF-8)") from None
    try:
        node = yaml.compose(text)
        data = _load_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    lines: dict[tuple[str, ...], int] = {}
    _collect_lines(node, (), lines)
    return data, lines


def format_validation_error(
    exc: ValidationError,
    source: str,
    lines: dict[tuple[str, ...], int],
    overridden: dict[tuple[str, ...], str] | None = None,
    data: Any = None,
) -> str:
    """One line per error: where it came from (file:line or the --set), key, expectation."""
    messages = []
    for err in exc.errors():
        loc = _strip_union_tags(tuple(str(p) for p in err["loc"]), data, err["type"] == "missing")
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, SettingError):
            loc += cause.key
            err = {**err, "msg": str(cause), "input": _value_at(data, loc)}
        key = ".".join(loc) or "<root>"
        line = _nearest_line(loc, lines)
        where = f"{source}:{line}" if line else source
        for path, text in (overridden or {}).items():
            # The --set made the key, or an unknown section it created (``foo.bar=1`` is
            # reported at ``foo``).
            if loc[: len(path)] == path or path[: len(loc)] == loc:
                where = f"--set {text!r}"
        if err["type"] == "extra_forbidden":
            messages.append(f"{where}: unknown key {key!r}")
        elif err["type"] == "missing":
            messages.append(f"{where}: missing required key {key!r}")
        else:
            got = err.get("input")
            messages.append(f"{where}: key {key!r}: {err['msg']} (got {got!r})")
    return "invalid config:\n  " + "\n  ".join(messages)


def _strip_union_tags(loc: tuple[str, ...], data: Any, missing: bool = False) -> tuple[str, ...]:
    """Drop the tags pydantic inserts into the location of an error inside a discriminated
    union (``draft.<tag>.block_size`` -> ``draft.block_size``, the key the user wrote;
    ``draft.<tag>`` -> ``draft`` for the section's own validator): a part that is not a key
    of the input at that point (the last one is, unless the error is that it is missing)."""
    out: list[str] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part not in node and (i < len(loc) - 1 or not missing):
            continue
        out.append(part)
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            node = None
    return tuple(out)


def _value_at(data: Any, loc: tuple[str, ...]) -> Any:
    for part in loc:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _nearest_line(loc: tuple[str, ...], lines: dict[tuple[str, ...], int]) -> int | None:
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def _collect_lines(node: Any, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = prefix + (str(key_node.value),)
            out[key] = key_node.start_mark.line + 1
            _collect_lines(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[prefix + (str(i),)] = item.start_mark.line + 1
            _collect_lines(item, prefix + (str(i),), out)


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """Write a resolved config as YAML (round-trips through ``load_config``)."""
    Path(path).write_text(config_text(cfg))


def config_text(cfg: BaseModel) -> str:
    """A resolved config as the YAML text ``dump_config`` writes."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
