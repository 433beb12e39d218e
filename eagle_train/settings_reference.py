"""The settings reference: every setting of a config schema with its dotted key, type,
default and description (the docstring under its field), for ``eagle-train settings``, and
docs/settings.md, which that command writes (``eagle-train settings --markdown``)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Setting:
    """One setting of a config schema, as ``eagle-train settings`` and docs/settings.md show
    it: its dotted key, type, default and description (the docstring under its field)."""

    key: str
    type: str
    default: str
    description: str
    variant: str = ""  # e.g. "draft.algorithm=eagle3" for the members of a tagged union


def list_settings(model: type[BaseModel], prefix: str = "", variant: str = "") -> list[Setting]:
    """Every setting of ``model`` and of the sections nested in it, in field order. A field
    holding a section (a model, or a union of them tagged by a literal field such as
    ``draft.algorithm``) is listed through that section's own fields."""
    rows: list[Setting] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sections = _sections(field.annotation)
        plain = not sections or _has_plain_alternative(field.annotation)
        kind = type_name(field.annotation) if plain else "section"
        default = _default(field) if plain else ""
        description = " ".join((field.description or "").split())
        rows.append(Setting(key, kind, default, description, variant))
        for section in sections:
            tag = _tag(section) if len(sections) > 1 else None
            inner = f"{key}.algorithm={tag}" if tag and name == "draft" else variant
            inner = f"{key}={tag}" if tag and name != "draft" else inner
            sub = f"{key}[]." if _in_list(field.annotation, section) else f"{key}."
            rows += list_settings(section, sub, inner)
    return rows


def type_name(annotation: Any) -> str:
    """``int | None``, ``'cosine' | 'constant'``, ``list[Path]``: as a user writes values."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _sections(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) is Literal:
        return []
    return [m for a in get_args(annotation) for m in _sections(a)]


def _has_plain_alternative(annotation: Any) -> bool:
    """True for ``Path | list[DataSource]``: the field also takes a plain value."""
    if get_origin(annotation) not in (Union, UnionType):
        return False
    return any(not _sections(a) and a is not type(None) for a in get_args(annotation))


def _in_list(annotation: Any, section: type[BaseModel]) -> bool:
    if get_origin(annotation) is list:
        return section in _sections(annotation)
    return any(_in_list(a, section) for a in get_args(annotation))


def _tag(section: type[BaseModel]) -> str | None:
    """The literal value that picks ``section`` out of a tagged union (draft.algorithm)."""
    for field in section.model_fields.values():
        args = get_args(field.annotation)
        if get_origin(field.annotation) is Literal and len(args) == 1:
            return str(args[0])
    return None


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, default=str)


def select(rows: list[Setting], section: str | None) -> list[Setting]:
    """The rows of ``section`` (a key or a dotted prefix: ``optim``, ``train.acceptance``,
    ``draft.ttt_steps``); all rows for None."""
    if section is None:
        return rows
    return [r for r in rows if r.key == section or r.key.startswith((f"{section}.", f"{section}["))]


def to_text(rows: list[Setting]) -> str:
    """``key: type = default`` and the description under it, grouped by variant."""
    out: list[str] = []
    variant = ""
    for row in rows:
        if row.variant != variant:
            variant = row.variant
            out.append(f"\n[{variant}]" if variant else "")
        default = f" = {row.default}" if row.type != "section" else ""
        out.append(f"{row.key}: {row.type}{default}")
        out += textwrap.wrap(row.description, 92, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(out).strip("\n")


def to_markdown(commands: dict[str, type[BaseModel]]) -> str:
    """The settings page: for each schema (the commands that read it) one table per top-level
    section and variant."""
    by_schema: dict[type[BaseModel], list[str]] = {}
    for name, schema in commands.items():
        by_schema.setdefault(schema, []).append(name)
    out = [
        "# Settings",
        "",
        "Every setting of every command that takes `--config FILE.yaml` and `--set key=value`,",
        "with its type, default and meaning, as the schemas themselves describe them (the",
        "docstring under each field). Written by `eagle-train settings --markdown >",
        "docs/settings.md`; `tests/cli/test_settings_reference.py` fails when it is out of date.",
        "`eagle-train settings [SECTION] --command C` prints the same in a terminal, and",
        "`--print-config` on any of these commands prints a run's fully resolved config.",
    ]
    for schema, names in by_schema.items():
        out += ["", f"## {', '.join(f'`{n}`' for n in names)}", ""]
        if schema.__doc__ and schema.__doc__ != BaseModel.__doc__:
            out += [" ".join(schema.__doc__.split()), ""]
        out += _tables(list_settings(schema))
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"


def _tables(rows: list[Setting]) -> list[str]:
    """One table of the schema's own plain settings, then one per section (and variant: one
    per draft.algorithm), each under the section's description."""
    plain = [r for r in rows if _is_top(r.key) and r.type != "section"]
    out = _table(plain) if plain else []
    for section in (r for r in rows if _is_top(r.key) and r.type == "section"):
        inner = [r for r in select(rows, section.key) if r.key != section.key]
        out += ["", f"### `{section.key}`", "", section.description]
        for variant in dict.fromkeys(r.variant for r in inner):
            if variant:
                out += ["", f"#### `{variant}`"]
            out += [""] + _table([r for r in inner if r.variant == variant])
    return out


def _is_top(key: str) -> bool:
    return "." not in key and "[" not in key


def _table(rows: list[Setting]) -> list[str]:
    out = ["| key | type | default | description |", "|---|---|---|---|"]
    for row in rows:
        cells = [f"`{row.key}`", _code(row.type), _code(row.default), row.description]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def _code(text: str) -> str:
    return f"`{text}`" if text else ""
