"""The examples in the documentation (README.md and docs/*.md), read the way a reader copies them.

A fenced block is an example: ```yaml blocks are configs or rule files, ```json blocks baselines,
```sh blocks (and ``$ ``-prompted lines of any block) commands. An HTML comment on the line before a
fence says how a block is checked:

* ``<!-- docs-check: partial -->``: left out on purpose (an excerpt, a fragment of a larger file);
* ``<!-- docs-check: synopsis -->``: commands in synopsis form (``[--flag X]``, ``a|b``): their
  subcommands and flags must exist, their values are not parsed.

Everything else is checked in full. Inline code naming ``specguard SUBCOMMAND ...`` is checked for its
subcommand and flags.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^\s*<!--\s*docs-check:\s*([a-z-]+)\s*-->\s*$")
MARKERS = ("partial", "synopsis")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# A heredoc in a shell block: `cat > specguard.yaml <<'YAML'` ... `YAML`.
HEREDOC = re.compile(r"cat\s+>\s*(\S+)\s+<<-?\s*'?(\w+)'?\s*$")
SHELL_OPERATORS = re.compile(r"\s(?:\|\||&&|\||;)\s|\s>\s|\s>/|\s2>")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # dedented by the fence's indent
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the marker on the line before it."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, lang = opening[1], opening[2]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^{indent}```\s*$", lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        found = MARKER.match(before)
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", found[1] if found else None))
        i += 1
    return out


def markers(page: Path) -> list[tuple[int, str]]:
    """(line, kind) of every docs-check marker of ``page``."""
    return [
        (n, found[1])
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if (found := MARKER.match(line))
    ]


def prose(page: Path) -> str:
    """``page`` without its fenced blocks (each replaced by a blank line)."""
    out: list[str] = []
    inside: str | None = None
    for line in page.read_text().splitlines():
        if inside is None:
            opening = FENCE.match(line)
            if opening is not None:
                inside = opening[1]
                out.append("")
                continue
            out.append(line)
        elif re.match(rf"^{inside}```\s*$", line):
            inside = None
    return "\n".join(out)


def inline_commands(page: Path) -> list[str]:
    """The text of each inline code span that runs specguard with a subcommand (`specguard eval ...`)."""
    spans = re.findall(r"(?<!`)`([^`]+)`(?!`)", prose(page))
    out = []
    for span in spans:
        words = " ".join(span.split())
        if re.match(r"(?:\S*/)?specguard [a-z]", words):
            out.append(words)
    return out


@dataclass(frozen=True)
class Command:
    where: str
    text: str  # the command line as written, continuations joined
    argv: list[str]  # after the program's name


def _joined(text: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _without_comment(line: str) -> str:
    """``line`` up to an unquoted `` #`` comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _specguard_argv(segment: str) -> list[str] | None:
    """The arguments after ``specguard`` when ``segment`` (one command of a pipeline) runs it."""
    segment = re.sub(r"\$\([^)]*\)", "X", segment)  # $(date +%F) is one word
    try:
        words = shlex.split(segment)
    except ValueError:
        return None
    while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] == "sudo"):
        words = words[1:]
    if not words or words[0].rsplit("/", 1)[-1] != "specguard":
        return None
    return words[1:]


def shell_commands(block: Block) -> tuple[list[Command], list[tuple[str, str, str]]]:
    """The specguard commands of a block, and the files its heredocs write: (where, name, text).

    In a ```sh block every line is a command; in any other block only ``$ `` lines are.
    """
    shell = block.lang in ("sh", "bash", "shell", "console")
    commands: list[Command] = []
    files: list[tuple[str, str, str]] = []
    lines = _joined(block.text)
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("$ "):
            line = line[2:]
        elif not shell:
            continue
        heredoc = HEREDOC.search(line)
        if heredoc is not None:
            body = []
            while i < len(lines) and lines[i].strip() != heredoc[2]:
                body.append(lines[i])
                i += 1
            i += 1
            files.append((block.where, heredoc[1], "\n".join(body) + "\n"))
            continue
        code = _without_comment(line)
        for segment in SHELL_OPERATORS.split(f" {code} "):
            argv = _specguard_argv(segment)
            if argv is not None:
                commands.append(Command(block.where, " ".join(code.split()), argv))
    return commands, files


def synopsis_commands(block: Block) -> list[Command]:
    """The commands of a synopsis block: one a line, continued by indented ``[...]`` lines, with
    alternatives after `` | `` (``silence list ... | silence expire ID``)."""
    joined: list[str] = []
    for raw in block.text.splitlines():
        line = _without_comment(raw).rstrip()
        if not line.strip():
            continue
        if raw[:1].isspace() and joined:
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    out = []
    for line in joined:
        # ` | ` between commands (`silence list ... | silence expire ID`), or between options
        # (`[--since 7d | --from DATE]`), which stay with their command.
        alternatives: list[str] = []
        for part in line.split(" | "):
            if alternatives and part.lstrip()[:1] in ("-", "["):
                alternatives[-1] += " " + part
            else:
                alternatives.append(part)
        first, *others = alternatives
        words = first.split()
        if not words or words[0] != "specguard":
            continue
        out.append(Command(block.where, first, words[1:]))
        out.extend(Command(block.where, other, other.split()) for other in others)
    return out


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def names_problem(
    argv: list[str], parser: argparse.ArgumentParser, simulator: argparse.ArgumentParser
) -> str | None:
    """Why ``argv`` names a subcommand or a flag that does not exist, or None. Values, brackets
    and alternatives (``table|json``, ``up|down|set``) are allowed: this is a synopsis's check."""
    words = [w.strip("[]") for w in argv]
    current = parser
    path = ["specguard"]
    position = 0
    while position < len(words):
        choices = subparsers(current)
        word = words[position]
        if not choices or word.startswith("-"):
            break
        for alternative in word.split("|"):
            if alternative not in choices:
                return f"`{' '.join(path)}` has no subcommand {alternative!r} (it has: {', '.join(choices)})"
        current = choices[word.split("|")[0]]
        path.append(word)
        position += 1
        if path[1:] == ["simulate"]:
            current = simulator
            break
    known = options(current)
    for word in words[position:]:
        for flag, dotted in re.findall(r"(?:^|\|)(--?[A-Za-z][\w-]*)(\.?)", word):
            if dotted:  # the simulator's --speculative-config.KEY VALUE, rewritten as vLLM does
                continue
            if flag not in known:
                return f"`{' '.join(path)}` has no option {flag}"
    return None
