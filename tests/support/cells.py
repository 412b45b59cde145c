"""Running cells in a real IPython shell for the holders tests, and counting bytes with torch's public API alone."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def run(shell: Any, code: str) -> Any:
    """Run a cell that must succeed (with history, so Out and _N fill as in a notebook); its result."""
    result = shell.run_cell(code, store_history=True)
    result.raise_error()
    return result


def fails(shell: Any, code: str) -> BaseException:
    """Run a cell that must fail; its exception."""
    result = shell.run_cell(code, store_history=True)
    error = result.error_in_exec
    assert isinstance(error, BaseException), "the cell was meant to fail"
    return error


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages of some tensors (public torch API, independent of nbhw's walker)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        try:
            seen[s.data_ptr()] = s.nbytes()
        except RuntimeError:  # "an invalid python storage": a fake tensor's (a training plan's FSDP2 dry run), no bytes
            continue
    return sum(seen.values())
