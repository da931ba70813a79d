"""YaRN and linear rope scaling (eagle3_backend/config.py RopeScaling, model.py
rope_inv_freq).

References, each compared at the stated tolerance:

* an fp64 re-derivation written here from the YaRN paper (``yarn_fp64``): rtol 1e-6
  (fp32 inv_freq vs fp64, a few fp32 ulps);
* transformers 5.x ``ROPE_INIT_FUNCTIONS["yarn"]``: inv_freq rtol 1e-6, atol 0 (it is
  computed in fp32 by the same formula; today bitwise equal) and the attention factor
  to rel 1e-12, except where SGLang differs (``attention_factor``, see below);
* SGLang 0.5.23 (marker ``sglang``, in a subprocess): ``get_rope(...)``'s
  YaRNScalingRotaryEmbedding and the rotary of a ``LlamaForCausalLMEagle3`` built
  from a draft config.json through SGLang's own config loader; cos/sin at chosen
  positions, rtol 1e-6 / atol 1e-6 (fp32 cos/sin of the same fp32 angles).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eagle3_backend.config import DraftConfig, RopeScaling
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.model import Attention, rope_inv_freq

REPO = Path(__file__).resolve().parents[1]

#: nvidia/gpt-oss-120b-Eagle3's rope (the target's): head_dim 64, theta 150000.
GPT_OSS = dict(head_dim=64, theta=150000.0, max_pos=131072, scaling={
    "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
#: DeepSeek-V3-style yarn on its 64-wide rope part (mscale / mscale_all_dim set and unequal).
DEEPSEEK = dict(head_dim=64, theta=10000.0, max_pos=163840, scaling={
    "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707})
#: Qwen3-style: only factor and original length; beta 32/1, truncate on by default.
QWEN3 = dict(head_dim=128, theta=1000000.0, max_pos=131072, scaling={
    "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
CASES = {"gpt-oss": GPT_OSS, "gpt-oss truncated": dict(GPT_OSS, scaling={
    k: v for k, v in GPT_OSS["scaling"].items() if k != "truncate"}),
    "deepseek": DEEPSEEK, "qwen3": QWEN3}


def yarn_fp64(head_dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """(inv_freq, cos/sin scale) in fp64, from the YaRN paper: pair i turns
    L / (2 pi theta^(2i/D)) times over L; the ramp runs from the pair that turns
    beta_fast times (kept) to the one that turns beta_slow times (divided by factor)."""
    D, L = head_dim, s.original_max_position_embeddings
    i_at = lambda turns: D * math.log(L / (2 * math.pi * turns)) / (2 * math.log(theta))  # noqa: E731
    lo, hi = i_at(s.beta_fast), i_at(s.beta_slow)
    if s.truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    base = torch.tensor([theta ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    frac = torch.tensor([min(max((i - lo) / (hi - lo), 0.0), 1.0) for i in range(D // 2)],
                        dtype=torch.float64)  # 0: kept, 1: divided by factor
    inv = base * (1 - frac) + base / s.factor * frac
    m = lambda k: 1.0 if s.factor <= 1 else 0.1 * k * math.log(s.factor) + 1  # noqa: E731
    scale = m(s.mscale) / m(s.mscale_all_dim) if s.mscale and s.mscale_all_dim else m(1.0)
    return inv, scale


def _hf(case: dict):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    D = case["head_dim"]
    hf = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D,
                     rope_theta=case["theta"], rope_scaling=dict(case["scaling"]),
                     max_position_embeddings=case["max_pos"])
    return ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")


# ------------------------------------------------------------------ config
def test_yarn_config_reads_hf_dict_with_defaults():
    s = RopeScaling.from_dict(GPT_OSS["scaling"])
    assert s == RopeScaling(32.0, original_max_position_embeddings=4096, rope_type="yarn",
                            beta_fast=32.0, beta_slow=1.0, truncate=False)
    assert s.to_dict() == GPT_OSS["scaling"]  # written back unchanged
    q = RopeScaling.from_dict(QWEN3["scaling"])
    assert (q.beta_fast, q.beta_slow, q.truncate, q.mscale, q.attention_factor) == (32.0, 1.0, True,
                                                                                  None, None)
    assert q.to_dict() == {**QWEN3["scaling"], "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    d = RopeScaling.from_dict(DEEPSEEK["scaling"])
    assert (d.mscale, d.mscale_all_dim, d.factor) == (1.0, 0.707, 40.0)
    hash(s)


def test_yarn_original_length_falls_back_to_max_position_embeddings():
    cfg = DraftConfig(hidden_size=128, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=50, draft_vocab_size=50,
                      target_hidden_size=128, layout="[embed]", max_position_embeddings=8192,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert cfg.rope_scaling.original_max_position_embeddings == 8192
    # transformers fills it the same way
    from transformers import LlamaConfig
    hf = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=8192,
                     rope_scaling={"rope_type": "yarn", "factor": 4.0})
    assert hf.rope_parameters["original_max_position_embeddings"] == 8192


@pytest.mark.parametrize("d, message", [
    ({"rope_type": "longrope", "factor": 4.0},
     "rope_scaling type 'longrope' is not supported; expected 'linear', 'llama3', 'yarn' or "
     "no scaling. Drafts with other scaling types cannot be run by this backend."),
    ({"rope_type": "dynamic", "factor": 4.0},
     "rope_scaling type 'dynamic' is not supported: SGLang 0.5.23 rotates every position with "
     "the NTK base for max_position_embeddings x factor, while transformers (where drafts are "
     "trained) keeps the plain base up to max_position_embeddings"),
    ({"type": "linear"}, "is of type linear but lacks ['factor']; linear scaling needs factor."),
    ({"type": "linear", "factor": 0.5},
     "rope_scaling.factor must be a number >= 1 for linear scaling, got 0.5."),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096},
     "is of type yarn but lacks ['factor']; yarn scaling needs factor and "
     "original_max_position_embeddings (or the config's max_position_embeddings)."),
    ({"rope_type": "yarn", "factor": 0.5, "original_max_position_embeddings": 4096},
     "rope_scaling.factor must be a number >= 1 for yarn scaling, got 0.5."),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "beta_fast": 1.0, "beta_slow": 32.0},
     "rope_scaling.beta_fast (1.0) is below beta_slow (32.0)"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_slow": 0},
     "rope_scaling.beta_slow must be a number > 0 for yarn scaling, got 0."),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "truncate": "no"}, "rope_scaling.truncate must be true or false, got 'no'."),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "truncate": None}, "sets ['truncate'] to null; transformers and SGLang read a null"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "mscale": 0.0, "mscale_all_dim": 1.0},
     "rope_scaling.mscale must be a number > 0 for yarn scaling, got 0.0."),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "attn_factor": 2.0, "extrapolation_factor": 1.0},
     "has keys ['attn_factor', 'extrapolation_factor'] this backend does not implement"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
      "low_freq_factor": 1.0}, "yarn has keys ['low_freq_factor'] this backend does not implement"),
    ({"rope_type": "yarn", "type": "llama3", "factor": 4.0},
     "says rope_type 'yarn' but type 'llama3'"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
     "original_max_position_embeddings must be a positive integer, got 0."),
])
def test_yarn_config_rejects(d, message):
    with pytest.raises(Eagle3Error) as e:
        RopeScaling.from_dict(d)
    assert message in str(e.value)


def test_scaling_fields_of_the_other_type_are_refused():
    with pytest.raises(Eagle3Error, match=r"type llama3 sets \['beta_fast'\], which only yarn"):
        RopeScaling(8.0, 1.0, 4.0, 8192, beta_fast=32.0)
    with pytest.raises(Eagle3Error, match=r"type yarn sets \['low_freq_factor'\], which only llama3"):
        RopeScaling(8.0, 1.0, original_max_position_embeddings=8192, rope_type="yarn")
    with pytest.raises(Eagle3Error, match=r"type linear sets \['beta_slow', 'low_freq_factor'\], "
                                          r"which only llama3 and yarn scaling uses"):
        RopeScaling(2.0, 1.0, rope_type="linear", beta_slow=1.0)


# ------------------------------------------------------------------ linear
#: a Llama-2-style linear interpolation (factor 4 stretches 4096 positions to 16384).
LINEAR = dict(head_dim=128, theta=10000.0, max_pos=4096, scaling={"type": "linear", "factor": 4.0})


def test_linear_config_reads_hf_dict():
    s = RopeScaling.from_dict(LINEAR["scaling"])
    assert s == RopeScaling(4.0, rope_type="linear")
    assert s.to_dict() == {"rope_type": "linear", "factor": 4.0}
    assert s.attention_scale == 1.0
    # keys transformers' linear scaling does not read are ignored, as there
    assert RopeScaling.from_dict({"rope_type": "linear", "factor": 2,
                                  "original_max_position_embeddings": 4096}).to_dict() == {
        "rope_type": "linear", "factor": 2.0}


def test_linear_matches_transformers_and_divides_every_frequency():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    D = LINEAR["head_dim"]
    s = RopeScaling.from_dict(LINEAR["scaling"])
    got = rope_inv_freq(D, LINEAR["theta"], s)
    plain = rope_inv_freq(D, LINEAR["theta"], None)
    torch.testing.assert_close(got, plain / 4.0, rtol=0, atol=0)
    hf = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D,
                     rope_theta=LINEAR["theta"], rope_scaling=dict(LINEAR["scaling"]),
                     max_position_embeddings=LINEAR["max_pos"])
    want, scale = ROPE_INIT_FUNCTIONS["linear"](hf, "cpu")
    assert scale == 1.0
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # position 4p with factor 4 is rotated as position p without scaling
    cfg = dict(hidden_size=2 * D, intermediate_size=64, num_attention_heads=2,
               num_key_value_heads=2, vocab_size=50, draft_vocab_size=50,
               target_hidden_size=2 * D, layout="[embed]", head_dim=D,
               rope_theta=LINEAR["theta"], dtype="float32")
    cos4, sin4 = Attention(DraftConfig(**cfg, rope_scaling=LINEAR["scaling"])).rope_cos_sin(
        torch.tensor([[0, 4, 40, 400]]))
    cos1, sin1 = Attention(DraftConfig(**cfg)).rope_cos_sin(torch.tensor([[0, 1, 10, 100]]))
    torch.testing.assert_close(cos4, cos1, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin4, sin1, rtol=0, atol=2e-6)


# ------------------------------------------------------------------ inv_freq / scale
@pytest.mark.parametrize("name", CASES)
def test_yarn_matches_fp64_derivation(name):
    c = CASES[name]
    s = RopeScaling.from_dict(c["scaling"])
    got = rope_inv_freq(c["head_dim"], c["theta"], s)
    want, scale = yarn_fp64(c["head_dim"], c["theta"], s)
    assert got.dtype == torch.float32 and got.shape == (c["head_dim"] // 2,)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert math.isclose(s.attention_scale, scale, rel_tol=1e-12)


def test_yarn_hand_computed():
    # head_dim 8, theta 1e4, L 1024, factor 4, beta 32/1:
    #   i(32) = 8 ln(1024 / 64 pi) / (2 ln 1e4) = 0.707..., i(1) = 8 ln(1024 / 2 pi) / (2 ln 1e4) = 2.212...
    #   truncated: ramp [0, 3]; pair i keeps (1 - i/3) of 1e4^(-i/4) and takes i/3 of it / 4.
    s = RopeScaling(4.0, original_max_position_embeddings=1024, rope_type="yarn")
    want = torch.tensor([10 ** -i * (1 - i / 3) + 10 ** -i / 4 * (i / 3) for i in range(4)],
                        dtype=torch.float64)
    torch.testing.assert_close(rope_inv_freq(8, 1e4, s).double(), want, rtol=1e-6, atol=0)
    assert s.attention_scale == pytest.approx(0.1 * math.log(4) + 1, rel=1e-15)
    # not truncated: ramp [0.707, 2.212], so pair 3 is fully divided by 4
    lo = 8 * math.log(1024 / (64 * math.pi)) / (2 * math.log(1e4))
    hi = 8 * math.log(1024 / (2 * math.pi)) / (2 * math.log(1e4))
    frac = [min(max((i - lo) / (hi - lo), 0), 1) for i in range(4)]
    want = torch.tensor([10 ** -i * (1 - f) + 10 ** -i / 4 * f for i, f in enumerate(frac)],
                        dtype=torch.float64)
    s = RopeScaling(4.0, original_max_position_embeddings=1024, rope_type="yarn", truncate=False)
    torch.testing.assert_close(rope_inv_freq(8, 1e4, s).double(), want, rtol=1e-6, atol=0)


def test_truncate_changes_gpt_oss_frequencies():
    # the gpt-oss drafts' truncate: false is not a no-op: served frequencies depend on it
    t = rope_inv_freq(64, 150000.0, RopeScaling.from_dict(CASES["gpt-oss truncated"]["scaling"]))
    f = rope_inv_freq(64, 150000.0, RopeScaling.from_dict(GPT_OSS["scaling"]))
    rel = (t - f).abs() / f  # pairs 9..17 of 32 lie in the ramp; without truncate it is narrower
    assert rel[:9].max() == 0 and rel[18:].max() == 0 and rel[9:18].min() > 1e-3
    assert rel.max() > 0.5


@pytest.mark.parametrize("name", CASES)
def test_yarn_matches_transformers(name):
    c = CASES[name]
    want, hf_scale = _hf(c)
    s = RopeScaling.from_dict(c["scaling"])
    torch.testing.assert_close(rope_inv_freq(c["head_dim"], c["theta"], s), want.float(),
                               rtol=1e-6, atol=0)
    assert math.isclose(s.attention_scale, hf_scale, rel_tol=1e-12)


WITH_ATTENTION_FACTOR = dict(GPT_OSS, scaling={**GPT_OSS["scaling"], "attention_factor": 1.0})


def test_attention_factor_follows_sglang_not_transformers(caplog):
    # transformers uses an explicit attention_factor; SGLang 0.5.23 never reads the key and
    # derives the scale from factor (test_cos_sin_match_sglang checks that on SGLang itself).
    # The draft is served by SGLang, so that is what we apply.
    c = WITH_ATTENTION_FACTOR
    _, hf_scale = _hf(c)
    assert hf_scale == 1.0
    with caplog.at_level(logging.WARNING, logger="eagle3_backend.config"):
        s = RopeScaling.from_dict(c["scaling"])
    assert s.attention_scale == pytest.approx(0.1 * math.log(32) + 1, rel=1e-15)
    assert "attention_factor 1.0 is not applied: SGLang 0.5.23 ignores it" in caplog.text
    assert s.to_dict()["attention_factor"] == 1.0  # kept in the config, written back
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="eagle3_backend.config"):
        RopeScaling.from_dict({**GPT_OSS["scaling"], "attention_factor": s.attention_scale})
    assert caplog.text == ""  # equal to what SGLang uses: nothing to say


def test_model_applies_scale_to_cos_and_sin():
    cfg = DraftConfig(hidden_size=128, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=50, draft_vocab_size=50,
                      target_hidden_size=128, layout="[embed]", head_dim=64,
                      rope_theta=150000.0, max_position_embeddings=131072,
                      rope_scaling=GPT_OSS["scaling"], dtype="bfloat16")
    attn = Attention(cfg).to(torch.bfloat16)
    pos = torch.tensor([[0, 1, 3, 10]])  # small: fp32 angle rounding stays below 1e-6
    cos, sin = attn.rope_cos_sin(pos)  # [1, 1, 4, 32]
    inv, scale = yarn_fp64(64, 150000.0, cfg.rope_scaling)
    ang = pos.double()[:, None, :, None] * inv
    assert cos.dtype == torch.float32 and scale > 1.3
    torch.testing.assert_close(cos.double(), ang.cos() * scale, rtol=0, atol=1e-5)
    torch.testing.assert_close(sin.double(), ang.sin() * scale, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ SGLang
_SGLANG_ROPE = textwrap.dedent('''
    import json, sys, types
    import torch
    # sglang's rotary base class imports vllm's op on a CPU-only, non-CPU-engine build;
    # only its cos/sin cache is read here, so a placeholder is enough.
    vm, co = types.ModuleType("vllm"), types.ModuleType("vllm._custom_ops")
    co.rotary_embedding = None
    vm._custom_ops = co
    sys.modules.update({"vllm": vm, "vllm._custom_ops": co})
    from sglang.srt.layers.rotary_embedding import get_rope
    from sglang.srt.utils.hf_transformers_utils import get_config
    job = json.loads(open(sys.argv[1]).read())
    out = []
    for case in job:
        if case["kind"] == "get_rope":
            D = case["head_dim"]
            r = get_rope(D, D, case["max_pos"], case["theta"], True, dict(case["scaling"]),
                         torch.float32)
        else:  # the draft as SGLang's server builds it: config.json -> get_config -> model
            from sglang.test.layer_ut_utils import init_single_process_dist
            init_single_process_dist(master_port=int(sys.argv[2]))
            from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
            m = LlamaForCausalLMEagle3(get_config(case["dir"], trust_remote_code=False))
            r = m.model.layers[0].self_attn.rotary_emb
        cache = r.cos_sin_cache
        out.append(dict(cls=type(r).__name__, truncate=getattr(r, "truncate", None),
                        mscale=getattr(r, "mscale", None), dtype=str(cache.dtype),
                        rows=cache[case["positions"]].double().tolist()))
    print("RESULT " + json.dumps(out))
''')

POSITIONS = [0, 1, 7, 100, 4095, 4096, 65537, 131071]


def _run_sglang(tmp_path: Path, job: list[dict]) -> list[dict]:
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "run.py").write_text(_SGLANG_ROPE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    port = str(29100 + os.getpid() % 400)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "job.json"),
                           port], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, f"sglang rope failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[0][len("RESULT "):])


def _ours(head_dim: int, theta: float, scaling: RopeScaling, positions: list[int]) -> torch.Tensor:
    """Our [P, D] cos|sin rows, laid out as SGLang's cos_sin_cache."""
    cfg = DraftConfig(hidden_size=2 * head_dim, intermediate_size=64, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=50, draft_vocab_size=50,
                      target_hidden_size=2 * head_dim, layout="[embed]", head_dim=head_dim,
                      rope_theta=theta, rope_scaling=scaling, dtype="float32")
    cos, sin = Attention(cfg).rope_cos_sin(torch.tensor([positions]))
    return torch.cat([cos[0, 0], sin[0, 0]], -1)


@pytest.mark.sglang
@pytest.mark.slow
def test_cos_sin_match_sglang(tmp_path):
    pytest.importorskip("sglang")
    job = [dict(kind="get_rope", positions=POSITIONS, **c) for c in CASES.values()]
    # an explicit attention_factor: SGLang does not read it (transformers would scale by 1.0)
    job.append(dict(kind="get_rope", positions=POSITIONS, **WITH_ATTENTION_FACTOR))
    linear_positions = [0, 1, 7, 100, 4095, 4096, 16383]
    job.append(dict(kind="get_rope", positions=linear_positions, **LINEAR))
    # the gpt-oss draft's config.json, through SGLang's config loader and LlamaForCausalLMEagle3
    draft = tmp_path / "gpt-oss-draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 128,
        "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 64, "num_hidden_layers": 1, "vocab_size": 50, "draft_vocab_size": 50,
        "max_position_embeddings": 131072, "rope_theta": 150000, "rms_norm_eps": 1e-5,
        "torch_dtype": "float32", "rope_scaling": GPT_OSS["scaling"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]}}))
    job.append(dict(kind="model", dir=str(draft), positions=POSITIONS))
    results = _run_sglang(tmp_path, job)
    linear = results.pop(-2)
    assert linear["cls"] == "LinearScalingRotaryEmbedding" and linear["dtype"] == "torch.float32"
    got = _ours(LINEAR["head_dim"], LINEAR["theta"], RopeScaling.from_dict(LINEAR["scaling"]),
                linear_positions).double()
    torch.testing.assert_close(got, torch.tensor(linear["rows"], dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)

    named = list(CASES.items()) + [("attention_factor", WITH_ATTENTION_FACTOR),
                                   ("LlamaForCausalLMEagle3", GPT_OSS)]
    assert len(results) == len(named)
    assert results[-2]["mscale"] == pytest.approx(0.1 * math.log(32) + 1, rel=1e-12)
    for (name, c), r in zip(named, results):
        s = RopeScaling.from_dict(c["scaling"], max_position_embeddings=c["max_pos"])
        assert r["cls"] == "YaRNScalingRotaryEmbedding", name
        assert r["truncate"] is s.truncate, name  # SGLang honours truncate: false
        assert math.isclose(r["mscale"], s.attention_scale, rel_tol=1e-12), name
        assert r["dtype"] == "torch.float32", name
        want = torch.tensor(r["rows"], dtype=torch.float64)
        got = _ours(c["head_dim"], c["theta"], s, POSITIONS).double()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
