"""``nbhw.plan(task=...)``: one call for both plans, loading and generating (``task="infer"``, a
:class:`~nbhw.core.plan.load_plan.LoadPlan`) or fine-tuning (``task="train"``, a
:class:`~nbhw.core.train.train_plan.TrainPlan`), with the words of :mod:`nbhw.core.train.tasks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbhw.core.argument import checked, given, signature
from nbhw.core.plan import load_plan
from nbhw.core.plan.arguments import PLAN_ARGUMENTS
from nbhw.core.train import train_plan
from nbhw.core.train.tasks import TASK_ARGUMENTS, TRAIN_ONLY, TaskArgs, check_names


def plan(
    model: str | Path | None = None, *, task: str = "infer", offline: bool = False, **values: Any
) -> load_plan.LoadPlan | train_plan.TrainPlan:
    """Plan ``from_pretrained`` and ``generate`` (``task="infer"``: :func:`nbhw.core.plan.load_plan.plan`), or a
    fine-tuning step (``task="train"``: :func:`nbhw.core.train.train_plan.train_plan`), with the same words.

    >>> nbhw.plan("Qwen/Qwen3-0.6B", dtype="bfloat16", context="8k")                      # doctest: +SKIP
    >>> nbhw.plan("Qwen/Qwen3-8B", task="train", method="qlora", target="T4", batch=4)   # doctest: +SKIP
    """
    found: TaskArgs = checked(TaskArgs, {"task": task})
    check_names(found.task, values)
    if found.task == "train":
        return train_plan.train_plan(model, offline=offline, **values)
    return load_plan.plan(model, offline=offline, **values)


plan.__signature__ = signature(  # type: ignore[attr-defined]
    plan, TASK_ARGUMENTS, PLAN_ARGUMENTS, TRAIN_ONLY, keep=("model", "offline")
)


def from_words(args: Any) -> load_plan.LoadPlan | train_plan.TrainPlan:
    """A plan from the parsed words of ``%hw load`` / ``python -m nbhw load`` (a switch left off is not given)."""
    values = {name: value for group in (PLAN_ARGUMENTS, TRAIN_ONLY)
              for name, value in given(args, group).items() if value is not False}  # fmt: skip
    return plan(args.model, task=getattr(args, "task", None) or "infer", offline=args.offline, **values)
