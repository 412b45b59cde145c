"""How pytest-xdist shares the tests between its workers: a file at a time, the longest first.

The test command runs ``-n 2 --dist loadgroup``: xdist sends each group of tests to one worker, whole. Every test's
group is its file (its module-scoped fixtures, a server, a kernel or a tiny model, are made once), unless the test
names another with ``pytest.mark.xdist_group``: a long file splits that way into parts that run side by side.

xdist sends groups in the order they are collected, then one more each time a worker finishes one. Collected
alphabetically, a long group that comes late keeps one worker busy while the other has nothing left. Here the
longest go first (their files' seconds in ``tests/durations.json``, from an earlier run; a part of a long file counts
as long), so the last to run are short. A file that is not in the record goes first: its time is not known, and it
is better met early.

``--record-durations`` writes the record again from this run: each file's seconds (setup, call and teardown of its
tests), measured where pytest reports them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[1] / "durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations", action="store_true",
        help=f"write each test file's seconds in this run to {RECORD.name} (xdist hands out the longest first)",
    )  # fmt: skip


def recorded() -> dict[str, float]:
    """Each test file's seconds in the run that was recorded ({} without a record)."""
    try:
        seconds: dict[str, float] = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}
    return seconds


def named_group(item: pytest.Item) -> str:
    """The group a test names (xdist joins several the same way), else its file."""
    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    return "_".join(names) or item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items, group by group, the longest group first; a group without a record before all; ties in collected
    order (a group keeps its tests in their own order)."""
    groups: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        groups[named_group(item)].append(item)
    unknown = float("inf")

    def length(group: str) -> float:  # the record is by file: a part of a long file counts as long
        return max(seconds.get(item.nodeid.split("::", 1)[0], unknown) for item in groups[group])

    order = sorted(groups, key=lambda g: -length(g))
    return [item for g in order for item in groups[g]]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test without a group of its own joins its file's, before xdist reads the groups; then the order."""
    for item in items:
        if not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items[:] = longest_first(items, recorded())


class Record:
    """Each file's seconds in this run, written to the record when the run ends (registered in the process that
    receives every report: the xdist controller, or pytest alone)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration  # by file: reports carry no group

    def pytest_sessionfinish(self) -> None:
        ordered = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        RECORD.write_text(json.dumps({f: round(s, 1) for f, s in ordered}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # xdist's own order of groups is by their number of tests, which says little of their time: this order instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Record(), "nbhw-record-durations")
