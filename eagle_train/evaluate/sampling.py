"""Sampled decoding in vLLM: the request's sampling parameters, its seed, the report's label.

Every request carries its own seed, derived from the run's ``seed``, the prompt's id and the
turn (not from its position in the run), so the same prompt draws the same tokens on every
engine of a run, in every rerun with the same settings, and whatever ``num_prompts`` cuts.
"""

from __future__ import annotations

import hashlib
from typing import Any

from eagle_train.evaluate.settings import Sampling


def request_seed(seed: int, prompt_id: str, turn: int) -> int:
    """A stable 31-bit seed of (run seed, prompt id, turn): no dependence on Python's
    per-process string hash, the platform or the order of requests."""
    digest = hashlib.blake2b(f"{seed}\0{prompt_id}\0{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


def sampling_params(
    sampling: Sampling, max_tokens: int, ignore_eos: bool, seed: int | None = None
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keywords: greedy at temperature 0, else the sampled settings
    with ``seed`` (a request's own, ``request_seed``)."""
    params: dict[str, Any] = dict(max_tokens=max_tokens, ignore_eos=ignore_eos)
    if sampling.temperature == 0:
        return {**params, "temperature": 0.0}
    return {
        **params,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k or 0,  # vLLM: 0 is off
        "seed": seed,
    }


def label(sampling: Sampling) -> str:
    """How the requests were decoded, for the report's heading."""
    if sampling.temperature == 0:
        return "greedy (temperature 0)"
    parts = [f"temperature {sampling.temperature:g}"]
    if sampling.top_p != 1.0:
        parts.append(f"top_p {sampling.top_p:g}")
    if sampling.top_k is not None:
        parts.append(f"top_k {sampling.top_k}")
    return f"sampled ({', '.join(parts)}; seed {sampling.seed}, one seed per request)"
