"""Files other programs read while specguard writes them (a router's flag, Prometheus's rules,
vLLM's config): written atomically, the previous version kept on request."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, keep_previous: bool = True) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a part:
    a temporary file in the same directory, synced, given the old file's mode (or the umask's),
    renamed over, the directory synced. With ``keep_previous`` the file that was there is kept as
    ``PATH.prev`` (a hard link, so the path is never missing). A symbolic link is written through:
    the file it points to is replaced, in its own directory, and its previous version kept beside
    it, so the reader that follows the link sees the new text and the link stays a link. Raises
    OSError (a link that points nowhere among them)."""
    path = write_target(path)
    directory = path.parent
    mode = path.stat().st_mode & 0o777 if path.exists() else _default_mode()
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)  # mkstemp's 0600 would keep the reader (another user) out
            os.fsync(handle.fileno())
        if keep_previous and path.exists():
            previous = path.with_name(path.name + ".prev")
            with contextlib.suppress(FileNotFoundError):
                previous.unlink()
            os.link(path, previous)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    try:  # the rename itself is durable once the directory is synced
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_target(path: Path) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or the file its symbolic links lead
    to. OSError when a link leads nowhere (a loop, or a missing directory)."""
    if not path.is_symlink():
        return path
    try:
        target = path.resolve(strict=False)
    except RuntimeError:  # Python 3.11's word for a loop
        raise OSError(f"{path} is a symbolic link that leads round in a loop") from None
    if target.is_symlink():  # where a later Python stops at a loop
        raise OSError(f"{path} is a symbolic link that leads round in a loop")
    if not target.parent.is_dir():
        raise OSError(f"{path} is a symbolic link to {target}, whose directory does not exist")
    return target


def read_or_none(path: Path) -> str | None:
    """The file's text, or None when it is missing or not text."""
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
