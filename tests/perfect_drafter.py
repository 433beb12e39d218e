"""Drafters that are perfect by construction, for testing acceptance-length measurement.

``build_identity_target`` writes a tiny fp32 Llama (with a tokenizer) whose every ``o_proj``
and ``down_proj`` is zero: each layer passes its input through, so the logits at a slot are
``lm_head(norm(embed(token)))`` and the next token depends only on the current one. The head
is built so that greedy decoding walks one random cycle through the whole vocabulary
(``next_token(t) = perm[t]``), with a wide top-1 margin.

``build_perfect_eagle3`` writes an EAGLE-3 drafter in vLLM's format (the project's export
contract, default ``norm_before_residual: false``) that predicts that target's next token
exactly at every draft step, so that vLLM measures acceptance length exactly K+1. Its single
layer computes, at every slot (x = cat(ne(tok), hidden_norm(h_in)), ne = input_layernorm of
the embedding, RMS 1):

- fc = 0, so step 0 starts from h_in = 0;
- q = k = one constant vector c for every token (read off a constant embedding component),
  so the RoPE score q_t.k_s = sum_i |c_i|^2 cos(theta_i (t - s)) peaks at s = t, and |c| is
  large enough that the softmax is one-hot on the slot's own key (margin checked for every
  distance up to ``max_position_embeddings``);
- v = ne(tok) - hidden_norm(h_in), o_proj = LAMBDA * I, mlp down_proj = 0. Then
  h_out = h_in + LAMBDA * (ne(tok) - h_in / rms(h_in)): at step 0 (h_in = 0) h_out =
  LAMBDA * ne(tok), and at a later step h_in = LAMBDA * ne(prev), whose normed form is
  ne(prev), so h_out = LAMBDA * ne(tok) again (up to rms-norm eps). The fed-back hidden
  cancels instead of accumulating.
- norm / lm_head = the target's final norm / lm_head, so the draft logits are the target's
  next-token logits for ``tok``.

(Zeroing hidden_norm instead, with o_proj large, does not work past the first step: the
residual h_in is not normed, so the earlier steps' token embeddings accumulate in h.)

``build_random_eagle3`` writes a random-init drafter of the same shape (acceptance ~1.0).

``build_perfect_eagle1`` writes an EAGLE-1 drafter (vLLM ``method="eagle"``) for the same
target: fc = [diag(w) | 0] with w the target's final-norm weight, and zero o_proj/down_proj,
so the layer passes fc's output through and the draft feature is w * embed(tok) =
norm(embed(tok)) (the embeddings have RMS 1), whose logits under the target's head are the
target's next-token logits. The feature it feeds back is ignored by fc.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eagle_train.drafts.base import VllmDrafter
from eagle_train.drafts.contract import PROVENANCE_FILE
from eagle_train.drafts.eagle1.config import Eagle1Config
from eagle_train.drafts.eagle1.export import expected_tensors as eagle1_tensors
from eagle_train.drafts.eagle1.export import vllm_config as eagle1_config
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle3.export import expected_tensors, vllm_config
from eagle_train.drafts.registry import get_draft
from eagle_train.export import validate_drafter
from eagle_train.target_model import TargetDescription, load_target_description

VOCAB = 96
HIDDEN = 64
HEADS = 2  # head_dim 32: vLLM's CPU attention needs head_dim >= 32
LAYERS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 1024
AUX_LAYER_IDS = [1, 2]
CONST_DIM = 0  # embedding dim that holds the same value for every token
LAMBDA = 4.0  # o_proj scale (any nonzero value works; larger shrinks the eps error)
MIN_SCORE_GAP = 60.0  # self vs any other key, in softmax logits (exp(-60) ~ 1e-26)
SELF_PAIRS = 6  # rotary pairs that carry the constant q = k vector (highest frequencies)


def _tokenizer() -> PreTrainedTokenizerFast:
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"t{i}": i for i in range(len(specials), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def build_identity_target(out_dir: str | Path, seed: int = 0) -> Path:
    """A tiny fp32 Llama whose next token depends only on the current one (with tokenizer)."""
    out = Path(out_dir)
    gen = torch.Generator().manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        dtype="float32",
    )
    with torch.random.fork_rng():  # seeded init without touching the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        # Embeddings: one constant dim, the rest random, every row with RMS exactly 1, so
        # input_layernorm(embed) has a token-independent component the drafter's q/k read.
        rand = torch.randn(VOCAB, HIDDEN, generator=gen)
        rand[:, CONST_DIM] = 0
        const = 0.5
        rand *= math.sqrt(HIDDEN - const**2) / rand.norm(dim=1, keepdim=True)
        rand[:, CONST_DIM] = const
        model.model.embed_tokens.weight.copy_(rand)
        # Head: next_token(t) = perm[t], one cycle through every token, wide top-1 margin.
        order = torch.randperm(VOCAB, generator=gen)
        perm = torch.empty(VOCAB, dtype=torch.long)
        perm[order] = order.roll(-1)
        varying = rand.clone()
        varying[:, CONST_DIM] = 0
        head = 0.05 * torch.randn(VOCAB, HIDDEN, generator=gen)
        head[perm] += varying / math.sqrt(HIDDEN)
        model.lm_head.weight.copy_(head)
        model.model.norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN, generator=gen))
        logits = model(torch.arange(VOCAB)[:, None]).logits[:, 0]
    top2 = logits.topk(2, dim=-1)
    if not torch.equal(top2.indices[:, 0], perm):
        raise AssertionError("the target's greedy next token is not the intended cycle")
    margin = float((top2.values[:, 0] - top2.values[:, 1]).min())
    if margin < 0.5:
        raise AssertionError(f"top-1 margin {margin} too small for exact comparisons")
    model.save_pretrained(out, safe_serialization=True)
    _tokenizer().save_pretrained(out)
    return out


def next_token_table(target_dir: str | Path) -> list[int]:
    """The target's greedy next token for every token id."""
    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return (
            model(torch.arange(model.config.vocab_size)[:, None]).logits[:, 0].argmax(-1).tolist()
        )


def _draft_config(target_dir: Path) -> tuple[TargetDescription, dict]:
    target = load_target_description(target_dir)
    config = vllm_config(
        Eagle3Config(aux_layer_ids=AUX_LAYER_IDS),
        target,
        AUX_LAYER_IDS,
        target.vocab_size,
        target.head_dim,
        target.num_kv_heads,
    )
    config["dtype"] = "float32"
    return target, config


def _write(drafter: VllmDrafter, target, out_dir: str | Path, algorithm: str = "eagle3") -> Path:
    validate_drafter(get_draft(algorithm), drafter, target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.to(torch.float32).contiguous() for n, t in sorted(drafter.tensors.items())}
    (out / "config.json").write_text(json.dumps(drafter.config, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    serving = {"method": drafter.method, "num_speculative_tokens": drafter.num_speculative_tokens}
    (out / PROVENANCE_FILE).write_text(json.dumps({"serving": serving}, indent=2) + "\n")
    return out


def _self_attention_q(config: dict, target: TargetDescription, const: float) -> torch.Tensor:
    """q = k rows for one head: pairs 0..SELF_PAIRS-1 (highest RoPE frequencies) carry the
    same value, scaled so that the own slot out-scores every other by MIN_SCORE_GAP."""
    d = config["head_dim"]
    theta = target.rope.theta
    if target.rope.type != "default":
        raise ValueError("the construction assumes plain RoPE")
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    weight = torch.zeros(d // 2, dtype=torch.float64)
    weight[:SELF_PAIRS] = 1.0
    dist = torch.arange(
        1, config.get("max_position_embeddings", MAX_POSITIONS) + 1, dtype=torch.float64
    )
    gap = (weight[:, None] * (1 - torch.cos(freqs[:, None] * dist[None]))).sum(0).min()
    # score(t, s) = |c_pair|^2 * sum_i w_i cos(theta_i (t-s)) / sqrt(d); per pair both
    # entries hold the value a: |c_pair|^2 = 2 a^2.
    a = math.sqrt(MIN_SCORE_GAP * math.sqrt(d) / (2 * float(gap)))
    q = torch.zeros(d, dtype=torch.float64)
    q[:SELF_PAIRS] = a
    q[d // 2 : d // 2 + SELF_PAIRS] = a
    return q / const  # weight on the constant input dim


def build_perfect_eagle3(target_dir: str | Path, out_dir: str | Path, k: int) -> Path:
    """An EAGLE-3 drafter that predicts ``build_identity_target``'s next token exactly."""
    target_dir = Path(target_dir)
    target, config = _draft_config(target_dir)
    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    embed = model.model.embed_tokens.weight.detach()
    h, eps = config["hidden_size"], config["rms_norm_eps"]
    normed = embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + eps)
    const = normed[:, CONST_DIM]
    if float(const.max() - const.min()) > 1e-6 or float(const.abs().min()) < 1e-3:
        raise ValueError(
            "the target's embeddings lack a constant component (not an identity target?)"
        )
    shapes, _ = expected_tensors(config)
    t = {name: torch.zeros(shape) for name, shape in shapes.items()}
    p = "layers.0.self_attn."
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    if kv * d != h or heads != kv:
        raise ValueError("the construction needs heads == kv_heads and kv_heads * head_dim == H")
    q_col = _self_attention_q(config, target, float(const.mean())).float()
    t[p + "q_proj.weight"][:, CONST_DIM] = q_col.repeat(heads)
    t[p + "k_proj.weight"][:, CONST_DIM] = q_col.repeat(kv)
    eye = torch.eye(h)
    t[p + "v_proj.weight"] = torch.cat([eye, -eye], dim=1)  # ne(tok) - hidden_norm(h_in)
    t[p + "o_proj.weight"] = LAMBDA * eye
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        t[f"layers.0.{name}.weight"] = torch.ones(h)
    gen = torch.Generator().manual_seed(0)  # gate/up are irrelevant (down_proj = 0)
    for name in ("gate_proj", "up_proj"):
        t[f"layers.0.mlp.{name}.weight"] = 0.02 * torch.randn(
            shapes[f"layers.0.mlp.{name}.weight"], generator=gen
        )
    t["norm.weight"] = model.model.norm.weight.detach().clone()
    t["lm_head.weight"] = model.lm_head.weight.detach().clone()
    drafter = VllmDrafter(config=config, tensors=t, method="eagle3", num_speculative_tokens=k)
    return _write(drafter, target, out_dir)


def build_random_eagle3(target_dir: str | Path, out_dir: str | Path, k: int, seed: int = 0) -> Path:
    """A random-init EAGLE-3 drafter of the same shape (acceptance length ~1)."""
    target, config = _draft_config(Path(target_dir))
    shapes, _ = expected_tensors(config)
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t[name] = torch.ones(shape)
        else:
            t[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    drafter = VllmDrafter(config=config, tensors=t, method="eagle3", num_speculative_tokens=k)
    return _write(drafter, target, out_dir)


def build_perfect_eagle1(target_dir: str | Path, out_dir: str | Path, k: int) -> Path:
    """An EAGLE-1 drafter that predicts ``build_identity_target``'s next token exactly."""
    target = load_target_description(target_dir)
    model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    h = target.hidden_size
    config = eagle1_config(Eagle1Config(), target, target.head_dim)
    config["dtype"] = "float32"
    shapes, _ = eagle1_tensors(config)
    gen = torch.Generator().manual_seed(0)  # q/k/v/gate/up are irrelevant (outputs zeroed)
    t = {name: 0.02 * torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    t["fc.weight"] = torch.cat(
        [torch.diag(model.model.norm.weight.detach()), torch.zeros(h, h)], dim=1
    )
    t["layers.0.self_attn.o_proj.weight"] = torch.zeros(h, h)
    t["layers.0.mlp.down_proj.weight"] = torch.zeros(shapes["layers.0.mlp.down_proj.weight"])
    t["layers.0.post_attention_layernorm.weight"] = torch.ones(h)
    drafter = VllmDrafter(config=config, tensors=t, method="eagle", num_speculative_tokens=k)
    return _write(drafter, target, out_dir, "eagle1")
