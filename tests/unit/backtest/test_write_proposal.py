"""``--write``: the proposal is the rules file as it was, with ``phi:`` set in the detector's
``detect:`` (inserted at its keys' indentation, or replacing the one there), comments and the other
rules untouched, and the result loads as a rules file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from specguard.backtest.calibrate import write
from specguard.config.loading import load

RULES = """\
rules:
  - name: other
    signal: acceptance_rate
    condition: "< 0.4"   # keep me
  - name: detector
    signal: token_acceptance
    interval: 5s
    detect:
        in_control: learn   # learned
        drop: [0.12, 0.3]
    no_data: keep
"""


def _run(**phis: float | None) -> SimpleNamespace:
    rules = [SimpleNamespace(name=name, calibration={"proposed_phi": phi}) for name, phi in phis.items()]
    return SimpleNamespace(rules=rules, start=1796083200.0, end=1796688000.0)


def test_a_phi_is_inserted_at_the_indentation_of_its_detect_keys(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    said = write(_run(other=None, detector=42.5), rules, tmp_path / "proposed.yaml")  # type: ignore[arg-type]
    assert said.startswith(f"specguard backtest: wrote {tmp_path / 'proposed.yaml'} (detector phi 42.5)")
    text = (tmp_path / "proposed.yaml").read_text()
    assert (
        text.splitlines()[8]
        == "        phi: 42.5  # proposed by specguard backtest (2026-12-01 00:00 to 2026-12-08 00:00 UTC)"
    )
    assert text.replace(text.splitlines()[8] + "\n", "") == RULES
    loaded = load(None, [str(tmp_path / "proposed.yaml")])
    assert loaded.ok, loaded.problems
    detector = next(r for r in loaded.rules if r.name == "detector")
    assert detector.rule.detect is not None and detector.rule.detect.phi == 42.5


def test_a_phi_already_there_is_replaced(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        RULES.replace("        drop: [0.12, 0.3]\n", "        drop: [0.12, 0.3]\n        phi: 3   # old\n")
    )
    write(_run(detector=7.0), rules, tmp_path / "proposed.yaml")  # type: ignore[arg-type]
    lines = (tmp_path / "proposed.yaml").read_text().splitlines()
    assert [line.split("#")[0].rstrip() for line in lines if "phi:" in line] == ["        phi: 7"]
    assert len(lines) == len(rules.read_text().splitlines())
