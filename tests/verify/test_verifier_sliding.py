"""The offline verifier on a target with sliding-window layers: the small gpt-oss of
eagle3_backend.cpu.tiny_targets (window 16, sliding and full layers alternating, attention
sinks), prompts and answers well past the window. References: transformers' own generate and
its own causal forward over the accepted text."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import TargetError
from eagle3_backend.verify.datasets import Prompt, render_prompt
from eagle3_backend.verify.engine import (
    SpeculativeEngine,
    _causal_lm_forward,
    _new_cache,
    generate_target_only,
    keep_cache_rows,
)
from eagle3_backend.verify.tree import DraftTree, SpecSettings

WINDOW = 16
NEW_TOKENS = 40
PROMPT = Prompt("story", (("user", "Write a long story about a dragon who learns to fly."),))


@pytest.fixture(scope="module")
def oss_target(tmp_path_factory):
    from eagle3_backend.cpu.tiny_targets import write_target
    from eagle3_backend.verify.targets import load_target

    path = write_target("gpt_oss", tmp_path_factory.mktemp("gpt-oss"), echo=0.35)
    target = load_target(path, "float32", "cpu", progress=False)
    assert target.model.config.sliding_window == WINDOW
    assert set(target.model.config.layer_types) == {"sliding_attention", "full_attention"}
    return target


@pytest.fixture(scope="module")
def prompt_ids(oss_target):
    ids = render_prompt(oss_target.tokenizer, PROMPT)
    assert len(ids) > 2 * WINDOW, "precondition: the prompt alone must pass the window"
    return ids


@pytest.fixture(scope="module")
def reference(oss_target, prompt_ids):
    """transformers' own greedy decoding, with its own sliding-window cache and masks."""
    with torch.inference_mode():
        out = oss_target.model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS,
                                        do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def test_cache_keeps_sliding_layers_whole(oss_target):
    cache = _new_cache(oss_target, 64)
    assert {type(layer).__name__ for layer in cache.layers} == {"InPlaceLayer"}
    assert len(cache.layers) == oss_target.num_layers


def test_target_only_equals_transformers_generate(oss_target, prompt_ids, reference):
    ours = generate_target_only(oss_target, prompt_ids, NEW_TOKENS).tokens
    assert len(reference) == NEW_TOKENS
    assert ours[:len(reference)] == reference


@torch.inference_mode()
def _tree_verify_matches_the_forward_over_the_accepted_text(target, prefix):
    P = len(prefix)
    cache = _new_cache(target)
    _causal_lm_forward(target, torch.tensor([prefix]), torch.arange(P)[None], cache)
    #   root 0 -> [1, 2]; 2 -> [3]; 3 -> [4]   (node 1 is a rejected sibling)
    tree = DraftTree.from_parents(torch.tensor([504, 357, 282, 464, 30]), [-1, 0, 0, 2, 3])
    pos = P + torch.tensor(tree.depths)[None]
    tree_logits = _causal_lm_forward(target, tree.tokens[None], pos, cache,
                                      mask=tree.attention_mask(P))
    keep_cache_rows(cache, P, [0, 2, 3, 4])
    path = [504, 282, 464, 30]
    full = target.model(torch.tensor([prefix + path])).logits[0]   # no cache: its own masks
    torch.testing.assert_close(tree_logits[[0, 2, 3, 4]], full[P:], rtol=1e-4, atol=1e-4)
    # the rejected sibling saw the prefix and the root only, within the window
    sibling = target.model(torch.tensor([prefix + [504, 357]])).logits[0, -1]
    torch.testing.assert_close(tree_logits[1], sibling, rtol=1e-4, atol=1e-4)
    # decoding continues from the rolled-back cache as from the accepted text
    nxt = _causal_lm_forward(target, torch.tensor([[13]]), torch.tensor([[P + 4]]), cache)
    after = target.model(torch.tensor([prefix + path + [13]])).logits[0, -1]
    torch.testing.assert_close(nxt[0], after, rtol=1e-4, atol=1e-4)


def test_tree_verify_and_rollback_past_the_window_mixed_layers(oss_target, prompt_ids):
    # sliding and full layers: a mask per layer type
    _tree_verify_matches_the_forward_over_the_accepted_text(oss_target, prompt_ids[:3 * WINDOW])


def _target(model):
    """A :class:`Target` around a small model built in the test (no tokenizer needed)."""
    from eagle3_backend.verify.targets import Target

    c = model.config
    return Target(model=model.eval(), tokenizer=None, path=type(model).__name__,
                  num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                  vocab_size=c.vocab_size, dtype=torch.float32, device=torch.device("cpu"))


def test_tree_verify_and_rollback_past_the_window_every_layer_sliding():
    """Mistral's layout (a small random one, transformers' own classes, SDPA): every layer
    slides over 8 positions, one windowed mask for all."""
    import transformers

    torch.manual_seed(0)
    target = _target(transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8)))
    _tree_verify_matches_the_forward_over_the_accepted_text(target, torch.randint(0, 512, (30,)).tolist())


class ReferenceTrees(SpeculativeEngine):
    """Proposes root -> [wrong, right0]; right0 -> right1 -> right2 from the reference
    answer: three tokens accepted a step while the KV rollback drops a sibling every time."""

    def __init__(self, *args, ref: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.ref = ref

    def _propose(self, out, ext_ids, ext_hidden, draft_cache):
        L = len(out)
        nxt = [self.ref[i] if i < len(self.ref) else 0 for i in range(L, L + 3)]
        wrong = (nxt[0] + 1) % self.target.vocab_size
        return DraftTree.from_parents(torch.tensor([out[-1], wrong, *nxt]), [-1, 0, 0, 2, 3])


def test_speculation_identical_across_the_window(oss_target, prompt_ids, reference, make_tiny_draft):
    draft = make_tiny_draft(oss_target.hidden_size, oss_target.vocab_size,
                            "[layer_input:2, layer_input:4, layer_input:5]", draft_vocab=1024)
    engine = ReferenceTrees(oss_target, draft, SpecSettings(3, 2, 5), ref=reference)
    res = engine.generate(prompt_ids, NEW_TOKENS)
    assert res.tokens == reference
    assert res.accepted_per_step[:-1] == [3] * (len(res.accepted_per_step) - 1)
    assert res.completion_tokens / res.verify_steps > 3.5   # 4 tokens a step, 40 past a 16 window


def _llama4(transformers):
    return transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        attention_chunk_size=8, num_local_experts=2))


def _deepseek_v32(transformers):
    return transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        index_topk=8, index_head_dim=16, index_n_heads=2))


@pytest.mark.parametrize("build, kind", [(_llama4, "chunked_attention"), (_deepseek_v32, "indexed_attention")])
def test_a_layer_kind_it_cannot_roll_back_is_refused_before_any_forward(build, kind):
    """Llama 4's chunked attention and DeepSeek-V3.2's indexed (sparse) attention, small random
    ones built with transformers' own classes: neither is a sliding window, and the verifier
    says so before computing anything."""
    import transformers

    target = _target(build(transformers))
    with pytest.raises(TargetError, match=rf"layer 0 has {kind} .*eagle3 bench"):
        _new_cache(target)
