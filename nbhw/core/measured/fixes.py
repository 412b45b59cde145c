"""The smallest changes that would have fit after an out-of-memory error: what the report asks, and who answers.

The report hands a :class:`FitRequest` to a planner (any callable returning :class:`Fix` es). Two answer today:
:func:`free_traceback_fix`, from the attribution (the bytes only the last error's traceback keeps), and
:func:`run_planner_fixes`, the run planner's slot (issue 16: a shorter context or batch, offloading, a quantization
method that runs here, gradient checkpointing for training, each with its projected peak). The run planner
(``nbhw.core.plan.run``) reached main after this report was built and is not connected to the slot yet, so the slot
answers nothing and the report says so; it is filled where it is defined, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nbhw.core.memory.out_of_memory import FailedAllocation

RUN_PLANNER_PENDING = (
    "a shorter context or batch, offloading, quantization, gradient checkpointing: not projected yet "
    "(the run planner is not connected to this report yet)"
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
    """The run planner's changes that would have fit ``request``, with their projected peaks: none yet.

    To be filled from the run planner (``nbhw.core.plan.run``: projected bytes at a given context and batch); until
    it is connected the report shows :data:`RUN_PLANNER_PENDING` in their place.
    """
    return ()


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
