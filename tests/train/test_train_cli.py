"""`eagle3 train` end to end on a tiny target: a strict-loadable SGLang checkpoint and its report."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3_backend.checkpoint import load_draft
from eagle3_backend.cli import main
from eagle3_backend.layout import Layout

LAYOUT = "[layer_input:3, embed]"          # given out of layer order on purpose


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("train-prompts") / "prompts.jsonl"
    rows = [{"prompt": f"Tell me fact number {i} about the sea."} for i in range(6)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return p


def _argv(target, prompts, out, cache, *extra):
    return ["train", "--target", str(target), "--dataset", str(prompts), "--out", str(out),
            "--layout", LAYOUT, "--num-prompts", "5", "--max-new-tokens", "8", "--steps", "3",
            "--draft-vocab", "256", "--batch-tokens", "256", "--heldout-fraction", "0.2",
            "--dtype", "float32", "--cache-data", str(cache), "--no-progress", *extra]


def test_train_writes_a_strict_loadable_checkpoint_and_report(tmp_path, tiny_target_dir,
                                                               prompts_file, capsys):
    out, cache = tmp_path / "draft", tmp_path / "cache"
    assert main(_argv(tiny_target_dir, prompts_file, out, cache)) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "held-out top-1 by position" in printed
    assert "float32, layout [layer_input:3, embed])" in printed  # as every command writes one

    loaded = load_draft(out, strict=True)
    assert loaded.layout_source == "explicit"
    # written in layer order (fc blocks permuted), the same draft as trained
    assert loaded.layout == Layout.parse("[embed, layer_input:3]")
    cfg = loaded.config
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.vocab_size) == (64, 64, 49152)
    assert cfg.draft_vocab_size == 256 and cfg.uses_vocab_map and not cfg.has_embed_tokens
    raw = json.loads((out / "config.json").read_text())
    assert raw["eagle3_layout"] == ["embed", "layer_input:3"]
    assert raw["eagle3_target"] == {"architecture": "LlamaForCausalLM", "num_hidden_layers": 4}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert "embed_tokens.weight" not in names and {"d2t", "t2d", "fc.weight"} <= names
        assert f.get_tensor("fc.weight").dtype == torch.float32

    report = json.loads((out / "train_report.json").read_text())
    assert report["layout"] == ["layer_input:3", "embed"]
    assert report["data"]["source"] == "generated" and report["data"]["sequences"] == 5
    assert report["training"]["steps"] == 3
    assert len(report["heldout_top1_by_position"]) == 3
    # the written float32 weights (fc blocks in layer order) score the held-out answers
    # exactly as the trained ones did in training order
    assert report["heldout_top1_by_position"] == report["training"]["heldout_top1_by_position"]
    assert report["heldout_loss_by_position"] == pytest.approx(
        report["training"]["heldout_loss_by_position"], rel=1e-4)
    assert report["draft_vocab"]["size"] == 256
    assert report["data"]["vocab_prior_prompts"] == 6        # every prompt of the file
    assert report["command"].startswith("eagle3 train ") and "--steps 3" in report["command"]
    assert {"machine", "versions"} <= set(report)
    assert set(report["wall_seconds"]) == {"data", "train", "write_and_heldout", "total"}

    # a second run with the same data settings reuses the cached data
    out2 = tmp_path / "draft2"
    assert main(_argv(tiny_target_dir, prompts_file, out2, cache)) == 0
    report2 = json.loads((out2 / "train_report.json").read_text())
    assert report2["data"]["source"] == "cache"
    assert report2["data"]["answer_tokens"] == report["data"]["answer_tokens"]
    same = load_draft(out2, strict=True)
    for name, t in loaded.state_dict.items():           # seeded: the same draft again
        assert torch.equal(t, same.state_dict[name]), name

    # --intermediate-size widens the draft's MLP, --draft-layers stacks layers; the config
    # SGLang reads says so, and only those weights change shape
    out3 = tmp_path / "draft3"
    assert cfg.intermediate_size != 96 and cfg.num_hidden_layers == 1
    assert main([*_argv(tiny_target_dir, prompts_file, out3, cache), "--intermediate-size", "96",
                 "--draft-layers", "2"]) == 0
    raw3 = json.loads((out3 / "config.json").read_text())
    assert (raw3["intermediate_size"], raw3["num_hidden_layers"]) == (96, 2)
    wide = load_draft(out3, strict=True).state_dict
    upper = {n for n in wide if n.startswith("layers.1.")}
    assert upper and set(wide) - upper == set(loaded.state_dict)
    for name, t in wide.items():
        if "mlp" in name:
            assert tuple(t.shape) == ((64, 96) if "down" in name else (96, 64)), name
        elif name in loaded.state_dict:
            assert t.shape == loaded.state_dict[name].shape, name

    # --init-from starts from a draft's weights: with a learning rate too small to move an
    # fp32 weight, the result is that draft exactly; another shape is refused by name
    out4 = tmp_path / "draft4"
    capsys.readouterr()
    assert main([*_argv(tiny_target_dir, prompts_file, out4, cache), "--init-from", str(out),
                 "--lr", "1e-30", "--steps", "1"]) == 0
    again = load_draft(out4, strict=True).state_dict
    assert set(again) == set(loaded.state_dict)
    for name, t in loaded.state_dict.items():
        assert torch.equal(t, again[name]), name
    capsys.readouterr()
    assert main([*_argv(tiny_target_dir, prompts_file, tmp_path / "draft5", cache),
                 "--init-from", str(out), "--intermediate-size", "96"]) == 2
    err = capsys.readouterr().err
    assert f"--init-from {out}: midlayer.mlp.down_proj.weight is [64, 256], this run's is [64, 96]" in err
    assert "drop --init-from" in err and not (tmp_path / "draft5").exists()
    # a draft vocabulary past the target's is noted (the draft predicts over all of them) and
    # here, being another size, refused; the same size over other ids names the data flags
    assert main([*_argv(tiny_target_dir, prompts_file, tmp_path / "draft6", cache),
                 "--init-from", str(out), "--draft-vocab", "60000"]) == 2
    err = capsys.readouterr().err
    assert ("eagle3 train: note: --draft-vocab 60000 is more than the target's 49152 token ids; "
            "the draft predicts over all of them.") in err
    assert (f"--init-from {out}: its draft vocabulary (256 ids) is not this run's (49152 ids "
            "from the data)") in err
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"Name {i} rivers of Peru, in French."}) + "\n"
                             for i in range(6)), encoding="utf-8")
    assert main([*_argv(tiny_target_dir, other, tmp_path / "draft7", cache),
                 "--init-from", str(out)]) == 2
    err = capsys.readouterr().err
    assert (f"--init-from {out}: its draft vocabulary holds other token ids than this run's "
            "(both 256; a run picks its ids from its data: --dataset, --num-prompts, "
            "--vocab-prompts)") in err


def test_train_on_a_base_model_without_a_chat_template(tmp_path, tiny_target_dir, prompts_file,
                                                      capsys):
    """A target without a chat template is refused with a fix that train takes (it named eval's
    --no-chat-template, which train rejected); with it, the raw prompts are answered."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_target_dir, base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    tok = json.loads((base / "tokenizer_config.json").read_text())
    tok.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(tok))
    assert main(_argv(base, prompts_file, tmp_path / "a", tmp_path / "cache")) == 2
    err = capsys.readouterr().err
    assert "the target tokenizer has no chat template" in err
    assert "or pass --no-chat-template to use raw prompts knowingly." in err
    assert main([*_argv(base, prompts_file, tmp_path / "b", tmp_path / "cache"),
                 "--no-chat-template", "--source", "teacher"]) == 2
    assert "Use it with --source generated." in capsys.readouterr().err
    assert main([*_argv(base, prompts_file, tmp_path / "c", tmp_path / "cache"),
                 "--no-chat-template"]) == 0
    report = json.loads((tmp_path / "c" / "train_report.json").read_text())
    assert report["data"]["sequences"] == 5 and "--no-chat-template" in report["command"]
    # the raw-text data has a cache of its own: a chat-template run never reads it
    assert len(list((tmp_path / "cache").glob("data-*"))) == 1


def test_train_refuses_mtbench_and_a_non_empty_out(tmp_path, tiny_target_dir, prompts_file, capsys):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    assert main(_argv(tiny_target_dir, prompts_file, tmp_path / "busy", tmp_path / "c")) == 2
    assert "--force" in capsys.readouterr().err
    argv = _argv(tiny_target_dir, "mt-bench", tmp_path / "o", tmp_path / "c")
    assert main(argv) == 2
    assert "evaluation set" in capsys.readouterr().err


def test_train_refuses_an_out_it_could_not_replace_before_any_work(tmp_path, tiny_target_dir,
                                                                   prompts_file, capsys):
    """--force on a directory holding the data cache or other files, or --out = the target,
    is refused up front (not after training), and nothing is touched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    cases = [(out, out / "cache", f"destination {str(out)!r} holds the input "
                                   f"{str(out / 'cache')!r}; writing there would destroy it."),
             (tiny_target_dir, tmp_path / "c", f"destination {str(tiny_target_dir)!r} is the "
                                               f"input {str(tiny_target_dir)!r};")]
    (out / "notes.md").write_text("mine")
    cases.append((out, tmp_path / "c", "holds notes.md, which are not draft checkpoint files"))
    target_before = sorted(p.name for p in tiny_target_dir.iterdir())
    for dst, cache, message in cases:
        assert main(_argv(tiny_target_dir, prompts_file, dst, cache, "--force")) == 2
        err = capsys.readouterr().err
        assert err.startswith("eagle3 train: error: ") and message in err, err
    assert sorted(p.name for p in tiny_target_dir.iterdir()) == target_before
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]   # no data was generated


def test_train_refuses_a_file_of_mtbench_questions(tmp_path, tiny_target_dir, capsys):
    from eagle3_backend.verify.datasets import mtbench_path

    # MT-Bench's own question.jsonl given as a path: every prompt is excluded
    argv = _argv(tiny_target_dir, str(mtbench_path()), tmp_path / "o", tmp_path / "c")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"all 80 prompts of {mtbench_path()} are MT-Bench questions" in err
    assert not (tmp_path / "o").exists()


def test_train_on_the_targets_own_answers_records_them_and_keeps_caches_apart(
        tmp_path, tiny_target_dir, capsys):
    from test_train_resume import _argv
    from test_train_teacher import write_conversation_file

    convs = tmp_path / "convs.jsonl"
    write_conversation_file(convs, 6)
    cache = tmp_path / "answers"
    argv = _argv(tiny_target_dir, convs, cache, tmp_path / "out", tmp_path / "ckpt",
                 "--answers", "target", "--max-new-tokens", "4")
    argv[argv.index("--steps") + 1] = "3"
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "train_report.json").read_text())
    assert report["data"]["teacher"]["answers"] == "target"
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["identity"]["answers"] == {"by": "target, greedy", "max_new_tokens": 4,
                                           "max_prompt_tokens": 256}
    # every stored answer is at most 4 target tokens after the rendered first user turn
    assert all(1 <= s["assistant_tokens"] <= 4 * s["sequences"] for s in meta["shards"])
    capsys.readouterr()
    recorded = _argv(tiny_target_dir, convs, cache, tmp_path / "o2", tmp_path / "c2")
    assert main(recorded) == 2                     # a recorded-answers run on that cache
    assert "answers: cache has {'by': 'target, greedy'" in capsys.readouterr().err
    generated = list(argv)
    generated[generated.index("--source") + 1] = "generated"
    assert main(generated) == 2
    assert ("--answers target chooses the assistant turns of the teacher-forced data; use it "
            "with --source teacher (or mix).") in capsys.readouterr().err


def test_a_later_stage_reads_other_chats_with_the_same_vocabulary_and_inits_from_the_first(
        tmp_path, tiny_target_dir, capsys):
    """--first-conversation N: a new cache starts at the Nth chat of the seeded order, keeps
    the draft vocabulary a cache from chat 0 gets (so a stage can --init-from the last), and
    is not mistaken for a cache from chat 0."""
    from test_train_resume import _argv
    from test_train_teacher import write_conversation_file

    from eagle3_backend.train.teacher import TeacherCache, load_conversations

    convs = tmp_path / "convs.jsonl"
    write_conversation_file(convs, 8)
    order = [c.id for c in load_conversations(str(convs), 0)[0]]
    assert len(set(order)) == 8

    def run(cache, out, *extra):
        argv = _argv(tiny_target_dir, convs, tmp_path / cache, tmp_path / out,
                     tmp_path / f"ckpt-{out}", "--steps", "2", *extra)
        return main(argv)

    def ids(cache):
        meta = json.loads((tmp_path / cache / "meta.json").read_text())
        return [s.id for s in TeacherCache(tmp_path / cache, meta["identity"]).sequences()], meta

    assert run("first", "one") == 0
    first, _ = ids("first")
    assert first == order
    assert run("later", "two", "--first-conversation", "5", "--init-from",
               str(tmp_path / "one")) == 0
    later, meta = ids("later")
    assert later == order[5:]
    assert meta["identity"]["first_conversation"] == 5 and meta["next_conversation"] == 8
    one, two = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("one", "two"))
    assert torch.equal(one["d2t"], two["d2t"])
    capsys.readouterr()
    assert run("first", "three", "--first-conversation", "5") == 2
    assert "first_conversation: cache has None, this run needs 5" in capsys.readouterr().err
    assert run("none", "four", "--first-conversation", "8") == 2
    assert ("--first-conversation 8: " in (err := capsys.readouterr().err)
            and "has 8 usable conversations; start below that." in err)
    assert not (tmp_path / "none").exists()


def test_a_stage_trains_on_added_caches_of_other_chats_and_refuses_overlaps(
        tmp_path, tiny_target_dir, capsys):
    """--add-teacher-cache DIR: a finished cache of other chats (an earlier stage's) is
    trained on beside --teacher-cache, read as it is; one whose chats overlap, one written
    for another setup and a folder that is no cache are refused before any training."""
    from test_train_resume import _argv
    from test_train_teacher import write_conversation_file

    convs = tmp_path / "convs.jsonl"
    write_conversation_file(convs, 8)

    def run(cache, out, *extra):
        argv = _argv(tiny_target_dir, convs, tmp_path / cache, tmp_path / out,
                     tmp_path / f"ckpt-{out}", "--steps", "2", *extra)
        return main(argv)

    def meta(cache):
        return json.loads((tmp_path / cache / "meta.json").read_text())

    assert run("head", "one", "--teacher-tokens", "1") == 0        # one shard: the first chats
    k = meta("head")["next_conversation"]
    assert 1 <= k < 8
    head_before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "head").iterdir())
    assert run("tail", "two", "--first-conversation", str(k),
               "--add-teacher-cache", str(tmp_path / "head")) == 0
    report = json.loads((tmp_path / "two" / "train_report.json").read_text())
    teacher = report["data"]["teacher"]
    assert teacher["added_caches"] == [{
        "cache_dir": str(tmp_path / "head"), "shards": 1, "tokens": meta("head")["shards"][0]["tokens"],
        "conversations": [0, k], "conversations_used": k}]
    assert teacher["conversations_used"] == 8                    # every chat, each once
    assert teacher["tokens_used"] == sum(s["tokens"] for c in ("head", "tail")
                                         for s in meta(c)["shards"])
    assert f"--add-teacher-cache {tmp_path / 'head'}" in report["command"]
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "head").iterdir()) == head_before
    assert meta("tail")["identity"]["first_conversation"] == k and "first_conversation" not in \
        meta("head")["identity"]

    capsys.readouterr()
    assert run("all", "three") == 0                                 # chats 0..7
    assert run("tail", "four", "--first-conversation", str(k),
               "--add-teacher-cache", str(tmp_path / "all")) == 2
    assert (f"--add-teacher-cache {tmp_path / 'all'}: its conversations 0..7 overlap "
            f"{tmp_path / 'tail'}'s ({k}..7); each chat would be trained on twice."
            ) in capsys.readouterr().err
    assert run("fresh", "nine", "--first-conversation", "3",
               "--add-teacher-cache", str(tmp_path / "all")) == 2      # before any data pass
    assert (f"overlap {tmp_path / 'fresh'}'s (from 3)" in capsys.readouterr().err
            and not (tmp_path / "fresh" / "meta.json").exists())
    assert run("tail", "five", "--first-conversation", str(k), "--add-teacher-cache",
               str(tmp_path / "head"), "--add-teacher-cache", str(tmp_path / "head")) == 2
    assert f"its conversations 0..{k - 1} overlap {tmp_path / 'head'}'s" in capsys.readouterr().err
    assert run("topk2", "six", "--teacher-tokens", "1", "--topk", "2") == 0
    capsys.readouterr()
    assert run("tail", "seven", "--first-conversation", str(k), "--topk", "8",
               "--add-teacher-cache", str(tmp_path / "topk2")) == 2
    assert (f"teacher cache {tmp_path / 'topk2'} was written for another setup (topk: cache has "
            "2, this run needs 8). Leave it out of --add-teacher-cache") in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run("tail", "eight", "--first-conversation", str(k),
               "--add-teacher-cache", str(tmp_path / "empty")) == 2
    assert (f"{tmp_path / 'empty'}: not a teacher cache (no meta.json)."
            ) in capsys.readouterr().err
    generated = _argv(tiny_target_dir, convs, tmp_path / "tail", tmp_path / "ten",
                      tmp_path / "ckpt-ten", "--add-teacher-cache", str(tmp_path / "head"))
    generated[generated.index("--source") + 1] = "generated"
    assert main(generated) == 2
    assert ("--add-teacher-cache adds teacher-forced data; use it with --source teacher (or "
            "mix).") in capsys.readouterr().err
    assert not any((tmp_path / d).exists()
                   for d in ("four", "five", "seven", "eight", "nine", "ten"))
