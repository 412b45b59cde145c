"""What a device must keep free beyond the run's peak: the allocator's margin, and whether a plan is "tight".

A dry run counts tensors. A caching allocator (CUDA's, which ROCm shares; XPU's and MPS's cache likewise) holds
memory in segments and can't hand out the free space split off inside a segment that is still in use: when the
run asks for a block no cached piece can take, the allocator frees its wholly unused segments and needs a new one
of that block's size. So a device whose headroom (budget less peak and reserve) is under one more segment of the
run's largest block may fail where the tensor count says it fits. The block is measured (the dry run's largest
allocation on that device); the segment sizes are torch's (``c10/cuda/CUDACachingAllocator.cpp``: requests up to
1 MiB come from 2 MiB segments, up to 10 MiB from 20 MiB ones, larger ones are rounded up to 2 MiB).
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` lets segments grow and lowers this; nbhw doesn't count on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbhw.core import render

MiB = 2**20
SMALL_REQUEST = MiB  # kSmallSize: requests up to this come from the small pool
SMALL_SEGMENT = 2 * MiB  # kSmallBuffer
MID_SEGMENT = 20 * MiB  # kLargeBuffer: requests between 1 and 10 MiB
LARGE_REQUEST = 10 * MiB  # kMinLargeAlloc
LARGE_ROUNDING = 2 * MiB  # kRoundLarge
SOURCE = "torch's caching allocator (c10/cuda/CUDACachingAllocator.cpp: kSmallBuffer, kLargeBuffer, kRoundLarge)"
NO_CACHE = ("cpu",)  # glibc serves large blocks with mmap and returns them on free: nothing cached to split


@dataclass(frozen=True)
class Margin:
    """The room a device's allocator needs beyond the peak, and why."""

    bytes: int
    why: str


def segment_for(request: int) -> int:
    """The segment torch's caching allocator reserves for a request no cached block can take."""
    if request <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if request < LARGE_REQUEST:
        return MID_SEGMENT
    return -(-request // LARGE_ROUNDING) * LARGE_ROUNDING


def allocator_margin(backend: str, largest_block: int) -> Margin:
    """The margin a device of ``backend`` needs when the run's largest block on it is ``largest_block`` bytes."""
    if backend in NO_CACHE:
        return Margin(0, "the CPU allocator returns large blocks to the system: no cache to fragment")
    segment = segment_for(largest_block) + SMALL_SEGMENT
    why = (
        f"one more segment for the run's largest block ({render.size(largest_block)}, measured) and a small-pool "
        f"segment: {render.size(segment)} by {SOURCE}"
    )
    return Margin(segment, why)


def is_tight(headroom: int | None, margin: int | None) -> bool:
    """Fits by the tensor count, but with less room left than the allocator's margin."""
    return headroom is not None and margin is not None and 0 <= headroom < margin
