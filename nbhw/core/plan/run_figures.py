"""What a dry run of generate() answers (:mod:`nbhw.core.plan.run`): the bytes each device holds, the whole run's
figures, the sizes it was asked, and its per-op timeline (what the searches of :mod:`nbhw.core.plan.run_search` fit)."""

from __future__ import annotations

import array
import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

ONE_DEVICE: tuple[tuple[str, Hashable], ...] = (("", "cpu"),)


# How a batch's prompts come to generate(), in the words of the plan's ``padding`` argument.
PADDINGS = {
    "left": "left-padded to the longest, as a tokenizer pads a batch for generate()",
    "none": "all the same length, unpadded",
}


@dataclass
class DeviceRun:
    """What one device of the placement holds during the run (the dry run's allocations counted on it)."""

    weight_bytes: int
    cache_bytes: int  # right after the prefill
    cache_decode_bytes: int  # after the decode step that reaches the context
    peak_bytes: int  # the device's highest total over the prefill and the decode step
    largest_block_bytes: int = 0  # the largest block the run made on it (what the allocator's margin is sized by)

    @property
    def held_cache_bytes(self) -> int:
        """The larger of the two cache figures: what the cache takes at its worst."""
        return max(self.cache_bytes, self.cache_decode_bytes)

    @property
    def activation_bytes(self) -> int:
        """The transient part of the device's peak: above its weights and its cache."""
        return max(self.peak_bytes - self.weight_bytes - self.held_cache_bytes, 0)


@dataclass
class RunEstimate:
    """Bytes one generation run holds, all measured on a meta-device dry run of generate()'s own steps."""

    batch: int
    context: int  # tokens per sequence: the prompt plus what is generated (decoder tokens for encoder-decoders)
    prompt_tokens: int
    encoder_tokens: int | None
    weight_bytes: int  # parameters and buffers, with the dtype plan
    cache_bytes: int  # the cache object right after the prefill (a sliding window still holds the whole prompt)
    cache_decode_bytes: int  # the cache object after the decode step that reaches ``context`` tokens
    state_bytes: int  # of cache_bytes: fixed conv / recurrent state (state-space, linear-attention layers)
    cross_cache_bytes: int  # of cache_bytes: cross-attention keys / values (encoder-decoder)
    activation_bytes: int  # the prefill's transient peak above weights + cache (hidden states, scores, logits)
    prefill_peak_bytes: int
    decode_peak_bytes: int
    cache_class: str
    layer_classes: dict[str, int]  # cache layer classes that hold tensors, and how many
    kernels: dict[str, int]  # how the dry run sized attention / grouped_mm (see dryrun.attention_as_on)
    logits_to_keep: int | None
    target: str
    padding: str = "none"  # how the batch's prompts came (PADDINGS)
    devices: dict[Hashable, DeviceRun] = field(default_factory=dict)  # by device_map value (0, 1, "cpu", ...)
    not_covered: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def peak_bytes(self) -> int:
        """The run's total peak: weights, cache and transients at the worst moment (prefill or decode)."""
        return max(self.prefill_peak_bytes, self.decode_peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        out = {k: v for k, v in vars(self).items() if k != "devices"}
        out["peak_bytes"] = self.peak_bytes
        out["devices"] = {str(k): {**vars(d), "activation_bytes": d.activation_bytes} for k, d in self.devices.items()}
        return out


class DryRunError(RuntimeError):
    """The dry run could not answer: which step failed on the meta device, and transformers' own message."""


@dataclass(frozen=True)
class Sizes:
    """What one dry run is asked: the run's shape, options and placement (the key of its cached result)."""

    batch: int
    context: int
    prompt: int
    encoder_tokens: int | None = None
    target: str = "cuda"
    generation: tuple[tuple[str, Any], ...] = ()  # generate() options, sorted items
    inputs: tuple[tuple[str, Any], ...] = ()  # extra inputs by shape: (name, shape) or (name, (shape, dtype))
    device_map: tuple[tuple[str, Hashable], ...] = ONE_DEVICE
    padding: str = "none"  # how the batch's prompts come: PADDINGS

    def check(self) -> None:
        if self.batch < 1 or self.prompt < 1 or self.context < self.prompt + 1:
            raise ValueError(
                f"need batch >= 1 and 1 <= prompt < context (got batch {self.batch}, prompt {self.prompt}, "
                f"context {self.context})"
            )
        if self.padding not in PADDINGS:
            raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, not {self.padding!r}")


class TrackedRun:
    """A dry run's figures and its timeline: every op's bytes on each device, kept flat in an int64 array (a 70B
    search keeps about a hundred runs of ~16,000 ops: as tuples of ints they took ~450 MB, here ~60 MB)."""

    def __init__(self, estimate: RunEstimate, table: Any, devices: list[Hashable]) -> None:
        self.estimate, self.devices = estimate, devices
        self.points = kept(table)

    @property
    def table(self) -> Any:
        """The timeline as a tensor view of the kept points (no copy): a row per op, a column per device."""
        return as_table(self.points, len(self.devices))

    @property
    def ops(self) -> int:
        """How many ops the timeline has."""
        return len(self.points) // len(self.devices) if self.devices else 0

    @property
    def timeline(self) -> list[tuple[int, ...]]:
        """Per op, the bytes on each device (in ``devices``' order)."""
        n, points = len(self.devices), self.points
        return [tuple(points[i : i + n]) for i in range(0, len(points), n)] if n else []


def flat(timeline: list[tuple[int, ...]], devices: int) -> array.array[int]:
    """The tracker's timeline as nbhw keeps it: every device's total after every op, flat, in an int64 array (a
    device first seen mid-run was 0 before). Not a tensor: one nbhw kept would be counted by ``%hw holders`` and in
    the memory of the device a user's cell is measured on."""
    if not all(len(p) == devices for p in timeline):
        timeline = [p + (0,) * (devices - len(p)) for p in timeline]
    return array.array("q", itertools.chain.from_iterable(timeline))


def as_table(points: array.array[int], devices: int) -> Any:
    """Kept points as an int64 tensor with a row per op and a column per device: a view, no copy (made while a run
    or a search computes, and dropped with it)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    if not points:
        return torch.zeros(0, devices, dtype=torch.int64)
    return torch.frombuffer(points, dtype=torch.int64).view(-1, devices)


def table(timeline: list[tuple[int, ...]], devices: int) -> Any:
    """The tracker's timeline as a tensor (see :func:`as_table`)."""
    return as_table(flat(timeline, devices), devices)


def kept(table: Any) -> array.array[int]:
    """A tensor table as nbhw keeps it (see :func:`flat`)."""
    import torch  # lazy: import nbhw and %load_ext nbhw stay free of torch

    out = array.array("q", bytes(8 * table.numel()))
    if table.numel():
        torch.frombuffer(out, dtype=torch.int64).copy_(table.reshape(-1))
    return out


def most_together(points: Any, default: int) -> int:
    """The highest total of every device at one op of a stretch of a table (``default`` for an empty one)."""
    return int(points.sum(dim=1).max()) if len(points) else default


def sizes(
    batch: int,
    context: int,
    *,
    prompt_tokens: int | None = None,
    encoder_tokens: int | None = None,
    target: str = "cuda",
    generation: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    device_map: dict[str, Hashable] | None = None,
    padding: str = "none",
) -> Sizes:
    """The Sizes of a run (prompt defaults to context - 1; device_map to the whole model on one device)."""
    return Sizes(
        batch=batch,
        context=context,
        prompt=context - 1 if prompt_tokens is None else prompt_tokens,
        encoder_tokens=encoder_tokens,
        target=target,
        generation=tuple(sorted((generation or {}).items())),
        inputs=tuple(sorted((inputs or {}).items())),
        device_map=tuple(device_map.items()) if device_map else ONE_DEVICE,
        padding=padding,
    )
