"""The draft algorithms, by name: one folder under drafts/ and one line here each."""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Union

from pydantic import Field

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.eagle3.spec import Eagle3Spec

DRAFTS: MappingProxyType[str, DraftSpec] = MappingProxyType({
    "eagle3": Eagle3Spec(),
})


def get_draft(name: str) -> DraftSpec:
    if name not in DRAFTS:
        raise ValueError(f"unknown draft algorithm {name!r}; known: {sorted(DRAFTS)}")
    return DRAFTS[name]


_configs = tuple(spec.config_cls for spec in DRAFTS.values())
# The `draft:` section of a run config: the algorithm's own config, picked by `algorithm`.
DraftConfig = (
    _configs[0] if len(_configs) == 1
    else Annotated[Union[_configs], Field(discriminator="algorithm")]  # noqa: UP007
)
