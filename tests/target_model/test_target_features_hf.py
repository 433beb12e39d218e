"""The target's features against transformers' own ``output_hidden_states=True``: aux layer
k is ``hidden_states[k]`` (the "after k layers" convention vLLM's drafter configs use),
concatenated in ascending layer order as vLLM appends them, ``final`` is the last (normed)
hidden state and the logits are the model's own; for every family of the family tests."""

from __future__ import annotations

import pytest
import torch
from target_families import FAMILIES, LAYERS, family_config
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from eagle_train.target_model import FrozenTarget


def _model(family: str):
    auto = AutoModelForImageTextToText if family == "qwen2_5_vl" else AutoModelForCausalLM
    torch.manual_seed(0)
    return auto.from_config(family_config(family)).float().eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_features_are_transformers_hidden_states(family: str) -> None:
    model = _model(family)
    ids = torch.randint(5, 400, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # a right-padded row, as the loader batches them
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    # the aux ids a drafter config may name: 0 (embeddings) .. L-1, in ascending order
    layer_ids = [0, 1, LAYERS - 1]
    got = FrozenTarget(model).features(ids, mask, layer_ids)
    real = mask.bool()
    want_aux = torch.cat([ref.hidden_states[k] for k in layer_ids], dim=-1)
    torch.testing.assert_close(got.aux[real], want_aux[real])
    torch.testing.assert_close(got.final[real], ref.hidden_states[-1][real])
    torch.testing.assert_close(got.logits[real], ref.logits[real])
