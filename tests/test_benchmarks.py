"""The served and training benchmarks' arithmetic (benchmarks/serve_demo.py, tree_sweep.py,
train_levers.py), on inputs whose answers are known exactly; their real runs are recorded in
benchmarks/results/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "ops"))
from kernel_testutil import load_benchmark  # noqa: E402

from eagle3_backend.train.data import DataSequence  # noqa: E402


def _report(tok_s: float, texts: list[str], accept: float | None = None) -> dict:
    return {"output_throughput": tok_s, "generated_texts": texts, "accept_length": accept}


def test_serve_demo_summary_per_level_with_the_stock_capture():
    sd = load_benchmark("serve_demo")
    runs = {
        "target-only": {"levels": {"1": {"report": _report(10.0, ["a", "b", "c", "d"])},
                                   "4": {"report": _report(20.0, ["a", "b", "c", "d"])}}},
        "eagle3": {"levels": {"1": {"report": _report(15.0, ["a", "b", "c", "x"], 2.25)},
                              "4": {"report": _report(16.0, ["a", "b", "c", "d"], 2.0)}}},
        "stock": {"levels": {"1": {"report": _report(12.0, ["a", "b", "c", "x"], 2.25)},
                             "4": {"report": _report(16.0, ["a", "y", "c", "d"], 2.0)}}},
    }
    s = sd.summarize(runs, 4)
    assert s["prompts"] == 4 and list(s["levels"]) == ["1", "4"]
    one, four = s["levels"]["1"], s["levels"]["4"]
    assert one == {"tok_s_target_only": 10.0,
                   "accept_length_eagle3": 2.25, "tok_s_eagle3": 15.0, "speedup_eagle3": 1.5,
                   "outputs_identical_eagle3": "3/4",
                   "accept_length_stock": 2.25, "tok_s_stock": 12.0, "speedup_stock": 1.2,
                   "outputs_identical_stock": "3/4",
                   "plugin_over_stock": 1.25, "plugin_stock_identical": "4/4"}
    assert (four["speedup_eagle3"], four["outputs_identical_eagle3"]) == (0.8, "4/4")
    assert (four["plugin_over_stock"], four["plugin_stock_identical"]) == (1.0, "3/4")
    # without a stock run there is no stock column
    del runs["stock"]
    assert not any("stock" in k for k in sd.summarize(runs, 4)["levels"]["1"])
    # the no-overlap target-only server: its tok/s and the speed-up over it, per level
    runs["target-only-sync"] = {"levels": {"1": {"report": _report(12.5, ["a", "b", "c", "d"])},
                                           "4": {"report": _report(25.0, ["a", "b", "c", "d"])}}}
    one, four = (sd.summarize(runs, 4)["levels"][c] for c in ("1", "4"))
    assert (one["tok_s_target_only_sync"], one["speedup_eagle3_over_sync"]) == (12.5, 1.2)
    assert (four["speedup_eagle3"], four["speedup_eagle3_over_sync"]) == (0.8, 0.64)


def test_serve_demo_rounds_combine_as_tokens_over_seconds():
    sd = load_benchmark("serve_demo")
    reps = [{"total_output_tokens": 64, "duration": 8.0, "generated_texts": ["a"], "accept_length": 1.5},
            {"total_output_tokens": 64, "duration": 8.0, "generated_texts": ["a"], "accept_length": 1.7},
            {"total_output_tokens": 32, "duration": 8.0, "generated_texts": ["a"], "accept_length": 1.75}]
    # SGLang's acceptance is cumulative over the server's life: the last round's covers them all
    assert sd.combine(reps) == {"output_throughput": 160 / 24, "generated_texts": ["a"],
                                "accept_length": 1.75, "rounds_identical": True}
    reps[1]["generated_texts"] = ["b"]
    assert sd.combine(reps)["rounds_identical"] is False


def test_serve_demo_chunks_of_a_round_join_in_prompt_order():
    sd = load_benchmark("serve_demo")
    one = {"total_output_tokens": 128, "duration": 10.0, "completed": 2, "total_input_tokens": 30,
           "generated_texts": ["a", "b"], "output_lens": [64, 64], "accept_length": 1.5,
           "output_throughput": 12.8, "mean_itl_ms": 70.0, "backend": "sglang"}
    two = {"total_output_tokens": 64, "duration": 6.0, "completed": 1, "total_input_tokens": 10,
           "generated_texts": ["c"], "output_lens": [64], "accept_length": 1.7,
           "output_throughput": 64 / 6, "mean_itl_ms": 90.0, "backend": "sglang"}
    j = sd.join_chunks([one, two])
    assert j == {"total_output_tokens": 192, "duration": 16.0, "completed": 3, "total_input_tokens": 40,
                 "generated_texts": ["a", "b", "c"], "output_lens": [64, 64, 64], "accept_length": 1.7,
                 "backend": "sglang", "output_throughput": 12.0, "input_throughput": 2.5,
                 "request_throughput": 3 / 16,
                 "per_chunk": [{"output_throughput": 12.8, "mean_itl_ms": 70.0},
                               {"output_throughput": 64 / 6, "mean_itl_ms": 90.0}]}
    assert sd.join_chunks([one]) is one


def test_serve_demo_keeps_the_server_info_once_and_no_per_token_latencies():
    sd = load_benchmark("serve_demo")
    run: dict = {}
    first = sd.slim({"server_info": {"v": 1}, "itls": [0.1] * 64, "median_itl_ms": 100.0}, run)
    second = sd.slim({"server_info": {"v": 2}, "itls": [0.1] * 64, "median_itl_ms": 90.0}, run)
    assert first == {"median_itl_ms": 100.0} and second == {"median_itl_ms": 90.0}
    assert run == {"server_info": {"v": 1}}


def test_tree_sweep_settings_parse_or_name_the_expected_form():
    ts = load_benchmark("tree_sweep")
    assert ts.parse_setting("3,4,8") == (3, 4, 8)
    with pytest.raises(SystemExit, match=r"--settings '3x4': expected STEPS,TOPK,TOKENS"):
        ts.parse_setting("3x4")


def _seq(sid: str, tokens: list[int], labels: list[int], prompt: int) -> DataSequence:
    T = len(tokens)
    return DataSequence(id=sid, tokens=torch.tensor(tokens), prompt_len=prompt,
                        aux=torch.zeros(T - 1, 2), final=None, labels=torch.tensor(labels),
                        assistant=torch.tensor([i >= prompt for i in range(T)]),
                        topk_idx=torch.zeros(T - 1, 1, dtype=torch.int32),
                        topk_p=torch.ones(T - 1, 1, dtype=torch.float16))


def test_ngram_reference_scores_the_rows_the_trainer_scores():
    tl = load_benchmark("train_levers")
    # row i is scored when x_{i+1} and x_{i+2} are answer tokens; its label is labels[i+1]
    train = [_seq("t0", [9, 1, 2, 1, 2, 1], [0, 5, 6, 5, 6], prompt=1),  # 1->5 x2, 2->6 x2
             _seq("t1", [9, 4, 2, 3], [0, 7, 7], prompt=1)]               # 4->7, 2->7, (4,2)->7
    held = [_seq("h0", [9, 1, 2, 3, 4, 2, 1], [0, 5, 6, 0, 0, 7], prompt=1)]
    # held rows (x_i, x_{i+1}) -> label: (9,1)->5 both hit; (1,2)->6 both hit; (2,3)->0 both
    # miss (3 unseen); (3,4)->0 both miss; (4,2)->7: unigram says 6 (2 of 3), bigram says 7
    ref = tl.ngram_reference(train, held)
    assert ref == {"heldout_rows": 5, "unigram_top1": 0.4, "bigram_top1": 0.6}


def test_profile_serve_sorts_main_thread_samples_into_phases_and_ops():
    ps = load_benchmark("profile_serve")
    main = "run_scheduler_process (scheduler.py:1);Scheduler.run_event_loop (scheduler.py:2)"
    raw = "\n".join([
        f"{main};run_eagle_verify (c.py:1);LogitsProcessor.forward (l.py:1) 3",
        f"{main};run_eagle_verify (c.py:1);LlamaModel;packed_linear (p.py:9) 5",
        f"{main};run_eagle_verify (c.py:1);RMSNorm.forward_native (n.py:1) 2",
        f"{main};EagleDraftWorker.draft (e.py:7);packed_linear (p.py:9) 4",
        f"{main};EagleDraftWorker._draft_extend_for_decode (e.py:9);x 1",
        f"{main};Scheduler.recv_requests (s.py:3) 5",
        "Thread._bootstrap (threading.py:1);TMonitor.run (tqdm.py:1) 50",    # not the main thread
    ])
    total, phase, op = ps.shares(raw)
    assert total == 20
    assert dict(phase) == {"verify forward": 10, "draft steps": 4, "draft extend": 1, "other": 5}
    assert op["verify forward", "lm_head"] == 3 and op["verify forward", "linear layers"] == 5
    assert op["verify forward", "other"] == 2 and op["draft steps", "linear layers"] == 4


def test_small_gemm_bench_streams_the_weights_in_forward_order(tmp_path):
    """bench_small_gemm reads a checkpoint's linear weights layer by layer (layer 10 after
    layer 2, not in string order), the LM head last (the tied embedding without one), and
    every provider multiplies them as F.linear does."""
    from safetensors.torch import save_file

    bench = load_benchmark("bench_small_gemm")
    g = torch.Generator().manual_seed(0)
    t = {f"model.layers.{i}.mlp.down_proj.weight": torch.randn(8, 16, generator=g) for i in (10, 2)}
    t["model.layers.2.input_layernorm.weight"] = torch.ones(16)         # 1-D: not a linear
    t["model.embed_tokens.weight"] = torch.randn(32, 16, generator=g)
    save_file(t, str(tmp_path / "model.safetensors"))
    ws = bench.linear_weights(tmp_path)
    want = [t["model.layers.2.mlp.down_proj.weight"], t["model.layers.10.mlp.down_proj.weight"],
            t["model.embed_tokens.weight"]]
    assert len(ws) == 3 and all(torch.equal(a, b) for a, b in zip(ws, want))
    x = torch.randn(3, 16, generator=g)
    for name, fn in bench.providers(ws).items():
        for i, w in enumerate(ws):
            torch.testing.assert_close(fn(x, i), x @ w.T, rtol=1e-5, atol=1e-5, msg=name)
