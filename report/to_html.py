"""The outline's blocks written as HTML, every piece of text escaped, with the page's inline style
(``CSS``): charts are inlined as data: URIs, nothing is loaded and nothing runs."""

from __future__ import annotations

import base64
import html as html_escape
from collections.abc import Mapping

from specguard.report.document import Block, Cell, Heading, Image, Items, Paragraph

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1c2430;background:#fff;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:1.55em;margin:0 0 .3em}
h2{font-size:1.25em;margin:1.8em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #d8dee6}
h3{font-size:1.05em;margin:1.3em 0 .4em}
table{border-collapse:collapse;margin:.4em 0 1em;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid #e4e8ee;vertical-align:top}
th{background:#f3f5f8;font-weight:600}
td.r,th.r{text-align:right;white-space:nowrap}
td.l,th.l{text-align:left}
table.compact{font-size:.8em}
table.compact th,table.compact td{padding:2px 4px}
.change{white-space:nowrap;color:#56606d;margin-left:.4em}
.good{color:#1a7f37}
.bad{color:#c0362c}
.note{background:#fff4d6;border-left:4px solid #d9a300;padding:8px 12px}
figure{margin:.6em 0 1.2em}
figure img{max-width:100%;height:auto;border:1px solid #e4e8ee}
figcaption{font-size:.85em;color:#56606d}
ul{margin:.3em 0 1em;padding-left:1.4em}
""".strip()


def escape(text: str) -> str:
    return html_escape.escape(text, quote=True)


def _cell(cell: Cell, tag: str, align: str) -> str:
    inner = escape(cell.text)
    if cell.change:
        inner += f'<span class="change {cell.tone}">{escape(cell.change)}</span>'
    return f'<{tag} class="{align}">{inner}</{tag}>'


def block_element(block: Block, images: Mapping[str, bytes], alts: Mapping[str, str]) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{escape(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return f'<p class="note">{escape(block.text)}</p>' if block.note else f"<p>{escape(block.text)}</p>"
    if isinstance(block, Items):
        return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Image):
        data = base64.b64encode(images[block.name]).decode("ascii")
        alt = escape(alts.get(block.name, block.title))
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{alt}">'
            f"<figcaption>{escape(block.title)}</figcaption></figure>"
        )
    align = block.alignment()
    head = "".join(_cell(Cell(h), "th", a) for h, a in zip(block.headers, align, strict=True))
    rows = "".join(
        "<tr>" + "".join(_cell(cell, "td", a) for cell, a in zip(row, align, strict=True)) + "</tr>"
        for row in block.rows
    )
    compact = ' class="compact"' if block.compact else ""
    return f"<table{compact}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def document(title: str, body: str) -> str:
    """A whole page: ``body`` (HTML) under ``title``, its style inline, nothing loaded from elsewhere
    (its policy allows images as data: URIs and the inline style only) and no script."""
    shown = escape(title)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{shown}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        f"<h1>{shown}</h1>\n{body}\n</main>\n</body>\n</html>\n"
    )
