"""The words of ``nbhw.plan(task=...)`` (:mod:`nbhw.core.task_plan`): one set for both plans, loading and
generating (``task="infer"``) or fine-tuning (``task="train"``). ``%hw load --task train`` and ``python -m nbhw load
--task train`` take the same words; ``%hw train`` stays the training plan's own command. Declarations only: the
command table imports them, and no planner.

The arguments are the two plans' own declarations: the load plan's, and the training plan's that the load plan
does not declare (:data:`TRAIN_ONLY`). Shared words (``context``, ``batch``, ``dtype``, ``target``) mean the same in
both; one that only the other task takes is a one-line mistake naming the task it is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nbhw.core.argument import argument, arguments
from nbhw.core.errors import UserError, one_of
from nbhw.core.plan.arguments import PLAN_ARGUMENTS
from nbhw.core.serve.arguments import SERVE_ARGUMENTS
from nbhw.core.train.arguments import TRAIN_ARGUMENTS

TASKS = ("infer", "train", "serve")
# What the Load tab's mode switch says for each task it has a mode for (the values are nbhw.plan()'s task words).
TASK_LABELS: dict[str, str] = {"infer": "Load / generate", "train": "Train", "serve": "Serve"}


def task_options() -> list[tuple[str, str]]:
    """The mode switch's (label, task) pairs, in the order of TASKS."""
    return [(TASK_LABELS[task], task) for task in TASKS if task in TASK_LABELS]


def check_task(value: Any) -> str:
    """What the plan is for: loading and generating ("infer"), fine-tuning ("train") or serving with continuous
    batching ("serve")."""
    if value in TASKS:
        return str(value)
    raise one_of("task", value, TASKS)


# The task argument of nbhw.plan() and nbhw.fit(), declared once (each gives its own help).
TASK: dict[str, Any] = {"default": "infer", "choices": TASKS, "check": check_task, "control": None}


@dataclass(frozen=True)
class TaskArgs:
    task: str = argument(**TASK, help="what the plan is for: infer (from_pretrained and generate), train "
                         "(a fine-tuning step: the training plan's words apply) or serve (continuous batching: "
                         "the serving plan's words apply)")  # fmt: skip


TASK_ARGUMENTS = arguments(TaskArgs)
PLAN_NAMES = frozenset(a.name for a in PLAN_ARGUMENTS)
TRAIN_NAMES = frozenset(a.name for a in TRAIN_ARGUMENTS)
# The training plan's arguments the load plan does not declare: method, devices, strategy, optimizer, lora_r, ...
TRAIN_ONLY = tuple(a for a in TRAIN_ARGUMENTS if a.name not in PLAN_NAMES)
SERVE_NAMES = frozenset(a.name for a in SERVE_ARGUMENTS)
# The serving plan's arguments neither other plan declares: prompt, answer, memory_percent, page_size, ...
SERVE_ONLY = tuple(a for a in SERVE_ARGUMENTS if a.name not in PLAN_NAMES | TRAIN_NAMES)


def check_names(task: str, names: Any) -> None:
    """A one-line UserError for the first argument that only another task takes."""
    if task == "serve":
        for name in names:
            if name not in SERVE_NAMES:
                raise UserError(f"{name} is not for task='serve'; it takes: {', '.join(sorted(SERVE_NAMES))}")
        return
    serve_only = {a.name for a in SERVE_ONLY}
    for name in names:
        if name in serve_only:
            raise UserError(f"{name} is for task='serve'; task={task!r} takes other words (see help)")
        if task == "train" and name in PLAN_NAMES and name not in TRAIN_NAMES:
            raise UserError(f"{name} is for task='infer'; task='train' takes: {', '.join(sorted(TRAIN_NAMES))}")
        if task != "train" and name in TRAIN_NAMES and name not in PLAN_NAMES:
            raise UserError(f"{name} is for task='train'; task={task!r} takes: {', '.join(sorted(PLAN_NAMES))}")
