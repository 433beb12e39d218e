"""Copy supervision (draft.copy_supervision, draft.copy_steps): the matches written out by
hand, the loss against a per-slot loop that recomputes softmax from scratch (chain keys of
later TTT steps included), the head it reads against the weights, and the CLI training a head
that then attends where the text repeats."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from realistic import weights
from run_configs import cli_args, run_sets
from target_families import family_config
from torch import Tensor
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.config import ConfigError
from eagle_train.data.loader import Batch
from eagle_train.drafts.eagle3 import copy_loss
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle3.copy_loss import copy_attention_loss, copy_targets
from eagle_train.drafts.registry import get_draft
from eagle_train.metrics import read_metrics
from eagle_train.target_model import FrozenTarget

REPO = Path(__file__).resolve().parents[2]
# Row 0 (length 7, padded with 0): "1 2" recurs, so slot 3 (next x_4=1, then x_5=2) matches
# key 1 (x_1=1, x_2=2). Row 1 (length 8): "4 5 6" recurs, slots 3, 4, 5 match keys 1, 2, 3.
IDS = torch.tensor([[5, 1, 2, 3, 1, 2, 9, 0], [7, 4, 5, 6, 4, 5, 6, 4]])
LENGTHS = torch.tensor([7, 8])
MATCHES = {(0, 3, 1), (1, 3, 1), (1, 4, 2), (1, 5, 3)}  # (row, slot t, key j), by hand
# TTT step 1: slot t reads x_{t+2} and predicts x_{t+3}. Row 0: slot 2 (x_4=1, x_5=2) matches
# key 1. Row 1: slots 2, 3, 4 match keys 1, 2, 3; slot 5 would predict x_8, past the end.
MATCHES_STEP1 = {(0, 2, 1), (1, 2, 1), (1, 3, 2), (1, 4, 3)}


@pytest.mark.parametrize(("step", "expected"), [(0, MATCHES), (1, MATCHES_STEP1)])
def test_matches_are_the_earlier_places_the_text_went_on_the_same_way(step, expected):
    found = copy_targets(IDS, step)
    real = {(b, t, j) for b, t, j in found.nonzero().tolist() if t + 2 + step < LENGTHS[b]}
    assert real == expected


def reference_loss(queries, keys, ids, lengths, matches_per_step):
    """One slot at a time with math.exp: at step s, softmax over context keys 0..t plus the
    slot's chain keys of steps 1..s, target uniform on the hand-listed matches (else key 0),
    averaged over slots t with t+2+s < length; the loss is the mean over steps."""
    losses, masses, counts = [], [], []
    d = queries[0].shape[-1]
    for step, (q, matches) in enumerate(zip(queries, matches_per_step, strict=True)):
        total, slots, mass, matched = 0.0, 0, 0.0, 0
        for b in range(ids.shape[0]):
            for t in range(int(lengths[b]) - 2 - step):
                s = [float(q[b, t] @ keys[0][b, j]) / math.sqrt(d) for j in range(t + 1)]
                s += [float(q[b, t] @ keys[i][b, t]) / math.sqrt(d) for i in range(1, step + 1)]
                z = sum(math.exp(x) for x in s)
                p = [math.exp(x) / z for x in s]
                hits = [j for bb, tt, j in matches if (bb, tt) == (b, t)] or [0]
                total -= sum(math.log(p[j]) for j in hits) / len(hits)
                slots += 1
                if (b, t, hits[0]) in matches:
                    mass += sum(p[j] for j in hits)
                    matched += 1
        losses.append(total / slots)
        masses.append(mass / matched)
        counts.append(matched)
    return sum(losses) / len(losses), masses, counts


@pytest.mark.parametrize("chunk", [8, 3], ids=["one chunk", "chunks of 3 slots"])
def test_loss_and_attention_mass_equal_a_per_slot_loop(chunk, monkeypatch):
    # the slots run in chunks; 3 does not divide the 8 slots
    monkeypatch.setattr(copy_loss, "_CHUNK_BYTES", 4 * 2 * 2 * 8 * chunk)
    torch.manual_seed(0)
    q = [torch.randn(2, 2, 8, 4, dtype=torch.float64) for _ in range(2)]  # (B, heads, T, D)
    k = [torch.randn(2, 2, 8, 4, dtype=torch.float64) for _ in range(2)]
    for steps, matches in [(1, [MATCHES]), (2, [MATCHES, MATCHES_STEP1])]:
        for heads in (1, 2):  # two copy heads: the mean of each head's own loss and mass
            stats = copy_attention_loss(
                [(a[:, :heads], b[:, :heads]) for a, b in zip(q, k, strict=True)][:steps],
                IDS,
                torch.ones_like(IDS),
                LENGTHS,
            )
            per_head = [
                reference_loss(
                    [a[:, h] for a in q[:steps]], [b[:, h] for b in k], IDS, LENGTHS, matches
                )
                for h in range(heads)
            ]
            loss = sum(r[0] for r in per_head) / heads
            mass = [sum(r[1][s] for r in per_head) / heads for s in range(steps)]
            assert stats.loss.item() == pytest.approx(loss, rel=1e-6)
            assert stats.mass == pytest.approx(mass, rel=1e-6)
            assert stats.slots == per_head[0][2] == [4] * steps


def test_chunked_slots_give_the_same_gradients_and_keep_nothing_t_by_t(monkeypatch):
    """A 300-slot row with repeats, ids above 32,767: the loss and the gradients of every
    query and key in chunks of 7 slots equal one chunk's, and autograd keeps no tensor of
    T x T entries (what made copy supervision quadratic in the row's length)."""
    torch.manual_seed(1)
    t, heads = 300, 2
    base = torch.randint(32768, 49152, (40,))
    ids = torch.cat([base, torch.randint(32768, 49152, (60,)), base, base[:20]])
    ids = torch.cat([ids, ids[: t - len(ids)]])[None].expand(2, t).clone()
    ids[1, 150:] = torch.randint(32768, 49152, (150,))
    lengths, mask = torch.tensor([t, 251]), torch.ones(2, t, dtype=torch.long)
    mask[1, 251:] = 0
    probed = [
        tuple(torch.randn(2, heads, t, 8, requires_grad=True) for _ in range(2)) for _ in range(3)
    ]
    results = []
    for chunk in (t, 7):
        monkeypatch.setattr(copy_loss, "_CHUNK_BYTES", 4 * 2 * heads * t * chunk)
        saved: list[int] = []

        def keep(x: Tensor, saved: list[int] = saved) -> Tensor:
            saved.append(x.numel())
            return x

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda x: x):
            stats = copy_attention_loss(probed, ids, mask, lengths)
        grads = torch.autograd.grad(stats.loss, [x for pair in probed for x in pair])
        results.append((stats, grads, max(saved)))
    (full, full_grads, _), (chunked, chunked_grads, largest) = results
    assert chunked.loss.item() == pytest.approx(full.loss.item(), rel=1e-5)
    assert chunked.mass == pytest.approx(full.mass, rel=1e-5)
    assert chunked.slots == full.slots and min(full.slots) > 0
    for a, b in zip(full_grads, chunked_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)
    assert largest < heads * t * t  # the chunked run keeps inputs only


def test_unsupervised_slots_carry_no_copy_loss():
    q, k = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)  # uniform attention: log(t+1) per slot
    mask = torch.ones_like(IDS)
    mask[1, 5:] = 0  # x_5.. of row 1 are not assistant tokens: slots 3.. are not counted
    stats = copy_attention_loss([(q, k)], IDS, mask, LENGTHS)
    counted = [t + 1 for t in range(5)] + [t + 1 for t in range(3)]
    assert stats.loss.item() == pytest.approx(sum(map(math.log, counted)) / len(counted))
    assert stats.slots == [1] and stats.mass == pytest.approx([1 / 4])


@pytest.fixture(scope="module")
def gqa_target(tmp_path_factory: pytest.TempPathFactory) -> FrozenTarget:
    """A random Llama with 4 query heads in 2 key/value groups (the tiny world has one)."""
    config = family_config("llama")
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    path = tmp_path_factory.mktemp("gqa")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return FrozenTarget.from_pretrained(path, dtype=torch.float32)


@pytest.mark.parametrize("copy_heads", [1, 2])
def test_the_supervised_heads_are_the_last_query_head_of_the_last_groups(
    gqa_target: FrozenTarget, copy_heads: int
):
    target = gqa_target
    cfg = Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=2, copy_heads=copy_heads)
    spec = get_draft("eagle3")
    torch.manual_seed(0)
    draft = spec.build(cfg, target, None)
    ids = torch.randint(0, target.description.vocab_size, (2, 10))
    aux = target.features(ids, None, [1, 2, 3]).aux
    step_inputs: list[Tensor] = []  # what the final norm reads: each step's pre-norm output
    hook = draft.norm.register_forward_hook(lambda m, args, out: step_inputs.append(args[0]))
    probed = draft(aux, ids, 2, copy_steps=2).copy_qk
    hook.remove()
    layer, d = draft.layers[0], draft.shape.head_dim
    heads, kv_heads = draft.shape.num_heads, draft.shape.num_kv_heads
    group = heads // kv_heads
    assert kv_heads >= 2 and group >= 2  # the tiny target has GQA groups to tell apart
    # (query head, key/value head) pairs: the last query head of each of the last groups
    pairs = [(heads - 1, kv_heads - 1), (heads - 1 - group, kv_heads - 2)][:copy_heads][::-1]
    # Step s reads token x_{t+1+s} at RoPE position t+s; step 1's hidden is step 0's output.
    for step, hidden in enumerate([draft.fc(aux), step_inputs[0]]):
        tokens = torch.cat([ids[:, 1 + step :], ids[:, -1:].expand(-1, 1 + step)], 1)
        x = torch.cat(
            [layer.input_layernorm(draft.embed_tokens(tokens)), layer.hidden_norm(hidden)], -1
        )
        q, k = probed[step]
        assert q.shape == k.shape == (2, copy_heads, 10, d)
        for i, (qh, kh) in enumerate(pairs):
            q_ref = (x @ layer.self_attn.q_proj.weight[qh * d : (qh + 1) * d].T)[:, None]
            k_ref = (x @ layer.self_attn.k_proj.weight[kh * d : (kh + 1) * d].T)[:, None]
            positions = torch.arange(step, 10 + step)[None]
            q_ref, k_ref = apply_rotary_pos_emb(q_ref, k_ref, *draft.rotary(x, positions))
            torch.testing.assert_close(q[:, i], q_ref[:, 0])
            torch.testing.assert_close(k[:, i], k_ref[:, 0])
    assert len(probed) == 2
    assert draft(aux, ids, 2).copy_qk == []


def test_copy_heads_beyond_the_drafts_key_value_groups_are_refused(gqa_target: FrozenTarget):
    target = gqa_target
    kv_heads = target.description.num_kv_heads
    cfg = Eagle3Config(aux_layer_ids=[1, 2, 3], copy_heads=kv_heads + 1)
    with pytest.raises(ConfigError, match=f"draft.copy_heads.*{kv_heads}.*{kv_heads + 1}"):
        get_draft("eagle3").build(cfg, target, None)
    # The draft's own key/value heads (draft.num_kv_heads) count, not the target's: one per
    # query head gives each copy head its own value; a count that does not divide is refused.
    wide = get_draft("eagle3").build(cfg.model_copy(update={"num_kv_heads": 4}), target, None)
    assert wide.copy_heads == [1, 2, 3] and wide.layers[0].self_attn.k_proj.out_features == 64
    with pytest.raises(ConfigError, match="draft.num_kv_heads: a divisor of .* 4 .*, got 3"):
        get_draft("eagle3").build(cfg.model_copy(update={"num_kv_heads": 3}), target, None)


def test_cli_trains_a_head_that_attends_where_the_text_repeats(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """With copy supervision the head's attention on the matching keys rises several-fold
    from where it starts (about 1/t) within a short run on the demo chats."""
    out = tmp_path / "run"
    sets = run_sets(
        tiny_world,
        tiny_llama_data,
        out,
        "data.micro_batch_size=4",
        "data.max_length=128",
        "train.max_steps=60",
        "train.log_every=4",
        "train.save_every=60",
        "optim.warmup_steps=2",
        "draft.copy_supervision=1.0",
        "draft.copy_steps=2",
        "optim.lr=0.01",
    )
    result = CliRunner().invoke(train_draft_app, cli_args(sets))
    assert result.exit_code == 0, result.output
    train = read_metrics(out / "metrics.jsonl", "train")
    for name in ("copy_attention", "copy_attention_1"):  # steps 0 and 1
        first, last = train[0][name], train[-1][name]
        assert last > 3 * first, (name, first, last)  # seen: 0.031 -> 0.185 and 0.028 -> 0.170
    assert train[-1]["copy_loss"] < train[0]["copy_loss"]
    assert "copy_attention_2" not in train[-1]  # ttt_steps 3, copy_steps 2


def test_more_copy_steps_than_ttt_steps_is_refused_naming_both(tiny_world: Path, tmp_path):
    args = ["--config", str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml")]
    args += ["--set", "draft.copy_steps=4", "--set", f"train.output_dir={tmp_path / 'run'}"]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 2, result.output
    assert "copy_steps (4) exceeds ttt_steps (3)" in result.output
    assert "--set 'draft.copy_steps=4'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_the_copy_loss_enters_the_step_loss_with_its_weight(gqa_target: FrozenTarget):
    """draft.copy_supervision is a weight other than 1 here (tests/realistic.py): the loss
    trained on is the EAGLE-3 loss plus that weight times the copy loss, both as logged."""
    target, spec = gqa_target, get_draft("eagle3")
    ids = IDS.clone()
    mask = (torch.arange(ids.shape[1])[None] < LENGTHS[:, None]).long()
    batch = Batch(ids, mask, mask, LENGTHS)
    features = target.features(ids, mask, [1, 2, 3])
    for weight in weights(2):
        cfg = Eagle3Config(
            aux_layer_ids=[1, 2, 3], ttt_steps=2, copy_supervision=weight, copy_steps=2
        )
        torch.manual_seed(0)
        draft = spec.build(cfg, target, None)
        result = spec.compute_loss(draft, features, batch, cfg)
        parts = result.metrics["loss"], result.metrics["copy_loss"]
        assert parts[1] > 0
        assert result.loss.item() == pytest.approx(parts[0] + weight * parts[1], rel=1e-5)
