"""What keeps tensors alive, per device: ``nbhw.holders()``, ``%hw holders`` and the Memory tab's holders section.

Pure: no IPython. The front end (:mod:`nbhw.session`) hands in what the session holds: the user namespace, the
output history, the last exception, and its own hidden copies as :class:`Internal` references. torch is never
imported here, only read from ``sys.modules`` once the user imported it.

Each root (a variable, an output entry, a traceback frame's local, a module global of nbhw) is walked on its own
(:mod:`nbhw.core.memory.keeps_alive`); a storage reached from several roots is counted once, in the group of exactly
those roots ("model + opt"): freeing one of them alone returns nothing of it. An autograd graph is a holder of its
own ("autograd graph of loss"): what a root keeps only through the grad_fn graphs of the tensors it holds. Every
live tensor is also found without the holders (the scan), so attributed + unattributed = the tensors' total.
"""

from __future__ import annotations

import functools
import gc
import heapq
import re
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from nbhw.core.cache import PLANNER_CACHES
from nbhw.core.errors import UserError
from nbhw.core.memory.allocator import DeviceMemory, TorchMemory
from nbhw.core.memory.keeps_alive import Key, Walker, WalkStopped, device_of, may_hold, on_device, where
from nbhw.core.render import STYLE, Shown, esc, html_table, size, text_table

KINDS = ("variable", "output", "traceback", "graph", "nbhw")
Storage = tuple[str, int]  # (device, data pointer)
OUTPUT_NAME = re.compile(r"^(_{1,3}|_\d+)$")
# IPython's own names in the user namespace that are not the user's variables (the history dicts, the input cache).
SESSION_NAMES = frozenset({"In", "Out", "_oh", "_ih", "_dh", "exit", "quit", "get_ipython", "_i", "_ii", "_iii"})
INPUT_NAME = re.compile(r"^_i\d+$")
OWN_MODULES = ("nbhw",)


# ---------------------------------------------------------------- what the front end hands in


@dataclass(frozen=True)
class Internal:
    """A reference the front end itself keeps (IPython's displayhook ``_``, the last execution result's error).

    ``kind`` says which choice of ``free`` drops it: "output" (history=True) or "traceback" (traceback=True).
    ``get`` reads it when needed: an Internal must not keep the object alive itself (``free`` measures after dropping).
    """

    label: str
    kind: str
    get: Callable[[], object]
    drop: Callable[[], None]


# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class Holder:
    """One thing that keeps tensors alive: a variable, an output entry, a traceback frame's local, a graph."""

    label: str
    kind: str
    aliases: tuple[str, ...] = ()
    name: str | None = None  # the namespace name of a variable (what ``free(names=...)`` takes)
    of: str | None = None  # for an autograd graph: the label of the holder whose tensors it hangs off

    @property
    def shown(self) -> str:
        """The label with its aliases: 'Out[3] (also _3, _ and 3 IPython references)'."""
        visible = [a for a in self.aliases if not a.startswith("IPython ")]
        hidden = len(self.aliases) - len(visible)
        also = ", ".join(visible)
        if hidden:
            also += f"{' and ' if also else ''}{hidden} IPython reference{'s' if hidden > 1 else ''}"
        return f"{self.label} (also {also})" if also else self.label


@dataclass(frozen=True)
class Group:
    """The storages on one device held by exactly these holders (and nothing else that was walked)."""

    holders: tuple[Holder, ...]
    nbytes: int
    storages: int
    owners: frozenset[int] = field(default=frozenset(), repr=False, compare=False)  # indices into Holders.holders

    @property
    def kind(self) -> str:
        kinds = {h.kind for h in self.holders}
        return kinds.pop() if len(kinds) == 1 else "shared"

    @property
    def label(self) -> str:
        """'model + opt'; a traceback's locals folded into one: the deepest frame's and how many more."""
        return fold(self.holders)


def _in_traceback(holder: Holder) -> bool:
    # A frame's local, or an autograd graph hanging off one (only frame labels hold " › ").
    return holder.kind == "traceback" or (holder.kind == "graph" and " › " in (holder.of or ""))


def fold(holders: Sequence[Holder]) -> str:
    """Holders as one label: 'model + opt'; a traceback's locals (and their graphs) as one item naming the deepest."""
    parts = [h.shown for h in holders if not _in_traceback(h)]
    frames = [h for h in holders if _in_traceback(h)]
    locals_ = [h.label for h in frames if h.kind == "traceback"] or [h.of or h.label for h in frames]
    graphs = " and autograd graphs" if any(h.kind == "graph" for h in frames) else ""
    if len(frames) == 1:
        parts.append(frames[0].label)
    elif frames:
        more = len({*locals_}) - 1
        parts.append(f"the last error's frames{graphs}: {locals_[-1]}" + (f" and {more} more" if more else ""))
    return " + ".join(parts)


@dataclass(frozen=True)
class DeviceHolders:
    """One device: the groups largest first, what no holder explains, and the allocator's own figures."""

    device: str
    groups: tuple[Group, ...]
    unattributed: int
    unattributed_storages: int | None  # None: live tensors were not scanned for (``scan=False``)
    unattributed_examples: tuple[str, ...]
    allocated: int | None
    reserved: int | None

    @property
    def attributed(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def tensors(self) -> int:
        """Bytes of every live storage found on this device."""
        return self.attributed + self.unattributed

    @property
    def outside_tensors(self) -> int | None:
        """What the allocator counts beyond the storages found (block rounding, workspaces, C++-only tensors)."""
        return None if self.allocated is None else self.allocated - self.tensors

    @property
    def cached(self) -> int | None:
        """Reserved by the allocator but not allocated: what ``empty_cache()`` can hand back."""
        if self.allocated is None or self.reserved is None:
            return None
        return self.reserved - self.allocated


@dataclass(frozen=True)
class Holders(Shown):
    """Per device, the live tensors grouped by what keeps them alive; ``nbhw.holders()``, ``%hw holders``."""

    devices: tuple[DeviceHolders, ...]
    holders: tuple[Holder, ...]
    seconds: float
    visited: int
    notes: tuple[str, ...] = ()
    listed: Callable[[], Mapping[Storage, tuple[int, frozenset[int]]]] = field(default=dict, repr=False, compare=False)

    @functools.cached_property
    def storages(self) -> Mapping[Storage, tuple[int, frozenset[int]]]:
        """Every storage found, as (device, data pointer): its bytes and the indices of the holders that keep it
        (none: unattributed).

        Listed when first read (the report and ``free`` work from the groups).
        """
        return self.listed()

    def device(self, device: str) -> DeviceHolders:
        for found in self.devices:
            if found.device == device:
                return found
        raise UserError(f"no tensors on {device!r}; devices with tensors: {', '.join(self.names()) or 'none'}")

    def names(self) -> list[str]:
        return [d.device for d in self.devices]

    def held_by(self, label: str, device: str | None = None) -> int:
        """Bytes held by exactly the one holder ``label`` (a variable's name, 'Out[3]', 'f() › x')."""
        return sum(
            g.nbytes
            for d in self.devices
            if device in (None, d.device)
            for g in d.groups
            if len(g.holders) == 1 and g.holders[0].label == label
        )

    def reached_from(self, label: str, device: str | None = None) -> int:
        """Bytes reachable from ``label``, alone or shared with other holders."""
        return sum(
            g.nbytes
            for d in self.devices
            if device in (None, d.device)
            for g in d.groups
            if any(h.label == label for h in g.holders)
        )

    def freed_if(self, chosen: Iterable[int]) -> dict[str, int]:
        """Per device, the bytes of the storages that only the chosen holders keep: what dropping them returns."""
        picked = frozenset(chosen)
        return {d.device: sum(g.nbytes for g in d.groups if g.owners <= picked) for d in self.devices}

    def text(self) -> str:
        lines = [
            f"nbhw holders: what keeps tensors alive ({self.seconds * 1000:.0f} ms, {self.visited:,} objects walked)"
        ]
        for d in self.devices:
            lines += ["", f"  {d.device}", text_table(HEADERS, _rows(d), indent="  "), "  " + _balance(d)]
        if not self.devices:
            lines.append("  no live tensors")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def html(self) -> str:
        walked = f"{self.visited:,} objects walked in {self.seconds * 1000:.0f} ms"
        parts = [f"<h3>What keeps tensors alive</h3><p class='src'>{walked}</p>"]
        for d in self.devices:
            parts += [f"<h3>{esc(d.device)}</h3>", html_table(HEADERS, _rows(d)), f"<p>{esc(_balance(d))}</p>"]
        parts += [f"<p class='warn'>note: {esc(n)}</p>" for n in self.notes]
        return f"{STYLE}<div class='nbhw'>{''.join(parts)}</div>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "devices": [
                {
                    "device": d.device,
                    "groups": [
                        {
                            "holders": [h.shown for h in g.holders],
                            "kind": g.kind,
                            "bytes": g.nbytes,
                            "tensors": g.storages,
                        }
                        for g in d.groups
                    ],
                    "unattributed": d.unattributed,
                    "tensors": d.tensors,
                    "allocated": d.allocated,
                    "reserved": d.reserved,
                }
                for d in self.devices
            ],
            "notes": list(self.notes),
        }


HEADERS = ("held by", "kind", "bytes", "storages")


def _rows(d: DeviceHolders) -> list[list[str]]:
    rows = [[g.label, g.kind, size(g.nbytes), str(g.storages)] for g in d.groups]
    if d.unattributed_storages is None:
        rows.append(["unattributed (allocated minus attributed; not scanned)", "", size(d.unattributed), ""])
    elif d.unattributed_storages:
        examples = f" — largest: {', '.join(d.unattributed_examples)}" if d.unattributed_examples else ""
        rows.append([f"unattributed{examples}", "", size(d.unattributed), str(d.unattributed_storages)])
    if d.cached:
        rows.append(["allocator cache (reserved, unused)", "allocator", size(d.cached), ""])
    return rows


def _balance(d: DeviceHolders) -> str:
    line = f"attributed {size(d.attributed)} + unattributed {size(d.unattributed)} = tensors {size(d.tensors)}"
    if d.allocated is None:
        return line + f"; {d.device} keeps no allocator counter"
    outside = d.outside_tensors or 0
    if outside >= 0:
        return line + f"; allocated {size(d.allocated)} ({size(outside)} not visible as tensors)"
    return line + f"; allocated {size(d.allocated)} (tensors exceed it by {size(-outside)}: memory not from it)"


# ---------------------------------------------------------------- roots: where the walk starts


@dataclass
class _Root:
    holder: Holder
    values: list[object]


def _namespace_roots(namespace: Mapping[str, Any], outputs: Mapping[int, Any] | None) -> list[_Root]:
    roots: list[_Root] = []
    for name, value in list(namespace.items()):
        if name in SESSION_NAMES or INPUT_NAME.match(name) or name.startswith("__") or value is outputs:
            continue
        if OUTPUT_NAME.match(name) or not may_hold(value):
            continue  # output names are folded into the output roots below
        roots.append(_Root(Holder(name, "variable", name=name), [value]))
    return roots


def _output_roots(
    namespace: Mapping[str, Any], outputs: Mapping[int, Any] | None, internals: Sequence[Internal]
) -> list[_Root]:
    """Out[n], then ``_``-names and the front end's copies: one holder per object, the other names as aliases."""
    by_object: dict[int, tuple[str, list[str], object]] = {}
    order: list[int] = []

    def add(label: str, value: object) -> None:
        if not may_hold(value):
            return
        key = id(value)
        if key in by_object:
            by_object[key][1].append(label)
        else:
            by_object[key] = (label, [], value)
            order.append(key)

    for number, value in sorted((outputs or {}).items()):
        add(f"Out[{number}]", value)
    for name in sorted((n for n in namespace if OUTPUT_NAME.match(n)), key=_underscore_order):
        add(name, namespace[name])
    for internal in internals:
        if internal.kind == "output":
            add(internal.label, internal.get())
    return [
        _Root(Holder(label, "output", tuple(aliases)), [value])
        for label, aliases, value in (by_object[k] for k in order)
    ]


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


def _underscore_order(name: str) -> tuple[int, int]:
    digits = name.lstrip("_")
    return (0, int(digits)) if digits else (1, len(name))


def errors_of(error: BaseException | None, internals: Sequence[Internal]) -> list[BaseException | types.TracebackType]:
    """The last exception, wherever it is kept (sys.last_*, the front end's copies), and what it chains to."""
    found: list[BaseException | types.TracebackType] = []
    seen: set[int] = set()
    candidates: list[object] = [error, getattr(sys, "last_exc", None), getattr(sys, "last_value", None)]
    candidates += [getattr(sys, "last_traceback", None)]
    candidates += [i.get() for i in internals if i.kind == "traceback"]
    while candidates:
        item = candidates.pop(0)
        if not isinstance(item, (BaseException, types.TracebackType)) or id(item) in seen:
            continue
        seen.add(id(item))
        found.append(item)
        if isinstance(item, BaseException):
            candidates += [item.__traceback__, item.__context__, item.__cause__]
    return found


def frames_of(errors: Sequence[BaseException | types.TracebackType]) -> list[types.FrameType]:
    frames: list[types.FrameType] = []
    seen: set[int] = set()
    for item in errors:
        tb = item.__traceback__ if isinstance(item, BaseException) else item
        while tb is not None:
            if id(tb.tb_frame) not in seen:
                seen.add(id(tb.tb_frame))
                frames.append(tb.tb_frame)
            tb = tb.tb_next
    return frames


def _traceback_roots(errors: Sequence[BaseException | types.TracebackType]) -> list[_Root]:
    roots: list[_Root] = []
    labels: set[str] = set()
    for frame in frames_of(errors):
        if frame.f_locals is frame.f_globals:
            continue  # module-level code (the cell itself): its locals are the namespace, walked as variables
        where = f"{_qualname(frame.f_code)}()"
        for name, value in frame.f_locals.items():
            if not may_hold(value):
                continue
            label = f"{where} › {name}"
            n = 2
            while label in labels:
                label, n = f"{where} › {name} #{n}", n + 1
            labels.add(label)
            roots.append(_Root(Holder(label, "traceback"), [value]))
    exceptions = [e for e in errors if isinstance(e, BaseException)]
    payload = [v for e in exceptions for v in (*e.args, *vars(e).values())]
    if any(may_hold(v) for v in payload):
        name = type(exceptions[0]).__name__ if exceptions else "error"
        roots.append(_Root(Holder(f"the last error ({name}) itself", "traceback"), payload))
    return roots


def _own_modules(own: Sequence[str]) -> list[tuple[str, types.ModuleType]]:
    names, prefixes = set(own), tuple(o + "." for o in own)
    found = [(n, m) for n, m in list(sys.modules.items()) if n in names or n.startswith(prefixes)]
    return [(n, m) for n, m in found if isinstance(m, types.ModuleType)]


def _module_globals(modules: Sequence[tuple[str, types.ModuleType]]) -> list[tuple[str, str, object]]:
    """(module, name, value) of each global of these modules that may hold a tensor (no module machinery, no
    function; classes and modules are the walker's to skip), but the planner's caches
    (:data:`nbhw.core.cache.PLANNER_CACHES`): they keep meta-device builds, plans and op memos, thousands after a
    fit, whose walk cost seconds and never found a byte (a tensor one held would still be counted, as unattributed)."""
    return [
        (name, attr, value)
        for name, module in modules
        for attr, value in list(vars(module).items())
        if not attr.startswith("__")
        and gc.is_tracked(value)
        and type(value) is not types.FunctionType
        and not isinstance(value, PLANNER_CACHES)
    ]


# ---------------------------------------------------------------- holders()


def holders(
    namespace: Mapping[str, Any],
    *,
    outputs: Mapping[int, Any] | None = None,
    error: BaseException | None = None,
    internals: Sequence[Internal] = (),
    ignore: Sequence[object] = (),
    device: str | None = None,
    memory: DeviceMemory | None = None,
    own_modules: Sequence[str] = OWN_MODULES,
    scan: bool = True,
    time_limit: float | None = None,
) -> Holders:
    """Per device, the live tensors grouped by what keeps them alive, largest first.

    ``namespace``: the user's variables; ``outputs``: the output history (IPython's ``Out``); ``error``: the last
    exception (``sys.last_exc`` and friends are read too); ``internals``: the front end's own hidden references;
    ``ignore``: objects never walked (the shell, the kernel). ``scan=False`` skips finding every live tensor (one
    pass over the whole gc heap, the cost that grows with the program, not with the tensors): the unattributed rest
    is then the allocator's figure minus what was attributed, where the device has one. ``time_limit`` (seconds):
    roots not walked by then are named in ``notes`` and their tensors stay unattributed. ``%hw holders [--device DEV]``.
    """
    started = time.perf_counter()
    torch = sys.modules.get("torch")
    memory = memory if memory is not None else TorchMemory()
    if torch is None:
        return Holders((), (), time.perf_counter() - started, 0, ("torch is not imported: no tensors",))
    # The walk makes tens of thousands of small containers: left on, the cyclic gc would run full collections
    # over the whole heap in the middle of it (measured: most of the time of a walk over 10,000 tensors).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _holders(
            torch,
            namespace,
            outputs=outputs,
            error=error,
            internals=internals,
            ignore=ignore,
            device=device,
            memory=memory,
            own_modules=own_modules,
            scan=scan,
            started=started,
            deadline=None if time_limit is None else started + time_limit,
        )
    finally:
        if enabled:
            gc.enable()


def _holders(
    torch: Any,
    namespace: Mapping[str, Any],
    *,
    outputs: Mapping[int, Any] | None,
    error: BaseException | None,
    internals: Sequence[Internal],
    ignore: Sequence[object],
    device: str | None,
    memory: DeviceMemory,
    own_modules: Sequence[str],
    scan: bool,
    started: float,
    deadline: float | None,
) -> Holders:
    errors = errors_of(error, internals)
    skip = {id(namespace), id(outputs), id(sys.modules), *map(id, ignore), *map(id, errors)}
    skip |= {id(sys.stdout), id(sys.stderr)}
    walker = Walker(torch, skip, deadline)
    # The scan first, while the heap holds only the program's objects (the walk makes its own): every tensor it finds
    # is read in one batch, and the walk reads none of them again.
    found = walker.find_all() if scan else set()
    roots = _namespace_roots(namespace, outputs) + _output_roots(namespace, outputs, internals)
    roots += _traceback_roots(errors)
    holder_keys: list[set[Key]] = []
    all_holders: list[Holder] = []
    notes: list[str] = []
    entries: list[list[object]] = []
    directs: list[set[Key]] = []
    walked: list[_Root] = []
    for root in _with_own(roots, own_modules, walker):
        try:
            direct, nodes = walker.reach(root.values)
        except WalkStopped as stop:
            notes.append(f"stopped at {root.holder.label} ({stop}); the holders after it not walked, their tensors "
                         "unattributed")  # fmt: skip
            break
        _assign(holder_keys, all_holders, root.holder, direct)
        if nodes:
            entries.append(nodes)
            directs.append(direct)
            walked.append(root)
    _assign_graphs(holder_keys, all_holders, walker.graphs(entries), directs, walked)
    devices, build = _report(walker, found, holder_keys, all_holders, memory=memory, device=device, scan=scan)
    seconds = time.perf_counter() - started
    return Holders(devices, tuple(all_holders), seconds, walker.visited, tuple(notes), build)


def _with_own(roots: list[_Root], own_modules: Sequence[str], walker: Walker) -> Iterator[_Root]:
    """The roots, then nbhw's own module globals: walked one by one only where all of them together reach a tensor."""
    yield from roots
    own = _module_globals(_own_modules(own_modules))
    try:
        direct, nodes = walker.reach([value for _, _, value in own])
    except WalkStopped:
        direct, nodes = {0}, []  # the roots' own walks say where it stopped
    if direct or nodes:
        yield from (_Root(Holder(f"{module}.{attr}", "nbhw"), [value]) for module, attr, value in own)


def _assign_graphs(
    holder_keys: list[set[Key]],
    all_holders: list[Holder],
    masks: dict[Key, int],
    directs: list[set[Key]],
    roots: list[_Root],
) -> None:
    """Each root's autograd graph as a holder: what the graph keeps and the root does not hold directly."""
    by_mask: dict[int, list[Key]] = {}
    for key, mask in masks.items():
        by_mask.setdefault(mask, []).append(key)
    per_root: list[set[Key]] = [set() for _ in roots]
    for mask, same in by_mask.items():  # the roots sharing a graph share its masks: a few, however many storages
        rest = mask
        while rest:
            low = rest & -rest
            per_root[low.bit_length() - 1].update(same)
            rest ^= low
    for root, keys, direct in zip(roots, per_root, directs, strict=True):
        label = root.holder.label
        _assign(holder_keys, all_holders, Holder(f"autograd graph of {label}", "graph", of=label), keys - direct)


def _assign(holder_keys: list[set[Key]], all_holders: list[Holder], holder: Holder, keys: set[Key]) -> None:
    if keys:
        all_holders.append(holder)
        holder_keys.append(keys)


def _groups(holder_keys: Sequence[set[Key]]) -> dict[tuple[int, ...], set[Key]]:
    """The storages by the exact set of holders that keep them (indices into the holders), in set operations.

    Most storages have one holder: those several holders share are split, holder by holder, into parts kept by the
    same holders (a set operation per part, never a step per storage: a model and its optimizer share 4,000).
    """
    seen: set[Key] = set()
    shared: set[Key] = set()
    for keys in holder_keys:
        shared |= keys & seen
        seen |= keys
    groups: dict[tuple[int, ...], set[Key]] = {}
    for i, keys in enumerate(holder_keys):
        alone = keys - shared if shared else keys
        if alone:
            groups[(i,)] = alone
    parts: dict[tuple[int, ...], set[Key]] = {(): shared} if shared else {}
    for i, keys in enumerate(holder_keys):
        if not parts or keys.isdisjoint(shared):
            continue
        split: dict[tuple[int, ...], set[Key]] = {}
        for by, part in parts.items():
            inside = part & keys
            if inside:
                split[(*by, i)] = inside
            if len(inside) < len(part):
                split[by] = part - inside if inside else part
        parts = split
    groups.update(parts)
    return groups


def _report(
    walker: Walker,
    found: set[Key],
    holder_keys: Sequence[set[Key]],
    all_holders: list[Holder],
    *,
    memory: DeviceMemory,
    device: str | None,
    scan: bool,
) -> tuple[tuple[DeviceHolders, ...], Callable[[], dict[Storage, tuple[int, frozenset[int]]]]]:
    """Per device, the groups of exactly-the-same holders; and how to list every storage with its bytes and holders."""
    groups = _groups(holder_keys)
    loose = found.difference(*holder_keys)
    on = _devices_of(walker, [loose, *groups.values()])
    names = sorted(on | set(memory.devices()))
    if device is not None and device not in names:
        raise UserError(f"no tensors on {device!r}; devices with tensors: {', '.join(names) or 'none'}")
    out = tuple(
        _device_holders(
            name, groups, loose, walker, all_holders=all_holders, memory=memory, scan=scan, split=len(on) > 1
        )
        for name in ([device] if device else names)
    )
    sizes = walker.sizes

    def storages() -> dict[Storage, tuple[int, frozenset[int]]]:
        nobody: frozenset[int] = frozenset()
        listed = {where(k): (sizes[k], nobody) for k in loose}
        for by, keys in groups.items():
            owners = frozenset(by)
            listed.update((where(k), (sizes[k], owners)) for k in keys)
        return listed

    return out, storages


def _devices_of(walker: Walker, key_sets: Sequence[set[Key]]) -> set[str]:
    """The devices these storages are on (the walker's list when it read storages of one device only)."""
    if not any(key_sets):
        return set()
    if len(walker.devices) == 1:
        return set(walker.devices)
    return set(map(device_of, chain.from_iterable(key_sets)))


def _device_holders(
    name: str,
    groups: Mapping[tuple[int, ...], set[Key]],
    loose: set[Key],
    walker: Walker,
    *,
    all_holders: Sequence[Holder],
    memory: DeviceMemory,
    scan: bool,
    split: bool,
) -> DeviceHolders:
    size_of = walker.sizes.__getitem__
    ranked: list[Group] = []
    for by, every in groups.items():
        keys = on_device(every, name) if split else every
        if keys:
            ranked.append(Group(tuple(all_holders[i] for i in by), sum(map(size_of, keys)), len(keys), frozenset(by)))
    ranked.sort(key=lambda g: (-g.nbytes, g.label))
    here = on_device(loose, name) if split else loose
    largest = heapq.nlargest(3, here, key=size_of)
    described = walker.examples(largest) if largest else {}
    examples = tuple(described[k] for k in largest)
    allocated, reserved = memory.allocated(name), memory.reserved(name)
    unattributed = sum(map(size_of, here))
    counted: int | None = len(here)
    if not scan:  # not looked for: the allocator's figure says how much is left, where it keeps one
        attributed = sum(g.nbytes for g in ranked)
        unattributed = max(0, allocated - attributed) if allocated is not None else 0
        counted = None
    return DeviceHolders(name, tuple(ranked), unattributed, counted, examples, allocated, reserved)
