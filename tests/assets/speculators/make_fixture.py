"""Make the speculators-format EAGLE-3 fixture with speculators' own code (not eagle-train's).

speculators 0.9.0 runs in eagle-train's environment from a folder of its own (as
../drafters/make_drafters.py installs it; its own dependencies would move torch):

    python -m pip install --target SITE --no-deps speculators==0.9.0 hs-connectors==0.9.0 \
        loguru==0.7.3
    # the wide tests' world (the test suite's `wide_world`), built with eagle-train's env:
    PYTHONPATH=$PWD .venv/bin/python -c "from pathlib import Path; \
      from eagle_train.config import load_config; \
      from eagle_train.demo.build import DemoConfig, build_demo_world; \
      build_demo_world(load_config(DemoConfig, Path('configs/demo/tiny.yaml'), \
      ['reserved_ids=32512']), Path('/tmp/warm25world'))"
    PYTHONPATH=SITE:$PWD .venv/bin/python tests/assets/speculators/make_fixture.py /tmp/warm25world

It writes eagle3-llama-tiny/ (config.json + model.safetensors via save_pretrained): an EAGLE-3
drafter (one decoder layer) for the tiny Llama target (hidden 64, 4 layers, the vocabulary its
config says: 33,024 ids) with aux layers [1, 2, 3], a 128-token draft vocabulary (d2t/t2d)
drawn from the ids the world's tokenizer produces (both sides of 32,767; not its reserved
ones) and every weight drawn at random (seeded), so that a tensor loaded under the wrong name
changes the loss. Rebuild it whenever the wide world changes its vocabulary.
"""

import json
import sys
from pathlib import Path

import torch
from speculators.models.eagle3.core import Eagle3DraftModel
from transformers import AutoConfig

world = Path(sys.argv[1])
verifier = world / "targets" / "llama" / "fp32"
out = Path(__file__).resolve().parent / "eagle3-llama-tiny"

torch.manual_seed(0)
vocab, draft_vocab = AutoConfig.from_pretrained(verifier).vocab_size, 128
pieces = json.loads((verifier / "tokenizer.json").read_text())["model"]["vocab"]
produced = torch.tensor(sorted(i for p, i in pieces.items() if not p.startswith("<|reserved_")))
ids = torch.sort(produced[torch.randperm(len(produced))[:draft_vocab]]).values
d2t = ids - torch.arange(draft_vocab)
t2d = torch.zeros(vocab, dtype=torch.bool)
t2d[ids] = True

layer_config = AutoConfig.from_pretrained(verifier)
layer_config.num_hidden_layers = 1  # the draft's decoder layers (speculators' --num-layers)
model = Eagle3DraftModel.from_training_args(
    layer_config,
    t2d=t2d,
    d2t=d2t,
    draft_vocab_size=draft_vocab,
    norm_before_residual=False,
    target_layer_ids=[1, 2, 3],
    ttt_steps=3,
    # a name, not this machine's path: a path that exists on the machine running the tests
    # would be compared with the tests' target (evaluate/drafter.py: other_target)
    verifier_name_or_path="eagle-train-tests/tiny-world-llama-fp32",
    draft_attn_impl="sdpa",
)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.startswith(("verifier_", "embed_tokens")):
            continue
        p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0))
model.save_pretrained(out)
# save_pretrained also copies speculators' config class (auto_map, for trust_remote_code);
# neither vLLM nor eagle-train reads it.
(out / "config.py").unlink()
print("wrote", out, sorted(p.name for p in out.iterdir()))
