"""``nbhw.fit(task="train")``: the training options in one documented order, each judged by its own training plan
(:func:`nbhw.core.train.train_plan.train_plan`), the first that fits, and why every one ahead of it lost.

An option is a training method, gradient checkpointing, and a split of the rows per device per optimizer step
(``batch``) into a micro-batch and gradient accumulation steps. Options are ranked by, in turn:

1. **method**: full fine-tuning, then LoRA, then QLoRA (every weight trained, then adapters on the checkpoint's
   dtype, then adapters on a 4-bit base: higher precision before quantization);
2. **gradient checkpointing**: off, then on (it recomputes the forward in backward: about a third more compute);
3. **micro-batch**: the whole batch in one step, then each smaller micro-batch that divides it, with as many
   accumulation steps as keep the rows per optimizer step (fewer rows at once: slower, less memory).

Across several devices the strategy (DDP, FSDP2, ZeRO-2/3, TP, then offload) is each plan's own answer: the first
that fits in the training planner's order. Nothing is decided here: an option's verdict and its reason are its
plan's (its ``fits``, ``verdict`` and ``why``, or the one-line mistake its arguments raise).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbhw.core import argument, render
from nbhw.core.errors import UserError
from nbhw.core.fit.result import SearchResult
from nbhw.core.hardware.targets import MAX_COUNT, Target, target_of
from nbhw.core.tasks import check_names
from nbhw.core.train.arguments import METHODS, TRAIN_ARGUMENTS, train_args
from nbhw.core.train.train_plan import TrainPlan, device_of, model_name, train_plan

CHECKPOINTING = (False, True)
MOST_DEVICES = 8  # when nothing fits: devices like this one, doubling up to one node of this many, are tried
SHOWN_REJECTED = 24  # a training search has a few dozen options at most: most are shown


@dataclass(frozen=True)
class TrainOption:
    """One way to run the training step: what a training plan is asked beyond the arguments you pinned."""

    method: str
    gradient_checkpointing: bool
    batch: int  # the micro-batch: rows per device per forward/backward
    gradient_accumulation_steps: int

    def words(self) -> str:
        """'qlora, gradient checkpointing on, batch 2 x 4 accumulation steps'."""
        steps = self.gradient_accumulation_steps
        rows = f"batch {self.batch}" + (f" x {steps} accumulation steps" if steps > 1 else "")
        return f"{self.method}, gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}, {rows}"

    def values(self) -> dict[str, Any]:
        return dict(self.__dict__)


def micro_batches(rows: int, pinned: dict[str, Any]) -> list[tuple[int, int]]:
    """(micro-batch, accumulation steps) with ``rows`` per device per optimizer step: the whole of it, then each
    smaller micro-batch that divides it; pinned accumulation steps keep ``rows`` as the micro-batch."""
    if "gradient_accumulation_steps" in pinned:
        return [(rows, pinned["gradient_accumulation_steps"])]
    return [(micro, rows // micro) for micro in range(rows, 0, -1) if rows % micro == 0]


def train_options(pinned: dict[str, Any]) -> list[TrainOption]:
    """Every option, in the documented order; a pinned method or gradient checkpointing is kept."""
    methods = [pinned["method"]] if "method" in pinned else list(METHODS)
    checkpointing = [pinned["gradient_checkpointing"]] if "gradient_checkpointing" in pinned else list(CHECKPOINTING)
    splits = micro_batches(pinned.get("batch", 1), pinned)
    return [TrainOption(m, g, b, a) for m, g, (b, a) in itertools.product(methods, checkpointing, splits)]


# ---------------------------------------------------------------- one option, judged by its own plan


@dataclass
class TrainJudged:
    """An option and its plan (None: its arguments were refused, ``refused`` says why in one line)."""

    option: TrainOption
    plan: TrainPlan | None
    refused: str | None = None

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits is True

    @property
    def reason(self) -> str:
        """The plan's own words: the refusal, else its verdict (and why its strategy, across several devices)."""
        if self.plan is None:
            return self.refused or "not planned"
        why = f" ({self.plan.why})" if len(self.plan.compared.choices) > 1 else ""
        return self.plan.verdict + why

    def to_dict(self) -> dict[str, Any]:
        return {"option": self.option.values(), "reason": self.reason}


@dataclass
class TrainSearch:
    model: str
    pinned: dict[str, Any]
    offline: bool
    options: list[TrainOption]
    judged: dict[TrainOption, TrainJudged] = field(default_factory=dict)

    def judge(self, option: TrainOption, **changed: Any) -> TrainJudged:
        key = option if not changed else None
        if key is not None and key in self.judged:
            return self.judged[key]
        values = {**self.pinned, **option.values(), **changed}
        try:
            found = TrainJudged(option, train_plan(self.model, offline=self.offline, **values))
        except UserError as refused:
            found = TrainJudged(option, None, str(refused))
        if key is not None:
            self.judged[key] = found
        return found

    def run(self) -> tuple[TrainJudged | None, list[TrainJudged]]:
        """The first option that fits with room for the allocator; a tight one only when none after it has room."""
        rejected: list[TrainJudged] = []
        tight: tuple[TrainJudged, list[TrainJudged]] | None = None
        for option in self.options:
            found = self.judge(option)
            if found.fits and not (found.plan is not None and found.plan.tight):
                return found, rejected
            if found.fits and tight is None:
                tight = (found, list(rejected))
            rejected.append(found)
        return tight or (None, rejected)


# ---------------------------------------------------------------- when nothing fits


@dataclass
class TrainChange:
    """A change of the request that makes some option fit, and its plan."""

    what: str
    plan: TrainPlan

    @property
    def verdict(self) -> str:
        return self.plan.verdict

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.what, "verdict": self.plan.verdict, "code": self.plan.code}


def _least(rejected: list[TrainJudged]) -> TrainJudged | None:
    """The planned option that needs the least memory per device."""
    planned = [r for r in rejected if r.plan is not None and r.plan.recommended.ok]
    return min(planned, key=lambda r: r.plan.peak_bytes if r.plan else 0, default=None)


def _shorter(search: TrainSearch, least: TrainJudged) -> Iterator[TrainChange]:
    """The longest context (halving, then bisected) at which the least-memory option fits."""
    assert least.plan is not None
    fits_at: dict[int, TrainJudged] = {}

    def fits(context: int) -> bool:
        fits_at[context] = search.judge(least.option, context=context)
        return fits_at[context].fits

    high = least.plan.args.context
    if high // 2 >= 2 and not fits(2):
        return  # what the step holds whatever its rows is over already: no context fits
    low = high // 2
    while low >= 2 and not fits(low):
        high, low = low, low // 2
    if low < 2:
        return
    while high - low > max(1, low // 64):  # to about 1.5 %: each step is a dry run
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    found = fits_at[low].plan
    assert found is not None
    yield TrainChange(f"context {low:,} tokens instead of {least.plan.args.context:,} ({least.option.words()})",
                      found)  # fmt: skip


def _device_words(plan: TrainPlan, count: int) -> tuple[str, dict[str, Any]]:
    target = target_of(plan.asked.target)
    if target is not None:
        more = Target(target.accelerator, count)
        return f"target {more.text!r}", {"target": more}
    return f"{count} devices of {render.size(plan.device.total)}", {"devices": count}


def _more_devices(search: TrainSearch, least: TrainJudged) -> Iterator[TrainChange]:
    """The first count of devices like this one (doubling, up to one node of MOST_DEVICES) at which the
    least-memory option fits, under the strategy its plan picks."""
    assert least.plan is not None
    now = least.plan.args.devices
    count = now * 2
    while count <= min(MOST_DEVICES, MAX_COUNT):
        words, changed = _device_words(least.plan, count)
        found = search.judge(least.option, **changed)
        if found.fits and found.plan is not None:
            yield TrainChange(f"{words} ({found.plan.recommended.label}; {least.option.words()})", found.plan)
            return
        count *= 2


def nearest(search: TrainSearch, rejected: list[TrainJudged]) -> list[TrainChange]:
    least = _least(rejected)
    if least is None:
        return []
    return [*_shorter(search, least), *_more_devices(search, least)]


# ---------------------------------------------------------------- the result


class TrainFitResult(SearchResult):
    """The answer of ``nbhw.fit(task="train")``: ``.plan`` (a TrainPlan, None when nothing fits), ``.code``,
    ``.rejected`` (every option ranked ahead of it, with its plan's reason) and ``.nearest``."""

    def headline(self) -> str:
        if self.answer is None or self.plan is None:
            return f"nbhw fit (train): nothing fits for {self.model!r} among {len(self.search.options)} options"
        plan = self.plan
        strategy = f", {plan.recommended.label}" if plan.args.world_size > 1 else ""
        return f"nbhw fit (train): {self.answer.option.words()}, {plan.args.dtype}{strategy}: {plan.verdict}"

    def _lines(self) -> list[str]:
        lines = []
        for r in self.rejected[:SHOWN_REJECTED]:
            lines.append(f"  - {r.option.words()}: {r.reason}")
        if len(self.rejected) > SHOWN_REJECTED:
            lines.append(f"  ... and {len(self.rejected) - SHOWN_REJECTED} more (result.rejected has every reason)")
        return lines

    def text(self) -> str:
        lines = self.head()
        if self.plan is not None:
            target = target_of(self.plan.asked.target)
            if target is not None:
                lines += [f"  {target.not_here}", ""]
            launch = self.plan.launch.command
            lines += ["Code" + (f" (launch: {launch})" if self.plan.args.world_size > 1 else "")]
            lines += [*("    " + line if line else "" for line in (self.code or "").splitlines()), ""]
        if self.rejected:
            lines += [f"Rejected ({len(self.rejected)}, in the order tried)", *self._lines(), ""]
        lines += self.nearest_lines()
        return "\n".join(lines).rstrip() + "\n"

    def html(self) -> str:
        esc = render.esc
        parts = [f'<div class="nbhw-fit"><p><b>{esc(self.headline())}</b></p>']
        if self.code:
            parts.append(f'<pre class="nbhw-code">{esc(self.code)}</pre>')
        if self.rejected:
            rows = [[r.option.words(), r.reason] for r in self.rejected[:SHOWN_REJECTED]]
            parts.append("<p><b>Rejected</b></p>" + render.html_table(("option", "reason"), rows))
        if self.answer is None and self.nearest:
            items = "".join(f"<li>{esc(c.what)}: {esc(c.plan.verdict)}</li>" for c in self.nearest)
            parts.append(f"<p><b>Nearest changes that fit</b></p><ul>{items}</ul>")
        return "".join(parts) + "</div>"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "arguments": argument.to_dict(self.args),
            "pinned": argument.plain_values(self.search.pinned, TRAIN_ARGUMENTS),
            "fits": self.answer is not None, "option": None if self.option is None else self.option.values(),
            "plan": None if self.plan is None else self.plan.to_dict(),
            "rejected": [r.to_dict() for r in self.rejected], "nearest": [c.to_dict() for c in self.nearest],
            "planned": self.planned, "options": len(self.search.options), "seconds": self.seconds,
        }  # fmt: skip


# ---------------------------------------------------------------- the search, from nbhw.fit()


def fit_training(model: str | None, args: Any, pinned: dict[str, Any], *, offline: bool) -> TrainFitResult:
    """The first training option that fits by the documented order (``pinned``: the training arguments you gave;
    ``args``: fit's own)."""
    started = time.perf_counter()
    check_names("train", pinned)
    checked = train_args(**pinned)  # every mistake up front, before a dry run
    pinned = {name: getattr(checked, name) for name in pinned}
    device = device_of(checked)
    if device.total is None:
        raise UserError(f"fit needs the memory of the devices trained on ({device.source}: nbhw can't read it); "
                        "give device_memory='24GiB' or target='T4'")  # fmt: skip
    search = TrainSearch(model_name(model), pinned, offline, train_options(pinned))
    answer, rejected = search.run()
    changes = nearest(search, rejected) if answer is None else []
    return TrainFitResult(search.model, args, search, answer, rejected=rejected, nearest=changes,
                          seconds=time.perf_counter() - started)  # fmt: skip
