"""The arguments of ``nbhw.fit()`` beyond a plan's own: what is run, and how far the search may go.

The plan's arguments (:data:`nbhw.core.plan.arguments.PLAN_ARGUMENTS`) are taken too: one you give is pinned (the
search keeps it), and ``context``, ``batch``, ``max_memory`` and ``reserve`` say what must fit where. For
``task="train"`` the training plan's arguments (:data:`nbhw.core.train.arguments.TRAIN_ARGUMENTS`) are taken instead:
``context``, ``batch`` (rows per device per optimizer step), ``target`` or ``device_memory`` and ``devices``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbhw.core import tasks
from nbhw.core.argument import argument, arguments, checked
from nbhw.core.errors import UserError, one_of
from nbhw.core.tasks import TASK
from nbhw.core.train.arguments import METHODS

FIT_TASKS = ("infer", "train")  # a serving fit is not searched yet: nbhw.plan(task="serve") answers one setup


def check_fit_task(value: Any) -> str:
    if value in FIT_TASKS:
        return str(value)
    raise one_of("task", value, FIT_TASKS)


def check_method(value: Any) -> str | None:
    """A training method (full, LoRA, QLoRA), for task="train"; None: each is searched."""
    if value is None or value in METHODS:
        return value  # type: ignore[no-any-return]
    raise one_of("method", value, METHODS)


@dataclass(frozen=True)
class FitArgs:
    """What the search is for and how far it may go. Each field declares one argument."""

    task: str = argument(
        **{**TASK, "choices": FIT_TASKS, "check": check_fit_task},
        help="what must fit: infer (from_pretrained and generate at --context) or train (a fine-tuning step)",
    )
    method: str | None = argument(
        choices=METHODS, check=check_method, help="task=train: full, lora or qlora (default: each, in that order)"
    )
    accelerators_only: bool = argument(
        default=False, kind="switch", check=bool,
        help="only plans with every layer on an accelerator (no CPU or disk offload)",
    )  # fmt: skip


FIT_ARGUMENTS = arguments(FitArgs)
# The training plan's arguments that neither fit nor a load plan declares (task="train" only): devices, strategy, ...
TRAIN_ONLY = tuple(a for a in tasks.TRAIN_ONLY if a.name not in {b.name for b in FIT_ARGUMENTS})


def fit_args(**values: Any) -> FitArgs:
    """Check every argument; the first mistake raises a one-line UserError."""
    found: FitArgs = checked(FitArgs, values)
    if found.method is not None and found.task != "train":
        raise UserError(f"method {found.method!r} is for task='train'; task={found.task!r} searches no method")
    if found.accelerators_only and found.task == "train":
        raise UserError("accelerators_only is for task='infer'; for training, strategy='ddp' / 'fsdp2' / 'zero3' "
                        "keeps the optimizer state on the devices")  # fmt: skip
    return found
