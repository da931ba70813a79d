"""`eagle3 validate` says what the plugin says at server start, for every broken draft.

Each case is one defect, fed to ``eagle3 validate --json`` and, with the same flags, to
the launcher's check_launch (in process) and to ``python -m sglang.launch_server`` (CPU
engine; marker ``server``). All ask the check suite (eagle3_backend.checkpoint.suite),
so the verdict and the words must be the same; the launch ends before any weight is
read, with exit status 2 and the refusal's paragraph only (no traceback).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serving_drafts import HIDDEN, VOCAB, write_draft
from serving_launch import declared_entry_points, launch_server, subprocess_env

from eagle3_backend.cli import main
from eagle3_backend.errors import Eagle3Error
from eagle3_backend.serving.checks import REFUSES, LaunchArgs, check_launch
from eagle3_backend.serving.runtime import EXIT_REFUSED
from eagle3_backend.target import TargetInfo

TIMEOUT = 150  # s per launch; a refusal takes 20-40 s on 2 loaded cores
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]

# case: (write_draft defects, flags for validate and the server, a phrase of the refusal)
CASES = {
    "architectures": (dict(config_extra={"architectures": ["LlamaForCausalLM"]}), TREE,
                      "declares architectures ['LlamaForCausalLM']; expected "
                      "['LlamaForCausalLMEagle3']"),
    "fc-width": (dict(fc_in=2 * HIDDEN), TREE, "fc.weight takes 128 inputs; expected 192"),
    "layer-range": (dict(layout=["embed", "layer_input:2", "layer_input:11"]), TREE,
                    "names layer_input:11; expected sources of the target's 8 decoder layers"),
    "vocab-map-wrong": (dict(d2t_shift=VOCAB), TREE,
                        "draft id(s) outside the target vocabulary [0, 49152)"),
    "vocab-map-missing": (dict(drop=("d2t", "t2d")), TREE, "missing tensor(s) ['d2t', 't2d']"),
    "algorithm-eagle": ({}, ["--speculative-algorithm", "EAGLE", *TREE],
                        "--speculative-algorithm EAGLE was given an EAGLE-3 draft"),
    "unknown-tensor": (dict(extra={"fc.bias": torch.zeros(HIDDEN)}), TREE,
                       "SGLang's EAGLE-3 loader would skip tensor(s) ['fc.bias']"),
    "missing-tensor": (dict(drop=("midlayer.mlp.down_proj.weight",)), TREE,
                       "would keep parameter(s) ['model.layers.0.mlp.down_proj.weight'] at their "
                       "random initial values"),
    "tree-size": ({}, ["--speculative-num-steps", "1", "--speculative-eagle-topk", "2",
                       "--speculative-num-draft-tokens", "16"],
                  "proposes at most 2 tokens; expected a verify step of at most 3"),
    # stock SGLang stops at model-config time with a ValueError traceback; the plugin first
    "context-length": (dict(config_extra={"max_position_embeddings": 1024}), TREE,
                       "its derived context length (max_position_embeddings, SGLang's rule) is "
                       "1024; expected at least the target's context length 4096"),
}
# more defects, judged in process only (each real start costs ~20 s)
IN_PROCESS = {
    **CASES,
    "sglang-fc-width": (dict(ids=[1, 4]), TREE, "SGLang derives the fc input slots from "
                        "config.json (num_aux_hidden_states, else len(eagle_config.eagle_aux_hidden_"
                        "state_layer_ids), else 3): 2; expected 3"),
    "vocab-size": (dict(vocab=32000), TREE, "is 32000; expected 49152"),
    "last-layer": (dict(layout=["embed", "layer_input:2", "layer_input:8"]), TREE,
                   "needs layer_input:8 (the output of the last decoder layer), which SGLang "
                   "0.5.23's LlamaForCausalLM model file cannot capture"),
    "qkv-shard": (dict(rename={"midlayer.self_attn.k_proj.weight": "midlayer.self_attn.kproj.weight"}),
                  TREE, "model.layers.0.self_attn.qkv_proj.weight (shards ['k'])"),
    "tree-too-small": ({}, ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                            "--speculative-num-draft-tokens", "2"], "expected at least 4 slots"),
    "three-problems": (dict(layout=["embed", "layer_input:2", "layer_input:11"], fc_in=2 * HIDDEN,
                            vocab=32000), TREE, "fc.weight takes 128"),
}


def _validate(draft, target, flags, capsys) -> tuple[int, list[str]]:
    code = main(["validate", str(draft), "--target", str(target), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)["problems"]


def _flags(case: str) -> list[str]:
    flags = IN_PROCESS[case][1]
    return flags if "--speculative-algorithm" in flags else ["--speculative-algorithm", "EAGLE3",
                                                             *flags]


def _launch_args(draft, flags: list[str]) -> LaunchArgs:
    value = dict(zip(flags[::2], flags[1::2]))
    return LaunchArgs(value["--speculative-algorithm"], str(draft),
                      num_steps=int(value["--speculative-num-steps"]),
                      topk=int(value["--speculative-eagle-topk"]),
                      num_draft_tokens=int(value["--speculative-num-draft-tokens"]))


def test_a_good_draft_is_servable_for_both(tmp_path, tiny_target_dir, capsys):
    draft = write_draft(tmp_path / "draft")
    assert _validate(draft, tiny_target_dir / "config.json", _flags("fc-width"), capsys) == (0, [])
    plan = check_launch(_launch_args(draft, _flags("fc-width")),
                        TargetInfo.from_path(tiny_target_dir), env={})
    assert plan is not None  # real starts of good drafts: tests/serving/test_server.py


@pytest.mark.parametrize("case", list(IN_PROCESS))
def test_validate_and_the_plugin_refuse_alike(case, tmp_path, tiny_target_dir, capsys):
    """In process: ``eagle3 validate`` and the launcher's check_launch."""
    draft = write_draft(tmp_path / "draft", **IN_PROCESS[case][0])
    code, problems = _validate(draft, tiny_target_dir / "config.json", _flags(case), capsys)
    assert code == 1 and any(IN_PROCESS[case][2] in p for p in problems), problems
    assert (len(problems) == 3) == (case == "three-problems"), problems
    with pytest.raises(Eagle3Error) as refusal:
        check_launch(_launch_args(draft, _flags(case)), TargetInfo.from_path(tiny_target_dir),
                     env={})
    assert str(refusal.value) == _paragraph(problems, draft, tiny_target_dir / "config.json")


def _paragraph(problems: list[str], draft, target) -> str:
    if len(problems) == 1:
        return f"{REFUSES}: {problems[0]}"
    return (f"{REFUSES} ({len(problems)} problems with draft {draft} on target {target}):\n"
            + "\n".join(f"  - {p}" for p in problems))


# the same refusals on the DeepSeek-V3 / Kimi-K2 structure (MLA, grouped-routing MoE; the
# small target of eagle3_backend.cpu.tiny_targets at the drafts' hidden size, 8 layers)
DEEPSEEK_CASES = ("fc-width", "layer-range", "vocab-map-wrong", "algorithm-eagle", "tree-size")
SERVED = [("llama", c) for c in CASES] + [("deepseek_v3", c) for c in DEEPSEEK_CASES]


@pytest.fixture(scope="module")
def targets(tiny_target_dir, tmp_path_factory) -> dict:
    from eagle3_backend.cpu.tiny_targets import write_target

    ds = write_target("deepseek_v3", tmp_path_factory.mktemp("ds") / "target", hidden_size=HIDDEN)
    return {"llama": tiny_target_dir, "deepseek_v3": ds}


@pytest.fixture(scope="module")
def launches(plugin_site, targets, tmp_path_factory):
    """Every case's draft and its server start, two at a time (each is mostly imports)."""
    pytest.importorskip("sglang")
    assert declared_entry_points().get("sglang.srt.platforms"), "no CPU platform entry point"
    env, root = subprocess_env(plugin_site), tmp_path_factory.mktemp("verdicts")
    drafts = {case: write_draft(root / case, **CASES[case][0]) for case in CASES}

    def start(key: tuple[str, str]):
        family, case = key
        return launch_server(["--model-path", str(targets[family]), "--dtype", "float32",
                              "--speculative-draft-model-path", str(drafts[case]), *_flags(case)],
                             env, root / f"{family}-{case}.log", timeout=TIMEOUT)

    with ThreadPoolExecutor(2) as pool:
        return {key: (drafts[key[1]], run) for key, run in zip(SERVED, pool.map(start, SERVED))}


@pytest.mark.server
@pytest.mark.sglang
@pytest.mark.parametrize("family, case", SERVED)
def test_validate_and_the_server_refuse_alike(family, case, launches, targets, capsys):
    """A real start ends with validate's words, once, and exit status 2."""
    draft, run = launches[family, case]
    target = targets[family]
    code, problems = _validate(draft, target / "config.json", _flags(case), capsys)
    out = run.output
    assert run.returncode == EXIT_REFUSED, f"{case}: rc {run.returncode} after {run.seconds:.0f} s\n{out[-3000:]}"
    assert "Traceback" not in out and "Load weight begin" not in out, out[-3000:]
    assert out.count(REFUSES) == 1, out[-3000:]
    assert code == 1 and _paragraph(problems, draft, target) in out, out[-3000:]


@pytest.mark.server
@pytest.mark.sglang
def test_a_draft_that_is_not_there_is_refused_by_the_server_in_one_paragraph(
        plugin_site, tiny_target_dir, tmp_path):
    """SGLang reads the draft's config while it resolves its arguments (before the plugin's
    other checks): a hub id with the hub offline ended in two huggingface_hub tracebacks."""
    env = subprocess_env(plugin_site, HF_HUB_OFFLINE="1")
    run = launch_server(["--model-path", str(tiny_target_dir), "--dtype", "float32",
                         "--speculative-draft-model-path", "no-such-org/no-such-draft",
                         *_flags("fc-width")], env, tmp_path / "hub-id.log", timeout=TIMEOUT)
    out = run.output
    assert run.returncode == EXIT_REFUSED, f"rc {run.returncode} after {run.seconds:.0f} s\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    assert out.count("eagle3_backend refuses to start: draft 'no-such-org/no-such-draft' is not "
                     "a local directory and could not be fetched") == 1, out[-3000:]
