"""Teacher-forced data: assistant spans, batched prefill equal to one unpadded forward, the
sharded cache (extended, reused, refused when written for another setup)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3_backend.errors import Eagle3Error
from eagle3_backend.layout import Layout
from eagle3_backend.train import teacher as tf
from eagle3_backend.verify.targets import HiddenCapture

LAYOUT = Layout.parse("[layer_input:3, embed]")


def conversations(n: int = 6) -> list[tf.Conversation]:
    return [tf.Conversation(f"c{i}", (("user", f"Tell me fact {i} about the sea."),
                                      ("assistant", "The sea is salty" + " and deep" * i + "."),
                                      ("user", "More?"), ("assistant", "Waves come from wind.")))
            for i in range(n)]


def write_conversation_file(path, n: int = 12) -> None:
    rows = [{"id": f"c{i}", "conversations": [
        {"from": "gpt", "value": "a leading assistant turn is dropped"},
        {"from": "human", "value": f"Tell me fact number {i} about the sea."},
        {"from": "gpt", "value": f"The sea covers {i} parts of the world and is salty."},
        {"from": "human", "value": "And more?"},
        {"from": "gpt", "value": "Waves are made by the wind " * (1 + i % 3)}]} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")


def test_assistant_flags_cover_exactly_the_assistant_turns(tiny_target):
    tok = tiny_target.tokenizer
    conv = conversations()[2]
    ids, flags = tf.encode_conversation(tok, conv, 10_000)
    text = tok.apply_chat_template([{"role": r, "content": c} for r, c in conv.messages],
                                   tokenize=False)
    assert ids == tok(text, add_special_tokens=False).input_ids        # the whole text, once
    runs, cur = [], []
    for t, f in zip(ids + [None], flags + [False]):
        if f:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    assert runs == ["The sea is salty and deep and deep.<|im_end|>\n",
                    "Waves come from wind.<|im_end|>\n"]
    # cut: only the first tokens; a cut that leaves no assistant token is None
    first = flags.index(True)
    assert tf.encode_conversation(tok, conv, first + 2) == (ids[:first + 2], flags[:first + 2])
    assert tf.encode_conversation(tok, conv, first) is None


def test_conversation_file_drops_leading_assistant_turns_and_mtbench(tmp_path):
    from eagle3_backend.verify.datasets import read_mtbench

    path = tmp_path / "c.jsonl"
    write_conversation_file(path, 3)
    q = read_mtbench()[0].text
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                         {"role": "assistant", "content": "x"}]}) + "\n")
        f.write(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    convs, counts = tf.load_conversations(str(path), seed=0)
    assert counts == {"records": 5, "skipped": 1, "mtbench_excluded": 1}
    assert sorted(c.id for c in convs) == ["c-c0-0", "c-c1-1", "c-c2-2"]
    assert all(c.messages[0][0] == "user" and len(c.messages) == 4 for c in convs)
    with pytest.raises(Eagle3Error, match="evaluation set"):
        tf.load_conversations("mt-bench", 0)


@torch.inference_mode()
def test_batched_prefill_equals_one_unpadded_forward_per_conversation(tiny_target):
    tok = tiny_target.tokenizer
    rows = [tf.encode_conversation(tok, c, 10_000)[0] for c in conversations(3)]
    assert len({len(r) for r in rows}) == 3                            # padding is exercised
    model = tiny_target.model
    vocab = torch.arange(0, 49152, 7)                                  # a draft vocabulary
    got = tf.teacher_batch(tiny_target, rows, LAYOUT, vocab, 4, torch.float32)
    for r, g in zip(rows, got):
        with HiddenCapture(model, LAYOUT) as cap:
            out = model.model(torch.tensor([r]))
            aux = cap.take()[0, :-1]
        final = out.last_hidden_state[0, :-1]
        torch.testing.assert_close(g["aux"], aux, rtol=1e-4, atol=1e-5)
        assert g["labels"].tolist() == model.lm_head(final).argmax(-1).tolist()
        p = torch.softmax(final @ model.lm_head.weight[vocab].T, -1)
        v, ix = p.topk(4, -1)
        assert g["topk_idx"].tolist() == ix.tolist()                   # draft ids
        torch.testing.assert_close(g["topk_p"].float(), v, rtol=1e-3, atol=1e-4)
        assert g["topk_p"].dtype == torch.float16 and g["aux"].shape == (len(r) - 1, 128)


def _identity(**kw):
    ident = {"target": "t", "layout": LAYOUT.to_strings(), "draft_vocab": 64, "topk": 4}
    ident.update(kw)
    return ident


def test_cache_grows_by_shards_is_reused_and_refuses_another_setup(tmp_path, tiny_target):
    tok = tiny_target.tokenizer
    convs = conversations(6)
    vocab = torch.arange(64) * 3
    encode = lambda c: tf.encode_conversation(tok, c, 10_000)  # noqa: E731
    lengths = [len(encode(c)[0]) for c in convs]
    cache = tf.TeacherCache(tmp_path / "tc", _identity())
    cache.write_vocab(vocab, torch.zeros(49152, 64))
    # shards of >= 2 conversations' tokens; the first run wants 3 conversations' worth
    kw = dict(k=4, store_dtype="bfloat16", batch_tokens=200,
              shard_tokens=lengths[0] + lengths[1])
    assert tf.fill_cache(cache, tiny_target, convs, encode, LAYOUT, vocab,
                         want_tokens=sum(lengths[:3]), **kw)
    assert [s["sequences"] for s in cache.shards] == [2, 1] and cache.next_conversation == 3
    first_shard = (tmp_path / "tc" / "shard-00000.safetensors").read_bytes()

    again = tf.TeacherCache(tmp_path / "tc", _identity())                # reused as it is
    assert tf.fill_cache(again, tiny_target, convs, encode, LAYOUT, vocab,
                         want_tokens=sum(lengths[:2]), **kw)
    assert len(again.shards) == 2
    assert [s.id for s in again.sequences(max_tokens=1)] == ["c0", "c1"]   # whole shards
    # a run that needs more extends it; written shards stay as they were
    assert tf.fill_cache(again, tiny_target, convs, encode, LAYOUT, vocab,
                         want_tokens=10**6, **kw)
    assert again.next_conversation == 6 and sum(s["sequences"] for s in again.shards) == 6
    assert (tmp_path / "tc" / "shard-00000.safetensors").read_bytes() == first_shard
    seqs = tf.TeacherCache(tmp_path / "tc", _identity()).sequences()
    assert [s.id for s in seqs] == [c.id for c in convs]
    ref = tf.teacher_batch(tiny_target, [encode(convs[4])[0]], LAYOUT, vocab, 4, torch.bfloat16)[0]
    s = seqs[4]
    assert s.tokens.tolist() == encode(convs[4])[0]
    assert s.assistant.tolist() == encode(convs[4])[1]
    assert s.prompt_len == encode(convs[4])[1].index(True)
    assert torch.equal(s.labels, ref["labels"].long()) and torch.equal(s.topk_idx, ref["topk_idx"])
    assert s.aux.dtype == torch.bfloat16
    torch.testing.assert_close(s.aux.float(), ref["aux"].float(), rtol=1e-2, atol=1e-2)
    assert sorted(p.name for p in (tmp_path / "tc").iterdir()) == [
        "meta.json", *[f"shard-{i:05d}.safetensors" for i in range(len(again.shards))],
        "target.safetensors"]                                          # no temporary files
    vocab_back, embed_back = again.read_target()
    assert torch.equal(vocab_back, vocab) and torch.equal(embed_back, torch.zeros(49152, 64))
    ids_only, no_embed = again.read_target(embed=False)
    assert torch.equal(ids_only, vocab) and no_embed is None

    with pytest.raises(Eagle3Error, match=r"^teacher cache .*tc was written for another setup "
                                          r"\(layout: cache has \['layer_input:3', 'embed'\], "
                                          r"this run needs \['embed'\]\)\. Use another "
                                          r"--teacher-cache folder, or delete this one"):
        tf.TeacherCache(tmp_path / "tc", _identity(layout=["embed"]))
    with pytest.raises(Eagle3Error, match=r"target: cache has 't', this run needs 'other'"):
        tf.TeacherCache(tmp_path / "tc", _identity(target="other"))


@pytest.mark.parametrize("text,found", [("[]", "None"), ('{"format_version": 0}', "0"),
                                        ('{"format_version": 1, "identity": []}', None)])
def test_a_damaged_cache_description_is_named_not_a_crash(tmp_path, text, found):
    """meta.json that is JSON but not a cache's description: the error names the file and
    the fix (a list of an identity compares as an empty one: every field differs)."""
    (tmp_path / "tc").mkdir()
    (tmp_path / "tc" / "meta.json").write_text(text, encoding="utf-8")
    pattern = (rf"meta.json: the teacher cache has format version {found}, expected 1\. Delete .*tc "
               rf"to rebuild it\.$"
               if found else r"teacher cache .*tc was written for another setup \(draft_vocab: cache has "
                             r"None, this run needs 64; layout: cache has None")
    with pytest.raises(Eagle3Error, match=pattern):
        tf.TeacherCache(tmp_path / "tc", _identity())


def test_a_deadline_keeps_the_complete_shards(tmp_path, tiny_target):
    import time

    tok = tiny_target.tokenizer
    convs = conversations(4)
    encode = lambda c: tf.encode_conversation(tok, c, 10_000)  # noqa: E731
    cache = tf.TeacherCache(tmp_path / "tc", _identity())
    vocab = torch.arange(64)
    assert not tf.fill_cache(cache, tiny_target, convs, encode, LAYOUT, vocab, k=4,
                             store_dtype="bfloat16", want_tokens=10**6, shard_tokens=1,
                             deadline=time.perf_counter() - 1)
    assert cache.shards == [] and cache.next_conversation == 0


def test_heldout_is_stable_by_id():
    ids = [f"sharegpt-{i}" for i in range(2000)]
    held = [i for i in ids if tf.heldout_conversation(i, 0.05)]
    assert 60 <= len(held) <= 140                                      # about 5%
    assert held == [i for i in ids if tf.heldout_conversation(i, 0.05)]
    assert not any(tf.heldout_conversation(i, 0.0) for i in ids)


def test_target_answers_are_the_targets_greedy_replies_and_resume_by_shard(tmp_path, tiny_target):
    """--answers target: each chat's first user turn (system turn kept) rendered as served,
    answered greedily; the stored states, labels and top-k are those a prefill of the
    stored tokens gives; a killed pass resumes after its last shard to the same data."""
    import time

    from eagle3_backend.verify.datasets import render_prompt

    tok = tiny_target.tokenizer
    convs = [tf.Conversation("sys", (("system", "You are terse."), ("user", "Name a fish."),
                                     ("assistant", "Cod."))),
             tf.Conversation("long", (("user", "sea " * 200), ("assistant", "Yes."))),
             *conversations(4)]
    vocab = torch.arange(64) * 5
    kw = dict(k=4, store_dtype="bfloat16", max_new_tokens=5, max_prompt_tokens=60, gen_batch=2,
              shard_prompts=2)
    one = tf.TeacherCache(tmp_path / "one", _identity())
    assert tf.fill_cache_answers(one, tiny_target, convs, LAYOUT, vocab, want_tokens=10**6, **kw)
    assert [s["sequences"] for s in one.shards] == [2, 2, 1] and one.next_conversation == 6
    seqs = one.sequences()
    assert sorted(s.id for s in seqs) == ["c0", "c1", "c2", "c3", "sys"]      # "long" skipped
    by_id = {c.id: c for c in convs}
    for s in seqs:
        prompt = render_prompt(tok, tf.turn_prompt(by_id[s.id]))
        P, L = len(prompt), int(s.tokens.shape[0])
        assert s.tokens[:P].tolist() == prompt and s.prompt_len == P and 1 <= L - P <= 5
        assert s.assistant.tolist() == [False] * P + [True] * (L - P)
        ref = tf.teacher_batch(tiny_target, [s.tokens.tolist()], LAYOUT, vocab, 4, torch.float32)[0]
        assert s.labels[P - 1:].tolist() == ref["labels"][P - 1:].tolist() == s.tokens[P:].tolist()
        assert s.topk_idx[P - 1:].tolist() == ref["topk_idx"][P - 1:].tolist()
        torch.testing.assert_close(s.aux.float(), ref["aux"], rtol=8e-3, atol=1e-5)   # stored bf16
        # the soft targets come from fp32 final states, whatever the stored dtype: at most a
        # stray fp16 rounding differs from the prefill's (from bf16 final states 27-36% did)
        torch.testing.assert_close(s.topk_p.float(), ref["topk_p"].float(), rtol=1e-3, atol=1e-4)
        assert (s.topk_p != ref["topk_p"]).float().mean() < 0.05
    assert "You are terse." in tok.decode(next(s for s in seqs if s.id == "sys").tokens)

    part = tf.TeacherCache(tmp_path / "part", _identity())
    assert not tf.fill_cache_answers(part, tiny_target, convs, LAYOUT, vocab, want_tokens=10**6,
                                     deadline=time.perf_counter() - 1, **kw)
    assert part.shards == [] and part.next_conversation == 0               # nothing half-written
    assert tf.fill_cache_answers(part, tiny_target, convs, LAYOUT, vocab, want_tokens=1, **kw)
    assert len(part.shards) == 1
    assert tf.fill_cache_answers(tf.TeacherCache(tmp_path / "part", _identity()), tiny_target,
                                 convs, LAYOUT, vocab, want_tokens=10**6, **kw)
    again = tf.TeacherCache(tmp_path / "part", _identity()).sequences()
    assert [(s.id, s.tokens.tolist()) for s in again] == [(s.id, s.tokens.tolist()) for s in seqs]
    assert all(torch.equal(a.aux, b.aux) for a, b in zip(again, seqs))


def test_turn_prompt_keeps_the_recorded_turns_before_the_nth_user_turn():
    conv = tf.Conversation("t", (("system", "S"), ("user", "u1"), ("assistant", "a1"),
                                 ("user", "u2"), ("assistant", "a2"), ("user", "u3")))
    assert tf.turn_prompt(conv).messages == (("system", "S"), ("user", "u1"))
    assert tf.turn_prompt(conv, 2).messages == conv.messages[:4]
    assert tf.turn_prompt(conv, 3).messages == conv.messages
    assert tf.turn_prompt(conv, 4) is None and tf.turn_prompt(conv, 0) is None
    opens_with_assistant = tf.Conversation("a", (("assistant", "hi"), ("user", "u1")))
    assert tf.turn_prompt(opens_with_assistant) is None


def test_second_turn_answers_follow_the_recorded_first_exchange(tmp_path, tiny_target):
    """--answer-turn 2: the prompt is the chat through its second user turn (the recorded
    first answer kept as context, without loss); single-turn chats are skipped."""
    from eagle3_backend.verify.datasets import render_prompt

    tok = tiny_target.tokenizer
    convs = [tf.Conversation("one", (("user", "Name a fish."), ("assistant", "Cod."))),
             *conversations(3)]
    vocab = torch.arange(64) * 5
    cache = tf.TeacherCache(tmp_path / "t2", _identity())
    assert tf.fill_cache_answers(cache, tiny_target, convs, LAYOUT, vocab, k=4,
                                 store_dtype="bfloat16", want_tokens=10**6, max_new_tokens=4,
                                 max_prompt_tokens=200, turn=2, gen_batch=2, shard_prompts=8)
    seqs = {s.id: s for s in cache.sequences()}
    assert sorted(seqs) == ["c0", "c1", "c2"]                                # "one" skipped
    for c in convs[1:]:
        s = seqs[c.id]
        prompt = render_prompt(tok, tf.turn_prompt(c, 2))
        P, L = len(prompt), int(s.tokens.shape[0])
        assert s.tokens[:P].tolist() == prompt and 1 <= L - P <= 4
        assert "The sea is salty" in tok.decode(prompt) and "More?" in tok.decode(prompt)
        assert s.assistant.tolist() == [False] * P + [True] * (L - P)
        ref = tf.teacher_batch(tiny_target, [s.tokens.tolist()], LAYOUT, vocab, 4, torch.float32)[0]
        assert s.labels[P - 1:].tolist() == ref["labels"][P - 1:].tolist() == s.tokens[P:].tolist()
