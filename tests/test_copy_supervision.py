"""Copy supervision (draft.copy_supervision): the matches written out by hand, the loss against
a per-slot loop that recomputes softmax from scratch, the head it reads against the weights,
and the CLI training a head that then attends where the text repeats."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import draft_vocab_sets
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle3.copy_loss import copy_attention_loss, copy_targets
from eagle_train.drafts.registry import get_draft
from eagle_train.metrics import read_metrics
from eagle_train.target import FrozenTarget

REPO = Path(__file__).resolve().parents[1]
# Row 0 (length 7, padded with 0): "1 2" recurs, so slot 3 (next x_4=1, then x_5=2) matches
# key 1 (x_1=1, x_2=2). Row 1 (length 8): "4 5 6" recurs, slots 3, 4, 5 match keys 1, 2, 3.
IDS = torch.tensor([[5, 1, 2, 3, 1, 2, 9, 0], [7, 4, 5, 6, 4, 5, 6, 4]])
LENGTHS = torch.tensor([7, 8])
MATCHES = {(0, 3, 1), (1, 3, 1), (1, 4, 2), (1, 5, 3)}  # (row, slot t, key j), by hand


def test_matches_are_the_earlier_places_the_text_went_on_the_same_way():
    found = copy_targets(IDS)
    real = {(b, t, j) for b, t, j in found.nonzero().tolist() if t + 2 < LENGTHS[b]}
    assert real == MATCHES


def reference_loss(q, k, ids, lengths):
    """One slot at a time with math.exp: softmax over keys 0..t, target uniform on the
    hand-listed matches (else key 0), averaged over slots t with t+2 < length."""
    total, slots, mass, matched = 0.0, 0, 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(int(lengths[b]) - 2):
            s = [float(q[b, t] @ k[b, j]) / math.sqrt(q.shape[-1]) for j in range(t + 1)]
            z = sum(math.exp(x) for x in s)
            p = [math.exp(x) / z for x in s]
            keys = [j for bb, tt, j in MATCHES if (bb, tt) == (b, t)] or [0]
            total -= sum(math.log(p[j]) for j in keys) / len(keys)
            slots += 1
            if (b, t, keys[0]) in MATCHES:
                mass += sum(p[j] for j in keys)
                matched += 1
    return total / slots, mass / matched, matched


def test_loss_and_attention_mass_equal_a_per_slot_loop():
    torch.manual_seed(0)
    q, k = torch.randn(2, 8, 4, dtype=torch.float64), torch.randn(2, 8, 4, dtype=torch.float64)
    stats = copy_attention_loss(q, k, IDS, torch.ones_like(IDS), LENGTHS)
    loss, mass, matched = reference_loss(q, k, IDS, LENGTHS)
    assert stats.loss.item() == pytest.approx(loss, rel=1e-6)
    assert stats.mass == pytest.approx(mass, rel=1e-6)
    assert stats.slots == matched == 4


def test_unsupervised_slots_carry_no_copy_loss():
    q, k = torch.zeros(2, 8, 4), torch.zeros(2, 8, 4)  # uniform attention: log(t+1) per slot
    mask = torch.ones_like(IDS)
    mask[1, 5:] = 0  # x_5.. of row 1 are not assistant tokens: slots 3.. are not counted
    stats = copy_attention_loss(q, k, IDS, mask, LENGTHS)
    counted = [t + 1 for t in range(5)] + [t + 1 for t in range(3)]
    assert stats.loss.item() == pytest.approx(sum(map(math.log, counted)) / len(counted))
    assert stats.slots == 1 and stats.mass == pytest.approx(1 / 4)


def test_the_supervised_head_is_the_first_layers_last_query_head(tiny_world: Path):
    target = FrozenTarget.from_pretrained(
        tiny_world / "targets" / "llama" / "fp32", dtype=torch.float32
    )
    spec, cfg = get_draft("eagle3"), Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=2)
    torch.manual_seed(0)
    draft = spec.build(cfg, target, None)
    ids = torch.randint(0, target.description.vocab_size, (2, 10))
    aux = target.features(ids, None, [1, 2, 3]).aux
    q, k = draft(aux, ids, 2, copy_qk=True).copy_qk
    layer, d = draft.layers[0], draft.shape.head_dim
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)
    x = torch.cat(
        [layer.input_layernorm(draft.embed_tokens(nxt)), layer.hidden_norm(draft.fc(aux))], -1
    )
    kv_heads = draft.shape.num_kv_heads
    q_ref = (x @ layer.self_attn.q_proj.weight[-d:].T)[:, None]
    k_ref = (x @ layer.self_attn.k_proj.weight[(kv_heads - 1) * d :].T)[:, None]
    q_ref, k_ref = apply_rotary_pos_emb(q_ref, k_ref, *draft.rotary(x, torch.arange(10)[None]))
    torch.testing.assert_close(q, q_ref[:, 0])
    torch.testing.assert_close(k, k_ref[:, 0])
    assert draft(aux, ids, 2).copy_qk is None


def test_cli_trains_a_head_that_attends_where_the_text_repeats(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """With copy supervision the head's attention on the matching keys rises several-fold
    from where it starts (about 1/t) within a short run on the demo chats."""
    out = tmp_path / "run"
    sets = [
        f"target.path={tiny_world / 'targets' / 'llama' / 'bf16'}",
        f"data.train={tiny_llama_data}",
        "data.val=null",
        "data.micro_batch_size=4",
        "data.max_length=128",
        f"train.output_dir={out}",
        "train.max_steps=60",
        "train.log_every=4",
        "train.save_every=60",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=2",
        "draft.copy_supervision=1.0",
        "optim.lr=0.01",
        *draft_vocab_sets("eagle3"),
    ]
    args = ["--config", str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml")]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    train = read_metrics(out / "metrics.jsonl", "train")
    first, last = train[0]["copy_attention"], train[-1]["copy_attention"]
    assert last > 3 * first, (first, last)  # seen: 0.032 -> 0.189
    assert train[-1]["copy_loss"] < train[0]["copy_loss"]
