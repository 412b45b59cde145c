"""The models in the running session, handed to core: ``nbhw.loaded()``, ``nbhw.pin()`` and the cell hook.

Inside IPython (a kernel or a terminal) the session is the shell's namespace; outside, the ``__main__`` module's
globals. The cell hook ties each model that appears to the cell that loaded it (see
:mod:`nbhw.core.measured.origins`); it costs a dictionary lookup until the user's code imports transformers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from IPython import get_ipython

from nbhw.core.argument import checked
from nbhw.core.measured import origins
from nbhw.core.measured.arguments import PinArgs
from nbhw.core.measured.report import Loaded, note_cell_lines, pick, pin_data
from nbhw.core.measured.report import entry as model_entry
from nbhw.core.measured.report import loaded as loaded_in
from nbhw.core.memory.cell_records import CellRecord
from nbhw.core.plan.pinned import Pin, write_pin


def namespace() -> Mapping[str, Any]:
    """The user's variables: the shell's namespace, else ``__main__``'s globals."""
    shell = get_ipython()
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


def _interval() -> float | None:
    process = sys.modules.get("nbhw.core.memory.process")
    sampler = process.existing() if process is not None else None
    return None if sampler is None else float(sampler.interval)


def loaded() -> Loaded:
    """Every transformers model alive in the session: what it holds, and the plan that wrote its cell beside it.

    Per model: class, dtypes (and the modules kept in float32), the attention set on it and on each sub-config,
    the layers ``use_kernels`` swapped, ``hf_device_map``, bytes per device measured from its tensors, the
    quantization applied; when nbhw's plan wrote the loading cell, every difference from that plan and the measured
    peaks against the plan's (``%hw memory`` must run while the cell runs for peaks). ``%hw loaded [--json]``.
    """
    return loaded_in(namespace(), _interval())


def pin(model: Any = None, path: str | os.PathLike[str] | None = None) -> Pin:
    """Write what ran with ``model`` to ``path`` as a small JSON: versions, the plan's arguments, the attention and
    kernels really used, the device map, measured bytes and peaks. ``nbhw.plan(pinned=path)`` reads it back.
    ``model``: the model, its variable's name, or None for the only one loaded. ``%hw pin PATH [--model NAME]``.
    """
    asked: PinArgs = checked(PinArgs, {"path": path})
    variable, found = pick(namespace(), model)
    assert asked.path is not None
    return write_pin(pin_data(model_entry(found, variable, _interval())), asked.path)


def _record(count: int | None) -> CellRecord | None:
    process = sys.modules.get("nbhw.core.memory.process")
    if process is None or process.existing() is None:
        return None
    records = process.cells().records
    last: CellRecord | None = records[-1] if records else None
    return last if last is not None and last.execution_count == count else None


def after_cell(shell: Any, result: Any) -> None:
    """The post-run-cell step: tie new models to this cell (and its plan and record), note generate runs."""
    info = getattr(result, "info", None)
    source = getattr(info, "raw_cell", "") or ""
    try:
        python = shell.transform_cell(source)  # magics and ! lines as the cell really ran them
    except Exception:
        python = source
    try:
        origins.after_cell(
            shell.user_ns, python, result.execution_count, _record(result.execution_count),
            succeeded=bool(result.success),
        )  # fmt: skip
        note_cell_lines()  # the Memory tab's lines, here on the main thread rather than in the graph's
    except Exception as exc:  # the user's cell ran; nbhw's bookkeeping failing must not look like their error
        print(f"nbhw: could not note the models this cell loaded: {type(exc).__name__}: {exc}", file=sys.stderr)
