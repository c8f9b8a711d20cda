"""vLLM's speculative config where the serving host keeps it, read and rewritten with a new
``num_speculative_tokens``: an environment file read by the vLLM unit, or vLLM's own YAML
``--config`` file (edited in place, comments and other keys kept).

k = 0 means speculative decoding off: vLLM rejects ``num_speculative_tokens: 0`` (``gt=0`` since
0.12), so the whole config is removed, and the other keys (method, model, ...) are kept by the
action to put back when a step up turns it on again.
"""

from __future__ import annotations

import io
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

K = "num_speculative_tokens"
YAML_KEYS = ("speculative-config", "speculative_config")  # vLLM reads either spelling
# The environment file's variable: the JSON, empty when off. The unit passes it on through a shell,
# ${VLLM_SPECULATIVE_CONFIG:+"--speculative-config=$VLLM_SPECULATIVE_CONFIG"} (systemd/vllm.service):
# systemd's own splitting of $VAR would strip the JSON's quotes and backslashes.
CONFIG_VARIABLE = "VLLM_SPECULATIVE_CONFIG"
# From this vLLM version a mapping under `speculative-config:` is passed on as JSON; before it,
# str(dict) gave Python's repr, which vLLM's json.loads rejects: the value must be a JSON string.
MAPPING_SINCE = (0, 16)


class ConfigError(ValueError):
    """The file does not hold a speculative config specguard can read; says where and why."""


def with_k(base: Mapping[str, Any], k: int) -> dict[str, Any] | None:
    """The speculative config for ``k`` tokens (None: off), every other key of ``base`` kept."""
    if k <= 0:
        return None
    return {**{key: value for key, value in base.items() if key != K}, K: k}


def compact(config: Mapping[str, Any]) -> str:
    """One line of JSON with no single quote and no whitespace (written as \\u escapes, which JSON
    reads back as the same characters): systemd's EnvironmentFile keeps it whole and unchanged
    inside single quotes."""
    text = json.dumps(dict(config), separators=(",", ":"), ensure_ascii=True)
    return text.replace(" ", "\\u0020").replace("'", "\\u0027")


def version_tuple(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


# --- the environment file ---------------------------------------------------------------------


def read_env(text: str | None, where: str) -> dict[str, Any] | None:
    """The config in an environment file's ``VLLM_SPECULATIVE_CONFIG`` (None: off or absent)."""
    for number, line in enumerate((text or "").splitlines(), 1):
        name, sep, value = line.partition("=")
        if not sep or name.strip() != CONFIG_VARIABLE:
            continue
        try:
            words = shlex.split(value, comments=False)
        except ValueError as exc:
            raise ConfigError(f"{where}:{number}: {CONFIG_VARIABLE}: {exc}") from None
        raw = words[0] if words else ""
        if not raw:
            return None
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}:{number}: {CONFIG_VARIABLE} is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{where}:{number}: {CONFIG_VARIABLE} is not a JSON object")
        return config
    return None


def render_env(config: Mapping[str, Any] | None, note: str) -> str:
    value = f"'{compact(config)}'" if config is not None else ""
    return (
        f"# {note}\n"
        "# Empty: speculative decoding off (the unit then passes no --speculative-config at all).\n"
        f"{CONFIG_VARIABLE}={value}\n"
    )


# --- vLLM's YAML config -------------------------------------------------------------------------


def _yaml() -> YAML:
    yaml = YAML()  # round trip: comments, order and quoting kept
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _load(text: str, where: str) -> CommentedMap:
    try:
        data = _yaml().load(text) if text.strip() else CommentedMap()
    except YAMLError as exc:
        raise ConfigError(f"{where}: not YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, CommentedMap):
        raise ConfigError(f"{where}: not a mapping of vLLM options")
    return data


def _key(data: CommentedMap) -> str | None:
    present = [k for k in YAML_KEYS if k in data]
    return present[0] if present else None


def read_yaml(text: str | None, where: str) -> dict[str, Any] | None:
    """The config under ``speculative-config`` (a JSON string or a mapping); None when absent."""
    data = _load(text or "", where)
    key = _key(data)
    if key is None or data[key] is None:
        return None
    value = data[key]
    line = data.lc.key(key)[0] + 1
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}:{line}: {key} is not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}:{line}: {key} is neither a JSON string nor a mapping")
    plain: dict[str, Any] = json.loads(json.dumps(dict(value)))  # plain dicts and lists, no ruamel types
    return plain


def render_yaml(text: str | None, config: Mapping[str, Any] | None, version: str | None, where: str) -> str:
    """``text`` with its speculative config replaced by ``config`` (None: the key removed), in
    the form the running vLLM reads: the form the file already uses, except that a mapping
    becomes a JSON string before vLLM 0.16; a new key is a mapping from 0.16 on (or when the
    version is not known, a JSON string, which every version reads)."""
    data = _load(text or "", where)
    key = _key(data) or YAML_KEYS[0]
    known = version_tuple(version)
    mapping_ok = known is not None and known >= MAPPING_SINCE
    if config is None:
        data.pop(key, None)
    elif isinstance(data.get(key), CommentedMap) and (known is None or mapping_ok):
        current: CommentedMap = data[key]
        for gone in [k for k in current if k not in config]:
            del current[gone]
        for name, value in config.items():
            current[name] = value  # in place: the keys' comments stay
    elif (key in data and isinstance(data[key], str)) or not mapping_ok:
        data[key] = json.dumps(dict(config), separators=(", ", ": "))
    else:
        data[key] = CommentedMap(config)
    out = io.StringIO()
    _yaml().dump(data, out)
    return out.getvalue()
