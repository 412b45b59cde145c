"""The panels' background work: the newest job of each kind runs after a short quiet time, off the kernel's thread.

A control change submits a job. The worker waits until changes of that kind stop for ``debounce`` seconds, then
iterates the newest job's parts (a plain generator, :meth:`Worker.submit_parts`; one part for :meth:`Worker.submit`)
outside any lock, and calls its ``apply`` with each part under :data:`LOCK` (the one lock every nbhw widget is
mutated under) only if no newer job of the same kind came in meanwhile: a stale result never overwrites a newer one.
A stale job stops: its generator is closed before its next part, and a dry run under way stops between two ops
(:func:`nbhw.core.hf.dryrun.interruptible`). The thread is named ``nbhw-panel``, never prints, and stops with
:meth:`Worker.stop` (the last panel closing, ``%unload_ext nbhw``).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nbhw.core.hf import dryrun
from nbhw.ui.memory import LOCK  # the one lock of every nbhw widget, shared with the memory graph

__all__ = ["CONTROL_DELAY", "DEBOUNCE", "LOCK", "THREAD_NAME", "Job", "Worker", "last", "locked"]

T = TypeVar("T")

DEBOUNCE = 0.15
# A change of a control is one message (dropdowns, checkboxes, and text fields on Enter), so the Load tab and its
# Train mode plan a change at once: no quiet time. A burst still ends on its last change: the worker keeps only the
# newest job, and a job made stale by a newer change stops at its next part (its dry run between two ops).
CONTROL_DELAY = 0.0
THREAD_NAME = "nbhw-panel"


def unexpected(exc: Exception) -> str:
    """The message for a bug: shown in the tab rather than leaving it waiting."""
    return f"nbhw failed here ({type(exc).__name__}: {exc}); please report it with %hw report"


def last(parts: Iterable[T]) -> T:
    """The final part of a staged compute, every part computed (a caller outside the worker: text, tests)."""
    *_, final = parts
    return final


def _one(compute: Callable[[], T]) -> Iterator[T]:
    yield compute()


@dataclass
class Job(Generic[T]):
    """One submitted piece of work: its parts computed off the lock, each applied under it while still the newest of
    its kind (the slow parts fill in after the quick ones)."""

    key: Hashable
    generation: int
    parts: Callable[[], Iterator[T]]
    apply: Callable[[T], None]
    due: float


class Worker:
    """One background thread running the newest job per key, debounced; stale results are dropped."""

    def __init__(self, debounce: float = DEBOUNCE, name: str = THREAD_NAME) -> None:
        self.debounce = debounce
        self.name = name
        self.errors: list[BaseException] = []  # kept, never printed: a thread must not write to a cell
        self.applied = 0
        self.dropped = 0
        self._cond = threading.Condition()
        self._pending: dict[Hashable, Job[Any]] = {}
        self._newest: dict[Hashable, int] = {}
        self._generations = itertools.count(1)
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(
        self, key: Hashable, compute: Callable[[], T], apply: Callable[[T], None], delay: float | None = None
    ) -> int:
        """Queue work for ``key``, replacing any not yet started; its generation (0 once stopped)."""
        return self.submit_parts(key, functools.partial(_one, compute), apply, delay)

    def submit_parts(
        self, key: Hashable, parts: Callable[[], Iterator[T]], apply: Callable[[T], None], delay: float | None = None
    ) -> int:
        """Queue a staged job for ``key`` (as :meth:`submit`): ``apply`` receives each part ``parts()`` yields, as it
        comes, until the job is stale; then the generator is closed, so no later part is computed."""
        with self._cond:
            if self._stopped:
                return 0
            generation = next(self._generations)
            self._newest[key] = generation
            due = time.monotonic() + (self.debounce if delay is None else delay)
            self._pending[key] = Job(key, generation, parts, apply, due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return generation

    def current(self, key: Hashable, generation: int) -> bool:
        """Whether ``generation`` is still the newest job submitted for ``key``."""
        with self._cond:
            return not self._stopped and self._newest.get(key) == generation

    def _next(self) -> Job[Any] | None:
        with self._cond:
            while not self._stopped:
                if not self._pending:
                    self._cond.wait()
                    continue
                job = min(self._pending.values(), key=lambda j: j.due)
                wait = job.due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                del self._pending[job.key]
                self._busy = True
                return job
            return None

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                if self._iterate(job):
                    self.applied += 1
                else:
                    self.dropped += 1
            except Exception as exc:  # a bug in a view must not end the thread every panel shares
                self.errors.append(exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _iterate(self, job: Job[Any]) -> bool:
        """Apply each part of a job while it is the newest of its kind; whether it ran to its end (else it went stale).

        Staleness is asked under the lock before a part is applied, and again before the next one is computed; while
        a part is computed, a dry run asks every few hundred ops and stops with ``Interrupted``.
        """

        def stale() -> bool:
            return not self.current(job.key, job.generation)

        with dryrun.interruptible(stale):
            parts = job.parts()
            try:
                for part in parts:
                    with LOCK:
                        if stale():
                            return False
                        job.apply(part)
                    if stale():  # before the next part is computed
                        return False
                return True
            except dryrun.Interrupted:
                return False
            finally:
                if isinstance(parts, Generator):  # its own cleanup runs now, not whenever it is collected
                    parts.close()

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        with self._cond:
            return not self._pending and not self._busy

    def wait(self, timeout: float = 60.0) -> bool:
        """Block until nothing is queued or running (tests, scripts); whether that happened in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return not self._pending and not self._busy
                self._cond.wait(left)
            return True

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Drop queued work, stop a running job at its next part (its dry run between two ops), join. Idempotent."""
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


@functools.cache
def locked(cls: type) -> type:
    """A widget class whose messages from the browser are handled under :data:`LOCK`.

    JupyterLab may handle widget messages on a second kernel thread while the worker applies a result: taking
    the lock first makes a user's change and the observer it triggers one step, never split by a stale apply.
    """

    def _handle_msg(self: Any, msg: Any) -> None:
        with LOCK:
            cls._handle_msg(self, msg)  # type: ignore[attr-defined]

    return type(cls.__name__, (cls,), {"_handle_msg": _handle_msg, "__module__": __name__})
