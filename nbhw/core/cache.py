"""A small thread-safe cache of the newest results, for work that is slow and asked again (meta builds, choices)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class PlannerDict(dict[K, V]):
    """A plain dict for the planner's own memos on the hot path of a dry run (op shapes, decisions): never a tensor
    on a device, so nbhw.holders() does not walk it (as :class:`Recent`)."""


class Recent(Generic[T]):
    """The ``size`` most recently used results by key. Two threads asking for one key may both compute it.

    For the planner's results (meta-device builds, plans, the Load tab's choices), never a tensor on a device:
    nbhw.holders() does not walk these caches (a tensor one held would show as unattributed, not hidden).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The result for ``key``: the kept one, or ``compute()`` now (outside the lock: it may be slow)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        found = compute()
        with self._lock:
            self._items[key] = found
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return found

    def put(self, key: Hashable, value: T) -> None:
        """Keep ``value`` for ``key`` (the newest)."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def peek(self, key: Hashable) -> T | None:
        """The kept result for ``key``, or None: never computes."""
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[T]:
        """The kept results, oldest first."""
        with self._lock:
            return list(self._items.values())

    def clear(self) -> None:
        """Forget every result."""
        with self._lock:
            self._items.clear()


PLANNER_CACHES = (Recent, PlannerDict)  # what nbhw.holders() does not walk among nbhw's own globals
