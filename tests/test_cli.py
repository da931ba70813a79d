"""The `eagle3` command: in-process for most cases, two subprocess runs for exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from eagle3_backend.cli import main
from eagle3_backend.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]
DEFAULT30 = ["layer_input:2", "layer_input:15", "layer_input:27"]
# A draft shaped for the bundled SmolLM2-135M target (hidden 576, vocab 49152), kept small.
SMOL = dict(hidden_size=576, target_hidden_size=576, vocab_size=49152, draft_vocab_size=8192,
            num_attention_heads=9, num_key_value_heads=3, intermediate_size=64, embed=False,
            max_position_embeddings=8192)


def run(capsys, *argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- inspect
def test_inspect_json_exact(make_draft_checkpoint, capsys):
    ckpt = make_draft_checkpoint("sglang")
    code, out, err = run(capsys, "inspect", ckpt, "--json")
    assert (code, err) == (0, "")
    rep = json.loads(out)
    H, I, V, Vd, heads, kv, hd = 64, 128, 512, 128, 4, 2, 16
    params = (V * H + 3 * H * H                                  # embed_tokens, fc
              + 2 * H * (heads + 2 * kv) * hd + heads * hd * H    # q, k, v (2H in), o
              + 3 * H * I + 4 * H + Vd * H)                       # mlp, 4 norms, lm_head
    assert params == 98560
    expected = {
        "path": str(ckpt), "format": "sglang", "layout": DEFAULT30, "layout_source": "explicit",
        "target_hidden_size": 64, "hidden_size": 64, "fc_in_features": 192,
        "draft_vocab_size": 128, "target_vocab_size": 512, "has_d2t": True,
        "has_embed_tokens": True, "dtype": "float32", "num_parameters": params,
        "target": {"architecture": "LlamaForCausalLM", "num_hidden_layers": 30},
        "sglang_ids": [1, 14, 26], "warnings": [],
    }
    assert {k: rep[k] for k in expected} == expected
    assert rep["layout_explanation"] == ("config.json eagle3_layout = "
                                         "[layer_input:2, layer_input:15, layer_input:27]")


def test_inspect_text_reports_assumption(make_draft_checkpoint, tiny_target_config, capsys):
    ckpt = make_draft_checkpoint("speculators", ids=None, record_layout=False, dtype="bfloat16")
    code, out, err = run(capsys, "inspect", ckpt, "--target", tiny_target_config())
    assert code == 0, err
    lines = dict(line.split(None, 1) for line in out.splitlines() if not line.startswith(" "))
    assert lines["layout"] == "[layer_input:2, layer_input:15, layer_input:27]"
    assert lines["known"].startswith("from  assumed-default: eagle_aux_hidden_state_layer_ids is "
                                     "null: assumed the speculators/vLLM default")
    assert lines["dtype"] == "bfloat16, 98,560 parameters"
    assert lines["fc"] == "3 x 64 = 192 -> 64"
    assert "warning: " in out and "right only if the draft was trained with the default" in out
    # RedHat's published speculators configs have no such key at all
    ckpt = make_draft_checkpoint("speculators", ids=None, record_layout=False, config_hook=lambda c:
                                 c.pop("eagle_aux_hidden_state_layer_ids"))
    code, out, err = run(capsys, "inspect", ckpt, "--target", tiny_target_config())
    assert code == 0 and "from  assumed-default: eagle_aux_hidden_state_layer_ids is absent: " in out


def test_pickle_via_cli(make_draft_checkpoint, capsys):
    ckpt = make_draft_checkpoint("sglang", pickle=True)
    code, out, err = run(capsys, "inspect", ckpt)
    assert code == 2 and out == ""
    assert "refused" in err and "--allow-pickle" in err and "Traceback" not in err
    code, out, err = run(capsys, "inspect", ckpt, "--allow-pickle", "--json")
    assert code == 0 and json.loads(out)["num_parameters"] == 98560


def test_validate_judges_a_pickle_draft_as_its_safetensors_copy(make_draft_checkpoint,
                                                                tiny_target_config, capsys):
    """SGLang's loader reads pytorch_model.bin too: with --allow-pickle, validate's model of
    that loader gets the pickle's tensor names (it once saw none and called every weight
    unfilled)."""
    target = tiny_target_config()
    verdicts = []
    for ckpt, extra in ((make_draft_checkpoint("sglang", pickle=True), ["--allow-pickle"]),
                        (make_draft_checkpoint("sglang"), [])):
        code, out, err = run(capsys, "validate", ckpt, "--target", target, "--json", *extra)
        verdicts.append((code, json.loads(out)["problems"]))
    assert verdicts[0] == verdicts[1] == (0, [])


def test_bad_input_is_one_paragraph_exit_2(make_draft_checkpoint, capsys):
    ckpt = make_draft_checkpoint("sglang")
    (ckpt / "config.json").write_text("{broken")
    code, out, err = run(capsys, "inspect", ckpt)
    assert code == 2 and out == ""
    assert err.startswith(f"eagle3 inspect: error: {ckpt}/config.json: is not valid JSON (line 1, "
                          f"column 2")
    assert err.count("\n") == 1
    with pytest.raises(CheckpointError):
        main(["--debug", "inspect", str(ckpt)])


# --------------------------------------------------------------------------- convert
def test_convert_round_trip_and_overwrite_refusal(make_draft_checkpoint, tmp_path, capsys):
    src = make_draft_checkpoint("specforge", dtype="bfloat16", dtype_key="dtype")
    target = tmp_path / "t.json"
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
                                  "hidden_size": 64, "vocab_size": 512}))
    spec = tmp_path / "spec"
    code, out, err = run(capsys, "convert", src, spec, "--to", "speculators", "--target", target)
    assert code == 0, err
    assert out.startswith(f"wrote {spec} (speculators format, bfloat16, layout "
                          f"[layer_input:2, layer_input:15, layer_input:27], from sglang {src}; "
                          f"layout engine-ids)")
    cfg = json.loads((spec / "config.json").read_text())
    assert (cfg["eagle_aux_hidden_state_layer_ids"], cfg["torch_dtype"]) == ([2, 15, 27], "bfloat16")

    back = tmp_path / "back"
    assert run(capsys, "convert", spec, back, "--to", "sglang")[0] == 0
    code, out, err = run(capsys, "convert", spec, back, "--to", "sglang")
    assert code == 2 and "is not empty; refusing to overwrite" in err and "--force" in err
    assert run(capsys, "convert", spec, back, "--to", "sglang", "--force")[0] == 0
    code, out, err = run(capsys, "inspect", back, "--json")
    rep = json.loads(out)
    assert (rep["layout"], rep["layout_source"], rep["dtype"], rep["has_embed_tokens"]) == (
        DEFAULT30, "explicit", "bfloat16", False)


def test_convert_to_sglang_says_what_validate_says(make_draft_checkpoint, tiny_target_config,
                                                   tmp_path, capsys):
    """A speculators draft with norm_before_residual: SGLang's file has the flag, SGLang 0.5.23
    ignores it. convert --target prints validate's note about the draft it wrote."""
    src = make_draft_checkpoint("speculators", norm_before_residual=True)
    target = tiny_target_config()
    code, out, err = run(capsys, "convert", src, tmp_path / "sg", "--to", "sglang", "--target", target)
    assert code == 0, err
    _, validated, _ = run(capsys, "validate", tmp_path / "sg", "--target", target)
    notes = [line for line in validated.splitlines() if line.startswith("note: ")]
    assert any("norm_before_residual is true" in n for n in notes), validated
    assert [line for line in out.splitlines() if line.startswith("note: ")] == notes


def test_convert_needs_target_when_not_recorded(make_draft_checkpoint, tmp_path, capsys):
    code, out, err = run(capsys, "convert", make_draft_checkpoint("specforge"), tmp_path / "o",
                         "--to", "sglang")
    assert code == 2 and "the target is not recorded" in err and "Pass --target" in err
    assert not (tmp_path / "o").exists()


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root (relative) -> file bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def test_convert_never_writes_over_its_input(make_draft_checkpoint, tmp_path, capsys):
    """DST = SRC, DST holding SRC, DST a link to SRC: refused with or without --force, and
    the source (with the user's own files next to it) is left byte for byte."""
    work = tmp_path / "work"
    src = make_draft_checkpoint("sglang", name="work/src")
    (src / "train_report.json").write_text("{}")
    (work / "mine.txt").write_text("precious")
    (work / "link").symlink_to(src)
    before = _snapshot(tmp_path)
    for dst, word in ((src, "is"), (work, "holds"), (work / "link", "is")):
        for force in ((), ("--force",)):
            code, out, err = run(capsys, "convert", src, dst, "--to", "sglang", *force)
            assert (code, out) == (2, ""), (dst, force, err)
            assert err == (f"eagle3 convert: error: destination {str(dst)!r} {word} the input "
                           f"{str(src)!r}; writing there would destroy it. Choose a new output "
                           f"directory outside the input.\n")
    assert _snapshot(tmp_path) == before


def test_convert_force_keeps_a_directory_of_other_files(make_draft_checkpoint, tmp_path, capsys):
    src = make_draft_checkpoint("sglang")
    dst = tmp_path / "results"
    (dst / "plots").mkdir(parents=True)
    (dst / "config.json").write_text("{}")
    (dst / "eval.json").write_text("{}")
    before = _snapshot(dst)
    code, out, err = run(capsys, "convert", src, dst, "--to", "sglang", "--force")
    assert (code, out) == (2, "")
    assert err == (f"eagle3 convert: error: destination {str(dst)!r} holds eval.json, plots, "
                   f"which are not draft checkpoint files; --force replaces only a checkpoint "
                   f"directory (config.json, *.safetensors, train_report.json). Move those away "
                   f"or choose a new directory.\n")
    assert _snapshot(dst) == before
    (dst / "eval.json").unlink()
    (dst / "plots").rmdir()
    assert run(capsys, "convert", src, dst, "--to", "sglang", "--force")[0] == 0
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    # the help says what --force does
    from eagle3_backend.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command, name in (("convert", "DST"), ("make-demo-draft", "OUT"), ("train", "DIR")):
        (force,) = [a for a in sub[command]._actions if a.dest == "force"]
        assert force.help == (f"replace an existing {name} that holds only a draft checkpoint "
                              "(config.json, *.safetensors, train_report.json); refused if it "
                              "holds other files or the input"), command


def test_convert_on_a_full_disk_keeps_everything(make_draft_checkpoint, tmp_path):
    """A real write failure (file size limit, as a full disk: EFBIG instead of ENOSPC) is
    a one-line error, exit 2, with DST unchanged and no temporary directory left."""
    import resource
    import signal

    src = make_draft_checkpoint("sglang", hidden_size=256, target_hidden_size=256)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "config.json").write_text("old")
    (dst / "model.safetensors").write_text("old weights")

    def limit() -> None:  # in the child: writes past 64 KiB fail instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([sys.executable, "-m", "eagle3_backend", "convert", str(src), str(dst),
                          "--to", "sglang", "--force"], capture_output=True, text=True, env=env,
                         timeout=300, preexec_fn=limit)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"eagle3 convert: error: writing {dst} failed (")
    assert "File too large" in res.stderr
    assert res.stderr.endswith(f"nothing was written and what was at {dst} is unchanged. Free "
                               f"space or fix permissions in {tmp_path}, or choose another "
                               f"output directory.\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", src.name]
    assert [(dst / n).read_text() for n in ("config.json", "model.safetensors")] == [
        "old", "old weights"]


# --------------------------------------------------------------------------- validate
def test_validate_correct_draft_against_bundled_gguf(make_draft_checkpoint, bundled_gguf, capsys):
    ckpt = make_draft_checkpoint("sglang", **SMOL)
    code, out, err = run(capsys, "validate", ckpt, "--target", bundled_gguf)
    assert code == 0, out + err
    assert out.startswith(f"OK: {ckpt} can be served on {bundled_gguf.resolve()} "
                          f"(LlamaForCausalLM, 30 layers, hidden 576, vocab 49152); layout "
                          f"[layer_input:2, layer_input:15, layer_input:27] (explicit)")


def test_validate_lists_every_problem(make_draft_checkpoint, bundled_gguf, capsys):
    # Trained for another target: hidden 64, 40 layers, vocab 60000 (d2t reaches past 49152).
    ckpt = make_draft_checkpoint("sglang", "[layer_input:2, layer_input:15, layer_input:31]",
                                 target=("LlamaForCausalLM", 40), vocab_size=60000, seed=3)
    code, out, err = run(capsys, "validate", ckpt, "--target", bundled_gguf, "--json")
    assert code == 1, err
    rep = json.loads(out)
    assert rep["servable"] is False
    problems = rep["problems"]
    wanted = [
        ": target_hidden_size is 64; expected 576, the hidden size of target",
        "fc.weight takes 192 inputs; expected 1728 = layout [layer_input:2, layer_input:15, "
        "layer_input:31] (3 sources) x target LlamaForCausalLM hidden size 576",
        "names layer_input:31; expected sources of the target's 30 decoder layers",
        ": vocab_size (the target vocabulary it predicts into) is 60000; expected 49152",
        "d2t maps",
        ": records the target layer count 40; expected 30, that of target",
        ": its derived context length (max_position_embeddings, SGLang's rule) is 256; expected at "
        "least the target's context length 8192. SGLang 0.5.23 refuses to start the draft.",
    ]
    assert len(problems) == len(wanted), problems
    for want, got in zip(wanted, problems):
        assert want in got, (want, got)
    assert "outside the target vocabulary [0, 49152)" in problems[4]


def test_validate_text_and_bad_target(make_draft_checkpoint, tmp_path, capsys):
    ckpt = make_draft_checkpoint("sglang")
    good = tmp_path / "t.json"
    good.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30,
                                "hidden_size": 64, "vocab_size": 512,
                                "max_position_embeddings": 4096}))
    code, out, err = run(capsys, "validate", ckpt, "--target", good)
    assert code == 1  # what the server says: SGLang refuses a draft shorter than the target
    assert out == (
        f"NOT SERVABLE: {ckpt} on {good.resolve()} (LlamaForCausalLM, 30 layers, hidden 64, vocab 512): "
        f"1 problem(s)\n  - draft {ckpt}: its derived context length (max_position_embeddings, "
        f"SGLang's rule) is 256; expected at least the target's context length 4096. SGLang 0.5.23 "
        f"refuses to start the draft. Launch with --context-length 256 (or less), or set "
        f"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to run the draft past its trained length, or "
        f"record max_position_embeddings >= 4096 in its config.json.\n")
    code, out, err = run(capsys, "validate", ckpt, "--target", good, "--context-length", "256")
    assert code == 0 and out.startswith(f"OK: {ckpt} can be served on ")
    code, out, err = run(capsys, "validate", ckpt, "--target", good, "--context-length", "257")
    assert code == 1 and "expected at least --context-length 257." in out
    small = tmp_path / "s.json"
    small.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 20,
                                 "hidden_size": 64, "vocab_size": 512}))
    code, out, err = run(capsys, "validate", ckpt, "--target", small)
    assert code == 1
    assert out.startswith(f"NOT SERVABLE: {ckpt} on {small} (LlamaForCausalLM, 20 layers, hidden "
                          f"64, vocab 512): 3 problem(s)")  # the third: context 256 < 2048 (no key: SGLang says 2048)
    code, out, err = run(capsys, "validate", ckpt, "--target", tmp_path / "missing.gguf")
    assert code == 2 and "does not exist" in err


@pytest.mark.slow
def test_a_target_given_as_the_draft_is_named(bundled_gguf, tmp_path, capsys):
    for argv in (["inspect", bundled_gguf], ["validate", bundled_gguf, "--target", bundled_gguf],
                 ["convert", bundled_gguf, tmp_path / "o", "--to", "sglang"]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, "")
        assert err == (f"eagle3 {argv[0]}: error: checkpoint {str(bundled_gguf)!r} is a GGUF model "
                       "file (a target, not a draft); expected the draft checkpoint directory "
                       "(config.json + model.safetensors). Pass the draft's directory; the GGUF "
                       "goes to --target.\n")
    assert list(tmp_path.iterdir()) == []


def test_subprocess_exit_codes_and_no_traceback(make_draft_checkpoint, bundled_gguf, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    bad = subprocess.run([sys.executable, "-m", "eagle3_backend", "inspect", str(tmp_path / "no")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "Traceback" not in bad.stderr and "does not exist" in bad.stderr
    ckpt = make_draft_checkpoint("sglang")
    wrong = subprocess.run([sys.executable, "-m", "eagle3_backend", "validate", str(ckpt),
                            "--target", str(bundled_gguf)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert wrong.returncode == 1, wrong.stderr
    assert wrong.stdout.startswith("NOT SERVABLE") and "Traceback" not in wrong.stderr


# --------------------------------------------------------------------------- env, demo
def test_env_json(capsys):
    had_sglang = "sglang" in sys.modules
    code, out, err = run(capsys, "env", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["packages"]["torch"] == metadata.version("torch")
    assert info["packages"]["sglang"] == metadata.version("sglang")
    assert info["cuda"]["available"] == torch.cuda.is_available()
    from eagle3_backend import ops

    assert info["kernels"] == ops.describe_backends()
    assert info["extension"] == ops.extension_status()
    assert info["kernels_error"] is None
    assert ("sglang" in sys.modules) == had_sglang  # versions only, never an import
    code, out, err = run(capsys, "env")
    assert code == 0 and f"torch           {metadata.version('torch')}" in out
    for op, how in info["kernels"].items():
        assert f"kernel          {op:<20} {how['backend']}  (" in out


@pytest.mark.slow
def test_make_demo_draft_for_bundled_target(bundled_gguf, tmp_path, capsys):
    out_dir = tmp_path / "demo"
    code, out, err = run(capsys, "make-demo-draft", out_dir, "--target", bundled_gguf,
                         "--seed", 1, "--draft-vocab-size", 1024)
    assert code == 0, err
    assert out.startswith(f"wrote {out_dir}: randomly initialised EAGLE-3 draft (seed 1)")
    code, out, err = run(capsys, "inspect", out_dir, "--json")
    rep = json.loads(out)
    assert (rep["layout"], rep["layout_source"], rep["fc_in_features"], rep["draft_vocab_size"],
            rep["target_vocab_size"], rep["has_embed_tokens"], rep["dtype"]) == (
        DEFAULT30, "explicit", 1728, 1024, 49152, True, "bfloat16")
    code, out, err = run(capsys, "validate", out_dir, "--target", bundled_gguf)
    assert code == 0, out + err
    from safetensors import safe_open

    with safe_open(str(out_dir / "model.safetensors"), framework="pt") as f:
        d2t = f.get_tensor("d2t")
        embed = f.get_tensor("embed_tokens.weight")
    assert torch.equal(d2t, torch.zeros(1024, dtype=torch.int64))  # the first 1024 target ids
    assert embed.shape == (49152, 576) and float(embed.float().abs().sum()) > 0


def test_make_demo_draft_takes_a_layout_for_a_target_too_small_for_the_default(
        tiny_target_config, tmp_path, capsys):
    """A 4-layer target has no engine default (2, L//2, L-3 collide); --layout gives one, and
    the refusal without it names the flag of this command too."""
    target = tiny_target_config(num_hidden_layers=4)
    code, out, err = run(capsys, "make-demo-draft", tmp_path / "a", "--target", target)
    assert code == 2 and "needs at least 7 decoder layers" in err, err
    assert "eagle3 train and make-demo-draft take e.g. --layout \"[embed, layer_input:4]\"" in err
    code, out, err = run(capsys, "make-demo-draft", tmp_path / "b", "--target", target,
                         "--layout", "[embed, layer_input:1, layer_input:9]")
    assert code == 2 and err.startswith("eagle3 make-demo-draft: error: --layout '[embed, layer_input:1, layer_input:9]'")
    assert "Give --layout sources of this target's layers, each once." in err, err
    assert not (tmp_path / "b").exists()
    code, out, err = run(capsys, "make-demo-draft", tmp_path / "c", "--target", target,
                         "--layout", "[layer_input:3, embed]", "--draft-vocab-size", 64)
    assert code == 0, err
    # SGLang concatenates captures in layer order: the written draft is in that order
    assert ("  layout [embed, layer_input:3] (given as [layer_input:3, embed], stored in layer "
            "order), ") in out
    code, out, err = run(capsys, "inspect", tmp_path / "c", "--json")
    rep = json.loads(out)
    assert (rep["layout"], rep["layout_source"], rep["fc_in_features"]) == (
        ["embed", "layer_input:3"], "explicit", 2 * 64)  # hidden 64
    code, out, err = run(capsys, "validate", tmp_path / "c", "--target", target)
    assert code == 0, out + err


def test_validate_says_what_serving_says_for_other_formats(make_draft_checkpoint,
                                                           tiny_target_config, capsys):
    # the plugin serves SGLang's draft class only, and SGLang's llama file cannot capture
    # layer_input:30 (the last layer's output) on a 30-layer target
    ckpt = make_draft_checkpoint("speculators", "[layer_input:2, layer_input:15, layer_input:30]")
    code, out, err = run(capsys, "validate", ckpt, "--target", tiny_target_config())
    assert code == 1, out
    assert (f"  - draft {ckpt} declares architectures ['Eagle3Speculator']; expected "
            f"['LlamaForCausalLMEagle3'], the EAGLE-3 draft class SGLang 0.5.23 dispatches to "
            f"and the eagle3_backend plugin checks and serves. Convert the draft with "
            f"`eagle3 convert {ckpt} OUT --to sglang --target <target>` and serve OUT.\n") in out
    assert ("needs layer_input:30 (the output of the last decoder layer), which SGLang 0.5.23's "
            "LlamaForCausalLM model file cannot capture") in out


def test_bundled_names_the_target_for_every_command(tmp_path, capsys):
    """eval, doctor and train default to `--target bundled`; validate and make-demo-draft took
    only paths and called the keyword a missing file."""
    from eagle3_backend.target import bundled_target_path

    shipped = Path(__file__).resolve().parents[1] / "drafts" / "smollm2-135m-eagle3"
    code, out, err = run(capsys, "validate", shipped, "--target", "bundled")
    assert code == 0 and f"on {bundled_target_path()} (LlamaForCausalLM, 30 layers" in out, err
    code, out, err = run(capsys, "make-demo-draft", tmp_path / "d", "--target", "bundled")
    assert code == 0, err
    recorded = json.loads((tmp_path / "d" / "config.json").read_text())["eagle3_target"]
    assert recorded["num_hidden_layers"] == 30


def test_swap_and_bench_check_their_arguments_and_name_a_server_that_is_not_sglang(tmp_path, capsys):
    """Exit 2 with the fix, not 3 ("cannot reach"): a URL without a scheme, --timeout 0, and a
    web server that answers HTML (it used to print the page as the swap's failure)."""
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    code, out, err = run(capsys, "swap", "--url", "127.0.0.1:9", "--draft", tmp_path)
    assert code == 2 and "Pass --url http://127.0.0.1:9." in err, err
    code, out, err = run(capsys, "swap", "--url", "http://127.0.0.1:9", "--draft", tmp_path,
                         "--timeout", "0")
    assert (code, err.strip()) == (2, "eagle3 swap: error: --timeout is 0.0; expected > 0 seconds.")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hi"}\n', encoding="utf-8")
    web = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}"
        code, out, err = run(capsys, "swap", "--url", url, "--draft", tmp_path)
        assert code == 2 and out == "", out
        assert f"{url} answered HTTP 501 without a JSON body" in err and "not an SGLang server" in err
        # bench, too, before any prompt (it used to send them all and list the HTML pages)
        code, out, err = run(capsys, "bench", "--url", url, "--dataset", prompts, "--no-progress")
        assert code == 2 and out == "", out
        assert (f"--url {url}: the server has neither /server_info nor /get_server_info: not an "
                "SGLang server.") in err, err
    finally:
        web.shutdown()


def test_bench_checks_its_tokenizer_as_eval_checks_a_target(tmp_path, capsys):
    """--tokenizer is read before any request, with load_target's words (an empty directory
    was an internal error, a missing path Hugging Face's repo-id rules)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "Hi"}\n', encoding="utf-8")
    (tmp_path / "empty").mkdir()
    base = ["bench", "--url", "http://127.0.0.1:9", "--dataset", prompts, "--no-progress", "--tokenizer"]
    code, out, err = run(capsys, *base, tmp_path / "empty")
    assert code == 2 and f"target dir '{tmp_path / 'empty'}' has no config.json and 0 .gguf files" in err
    code, out, err = run(capsys, *base, tmp_path / "nope")
    assert code == 2 and f"target '{tmp_path / 'nope'}' does not exist" in err, err
