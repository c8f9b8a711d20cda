"""The checklist's runner: items in order, each within its time limit; an item that raises, runs
out of time or answers something else is unknown with what happened, and the others still run."""

from __future__ import annotations

from pathlib import Path

from specguard.cli.preflight import KEYS
from specguard.preflight import run as runner
from specguard.preflight.item import ItemResult, Status
from specguard.preflight.items import ITEMS
from tests.unit.preflight.fakes import answering, context, item, raising, sleeping


def test_the_command_line_names_the_items_in_the_checklist_order() -> None:
    assert KEYS == runner.keys() == tuple(module.KEY for module in ITEMS)
    assert [module.NUMBER for module in ITEMS] == list(range(1, 12))


async def test_items_run_in_order_and_a_failing_one_is_unknown_with_its_error(tmp_path: Path) -> None:
    items = [
        item(1, "one", answering(Status.PASS, "read it")),
        item(2, "two", raising),
        item(3, "three", answering(Status.FAIL, "found it", fix="specguard fix-it")),
    ]
    results = await runner.run(context(tmp_path), items=items)
    assert [(r.number, r.key, r.answer.status) for r in results] == [
        (1, "one", Status.PASS), (2, "two", Status.UNKNOWN), (3, "three", Status.FAIL),
    ]  # fmt: skip
    assert results[1].answer.evidence == ("the check failed: RuntimeError: the flag API said 500",)
    assert results[2].answer.fix == "specguard fix-it"


async def test_an_item_over_its_time_limit_is_unknown(tmp_path: Path) -> None:
    results = await runner.run(context(tmp_path), items=[item(1, "slow", sleeping, timeout=0.05)])
    assert results[0].answer.status is Status.UNKNOWN
    assert results[0].answer.evidence == ("not finished within 0.05 s: not checked",)


async def test_an_item_that_answers_no_answer_is_unknown(tmp_path: Path) -> None:
    async def wrong(ctx: object) -> object:
        return "pass"

    (result,) = await runner.run(context(tmp_path), items=[item(1, "odd", wrong)])
    assert result.answer.status is Status.UNKNOWN
    assert result.answer.evidence == ("the check failed: TypeError: the item answered str, not an Answer",)


async def test_only_runs_the_items_named_in_the_checklist_order(tmp_path: Path) -> None:
    items = [item(n, key, answering(Status.PASS)) for n, key in enumerate(("a", "b", "c"), 1)]
    results = await runner.run(context(tmp_path), ("c", "a"), items=items)
    assert [r.key for r in results] == ["a", "c"]


def test_the_checklist_passes_only_when_every_item_passes_or_unknown_is_allowed() -> None:
    def results(*statuses: Status) -> list[ItemResult]:
        from specguard.preflight.item import Answer

        return [ItemResult(n, f"k{n}", "t", Answer(s, ())) for n, s in enumerate(statuses, 1)]

    assert runner.passed(results(Status.PASS, Status.PASS), allow_unknown=False)
    assert not runner.passed(results(Status.PASS, Status.UNKNOWN), allow_unknown=False)
    assert runner.passed(results(Status.PASS, Status.UNKNOWN), allow_unknown=True)
    assert not runner.passed(results(Status.FAIL, Status.UNKNOWN), allow_unknown=True)
