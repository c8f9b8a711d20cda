"""The report's "Traffic by class" section: each routing class and pool's requests, share and the
latency the router saw, beside the acceptance of the pool the class went to. Shown only when
history holds the router's series (``report/traffic.py``)."""

from __future__ import annotations

from typing import Any

from specguard.report import values
from specguard.report.document import Block, Cell, Heading, Paragraph, Table
from specguard.report.model import Report

ACCEPTANCE_NOTE = (
    "Acceptance is a server-wide figure: vLLM counts drafts per server, not per request. It is shown "
    "for the pool each class went to (the pool's servers' accepted / draft tokens over the period), "
    "so two classes sent to one pool show the same acceptance."
)


def traffic_section(report: Report) -> list[Block]:
    traffic = report.get("traffic")
    if not isinstance(traffic, dict):
        return []
    classes = [c for c in traffic.get("classes") or [] if isinstance(c, dict)]
    pools = traffic["pools"] if isinstance(traffic.get("pools"), dict) else {}
    routers = ", ".join(values.text(r) for r in traffic.get("routers") or [])
    blocks: list[Block] = [
        Heading(2, "Traffic by class"),
        Paragraph(
            f"{values.count(traffic.get('requests'))} requests through the router ({routers}) in this "
            "period, by the traffic class they matched and the pool they went to. Latency is what the "
            "router saw, from the request's first byte to the response's last."
        ),
    ]
    rows = [
        [
            Cell(values.text(c.get("class"))),
            Cell(values.text(c.get("pool"))),
            Cell(values.count(c.get("requests"))),
            Cell(values.percent(values.as_number(c.get("share")))),
            Cell(values.value("seconds", c.get("latency_p50"))),
            Cell(values.value("seconds", c.get("latency_p95"))),
            Cell(_acceptance(c, pools.get(c.get("pool")))),
        ]
        for c in classes
    ]
    headers = ("Class", "Pool", "Requests", "Share", "Latency p50", "Latency p95", "Pool's acceptance")
    blocks.append(Table(headers, rows, align="llrrrrr"))
    blocks.append(Paragraph(ACCEPTANCE_NOTE))
    known = [
        f"{values.text(name)}: {', '.join(values.text(s) for s in pool.get('servers') or [])}"
        for name, pool in pools.items()
        if isinstance(pool, dict) and pool.get("known")
    ]
    if known:
        blocks.append(Paragraph(f"Pools' servers: {'; '.join(known)}."))
    malformed = traffic["malformed"] if isinstance(traffic.get("malformed"), dict) else {}
    if malformed:
        said = ", ".join(f"{values.text(reason)} {values.count(n)}" for reason, n in malformed.items())
        blocks.append(Paragraph(f"Bodies the router could not classify (sent to the default pool): {said}."))
    return blocks


def _acceptance(row: dict[str, Any], pool: Any) -> str:
    if not isinstance(pool, dict) or not pool.get("known"):
        return "servers unknown"
    rate = values.as_number(row.get("acceptance_rate"))
    return "no speculation" if rate is None else values.percent(rate)
