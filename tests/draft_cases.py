"""The cases every draft algorithm gets, derived from the registry
(``eagle_train/drafts/registry.py``): a new algorithm is covered by the guard tests (layout,
export, warm start, speculators format) from its folder and its registry line alone."""

from __future__ import annotations

import re

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.registry import DRAFTS

ALGORITHMS = list(DRAFTS)


def has_field(algorithm: str, name: str) -> bool:
    """Whether the algorithm's draft config has the setting ``name``."""
    return name in DRAFTS[algorithm].config_cls.model_fields


def loss_from_data(algorithm: str) -> bool:
    """Whether the algorithm's ``draft.loss`` defaults to ``auto`` (train-draft resolves it
    from the training data's meta.json: a test building the run config without data sets it)."""
    field = DRAFTS[algorithm].config_cls.model_fields.get("loss")
    return field is not None and field.default == "auto"


def has_speculators_format(spec: DraftSpec) -> bool:
    """Whether vLLM reads a vllm-project/speculators drafter of the algorithm: vLLM has a
    speculators type for every method but "eagle" (EAGLE-1's)."""
    return spec.vllm_method != "eagle"


def name_pattern(name: str) -> str:
    """A registry name as code might spell it: any case, a separator (-, _ or space) allowed
    between any two characters (``eagle3``: EAGLE-3, eagle_3; ``peagle``: P-EAGLE)."""
    return "[-_ ]?".join(re.escape(c) for c in name)


# Any algorithm's name, as the layout test looks for it outside drafts/.
ALGORITHM_NAME = re.compile("|".join(name_pattern(n) for n in DRAFTS), re.IGNORECASE)
