"""Prompts that would stop the scheduler are refused in the launcher with the reason.

The end-to-end check (real server, HTTP 400, server still serving) is in
tests/cpu/test_cpu_server.py; these pin the rule and its messages, on
SGLang's own request object.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eagle3_backend.serving.requests import before_validate_one_request, prompt_problem

pytestmark = pytest.mark.sglang

VOCAB = 49152


@pytest.fixture
def generate_req():
    io_struct = pytest.importorskip("sglang.srt.managers.io_struct")

    def make(**fields):
        return io_struct.GenerateReqInput(sampling_params={"max_new_tokens": 4}, **fields)
    return make


def test_ordinary_prompts_pass(generate_req):
    assert prompt_problem(generate_req(text="hi"), [12, 0, VOCAB - 1], VOCAB) is None
    assert prompt_problem(generate_req(input_ids=[5]), [5], VOCAB) is None


def test_empty_prompt(generate_req):
    assert prompt_problem(generate_req(text=""), [], VOCAB) == (
        "The prompt is empty (0 tokens after tokenization). Send at least one token: "
        "non-empty text, or input_ids with one or more ids.")


@pytest.mark.parametrize("ids,bad,pos", [([3, VOCAB], VOCAB, 1), ([-1, 4], -1, 0), ([7, 10**9, -5], -5, 2)])
def test_out_of_vocabulary_ids(generate_req, ids, bad, pos):
    assert prompt_problem(generate_req(input_ids=ids), ids, VOCAB) == (
        f"input_ids contains token id {bad} at position {pos}, outside the model's vocabulary "
        f"[0, {VOCAB}). Tokenize with this model's tokenizer.")


@pytest.mark.parametrize("token", ["7", 1.5, True, None])
def test_non_integer_ids(generate_req, token):
    problem = prompt_problem(generate_req(input_ids=[1, token]), [1, token], VOCAB)
    assert problem.startswith(f"input_ids[1] is {token!r} ({type(token).__name__}); input_ids must be")


def test_multimodal_and_embedding_requests_are_left_to_sglang(generate_req):
    # Multimodal prompts carry placeholder ids; embeddings have no ids at all.
    assert prompt_problem(generate_req(text="<image>", image_data="x.png"), [VOCAB + 10], VOCAB) is None
    assert prompt_problem(generate_req(input_embeds=[[0.0]]), None, VOCAB) is None


def test_handler_raises_the_value_error_sglang_turns_into_a_400(generate_req):
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))
    obj = generate_req(input_ids=[VOCAB + 1])
    with pytest.raises(ValueError, match=rf"token id {VOCAB + 1} at position 0"):
        before_validate_one_request(manager, obj, [VOCAB + 1])
    assert before_validate_one_request(manager, obj=generate_req(text="a"), input_ids=[1]) is None


def test_top_logprobs_beyond_the_vocabulary(generate_req):
    obj = generate_req(text="hi", return_logprob=True, top_logprobs_num=VOCAB + 1)
    assert prompt_problem(obj, [5], VOCAB) == (
        f"top_logprobs_num is {VOCAB + 1}, larger than the model's vocabulary ({VOCAB} tokens); "
        f"ask for at most {VOCAB} top logprobs.")
    ok = generate_req(text="hi", return_logprob=True, top_logprobs_num=VOCAB)
    assert prompt_problem(ok, [5], VOCAB) is None


# --------------------------------------------------------- max_new_tokens near the KV pool
POOL = 4096
RESERVE = 8  # 2 x max(steps x topk, draft tokens) for steps 3, topk 1, 4 draft tokens


@pytest.fixture
def scheduler_and_req(monkeypatch):
    """SGLang's own Scheduler.init_req_max_new_tokens on a 4096-token pool, then the plugin's clip."""
    scheduler_mod = pytest.importorskip("sglang.srt.managers.scheduler")
    torch = pytest.importorskip("torch")
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache import allocation_sizing
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.sampling.sampling_params import SamplingParams

    from eagle3_backend.serving.requests import after_init_req_max_new_tokens

    # what SGLang computes for --speculative-num-steps 3 --speculative-eagle-topk 1
    # --speculative-num-draft-tokens 4 (it reads the scheduler's runtime context)
    monkeypatch.setattr(allocation_sizing, "get_alloc_reserve_per_decode", lambda: RESERVE)
    allocator = TokenToKVPoolAllocator(POOL, torch.float32, "cpu", None, need_sort=False)
    scheduler = SimpleNamespace(
        max_new_tokens_limit=None, max_req_len=POOL - 1, max_total_num_tokens=POOL,
        kv_shard_widening=1, page_size=1, token_to_kv_pool_allocator=allocator,
        sliding_window_size=None, chunked_prefill_size=POOL)

    def run(input_len: int, max_new_tokens: int | None, min_new_tokens: int = 0,
            aborted: list | None = None) -> tuple[int, int]:
        req = Req("r", "", [5] * input_len, SamplingParams(max_new_tokens=max_new_tokens,
                                                          min_new_tokens=min_new_tokens))
        scheduler_mod.Scheduler.init_req_max_new_tokens(scheduler, req)
        stock = req.sampling_params.max_new_tokens
        with get_parallel().override(tp_rank=0):  # a scheduler's place in its TP group
            after_init_req_max_new_tokens(None, scheduler, req)
        assert req.sampling_params.min_new_tokens <= req.sampling_params.max_new_tokens
        if aborted is not None:
            aborted.append(req.to_finish)  # SGLang's abort, reported when the request is next run
        else:
            assert req.to_finish is None, req.to_finish
        return stock, req.sampling_params.max_new_tokens
    return run


def test_request_reaching_the_pool_keeps_the_speculative_reserve(scheduler_and_req):
    # stock: 4096 - 4080 - 2 = 14 new tokens, enough for 1-token decode steps; a
    # live EAGLE-3 server aborted this request with HTTP 500 after ~8 of them
    assert scheduler_and_req(4080, 40) == (14, 14 - RESERVE)
    assert scheduler_and_req(3000, 1200) == (1094, 1094 - RESERVE)
    # an OpenAI client without max_tokens: SGLang fills the pool
    assert scheduler_and_req(38, None) == (POOL - 38 - 2, POOL - 38 - 2 - RESERVE)
    # a prompt that leaves no room for a speculative step is refused with a 400 naming why
    # (it came back empty with finish reason "length"); SGLang accepts up to 4089 tokens
    for input_len in (4089, 4086):
        aborted: list = []
        scheduler_and_req(input_len, 16, aborted=aborted)
        (reason,) = aborted
        assert (type(reason).__name__, reason.status_code) == ("FINISH_ABORT", 400), reason
        assert reason.message == (
            f"eagle3_backend: the prompt ({input_len} tokens) leaves no room for an EAGLE-3 decode "
            f"step in the 4096-token KV pool: each step reserves 8 slots past the tokens kept, so "
            f"not one new token fits. Shorten the prompt, or start the server with a larger "
            f"--max-total-tokens.")
    assert scheduler_and_req(4085, 16) == (9, 1)    # room for one token: served
    assert scheduler_and_req(4089, 0) == (0, 0)     # asked for none (a prefill-only request)


def test_requests_that_fit_are_left_alone(scheduler_and_req):
    assert scheduler_and_req(4080, 6) == (6, 6)
    assert scheduler_and_req(100, 500) == (500, 500)


def test_min_new_tokens_follows_the_clip(scheduler_and_req):
    assert scheduler_and_req(4080, 14, min_new_tokens=12) == (14, 6)
