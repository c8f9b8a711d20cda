"""The webhook's pieces without a server: the payload as Alertmanager writes it, and the alert book
that alert rules read (newest state per alert, grouping, late copies)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from specguard.config.loading import LoadedRule
from specguard.daemon.alertmanager.book import AlertBook, Receipt
from specguard.daemon.alertmanager.payload import BadPayload, parse
from specguard.rules.schema import Rule
from tests.am_payloads import alert, message

LOW = {"alertname": "AcceptanceLow", "instance": "a:8000", "model_name": "m", "severity": "warning"}


def body(data: Any) -> bytes:
    return json.dumps(data).encode()


def test_a_firing_alerts_zero_ends_at_is_unset_and_nanoseconds_parse() -> None:
    parsed = parse(body(message(alert(LOW, starts_at="2026-08-20T10:00:00.123456789Z"))))
    (first,) = parsed.alerts
    assert first.ends_at is None  # "0001-01-01T00:00:00Z" is Go's zero time, not a moment
    assert first.starts_at == datetime(2026, 8, 20, 10, 0, 0, 123456, tzinfo=UTC)
    assert first.starts == "2026-08-20T10:00:00.123456+00:00"
    resolved = parse(body(message(alert(LOW, status="resolved", ends_at="2026-08-20T10:05:00Z"))))
    assert resolved.alerts[0].ends_at == datetime(2026, 8, 20, 10, 5, tzinfo=UTC)


def test_fields_added_by_newer_alertmanagers_are_ignored() -> None:
    data = message(alert(LOW, someday="x"), notification_reason="repeat", routeLabels={"team": "ml"})
    assert parse(body(data)).alerts[0].labels == LOW


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"version": "3"}, "version '3' is not supported"),
        ({"truncatedAlerts": -1}, "truncatedAlerts: Input should be greater than or equal to 0"),
        ({"alerts": {}}, "alerts: Input should be a valid list"),
        ({"status": "pending"}, "status: Input should be 'firing' or 'resolved'"),
    ],
)
def test_a_message_that_is_not_version_4_says_why(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(BadPayload, match=reason):
        parse(body({**message(alert(LOW)), **change}))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            {"startsAt": "2026-08-20T10:00:00"},
            "alerts.0.startsAt: Value error, a timestamp needs its time zone",
        ),
        ({"labels": {"a": 1}}, "alerts.0.labels.a: Input should be a valid string"),
        ({"fingerprint": ""}, "alerts.0.fingerprint: String should have at least 1 character"),
    ],
)
def test_a_bad_alert_names_its_field(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(BadPayload) as caught:
        parse(body(message({**alert(LOW), **change})))
    assert reason.replace("Value error, ", "") in str(caught.value)


def test_many_problems_are_summed_up() -> None:
    with pytest.raises(BadPayload, match=r"\(and \d+ more\)"):
        parse(b'{"alerts": [{}, {}]}')


def receipt(
    n: int, labels: dict[str, str], status: str = "firing", starts_at: str = "2026-12-03T10:00:00+00:00"
) -> Receipt:
    return Receipt(
        n, n, "fp-" + ",".join(sorted(labels.values())), status, starts_at, None, labels, {}, 100.0 + n
    )


def rule(**fields: Any) -> LoadedRule:
    return LoadedRule(
        Rule.model_validate({"name": "am", "alert": {"match": {"alertname": "AcceptanceLow"}}, **fields}),
        "r.yaml",
        1,
    )


def test_a_late_copy_of_a_firing_state_does_not_undo_its_resolution() -> None:
    book = AlertBook()
    assert book.update(receipt(1, LOW))
    assert book.update(receipt(2, LOW, "resolved"))
    assert not book.update(receipt(3, LOW, "firing"))  # same startsAt: the older state
    assert book.query(rule(group_by=["instance"])).series[0].value == 0
    assert book.update(receipt(4, LOW, "firing", starts_at="2026-12-03T11:00:00+00:00"))  # a new episode
    assert book.query(rule(group_by=["instance"])).series[0].value == 1


def test_series_are_the_group_by_labels_and_count_firing_alerts() -> None:
    book = AlertBook()
    book.update(receipt(1, LOW))
    book.update(receipt(2, {**LOW, "model_name": "other"}))
    book.update(receipt(3, {**LOW, "instance": "b:8000"}, "resolved"))
    book.update(receipt(4, {"alertname": "DiskFull", "instance": "a:8000"}))
    by_instance = {s.labels["instance"]: s.value for s in book.query(rule(group_by=["instance"])).series}
    assert by_instance == {"a:8000": 2, "b:8000": 0}
    whole = book.query(rule()).series  # by default, one series per alert with all its labels
    assert sorted(s.value for s in whole) == [0, 1, 1]
    assert {"alertname", "instance", "model_name", "severity"} == set(whole[0].labels)
    assert [s.value for s in book.query(rule(group_by=[])).series] == [2]


def test_alert_matchers_use_prometheus_operators() -> None:
    book = AlertBook()
    book.update(receipt(1, LOW))
    book.update(receipt(2, {**LOW, "severity": "info", "instance": "c:1"}))
    chosen = LoadedRule(
        Rule.model_validate(
            {
                "name": "am",
                "alert": {"match": {"alertname": {"=~": "Acceptance.*"}, "severity": {"!=": "info"}}},
                "group_by": ["instance"],
            }
        ),
        "r.yaml",
        1,
    )
    assert [dict(s.labels) for s in book.query(chosen).series] == [{"instance": "a:8000"}]


def test_resolved_alerts_are_forgotten_after_the_retention() -> None:
    book = AlertBook(resolved_retention=60)
    book.update(receipt(1, LOW, "resolved"))
    book.update(receipt(2, {**LOW, "instance": "b"}))
    assert book.prune(now=150.0) == 0
    assert book.prune(now=162.0) == 1  # received at 101
    assert book.counts() == {"firing": 1, "resolved": 0}


def test_an_alert_rules_event_says_how_many_alerts_fire_and_which() -> None:
    from specguard.dispatch import describe
    from specguard.store.records import Event, State

    event = Event(
        "am", "k", {"instance": "a:8000"}, State.FIRING, State.PENDING, 1.0, 2.0, 0.0, "alertmanager: x"
    )
    summary, _ = describe(rule(), event)
    assert summary == '2 Alertmanager alert(s) {alertname="AcceptanceLow"} firing on instance=a:8000'


@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_deeply_nested_json_is_a_bad_payload_not_a_crash(depth: int) -> None:
    with pytest.raises(BadPayload, match="the body is nested too deeply"):
        parse(b'{"alerts": ' + b"[" * depth + b"]" * depth + b"}")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"alerts": [], "n": 1' + b"1" * 5000 + b"}", "not usable JSON"),
        (json.dumps(message(alert({"alertname": "\ud800"}))).encode(), "not valid Unicode"),
        (json.dumps({**message(alert(LOW)), "groupKey": "\udfff"}).encode(), "not valid Unicode"),
        (
            json.dumps(message(alert(LOW, starts_at="0001-01-01T00:00:00+14:00"))).encode(),
            "out of range in UTC",
        ),
        (json.dumps({**message(alert(LOW)), "truncatedAlerts": 2**63}).encode(), "truncatedAlerts"),
    ],
)
def test_bodies_the_store_could_not_hold_are_bad_payloads(data: bytes, reason: str) -> None:
    # found by the fuzz test: each was a 500, and a lone surrogate in a label broke its rule for good
    with pytest.raises(BadPayload, match=reason):
        parse(data)


def test_an_alert_rule_evaluates_only_the_series_that_can_change() -> None:
    from specguard.daemon.evaluation import evaluate_alert_rule
    from specguard.engine.states import series_key
    from specguard.store.records import SeriesState, State

    item = rule(group_by=["instance"], keep_firing_for="1m", forget_after="10m")
    book = AlertBook()
    a, b, c, d = ({**LOW, "instance": name} for name in "abcd")
    for n, labels in enumerate((a, b, c, d), 1):
        book.update(receipt(n, labels))
    key = {name: series_key({"instance": name}) for name in "abcdef"}

    # a delivery about `a` evaluates `a` alone, however many series the rule has
    first = evaluate_alert_rule(item, book, {}, 1000.0, 15.0, "alertmanager: x", touched=[receipt(1, a)])
    assert set(first.states) == {key["a"]}
    assert first.states[key["a"]].state is State.FIRING

    fired = {
        k: SeriesState(labels={"instance": n}, state=State.FIRING, since=1000.0, last_eval=1000.0)
        for n, k in key.items()
        if n != "e"
    }
    book.update(receipt(5, b, "resolved"))  # b: firing, its alert resolved: keep_firing_for runs
    pending = SeriesState(labels={"instance": "c"}, state=State.PENDING, since=1000.0, breach_since=1000.0)
    gone = SeriesState(
        labels={"instance": "e"}, state=State.RESOLVED, since=1.0, last_seen=1.0
    )  # no alerts left
    previous = {**fired, key["c"]: pending, key["e"]: gone}
    del previous[key["d"]]  # d: alerts known, series not yet (a rule added by a reload)
    book.update(receipt(6, {**LOW, "instance": "f"}))  # its evaluation was never stored
    previous[key["f"]] = SeriesState(labels={"instance": "f"}, state=State.RESOLVED, since=1.0)
    later = evaluate_alert_rule(item, book, previous, 1100.0, 15.0)
    assert later.states[key["f"]].state is State.FIRING  # the schedule catches up
    # a fires on a firing alert: nothing can change it with time, it is left alone
    assert key["a"] not in later.states
    assert later.states[key["b"]].ok_since == 1100.0  # keep_firing_for started
    assert key["c"] in later.states and key["d"] in later.states
    assert later.forgotten == [key["e"]]  # absent for longer than forget_after
    assert all(event.trigger == "schedule" for event in later.events)


def test_a_rule_index_follows_alerts_that_arrive_resolve_and_are_pruned() -> None:
    book = AlertBook(resolved_retention=60)
    item = rule(group_by=["instance"])
    assert book.keys(item) == set()  # built (empty) on first use, kept up to date from then on
    book.update(receipt(1, LOW))
    book.update(receipt(2, {**LOW, "model_name": "other"}))  # same instance: same series
    assert [s.value for s in book.query(item).series] == [2]
    book.update(receipt(3, LOW, "resolved"))
    assert [s.value for s in book.query(item).series] == [1]
    book.update(receipt(4, {**LOW, "model_name": "other"}, "resolved"))
    assert book.prune(now=200.0) == 2
    assert book.keys(item) == set() and book.query(item).series == ()


async def test_the_store_gives_back_each_alerts_newest_state_and_prunes_the_rest(tmp_path: Any) -> None:
    from specguard.daemon.alertmanager.inbox import Inbox
    from specguard.store.database import Store

    store = Store(tmp_path / "specguard.db")
    await store.open()
    inbox = Inbox(store)
    try:
        late = "2026-12-03T11:00:00Z"
        for sent in (
            message(alert(LOW)),
            message(alert(LOW, status="resolved")),
            message(alert(LOW, starts_at=late)),  # a new episode
            message(alert(LOW)),  # a late copy of the first episode: already known
            message(alert({**LOW, "instance": "b"}, status="resolved")),
        ):
            await inbox.put(parse(json.dumps(sent).encode()), 100.0)
        newest = {(r.labels["instance"], r.status, r.starts_at[:13]) for r in await inbox.known()}
        assert newest == {("a:8000", "firing", "2026-12-03T11"), ("b", "resolved", "2026-12-03T10")}
        assert await inbox.prune(before=200.0) == 2  # the first episode's firing and resolved states
        assert {(r.labels["instance"], r.status) for r in await inbox.known()} == {
            ("a:8000", "firing"),
            ("b", "resolved"),
        }
    finally:
        await store.close()
