"""The drill's claim on the flag, in the action's memory under ``drill``: taken in one transaction,
so of two drills claiming at once the second finds it held; beside the controller's own record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from specguard.preflight.drill import claim
from specguard.store.database import opened


async def test_a_claim_is_taken_once_and_kept_apart_from_the_controllers_record(tmp_path: Path) -> None:
    async with opened(tmp_path / "specguard.db") as store:
        first, second = claim.DrillMemory(store, "fallback"), claim.DrillMemory(store, "fallback")
        assert await claim.claim(first, 1, 100.0) is None
        held = await claim.claim(second, 2, 100.0)
        assert held is not None and (held.drill, held.state, held.running) == (1, "unknown", True)
        assert await store.memory_read("fallback", "flag") is None  # the controller's: untouched
        assert (await store.memory_read("fallback", "drill"))["pid"] == os.getpid()

        await claim.release(first, "nothing changed")
        assert await claim.left_by_drill(first) is None
        assert await claim.claim(second, 2, 200.0) is None  # free again


async def test_a_claim_left_by_a_process_that_is_gone_is_told_apart(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    async with opened(tmp_path / "specguard.db") as store:
        memory = claim.DrillMemory(store, "fallback")
        await claim.claim(memory, 7, 100.0)
        await store.memory_update("fallback", "drill", lambda v: {**v, "pid": int(gone.stdout)})
        left = await claim.left_by_drill(memory)
        assert left is not None and (left.drill, left.running) == (7, False)
