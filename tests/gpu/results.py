"""The GPU suite's results: one JSON line per test written as pytest runs (so a run cut short keeps what it had),
read back into a results file and a short table.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RESULTS_ENV = "NBHW_GPU_RESULTS"
OUTCOMES = ("passed", "failed", "error", "skipped")
MESSAGE_WIDTH = 90


@dataclass
class TestResult:
    """One test: its outcome, time, why (skip reason or failure), and the figures it recorded."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    nodeid: str
    outcome: str
    seconds: float
    message: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """'test_detect.py::test_x' without the folder."""
        return self.nodeid.rsplit("/", 1)[-1]


def _message(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    text = str(getattr(report, "longreprtext", "") or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


def from_report(report: Any) -> TestResult | None:
    """The result a pytest TestReport stands for, or None for phases that say nothing new (a passed setup)."""
    if report.when == "call":
        outcome = report.outcome
    elif report.skipped:
        outcome = "skipped"
    elif report.failed:
        outcome = "error"  # a fixture failed in setup or teardown
    else:
        return None
    message = "" if outcome == "passed" else _message(report)
    figures = {str(k): v for k, v in report.user_properties}
    return TestResult(report.nodeid, outcome, round(float(report.duration), 2), message, figures)


def record(report: Any) -> None:
    """The pytest_runtest_logreport hook's body: add this report's result to $NBHW_GPU_RESULTS, if set."""
    path = os.environ.get(RESULTS_ENV)
    found = from_report(report) if path else None
    if path and found is not None:
        append(Path(path), found)


def append(path: Path, result: TestResult) -> None:
    """Add one result to the JSON-lines file."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(result), default=str) + "\n")


def read(path: Path) -> list[TestResult]:
    """Every result in a JSON-lines file (none if it doesn't exist); a test's later phases add to its figures."""
    if not path.is_file():
        return []
    found: dict[str, TestResult] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        result = TestResult(**json.loads(line))
        earlier = found.get(result.nodeid)
        if earlier is None:
            found[result.nodeid] = result
        elif result.outcome == "error":  # a teardown failure after the call: the test did not end well
            earlier.outcome, earlier.message = "error", result.message
    return list(found.values())


def counts(results: list[TestResult]) -> dict[str, int]:
    """How many tests had each outcome."""
    return {o: sum(r.outcome == o for r in results) for o in OUTCOMES}


def _figures(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in figures.items())


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(results: list[TestResult], width: int = MESSAGE_WIDTH) -> str:
    """Aligned text: one line per test that ran (outcome, seconds, test, its figures or why it failed), then the
    skipped tests counted by reason, then the totals."""
    rows = [("result", "s", "test", "figures / why")]
    skipped: dict[str, int] = {}
    for r in results:
        if r.outcome == "skipped":
            skipped[r.message] = skipped.get(r.message, 0) + 1
            continue
        detail = _figures(r.figures) if r.outcome == "passed" else r.message
        outcome = "ok" if r.outcome == "passed" else r.outcome.upper()
        rows.append((outcome, f"{r.seconds:g}", r.name, _cut(detail, width)))
    lines = []
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in rows]
    lines += [f"skipped ({n}): {_cut(why, width + 40)}" for why, n in skipped.items()]
    lines.append(", ".join(f"{n} {o}" for o, n in counts(results).items() if n) or "no tests ran")
    return "\n".join(lines)
