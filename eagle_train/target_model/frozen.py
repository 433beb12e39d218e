"""The frozen target: any HF causal LM, bf16, eval, no grads; hidden states in one forward.

Layer ids use the "after k layers" convention (HF ``output_hidden_states[k]``; k=0 is the
embedding output, k<L is before the final norm), the convention vLLM's drafter configs use.
Only the requested layers are captured (forward hooks), not all L+1 hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PretrainedConfig,
    PreTrainedModel,
)

from eagle_train.config import ConfigError
from eagle_train.target_model.description import TargetDescription, describe_target
from eagle_train.target_model.location import check_weights, from_pretrained


@dataclass
class TargetFeatures:
    """What the target computed for a batch. The logits are the head applied to ``final``,
    computed when a loss first asks for them; a draft with its own vocabulary asks only for
    the target's greedy tokens and the logits of its vocabulary's rows (``logits_of``), which
    cost a fraction of the full vocabulary's when a feature cache stored the greedy tokens."""

    aux: Tensor  # (B, T, n*H) hidden after each requested layer count, concatenated in order
    final: Tensor  # (B, T, H) last hidden state after the final norm
    head: nn.Module  # the target's output head (frozen)
    stored_greedy: Tensor | None = None  # (B, T) the target's argmax, from a feature cache

    @cached_property
    def logits(self) -> Tensor:
        """(B, T, V) the target's next-token logits."""
        return self.head(self.final)

    @cached_property
    def greedy(self) -> Tensor:
        """(B, T) the target's greedy next token (the first of tied maxima)."""
        if self.stored_greedy is not None:
            return self.stored_greedy.long()
        if "logits" in self.__dict__:
            return self.logits.max(-1).indices  # argmax's result; 4x faster on bf16 CPU
        return chunked_argmax(self.final, self.head)

    def logits_of(self, ids: Tensor) -> Tensor:
        """(B, T, len(ids)) the logits of the target tokens ``ids``: their rows of the head
        alone when the greedy tokens are stored, else a slice of the full logits."""
        if self.stored_greedy is None or "logits" in self.__dict__:
            return self.logits[..., ids]
        bias = getattr(self.head, "bias", None)
        return F.linear(self.final, self.head.weight[ids], None if bias is None else bias[ids])


# Rows of the head computed at once by ``chunked_argmax``: about 32 MiB of fp32 logits.
_ARGMAX_CHUNK_ELEMENTS = 2**23


def matmul_upcasts(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``matmul_weight`` copies a head of ``dtype`` on ``device_type`` to fp32 (the
    memory pre-flight counts that copy)."""
    return device_type == "cpu" and dtype in (torch.bfloat16, torch.float16)


def matmul_weight(weight: Tensor) -> Tensor:
    """The head weight a logits matmul should use: on CPU a half-precision one in fp32 (its
    products are exact in fp32, and torch's bf16 matmul is ~10x slower on CPUs without bf16
    units), rounded back by ``head_logits``; elsewhere ``weight`` itself."""
    if matmul_upcasts(weight.device.type, weight.dtype):
        return weight.float()
    return weight


def head_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``hidden @ weight.T + bias`` rounded to the head's ``dtype`` (what the head module
    computes), ``weight`` from ``matmul_weight``."""
    out = F.linear(hidden.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype))
    return out.to(dtype)


def chunked_argmax(hidden: Tensor, head: nn.Module) -> Tensor:
    """(..., H) -> (...) the head's argmax over the whole vocabulary (the first of tied
    maxima), a chunk of rows at a time: the [tokens, vocabulary] logits never exist whole."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    weight = head.weight
    matmul = matmul_weight(weight)
    bias = getattr(head, "bias", None)
    rows = max(1, _ARGMAX_CHUNK_ELEMENTS // max(int(weight.shape[0]), 1))
    out = [
        head_logits(flat[s : s + rows], matmul, bias, weight.dtype).max(-1).indices
        for s in range(0, flat.shape[0], rows)
    ]
    if not out:
        return torch.zeros(hidden.shape[:-1], dtype=torch.long, device=hidden.device)
    return torch.cat(out).view(hidden.shape[:-1])


class FrozenTarget(nn.Module):
    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.bfloat16,
        device: str = "cpu",
        key: str = "target.path",
    ) -> FrozenTarget:
        # Load straight onto the device: a large target should not pass through host memory.
        # A multimodal checkpoint (text model nested under text_config) loads whole; the
        # draft reads only its text decoder.
        config = from_pretrained(AutoConfig, path, key)
        check_weights(path, key)
        auto: Any = AutoModelForCausalLM
        if type(config) not in AutoModelForCausalLM._model_mapping:
            auto = AutoModelForImageTextToText
        model = from_pretrained(auto, path, key, dtype=dtype, device_map=device)
        return cls(model)

    @property
    def description(self) -> TargetDescription:
        return describe_target(self.config, self.model.name_or_path)

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.description.num_layers

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def _decoder(self) -> nn.Module:
        return self.model.get_decoder()

    def check_layer_ids(self, layer_ids: list[int]) -> None:
        bad = [k for k in layer_ids if not 0 <= k <= self.num_layers]
        if bad:
            raise ConfigError(
                f"draft.aux_layer_ids: layer ids {bad} out of range: the target has {self.num_layers} layers, "
                f"ids count layers run (0 = embeddings .. {self.num_layers})"
            )

    @torch.no_grad()
    def features(
        self, input_ids: Tensor, attention_mask: Tensor | None, layer_ids: list[int]
    ) -> TargetFeatures:
        self.check_layer_ids(layer_ids)
        captured: dict[int, Tensor] = {}
        hooks = []
        decoder = self._decoder()
        for k in sorted(set(layer_ids)):
            module = decoder.embed_tokens if k == 0 else decoder.layers[k - 1]
            hooks.append(module.register_forward_hook(_capture(captured, k)))
        try:
            out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()
        final = out.last_hidden_state
        # No layer ids (a draft that reads only the final hidden): an empty (B, T, 0) aux.
        aux = torch.cat([captured[k] for k in layer_ids], dim=-1) if layer_ids else final[..., :0]
        return TargetFeatures(aux=aux, final=final, head=self.lm_head())


def _capture(store: dict[int, Tensor], key: int):
    def hook(module: nn.Module, args: object, output: Tensor | tuple) -> None:
        store[key] = output[0] if isinstance(output, tuple) else output

    return hook
