"""The bench's plan (prompts that fit the server's context, --num-prompts counted in all), its
progress line (done/total and the time left, on a fake clock), and the figures it takes from
vLLM's /metrics (what the rules compute over the same pages)."""

from __future__ import annotations

import io

import pytest

from specguard.playbook.bench import histograms
from specguard.playbook.bench.client import Result
from specguard.playbook.bench.plan import PlanError, plan, shares
from specguard.playbook.bench.progress import ProgressLine, duration_text
from specguard.playbook.bench.prompts import Prompt
from specguard.playbook.bench.stats import client_figures
from specguard.rules.signals import get_signal
from specguard.sources.windows import signal_over
from tests.pages import E2E, GENERATED, MODEL, SELF_DRAFT, add, observe

CHAT = [Prompt("chat", f"chat {i}") for i in range(4)]
LONG = [Prompt("long_context", f"long {i}") for i in range(3)]
TOKENS = {**{p.text: 20 for p in CHAT}, **{p.text: 1500 + i for i, p in enumerate(LONG)}}


def test_num_prompts_is_shared_among_the_classes_in_all() -> None:
    assert shares(40, 4) == [10, 10, 10, 10]
    assert shares(10, 4) == [3, 3, 2, 2]
    made = plan(CHAT + LONG, per_class=True, num_prompts=7, duration=None, max_tokens=64)
    assert [(p.klass, p.requests) for p in made.phases] == [("chat", 4), ("long_context", 3)]
    assert made.requests == 7
    one = plan(CHAT + LONG, per_class=False, num_prompts=7, duration=None, max_tokens=64)
    assert [(p.klass, p.requests, len(p.prompts)) for p in one.phases] == [("all", 7, 7)]


def test_without_a_count_each_prompt_goes_once_and_a_duration_has_no_count() -> None:
    once = plan(CHAT + LONG, per_class=True, num_prompts=None, duration=None, max_tokens=64)
    assert [p.requests for p in once.phases] == [4, 3] and once.requests == 7
    timed = plan(CHAT + LONG, per_class=True, num_prompts=None, duration=60.0, max_tokens=64)
    assert [p.requests for p in timed.phases] == [None, None] and timed.requests is None


def test_fewer_prompts_than_classes_is_refused_with_what_to_do() -> None:
    with pytest.raises(PlanError, match=r"--num-prompts 1 counts requests in all, and 2 classes run \(chat, "
                       r"long_context\): give at least 2, or fewer --classes"):  # fmt: skip
        plan(CHAT + LONG, per_class=True, num_prompts=1, duration=None, max_tokens=64)


def test_prompts_that_cannot_fit_are_left_out_with_one_line() -> None:
    made = plan(CHAT + LONG, per_class=True, num_prompts=8, duration=None, max_tokens=128,
                limit=1024, counts=TOKENS)  # fmt: skip
    assert [(p.klass, p.requests) for p in made.phases] == [("chat", 8)]  # all 8 go to what runs
    assert made.left_out == {"long_context": 3}
    assert made.notes == (
        "left out 3 prompt(s) that cannot fit max_model_len 1024 with their output (--max-tokens 128): "
        "long_context (all 3: not run)",
    )
    # a prompt's own max_tokens counts instead of --max-tokens; the limit is prompt + output
    mixed = [Prompt("chat", "chat 0", max_tokens=1004), Prompt("chat", "chat 1", max_tokens=1005)]
    made = plan(
        mixed, per_class=True, num_prompts=None, duration=None, max_tokens=8, limit=1024, counts=TOKENS
    )
    assert [p.text for p in made.phases[0].prompts] == ["chat 0"]
    assert made.notes[0].endswith("chat (1 of 2)")


def test_a_class_asked_for_by_name_that_cannot_run_stops_the_run() -> None:
    with pytest.raises(PlanError) as raised:
        plan(CHAT + LONG, per_class=True, num_prompts=None, duration=None, max_tokens=128, limit=1024,
             counts=TOKENS, named=("chat", "long_context"))  # fmt: skip
    assert str(raised.value) == (
        "class long_context cannot run: none of its 3 prompts fits max_model_len 1024 with --max-tokens 128 "
        "(the shortest has 1500 prompt tokens); serve a longer context (vLLM's --max-model-len), lower "
        "--max-tokens, or leave long_context out of --classes"
    )
    # named, and partly fitting: it runs with what fits
    made = plan(CHAT + LONG, per_class=True, num_prompts=None, duration=None, max_tokens=8, limit=1508,
                counts=TOKENS, named=("long_context",))  # fmt: skip
    assert [(p.klass, len(p.prompts)) for p in made.phases] == [("chat", 4), ("long_context", 1)]


def test_a_file_of_which_nothing_fits_is_refused() -> None:
    with pytest.raises(
        PlanError, match=r"no prompt of prompts.jsonl fits max_model_len 1024 with --max-tokens 128"
    ):
        plan(LONG, per_class=True, num_prompts=None, duration=None, max_tokens=128, limit=1024, counts=TOKENS,
             source="prompts.jsonl")  # fmt: skip


def test_without_a_known_context_or_counts_nothing_is_left_out() -> None:
    for limit, counts in ((None, TOKENS), (1024, None)):
        made = plan(CHAT + LONG, per_class=True, num_prompts=None, duration=None, max_tokens=128,
                    limit=limit, counts=counts)  # fmt: skip
        assert made.left_out == {} and made.notes == () and len(made.phases) == 2


# --- the progress line ----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answered(ok: bool = True) -> Result:
    return Result("chat", 0.0, ok=ok)


def test_the_progress_line_shows_done_of_total_and_the_time_left() -> None:
    out, clock = io.StringIO(), FakeClock()
    line = ProgressLine(out, show=True, clock=clock)
    line.planned(requests=40, seconds=None)
    assert line.left(0.0) is None  # nothing answered yet: no estimate
    clock.now += 10.0
    for ok in (True, True, True, False):
        line.update("chat", answered(ok))
    assert line.text("chat") == "[chat] 4/40 requests, 1 errors, 10s, ETA 1m30s"
    assert out.getvalue().startswith("\r[chat] 1/40 requests, 0 errors, 10s, ETA 6m30s")
    clock.now += 200.0
    assert line.text("code") == "[code] 4/40 requests, 1 errors, 3m30s, ETA 31m30s"


def test_a_run_for_a_duration_counts_down_its_planned_time() -> None:
    out, clock = io.StringIO(), FakeClock()
    line = ProgressLine(out, show=False, clock=clock)
    line.planned(requests=None, seconds=240.0)
    clock.now += 100.0
    line.update("chat", answered())
    assert line.text("chat") == "[chat] 1 requests, 0 errors, 1m40s, ETA 2m20s"
    assert out.getvalue() == ""  # not a terminal: no line


def test_notes_are_printed_whole_and_clear_the_line() -> None:
    out = io.StringIO()
    line = ProgressLine(out, show=True, clock=FakeClock())
    line.planned(requests=2, seconds=None)
    line.update("chat", answered())
    line.note("left out 3 prompt(s) ...")
    assert out.getvalue().endswith("\r" + " " * 79 + "\rspecguard bench: left out 3 prompt(s) ...\n")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (59.6, "1m00s"), (3599, "59m59s"), (7260, "2h01m")]
)
def test_durations_are_short(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


# --- the server's figures -------------------------------------------------------------------------


def page_after(observations: list[float], tokens: float) -> str:
    return observe(add(SELF_DRAFT, GENERATED, tokens), E2E, observations)


def test_the_histogram_figures_are_what_the_rules_compute_over_the_same_pages() -> None:
    before = histograms.reading(SELF_DRAFT, at=1000.0)
    after = histograms.reading(page_after([0.55, 0.56, 0.57, 0.58, 0.6], 320.0), at=1010.0)
    assert before is not None and after is not None
    figures = histograms.server_figures(MODEL, [(before, after)])
    samples = {"x": [(1000.0, before.snapshot), (1010.0, after.snapshot)]}
    for name in ("e2e_latency_p95", "e2e_latency_mean"):
        (series,) = signal_over(get_signal(name), samples, ("model_name",)).series
        assert figures[name] == series.value, name
    assert figures["e2e_latency_p95"] == pytest.approx(0.785)  # near the top of the 0.5-0.8 bucket
    assert figures["e2e_latency_mean"] == pytest.approx(0.572)  # exact
    assert figures["generation_throughput"] == pytest.approx(32.0)
    assert histograms.requests_counted(MODEL, (before, after)) == 5
    assert histograms.requests_counted("other-model", (before, after)) == 0


def test_phases_pool_as_one_window_of_all_their_requests() -> None:
    first = histograms.reading(SELF_DRAFT, at=0.0)
    mid = histograms.reading(page_after([0.4, 0.45], 100.0), at=10.0)
    # a warm-up between the phases: not counted
    resumed = histograms.reading(page_after([0.4, 0.45, 5.0, 5.0, 5.0], 400.0), at=30.0)
    last = histograms.reading(page_after([0.4, 0.45, 5.0, 5.0, 5.0, 0.9, 0.95], 500.0), at=60.0)
    assert first and mid and resumed and last
    pooled = histograms.server_figures(MODEL, [(first, mid), (resumed, last)])
    alone = histograms.reading(page_after([0.4, 0.45, 0.9, 0.95], 200.0), at=40.0)
    assert alone is not None
    together = histograms.server_figures(MODEL, [(first, alone)])
    for name in ("e2e_latency_p50", "e2e_latency_p95", "e2e_latency_mean"):
        assert pooled[name] == pytest.approx(together[name]), name
    assert pooled["generation_throughput"] == pytest.approx(200.0 / 40.0)  # tokens over the phases' time


def test_a_page_that_is_not_metrics_or_lacks_histograms_gives_no_figures() -> None:
    assert histograms.reading("<html>not metrics</html>\n") is None
    bare = histograms.reading("# TYPE up gauge\nup 1\n", at=0.0)
    assert bare is not None
    assert histograms.server_figures(MODEL, [(bare, bare)]) == {}
    assert histograms.requests_counted(MODEL, (bare, bare)) is None


def test_the_client_figures_pool_every_answered_request() -> None:
    def timed(e2e: float, ttft: float, tokens: int, gaps: list[float]) -> Result:
        return Result("chat", 0.0, ok=True, ttft=ttft, e2e=e2e, output_tokens=tokens, gaps=gaps,
                      gap_tokens=[1] * len(gaps))  # fmt: skip

    results = [timed(0.5, 0.1, 5, [0.1] * 4), timed(0.7, 0.1, 7, [0.1] * 6), Result("chat", 0.0, ok=False)]
    figures = client_figures(results, seconds=2.0)
    assert figures["e2e_latency_mean"] == pytest.approx(0.6)
    assert figures["tpot_mean"] == pytest.approx(0.1)
    assert figures["output_throughput"] == pytest.approx(6.0)
    assert client_figures([Result("chat", 0.0, ok=False)], seconds=2.0) == {}
