"""Flag files and vLLM config files written atomically: a symbolic link is written through to the
file it points to (what the router or vLLM reads), never replaced by a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specguard.common.files import write_atomically


def test_a_symlinked_file_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "etc").mkdir()
    real = tmp_path / "real" / "flag.json"
    real.write_text('{"speculative": true}\n')
    link = tmp_path / "etc" / "flag.json"
    link.symlink_to(Path("..") / "real" / "flag.json")
    write_atomically(link, '{"speculative": false}\n')
    assert link.is_symlink() and os.readlink(link) == str(Path("..") / "real" / "flag.json")
    assert real.read_text() == '{"speculative": false}\n'  # what the reader of the target sees
    assert (tmp_path / "real" / "flag.json.prev").read_text() == '{"speculative": true}\n'
    assert not (tmp_path / "etc" / "flag.json.prev").exists()
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["flag.json"]  # no temporary left


def test_a_chain_of_links_leads_to_the_last_file(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "middle.json").symlink_to(real)
    (tmp_path / "flag.json").symlink_to(tmp_path / "middle.json")
    write_atomically(tmp_path / "flag.json", "new")
    assert real.read_text() == "new" and (tmp_path / "middle.json").is_symlink()


def test_a_link_to_a_file_not_yet_there_creates_it(tmp_path: Path) -> None:
    (tmp_path / "flag.json").symlink_to(tmp_path / "target.json")
    write_atomically(tmp_path / "flag.json", "new")
    assert (tmp_path / "target.json").read_text() == "new" and (tmp_path / "flag.json").is_symlink()


@pytest.mark.parametrize("case", ["loop", "no directory"])
def test_a_link_that_leads_nowhere_is_an_error_and_nothing_is_replaced(tmp_path: Path, case: str) -> None:
    link = tmp_path / "flag.json"
    if case == "loop":
        (tmp_path / "other.json").symlink_to(link)
        link.symlink_to(tmp_path / "other.json")
    else:
        link.symlink_to(tmp_path / "missing" / "flag.json")
    with pytest.raises(OSError):
        write_atomically(link, "new")
    assert link.is_symlink()


def test_a_regular_file_is_replaced_with_its_previous_version_kept(tmp_path: Path) -> None:
    path = tmp_path / "flag.json"
    path.write_text("old")
    write_atomically(path, "new")
    assert path.read_text() == "new" and (tmp_path / "flag.json.prev").read_text() == "old"
