"""The draft algorithms, by name: one folder under drafts/ and one line here each."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.dflash.spec import DFlashSpec
from eagle_train.drafts.eagle1.spec import Eagle1Spec
from eagle_train.drafts.eagle3.spec import Eagle3Spec
from eagle_train.drafts.peagle.spec import PEagleSpec

DRAFTS: MappingProxyType[str, DraftSpec] = MappingProxyType(
    {
        "eagle1": Eagle1Spec(),
        "eagle3": Eagle3Spec(),
        "peagle": PEagleSpec(),
        "dflash": DFlashSpec(),
    }
)


def get_draft(name: str) -> DraftSpec:
    if name not in DRAFTS:
        raise ValueError(f"unknown draft algorithm {name!r}; known: {sorted(DRAFTS)}")
    return DRAFTS[name]


def identify_drafter(config: dict[str, Any], method: str | None = None) -> DraftSpec:
    """The spec of a drafter directory's format: by its recorded serving method when given,
    else by recognising its config.json."""
    if method is not None:
        found = [s for s in DRAFTS.values() if s.vllm_method == method and s.recognizes(config)]
        found = found or [s for s in DRAFTS.values() if s.vllm_method == method]
    else:
        found = [s for s in DRAFTS.values() if s.recognizes(config)]
    if len(found) != 1:
        known = ", ".join(sorted(s.vllm_method for s in DRAFTS.values()))
        raise ValueError(
            f"unknown drafter method (method {method!r}, architectures "
            f"{config.get('architectures')}); this version validates and serves: {known}"
        )
    return found[0]


_configs = tuple(spec.config_cls for spec in DRAFTS.values())
# The `draft:` section of a run config: the algorithm's own config, picked by `algorithm`.
if TYPE_CHECKING:  # a union built at run time from the registry: any one algorithm's config
    DraftConfig = Any
else:
    DraftConfig = (
        _configs[0]
        if len(_configs) == 1
        else Annotated[Union[_configs], Field(discriminator="algorithm")]  # noqa: UP007
    )
