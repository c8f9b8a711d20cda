"""Finding a model (a local directory, or a hub id in the local Hugging Face cache) and loading its
config and tokenizer with transformers, the ``playbook`` extra, imported here and only when the
command runs: the daemon and every other command never import it."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

EXTRA = "pip install 'specguard[playbook]'"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a model needs for these checks; weights only for an EAGLE head's d2t/t2d (small files).
DOWNLOAD_PATTERNS = ["*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt"]


class MissingExtra(Exception):
    """transformers is not installed."""


class InputError(Exception):
    """A model or file the command cannot use; the message names it and says why."""


@dataclass
class Model:
    """One side of the pair: where it is, its config.json (raw, and through transformers) and its
    tokenizer (None when the directory has none, with the reason)."""

    role: str  # "target" or "draft"
    name: str  # as given
    path: Path
    source: str  # "local", "cache" or "download"
    raw: dict[str, Any]  # config.json as written
    config: Any  # transformers' config, or None when transformers does not know the model type
    config_note: str  # why ``config`` is None, else ""
    tokenizer: Any
    tokenizer_note: str  # why ``tokenizer`` is None, else ""
    weights: list[Path] = field(default_factory=list)  # *.safetensors beside config.json

    def text_value(self, *names: str) -> Any:
        """The first of ``names`` the text config has (``get_text_config()`` where nested, as vLLM
        reads it), else None."""
        text = self.text_config()
        for name in names:
            value = getattr(text, name, None) if not isinstance(text, dict) else text.get(name)
            if value is not None:
                return value
        return None

    def text_config(self) -> Any:
        if self.config is not None:
            return self.config.get_text_config()
        nested = self.raw.get("text_config")
        return nested if isinstance(nested, dict) else self.raw


def transformers_module() -> ModuleType:
    """transformers, imported now; MissingExtra names the extra that installs it."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found"
    try:
        import transformers
    except ImportError:
        raise MissingExtra(
            f"specguard compat needs transformers (and tokenizers), which the playbook extra installs: {EXTRA}"
        ) from None
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers


def load(role: str, name: str, allow_download: bool = False) -> Model:
    transformers = transformers_module()
    path, source = resolve(role, name, allow_download)
    raw = _read_config(role, path)
    config, config_note = _config(transformers, role, path)
    tokenizer, tokenizer_note = _tokenizer(transformers, role, path)
    weights = sorted(path.glob("*.safetensors"))
    return Model(role, name, path, source, raw, config, config_note, tokenizer, tokenizer_note, weights)


def resolve(role: str, name: str, allow_download: bool) -> tuple[Path, str]:
    """The directory of ``name``: a local directory as it is; a hub id from the local cache, or
    downloaded (config and tokenizer files only) when the user allows it and HF_HUB_OFFLINE does not
    forbid it."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(
                f"{role} {name}: not a model directory (a model is a directory with a config.json)"
            )
        return path, "local"
    if not HUB_ID.match(name) or name.startswith((".", "/", "~")):
        raise InputError(f"{role} {name}: no such directory (and not a hub id of the form org/name)")
    return _from_hub(role, name, allow_download), "download" if allow_download else "cache"


def _from_hub(role: str, name: str, allow_download: bool) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = constants.HF_HUB_OFFLINE  # HF_HUB_OFFLINE as the hub's client reads it
    try:
        found = snapshot_download(
            name,
            local_files_only=offline or not allow_download,
            allow_patterns=DOWNLOAD_PATTERNS if allow_download else None,
        )
    except LocalEntryNotFoundError:
        if allow_download and offline:
            raise InputError(
                f"{role} {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids downloading it"
            ) from None
        raise InputError(
            f"{role} {name}: no such directory, and not in the local Hugging Face cache (HF_HOME / "
            "HF_HUB_CACHE); nothing is downloaded without --allow-download"
        ) from None
    except Exception as err:  # the hub's errors: unknown repo, gated, network down
        raise InputError(f"{role} {name}: cannot fetch from the hub: {_one_line(err)}") from None
    return Path(str(found))


def _read_config(role: str, path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.exists():
        raise InputError(f"{role} {path}: not a model directory: no config.json in it")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{role} {file}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise InputError(f"{role} {file}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{role} {file}:{err.lineno}: not valid JSON: {err.msg}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{role} {file}: not a JSON object")
    return raw


def _config(transformers: ModuleType, role: str, path: Path) -> tuple[Any, str]:
    try:
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True), ""
    except (ValueError, KeyError) as err:  # a model type this transformers does not know
        return None, f"transformers cannot read it ({_one_line(err)}); config.json read as written"
    except OSError as err:
        raise InputError(f"{role} {path}/config.json: {_one_line(err)}") from None


def _tokenizer(transformers: ModuleType, role: str, path: Path) -> tuple[Any, str]:
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((path / n).exists() for n in names):
        return None, "no tokenizer files in the directory"
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True), ""
    except Exception as err:  # transformers raises many kinds for a broken tokenizer
        raise InputError(f"{role} {path}: cannot load its tokenizer: {_one_line(err)}") from None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "") if text else type(err).__name__
