"""``nbhw.plan(task=...)``: one call for the three plans, loading and generating (``task="infer"``, a
:class:`~nbhw.core.plan.load_plan.LoadPlan`), fine-tuning (``task="train"``, a
:class:`~nbhw.core.train.train_plan.TrainPlan`) or serving with continuous batching (``task="serve"``, a
:class:`~nbhw.core.serve.serve_plan.ServePlan`), with the words of :mod:`nbhw.core.tasks`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbhw.core.argument import checked, given, signature
from nbhw.core.plan import load_plan
from nbhw.core.plan.arguments import PLAN_ARGUMENTS
from nbhw.core.serve import serve_plan
from nbhw.core.tasks import SERVE_ONLY, TASK_ARGUMENTS, TRAIN_ONLY, TaskArgs, check_names
from nbhw.core.train import train_plan

Plan = load_plan.LoadPlan | train_plan.TrainPlan | serve_plan.ServePlan


def plan(model: str | Path | None = None, *, task: str = "infer", offline: bool = False, **values: Any) -> Plan:
    """Plan ``from_pretrained`` and ``generate`` (``task="infer"``: :func:`nbhw.core.plan.load_plan.plan`), a
    fine-tuning step (``task="train"``: :func:`nbhw.core.train.train_plan.train_plan`) or serving with continuous
    batching (``task="serve"``: :func:`nbhw.core.serve.serve_plan.serve_plan`), with the same words.

    >>> nbhw.plan("Qwen/Qwen3-0.6B", dtype="bfloat16", context="8k")                      # doctest: +SKIP
    >>> nbhw.plan("Qwen/Qwen3-8B", task="train", method="qlora", target="T4", batch=4)   # doctest: +SKIP
    >>> nbhw.plan("Qwen/Qwen3-8B", task="serve", target="L4", context="8k")              # doctest: +SKIP
    """
    found: TaskArgs = checked(TaskArgs, {"task": task})
    check_names(found.task, values)
    if found.task == "train":
        return train_plan.train_plan(model, offline=offline, **values)
    if found.task == "serve":
        return serve_plan.serve_plan(model, offline=offline, **values)
    return load_plan.plan(model, offline=offline, **values)


plan.__signature__ = signature(  # type: ignore[attr-defined]
    plan, TASK_ARGUMENTS, PLAN_ARGUMENTS, TRAIN_ONLY, SERVE_ONLY, keep=("model", "offline")
)


def from_words(args: Any) -> Plan:
    """A plan from the parsed words of ``%hw load`` / ``python -m nbhw load`` (a switch left off is not given)."""
    values = {name: value for group in (PLAN_ARGUMENTS, TRAIN_ONLY, SERVE_ONLY)
              for name, value in given(args, group).items() if value is not False}  # fmt: skip
    return plan(args.model, task=getattr(args, "task", None) or "infer", offline=args.offline, **values)
