"""Incidents: the file an operator writes (every mistake named by line and field), and how firings
are scored against it: caught, missed, false alarms and the delays."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.backtest.incidents import Episode, Incident, load, score
from specguard.common.yamlfile import FileProblems

T0 = 1_796_000_000.0


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "incidents.yaml"
    path.write_text(text)
    return path


def test_an_incidents_file_is_read_with_its_times_series_and_rules(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
incidents:
  - start: 2026-12-01T14:00:00Z
    end: 2026-12-01T15:30:00+00:00
    match: {instance: "vllm-a:8000"}
    rules: ["acceptance_*"]
    note: draft v2
  - start: 2026-12-03T13:00:00+01:00
    end: 2026-12-03T14:00:00+01:00
""",
    )
    first, second = load(path)
    assert (first.start, first.end) == (1796133600.0, 1796139000.0)
    assert dict(first.match) == {"instance": "vllm-a:8000"} and first.rules == ("acceptance_*",)
    assert first.note == "draft v2" and first.origin == "file"
    assert second.start == 1796299200.0 and second.match == {} and second.rules == ()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("incidents:\n  - start: 2026-12-01T14:00:00Z\n    end: 2026-12-01T13:00:00Z\n",
         "incidents.yaml:2: incidents[0]: end must come after start"),
        ("incidents:\n  - start: 2026-12-01T14:00:00\n    end: 2026-12-01T15:00:00Z\n",
         "incidents.yaml:2: incidents[0].start: Input should have timezone info"),
        ("incidents:\n  - start: yesterday\n    end: 2026-12-01T15:00:00Z\n",
         "incidents.yaml:2: incidents[0].start: Input should be a valid datetime"),
        ("incidents:\n  - start: 2026-12-01T14:00:00Z\n    end: 2026-12-01T15:00:00Z\n    severity: high\n",
         "incidents.yaml:4: incidents[0].severity: unknown key"),
        ("incidents:\n  - start: 2026-12-01T14:00:00Z\n    end: 2026-12-01T15:00:00Z\n    match: [a]\n",
         "incidents.yaml:4: incidents[0].match: Input should be a valid dictionary"),
        ("- start: 2026-12-01T14:00:00Z\n", "incidents.yaml:1: an incidents file is a mapping with an `incidents:` list"),
        ("incidents: [\n", "incidents.yaml:2: invalid YAML"),
    ],
)  # fmt: skip
def test_a_bad_incidents_file_is_refused_naming_the_line_and_field(
    tmp_path: Path, text: str, said: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(FileProblems) as refused:
        load(path)
    shown = [str(p).replace(f"{tmp_path}/", "") for p in refused.value.problems]
    assert any(line.startswith(said) for line in shown), shown


def test_a_missing_incidents_file_is_said_not_raised_as_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(FileProblems) as refused:
        load(tmp_path / "nowhere.yaml")
    assert "cannot read file" in str(refused.value.problems[0])


def _episode(instance: str, fired: float, resolved: float | None, action: float | None = None) -> Episode:
    return Episode("r", "{}", {"instance": instance}, None, fired, resolved, action)


def test_firings_are_scored_caught_missed_and_false_alarms_with_their_delays() -> None:
    incidents = [
        Incident(T0, T0 + 3600, {"instance": "a"}, (), "collapse on a"),
        Incident(T0 + 7200, T0 + 7800, {"instance": "b"}, (), "b's first"),
        Incident(T0 + 9000, T0 + 9600, {}, ("other_rule",), "not this rule's"),
    ]
    episodes = [
        _episode("a", T0 + 120, T0 + 3000, action=T0 + 150),  # catches the first, 2 min in
        _episode("a", T0 + 20000, T0 + 20600),  # nothing happened then: a false alarm
        _episode("b", T0 + 100, T0 + 200),  # b's series before b's incident: false
    ]
    got = score("r", episodes, incidents, T0 + 86400)
    assert (got.incidents, got.caught) == (2, 1)
    assert [i.note for i in got.missed] == ["b's first"]
    assert [e.fired for e in got.false_alarms] == [T0 + 20000, T0 + 100]
    assert got.delays == [{"incident": 0, "start": T0, "to_firing": 120.0, "to_action": 150.0}]


def test_a_firing_that_began_before_the_incident_catches_it_with_no_delay() -> None:
    incident = Incident(T0 + 600, T0 + 1200, {"instance": "a"})
    still = _episode("a", T0, None)  # firing since before, and at the period's end
    got = score("r", [still], [incident], T0 + 3600)
    assert (got.caught, got.false_alarms) == (1, [])
    assert got.delays[0]["to_firing"] == 0.0 and got.delays[0]["to_action"] is None


def test_a_label_the_rule_sums_over_does_not_count_against_the_match() -> None:
    incident = Incident(T0, T0 + 600, {"instance": "a", "engine": "0"})
    fleet_wide = Episode("r", "{}", {"model_name": "m"}, None, T0 + 60, T0 + 300)  # grouped by model only
    other = _episode("b", T0 + 60, T0 + 300)
    assert incident.concerns("r", fleet_wide.labels) and not incident.concerns("r", other.labels)
    got = score("r", [fleet_wide, other], [incident], T0 + 3600)
    assert got.caught == 1 and [e.labels for e in got.false_alarms] == [{"instance": "b"}]
