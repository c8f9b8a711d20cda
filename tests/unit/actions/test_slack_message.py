"""Slack messages stay within Slack's limits, whatever a rule's labels and annotations hold."""

from __future__ import annotations

from specguard.actions.slack import message


def incident(**extra: object) -> dict[str, object]:
    return {
        "rule": "r" * 300,
        "severity": "critical",
        "host": "h",
        "labels": {f"label_{i}": "v" * 3000 for i in range(20)},
        "value": 0.2,
        "threshold": 0.4,
        "summary": "<b>" + "s" * 10_000,
        "fired_at": 1_800_000_000.0,
        "annotations": {"runbook_url": "javascript:alert(1)", "dashboard_url": "https://d.example/x"},
        "actions": [{"name": "fallback", "detail": "d" * 5000, "at": 1_800_000_041.0}] * 5,
        **extra,
    }


def test_every_part_is_cut_to_its_limit() -> None:
    text, blocks = message.notice(incident())
    assert len(text) <= message.TEXT_MAX and len(blocks) <= message.BLOCKS_MAX
    header = blocks[0]["text"]["text"]
    assert len(header) <= message.HEADER_MAX and header.endswith("…")
    for block in blocks[1:]:
        if "text" in block:
            assert len(block["text"]["text"]) <= message.SECTION_MAX
        fields = block.get("fields", [])
        assert len(fields) <= message.FIELDS_MAX
        assert all(len(f["text"]) <= message.FIELD_MAX for f in fields)
    summary = blocks[1]["text"]["text"]
    assert "&lt;b&gt;" in summary and "<b>" not in summary  # mrkdwn escaped
    links = blocks[-1]["elements"][0]["text"]
    assert links == "<https://d.example/x|Dashboard>"  # only http(s) links are shown
    assert "(41 s after firing)" in blocks[3]["text"]["text"]


def test_a_resolved_incident_says_when_and_after_how_long() -> None:
    _, blocks = message.notice(incident(rule="acceptance_low"), {"at": 1_800_000_000.0 + 3725, "value": 0.7})
    assert blocks[0]["text"]["text"] == "RESOLVED · CRITICAL · acceptance_low"
    fields = [f["text"] for f in blocks[2]["fields"]]
    assert any(f.startswith("*Resolved at*") and f.endswith("after 1 h 2 min") for f in fields), fields


def test_the_resolution_reply_says_what_resolved_it() -> None:
    at = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    assert message.resolution(at, 0.7234, 0.4) == "Resolved at 08:00:00 UTC: value 0.7234, threshold 0.4"
    # resolved on no data (traffic moved away): said so, not "acceptance - below 0.4"
    assert message.resolution(at, None, 0.4) == (
        "Resolved at 08:00:00 UTC: no data to judge (the rule resolves on no data)"
    )


def test_the_resolution_reply_says_the_rules_words_for_the_resolution() -> None:
    at = 1_800_000_000.0
    said = "Acceptance 0.72 on vllm-a:8000: back at or above 0.4"
    assert message.resolution(at, 0.72, 0.4, said) == f"Resolved at 08:00:00 UTC: {said}"


def test_a_resolved_incident_leads_with_the_resolutions_words_not_the_firings() -> None:
    fired = "Acceptance 0.31 below 0.4 for 3 evaluations in a row on vllm-a:8000"
    back = "Acceptance 0.72 on vllm-a:8000: back at or above 0.4"
    text, blocks = message.notice(
        incident(rule="acceptance_fallback", summary=fired, labels={"instance": "vllm-a:8000"}),
        {"at": 1_800_000_060.0, "value": 0.72, "summary": back},
    )
    assert text == f"[RESOLVED] CRITICAL acceptance_fallback on instance=vllm-a:8000: {back}"
    lead = blocks[1]["text"]["text"]
    assert lead.startswith(f":white_check_mark: {back}\n")  # the firing's words follow, as such
    assert lead.endswith(f"Fired: {fired}")
    # still firing: the firing's words alone
    text, blocks = message.notice(incident(rule="acceptance_fallback", summary=fired, labels={}))
    assert text.endswith(f": {fired}") and "Fired:" not in blocks[1]["text"]["text"]


def test_the_message_says_since_when_and_how_long_after_the_drop_each_action_came() -> None:
    fired = 1_800_000_000.0  # 08:00:00 UTC; the breach began 30 s before
    _, blocks = message.notice(
        incident(rule="acceptance_fallback", fired_at=fired, since=fired - 30,
                 actions=[{"name": "fallback", "detail": "ok: fallback engaged", "at": fired + 11}])
    )  # fmt: skip
    fields = [f["text"] for f in blocks[2]["fields"]]
    assert "*Breaching since*\n07:59:30 UTC (fired 30 s later)" in fields, fields
    assert not any(f.startswith("*Fired at*") for f in fields)
    assert (
        "• *fallback* at 08:00:11 UTC (41 s after the breach began): ok: fallback engaged"
        in blocks[3]["text"]["text"]
    )
