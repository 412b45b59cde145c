"""What the running Python session holds, handed to core: ``nbhw.holders()``, ``nbhw.free()``, the OOM report's hook.

Inside IPython (a kernel or a terminal) that is the shell's namespace, its output history and the last error, plus
the references IPython keeps out of sight (read from IPython 9.18): the displayhook's own ``_``, ``__``, ``___``
attributes; ``user_ns_hidden`` (``_``, ``__``, ``___`` and every ``_N`` are there too); the last execution result's
``result`` and ``error_in_exec``; the traceback formatter's ``InteractiveTB.tb``; and ``sys.last_traceback`` /
``last_value`` (``last_exc`` on 3.12+). Clearing only the names a user sees leaves the tensors alive. Outside
IPython it is the ``__main__`` module's globals and ``sys.last_*``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from IPython import get_ipython
from IPython.display import display

from nbhw.core.argument import checked
from nbhw.core.measured import origins
from nbhw.core.measured.arguments import PinArgs
from nbhw.core.measured.fixes import Planner, run_planner_fixes
from nbhw.core.measured.oom_report import OutOfMemory, oom_report
from nbhw.core.measured.report import Loaded, note_cell_lines, pick, pin_data
from nbhw.core.measured.report import entry as model_entry
from nbhw.core.measured.report import loaded as loaded_in
from nbhw.core.memory.allocator import DeviceMemory, TorchMemory
from nbhw.core.memory.arguments import FreeArgs, HoldersArgs
from nbhw.core.memory.cell_records import CellRecord
from nbhw.core.memory.freeing import Freed
from nbhw.core.memory.freeing import free as free_in
from nbhw.core.memory.holders import OUTPUT_NAME, Holders, Internal
from nbhw.core.memory.holders import holders as holders_in
from nbhw.core.plan.pinned import Pin, write_pin


def device_memory() -> DeviceMemory:
    """The allocator figures every call here reads (torch's counters; tests fake the device here)."""
    return TorchMemory()


# ---------------------------------------------------------------- what IPython keeps


def _read(obj: object, name: str) -> Callable[[], object]:
    return lambda: getattr(obj, name, None)


def _write(obj: object, name: str, value: object) -> Callable[[], None]:
    return lambda: setattr(obj, name, value)


def _item(mapping: dict[str, Any], name: str) -> Callable[[], object]:
    return lambda: mapping.get(name)


def _drop_item(mapping: dict[str, Any], name: str) -> Callable[[], None]:
    def drop() -> None:
        if name in ("_", "__", "___"):
            mapping[name] = ""  # what IPython's own flush leaves there
        else:
            mapping.pop(name, None)

    return drop


def internals(shell: Any) -> list[Internal]:
    """IPython's own references to outputs and to the last error: a getter and a drop each, never the object."""
    hook = shell.displayhook
    found = [
        Internal(f"IPython displayhook.{n}", "output", _read(hook, n), _write(hook, n, "")) for n in ("_", "__", "___")
    ]
    hidden = shell.user_ns_hidden
    found += [
        Internal(f"IPython user_ns_hidden[{n!r}]", "output", _item(hidden, n), _drop_item(hidden, n))
        for n in hidden
        if OUTPUT_NAME.match(n)
    ]
    last = shell.last_execution_result
    if last is not None:
        label = "IPython last_execution_result"
        found.append(Internal(f"{label}.result", "output", _read(last, "result"), _write(last, "result", None)))
        found += [
            Internal(f"{label}.{n}", "traceback", _read(last, n), _write(last, n, None))
            for n in ("error_in_exec", "error_before_exec")
        ]
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is not None:
        found.append(
            Internal("IPython InteractiveTB.tb", "traceback", _read(formatter, "tb"), _write(formatter, "tb", None))
        )
    return found


def last_error(shell: Any) -> BaseException | None:
    """The last exception, wherever it is kept."""
    for candidate in (getattr(sys, "last_exc", None), getattr(sys, "last_value", None)):
        if isinstance(candidate, BaseException):
            return candidate
    last = getattr(shell, "last_execution_result", None)
    error = getattr(last, "error_in_exec", None)
    return error if isinstance(error, BaseException) else None


def _seen_by_core(shell: Any) -> dict[str, Any]:
    """The keyword arguments core's holders / free / oom_report take, read from a shell."""
    ignore = [shell, shell.displayhook, shell.history_manager, shell.user_ns_hidden, shell.last_execution_result]
    ignore.append(getattr(shell, "kernel", None))
    return {
        "outputs": shell.user_ns.get("_oh"),
        "internals": internals(shell),
        "ignore": [o for o in ignore if o is not None],
    }


# ---------------------------------------------------------------- in a shell


def shell_holders(
    shell: Any,
    device: str | None = None,
    *,
    memory: DeviceMemory | None = None,
    scan: bool = True,
    time_limit: float | None = None,
) -> Holders:
    """What keeps tensors alive in this shell, per device (``%hw holders``)."""
    return holders_in(
        shell.user_ns,
        error=last_error(shell),
        device=device,
        memory=memory if memory is not None else device_memory(),
        scan=scan,
        time_limit=time_limit,
        **_seen_by_core(shell),
    )


def shell_free(
    shell: Any,
    names: Sequence[str] = (),
    *,
    history: bool = False,
    traceback: bool = False,
    cache: bool = False,
    memory: DeviceMemory | None = None,
) -> Freed:
    """Do only what was chosen in this shell, and measure what came back (``%hw free ...``)."""
    return free_in(
        shell.user_ns,
        names,
        history=history,
        traceback=traceback,
        cache=cache,
        error=last_error(shell),
        memory=memory if memory is not None else device_memory(),
        **_seen_by_core(shell),
    )


def out_of_memory_report(
    shell: Any,
    error: BaseException,
    *,
    cell: str = "",
    memory: DeviceMemory | None = None,
    device: str | None = None,
    planner: Planner = run_planner_fixes,
) -> OutOfMemory:
    """The report for a cell of this shell that failed with ``error`` (an out-of-memory error)."""
    return oom_report(
        error,
        shell.user_ns,
        memory=memory if memory is not None else device_memory(),
        device=device,
        planner=planner,
        cell=cell,
        **_seen_by_core(shell),
    )


def show_out_of_memory(result: Any) -> None:
    """The post-run-cell step after a cell that ran out of memory: the report, displayed below the error."""
    shell = get_ipython()
    error = getattr(result, "error_in_exec", None)
    if shell is None or not isinstance(error, BaseException):
        return
    cell = getattr(getattr(result, "info", None), "raw_cell", "") or ""
    try:
        report = out_of_memory_report(shell, error, cell=cell)
    except Exception as exc:  # the user's error is already shown; a failing report must not bury it
        print(f"nbhw: the out-of-memory report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    display(report)


# ---------------------------------------------------------------- the public functions


def holders(device: str | None = None) -> Holders:
    """Per device, the live tensors grouped by what keeps them alive, largest first (``%hw holders``).

    Inside IPython: the notebook's variables, the output history (``Out``, ``_``), the last error's traceback frames,
    autograd graphs hanging off held tensors, nbhw's own module globals (there should be none); what no holder
    explains is shown as unattributed, next to the allocator's allocated and reserved figures. Outside IPython: the
    ``__main__`` module's globals. ``device``: only that one ("cuda:0").
    """
    asked = checked(HoldersArgs, {"device": device} if device is not None else {})
    shell = get_ipython()
    if shell is not None:
        return shell_holders(shell, asked.device)
    namespace = vars(sys.modules["__main__"])
    return holders_in(namespace, device=asked.device, memory=device_memory())


def free(names: Sequence[str] = (), *, history: bool = False, traceback: bool = False, cache: bool = False) -> Freed:
    """Do only what was chosen, then say how many bytes came back per device, measured, against what was expected.

    ``names``: delete these variables; ``history``: clear the output history (``Out``, ``_``, ``__``, ``___`` and
    IPython's own copies); ``traceback``: clear the last error's traceback (its frames' locals); ``cache``: the
    device's ``empty_cache()``. ``gc.collect()`` runs after deleting. A mistake (an unknown name, a name holding no
    tensor, nothing chosen) deletes nothing. ``%hw free [NAME ...] [--history] [--traceback] [--cache]``.
    """
    asked = checked(FreeArgs, {"names": names, "history": history, "traceback": traceback, "cache": cache})
    choices = {"history": asked.history, "traceback": asked.traceback, "cache": asked.cache}
    shell = get_ipython()
    if shell is not None:
        return shell_free(shell, asked.names, **choices)
    namespace = vars(sys.modules["__main__"])
    return free_in(namespace, asked.names, memory=device_memory(), **choices)


# ---------------------------------------------------------------- the session's models (nbhw.loaded, nbhw.pin)


def user_namespace() -> Mapping[str, Any]:
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
    return loaded_in(user_namespace(), _interval())


def pin(model: Any = None, path: str | os.PathLike[str] | None = None) -> Pin:
    """Write what ran with ``model`` to ``path`` as a small JSON: versions, the plan's arguments, the attention and
    kernels really used, the device map, measured bytes and peaks. ``nbhw.plan(pinned=path)`` reads it back.
    ``model``: the model, its variable's name, or None for the only one loaded. ``%hw pin PATH [--model NAME]``.
    """
    asked: PinArgs = checked(PinArgs, {"path": path})
    variable, found = pick(user_namespace(), model)
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

    def ran(source: str) -> str:
        try:
            return str(shell.transform_cell(source))  # magics and ! lines as the cell really ran them
        except Exception:
            return source

    try:
        origins.after_cell(
            shell.user_ns, source, result.execution_count, _record(result.execution_count),
            succeeded=bool(result.success), ran=ran,
        )  # fmt: skip
        note_cell_lines()  # the Memory tab's lines, here on the main thread rather than in the graph's
    except Exception as exc:  # the user's cell ran; nbhw's bookkeeping failing must not look like their error
        print(f"nbhw: could not note the models this cell loaded: {type(exc).__name__}: {exc}", file=sys.stderr)
