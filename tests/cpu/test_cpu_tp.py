"""Tensor parallel 2 on this CPU, through real SGLang: gloo groups (the CPU platform's hook keeps
PyNccl, CUDA-only, out of them), one OMP thread per rank bound with
``SGLANG_CPU_OMP_THREADS_BIND="0|1"`` (one NUMA node), ``--max-total-tokens`` given.

The Llama and the DeepSeek-V3-shaped small targets served at ``--tp-size 2`` with EAGLE-3 give,
token for token, the tp 1 target-only server's outputs; the plugin's pre-load checks run once
(in the launcher), and every rank self-checks its fc input, the embed slot against its own
vocabulary shard of the embedding.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from cpu_drafts import make_echo_draft
from cpu_testutil import assert_fc_input_matches_hf, assert_same_tokens, family_spec, serve_prompts

pytestmark = [pytest.mark.server, pytest.mark.sglang]

TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}
LAYOUT = {"llama": "[layer_input:5, embed, layer_input:2]",
          "deepseek_v3": "[embed, layer_input:1, layer_input:6]"}


@pytest.mark.parametrize("family", list(LAYOUT))
def test_tp2_eagle3_equals_tp1_target_only(family, family_target, family_reference, family_prompts,
                                           plugin_site, tmp_path):
    target, layout = family_target(family), LAYOUT[family]
    draft = make_echo_draft(tmp_path / "echo-draft", target, layout=layout)
    env = {**TP_ENV, "EAGLE3_DUMP_FC_INPUT": str(tmp_path / "fc_{pid}.safetensors")}
    with ThreadPoolExecutor(1) as pool:  # the tp 1 reference starts beside it, unless cached
        ref = pool.submit(family_reference, family)
        outs, text = serve_prompts(family_spec(target, draft, tp=2), plugin_site, tmp_path / "tp2.log",
                                   family_prompts, env)
        reference = ref.result()
    assert_same_tokens(outs, reference, f"{family} tp 2 EAGLE-3 vs tp 1 target-only")
    lengths = [float(o["meta_info"]["spec_accept_length"]) for o in outs.values()]
    assert sum(lengths) / len(lengths) > 2.0, lengths

    assert text.count("eagle3_backend: pre-load checks passed") == 1, "the launcher checks once"
    checked = re.findall(r"\[[^\]]* (TP\d)\] EAGLE-3 layout (\[[^\]]*\]) -> fc input (\d+) \(checked\)"
                         r"; embed slot on this rank's vocabulary shard \[(\d+), (\d+)\): (\d+) of (\d+) tokens",
                         text)
    assert sorted(c[0] for c in checked) == ["TP0", "TP1"], text[-3000:]
    shards = sorted((int(c[3]), int(c[4])) for c in checked)
    assert shards == [(0, 24576), (24576, 49152)], shards  # each rank its half of the vocabulary
    assert all(c[1] == layout for c in checked)
    # both ranks capture the same replicated residual stream; each dumped what it packed
    dumps = sorted(tmp_path.glob("fc_*.safetensors"))
    assert len(dumps) == 2, dumps
    for dump in dumps:
        assert_fc_input_matches_hf(dump, target, layout)
