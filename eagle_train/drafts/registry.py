"""The draft algorithms, by name: one folder under drafts/ and one line here each."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.dflash.spec import DFlashSpec
from eagle_train.drafts.dspark.spec import DSparkSpec
from eagle_train.drafts.eagle1.spec import Eagle1Spec
from eagle_train.drafts.eagle3.spec import Eagle3Spec
from eagle_train.drafts.peagle.spec import PEagleSpec
from eagle_train.target_model import TargetDescription, TargetError
from eagle_train.target_model.description import architectures_with

DRAFTS: MappingProxyType[str, DraftSpec] = MappingProxyType(
    {
        "eagle1": Eagle1Spec(),
        "eagle3": Eagle3Spec(),
        "peagle": PEagleSpec(),
        "dflash": DFlashSpec(),
        "dspark": DSparkSpec(),
    }
)


def get_draft(name: str) -> DraftSpec:
    if name not in DRAFTS:
        raise ValueError(f"unknown draft algorithm {name!r}; known: {sorted(DRAFTS)}")
    return DRAFTS[name]


def served_methods(target: TargetDescription) -> list[str]:
    """The vLLM speculative methods that serve this project's drafts next to ``target``."""
    return sorted({s.vllm_method for s in DRAFTS.values() if target.serves(s.target_needs)})


def check_servable(spec: DraftSpec, target: TargetDescription) -> None:
    """Raise TargetError when vLLM cannot serve ``spec``'s drafter next to ``target``: before
    any training, naming the architectures that can and what this target can serve."""
    if target.serves(spec.target_needs):
        return
    can = ", ".join(architectures_with(spec.target_needs))
    here = ", ".join(served_methods(target)) or "none"
    raise TargetError(
        f"vLLM cannot serve a {spec.name!r} draft (method {spec.vllm_method!r}) next to "
        f"target {target.name_or_path or '?'} ({target.architecture}): the drafter needs the "
        f"target's {spec.target_needs.replace('_', ' ')}, which vLLM provides for: {can}. "
        f"Methods this target can serve: {here}"
    )


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
