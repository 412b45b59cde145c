"""``nbhw.fit()``: search the options of :mod:`nbhw.core.fit.options` in their documented order and return the
first that fits, every option ranked ahead of it with the reason its own plan gives, and, when nothing fits, the
smallest changes that would.

Nothing is decided here: whether an option is refused, where its layers go and whether its run fits are the plan's
own answers (``check()``, ``weight_placement.kind``, ``run_fits``), and each rejection's reason is the plan's own
text (its problems, its weights-only verdict, its run verdict). Cheapest checks first: a plan's problems and its
weights-only placement (no dry run) before its run; plans are kept between calls, so a second search of the same
model and budget reuses every plan, build and dry run of the first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from nbhw.core import argument, render
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.fit.arguments import FIT_ARGUMENTS, TRAIN_ONLY, FitArgs, fit_args
from nbhw.core.fit.options import WHERE, WHERE_OF_KIND, Option, budget_for, memory_for, options
from nbhw.core.fit.result import SearchResult
from nbhw.core.fit.train_search import TrainFitResult, fit_training
from nbhw.core.hardware.targets import MAX_COUNT, Target
from nbhw.core.hf import meta_build
from nbhw.core.plan import for_target
from nbhw.core.plan.arguments import DISK, PLAN_ARGUMENTS, MemoryKey, plan_args
from nbhw.core.plan.load_plan import LoadPlan, plan
from nbhw.core.plan.placement import is_accelerator
from nbhw.core.tasks import check_names

PLAN_CACHE_SIZE = 16384  # a 70B search with its nearest changes plans about 10,000 options (most refused: small)
SHOWN_REJECTED = 12  # the text and HTML list the first ones (a run's reason may search the longest context)
_PLANS: Recent[LoadPlan] = Recent(PLAN_CACHE_SIZE)
_JUDGED: Recent[Judged] = Recent(PLAN_CACHE_SIZE)  # an option's answers, by its arguments as given (no parsing)
MOST_DEVICES = 64  # when nothing fits: accelerators like the largest one, up to this many, are tried


def clear_cache() -> None:
    """Forget every kept plan (benchmarks measure a cold search)."""
    _PLANS.clear()
    _JUDGED.clear()


def planned(model: str, values: dict[str, Any], offline: bool, base: LoadPlan | None = None) -> LoadPlan:
    """The plan of these arguments, kept: the same option asked again is the same plan (``base``: a plan of the
    same model whose machine read and config the new plan shares, read once for the whole search)."""
    args = plan_args(**values)

    def made() -> LoadPlan:
        if base is None:
            return LoadPlan(model, args, offline=offline)
        return LoadPlan(model, args, offline=offline, rows=base.rows, config=base.config)

    return _PLANS.get((model, repr(args), offline), made)


# ---------------------------------------------------------------- one option, judged by its own plan


@dataclass
class Judged:
    """An option and its plan's answers: its problems (devices a named budget has but this machine lacks left
    out) and where its weights-only placement puts the layers (an index of WHERE; None: not placed)."""

    option: Option
    plan: LoadPlan
    problems: list[str]
    where: int | None


def where_of(plan_: LoadPlan) -> int | None:
    """Where the plan's weights-only placement puts the layers (an index of WHERE; None: not placed)."""
    with meta_build.quiet():
        placement = plan_.weight_placement
    return WHERE_OF_KIND.get(placement.kind) if placement is not None else None


def judge(option: Option, plan_: LoadPlan, named_hardware: bool) -> Judged:
    with meta_build.quiet():
        problems = plan_.check()
    if plan_.quantization_refused:  # its method can't run there: no placement is made (the cost of most)
        return Judged(option, plan_, problems, None)
    with meta_build.quiet():
        absent = set(plan_.absent_devices) if named_hardware else set()
    problems = [p for p in problems if p not in absent]
    return Judged(option, plan_, problems, where_of(plan_))


@dataclass
class Rejected:
    """An option ranked ahead of the answer (or every option, when nothing fits), at one stage of WHERE, and the
    reason its plan gives: transformers' or nbhw's problems, where the weights go, or the run's verdict."""

    option: Option
    stage: int
    judged: Judged

    @property
    def plan(self) -> LoadPlan:
        return self.judged.plan

    @property
    def why(self) -> str:
        """refused (the plan has problems), placed (its layers are not where this stage wants them), tight (the run
        fits with less room than the allocator needs, and a later option has the room) or run (it does not fit)."""
        if self.judged.problems:
            return "refused"
        if self.judged.where != self.stage:
            return "placed"
        return "tight" if self.plan.run_tight else "run"

    @cached_property
    def reason(self) -> str:
        """The plan's own words (the run's verdict is computed on first read: it searches the largest context)."""
        if self.why == "refused":
            return "; ".join(self.judged.problems)
        placement = self.plan.weight_placement if self.why == "placed" else self.plan.placement
        return placement.verdict if placement is not None else "no placement"

    def to_dict(self) -> dict[str, Any]:
        return {"option": self.option.__dict__, "stage": WHERE[self.stage], "why": self.why, "reason": self.reason}


@dataclass
class Change:
    """A change of the request that makes something fit, and the plan that then fits."""

    what: str
    plan: LoadPlan

    @property
    def verdict(self) -> str:
        return self.plan.placement.verdict if self.plan.placement else ""

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.what, "verdict": self.plan.placement.verdict if self.plan.placement else None,
                "code": self.plan.code}  # fmt: skip


# ---------------------------------------------------------------- the search


@dataclass
class Search:
    """One search: the options in order, judged lazily (each plan once), and the stages of WHERE it may use."""

    model: str
    pinned: dict[str, Any]
    offline: bool
    budget: dict[MemoryKey, int] | None
    named_hardware: bool
    stages: tuple[int, ...]
    options: list[Option]
    base: LoadPlan | None = None
    judged: dict[int, Judged] = field(default_factory=dict)

    def values(self, option: Option) -> dict[str, Any]:
        values = {**self.pinned, "dtype": option.dtype, "quantization": option.quantization,
                  "attn_implementation": option.attn_implementation, "use_kernels": option.use_kernels,
                  "device_map": option.device_map, "cache_implementation": option.cache_implementation}  # fmt: skip
        if option.share < 1.0 and self.budget is not None:
            written = self.pinned.get("max_memory")  # the sizes as you wrote them, where a share keeps them
            values["max_memory"] = memory_for(option.share, self.budget, written)
            values["budget"] = budget_for(option.share, self.budget, written)
        return values

    def judge(self, index: int) -> Judged:
        if index not in self.judged:
            option, values = self.options[index], self.values(self.options[index])

            def judged() -> Judged:
                return judge(option, planned(self.model, values, self.offline, self.base), self.named_hardware)

            # the same arguments asked again (a search repeated, a later stage): the kept answers, not re-read
            key = (self.model, repr(values), self.offline, self.named_hardware)
            found = _JUDGED.get(key, judged)
            self.judged[index] = found if found.option == option else replace(found, option=option)
        return self.judged[index]

    def run(self) -> tuple[Judged | None, list[Rejected]]:
        """The first option that fits by the documented order, and every option ranked ahead of it. Within a stage
        an option that fits with room for the allocator beats one that is tight; a tight one is the answer only
        when nothing later in its stage has the room."""
        rejected: list[Rejected] = []
        first = self.stages[0]
        for stage in self.stages:
            tight: tuple[Judged, list[Rejected]] | None = None
            for index, option in enumerate(self.options):
                found = self.judge(index)
                if found.problems or found.where is None:
                    if stage == first:
                        rejected.append(Rejected(option, stage, found))
                    continue
                if found.where != stage:
                    if stage == first:  # at later stages it was judged at its own (or is worse still)
                        rejected.append(Rejected(option, stage, found))
                    continue
                with meta_build.quiet():
                    fits, is_tight = found.plan.run_fits, bool(found.plan.run_tight)
                if fits and not is_tight:
                    return found, rejected
                if fits and tight is None:
                    tight = (found, list(rejected))
                rejected.append(Rejected(option, stage, found))
            if tight is not None:
                return tight
        return None, rejected


def _accelerators(budget: dict[MemoryKey, int] | None) -> dict[int, int]:
    return {k: v for k, v in (budget or {}).items() if isinstance(k, int)}


def new_search(model: str, pinned: dict[str, Any], offline: bool, args: FitArgs, base: LoadPlan) -> Search:
    named = "max_memory" in pinned
    budget = base.args.max_memory_bytes if named else dict(base.placed.live.max_memory)
    # A catalog target's memory is the catalog's (max_memory can't be given beside it): searched whole, no shares.
    shared = any(is_accelerator(k) for k in budget or {}) and base.target is None
    stages = (0,) if args.accelerators_only else tuple(range(len(WHERE)))
    found = options(base.inputs.checkpoint_dtype, pinned, has_budget=shared)
    return Search(model, pinned, offline, budget, named or base.target is not None, stages, found, base)


# ---------------------------------------------------------------- when nothing fits


def _shorter(search: Search) -> Iterator[Change]:
    """The first option ranked whose run is over budget: the longest context its plan says fits."""
    for stage in search.stages:
        for index in range(len(search.options)):
            found = search.judged.get(index)
            if found is None or found.problems or found.where != stage:
                continue
            with meta_build.quiet():
                most = found.plan.max_context
            if most is not None and most >= 2:
                shorter = planned(
                    search.model, {**search.values(found.option), "context": most}, search.offline, search.base
                )
                yield Change(f"context {most:,} tokens instead of {found.plan.context:,}", shorter)
                return


def _device_counts(now: int) -> list[int]:
    """Accelerator counts tried when nothing fits: one more, then doubling, up to MOST_DEVICES."""
    counts, n = [now + 1], max(now, 1) * 2
    while n <= MOST_DEVICES:
        if n > counts[-1]:
            counts.append(n)
        n *= 2
    return counts


def _more_devices(search: Search, args: FitArgs) -> Iterator[Change]:
    """The first count of accelerators, each like the largest in the budget (one more, then doubling), with which
    some option fits (whole budgets only: the shares are for the budget you named)."""
    if search.base is not None and search.base.target is not None:
        yield from _more_cards(search, search.base.target)
        return
    accelerators = _accelerators(search.budget)
    if not accelerators or search.budget is None:
        return
    largest = max(accelerators.values())
    whole = [o for o in search.options if o.share == 1.0]
    for count in _device_counts(len(accelerators)):
        budget: dict[MemoryKey, int | str] = dict(search.budget)
        for i in range(count - len(accelerators)):
            budget[max(accelerators) + 1 + i] = largest
        pinned = {**search.pinned, "max_memory": budget}
        wider = Search(search.model, pinned, search.offline, plan_args(max_memory=budget).max_memory_bytes, True,
                       search.stages, whole, search.base)  # fmt: skip
        answer, _ = wider.run()
        if answer is not None:
            yield Change(f"{count} accelerators of {render.size(largest)} ({count - len(accelerators)} more)",
                         answer.plan)  # fmt: skip
            return


def _more_cards(search: Search, target: Target) -> Iterator[Change]:
    """For a catalog target: the first count of its cards (one more, then doubling) with which some option fits."""
    for cards in _device_counts(target.cards):
        if cards > MAX_COUNT:
            return
        more = Target(target.accelerator, cards)
        pinned = {**search.pinned, "target": more}
        base = plan(search.model, offline=search.offline, **pinned)
        wider = Search(search.model, pinned, search.offline, dict(base.placed.live.max_memory), True, search.stages,
                       search.options, base)  # fmt: skip
        answer, _ = wider.run()
        if answer is not None:
            yield Change(f"target {more.text!r} ({cards - target.cards} more)", answer.plan)
            return


def _installs(search: Search) -> Iterator[Change]:
    """The best option by the documented order (where the layers are, then its rank) among those refused only
    because a package is missing, whose run would fit once installed (where the layers go is read first: no dry run
    for an option on a later stage)."""
    missing = [found for _, found in sorted(search.judged.items())
               if found.problems and all("pip install" in p for p in found.problems)]  # fmt: skip
    for stage in search.stages:
        for found in missing:
            if where_of(found.plan) != stage:
                continue
            with meta_build.quiet():
                fits = found.plan.run_fits
            if fits:
                yield Change(f"{'; '.join(found.problems)} — then {found.option.words()}", found.plan)
                return


def nearest(search: Search, args: FitArgs) -> list[Change]:
    """The smallest changes that make something fit: a package installed, a shorter context, more devices."""
    return [*_installs(search), *_shorter(search), *_more_devices(search, args)]


# ---------------------------------------------------------------- the result


class FitResult(SearchResult):
    """The answer of ``nbhw.fit()``: ``.plan`` (a LoadPlan, None when nothing fits), ``.code``, ``.rejected``
    (every option ranked ahead of the answer, with its plan's reason) and ``.nearest`` (when nothing fits)."""

    def headline(self) -> str:
        if self.answer is None:
            return f"nbhw fit: nothing fits for {self.model!r} among {len(self.search.options)} options"
        where = WHERE[self.answer.where or 0]
        verdict = self.plan.placement.verdict if self.plan and self.plan.placement else ""
        return f"nbhw fit: {self.answer.option.words()} ({where}): {verdict}"

    def rejected_groups(self) -> tuple[list[tuple[int, list[Option], str]], int]:
        """The first SHOWN_REJECTED runs of rejections in a row with one stage and reason, and how many they hold
        (a run's reason is read only for those shown: it may search the longest context)."""
        groups: list[tuple[int, list[Option], str]] = []
        seen = 0
        for r in self.rejected:
            if groups and groups[-1][0] == r.stage and groups[-1][2] == r.reason:
                groups[-1][1].append(r.option)
            elif len(groups) == SHOWN_REJECTED:
                break
            else:
                groups.append((r.stage, [r.option], r.reason))
            seen += 1
        return groups, seen

    def text(self) -> str:
        lines = self.head()
        if self.code:
            lines += ["Code", *("    " + line if line else "" for line in self.code.splitlines()), ""]
        if self.rejected:
            lines.append(f"Rejected ({len(self.rejected)}, in the order tried; options in a row with one reason "
                         "are one line)")  # fmt: skip
            groups, seen = self.rejected_groups()
            for stage, options, reason in groups:
                more = f" and {len(options) - 1} more like it" if len(options) > 1 else ""
                lines.append(f"  - {WHERE[stage]}: {options[0].words()}{more}: {reason}")
            if seen < len(self.rejected):
                lines.append(f"  ... and {len(self.rejected) - seen} more (result.rejected has every reason)")
            lines.append("")
        lines += self.nearest_lines()
        return "\n".join(lines).rstrip() + "\n"

    def html(self) -> str:
        esc = render.esc
        parts = [f'<div class="nbhw-fit"><p><b>{esc(self.headline())}</b></p>']
        if self.code:
            parts.append(f'<pre class="nbhw-code">{esc(self.code)}</pre>')
        if self.rejected:
            groups, _ = self.rejected_groups()
            rows = [[WHERE[g], o[0].words() + (f" (+{len(o) - 1} like it)" if len(o) > 1 else ""), why]
                    for g, o, why in groups]  # fmt: skip
            parts.append("<p><b>Rejected</b></p>" + render.html_table(("stage", "option", "reason"), rows))
        if self.answer is None and self.nearest:
            items = "".join(f"<li>{esc(c.what)}</li>" for c in self.nearest)
            parts.append(f"<p><b>Nearest changes that fit</b></p><ul>{items}</ul>")
        return "".join(parts) + "</div>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "arguments": argument.to_dict(self.args),
            "fits": self.answer is not None, "option": None if self.option is None else self.option.__dict__,
            "where": None if self.answer is None else WHERE[self.answer.where or 0],
            "plan": None if self.plan is None else self.plan.to_dict(),
            "rejected": [r.to_dict() for r in self.rejected], "nearest": [c.to_dict() for c in self.nearest],
            "planned": self.planned, "options": len(self.search.options), "seconds": self.seconds,
        }  # fmt: skip


# ---------------------------------------------------------------- nbhw.fit()


def _pinned(values: dict[str, Any]) -> dict[str, Any]:
    """The plan arguments given, checked (a UserError names the first mistake)."""
    declared = {a.name for a in PLAN_ARGUMENTS}
    unknown = [n for n in values if n not in declared]
    check_names("infer", unknown)
    if unknown:
        valid = ", ".join([*(a.name for a in FIT_ARGUMENTS), *declared])
        raise UserError(f"unknown argument {unknown[0]!r}; valid: {valid}")
    checked = plan_args(**values)
    return {name: getattr(checked, name) for name in values}


def _conflicts(args: FitArgs, pinned: dict[str, Any]) -> None:
    device_map = pinned.get("device_map")
    off = device_map in ("cpu", DISK) or (isinstance(device_map, dict) and {"cpu", DISK} & set(device_map.values()))
    if args.accelerators_only and off:
        raise UserError(f"accelerators_only=True but device_map={device_map!r} puts layers off the accelerators")
    memory = pinned.get("max_memory")
    if args.accelerators_only and memory is not None and not any(is_accelerator(k) for k in memory):
        raise UserError("accelerators_only=True but max_memory names no accelerator (only cpu / disk)")


def fit(model: str | Path | None = None, *, offline: bool = False, **values: Any) -> FitResult | TrainFitResult:
    """The best from_pretrained call for ``model`` at ``context`` x ``batch`` on this machine (or the max_memory
    you name), by the documented order (:mod:`nbhw.core.fit.options`), and why every option ahead of it lost.

    Plan arguments you give (dtype, device_map, attn_implementation, quantization, use_kernels, max_memory) are
    kept; the rest are searched. Same words: ``%hw fit MODEL --context 32k --max-memory 0=24GiB 1=24GiB``.

    ``task="train"`` searches fine-tuning instead (:mod:`nbhw.core.fit.train_search`): method, gradient
    checkpointing, micro-batch and accumulation, the strategy across ``devices``; its memory is a ``target`` or
    ``device_memory``. ``.plan`` is then a training plan.

    >>> r = nbhw.fit("meta-llama/Llama-3.1-70B", context=32768, max_memory={0: "24GiB", 1: "24GiB"})  # doctest: +SKIP
    >>> r.plan.code; r.rejected[0].reason                                                             # doctest: +SKIP
    >>> nbhw.fit("meta-llama/Llama-3.1-8B", task="train", target="T4", context=2048).option.words()   # doctest: +SKIP
    """
    own = {a.name for a in FIT_ARGUMENTS}
    args = fit_args(**{k: v for k, v in values.items() if k in own})
    rest = {k: v for k, v in values.items() if k not in own}
    # Quiet once for the whole search: each plan's own quiet() is then nearly free (setting a logger's level
    # clears the cache of every logger transformers made: measured, a third of a search of small models).
    with meta_build.quiet(), for_target.rows_kept():  # and each attention answer once per search
        if args.task == "train":
            chosen = {"method": args.method} if args.method is not None else {}
            return fit_training(model if model is None else str(model), args, {**rest, **chosen}, offline=offline)
        return fit_loading(model, args, rest, offline=offline)


def fit_loading(model: str | Path | None, args: FitArgs, values: dict[str, Any], *, offline: bool) -> FitResult:
    """The search for task="infer": ``values`` are the plan arguments given (pinned)."""
    started = time.perf_counter()
    pinned = _pinned(values)
    _conflicts(args, pinned)
    base = plan(model, offline=offline, **pinned)  # the model, its config and the sizes, checked once
    if not base.config.available:
        raise UserError(f"fit needs the config of {base.model!r}: {base.config.problem or 'not available'}")
    search = new_search(base.model, pinned, offline, args, base)
    answer, rejected = search.run()
    changes = nearest(search, args) if answer is None else []
    return FitResult(base.model, args, search, answer, rejected=rejected, nearest=changes,
                     seconds=time.perf_counter() - started)  # fmt: skip


fit.__signature__ = argument.signature(fit, FIT_ARGUMENTS, PLAN_ARGUMENTS, TRAIN_ONLY, keep=("model", "offline"))  # type: ignore[attr-defined]


def from_words(args: Any) -> FitResult | TrainFitResult:
    """A fit from the parsed words of ``%hw fit`` / ``python -m nbhw fit`` (a switch left off is not pinned)."""
    values = {name: value for group in (FIT_ARGUMENTS, PLAN_ARGUMENTS, TRAIN_ONLY)
              for name, value in argument.given(args, group).items()}  # fmt: skip
    return fit(args.model, offline=args.offline, **{k: v for k, v in values.items() if v is not False})
