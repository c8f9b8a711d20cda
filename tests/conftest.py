"""Fixtures shared by every tier."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.ports import free_port


@pytest.fixture
def unused_tcp_port() -> int:
    """pytest-asyncio's fixture, with the port taken outside the ephemeral range (tests/ports.py)."""
    return free_port()


@pytest.fixture(scope="session")
def unused_tcp_port_factory() -> Callable[[], int]:
    return free_port
