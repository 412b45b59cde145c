"""Dry-run recordings kept on disk (nbhw.core.plan.run_store): a new kernel planning the same model reads them
instead of running generate() again, with the same figures; nothing is kept when switched off, and a file that
can't be read is run again."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nbhw.core.plan import load_plan, run, stages
from tests.support import published


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The sizes of every dry run that ran generate() (not read from memory or disk)."""
    found: list[Any] = []
    record = run._DryRun._record
    monkeypatch.setattr(run._DryRun, "_record", lambda self: found.append(self.sizes) or record(self))
    return found


def new_kernel() -> None:
    """What a fresh process has in memory: no meta builds, no dry runs."""
    stages.clear_cache()
    run.clear_results()


def planned(model: str) -> Any:
    estimate = load_plan.plan(model, context=512, target="T4").run
    assert estimate is not None
    return dataclasses.replace(estimate, seconds=0.0)


def test_a_new_kernel_reads_the_dry_runs_an_earlier_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[Any]
) -> None:
    monkeypatch.setenv("NBHW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NBHW_KEEP_DRY_RUNS", "1")  # the suite keeps none (conftest)
    model = published.folder("Llama-3.1-8B", tmp_path)
    new_kernel()
    first = planned(model)
    kept = list((tmp_path / "home" / "dry-runs").glob("*.pickle"))
    assert len(recorded) == 1 and len(kept) == 1  # 32 layers on one device: a shallow run, recorded once

    new_kernel()
    assert planned(model) == first and len(recorded) == 1  # read from disk, not run
    elsewhere = published.folder("Llama-3.1-8B", tmp_path / "elsewhere")
    new_kernel()
    assert planned(elsewhere) == first and len(recorded) == 1  # the same config in another folder: the same model

    kept[0].write_bytes(b"torn")  # an unreadable file is run again, and written again
    new_kernel()
    assert planned(model) == first and len(recorded) == 2
    new_kernel()
    assert planned(model) == first and len(recorded) == 2


def test_nothing_is_kept_when_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[Any]
) -> None:
    monkeypatch.setenv("NBHW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NBHW_KEEP_DRY_RUNS", "0")
    model = published.folder("Llama-3.1-8B", tmp_path)
    new_kernel()
    first = planned(model)
    new_kernel()
    assert planned(model) == first and len(recorded) == 2
    assert not (tmp_path / "home" / "dry-runs").exists()
