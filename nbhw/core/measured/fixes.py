"""The smallest changes that would have fit after an out-of-memory error: what the report asks, and who answers.

The report hands a :class:`FitRequest` to a planner (any callable returning :class:`Fix` es). Two answer:
:func:`free_traceback_fix`, from the attribution (the bytes only the last error's traceback keeps), and
:func:`run_planner_fixes`, the run planner's: when the error happened inside a transformers model's ``generate()``
(:mod:`nbhw.core.measured.run_asked` reads which run from the traceback), a shorter context, a smaller batch and
offloading to the CPU, each planned by ``nbhw.plan`` (a dry run of that model's generate() on the meta device) against
what the device could give torch at the failure, with its projected peak. Elsewhere (a training step, a plain
forward) it answers nothing and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nbhw.core.errors import UserError
from nbhw.core.measured.loaded import stored_parts
from nbhw.core.measured.run_asked import AskedRun
from nbhw.core.memory.out_of_memory import FailedAllocation
from nbhw.core.plan.load_plan import LoadPlan, plan
from nbhw.core.render import size

RUN_PLANNER_PENDING = (
    "a shorter context or batch, offloading: projected only for a transformers model's generate() (this error "
    "happened elsewhere, or before generate() had prepared its inputs)"
)


@dataclass(frozen=True)
class FitRequest:
    """What a planner needs to find the smallest changes that would have fit."""

    device: str
    capacity: int | None  # the device's total memory, from the allocator's message
    failed: FailedAllocation
    held: Mapping[str, int]  # bytes on the device under the holder kind that keeps them longest (variable > ...)
    models: Sequence[str]  # names of the models alive in the namespace
    cell: str  # the failing cell's source (which call ran out: generate, a training step, from_pretrained)
    plan: object | None  # nbhw's plan when nbhw wrote the cell (its model, context, batch, task, method)
    traceback_bytes: int  # what clearing the traceback alone gives back on the device
    run: AskedRun | None = None  # the generate() call it happened in, read from the traceback


@dataclass(frozen=True)
class Fix:
    """One change and its bytes: a projected peak (the run planner's, never a rule of thumb) or bytes given back."""

    change: str  # "context 32768 -> 16384", "quantization bitsandbytes 4-bit", "free the last error's traceback"
    code: str  # the changed call or arguments, ready to paste
    peak_bytes: int | None = None  # the projected peak on the device; None for a fix that only gives memory back
    fits: bool | None = None  # whether that peak fits the device; None when there is no peak to compare
    frees: int = 0  # bytes it gives back now
    by: str = "the run planner"  # where the figure comes from


Planner = Callable[[FitRequest], Sequence[Fix]]


def run_planner_fixes(request: FitRequest) -> tuple[Fix, ...]:
    """The run planner's changes that would have fit ``request``'s generate() call, each with its projected peak.

    The budget is what the device could give torch at the failure (allocated + reserved but unused + free, from the
    allocator's message: the CUDA context is already outside it, so the plans add no reserve), less what other
    variables hold there. The traceback's bytes are counted as given back (the report's last fix says how).
    """
    asked, budget = request.run, _run_budget(request)
    if asked is None or budget is None:
        return ()
    try:
        now = _plan(asked, request.device, budget)
    except UserError:
        return ()  # its config can't be read here (a Hub id while offline): nothing to project
    return tuple(f for f in (_shorter(asked, now, request, budget), _fewer(asked, now, request, budget),
                             _offload(asked, request, budget)) if f is not None)  # fmt: skip


def _usable(failed: FailedAllocation) -> int | None:
    if failed.allocated is None or failed.free is None:
        return failed.capacity
    found = failed.allocated + failed.free + (failed.reserved_unused or 0)
    return found if failed.capacity is None else min(found, failed.capacity)


def _model_bytes(model: object, device: str) -> int:
    seen: dict[int, int] = {}
    tensors = (*model.parameters(), *model.buffers())  # type: ignore[attr-defined]
    for t in (part for tensor in tensors for part in stored_parts(tensor)):
        if str(t.device) == device or (device == "cpu" and t.device.type == "cpu"):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _run_budget(request: FitRequest) -> int | None:
    """What the model's run may use on the device: the usable bytes less what the rest of the notebook holds."""
    usable = _usable(request.failed)
    if usable is None or request.run is None:
        return None
    held = sum(v for k, v in request.held.items() if k != "traceback")
    others = max(0, held - _model_bytes(request.run.model, request.device))
    return usable - others


def _place(device: str) -> tuple[int | str, int | str]:
    """(device_map, max_memory key) for the failed device: "cuda:1" -> (1, 1), "cpu" -> ("cpu", "cpu")."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return "cpu", "cpu"
    return (int(index), int(index)) if index.isdigit() else (0, 0)


def _plan(asked: AskedRun, device: str, budget: int, **changes: object) -> LoadPlan:
    device_map, key = _place(device)
    words: dict[str, object] = {
        "dtype": asked.dtype or "auto", "device_map": device_map, "max_memory": {key: budget},
        "context": asked.context, "batch": asked.batch, "reserve": 0, "offline": True,
    }  # fmt: skip
    return plan(asked.source, **(words | changes))  # type: ignore[arg-type]


def _peak(found: LoadPlan, device: str) -> int | None:
    """The device's projected peak in a plan (weights, cache and activations at the run's worst moment)."""
    placement = found.placement
    if placement is None:
        return None
    key = _place(device)[1]
    share = next((d for d in placement.devices if d.key == key), None)
    return None if share is None else share.peak_bytes


def _fix(change: str, code: str, found: LoadPlan, request: FitRequest, budget: int) -> Fix | None:
    peak = _peak(found, request.device)
    if peak is None:
        return None
    held_by_others = (_usable(request.failed) or budget) - budget
    return Fix(change, code, peak + held_by_others, peak <= budget)  # the device's peak, the notebook's rest included


def _shorter(asked: AskedRun, now: LoadPlan, request: FitRequest, budget: int) -> Fix | None:
    most = now.max_context
    if most is None or most >= asked.context:
        return None
    if most <= asked.prompt:
        if most < 2:
            return None
        code = f"a prompt of at most {most - 1:,} tokens and max_new_tokens=1"
        return _fix(f"prompt {asked.prompt:,} -> {most - 1:,} tokens", code, _plan(asked, request.device, budget,
                    context=most), request, budget)  # fmt: skip
    code = f"max_new_tokens={most - asked.prompt}"
    found = _plan(asked, request.device, budget, context=most)
    return _fix(f"context {asked.context:,} -> {most:,} tokens", code, found, request, budget)


def _fewer(asked: AskedRun, now: LoadPlan, request: FitRequest, budget: int) -> Fix | None:
    most = now.max_batch
    if most is None or not 1 <= most < asked.batch:
        return None
    found = _plan(asked, request.device, budget, batch=most)
    code = f"generate {most} sequence{'s' if most > 1 else ''} at a time"
    return _fix(f"batch {asked.batch} -> {most}", code, found, request, budget)


def _offload(asked: AskedRun, request: FitRequest, budget: int) -> Fix | None:
    """Layers the device can't hold on the CPU (accelerate's hooks run them there): accelerators only."""
    device_map, key = _place(request.device)
    if device_map == "cpu":
        return None
    found = _plan(asked, request.device, budget, device_map="auto", max_memory={key: budget, "cpu": "2TiB"})
    code = f'device_map="auto", max_memory={{{key!r}: "{size(budget)}", "cpu": ...}}'
    return _fix("offload the layers that don't fit to the CPU (slow)", code, found, request, budget)


def free_traceback_fix(request: FitRequest) -> Fix | None:
    """Free what the last error's traceback now holds: its bytes, counted by the attribution."""
    if request.traceback_bytes <= 0:
        return None
    return Fix(
        "free what the last error's traceback holds",
        "nbhw.free(traceback=True)",
        frees=request.traceback_bytes,
        by="attribution",
    )
