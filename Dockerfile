# eagle-train for GPU users: CUDA, torch and vLLM come from the official vLLM image, so the
# drafter you train is served by the same vLLM build that measures it.
#   docker build -t eagle-train .
#   docker run --gpus all --ipc=host -v $PWD/runs:/work/runs eagle-train \
#       build-demo-world runs/demo_world
FROM vllm/vllm-openai:v0.32.0

WORKDIR /opt/eagle-train
COPY pyproject.toml README.md LICENSE ./
COPY eagle_train ./eagle_train
COPY configs ./configs
COPY scripts ./scripts
# torch and vllm are already in the image; install the package and the training extras only.
RUN pip install --no-cache-dir -e ".[gpu,dev]"

ENV HF_HUB_OFFLINE=0 \
    TOKENIZERS_PARALLELISM=false
WORKDIR /work
ENTRYPOINT []
CMD ["bash"]
