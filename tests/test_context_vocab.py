"""``draft.context_vocab``: a head row per target token, trained at the cost of a draft
vocabulary. The loss and every gradient against a soft CE written by hand over the full
head's logits at the columns listed by hand (the frequent tokens, the micro-batch's tokens and
the target's greedy tokens inside each row's length), the head a copy of the target's, the
setting refused without its frequent rows, and the CLI from training to an exported
full-vocabulary drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from eagle_train.cli import export_draft_app, train_draft_app
from eagle_train.data.loader import Batch
from eagle_train.data.vocab import COUNTS_FILE, build_vocab_mapping, load_token_counts
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.registry import get_draft
from eagle_train.target import FrozenTarget

REPO = Path(__file__).resolve().parents[1]
SPEC = get_draft("eagle3")
FREQUENT = 16  # the draft vocabulary: ids 0..15 (counts fall with the id)
PAD = 99  # a token only the padding holds


@pytest.fixture(scope="module")
def target(tiny_world: Path) -> FrozenTarget:
    return FrozenTarget.from_pretrained(tiny_world / "targets" / "llama" / "fp32", torch.float32)


def test_loss_and_gradients_equal_a_soft_ce_over_the_listed_columns(target: FrozenTarget):
    vocab_size = target.config.vocab_size
    vocab = build_vocab_mapping(torch.arange(vocab_size).flip(0), FREQUENT)
    cfg = Eagle3Config(
        aux_layer_ids=[1, 2, 3], ttt_steps=3, draft_vocab_size=FREQUENT, context_vocab=True
    )
    torch.manual_seed(0)
    draft = SPEC.build(cfg, target, vocab)
    assert draft.lm_head.out_features == vocab_size  # a row per target token
    assert torch.equal(draft.lm_head.weight, target.lm_head().weight)
    with torch.no_grad():  # a trained draft: its logits differ from the target's
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(200, 400, (2, 14), generator=torch.Generator().manual_seed(3))
    ids[1, 10:] = PAD  # row 1 ends at 10
    mask = torch.zeros_like(ids)
    mask[0, 5:] = 1  # a 5-token prompt, then the answer
    mask[1, 3:10] = 1
    lengths = torch.tensor([14, 10])
    batch = Batch(ids, mask, (torch.arange(14) < lengths[:, None]).long(), lengths)
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))

    result = SPEC.compute_loss(draft, features, batch, cfg)
    result.loss.backward()
    got = {n: p.grad.clone() for n, p in draft.named_parameters() if p.requires_grad}
    draft.zero_grad()

    greedy = features.logits.argmax(-1)
    columns = set(range(FREQUENT))
    for i in range(2):
        for s in range(int(lengths[i])):
            columns |= {int(ids[i, s]), int(greedy[i, s])}
    assert PAD not in columns and len(columns) < vocab_size  # the test leaves rows out
    cols = torch.tensor(sorted(columns))
    full = draft(features.aux, ids, 3).logits  # (B, T, V) at every slot
    weights = [1 / 2.44, 0.8 / 2.44, 0.64 / 2.44]
    loss, right, slots0 = torch.zeros(()), 0, 0
    for k in range(3):
        terms = []
        for i in range(2):
            for s in range(14):
                label = s + 2 + k
                if label >= lengths[i] or mask[i, label] == 0:
                    continue
                p = torch.softmax(features.logits[i, label - 1, cols], -1)
                terms.append(-(p * torch.log_softmax(full[k][i, s, cols], -1)).sum())
                if k == 0:
                    slots0 += 1
                    right += int(cols[full[0][i, s, cols].argmax()] == greedy[i, label - 1])
        loss = loss + weights[k] * torch.stack(terms).mean()
    loss.backward()

    assert result.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert result.metrics["acc_0"] == pytest.approx(right / slots0)
    for name, p in draft.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6)
    head = got["lm_head.weight"]
    unread = torch.ones(vocab_size, dtype=torch.bool)
    unread[cols] = False
    assert head[unread].abs().max() == 0  # the padding's token among them
    assert head[ids[0, 7]].abs().max() > 0  # a token of the text, outside the frequent rows


def test_context_vocab_without_a_draft_vocabulary_is_refused(tiny_world: Path, tmp_path):
    args = ["--config", str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml")]
    args += ["--set", "draft.context_vocab=true", "--set", "draft.draft_vocab_size=null"]
    args += ["--set", f"train.output_dir={tmp_path / 'run'}"]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 2, result.output
    assert "context_vocab needs draft_vocab_size" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_cli_trains_and_exports_a_whole_vocabulary_head(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Trained from the CLI, the head's rows outside what the micro-batches read keep the
    target's weights, and export writes the whole vocabulary's head with no d2t."""
    target_dir = tiny_world / "targets" / "llama" / "bf16"
    sets = [
        f"target.path={target_dir}",
        f"data.train={tiny_llama_data}",
        "data.val=null",
        "data.micro_batch_size=4",
        "data.max_length=128",
        f"train.output_dir={tmp_path / 'run'}",
        "train.max_steps=4",
        "train.save_every=4",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=1",
        "draft.draft_vocab_size=64",
        "draft.context_vocab=true",
    ]
    args = ["--config", str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml")]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "drafter"
    checkpoint = tmp_path / "run" / "checkpoints" / "step-0000004"
    result = CliRunner().invoke(export_draft_app, [str(checkpoint), str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    target = FrozenTarget.from_pretrained(target_dir, torch.bfloat16)
    vocab_size = target.config.vocab_size
    assert config["draft_vocab_size"] == vocab_size and "d2t" not in tensors
    head, original = tensors["lm_head.weight"], target.lm_head().weight
    assert head.shape == original.shape
    kept = (head == original).all(-1)
    assert 0 < int(kept.sum()) < vocab_size  # trained rows moved, the tokens never read did not
    frequent = build_vocab_mapping(load_token_counts(tiny_llama_data / COUNTS_FILE), 64)
    assert not kept[frequent.draft_ids].any()  # the frequent rows are read at every step
