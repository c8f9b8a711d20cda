"""The prompts ``specguard bench`` sends: the built-in sets, one per traffic class, and prompt files.

Speculative decoding's acceptance depends on the traffic: code and summaries repeat their input and
follow predictable patterns, so drafts are accepted often; open chat and other languages less. A
benchmark that mixes them hides the difference, so every prompt carries its class and results are
reported per class.

A prompt file is either JSONL (one object per line, ``prompt`` or OpenAI-style ``messages``, with
optional ``class``, ``max_tokens`` and ``temperature``) or a ShareGPT-style JSON array; the format is told by the
content, since such files are often saved under whatever suffix the tool that made them chose.
Every problem with a file is a :class:`PromptError` in ``file:line: field: message`` form.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

CLASSES = ("chat", "code", "summarization", "multilingual", "long_context")

BUILTIN_PREFIX = "builtin:"  # how a built-in set is named in messages: it has no path of its own

_JSON_WHITESPACE = " \t\n\r"
_SHAREGPT_HUMAN = ("human", "user")


@dataclass(frozen=True)
class Prompt:
    klass: str  # the traffic class ("chat", ..., or the file's "class" field, or "file")
    text: str  # the user message (for /v1/completions: the prompt itself)
    max_tokens: int | None = None  # a per-prompt output length, when the file gives one
    temperature: float | None = None  # a per-prompt sampling temperature, when the file gives one


@dataclass(frozen=True)
class PromptFile:
    """What :func:`read_file` found in a file.

    ``skipped`` counts ShareGPT entries that have no usable human turn (none at all, or a blank
    one): public dumps contain such entries, and an operator comparing runs wants to know how many
    of the file's entries were not sent. It is always 0 for JSONL, where every line must be valid.
    """

    path: Path
    format: Literal["jsonl", "sharegpt"]
    prompts: tuple[Prompt, ...]
    skipped: int = 0


class PromptError(ValueError):
    """A prompt file (or a built-in set's name) that cannot be used.

    The message is ``file:line: field: message``; the line is left out when the problem is the
    whole file (missing, empty), the field when it is the line itself (bad JSON). The parts are
    kept as attributes for callers that lay out their own messages.
    """

    def __init__(self, file: str, message: str, line: int | None = None, field: str = "") -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        where = f"{file}:{line}" if line is not None else file
        prefix = f"{field}: " if field else ""
        super().__init__(f"{where}: {prefix}{message}")


def builtin(classes: Sequence[str] | None = None) -> list[Prompt]:
    """The built-in prompts of ``classes`` (all of :data:`CLASSES` when None), class by class in
    the order asked, each class in file order, so that runs over the same classes are comparable."""
    wanted = CLASSES if classes is None else tuple(classes)
    unknown = [name for name in wanted if name not in CLASSES]
    if unknown:
        raise PromptError(
            BUILTIN_PREFIX + unknown[0],
            f"unknown prompt class {unknown[0]!r}; the built-in classes are {', '.join(CLASSES)}",
        )
    prompts: list[Prompt] = []
    for name in wanted:
        label = BUILTIN_PREFIX + name
        resource = resources.files("specguard.playbook.bench") / "prompts" / f"{name}.jsonl"
        try:
            data = resource.read_bytes()
        except OSError:  # the package was installed without its data files
            raise PromptError(label, "the built-in prompt file is missing from the installation") from None
        text = _decode(data, label)
        found = [Prompt(name, p.text, p.max_tokens) for p in _parse_jsonl(text, label)]
        if not found:
            raise PromptError(label, "no prompts")
        prompts.extend(found)
    return prompts


def load_file(path: Path) -> list[Prompt]:
    """The prompts of a JSONL or ShareGPT file, in file order; see :func:`read_file`."""
    return list(read_file(path).prompts)


def read_file(path: Path) -> PromptFile:
    """Read a prompt file, telling its format from its first non-blank character (``[`` is a
    ShareGPT array, anything else JSONL). Raises PromptError for anything wrong with it, including
    a file that yields no prompt at all (a benchmark of nothing would report nothing)."""
    label = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(label, "no such file") from None
    except IsADirectoryError:
        raise PromptError(label, "is a directory, not a prompt file") from None
    except OSError as err:
        raise PromptError(label, f"cannot read: {err.strerror or err}") from None
    text = _decode(data, label)
    start = _skip_whitespace(text, 0)
    if start == len(text):
        raise PromptError(label, "no prompts: the file is empty")
    if text[start] == "[":
        prompts, skipped = _parse_sharegpt(text, label)
        if not prompts:
            detail = f"none of its {skipped} entries has a human turn" if skipped else "the array is empty"
            raise PromptError(label, f"no prompts: {detail}")
        return PromptFile(path, "sharegpt", tuple(prompts), skipped)
    prompts = _parse_jsonl(text, label)
    if not prompts:
        raise PromptError(label, "no prompts")
    return PromptFile(path, "jsonl", tuple(prompts))


# --- decoding -------------------------------------------------------------------------------------


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")  # a BOM (some editors write one) is not part of the JSON
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise PromptError(label, f"not UTF-8 text (byte {data[err.start]:#04x})", line) from None


def _skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _JSON_WHITESPACE:
        pos += 1
    return pos


def _json_error(label: str, err: json.JSONDecodeError, line_offset: int = 0) -> PromptError:
    return PromptError(label, f"invalid JSON at column {err.colno}: {err.msg}", err.lineno + line_offset)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages about wrong types."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# --- JSONL ----------------------------------------------------------------------------------------


_Fail = Callable[[str, str], "PromptError"]  # (field, message) -> the error for the current line


def _parse_jsonl(text: str, label: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    # Split on "\n" only: str.splitlines would also split on U+2028 and friends, which JSON allows
    # unescaped inside strings.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise _json_error(label, err, number - 1) from None
        prompts.append(_jsonl_record(record, label, number))
    return prompts


def _jsonl_record(record: Any, label: str, line: int) -> Prompt:
    def fail(field: str, message: str) -> PromptError:
        return PromptError(label, message, line, field)

    if not isinstance(record, dict):
        raise fail("", f"expected a JSON object, got {_kind(record)}")
    # Other keys (ids, reference answers, sources) are ignored: prompt files are often exported by
    # other tools, and their metadata is no reason to refuse the prompts.
    if "prompt" in record and "messages" in record:
        raise fail("prompt", 'give "prompt" or "messages", not both')
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str):
            raise fail("prompt", f"must be a string, got {_kind(text)}")
        if not text.strip():
            raise fail("prompt", "is empty")
    elif "messages" in record:
        text = _last_user_message(record["messages"], fail)
    else:
        raise fail("prompt", 'missing: each line needs "prompt" (a string) or "messages" (a chat list)')

    klass = record.get("class", "file")
    if not isinstance(klass, str):
        raise fail("class", f"must be a string, got {_kind(klass)}")
    if not klass.strip():
        raise fail("class", "is empty")

    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        shown = json.dumps(max_tokens, ensure_ascii=False)
        raise fail("max_tokens", f"must be a positive integer, got {shown}")
    temperature = record.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not 0 <= temperature <= 100
    ):
        shown = json.dumps(temperature, ensure_ascii=False)
        raise fail("temperature", f"must be a number from 0 to 100, got {shown}")
    return Prompt(klass.strip(), text, max_tokens, None if temperature is None else float(temperature))


def _last_user_message(messages: Any, fail: _Fail) -> str:
    """The content of the last ``user`` message: what a chat request would ask the model to answer
    (the earlier turns are context the benchmark does not replay)."""
    if not isinstance(messages, list):
        raise fail("messages", f"must be an array of messages, got {_kind(messages)}")
    chosen: tuple[int, Any] | None = None
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise fail(f"messages[{index}]", f"must be an object, got {_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str):
            shown = "missing" if role is None else f"must be a string, got {_kind(role)}"
            raise fail(f"messages[{index}].role", shown)
        if role == "user":
            chosen = (index, message.get("content"))
    if chosen is None:
        raise fail("messages", "no message with role 'user'")
    index, content = chosen
    field = f"messages[{index}].content"
    if isinstance(content, list):
        content = _text_parts(content, field, fail)
    if not isinstance(content, str):
        raise fail(field, f"must be a string or a list of text parts, got {_kind(content)}")
    if not content.strip():
        raise fail(field, "is empty")
    return content


def _text_parts(parts: list[Any], field: str, fail: _Fail) -> str:
    """The text of an OpenAI content-parts list; other parts (images, audio) are left out, since
    the benchmark sends text, and a message with no text at all is then reported as empty."""
    texts: list[str] = []
    for index, part in enumerate(parts):
        if not isinstance(part, dict):
            raise fail(f"{field}[{index}]", f"must be an object, got {_kind(part)}")
        if part.get("type") == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise fail(f"{field}[{index}].text", f"must be a string, got {_kind(text)}")
            texts.append(text)
    return "\n".join(texts)


# --- ShareGPT -------------------------------------------------------------------------------------


def _parse_sharegpt(text: str, label: str) -> tuple[list[Prompt], int]:
    prompts: list[Prompt] = []
    skipped = 0
    for line, index, entry in _array_entries(text, label):
        human = _first_human_turn(entry, label, line, index)
        if human is None or not human.strip():
            skipped += 1
        else:
            prompts.append(Prompt("sharegpt", human))
    return prompts, skipped


def _first_human_turn(entry: Any, label: str, line: int, index: int) -> str | None:
    where = f"[{index}]"
    if not isinstance(entry, dict):
        raise PromptError(label, f"must be an object, got {_kind(entry)}", line, where)
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        shown = "missing" if turns is None else f"must be an array, got {_kind(turns)}"
        raise PromptError(label, shown, line, f"{where}.conversations")
    for number, turn in enumerate(turns):
        field = f"{where}.conversations[{number}]"
        if not isinstance(turn, dict):
            raise PromptError(label, f"must be an object, got {_kind(turn)}", line, field)
        speaker = turn.get("from")
        if not isinstance(speaker, str):
            shown = "missing" if speaker is None else f"must be a string, got {_kind(speaker)}"
            raise PromptError(label, shown, line, f"{field}.from")
        if speaker in _SHAREGPT_HUMAN:
            value = turn.get("value")
            if not isinstance(value, str):
                shown = "missing" if value is None else f"must be a string, got {_kind(value)}"
                raise PromptError(label, shown, line, f"{field}.value")
            return value
    return None


def _array_entries(text: str, label: str) -> Iterator[tuple[int, int, Any]]:
    """The entries of a top-level JSON array as (line where the entry starts, index, value).

    Decoding entry by entry rather than the whole array at once is what gives each entry its line
    for messages; lines are counted incrementally, since ShareGPT dumps run to hundreds of MB."""
    decoder = json.JSONDecoder()
    counted_to, line = 0, 1

    def line_at(pos: int) -> int:
        nonlocal counted_to, line
        line += text.count("\n", counted_to, pos)
        counted_to = pos
        return line

    def syntax(pos: int, message: str) -> PromptError:
        line_start = text.rfind("\n", 0, pos) + 1
        return PromptError(label, f"invalid JSON at column {pos - line_start + 1}: {message}", line_at(pos))

    pos = _skip_whitespace(text, text.index("[") + 1)
    if text.startswith("]", pos):
        pos = _skip_whitespace(text, pos + 1)
        if pos != len(text):
            raise syntax(pos, "extra data after the array")
        return
    index = 0
    while True:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise _json_error(label, err) from None
        yield line_at(pos), index, value
        index += 1
        pos = _skip_whitespace(text, end)
        if text.startswith(",", pos):
            pos = _skip_whitespace(text, pos + 1)
            continue
        if text.startswith("]", pos):
            pos = _skip_whitespace(text, pos + 1)
            if pos != len(text):
                raise syntax(pos, "extra data after the array")
            return
        if pos == len(text):
            raise syntax(pos, "the array is not closed (expected ',' or ']')")
        raise syntax(pos, "expected ',' or ']'")
