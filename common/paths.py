"""Paths in the config: relative ones are relative to the config file's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, ValidationInfo


def _from_config(value: Path, info: ValidationInfo) -> Path:
    """``value`` under the validation context's ``base`` (the config's directory) when relative."""
    path = value.expanduser()
    base = (info.context or {}).get("base")
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return path


# A path as the config gives it: validate with ``context={"base": config_dir}``.
ConfigPath = Annotated[Path, AfterValidator(_from_config)]
