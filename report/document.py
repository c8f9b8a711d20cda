"""The report as a document of blocks (headings, paragraphs, tables, lists, images), the outline
both renderings are made from. Text in it is plain text: each format escapes it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    text: str
    change: str = ""  # a week-over-week change shown after the value
    tone: str = ""  # "good" or "bad": the HTML colours the change


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str
    note: bool = False  # something the reader must not miss (charts left out)


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: list[list[Cell]]
    align: str = ""  # a letter per column, "l" or "r"; default: the first left, the rest right
    compact: bool = False

    def alignment(self) -> str:
        return self.align or "l" + "r" * (len(self.headers) - 1)


@dataclass(frozen=True)
class Items:
    items: list[str]


@dataclass(frozen=True)
class Image:
    name: str
    title: str


Block = Heading | Paragraph | Table | Items | Image


@dataclass
class Outline:
    title: str
    blocks: list[Block] = field(default_factory=list)
