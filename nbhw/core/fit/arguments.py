"""The arguments of ``nbhw.fit()`` beyond a plan's own: what is run, and how far the search may go.

The plan's arguments (:data:`nbhw.core.plan.arguments.PLAN_ARGUMENTS`) are taken too: one you give is pinned (the
search keeps it), and ``context``, ``batch``, ``max_memory`` and ``reserve`` say what must fit where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbhw.core.argument import argument, arguments, checked
from nbhw.core.errors import UserError, one_of

TASKS = ("infer",)  # "train" arrives with the training planner


def check_task(value: Any) -> str:
    """What the plan is for: generating ("infer")."""
    if value in TASKS:
        return str(value)
    raise one_of("task", value, TASKS)


def check_method(value: Any) -> str | None:
    """A training method (LoRA, QLoRA, full): only for task="train"."""
    if value is None:
        return None
    raise UserError(f"method {value!r} is for task='train'; valid tasks here: {', '.join(TASKS)} (no method)")


@dataclass(frozen=True)
class FitArgs:
    """What the search is for and how far it may go. Each field declares one argument."""

    task: str = argument(
        default="infer", choices=TASKS, check=check_task, help="what must fit: infer (generate at --context)"
    )
    method: str | None = argument(check=check_method, help="training method (task=train only)")
    accelerators_only: bool = argument(
        default=False, kind="switch", check=bool,
        help="only plans with every layer on an accelerator (no CPU or disk offload)",
    )  # fmt: skip


FIT_ARGUMENTS = arguments(FitArgs)


def fit_args(**values: Any) -> FitArgs:
    """Check every argument; the first mistake raises a one-line UserError."""
    found: FitArgs = checked(FitArgs, values)
    return found
