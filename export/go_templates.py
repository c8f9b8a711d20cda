"""Annotation templates: specguard's Python format strings as Prometheus's Go templates
(``{value:.2f}`` -> ``{{ printf "%.2f" $value }}``), with text that Go would read as a template
action escaped, and what has no Go equivalent said."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

_SPEC = re.compile(
    r"^(?:(?P<fill>.)?(?P<align>[<>=^]))?(?P<sign>[-+ ])?z?(?P<alt>#)?(?P<zero>0)?(?P<width>\d+)?"
    r"(?P<grouping>[,_])?(?:\.(?P<precision>\d+))?(?P<type>[eEfFgGn%])?$"
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_FIELD = re.compile(r"^labels\[([^\]]*)\]$")


def _value_action(spec: str) -> str | None:
    """The Go action printing ``$value`` as Python's ``format(value, spec)`` would, or None."""
    if not spec:
        return "{{ $value }}"
    found = _SPEC.match(spec)
    if found is None or found["grouping"] or found["align"] in ("^", "="):
        return None
    if found["fill"] not in (None, " "):
        return None
    kind, precision = found["type"], found["precision"]
    if kind == "%":
        # Go templates have no arithmetic; Prometheus's own percentage helper multiplies by 100.
        plain = not (found["sign"] or found["alt"] or found["zero"] or found["width"] or found["align"])
        return "{{ $value | humanizePercentage }}" if plain else None
    flags = ("-" if found["align"] == "<" else "") + (found["sign"] or "").replace("-", "")
    flags += (found["alt"] or "") + (found["zero"] or "")
    if kind in (None, "n"):
        kind = "g"  # Python's default and locale formats are the general format
    verb = {"F": "f"}.get(kind, kind)
    # Python's precision defaults to 6 for every float format; Go's %g would print all digits.
    return f'{{{{ printf "%{flags}{found["width"] or ""}.{precision or 6}{verb}" $value }}}}'


def _go_text(text: str, action_follows: bool) -> str:
    """Literal ``text`` as Go template text: ``{{`` (and a ``{`` just before an action) would open
    an action, so they are printed by one."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i):
            out.append('{{ "{{" }}')
            i += 2
        elif text[i] == "{" and i == len(text) - 1 and action_follows:
            out.append('{{ "{" }}')
            i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def escape_go(text: str) -> str:
    """Text with no template actions of its own (a label value), safe in a Go template."""
    return _go_text(text, action_follows=False)


def go_template(
    template: str,
    *,
    threshold: float,
    rule: str,
    signal: str,
    severity: str,
    fixed: Mapping[str, Any] | None = None,
) -> tuple[str, list[str]]:
    """specguard's annotation ``template`` as a Prometheus (Go) template, and what could not be kept.

    ``threshold``, ``rule``, ``signal``, ``severity`` and ``state`` are known when the file is
    written (an alert Prometheus sends is firing), so they are rendered here with Python's own
    formatting, as are the ``fixed`` fields given (a firing's ``previous``, ``for``, ``change``...);
    ``value`` and ``labels`` become ``$value`` and ``$labels``.
    """
    fixed = {
        **(fixed or {}),
        "threshold": threshold,
        "rule": rule,
        "signal": signal,
        "severity": severity,
        "state": "firing",
    }
    pieces: list[tuple[bool, str]] = []  # (is an action, text)
    problems: list[str] = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        pieces.append((False, literal))
        if name is None:
            continue
        spec, suffix = spec or "", f"!{conversion}" if conversion else ""
        root = name.split("[", 1)[0].split(".", 1)[0]
        if root in fixed:
            pieces.append(
                (False, ("{" + name + suffix + (":" + spec if spec else "") + "}").format_map(fixed))
            )
            continue
        label = _LABEL_FIELD.match(name)
        if label is not None:
            key = label.group(1)
            ref = f"$labels.{key}" if _IDENTIFIER.match(key) else f"index $labels {_go_string(key)}"
            pieces.append((True, f"{{{{ {ref} }}}}"))
            if spec or conversion:
                problems.append(f"{{{name}{suffix}:{spec}}}: a label's format is not kept, it prints as is")
            continue
        action = _value_action(spec) if name == "value" and "{" not in spec else None
        if action is None:
            what = f"{{{name}{suffix}{':' + spec if spec else ''}}}"
            problems.append(f"{what} has no Go template equivalent here: it prints as {{{{ $value }}}}")
            action = "{{ $value }}"
        pieces.append((True, action))
    out: list[str] = []
    literal_run = ""
    for is_action, text in pieces:
        if is_action:
            out.append(_go_text(literal_run, action_follows=True) + text)
            literal_run = ""
        else:
            literal_run += text
    out.append(_go_text(literal_run, action_follows=False))
    return "".join(out), problems


def _go_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
