"""The architectures users serve, through real SGLang on this CPU: DeepSeek-V3 / Kimi-K2 (MLA +
grouped-routing MoE), GLM-4.5 MoE, GLM-4.7-Flash (DeepSeek's MLA in GLM's own model file),
Qwen3-MoE, Qwen3, Qwen2 (q/k/v biases) and gpt-oss, each a small random target from
``eagle3_backend.cpu.tiny_targets`` (transformers' own config classes, fp32).

Per family, bounded server launches, one at a time: target-only (the reference, shared with
tests/cpu/test_cpu_tp.py), EAGLE-3 chain with the echo draft (accepted in the target's runs of
repeated tokens) and, where the tree mask meets an attention path of its own (absorbed MLA,
sinks with a sliding window), EAGLE-3 top-k tree. Each test asserts:

* greedy outputs identical, token for token, to the target-only server (8 prompts);
* the fc input SGLang built on its first prefill (``EAGLE3_DUMP_FC_INPUT``) equals the HF
  reference's ``hidden_states`` slot by slot in layout order, for layouts with ``embed``,
  out of layer order, (DeepSeek's +1 id rule) ``layer_input:1`` as the lowest capture, and
  (gpt-oss) the last layer's output;
* chain: SGLang's ``spec_accept_length`` per prompt equals the offline verifier's within 0.05
  and its tokens are the offline verifier's (the same verify steps: nothing lost in the wiring).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cpu_drafts import make_echo_draft, make_random_draft
from cpu_testutil import assert_fc_input_matches_hf, assert_same_tokens, family_spec, offline_acceptance, serve_prompts

pytestmark = [pytest.mark.server, pytest.mark.sglang]


# family -> echo draft layout of the chain test (accepted in the target's runs)
CHAIN = {
    "deepseek_v3": "[layer_input:5, embed, layer_input:2]",
    "kimi_k2": "[embed, layer_input:1, layer_input:6]",
    "glm4_moe": "[layer_input:6, layer_input:1, embed]",
    "qwen3_moe": "[embed, layer_input:4, layer_input:7]",
    "qwen3": "[layer_input:7, embed, layer_input:3]",
    "qwen2": "[embed, layer_input:5, layer_input:2]",
    "glm4_moe_lite": "[layer_input:1, embed, layer_input:5]",
    # the one model file that captures the last layer's output (layer_input:L, L = 8)
    "gpt_oss": "[layer_input:8, embed, layer_input:3]",
}
# family -> (draft kind, layout) of the tree test, for the attention paths a tree mask meets
# beyond the Llama one (tests/cpu/test_cpu_server.py): absorbed MLA (Kimi-K2's differs from
# DeepSeek-V3's in the q projection only), sinks + sliding window
TREE = {
    # +1 rule: the lowest capture is layer_input:1, so the ids handed to the model file must
    # not start with 1 (a random draft: the echo draft needs an embed slot)
    "deepseek_v3": ("random", "[layer_input:1, layer_input:4, layer_input:6]"),
    "gpt_oss": ("random", "[layer_input:2, layer_input:5, layer_input:8]"),
}


def _check_served(text: str, layout: str, target: Path, tmp_path: Path) -> None:
    assert f"EAGLE-3 layout {layout} -> fc input" in text and "(checked)" in text, text[-3000:]
    (dump,) = tmp_path.glob("fc_*.safetensors")
    assert_fc_input_matches_hf(dump, target, layout)


@pytest.mark.parametrize("family", list(CHAIN))
def test_chain_equals_target_fc_input_and_acceptance(family, family_target, family_reference, family_prompts,
                                                     plugin_site, tmp_path):
    target, layout = family_target(family), CHAIN[family]
    draft = make_echo_draft(tmp_path / "echo-draft", target, layout=layout)
    env = {"EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    # the target-only reference server and the EAGLE-3 one start side by side (a start is
    # mostly imports); the reference is kept for the tree and tp tests
    with ThreadPoolExecutor(1) as pool:
        ref = pool.submit(family_reference, family)
        outs, text = serve_prompts(family_spec(target, draft), plugin_site, tmp_path / "chain.log",
                                   family_prompts, env)
        reference = ref.result()
    assert_same_tokens(outs, reference, f"{family} EAGLE-3 chain, echo draft {layout}")
    _check_served(text, layout, target, tmp_path)

    served = {name: float(out["meta_info"]["spec_accept_length"]) for name, out in outs.items()}
    # a draft that accepts: most steps commit more than one token
    assert sum(served.values()) / len(served) > 2.0, served
    offline = offline_acceptance(target, draft, family_prompts, list(family_prompts), 3, 1, 4)
    for name, out in outs.items():
        length, tokens = offline[name]
        assert tokens == out["output_ids"], f"{family} {name}: the offline verifier's output differs"
        assert abs(length - served[name]) <= 0.05, (family, name, length, served[name])


@pytest.mark.parametrize("family", list(TREE))
def test_tree_equals_target_and_fc_input(family, family_target, family_reference, family_prompts,
                                         plugin_site, tmp_path):
    target, reference, (kind, layout) = family_target(family), family_reference(family), TREE[family]
    make = make_echo_draft if kind == "echo" else make_random_draft
    draft = make(tmp_path / f"{kind}-draft", target, layout=layout)
    env = {"EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    outs, text = serve_prompts(family_spec(target, draft, tree=True), plugin_site, tmp_path / "tree.log", family_prompts, env)
    assert_same_tokens(outs, reference, f"{family} EAGLE-3 tree topk 4, {kind} draft {layout}")
    _check_served(text, layout, target, tmp_path)
    lengths = [float(o["meta_info"]["spec_accept_length"]) for o in outs.values()]
    if kind == "echo":
        assert sum(lengths) / len(lengths) > 2.0, lengths


def test_kimi_k25_serves_its_language_model_exactly(family_target, family_reference, family_prompts,
                                                    plugin_site, tmp_path):
    """Kimi-K2.5 wraps Kimi-K2's model in a vision tower: the plugin finds the decoder stack one
    level deeper, and the self-check reads the batch's ids (the wrapper hands its language model
    embeddings, not ids). Its language model is the kimi_k2 family target, so the target-only
    reference, the HF fc input and the offline acceptance are that target's."""
    import dataclasses

    from eagle3_backend.cpu.tiny_targets import write_kimi_k25

    inner, layout = family_target("kimi_k2"), CHAIN["kimi_k2"]
    target = write_kimi_k25(inner, tmp_path / "kimi-k25")
    draft = make_echo_draft(tmp_path / "echo-draft", target, layout=layout)
    spec = family_spec(target, draft)
    spec = dataclasses.replace(spec, extra_args=(*spec.extra_args, "--trust-remote-code"))
    env = {"EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    outs, text = serve_prompts(spec, plugin_site, tmp_path / "k25.log", family_prompts, env)
    assert "eagle3_backend.cpu platform: KimiK25ForConditionalGeneration loaded" in text
    assert_same_tokens(outs, family_reference("kimi_k2"), f"Kimi-K2.5 EAGLE-3 chain, echo draft {layout}")
    _check_served(text, layout, inner, tmp_path)
    offline = offline_acceptance(inner, draft, family_prompts, list(family_prompts), 3, 1, 4)
    for name, out in outs.items():
        length, tokens = offline[name]
        assert tokens == out["output_ids"], name
        assert abs(length - float(out["meta_info"]["spec_accept_length"])) <= 0.05, name
