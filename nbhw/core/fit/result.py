"""What both searches of ``nbhw.fit()`` return: the answer (an option and its plan), every option ranked ahead of
it with its plan's reason, the nearest changes when nothing fits, and how much of the space was planned."""

from __future__ import annotations

from typing import Any

from nbhw.core.render import Shown


class SearchResult(Shown):
    """``.plan`` (None when nothing fits), ``.option``, ``.code``, ``.rejected``, ``.nearest``, ``.planned``; each
    search's result (:class:`~nbhw.core.fit.solver.FitResult`, :class:`~nbhw.core.fit.train_search.TrainFitResult`)
    adds its headline and views."""

    def __init__(self, model: str, args: Any, search: Any, answer: Any, *, rejected: list[Any], nearest: list[Any],
                 seconds: float) -> None:  # fmt: skip
        self.model = model
        self.args = args
        self.search = search
        self.answer = answer
        self.rejected = rejected
        self.nearest = nearest
        self.seconds = seconds

    @property
    def plan(self) -> Any:
        """The answer's plan (a LoadPlan or a TrainPlan), None when nothing fits."""
        return None if self.answer is None else self.answer.plan

    @property
    def option(self) -> Any:
        return None if self.answer is None else self.answer.option

    @property
    def code(self) -> str | None:
        plan = self.plan
        return None if plan is None else str(plan.code)

    @property
    def planned(self) -> int:
        """How many options were planned (the rest of the space was never needed)."""
        return len(self.search.judged)

    def headline(self) -> str:
        raise NotImplementedError

    def nearest_lines(self) -> list[str]:
        """When nothing fits: the nearest changes that do, each with its plan's verdict."""
        if self.answer is not None:
            return []
        found = ["Nearest changes that fit" if self.nearest else "No change nbhw tries fits either"]
        return found + [f"  - {c.what}: {c.verdict}" for c in self.nearest]

    def head(self) -> list[str]:
        """The first lines of the text: the headline and how much was planned, in how long."""
        return [self.headline(), f"  planned {self.planned} of {len(self.search.options)} options in "
                f"{self.seconds:.2f} s", ""]  # fmt: skip
