"""The outline's blocks written as Markdown, escaped so that outside text (a model's name, a rule's
reasoning) shows as the text it is and starts no Markdown or HTML."""

from __future__ import annotations

import re
from collections.abc import Mapping

from specguard.report.document import Block, Cell, Heading, Image, Items, Paragraph

# Characters that would start Markdown syntax (or raw HTML) inside a line. "_" is handled apart:
# inside a word (p_i, acceptance_fallback) it starts nothing, and escaping it there would litter
# the source people read.
_MD_SPECIAL = re.compile(r"([\\`*\[\]|<>~])")
_MD_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_MD_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
_MD_LINE_START = re.compile(r"^(#{1,6}|[+=-]|\d{1,9}[.)])(?=\s|$)")


def escape(text: str) -> str:
    """Plain text as Markdown that shows exactly that text, on one line (tables and list items)."""
    text = " ".join(text.split())
    text = _MD_ENTITY.sub("&amp;", text)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    text = _MD_UNDERSCORE.sub(r"\\_", text)
    return _MD_LINE_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], text)


def _cell(cell: Cell) -> str:
    return escape(" ".join(part for part in (cell.text, cell.change) if part)) or " "


def block_lines(block: Block, images: Mapping[str, str], alts: Mapping[str, str]) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + escape(block.text)]
    if isinstance(block, Paragraph):
        return [f"> **{escape(block.text)}**" if block.note else escape(block.text)]
    if isinstance(block, Items):
        return [f"- {escape(item)}" for item in block.items]
    if isinstance(block, Image):
        target = images[block.name]
        if re.search(r"[\s()<>]", target):
            target = "<" + target.replace("<", "%3C").replace(">", "%3E") + ">"
        return [f"![{escape(alts.get(block.name, block.title))}]({target})", "", f"*{escape(block.title)}*"]
    rule = {"l": ":--", "r": "--:"}
    lines = [
        "| " + " | ".join(escape(h) or " " for h in block.headers) + " |",
        "| " + " | ".join(rule[a] for a in block.alignment()) + " |",
    ]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in block.rows]
    return lines
