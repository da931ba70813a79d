"""`eagle3 eval` and `eagle3 bench` end to end through eagle3_backend.cli.main.

eval runs on a small HF-dir target (8 random layers, SmolLM2's tokenizer and chat
template) with a demo draft written by the checkpoint package; bench runs against
the local SGLang-shaped server of sglang_peer.py.
"""

from __future__ import annotations

import json

import pytest

from eagle3_backend.cli import main

EVAL_KEYS = {"acceptance_length", "acceptance_rate_by_position", "tokens_per_s",
             "baseline_tokens_per_s", "speedup", "outputs_identical", "n_prompts"}


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Name three colours."}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "Count to five."}]}) + "\n",
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo_draft(tiny_target_dir, tmp_path_factory):
    from eagle3_backend.checkpoint.demo import make_demo_draft
    from eagle3_backend.target import TargetInfo

    out = tmp_path_factory.mktemp("demo-draft") / "draft"
    make_demo_draft(out, TargetInfo.from_path(tiny_target_dir), seed=0, draft_vocab_size=4096)
    return out


def _eval(capsys, *extra):
    code = main(["eval", *map(str, extra), "--no-progress", "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_eval_json_fp32_identical_and_files(capsys, tmp_path, tiny_target_dir, demo_draft, prompts_file):
    code, r = _eval(capsys, "--target", tiny_target_dir, "--draft", demo_draft, "--dataset",
                    prompts_file, "--max-new-tokens", 8, "--speculative-num-steps", 2,
                    "--speculative-eagle-topk", 2, "--output-dir", tmp_path / "res", "--name", "ev")
    assert code == 0
    assert EVAL_KEYS <= set(r)
    assert r["n_prompts"] == 2 and r["outputs_identical"] is True and r["agreement_rate"] == 1.0
    assert r["acceptance_by_category"] is None  # no record names a category
    assert r["settings"] == {"speculative_num_steps": 2, "speculative_eagle_topk": 2,
                             "speculative_num_draft_tokens": 7}
    assert r["acceptance_length"] == pytest.approx(r["completion_tokens"] / r["verify_steps"])
    assert len(r["acceptance_rate_by_position"]) == 2
    assert sum(r["acceptance_histogram"]) == r["verify_steps"]
    assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["baseline_tokens_per_s"])
    ms = r["step_ms"]
    assert ms["step"] == pytest.approx(ms["draft"] + ms["verify"] + ms["accept"])
    assert ms["step_cost"] == pytest.approx(ms["step"] / ms["decode"])
    assert r["layout"] == "[layer_input:2, layer_input:4, layer_input:5]"
    saved = json.loads((tmp_path / "res" / "ev.json").read_text())
    assert saved["results"]["n_prompts"] == 2
    assert saved["settings"]["speculative_eagle_topk"] == 2
    assert (tmp_path / "res" / "ev-acceptance.png").is_file()
    assert (tmp_path / "res" / "ev-speedup.png").is_file()


def test_eval_reports_acceptance_by_category(capsys, tmp_path, tiny_target_dir, demo_draft):
    path = tmp_path / "cats.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Write a poem.", "category": "writing"},
        {"prompt": "Sort a list in Python.", "category": "coding"},
        {"prompt": "Write a limerick.", "category": "writing"},
        {"prompt": "No category here."}]), encoding="utf-8")
    code, r = _eval(capsys, "--target", tiny_target_dir, "--draft", demo_draft, "--dataset", path,
                    "--max-new-tokens", 6, "--no-baseline")
    assert code == 0
    rows = r["per_prompt"]
    assert [row.get("category") for row in rows] == ["writing", "coding", "writing", None]
    want = {name: {"prompts": len(ix), "acceptance_length": sum(rows[i]["completion_tokens"] for i in ix)
                   / sum(rows[i]["verify_steps"] for i in ix)}
            for name, ix in (("coding", [1]), ("writing", [0, 2]))}
    assert r["acceptance_by_category"] == want
    assert list(r["acceptance_by_category"]) == ["coding", "writing"]
    assert main(["eval", "--target", str(tiny_target_dir), "--draft", str(demo_draft), "--dataset",
                 str(path), "--max-new-tokens", "2", "--no-baseline", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "by category           coding " in out
    assert "speedup               n/a (no target-only run)\n" in out


def test_eval_bf16_reports_agreement(capsys, tiny_target_dir, demo_draft, prompts_file):
    code, r = _eval(capsys, "--target", tiny_target_dir, "--draft", demo_draft, "--dataset",
                    prompts_file, "--max-new-tokens", 6, "--dtype", "bfloat16", "--limit", 1)
    assert code == 0  # bf16 differences are reported, not failed
    assert r["dtype"] == "bfloat16" and r["n_prompts"] == 1
    assert r["agreement_rate"] in (0.0, 1.0)
    assert r["outputs_identical"] is (r["agreement_rate"] == 1.0)


def test_eval_bad_input_exits_2(capsys, tiny_target_dir, demo_draft, tmp_path):
    code = main(["eval", "--target", str(tiny_target_dir), "--draft", str(demo_draft),
                 "--dataset", str(tmp_path / "missing.jsonl")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
    code = main(["eval", "--draft", str(demo_draft), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "9"])
    assert code == 2
    assert "verifies exactly 4 tokens" in capsys.readouterr().err


def test_eval_turn_2_asks_the_follow_up_after_the_targets_own_answer(capsys, tmp_path,
                                                                    tiny_target_dir, demo_draft):
    from eagle3_backend.verify.datasets import Prompt, render_prompt
    from eagle3_backend.verify.engine import generate_target_only
    from eagle3_backend.verify.targets import load_target

    path = tmp_path / "turns.jsonl"
    path.write_text(json.dumps({"question_id": 7, "turns": ["Name a colour.", "Another one?"]})
                    + "\n" + json.dumps({"prompt": "One turn only."}) + "\n", encoding="utf-8")
    args = ["--target", tiny_target_dir, "--draft", demo_draft, "--dataset", path,
            "--max-new-tokens", 6]
    code, r = _eval(capsys, *args, "--turn", 2)
    assert code == 0
    assert (r["n_prompts"], r["turn"], r["prompts_without_turn"]) == (1, 2, 1)
    assert r["outputs_identical"] is True
    target = load_target(tiny_target_dir, progress=False)
    tok = target.tokenizer
    first = generate_target_only(target, render_prompt(tok, Prompt("7", (("user", "Name a colour."),))), 6)
    chat = (("user", "Name a colour."), ("assistant", tok.decode(first.tokens, skip_special_tokens=True)),
            ("user", "Another one?"))
    assert r["per_prompt"][0]["prompt_tokens"] == len(render_prompt(tok, Prompt("7", chat)))
    assert _eval(capsys, *args)[1]["turn"] == 1
    assert main(["eval", *map(str, args), "--turn", "3", "--no-progress"]) == 2
    assert "--turn 3: none of the 2 prompts has 3 user turns" in capsys.readouterr().err
    assert main(["eval", *map(str, args), "--turn", "2", "--no-chat-template"]) == 2
    assert "drop --no-chat-template" in capsys.readouterr().err


def test_bench_cli_json_and_plots(capsys, tmp_path, serve, prompts_file):
    spec, base = serve(), serve(spec=False)
    code = main(["bench", "--url", spec.url, "--baseline-url", base.url, "--dataset", str(prompts_file),
                 "--concurrency", "1,2", "--max-new-tokens", "16", "--json", "--no-progress",
                 "--output-dir", str(tmp_path), "--name", "b"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
    assert r["levels"][0]["spec"]["acceptance_length"] is not None
    assert r["errors"] == []
    for name in ("b.json", "b-throughput.png", "b-acceptance.png", "b-speedup.png"):
        assert (tmp_path / name).is_file(), name
    # native API without --tokenizer sends the raw user text
    assert {b["text"] for _, b in spec.bodies} == {"Name three colours.", "Count to five."}


def test_bench_notes_a_url_that_does_not_speculate(capsys, serve, prompts_file):
    base = serve(spec=False)  # the target-only server given as --url
    assert main(["bench", "--url", base.url, "--dataset", str(prompts_file), "--concurrency", "1",
                 "--max-new-tokens", "4", "--warmup", "0", "--no-progress"]) == 0
    assert (f"eagle3 bench: note: {base.url} does not speculate (its /server_info has no "
            "speculative_algorithm)") in capsys.readouterr().err


def test_bench_tokenizer_sends_the_chat_template_text(capsys, serve, prompts_file):
    from eagle3_backend.verify.targets import load_tokenizer

    spec = serve()
    assert main(["bench", "--url", spec.url, "--dataset", str(prompts_file), "--concurrency", "1",
                 "--max-new-tokens", "4", "--warmup", "0", "--json", "--no-progress",
                 "--tokenizer", "bundled"]) == 0
    tok = load_tokenizer("bundled")
    want = {tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=False) for q in ("Name three colours.", "Count to five.")}
    assert {b["text"] for _, b in spec.bodies} == want
    assert all(t.startswith("<|im_start|>") and t.endswith("<|im_start|>assistant\n") for t in want)


def test_bench_cli_prints_acceptance_by_category(capsys, tmp_path, serve):
    from sglang_peer import tokens_for

    path = tmp_path / "cats.jsonl"
    texts = ["Sort a list.", "Write a poem about rain.", "Reverse a string."]
    path.write_text("\n".join(json.dumps({"prompt": t, "category": c}) for t, c in
                              zip(texts, ["coding", "writing", "coding"])), encoding="utf-8")
    spec = serve()
    assert main(["bench", "--url", spec.url, "--dataset", str(path), "--concurrency", "1",
                 "--warmup", "0", "--no-progress"]) == 0
    counts = [tokens_for(t) for t in texts]
    coding = (counts[0][0] + counts[2][0]) / (counts[0][1] + counts[2][1])
    writing = counts[1][0] / counts[1][1]
    assert f"c=1 accept by category: coding {coding:.2f}, writing {writing:.2f}" in capsys.readouterr().out


def test_bench_cli_failures_exit_1_and_are_listed(capsys, tmp_path, serve, prompts_file):
    srv = serve(mode="500")
    code = main(["bench", "--url", srv.url, "--dataset", str(prompts_file), "--concurrency", "2",
                 "--warmup", "0", "--no-progress"])
    assert code == 1
    captured = capsys.readouterr()
    assert "0/2" in captured.out
    assert captured.err.count("HTTP 500") == 2
    assert main(["bench", "--url", srv.url, "--dataset", str(prompts_file), "--concurrency", "0"]) == 2


# --------------------------------------------------------------------------- bad input, before the run
def _closed_port_url() -> str:
    from eagle3_backend.cpu.launch import free_port

    return f"http://127.0.0.1:{free_port()}"  # bound once, never listening: connections are refused


def test_unwritable_results_place_is_refused_before_the_run(capsys, tmp_path, prompts_file):
    """--output-dir / --name / doctor --plot are checked first: the draft given here does not
    even exist, and the error is about the output, so nothing ran (and nothing is lost)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    absent = tmp_path / "no-draft"
    cases = [
        (["eval", "--draft", absent, "--output-dir", blocker],
         f"eagle3 eval: error: --output-dir {blocker}: {blocker} is a file; expected a directory. "
         "Choose another --output-dir.\n"),
        (["eval", "--draft", absent, "--output-dir", blocker / "sub"],
         f"eagle3 eval: error: --output-dir {blocker / 'sub'}: cannot write there (Not a "
         "directory); checked before the run so its results are not lost at the end. Choose a "
         "writable --output-dir.\n"),
        (["eval", "--draft", absent, "--name", "my run"],
         "eagle3 eval: error: results name 'my run' must be letters, digits, '.', '_' or '-' (a "
         "file stem), e.g. 'eval-smollm2-chain3'.\n"),
        (["bench", "--url", "http://127.0.0.1:1", "--dataset", prompts_file, "--output-dir",
          blocker], f"eagle3 bench: error: --output-dir {blocker}: {blocker} is a file; "
                    "expected a directory. Choose another --output-dir.\n"),
        (["doctor", absent, "--plot", tmp_path / "scores.json"],
         f"eagle3 doctor: error: --plot {tmp_path / 'scores.json'}: 'json' file format; expected "
         "one of "),
        (["doctor", absent, "--plot", tmp_path],
         f"eagle3 doctor: error: --plot {tmp_path}: no file format; expected one of "),
        (["doctor", absent, "--plot", blocker / "s.png"],
         f"eagle3 doctor: error: --plot directory {blocker}: {blocker} is a file; expected a "
         "directory. Choose another --plot directory.\n"),
    ]
    for argv, message in cases:
        assert main([*map(str, argv), "--no-progress"]) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(message) and err.count("\n") == 1, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "prompts.jsonl"]


def test_bench_and_doctor_refuse_a_url_without_a_server(capsys, tmp_path, prompts_file, serve):
    dead = _closed_port_url()
    start = (f"--url {dead}: cannot connect ([Errno 111] Connection refused); no server answers "
             "there. Start the SGLang server (python -m sglang.launch_server ... --port N) or fix "
             "--url.\n")
    # native API without --tokenizer: the URL is refused before the chat-template note
    assert main(["bench", "--url", dead, "--dataset", str(prompts_file), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"eagle3 bench: error: {start}")
    live = serve()
    assert main(["bench", "--url", live.url, "--baseline-url", dead, "--dataset",
                 str(prompts_file), "--api", "openai", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("eagle3 bench: error: " + start.replace("--url", "--baseline-url"))
    assert live.bodies == []            # not one prompt was sent
    assert main(["bench", "--url", "127.0.0.1:30000", "--dataset", str(prompts_file),
                 "--api", "openai"]) == 2
    assert capsys.readouterr().err == (
        "eagle3 bench: error: --url '127.0.0.1:30000' has no http:// or https:// scheme and host; "
        "expected e.g. http://127.0.0.1:30000. Pass --url http://127.0.0.1:30000.\n")
    # doctor: refused before the target is loaded (the draft path does not even exist)
    assert main(["doctor", str(tmp_path / "no-draft"), "--url", dead, "--no-progress"]) == 2
    assert capsys.readouterr().err == f"eagle3 doctor: error: {start}"


def test_a_draft_given_as_the_target_is_named(capsys, tiny_target_dir, demo_draft, prompts_file):
    for argv in (["eval", "--draft", demo_draft, "--target", demo_draft, "--dataset", prompts_file],
                 ["doctor", demo_draft, "--target", demo_draft, "--dataset", prompts_file]):
        assert main([*map(str, argv), "--no-progress"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == (
            f"eagle3 {argv[0]}: error: target {str(demo_draft)!r} is an EAGLE-3 draft checkpoint "
            "(architectures ['LlamaForCausalLMEagle3']), not a target model. Pass the target (HF "
            "model dir or .gguf) as the target and the draft as the draft.\n")
    # a target given as the draft: named before the long offline run
    assert main(["doctor", str(tiny_target_dir), "--target", str(tiny_target_dir), "--dataset",
                 str(prompts_file), "--no-progress"]) == 2
    assert "is not an EAGLE-3 draft" in capsys.readouterr().err


def test_bad_run_settings_are_refused_before_loading(capsys, tmp_path, prompts_file):
    """Wrong numbers and devices a user may type: exit 2 and one line naming the flag, found
    before any model is loaded (the draft path given does not exist)."""
    import torch

    absent = str(tmp_path / "no-draft")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    no_gpu = ("--device cuda: no CUDA device is visible here (torch CUDA build: "
              f"{torch.version.cuda or 'none'}). Use --device cpu.")
    cases = [
        (["eval", "--draft", absent, "--temperature", "-1"],
         "eagle3 eval: error: --temperature must be >= 0 (0 = greedy), got -1.0."),
        (["eval", "--draft", absent, "--threads", "0"],
         "eagle3 eval: error: --threads must be >= 1, got 0."),
        (["doctor", absent, "--threads", "-2"],
         "eagle3 doctor: error: --threads must be >= 1, got -2."),
        (["eval", "--draft", absent, "--device", "gpu"],
         "eagle3 eval: error: --device 'gpu' is not a torch device; expected cpu, cuda or cuda:N."),
        (["doctor", absent, "--device", "gpu"],
         "eagle3 doctor: error: --device 'gpu' is not a torch device; expected cpu, cuda or cuda:N."),
        (["bench", "--url", "http://127.0.0.1:1", "--dataset", prompts_file, "--warmup", "-1"],
         "eagle3 bench: error: --warmup must be >= 0 requests, got -1."),
        (["train", "--out", tmp_path / "o", "--draft-vocab", "0"],
         "eagle3 train: error: --draft-vocab must be >= 1, got 0."),
        (["train", "--out", tmp_path / "o", "--layout", "[layer_input:2, layer_input:2]"],
         "eagle3 train: error: --layout '[layer_input:2, layer_input:2]': layout [layer_input:2, "
         "layer_input:2] names layer_input:2 twice; two identical fc input slots carry no "
         "information and no engine captures a state twice. Give --layout sources of this "
         "target's layers, each once."),
        (["train", "--out", tmp_path / "o", "--layout", "[embed, layer_input:31]"],
         "eagle3 train: error: --layout '[embed, layer_input:31]': layout [embed, layer_input:31] "
         "names layer_input:31, but the target has 30 decoder layers (valid: embed, layer_input:1 "
         ".. layer_input:30). Give --layout sources of this target's layers, each once."),
        (["train", "--out", tmp_path / "o", "--steps", "0"],
         "eagle3 train: error: --steps must be >= 1, got 0."),
        (["train", "--out", tmp_path / "o", "--cache-data", prompts_file],
         f"eagle3 train: error: --cache-data {prompts_file} is a file; expected a directory "
         "(created when missing). Pass another path."),
        (["eval", "--draft", absent, "--dataset", prompts_file],  # before the target loads
         f"eagle3 eval: error: checkpoint '{absent}' does not exist; expected a draft checkpoint "
         "directory holding config.json and model.safetensors. Check the path."),
        (["eval", "--draft", absent, "--turn", "0"],
         "eagle3 eval: error: --turn 0: turns count from 1 (the first user turn); expected --turn 1 "
         "or more."),
        (["eval", "--draft", absent, "--speculative-num-steps", "2", "--speculative-eagle-topk", "4",
          "--speculative-num-draft-tokens", "1"],
         "eagle3 eval: error: speculative_num_draft_tokens=1 is out of range for 2 steps with top-k "
         "4: expected 2..21 (root + at most k + (steps-1)*k*k drafted nodes). Raise it to at least 2 "
         "(the root and one draft token)."),
    ]
    if gpus == 0:
        cases.append((["eval", "--draft", absent, "--device", "cuda"], "eagle3 eval: error: " + no_gpu))
    for argv, message in cases:
        assert main([*map(str, argv), "--no-progress"]) == 2, argv
        out, err = capsys.readouterr()
        assert (out, err) == ("", message + "\n"), argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl"]


def test_eval_on_a_full_disk_still_prints_its_results(tmp_path, tiny_target_dir, demo_draft,
                                                      prompts_file):
    """The results files cannot be written at the end (a real write failure: a 2 KiB file
    size limit, as a full disk): the finished run's results still reach stdout, then a
    one-line error, exit 2, and no half-written results file."""
    import os
    import resource
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "res"

    def limit() -> None:  # in the child: a write past 2 KiB fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "eagle3_backend", "eval", "--target", str(tiny_target_dir),
         "--draft", str(demo_draft), "--dataset", str(prompts_file), "--max-new-tokens", "4",
         "--threads", "1", "--no-progress", "--json", "--output-dir", str(out), "--name", "ev"],
        capture_output=True, text=True, env=env, timeout=600, preexec_fn=limit)
    assert res.returncode == 2, res.stderr
    r = json.loads(res.stdout)
    assert r["n_prompts"] == 2 and "files" not in r
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("eagle3 eval: error: the run finished (results above) but writing its "
                           "files failed: File too large (")
    assert last.endswith("). Free space or choose another --output-dir, and rerun to save them.")
    assert "Traceback" not in res.stderr
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_wrong_dataset_is_named_before_the_target_is_loaded(capsys, tmp_path, tiny_target_dir):
    """doctor and train read --dataset before loading the target: given a target that cannot
    load (weights missing), the error is still the dataset's."""
    import shutil

    no_weights = tmp_path / "target"
    no_weights.mkdir()
    shutil.copy(tiny_target_dir / "config.json", no_weights)
    missing = tmp_path / "nosuch.jsonl"
    message = (f"dataset file {str(missing)!r} does not exist; expected mt-bench, sharegpt or a "
               "prompt file")
    for argv in (["doctor", tmp_path / "d", "--target", no_weights, "--dataset", missing],
                 ["train", "--out", tmp_path / "o", "--target", no_weights, "--dataset", missing,
                  "--layout", "[embed]"]):
        assert main([*map(str, argv), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"eagle3 {argv[0]}: error: {message}"), err


def test_eval_prints_where_a_verify_step_goes(capsys):
    from eagle3_backend.verify.cli import _print_eval

    r = {"n_prompts": 2, "dataset": "mt-bench", "max_new_tokens": 8, "temperature": 0.0,
         "dtype": "float32", "device": "cpu", "settings": {}, "acceptance_length": 2.0,
         "completion_tokens": 16, "verify_steps": 8, "acceptance_rate_by_position": [0.5],
         "acceptance_histogram": [4, 4], "tokens_per_s": 30.0, "baseline_tokens_per_s": 20.0,
         "speedup": 1.5, "outputs_identical": True, "agreement_rate": 1.0,
         "step_ms": {"draft": 4.0, "verify": 31.5, "accept": 0.75, "step": 36.25,
                     "decode": 25.0, "step_cost": 1.45}}
    _print_eval(r)
    lines = capsys.readouterr().out.splitlines()
    assert ("verify step           36.2 ms: draft 4.0, target forward 31.5, accept 0.8 = 1.45 "
            "decode steps of 25.0 ms") in lines
    del r["step_ms"]["step_cost"], r["step_ms"]["decode"]  # --no-baseline
    _print_eval(r)
    lines = capsys.readouterr().out.splitlines()
    assert "verify step           36.2 ms: draft 4.0, target forward 31.5, accept 0.8" in lines
    assert "outputs identical     True (agreement 100% of prompts)" in lines
    # in bf16 a verify and a decode round differently: a difference is explained, not alarming
    _print_eval({**r, "dtype": "bfloat16", "outputs_identical": False, "agreement_rate": 0.5})
    assert ("outputs identical     False (agreement 50% of prompts; expected in reduced precision: "
            "a k-token verify and a 1-token decode round differently, so a near-tie can fall the "
            "other way (identical is checked in float32))") in capsys.readouterr().out.splitlines()
