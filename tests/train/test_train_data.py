"""Self-distilled training data: batched capture equals the verifier's capture of each sequence."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.train.data import (
    DATA_FORMAT_VERSION,
    generate_data,
    load_data,
    prompt_token_counts,
    save_data,
)
from eagle3_backend.verify.datasets import Prompt, render_prompt
from eagle3_backend.verify.engine import generate_target_only
from eagle3_backend.verify.targets import HiddenCapture

LAYOUT = "[layer_input:3, embed, layer_input:4]"   # not in layer order; includes the last output
PROMPTS = [
    Prompt("short", (("user", "Hi"),)),
    Prompt("long", (("user", "Write a detailed, long explanation of how rainbows form in the sky."),)),
    Prompt("mid", (("user", "List three colours."),)),
]


@pytest.fixture(scope="module")
def data(tiny_target):
    return generate_data(tiny_target, PROMPTS, LAYOUT, max_new_tokens=6, batch_size=3,
                         store_dtype="float32", seed=0)


def test_tokens_are_the_chat_prompt_then_the_targets_greedy_answer(tiny_target, data):
    by_id = {s.id: s for s in data.sequences}
    assert set(by_id) == {"short", "long", "mid"}
    for p in PROMPTS:
        s = by_id[p.id]
        ids = render_prompt(tiny_target.tokenizer, p)
        assert s.prompt_len == len(ids)
        assert s.tokens[: s.prompt_len].tolist() == ids
        ref = generate_target_only(tiny_target, ids, 6)
        assert s.tokens[s.prompt_len:].tolist() == ref.tokens


@torch.inference_mode()
def test_batched_capture_matches_the_verifier_capture(tiny_target, data):
    H = tiny_target.hidden_size
    for s in data.sequences:
        L = s.tokens.shape[0]
        assert s.aux.shape == (L - 1, 3 * H) and s.final.shape == (L - 1, H)
        assert s.aux.dtype == torch.float32
        with HiddenCapture(tiny_target.model, LAYOUT) as cap:
            out = tiny_target.model.model(s.tokens[None, :-1])
            ref = cap.take()[0]                                  # [L-1, 3H] layout order
        torch.testing.assert_close(s.aux, ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s.final, out.last_hidden_state[0], rtol=1e-4, atol=1e-5)
        # greedy: the target's argmax at every answer position is the next token
        logits = tiny_target.model.lm_head(s.final[s.prompt_len - 1:])
        assert logits.argmax(-1).tolist() == s.tokens[s.prompt_len:].tolist()


def test_prompt_token_counts(tiny_target):
    tok = tiny_target.tokenizer
    counts = prompt_token_counts(tok, PROMPTS, 49152)
    ref = torch.zeros(49152, dtype=torch.long)
    for p in PROMPTS:
        for t in tok(p.text, add_special_tokens=False).input_ids:
            ref[t] += 1
    assert torch.equal(counts, ref) and int(counts.sum()) > 10


def test_save_load_roundtrip(tmp_path, data):
    data.prior_counts = torch.arange(49152)
    save_data(data, tmp_path / "d")
    back = load_data(tmp_path / "d")
    assert torch.equal(back.prior_counts, data.prior_counts)
    assert back.layout == data.layout
    assert [s.id for s in back.sequences] == [s.id for s in data.sequences]
    for a, b in zip(back.sequences, data.sequences):
        assert torch.equal(a.tokens, b.tokens) and a.prompt_len == b.prompt_len
        assert torch.equal(a.aux, b.aux) and torch.equal(a.final, b.final)
    assert torch.equal(back.embed, data.embed) and back.lm_head is back.embed  # tied target
    assert torch.equal(back.final_norm, data.final_norm)
    assert back.meta["answer_tokens"] == data.num_answer_tokens == sum(
        s.tokens.shape[0] - s.prompt_len for s in data.sequences)


def test_damaged_cache_is_a_one_line_error(tmp_path, data):
    """A cache folder cut short (meta.json or data.safetensors truncated): an Eagle3Error
    naming the file and the fix, not a JSON/safetensors exception; no temp files remain."""
    from eagle3_backend.errors import Eagle3Error

    d = save_data(data, tmp_path / "d")
    assert sorted(p.name for p in d.iterdir()) == ["data.safetensors", "meta.json"]
    meta = (d / "meta.json").read_text()
    (d / "meta.json").write_text(meta[: len(meta) // 2])
    with pytest.raises(Eagle3Error, match=rf"^{d}/meta.json: cannot be read as JSON \(.*\); the "
                                          rf"cached training data is damaged. Delete {d} to "
                                          rf"regenerate it.$"):
        load_data(d)
    (d / "meta.json").write_text(json.dumps({**json.loads(meta), "format_version": 0}))
    with pytest.raises(Eagle3Error, match=rf"^{d}/meta.json: the cached training data has format "
                                          rf"version 0, expected {DATA_FORMAT_VERSION}. Delete {d} "
                                          rf"to regenerate it.$"):
        load_data(d)
    (d / "meta.json").write_text(meta)
    blob = (d / "data.safetensors").read_bytes()
    (d / "data.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(Eagle3Error, match=rf"^{d}/data.safetensors: not a readable safetensors "
                                          rf"file \(.*\); the cached training data is damaged. "
                                          rf"Delete {d} to regenerate it.$"):
        load_data(d)


def test_prompt_limits(tiny_target):
    ids_len = {p.id: len(render_prompt(tiny_target.tokenizer, p)) for p in PROMPTS}
    cap = ids_len["mid"]  # "long" is longer than "mid", "short" is shorter
    d = generate_data(tiny_target, PROMPTS, "[embed]", max_new_tokens=2, max_prompt_tokens=cap)
    assert sorted(s.id for s in d.sequences) == ["mid", "short"]
    assert d.meta["prompts_skipped_too_long"] == 1
    d = generate_data(tiny_target, PROMPTS, "[embed]", max_new_tokens=2, num_prompts=1)
    assert [s.id for s in d.sequences] == ["short"]
    with pytest.raises(Eagle3Error, match="longer than max_prompt_tokens=3"):
        generate_data(tiny_target, PROMPTS, "[embed]", max_new_tokens=2, max_prompt_tokens=3)
