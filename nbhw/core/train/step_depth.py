"""A deep model's step from a few of its layers (:mod:`nbhw.core.train.step`): the recorded timeline widened to the
full depth, and the peak it reaches there."""

from __future__ import annotations

import copy
from typing import Any


class Timeline:
    """The tracker's total after every op of forward and backward, each tagged with the decoder layer running."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers
        self.names: dict[str, int] | None = None
        self.values: list[int] = []
        self.grads: list[int] = []
        self.tags: list[tuple[bool, int | None]] = []

    def record(self, tracker: Any, total: int, grads: int) -> None:
        mods = tracker._mod_tracker
        layer = None
        if self.names is None and self.layers and self.layers[0] in mods._known_modules:
            known = mods._known_modules
            self.names = {known[m]: i for i, m in enumerate(self.layers)}
        if self.names is not None:
            running = [i for name in mods.parents if (i := self.names.get(name)) is not None]
            # Two layers at once (FSDP2's hooks overlap them): the one entered last in this phase's order, so the
            # tags don't depend on the set's order.
            layer = (min if mods.is_bw else max)(running, default=None)
        self.values.append(total)
        self.grads.append(grads)
        self.tags.append((mods.is_bw, layer))


def _blocks(timeline: Timeline, backward: bool) -> dict[int, tuple[int, int]]:
    """Each layer's (first, last+1) op index in the forward or the backward phase."""
    spans: dict[int, list[int]] = {}
    for i, (bw, layer) in enumerate(timeline.tags):
        if bw == backward and layer is not None:
            span = spans.setdefault(layer, [i, i + 1])
            span[1] = i + 1
    return {k: (v[0], v[1]) for k, v in spans.items()}


def synthesize_peak(timeline: Timeline, layers: int) -> tuple[int, int]:
    """The forward/backward peak (and the gradients held at it) the same step reaches with ``layers`` identical
    decoder layers, from a timeline recorded with fewer.

    In each phase the ops from one middle layer's start to the next one's form a period; the recorded timeline
    must hold two periods that differ by a constant (what one more layer holds), byte for byte at every op.
    The L-layer timeline is the recorded one with L - recorded more periods inserted after those two, each one
    constant higher, and everything after them shifted. Raises when the periods do not repeat.
    """
    recorded = len(timeline.layers)
    if recorded < 5 or layers < recorded:
        raise ValueError("need a timeline of at least 5 layers (first, three middle, last) and no more than asked")
    values, grads = timeline.values, timeline.grads
    inserts = [_period(timeline, backward) for backward in (False, True)]
    copies = layers - recorded
    best = (0, 0)
    shift = gshift = cursor = 0
    for at, period, step, gstep in sorted(inserts):
        pairs = zip(values[cursor:at], grads[cursor:at], strict=True)
        best = max([best, *((v + shift, g + gshift) for v, g in pairs)])
        if copies > 0:
            top = max(range(period, at), key=values.__getitem__)
            # Copy q (1..copies) is the last recorded period plus q steps: the largest is the first or the last.
            for q in (1, copies):
                best = max(best, (values[top] + shift + q * step, grads[top] + gshift + q * gstep))
        shift += copies * step
        gshift += copies * gstep
        cursor = at
    return max([best, *((v + shift, g + gshift) for v, g in zip(values[cursor:], grads[cursor:], strict=True))])


def _period(timeline: Timeline, backward: bool) -> tuple[int, int, int, int]:
    """Where one phase repeats: (the end of the second of two like periods, its start, the bytes and the gradient
    bytes one more layer adds)."""
    spans = _blocks(timeline, backward)
    # Three middle layers in execution order, from the centre: two periods away from both ends (FSDP2's prefetch
    # makes the periods next to the first and last layers differ).
    middle = list(range(1, len(timeline.layers) - 1))
    middle = middle if not backward else middle[::-1]
    centre = (len(middle) - 3) // 2
    a, b, c = (spans[i][0] for i in middle[centre : centre + 3])
    values, grads = timeline.values, timeline.grads
    step, gstep = values[b] - values[a], grads[b] - grads[a]
    if b - a != c - b or any(
        values[b + j] - values[a + j] != step or grads[b + j] - grads[a + j] != gstep for j in range(b - a)
    ):
        raise ValueError("the middle decoder layers do not repeat exactly; run the full depth")
    return c, b, step, gstep


def uniform_depth(config: Any) -> str | None:
    """Why a config's decoder layers might not do the same work (None: nothing says so)."""
    text = config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or [])
    if len(kinds) > 1:
        return f"layer_types mixes {', '.join(sorted(kinds))}"
    return None


def with_depth(config: Any, layers: int) -> Any:
    """A copy of the config with ``layers`` decoder layers (layer_types cut to match)."""
    small = copy.deepcopy(config)
    text = small.get_text_config()
    kinds = list(getattr(text, "layer_types", None) or [])
    text.num_hidden_layers = layers
    if kinds:
        text.layer_types = (kinds * (layers // len(kinds) + 1))[:layers] if len(set(kinds)) > 1 else kinds[:1] * layers
    return small
