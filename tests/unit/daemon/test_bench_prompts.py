"""The bench's prompts: the built-in sets (sizes, variety, lengths) and the prompt file loader."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specguard.playbook.bench.prompts import CLASSES, Prompt, PromptError, builtin, load_file, read_file

EXPECTED_COUNTS = {"chat": 40, "code": 30, "summarization": 20, "multilingual": 30, "long_context": 10}


def by_class(klass: str) -> list[str]:
    return [p.text for p in builtin([klass])]


# --- the built-in sets ----------------------------------------------------------------------------


def test_the_classes_are_the_documented_ones() -> None:
    assert set(CLASSES) == set(EXPECTED_COUNTS)


@pytest.mark.parametrize(("klass", "count"), EXPECTED_COUNTS.items())
def test_each_builtin_class_loads_with_its_count(klass: str, count: int) -> None:
    prompts = builtin([klass])
    assert len(prompts) == count
    assert {p.klass for p in prompts} == {klass}
    assert all(p.max_tokens is None for p in prompts)
    assert all(p.text.strip() for p in prompts)


def test_all_classes_come_in_class_order_and_file_order() -> None:
    prompts = builtin()
    assert len(prompts) == sum(EXPECTED_COUNTS.values())
    order = [p.klass for p in prompts]
    # grouped by class, classes in CLASSES order
    assert order == [k for k in CLASSES for _ in range(EXPECTED_COUNTS[k])]
    # file order within a class is stable between calls, so runs are comparable
    assert [p.text for p in prompts] == [p.text for p in builtin()]


def test_a_subset_comes_in_the_order_asked() -> None:
    prompts = builtin(["code", "chat"])
    assert [p.klass for p in prompts] == ["code"] * 30 + ["chat"] * 40
    assert prompts[30:] == builtin(["chat"])


def test_an_unknown_class_names_the_known_ones() -> None:
    with pytest.raises(PromptError) as info:
        builtin(["chat", "poetry"])
    message = str(info.value)
    assert "poetry" in message
    for klass in CLASSES:
        assert klass in message


def test_no_prompt_is_repeated_within_or_across_classes() -> None:
    texts = [p.text for p in builtin()]
    normalized = [" ".join(t.split()).casefold() for t in texts]
    assert len(set(normalized)) == len(normalized)


def test_chat_prompts_are_short_everyday_requests() -> None:
    for text in by_class("chat"):
        assert len(text) <= 300, text
        assert "```" not in text


def test_code_prompts_span_several_languages_and_some_carry_code() -> None:
    texts = by_class("code")
    languages = [
        "Python",
        "JavaScript",
        "TypeScript",
        "Go",
        "Rust",
        "C",
        "Java",
        "SQL",
        "Bash",
        "Ruby",
        "Kotlin",
        "C#",
    ]
    named = {
        lang for lang in languages for t in texts if re.search(rf"(?<![\w#+]){re.escape(lang)}(?![\w#+])", t)
    }
    assert len(named) >= 6, named
    fenced = [t for t in texts if t.count("```") >= 2]
    assert len(fenced) >= 5


def _passage_and_instruction(text: str) -> tuple[str, str]:
    passage, _, instruction = text.rpartition("\n\n")
    return passage, instruction


def test_summarization_prompts_are_a_passage_then_a_varied_instruction() -> None:
    instructions = set()
    for text in by_class("summarization"):
        passage, instruction = _passage_and_instruction(text)
        assert len(passage) >= 600, passage[:80]
        assert 120 <= len(passage.split()) <= 250, passage[:80]
        assert 0 < len(instruction) < 300, instruction
        assert re.search(r"summar|tl;dr|condense", instruction, re.IGNORECASE), instruction
        instructions.add(instruction)
    assert len(instructions) == len(by_class("summarization"))


def test_long_context_prompts_are_long_and_end_with_a_question() -> None:
    for text in by_class("long_context"):
        assert len(text) >= 6000, text[:80]
        assert 1200 <= len(text.split()) <= 2000, text[:80]
        last = text.rstrip().rsplit("\n", 1)[-1]
        assert last.startswith("Question:") and "?" in last, last


# Scripts by Unicode range; Latin-script languages by letters that only they (among those used) have.
_SIGNATURES: dict[str, str] = {
    "japanese": r"[\u3040-\u30ff]",  # hiragana, katakana
    "korean": r"[\uac00-\ud7af]",
    "russian": r"[\u0400-\u04ff]",
    "arabic": r"[\u0600-\u06ff]",
    "hindi": r"[\u0900-\u097f]",
    "german": r"[äÄß]",
    "spanish": r"[ñ¿¡]",
    "portuguese": r"[ãõ]",
    "french": r"[çœêÊ]",
    "turkish": r"[ığşİ]",
}


def _languages(text: str) -> set[str]:
    found = {name for name, pattern in _SIGNATURES.items() if re.search(pattern, text)}
    # Han without kana is Chinese; with kana it is Japanese (already counted).
    if re.search(r"[\u4e00-\u9fff]", text) and "japanese" not in found:
        found.add("chinese")
    return found


def test_the_signature_check_tells_languages_apart() -> None:
    assert _languages("Hello, how are you?") == set()
    assert _languages("请解释一下") == {"chinese"}
    assert _languages("説明してください") == {"japanese"}
    assert _languages("¿Qué tal?") == {"spanish"}


def test_multilingual_covers_at_least_eight_languages_with_real_scripts() -> None:
    texts = by_class("multilingual")
    covered: set[str] = set()
    for text in texts:
        covered |= _languages(text)
        assert any(ord(c) > 127 for c in text), f"no non-ASCII letter, English? {text}"
    assert len(covered) >= 8, covered
    for script in ("japanese", "chinese", "korean", "russian", "arabic", "hindi"):
        assert script in covered, script


def test_builtin_files_are_one_object_per_line_with_only_a_prompt() -> None:
    folder = Path(__file__).resolve().parents[3] / "playbook" / "bench" / "prompts"
    for klass in CLASSES:
        lines = (folder / f"{klass}.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) == EXPECTED_COUNTS[klass]
        for line in lines:
            assert set(json.loads(line)) == {"prompt"}
    assert sorted(p.stem for p in folder.glob("*.jsonl")) == sorted(CLASSES)


# --- JSONL files ----------------------------------------------------------------------------------


def write(tmp_path: Path, content: str | bytes, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def jsonl(*records: Any) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def test_jsonl_prompts_classes_and_max_tokens(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        jsonl(
            {"prompt": "Say hi."},
            {"prompt": "Write a sort.", "class": "code", "max_tokens": 256},
            {"prompt": "Résumé ?", "class": " multilingual ", "id": 7, "reference": "ignored"},
        ),
    )
    assert load_file(path) == [
        Prompt("file", "Say hi."),
        Prompt("code", "Write a sort.", 256),
        Prompt("multilingual", "Résumé ?"),
    ]
    loaded = read_file(path)
    assert loaded.format == "jsonl"
    assert loaded.skipped == 0
    assert loaded.path == path


def test_jsonl_messages_take_the_last_user_message(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question"},
        {"role": "assistant", "content": "Trailing assistant turn"},
    ]
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url"},
                {"type": "text", "text": "what is it?"},
            ],
        }
    ]
    path = write(tmp_path, jsonl({"messages": messages, "class": "chat"}, {"messages": parts}))
    assert load_file(path) == [Prompt("chat", "Second question"), Prompt("file", "Look:\nwhat is it?")]


def test_jsonl_tolerates_blank_lines_crlf_and_a_bom(tmp_path: Path) -> None:
    content = '\ufeff{"prompt": "one"}\r\n\r\n   \n{"prompt": "two"}'  # no final newline either
    path = write(tmp_path, content.encode("utf-8"))
    assert [p.text for p in load_file(path)] == ["one", "two"]


def test_jsonl_keeps_the_prompt_text_as_written(tmp_path: Path) -> None:
    text = "  indented\n\tcode  "
    path = write(tmp_path, jsonl({"prompt": text}))
    assert load_file(path)[0].text == text


def test_a_line_separator_inside_a_string_does_not_split_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{"prompt": "before\u2028after"}\n')
    assert load_file(path) == [Prompt("file", "before\u2028after")]


def test_the_format_comes_from_the_content_not_the_suffix(tmp_path: Path) -> None:
    array = json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}])
    as_jsonl = write(tmp_path, array, "looks_like.jsonl")
    assert read_file(as_jsonl).format == "sharegpt"
    lines = write(tmp_path, jsonl({"prompt": "hi"}), "looks_like.json")
    assert read_file(lines).format == "jsonl"


# --- ShareGPT files -------------------------------------------------------------------------------


def sharegpt(*entries: Any) -> str:
    return json.dumps(list(entries), indent=2, ensure_ascii=False)


def test_sharegpt_takes_the_first_human_turn_and_counts_the_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        sharegpt(
            {
                "id": "a",
                "conversations": [
                    {"from": "human", "value": "Q1"},
                    {"from": "gpt", "value": "A1"},
                    {"from": "human", "value": "Q2"},
                ],
            },
            {
                "id": "b",
                "conversations": [
                    {"from": "gpt", "value": "Hello! How can I help?"},
                    {"from": "user", "value": "Q3"},
                ],
            },
            {"id": "c", "conversations": []},
            {"id": "d", "conversations": [{"from": "gpt", "value": "only the model"}]},
            {
                "id": "e",
                "conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": "   "}],
            },
            {
                "id": "f",
                "conversations": [{"from": "human", "value": "Q4"}, {"from": "assistant", "value": "A4"}],
            },
        ),
        "sharegpt.json",
    )
    loaded = read_file(path)
    assert loaded.format == "sharegpt"
    assert [p.text for p in loaded.prompts] == ["Q1", "Q3", "Q4"]
    assert {p.klass for p in loaded.prompts} == {"sharegpt"}
    assert all(p.max_tokens is None for p in loaded.prompts)
    assert loaded.skipped == 3
    assert load_file(path) == list(loaded.prompts)


def test_sharegpt_on_one_line_and_with_leading_whitespace(tmp_path: Path) -> None:
    entries = [{"conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(3)]
    path = write(tmp_path, "\n\n  " + json.dumps(entries) + "\n", "one_line.json")
    assert [p.text for p in load_file(path)] == ["q0", "q1", "q2"]


# --- bad input: every error names the file, the line and the field --------------------------------

_OK = '{"prompt": "fine"}\n'


@pytest.mark.parametrize(
    ("content", "line", "field", "reason"),
    [
        (_OK + '{"prompt": "a",}\n', 2, "", "invalid JSON at column 16: Expecting property name"),
        (_OK + _OK + "not json\n", 3, "", "invalid JSON at column 1: Expecting value"),
        (_OK + '["a list"]\n', 2, "", "expected a JSON object, got an array"),
        (_OK + '"just a string"\n', 2, "", "expected a JSON object, got a string"),
        (_OK + '{"text": "wrong key"}\n', 2, "prompt", "missing"),
        (_OK + '{"prompt": 42}\n', 2, "prompt", "must be a string, got a number"),
        (_OK + '{"prompt": null}\n', 2, "prompt", "must be a string, got null"),
        (_OK + '{"prompt": ""}\n', 2, "prompt", "is empty"),
        (_OK + '{"prompt": "  \\n "}\n', 2, "prompt", "is empty"),
        ('{"prompt": "a", "messages": []}\n', 1, "prompt", 'give "prompt" or "messages", not both'),
        ('{"messages": "hi"}\n', 1, "messages", "must be an array of messages, got a string"),
        ('{"messages": ["hi"]}\n', 1, "messages[0]", "must be an object, got a string"),
        ('{"messages": [{"content": "hi"}]}\n', 1, "messages[0].role", "missing"),
        (
            '{"messages": [{"role": 1, "content": "hi"}]}\n',
            1,
            "messages[0].role",
            "must be a string, got a number",
        ),
        (
            '{"messages": [{"role": "system", "content": "hi"}]}\n',
            1,
            "messages",
            "no message with role 'user'",
        ),
        ('{"messages": []}\n', 1, "messages", "no message with role 'user'"),
        (
            '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": ""}]}\n',
            1,
            "messages[1].content",
            "is empty",
        ),
        (
            '{"messages": [{"role": "user"}]}\n',
            1,
            "messages[0].content",
            "must be a string or a list of text parts, got null",
        ),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}\n',
            1,
            "messages[0].content",
            "is empty",
        ),
        (
            '{"messages": [{"role": "user", "content": ["x"]}]}\n',
            1,
            "messages[0].content[0]",
            "must be an object, got a string",
        ),
        (
            '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}\n',
            1,
            "messages[0].content[0].text",
            "must be a string, got null",
        ),
        (_OK + '{"prompt": "a", "class": 3}\n', 2, "class", "must be a string, got a number"),
        (_OK + '{"prompt": "a", "class": " "}\n', 2, "class", "is empty"),
        (_OK + '{"prompt": "a", "max_tokens": 0}\n', 2, "max_tokens", "must be a positive integer, got 0"),
        (_OK + '{"prompt": "a", "max_tokens": -5}\n', 2, "max_tokens", "must be a positive integer, got -5"),
        (
            _OK + '{"prompt": "a", "max_tokens": 1.5}\n',
            2,
            "max_tokens",
            "must be a positive integer, got 1.5",
        ),
        (
            _OK + '{"prompt": "a", "max_tokens": "64"}\n',
            2,
            "max_tokens",
            'must be a positive integer, got "64"',
        ),
        (
            _OK + '{"prompt": "a", "max_tokens": true}\n',
            2,
            "max_tokens",
            "must be a positive integer, got true",
        ),
    ],
)
def test_a_bad_jsonl_line_is_named_with_its_line_and_field(
    tmp_path: Path, content: str, line: int, field: str, reason: str
) -> None:
    path = write(tmp_path, content)
    with pytest.raises(PromptError) as info:
        load_file(path)
    where = f"{path}:{line}: " + (f"{field}: " if field else "")
    assert str(info.value).startswith(where + reason), str(info.value)
    assert (info.value.file, info.value.line, info.value.field) == (str(path), line, field)


def test_a_line_number_counts_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path, _OK + "\n\n" + '{"prompt": ""}\n')
    with pytest.raises(PromptError, match=re.escape(f"{path}:4: prompt: is empty")):
        load_file(path)


def test_a_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, _OK.encode() + b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(PromptError) as info:
        load_file(path)
    assert str(info.value) == f"{path}:2: not UTF-8 text (byte 0xe9)"


@pytest.mark.parametrize("content", ["", "\n\n  \n", "\ufeff"])
def test_a_file_without_prompts_is_an_error(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(PromptError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}: no prompts")
    assert info.value.line is None


def test_a_missing_file_and_a_directory_are_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(PromptError) as info:
        load_file(missing)
    assert str(info.value) == f"{missing}: no such file"
    with pytest.raises(PromptError) as info:
        load_file(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: is a directory")


@pytest.mark.parametrize(
    ("entries", "line", "field", "reason"),
    [
        # entries start on lines 2, 3, ... when written one per line after "[\n"
        (
            ['{"conversations": [{"from": "human", "value": "ok"}]}', '"text"'],
            3,
            "[1]",
            "must be an object, got a string",
        ),
        (['{"conversations": [{"from": "human", "value": "ok"}]}', "{}"], 3, "[1].conversations", "missing"),
        (['{"conversations": {"from": "human"}}'], 2, "[0].conversations", "must be an array, got an object"),
        (['{"conversations": ["hi"]}'], 2, "[0].conversations[0]", "must be an object, got a string"),
        (['{"conversations": [{"value": "hi"}]}'], 2, "[0].conversations[0].from", "missing"),
        (
            ['{"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": 5}]}'],
            2,
            "[0].conversations[1].value",
            "must be a string, got a number",
        ),
        (['{"conversations": [{"from": "human"}]}'], 2, "[0].conversations[0].value", "missing"),
    ],
)
def test_a_bad_sharegpt_entry_is_named_with_its_line_and_field(
    tmp_path: Path, entries: list[str], line: int, field: str, reason: str
) -> None:
    path = write(tmp_path, "[\n" + ",\n".join(entries) + "\n]\n", "sharegpt.json")
    with pytest.raises(PromptError) as info:
        load_file(path)
    assert str(info.value) == f"{path}:{line}: {field}: {reason}"


def test_a_sharegpt_entry_spanning_lines_is_named_by_its_first_line(tmp_path: Path) -> None:
    good = {"conversations": [{"from": "human", "value": "ok"}]}
    bad = {"conversations": [{"from": "human", "value": None}]}
    path = write(tmp_path, sharegpt(good, good, bad), "sharegpt.json")
    # indent=2: each entry takes 8 lines after the opening "[" line
    with pytest.raises(PromptError) as info:
        load_file(path)
    assert str(info.value) == f"{path}:18: [2].conversations[0].value: missing"


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (
            '[\n  {"conversations": []},\n  {"conversations": [}\n]',
            3,
            "invalid JSON at column 22: Expecting value",
        ),
        ('[\n  {"conversations": []},\n]', 3, "invalid JSON at column 1: Expecting value"),
        (
            '[\n  {"conversations": []}\n  {"conversations": []}\n]',
            3,
            "invalid JSON at column 3: expected ',' or ']'",
        ),
        ('[\n  {"conversations": []}\n', 3, "invalid JSON at column 1: the array is not closed"),
        (
            '[{"conversations": [{"from": "human", "value": "q"}]}]\n{"prompt": "x"}\n',
            2,
            "invalid JSON at column 1: extra data after the array",
        ),
        ("[]\n[]", 2, "invalid JSON at column 1: extra data after the array"),
    ],
)
def test_broken_sharegpt_json_names_line_and_column(
    tmp_path: Path, content: str, line: int, reason: str
) -> None:
    path = write(tmp_path, content, "sharegpt.json")
    with pytest.raises(PromptError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}:{line}: {reason}"), str(info.value)


def test_a_sharegpt_file_without_prompts_says_why(tmp_path: Path) -> None:
    empty = write(tmp_path, "[ ]", "empty.json")
    with pytest.raises(PromptError, match=re.escape(f"{empty}: no prompts: the array is empty")):
        load_file(empty)
    no_human = write(
        tmp_path,
        sharegpt({"conversations": []}, {"conversations": [{"from": "gpt", "value": "x"}]}),
        "gpt.json",
    )
    with pytest.raises(
        PromptError, match=re.escape(f"{no_human}: no prompts: none of its 2 entries has a human turn")
    ):
        load_file(no_human)


# --- never a traceback ----------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "prompt",
                    "messages",
                    "role",
                    "content",
                    "class",
                    "max_tokens",
                    "conversations",
                    "from",
                    "value",
                    "type",
                    "text",
                ]
            )
            | st.text(max_size=3),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_json_values, max_size=4), as_array=st.booleans())
def test_any_json_gives_prompts_or_a_prompt_error(tmp_path: Path, records: list[Any], as_array: bool) -> None:
    text = json.dumps(records) if as_array else "\n".join(json.dumps(r) for r in records)
    path = write(tmp_path, text)
    try:
        prompts = load_file(path)
    except PromptError as err:
        assert str(err).startswith(str(path))
    else:
        assert prompts and all(isinstance(p, Prompt) and p.text.strip() for p in prompts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=64) | st.text(alphabet='[]{}",: \n\\abu0', max_size=40).map(str.encode))
def test_any_bytes_give_prompts_or_a_prompt_error(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path, data)
    try:
        load_file(path)
    except PromptError as err:
        assert str(err).startswith(str(path))
