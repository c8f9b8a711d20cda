"""Case 2's remedy as the routing section's YAML: the classes whose acceptance collapsed sent to the
fallback (standard) pool, ready to paste into the config's ``routing:`` section, and checked with
``config/routing.py`` before it is printed.

An existing class keeps its conditions and its place in the list (the first class that matches
wins) and gets the fallback pool; the router's own class ``default`` (no class matched) is
``default_pool``; a class the router cannot see yet (a bench prompt class: the router reads a
request's shape, not its text) is a new class on a ``model`` name its clients send, put first.
The whole ``classes:`` list is printed, so that pasting it keeps the order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from specguard.config.routing import DEFAULT_CLASS, RESERVED_CLASSES, RoutingConfig, TrafficClass

STANDARD = "standard"  # the fallback pool's name when the config has no routing section
# Words YAML 1.1 (PyYAML) reads as booleans or null: quoted when a name is one of them.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


@dataclass(frozen=True)
class Reroute:
    text: str  # the YAML, as printed ("" when nothing could be written)
    pool: str  # the pool the classes are sent to
    problems: tuple[str, ...] = ()  # classes it could not write a rule for, or why it is not valid


def class_name(name: str) -> str:
    """A routing class name for a bench prompt class: letters, digits, ``_.-``, a letter first, not
    one of the router's own names."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:56] or "prompts"
    if not cleaned[0].isalpha():
        cleaned = f"c_{cleaned}"
    return f"{cleaned}_prompts" if cleaned in RESERVED_CLASSES else cleaned


def _scalar(value: Any) -> str:
    """A value as YAML reads it back: JSON's strings, numbers, booleans and lists are YAML."""
    return json.dumps(value, ensure_ascii=False)


def _name(value: str) -> str:
    """A class or pool name, plain where YAML reads it back as the same string."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", value) and value.lower() not in _YAML_WORDS
    return value if plain else _scalar(value)


def _note(first: str, why: str) -> str:
    return f"{first}; {why}" if why else first


def _when(item: TrafficClass) -> str:
    conditions = []
    for condition in item.when:
        if len(condition.ops) == 1 and condition.ops[0][0] == "eq":
            conditions.append(f"{condition.field}: {_scalar(condition.ops[0][1])}")
        else:
            ops = ", ".join(f"{op}: {_scalar(value)}" for op, value in condition.ops)
            conditions.append(f"{condition.field}: {{{ops}}}")
    return "{" + ", ".join(conditions) + "}"


def _entry(name: str, pool: str, when: str, comment: str = "") -> list[str]:
    note = f"  # {comment}" if comment else ""
    return [f"    - name: {_name(name)}", f"      pool: {_name(pool)}{note}", f"      when: {when}"]


def reroute(
    routing: RoutingConfig | None,
    existing: Sequence[str],
    new: Mapping[str, Mapping[str, Any]],
    why: Mapping[str, str],
) -> Reroute:
    """Send the routing classes ``existing`` (``default`` included) and the new classes ``new``
    (name -> its ``when``) to the fallback pool; ``why`` is each one's comment."""
    pool = routing.fallback_pool if routing is not None else STANDARD
    known = {item.name: item for item in routing.classes} if routing is not None else {}
    problems = [
        f"class {name}: the config's routing section has no class of that name, so its conditions are unknown"
        for name in existing
        if name != DEFAULT_CLASS and name not in known
    ]
    current = {name: item.pool for name, item in known.items()}
    if routing is not None:
        current[DEFAULT_CLASS] = routing.default_pool
    problems += [
        f"class {name} already goes to the fallback pool {pool}, whose servers speculate: turn "
        "speculation off there, or name another pool"
        for name in existing
        if current.get(name) == pool
    ]
    lines = ["routing:"]
    changed = 0
    if DEFAULT_CLASS in existing and routing is None:
        problems.append("class default: the config has no routing section whose default_pool to change")
    elif DEFAULT_CLASS in existing and routing is not None and routing.default_pool != pool:
        changed += 1
        comment = _note(f"was {routing.default_pool}", why.get(DEFAULT_CLASS, ""))
        lines.append(f"  default_pool: {_name(pool)}  # {comment}")
    entries: list[str] = []
    for given, when in new.items():
        name = class_name(given)
        try:
            made = TrafficClass(name=name, pool=pool, when=dict(when))
        except ValidationError as exc:
            problems.append(f"class {given}: no rule could be written: {exc.errors()[0]['msg']}")
            continue
        entries += _entry(name, pool, _when(made), _note("new", why.get(given, "")))
        changed += 1
    for item in known.values():
        if item.name in existing and item.pool != pool:
            entries += _entry(item.name, pool, _when(item), _note(f"was {item.pool}", why.get(item.name, "")))
            changed += 1
        else:
            entries += _entry(item.name, item.pool, _when(item))
    if entries:
        lines += ["  classes:", *entries]
    if not changed:
        return Reroute("", pool, tuple(problems))
    text = "\n".join(lines) + "\n"
    return Reroute(text, pool, tuple(problems) + _check(text, routing))


def _check(text: str, routing: RoutingConfig | None) -> tuple[str, ...]:
    """Whether the printed YAML is a valid routing section with the config's other keys: each
    class, and with a routing section the whole section, through config/routing.py."""
    try:
        section = yaml.safe_load(text)["routing"]
        for item in section.get("classes", []):
            TrafficClass.model_validate(item)
        if routing is not None:
            merged = {**routing.model_dump(exclude={"classes"}), "classes": [], **section}
            RoutingConfig.model_validate(merged)
    except (yaml.YAMLError, ValidationError, KeyError, TypeError) as exc:
        first = str(exc).splitlines()
        return (f"the rule printed is not a valid routing section: {' '.join(first[:3])}",)
    return ()
