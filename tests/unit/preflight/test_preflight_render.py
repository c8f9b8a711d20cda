"""What preflight prints: the table (each item, its evidence, its fix), the JSON, and the Markdown
record for a change ticket."""

from __future__ import annotations

import json

from specguard.preflight import render
from specguard.preflight.item import Answer, ItemResult, Status

HEADER = render.Header("gpu-7", 1_796_500_000.0, "/etc/specguard/specguard.yaml", "0.1.0", False)
RESULTS = [
    ItemResult(1, "baseline", "baseline measured and fresh",
               Answer(Status.PASS, ("http://10.0.0.7:8000: model llama, vLLM 0.32.0, k=3",
                                    "  the baseline entry for model llama: measured 2026-12-01 10:00 UTC"))),
    ItemResult(4, "acceptance", "acceptance on production traffic",
               Answer(Status.FAIL, ("10.0.0.7:8000 llama: acceptance 0.412 NOT over 0.55 (*all* traffic)",),
                      "specguard diagnose --since 7d")),
    ItemResult(10, "report", "weekly report scheduled and written", Answer(Status.UNKNOWN, ("no state database",))),
]  # fmt: skip


def test_the_table_gives_each_item_its_status_evidence_and_fix() -> None:
    text = render.table(HEADER, RESULTS, passed=False)
    lines = text.splitlines()
    assert lines[0] == "specguard preflight on gpu-7 at 2026-12-05T19:46:40Z (/etc/specguard/specguard.yaml)"
    assert lines[2].startswith(" 1. baseline measured and fresh") and lines[2].endswith("PASS")
    assert lines[3] == "      http://10.0.0.7:8000: model llama, vLLM 0.32.0, k=3"
    assert (
        lines[4] == "        the baseline entry for model llama: measured 2026-12-01 10:00 UTC"
    )  # about the line above
    assert lines[5].startswith(" 4. acceptance on production traffic") and lines[5].endswith("FAIL")
    assert "      fix: specguard diagnose --since 7d" in lines
    assert lines[8].startswith("10. weekly report") and lines[8].endswith("UNKNOWN")
    assert lines[-1] == "preflight FAILED: 1 pass, 1 fail, 1 unknown"


def test_unknown_allowed_is_said() -> None:
    header = render.Header("h", 0.0, "<defaults>", "0.1.0", True)
    passed = [RESULTS[0], RESULTS[2]]
    assert render.verdict(passed, True, True) == "preflight passed: 1 pass, 1 unknown (unknown allowed)"
    assert render.table(header, passed, True).endswith("(unknown allowed)\n")


def test_json_holds_every_item() -> None:
    found = json.loads(json.dumps(render.to_json(HEADER, RESULTS, passed=False)))
    assert found["host"] == "gpu-7" and found["time"] == "2026-12-05T19:46:40Z" and found["passed"] is False
    assert found["counts"] == {"pass": 1, "fail": 1, "unknown": 1}
    assert found["items"][1] == {
        "number": 4, "key": "acceptance", "title": "acceptance on production traffic", "status": "fail",
        "evidence": ["10.0.0.7:8000 llama: acceptance 0.412 NOT over 0.55 (*all* traffic)"],
        "fix": "specguard diagnose --since 7d",
    }  # fmt: skip


def test_the_markdown_record_names_host_time_config_and_each_item() -> None:
    text = render.markdown(HEADER, RESULTS, passed=False)
    assert text.startswith("# Preflight of speculative decoding on gpu-7\n")
    for line in ("- **Host:** gpu-7", "- **Time:** 2026-12-05T19:46:40Z",
                 "- **Config:** `/etc/specguard/specguard.yaml`", "- **specguard:** 0.1.0",
                 "- **Result:** preflight FAILED: 1 pass, 1 fail, 1 unknown",
                 "| 4 | acceptance on production traffic | **fail** |",
                 "## 4. acceptance on production traffic: fail",
                 # evidence is text: what Markdown would read as emphasis is escaped
                 r"- 10.0.0.7:8000 llama: acceptance 0.412 NOT over 0.55 (\*all\* traffic)",
                 "  - the baseline entry for model llama: measured 2026-12-01 10:00 UTC"):  # fmt: skip
        assert line in text.splitlines(), line
    assert "Fix:\n\n```\nspecguard diagnose --since 7d\n```\n" in text
    assert "Checked" not in text


def test_a_partial_run_says_which_items_it_checked() -> None:
    header = render.Header("h", 0.0, "c.yaml", "0.1.0", False, ("baseline", "report"))
    assert "- **Checked:** only baseline, report (--only)" in render.markdown(header, RESULTS, False)
    assert render.table(header, RESULTS, False).startswith(
        "specguard preflight on h at 1970-01-01T00:00:00Z (c.yaml, only baseline, report)"
    )
    assert render.to_json(header, RESULTS, False)["only"] == ["baseline", "report"]
