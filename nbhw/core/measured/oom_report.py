"""The short report below a cell that ran out of memory: what was held, the allocation that failed, what would fit.

Built only after :func:`nbhw.core.memory.out_of_memory.is_out_of_memory` said yes (the front end's cell hook).
"What was held" is the attribution of :func:`nbhw.core.memory.holders.holders` after the error unwound: temporaries
no frame kept are gone by then; the allocator's own figure at the failure comes from its message, shown beside it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbhw.core.measured.fixes import (
    RUN_PLANNER_PENDING,
    FitRequest,
    Fix,
    Planner,
    free_traceback_fix,
    run_planner_fixes,
)
from nbhw.core.measured.run_asked import asked_run
from nbhw.core.memory.allocator import DeviceMemory, TorchMemory
from nbhw.core.memory.holders import DeviceHolders, Holders, Internal, holders
from nbhw.core.memory.out_of_memory import FailedAllocation, failed_allocation
from nbhw.core.render import STYLE, Shown, esc, size

SHOWN_GROUPS = 6
# Each storage counts under the holder kind that keeps it longest: what stays once the traceback is cleared.
LONGEST = ("variable", "output", "nbhw", "graph", "traceback")


@dataclass(frozen=True)
class OutOfMemory(Shown):
    """The report below a cell that ran out of memory; its planner request and fixes are kept for code to read."""

    error: str  # "OutOfMemoryError: CUDA out of memory"
    failed: FailedAllocation
    device: str | None  # where the holders were counted
    held: DeviceHolders | None
    traceback_bytes: int  # free(traceback=True) gives this back on that device
    fixes: tuple[Fix, ...]
    fixes_note: str  # what the planner said when it proposed nothing
    request: FitRequest | None

    def text(self) -> str:
        lines = [self._headline()]
        f = self.failed
        if f.allocated is not None:
            lines.append(f"  at the failure the allocator had {size(f.allocated)} allocated of {size(f.capacity)}")
        lines += self._held_lines()
        lines.append("  smallest changes that would have fit:")
        lines += [f"    {_fix_line(x)}" for x in self.fixes]
        if self.fixes_note:
            lines.append(f"    {self.fixes_note}")
        return "\n".join(lines)

    def _headline(self) -> str:
        f = self.failed
        if f.nbytes is None:
            tried = "of unknown size"
        elif f.exact:
            tried = f"{size(f.nbytes)} ({f.nbytes:,} bytes)"
        else:  # two decimals of the allocator's (rounded) size: within 0.5 % of the figure it printed
            tried = f"{f.printed} ({f.nbytes:,} bytes, as printed)"
        return f"nbhw: out of memory on {f.device or 'an unknown device'}: the failed allocation was {tried}"

    def _held_lines(self) -> list[str]:
        if self.held is None:
            return [f"  no tensors found on {self.device or 'that device'}"]
        lines = [f"  held now on {self.device}, largest first:"]
        groups = self.held.groups
        lines += [f"    {size(g.nbytes):>10}  {g.label} ({g.kind})" for g in groups[:SHOWN_GROUPS]]
        if len(groups) > SHOWN_GROUPS:
            rest = groups[SHOWN_GROUPS:]
            lines.append(f"    {size(sum(g.nbytes for g in rest)):>10}  {len(rest)} more groups (nbhw.holders())")
        if self.held.unattributed:
            lines.append(f"    {size(self.held.unattributed):>10}  unattributed")
        return lines

    def html(self) -> str:
        return f"{STYLE}<div class='nbhw'><pre class='nbhw-oom'>{esc(self.text())}</pre></div>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "failed": vars(self.failed),
            "device": self.device,
            "held": [{"holders": g.label, "kind": g.kind, "bytes": g.nbytes} for g in self.held.groups]
            if self.held
            else [],
            "traceback_bytes": self.traceback_bytes,
            "fixes": [vars(x) for x in self.fixes],
            "fixes_note": self.fixes_note,
        }


def _fix_line(fix: Fix) -> str:
    if fix.peak_bytes is None:
        return f"{fix.change}: gives back {size(fix.frees)} now ({fix.by})  {fix.code}"
    verdict = "fits" if fix.fits else "does not fit"
    return f"{fix.change}: peak {size(fix.peak_bytes)}, {verdict} ({fix.by})  {fix.code}"


def oom_report(
    exc: BaseException,
    namespace: Mapping[str, Any],
    *,
    outputs: Mapping[int, Any] | None = None,
    internals: Sequence[Internal] = (),
    ignore: Sequence[object] = (),
    device: str | None = None,
    memory: DeviceMemory | None = None,
    planner: Planner = run_planner_fixes,
    cell: str = "",
    plan: object | None = None,
    scan: bool | None = None,
) -> OutOfMemory:
    """What was held when the cell ran out of memory, the failed size, and the fixes (the planner's and freeing).

    ``device``: where to count (default: the device the message names). ``scan=None``: look for every live tensor
    only where the device keeps no allocator counter (the scan is the part of the cost that grows with the whole
    program; with a counter, allocated minus attributed is the rest).
    """
    failed = failed_allocation(exc)
    memory = memory if memory is not None else TorchMemory()
    where = device or failed.device
    if scan is None:
        scan = where is None or memory.allocated(where) is None
    report = holders(
        namespace, outputs=outputs, error=exc, internals=internals, ignore=ignore, memory=memory, scan=scan
    )
    where = _device_named(where, report)
    held = next((d for d in report.devices if d.device == where), None)
    traceback_bytes = _traceback_bytes(report, where)
    line = f"{type(exc).__name__}: {str(exc).split('. ', 1)[0]}"
    if where is None:
        return OutOfMemory(line, failed, where, held, 0, (), "the message names no device to count on", None)
    request = FitRequest(
        where,
        failed.capacity,
        failed,
        _by_kind(report, where),
        _models(namespace),
        cell,
        plan,
        traceback_bytes,
        asked_run(exc),
    )
    fixes, note = _fixes(planner, request)
    return OutOfMemory(line, failed, where, held, traceback_bytes, fixes, note, request)


def _fixes(planner: Planner, request: FitRequest) -> tuple[tuple[Fix, ...], str]:
    """The planner's fixes, then freeing the traceback; a failing planner is named, never raised."""
    note = ""
    try:
        planned = tuple(planner(request))
    except Exception as error:  # the report must still show
        planned, note = (), f"the run planner failed: {type(error).__name__}: {error}"
    if not planned and not note:
        note = RUN_PLANNER_PENDING
    freeing = free_traceback_fix(request)
    return planned + ((freeing,) if freeing else ()), note


def _device_named(where: str | None, report: Holders) -> str | None:
    """The report's name for the failed device: 'mps' (the message) is 'mps:0' (the storages), 'cuda' is 'cuda:0'."""
    names = report.names()
    if where is None or where in names or ":" in where:
        return where
    same = [n for n in names if n.partition(":")[0] == where]
    return same[0] if len(same) == 1 else f"{where}:0"


def _traceback_bytes(report: Holders, device: str | None) -> int:
    if device is None:
        return 0
    frames = {i for i, h in enumerate(report.holders) if h.kind == "traceback"}
    labels = {report.holders[i].label for i in frames}
    frames |= {i for i, h in enumerate(report.holders) if h.kind == "graph" and h.of in labels}
    return report.freed_if(frames).get(device, 0)


def _by_kind(report: Holders, device: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in report.devices:
        if d.device != device:
            continue
        for g in d.groups:
            kinds = {h.kind for h in g.holders}
            kind = next(k for k in LONGEST if k in kinds)
            out[kind] = out.get(kind, 0) + g.nbytes
        if d.unattributed_storages:  # found by the scan, held by nothing walked
            out["unattributed"] = d.unattributed
    return out


def _models(namespace: Mapping[str, Any]) -> list[str]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    module = torch.nn.Module
    return [n for n, v in namespace.items() if isinstance(v, module) and not n.startswith("_")]
