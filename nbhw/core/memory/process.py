"""This process's one sampler and its cell log, and the IPython cell hooks that feed them."""

from __future__ import annotations

import threading
from typing import Any

from nbhw.core.memory.cell_records import CellLog
from nbhw.core.memory.sampling import Sampler

# ---------------------------------------------------------------- the process's sampler and cells

_process: dict[str, Any] = {}
_process_lock = threading.Lock()


def sampler() -> Sampler:
    """The one sampler of this process, shared by every graph (created on first use, not started)."""
    with _process_lock:
        if "sampler" not in _process:
            _process["sampler"] = Sampler()
            _process["cells"] = CellLog(_process["sampler"])
        found: Sampler = _process["sampler"]
        return found


def existing() -> Sampler | None:
    """This process's sampler if something created it, without creating it."""
    found: Sampler | None = _process.get("sampler")
    return found


def cells() -> CellLog:
    """The per-cell records of this process's sampler."""
    sampler()
    log: CellLog = _process["cells"]
    return log


def cell_started(key: object, source: str) -> None:
    """The pre-run-cell hook: cheap unless this process's sampler runs."""
    found = _process.get("sampler")
    if found is not None and found.running:
        _process["cells"].begin(key, source)


def cell_finished(key: object, execution_count: int | None, succeeded: bool | None) -> None:
    """The post-run-cell hook: record the cell, and add device traces once the user has imported torch."""
    found: Sampler | None = _process.get("sampler")
    if found is None:
        return
    _process["cells"].end(key, execution_count, succeeded)
    if found.running:
        found.refresh_sources()
