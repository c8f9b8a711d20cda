"""What a feature flag should be, decided from the eligible firing series, the drains that hold it
and what was last confirmed: the fallback controller's pure part, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from specguard.actions.feature_flag import empty
from specguard.dispatch.fallback import Firing, decide
from specguard.dispatch.guards import Later

NOW = 1_000.0
QUIET = 60.0


def firing(rule: str = "low", instance: str = "a", silenced: bool = False) -> Firing:
    silence = Later("silenced: by silence 1 until ...", NOW + 600) if silenced else None
    return Firing(rule, f'{{"instance":"{instance}"}}', {"instance": instance}, 1, silence)


def record(state: str = "restored", **fields: Any) -> dict[str, Any]:
    return {**empty(), "state": state, **fields}


@pytest.mark.parametrize("state", ["restored", "engaged", "unknown"])
def test_an_eligible_unsilenced_series_that_fires_wants_the_flag_engaged(state: str) -> None:
    desire = decide([firing(), firing("low", "b", silenced=True)], [], record(state), QUIET, NOW)
    assert desire.want == "engaged" and desire.rule_held
    assert desire.holders == ('low{instance="a"}', 'low{instance="b"}')
    assert desire.why.startswith("held by low{instance=")


def test_a_silenced_series_starts_nothing_but_keeps_a_flag_specguard_may_have_engaged() -> None:
    assert decide([firing(silenced=True)], [], record("restored"), QUIET, NOW).want == "alone"
    for state in ("engaged", "unknown"):
        kept = decide([firing(silenced=True)], [], record(state), QUIET, NOW)
        assert kept.want == "engaged" and kept.why.startswith("kept: ")


def test_the_restore_waits_the_quiet_period_from_when_the_last_holder_stopped() -> None:
    first = decide([], [], record("engaged", rule_held=True), QUIET, NOW)
    assert (first.want, first.hold_end, first.restore_at) == ("restored", NOW, NOW + QUIET)
    later = decide([], [], record("engaged", rule_held=True, hold_end=NOW - 10), QUIET, NOW + 5)
    assert (later.hold_end, later.restore_at) == (NOW - 10, NOW - 10 + QUIET)  # not moved by looking again
    assert later.rule_held  # a rule held it: the restore needs the canary


def test_a_flag_only_a_drain_held_is_restored_at_once_and_without_the_canary() -> None:
    held = decide([], ["shrink (k 5 -> 3 under way)"], record("engaged"), QUIET, NOW)
    assert held.want == "engaged" and held.holders == ("shrink (k 5 -> 3 under way)",) and not held.rule_held
    over = decide([], [], record("engaged"), QUIET, NOW)
    assert (over.want, over.restore_at, over.rule_held) == ("restored", NOW, False)


def test_a_flag_specguard_did_not_engage_is_left_alone_when_nothing_fires() -> None:
    assert decide([], [], record("restored"), QUIET, NOW).want == "alone"
    unknown = decide([], [], record("unknown"), QUIET, NOW)  # a write whose outcome is not known
    assert unknown.want == "restored"
