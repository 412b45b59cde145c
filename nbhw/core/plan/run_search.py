"""Searches with dry runs (:mod:`nbhw.core.plan.run`): the longest context and the largest batch that fit a budget,
and the sizes that keep the allocator's margin.

Every tracked allocation size is a polynomial in the batch (degree 1) and the context (degree <= 2, attention
scores), so the memory timelines of three dry runs fix the whole timeline at any size; the answer is then confirmed by
a dry run at the next size up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

from nbhw.core.plan.run import LOOP_OPS_PER_MODULE, modules, op_budget, tracked_run
from nbhw.core.plan.run_figures import RunEstimate, TrackedRun, sizes

NO_LIMIT = 1 << 20  # tokens, for a config that names no maximum position (relative or no position embeddings)


@dataclass
class Fit:
    """The answer of a search and how it was reached."""

    value: int  # the largest size that fits (0: not even the smallest)
    limit: int  # the largest size searched (the model's maximum positions, or the batch limit)
    dry_runs: int  # dry runs made for the search (runs remembered from earlier plans included)
    method: str  # "timeline fit, confirmed ...", "peak fit, confirmed by dry runs" or "bisection"
    seconds: float = 0.0


def _over(run: TrackedRun, limits: dict[Hashable, int]) -> Any:
    """The run's timeline as bytes over each device's limit, every device of every point (float64, flat)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    columns = [i for i, d in enumerate(run.devices) if d in limits]
    if not columns:
        return torch.full((1,), -1.0, dtype=torch.float64)
    points = run.table if len(run.table) else torch.zeros(1, len(run.devices), dtype=torch.int64)
    table = points.to(torch.float64)[:, columns]
    return (table - torch.tensor([float(limits[run.devices[i]]) for i in columns], dtype=torch.float64)).flatten()


class _Search:
    """Largest n in [lo, hi] whose dry run stays within every device's limit.

    First a timeline fit: the timelines of the dry runs so far, as polynomials in n (degree grows with the points,
    up to ``degree``), give a guess g; the dry run at g + 1 must not fit and its whole timeline must equal the fit's
    prediction (then the prediction at g is the measured law, not a guess), else it becomes a fit point. When the
    op sequence changes with n (a loop over tokens or chunks), the peaks nearest the boundary are fitted instead and
    each guess confirmed by dry runs at g and g + 1; bisection with dry runs is the last resort.
    """

    def __init__(
        self, measure: Callable[[int], TrackedRun], limits: dict[Hashable, int], bounds: tuple[int, int], degree: int
    ) -> None:
        self.measure, self.limits, self.degree = measure, limits, degree
        self.lo, self.hi = bounds
        self.seen: dict[int, Any] = {}  # n -> flat over-the-limit timeline
        self.started = time.perf_counter()

    def over(self, n: int) -> Any:
        if n not in self.seen:
            self.seen[n] = _over(self.measure(n), self.limits)
        return self.seen[n]

    def fits(self, n: int) -> bool:
        return bool(self.over(n).max() <= 0)

    def done(self, value: int, method: str) -> Fit:
        return Fit(max(value, 0), self.hi, len(self.seen), method, time.perf_counter() - self.started)

    def __call__(self, seeds: list[int]) -> Fit:
        points = sorted({min(max(n, self.lo), self.hi) for n in seeds})
        for n in points:
            self.over(n)
        return self.timeline_fit(points) or self.peak_fit() or self.bisect()

    def _coefficients(self, points: list[int]) -> Any:
        """Per timeline point, the polynomial in n through the last points (None when the op sequences differ)."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        order = min(len(points) - 1, self.degree)
        chosen = points[-(order + 1) :]
        if len({self.seen[n].numel() for n in chosen}) != 1:
            return None
        xs = torch.tensor([float(n) for n in chosen], dtype=torch.float64)
        vander = torch.vander(xs, order + 1)
        return torch.linalg.solve(vander, torch.stack([self.seen[n] for n in chosen]))

    @staticmethod
    def _predicted(coeffs: Any, n: int) -> Any:
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        powers = torch.tensor([float(n) ** p for p in range(coeffs.shape[0] - 1, -1, -1)], dtype=torch.float64)
        return powers @ coeffs

    def _largest_predicted(self, coeffs: Any, low: int | None = None, high: int | None = None) -> int:
        """Largest n in [low, high] (default [lo, hi]) whose predicted timeline fits, low - 1 when none does (peaks
        grow with n: a bisection over the prediction, no dry run)."""
        low, high = self.lo if low is None else low, self.hi if high is None else high
        if self._predicted(coeffs, low).max() > 0:
            return low - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self._predicted(coeffs, mid).max() <= 0:
                low = mid
            else:
                high = mid - 1
        return low

    def timeline_fit(self, points: list[int]) -> Fit | None:
        for _ in range(self.degree + 2):
            coeffs = self._coefficients(points)
            if coeffs is None:
                return None
            guess = self._largest_predicted(coeffs)
            edge = self.hi if guess >= self.hi else self.lo if guess < self.lo else None
            if edge is not None:
                if self.fits(edge) == (edge == self.hi):
                    return self.done(self.hi if edge == self.hi else self.lo - 1, "timeline fit, confirmed")
                points.append(edge)
                continue
            nxt = guess + 1
            if not self.fits(nxt) and _matches(self._predicted(coeffs, nxt), self.seen[nxt]):
                return self.done(guess, "timeline fit, confirmed at the next size")
            if nxt in points:
                return None
            points.append(nxt)
        return None

    def peak_fit(self) -> Fit | None:
        for _ in range(4):
            good, bad = self._bracket()
            if bad - good <= 1:
                return None
            guess = self._peak_fit_guess(good, bad)
            if guess is None:
                return None
            if self.fits(guess) and (guess == self.hi or not self.fits(guess + 1)):
                return self.done(guess, "peak fit, confirmed by dry runs")
        return None

    def bisect(self) -> Fit:
        good, bad = self._bracket()
        if good == self.lo - 1 and self.fits(self.lo):
            good = self.lo
        if bad == self.hi + 1 and good < self.hi and self.fits(self.hi):
            good = self.hi
        while bad - good > 1 and good < self.hi:
            mid = (good + bad) // 2
            if self.fits(mid):
                good = mid
            else:
                bad = mid
        return self.done(good, "bisection")

    def _bracket(self) -> tuple[int, int]:
        good = max([n for n in self.seen if self.fits(n)], default=self.lo - 1)
        bad = min([n for n in self.seen if not self.fits(n)], default=self.hi + 1)
        return good, bad

    def _peak_fit_guess(self, good: int, bad: int) -> int | None:
        """Largest n strictly inside (good, bad) that the polynomial through the nearest measured peaks says fits."""
        import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

        if good < min(self.seen) or bad > max(self.seen):
            return None
        order = min(self.degree, len(self.seen) - 1)
        if order < 1:
            return None
        nearest = sorted(self.seen, key=lambda n: min(abs(n - good), abs(n - bad)))[: order + 1]
        xs = torch.tensor([float(n) for n in nearest], dtype=torch.float64)
        ys = torch.tensor([float(self.seen[n].max()) for n in nearest], dtype=torch.float64)
        coeffs = torch.linalg.solve(torch.vander(xs, order + 1), ys.unsqueeze(1))
        return max(self._largest_predicted(coeffs, good + 1, bad - 1), good + 1)


def _matches(predicted: Any, measured: Any) -> bool:
    return bool(predicted.shape == measured.shape and (predicted - measured).abs().max() < 1.0)


def context_limit(config: Any) -> int:
    """The longest sequence a config allows (its maximum positions), or NO_LIMIT when it names none."""
    config = getattr(config, "config", config)
    text = config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return NO_LIMIT


def context_limit_name(config: Any) -> str | None:
    """Which config field gives the limit (for the message that names it)."""
    text = getattr(config, "config", config).get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return name
    return None


def max_context(
    model: Any,
    limits: dict[Hashable, int],
    *,
    batch: int = 1,
    target: str = "cuda",
    start: int = 4096,
    generation: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    encoder_tokens: int | None = None,
    limit: int | None = None,
    margins: Margins | None = None,
    padding: str = "none",
) -> Fit:
    """Tokens per sequence (prompt + generated) that fit every device's limit at this batch, up to the model's limit.

    ``limits``: the bytes the dry run's tensors may reach on each device (a device not named has no limit);
    ``margins``: what each device's allocator needs left free for a run (see :func:`with_margins`).
    """
    hi = max(limit or context_limit(model), 2)
    first = max(min(start, hi), 2)
    seeds = sorted({first, min(2 * first, hi)})

    def measure(n: int) -> TrackedRun:
        return tracked_run(model, sizes(batch, max(n, 2), target=target, generation=generation, device_map=device_map,
                                 encoder_tokens=encoder_tokens, padding=padding))  # fmt: skip

    note = ""
    if _ops_grow(model, measure, first):
        # A loop over tokens: past some context the dry run would stop at its op budget. Search below it.
        covered = _covered_context(model, measure, first)
        if covered < hi:
            hi, note = max(covered, first), f"; past {max(covered, first):,} tokens not covered (a loop over tokens)"
            seeds = sorted({max(first // 2, 2), first})
    found = with_margins(lambda lim: _Search(measure, lim, (2, hi), degree=2)(seeds), measure, limits, margins)
    found = replace(found, method=found.method + note)
    return found if found.value >= 2 else replace(found, value=0)


def _ops_grow(model: Any, measure: Callable[[int], TrackedRun], first: int) -> bool:
    """Whether the dry run's op count grows with the context (a Python loop over tokens or chunks): far more ops per
    module than a forward of fused layers makes (11-16 per module for a prefill and a decode step)."""
    return measure(first).ops > LOOP_OPS_PER_MODULE * modules(model)


def _covered_context(model: Any, measure: Callable[[int], TrackedRun], first: int) -> int:
    """The longest context whose dry run stays within the op budget, by the op counts at two contexts (they grow
    linearly with the context in a loop over tokens)."""
    low = max(first // 2, 2)
    ops_low, ops_first = measure(low).ops, measure(first).ops
    if ops_first <= ops_low or first == low:
        return first
    budget = op_budget(model)
    per_token = (ops_first - ops_low) / (first - low)
    return int(first + 0.9 * (budget - ops_first) / per_token)


def max_batch(
    model: Any,
    limits: dict[Hashable, int],
    *,
    context: int = 4096,
    target: str = "cuda",
    generation: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    encoder_tokens: int | None = None,
    limit: int = 4096,
    margins: Margins | None = None,
    padding: str = "none",
) -> Fit:
    """Sequences of ``context`` tokens that fit every device's limit together (``margins``: see max_context)."""

    def measure(n: int) -> TrackedRun:
        return tracked_run(model, sizes(n, context, target=target, generation=generation, device_map=device_map,
                                 encoder_tokens=encoder_tokens, padding=padding))  # fmt: skip

    return with_margins(lambda lim: _Search(measure, lim, (1, limit), degree=1)([1, 2]), measure, limits, margins)


Margins = Callable[[RunEstimate], dict[Hashable, int]]


MARGIN_ROUNDS = 4  # searches against a margin before the largest size seen to keep its own is taken


def with_margins(
    search: Callable[[dict[Hashable, int]], Fit],
    measure: Callable[[int], TrackedRun],
    limits: dict[Hashable, int],
    margins: Margins | None,
) -> Fit:
    """The largest size whose run leaves each device its allocator's margin (``margins``: per device, what the
    allocator needs for a given run). Both the tensors and the margin grow with the size, so "keeps its margin" holds
    up to one size: the tensors' boundary bounds it, searches against the limits less the margin of the last answer
    narrow it (a few rounds), and dry runs bisect what is left."""
    found = search(limits)
    if margins is None or found.value == 0:
        return found

    def less(n: int) -> dict[Hashable, int]:
        room = margins(measure(n).estimate)
        return {d: lim - room.get(d, 0) for d, lim in limits.items()}

    def keeps(n: int) -> bool:
        return bool(_over(measure(n), less(n)).max() <= 0)

    if keeps(found.value):
        return found
    good, bad, dry_runs = 0, found.value, found.dry_runs
    for _ in range(MARGIN_ROUNDS):
        again = search(less(bad if good == 0 else good))
        dry_runs += again.dry_runs
        if not good < again.value < bad:  # nothing new inside the bracket
            break
        good, bad = (again.value, bad) if keeps(again.value) else (good, again.value)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if keeps(middle) else (good, middle)
        dry_runs += 1
    return replace(found, value=good, dry_runs=dry_runs, method=f"{found.method}, then keeping the allocator's margin")
