"""Memory sources, a clock and a sampler for the memory graph's tests: fakes at the sampler's boundary."""

from __future__ import annotations

from nbhw.core import memory


class FakeSource(memory.Source):
    """A device whose readings the test sets; optionally with an allocator peak counter."""

    def __init__(self, device: str = "fake:0", kinds: tuple[str, ...] = ("allocated", "capacity"), peaks: bool = False):
        self.device = device
        self.name = f"{device} (fake)"
        self.kinds = kinds
        self.primary = kinds[0]
        self.values = dict.fromkeys(kinds, 0)
        self.peaks = peaks
        self.peak_value = 0
        self.resets = 0
        self.reads = 0

    def read(self) -> dict[str, int]:
        self.reads += 1
        return dict(self.values)

    def set(self, **values: int) -> None:
        self.values.update(values)
        self.peak_value = max(self.peak_value, *self.values.values())

    def reset_peak(self) -> bool:
        if not self.peaks:
            return False
        self.resets += 1
        self.peak_value = self.values[self.primary]
        return True

    def peak(self) -> int | None:
        return self.peak_value if self.peaks else None


class Broken(memory.Source):
    name = "gpu9 (broken)"
    device = "gpu9"
    kinds = ("used",)
    primary = "used"

    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> dict[str, int]:
        self.calls += 1
        raise RuntimeError("GPU is lost")


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Running(memory.Sampler):
    """A sampler that counts as running without a thread, so tests drive ticks by hand."""

    @property
    def running(self) -> bool:
        return True
