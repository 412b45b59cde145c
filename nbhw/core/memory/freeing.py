"""Getting the memory back: ``nbhw.free(...)``, ``%hw free ...`` and the Memory tab's free button.

Only what was chosen is done: delete the named variables, clear the output history, clear the last error's traceback,
then ``gc.collect()`` and, when asked, the device's ``empty_cache()``. What should come back is known before anything
is done (the storages only the chosen holders keep, from :func:`nbhw.core.memory.holders.holders`); what came back
is measured afterwards, by the allocator's counter where the device keeps one, else by counting live tensors again.
"""

from __future__ import annotations

import difflib
import functools
import gc
import sys
import traceback as tb_module
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbhw.core.errors import UserError
from nbhw.core.memory.allocator import DeviceMemory, TorchMemory
from nbhw.core.memory.holders import (
    OUTPUT_NAME,
    OWN_MODULES,
    Holders,
    Internal,
    errors_of,
    fold,
    frames_of,
    holders,
)
from nbhw.core.render import STYLE, Shown, esc, html_table, size, text_table


@dataclass(frozen=True)
class DeviceFreed:
    """One device after ``free``: what attribution expected back and what was measured."""

    device: str
    expected: int
    measured: int
    how: str  # "allocator" (the backend's allocated counter) or "tensors" (live storages counted again)
    cache_expected: int | None = None
    cache_measured: int | None = None


@dataclass(frozen=True)
class Freed(Shown):
    """What ``free`` did and how many bytes came back per device; ``nbhw.free(...)``, ``%hw free ...``."""

    done: tuple[str, ...]
    devices: tuple[DeviceFreed, ...]
    kept: tuple[str, ...]
    after: Holders
    garbage: Mapping[str, int] = field(default_factory=dict)  # device -> bytes gc.collect() gave back first

    def garbage_line(self) -> str | None:
        """What the first gc.collect() gave back, before anything chosen was done (None: nothing measured)."""
        found = [f"{size(n)} on {d}" for d, n in self.garbage.items() if n > 0]
        if not found:
            return None
        return f"first, gc.collect() gave back {', '.join(found)} that nothing held (tensors in reference cycles)"

    def rows(self) -> list[list[str]]:
        """One row per device: expected back, came back, measured by, cache released (of what it could)."""
        return [
            [
                d.device,
                size(d.expected),
                size(d.measured),
                d.how,
                "" if d.cache_measured is None else f"{size(d.cache_measured)} of {size(d.cache_expected)}",
            ]
            for d in self.devices
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "done": list(self.done),
            "devices": [vars(d) for d in self.devices],
            "kept": list(self.kept),
            "garbage": dict(self.garbage),
        }

    def text(self) -> str:
        lines = ["nbhw free: " + "; ".join(self.done)]
        if self.devices:
            lines.append(text_table(FREED_HEADERS, self.rows(), indent="  "))
        lines += [f"  kept: {k}" for k in self.kept]
        garbage = self.garbage_line()
        return "\n".join(lines + ([f"  {garbage}"] if garbage else []))

    def html(self) -> str:
        parts = [f"<p class='nbhw-freed-done'>nbhw free: {esc('; '.join(self.done))}</p>"]
        if self.devices:
            parts.append(html_table(FREED_HEADERS, self.rows(), css_class="nbhw-table nbhw-freed"))
        parts += [f"<p class='warn'>kept: {esc(k)}</p>" for k in self.kept]
        garbage = self.garbage_line()
        parts += [f"<p class='src'>{esc(garbage)}</p>"] if garbage else []
        return f"{STYLE}<div class='nbhw'>{''.join(parts)}</div>"


FREED_HEADERS = ("device", "expected back", "came back", "measured by", "cache released")


def free(
    namespace: MutableMapping[str, Any],
    names: Sequence[str] = (),
    *,
    history: bool = False,
    traceback: bool = False,
    cache: bool = False,
    outputs: MutableMapping[int, Any] | None = None,
    error: BaseException | None = None,
    internals: Sequence[Internal] = (),
    ignore: Sequence[object] = (),
    memory: DeviceMemory | None = None,
    own_modules: Sequence[str] = OWN_MODULES,
) -> Freed:
    """Do only what was chosen, then say how many bytes came back per device, measured, against the expectation.

    ``names``: delete these variables from the namespace; ``history``: clear the output history and ``_``-names;
    ``traceback``: clear the last exception's frames and every reference to it; ``cache``: the allocator's
    ``empty_cache()``. ``%hw free [NAME ...] [--history] [--traceback] [--cache]``.
    """
    names = list(dict.fromkeys(names))
    if not (names or history or traceback or cache):
        raise UserError("nothing to free: name variables, or choose history, traceback or cache")
    memory = memory if memory is not None else TorchMemory()
    walk = functools.partial(
        holders, namespace, outputs=outputs, error=error, internals=internals, ignore=ignore, memory=memory,
        own_modules=own_modules,
    )  # fmt: skip
    # Garbage first: tensors in reference cycles nothing holds (an old traceback with the ExecutionResult that held
    # it) are given back by any gc.collect(); counted apart, so "came back" is what the choice itself returned.
    garbage = _collect_garbage(memory)
    before = walk()
    _check_names(namespace, names, before)
    chosen = _chosen(before, names, history, traceback)
    allocated = {d.device: d.allocated for d in before.devices}
    done = _delete(namespace, names)
    if history:
        done.append(_clear_history(namespace, outputs, internals))
    if traceback:
        done.append(_clear_traceback(error, internals))
    gc.collect()  # what the choice left in reference cycles (a model and its hooks) comes back only now
    reserved = {d: memory.reserved(d) for d in allocated}
    if cache:
        emptied = [d for d in allocated if memory.empty_cache(d)]
        done.append(f"emptied the allocator cache on {', '.join(emptied)}" if emptied else "no device keeps a cache")
    after = walk()
    was = _Before(before, before.freed_if(chosen), allocated, reserved)
    devices = tuple(_device_freed(d, was, after, memory=memory, cache=cache) for d in allocated)
    kept = tuple(_kept(before, {before.holders[i].label for i in chosen}))
    return Freed(tuple(done), devices, kept, after, garbage)


def _collect_garbage(memory: DeviceMemory) -> dict[str, int]:
    """gc.collect(), and what it gave back on each device whose allocator keeps a counter."""
    counted = {d: memory.allocated(d) for d in memory.devices()}
    gc.collect()
    return {d: was - (memory.allocated(d) or 0) for d, was in counted.items() if was is not None}


def _check_names(namespace: Mapping[str, Any], names: Sequence[str], before: Holders) -> None:
    """Every name is checked before anything is deleted: one mistake, nothing done."""
    for name in names:
        if OUTPUT_NAME.match(name):
            raise UserError(f"{name!r} is output history, not a variable; free it with history=True (--history)")
        if name not in namespace:
            raise UserError(f"unknown variable {name!r}; variables holding tensors: {_hint(name, before)}")
        if not any(name in (h.name, h.of) for h in before.holders):
            raise UserError(f"{name!r} holds no tensor ({type(namespace[name]).__name__}); nothing to free")


def _hint(name: str, before: Holders) -> str:
    """The variables that hold tensors, the closest to a mistyped name first."""
    holding = sorted({h.name for h in before.holders if h.kind == "variable" and h.name})
    close = difflib.get_close_matches(name, holding, n=3)
    return ", ".join([*close, *(n for n in holding if n not in close)][:8]) or "none"


def _chosen(before: Holders, names: Sequence[str], history: bool, traceback: bool) -> set[int]:
    """The holders a choice drops; an autograd graph goes with the holder it hangs off."""
    picked = {
        i
        for i, h in enumerate(before.holders)
        if (h.kind == "variable" and h.name in names)
        or (history and h.kind == "output")
        or (traceback and h.kind == "traceback")
    }
    labels = {before.holders[i].label for i in picked}
    return picked | {i for i, h in enumerate(before.holders) if h.kind == "graph" and h.of in labels}


def _delete(namespace: MutableMapping[str, Any], names: Sequence[str]) -> list[str]:
    for name in names:
        del namespace[name]
    return [f"deleted {', '.join(names)}"] if names else []


def _clear_history(
    namespace: MutableMapping[str, Any], outputs: MutableMapping[int, Any] | None, internals: Sequence[Internal]
) -> str:
    count = len(outputs or {})
    if outputs is not None:
        outputs.clear()
    for name in [n for n in namespace if OUTPUT_NAME.match(n)]:
        if name in ("_", "__", "___"):
            namespace[name] = ""  # what IPython's own flush leaves there
        else:
            del namespace[name]
    for internal in internals:
        if internal.kind == "output":
            internal.drop()
    return f"cleared the output history ({count} entries) and _, __, ___"


def _clear_traceback(error: BaseException | None, internals: Sequence[Internal]) -> str:
    errors = errors_of(error, internals)
    frames = frames_of(errors)
    for item in errors:
        tb = item.__traceback__ if isinstance(item, BaseException) else item
        if tb is not None:
            tb_module.clear_frames(tb)  # the frames' locals go even where someone still holds the exception
    for frame in frames:
        # Reading f_locals (the holders walk did) left a dict snapshot on the frame that clear() keeps (Python
        # 3.11-3.12); reading it again now syncs it with the cleared locals, which drops the tensors it still held.
        frame.f_locals  # noqa: B018
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    for internal in internals:
        if internal.kind == "traceback":
            internal.drop()
    return f"cleared the last error's traceback ({len(frames)} frames)" if errors else "there was no last error"


@dataclass(frozen=True)
class _Before:
    """What free knew before doing anything: the attribution, its expectation, the allocator's figures."""

    holders: Holders
    expected: Mapping[str, int]
    allocated: Mapping[str, int | None]
    reserved: Mapping[str, int | None]  # after the choice, before empty_cache()


def _device_freed(device: str, was: _Before, after: Holders, *, memory: DeviceMemory, cache: bool) -> DeviceFreed:
    before, now = was.allocated.get(device), memory.allocated(device)
    if before is not None and now is not None:
        measured, how = before - now, "allocator"
    else:
        tensors_after = next((d.tensors for d in after.devices if d.device == device), 0)
        measured, how = was.holders.device(device).tensors - tensors_after, "tensors"
    cache_expected = cache_measured = None
    reserved_was, reserved_now = was.reserved.get(device), memory.reserved(device)
    if cache and reserved_was is not None and reserved_now is not None and now is not None:
        cache_expected, cache_measured = reserved_was - now, reserved_was - reserved_now
    return DeviceFreed(device, was.expected.get(device, 0), measured, how, cache_expected, cache_measured)


def _kept(before: Holders, chosen: set[str]) -> Iterator[str]:
    """Why chosen tensors did not come back: who else holds them."""
    for d in before.devices:
        for g in d.groups:
            mine = [h.label for h in g.holders if h.label in chosen]
            others = [h for h in g.holders if h.label not in chosen]
            if mine and others:
                yield f"{', '.join(mine)}: {size(g.nbytes)} on {d.device} still held by {fold(others)}"
