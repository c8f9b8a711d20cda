"""`specguard tune` over several concurrency levels: the prediction (p_i and c from the runs at
the first level, Leviathan's (1 + Σ p_i) / (1 + k c), which leaves out the batch's cost of
verifying) is shown at that level only, and said to be."""

from __future__ import annotations

from specguard.playbook.tune.measure import Figures, Run
from specguard.playbook.tune.predict import predict
from specguard.playbook.tune.table import plain_text
from specguard.playbook.tune.verdict import Verdict, decide


def run(k: int, concurrency: int, tpot: float) -> Run:
    positions = [0.9, 0.72, 0.43][:k]
    figures = Figures(10, 10, (None, None), (None, None), (None, None), None, tpot, None,
                      per_position=positions, drafts=100.0 if k else 0.0)  # fmt: skip
    return Run(k, concurrency, {"chat": figures}, "0.32.0", k, {})


def verdict() -> Verdict:
    # at 2 running k = 3 is fastest; at 8 the batch's verification makes k = 1 fastest
    runs = {1: {2: run(1, 2, 0.0058), 8: run(1, 8, 0.0089)}, 3: {2: run(3, 2, 0.0043), 8: run(3, 8, 0.0115)}}
    reference = {2: run(0, 2, 0.0101), 8: run(0, 8, 0.0107)}
    predictions = predict(runs[3][2], {"*": 0.1}, "--draft-cost", 4)
    return decide(Verdict((1, 3), (2, 8), runs, reference, predictions))


def test_the_prediction_is_shown_at_the_level_it_was_made_at_only() -> None:
    made = verdict()
    assert made.best == {2: 3, 8: 1} and made.schedule == [[1, 4, 3], [5, 8, 1]]
    assert made.predicted(3, "chat") == made.predicted(3, "chat", 2) is not None
    assert made.predicted(3, "chat", 8) is None and made.predicted(1, "chat", 8) is None
    text = plain_text(made)
    low, high = text.split("concurrency 8\n")
    rows = {line.split()[1]: line.split()[-2:] for line in high.splitlines() if line.startswith("chat ")}
    assert rows == {"off": ["1.00x", "-"], "1": ["1.20x", "-"], "3": ["0.93x", "-"]}, text
    assert "  PREDICTED: at concurrency 2 only, where p_i and c were measured\n" in high
    rows = {line.split()[1]: line.split()[-1] for line in low.splitlines() if line.startswith("chat ")}
    assert rows == {"off": "1.00x", "1": "1.73x", "3": "2.35x"}, text  # (1 + 0.9) / 1.1, 3.05 / 1.3
    assert "PREDICTED: at" not in low
    assert "\npredicted, chat (p_i measured at k = 3, concurrency 2):\n" in text


def test_one_level_says_its_prediction_as_before() -> None:
    made = verdict()
    one = decide(Verdict((1, 3), (2,), {k: {2: by[2]} for k, by in made.runs.items()}, {2: made.reference[2]},
                         made.predictions))  # fmt: skip
    text = plain_text(one)
    assert "\npredicted, chat (p_i measured at k = 3):\n" in text and "PREDICTED: at" not in text
