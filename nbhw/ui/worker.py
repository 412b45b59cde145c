"""The panels' background work: the newest job of each kind runs after a short quiet time, off the kernel's thread.

A control change submits a job. The worker waits until changes of that kind stop for ``debounce`` seconds, runs
the newest job's ``compute`` outside any lock, then calls its ``apply`` under :data:`LOCK` (the one lock every nbhw
widget is mutated under) only if no newer job of the same kind came in meanwhile: a stale result never overwrites
a newer one. The thread is named ``nbhw-panel``, never prints, and stops with :meth:`Worker.stop` (the last panel
closing, ``%unload_ext nbhw``).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from nbhw.ui.memory import LOCK  # the one lock of every nbhw widget, shared with the memory graph

__all__ = ["CONTROL_DELAY", "DEBOUNCE", "LOCK", "THREAD_NAME", "Job", "Poster", "Worker", "locked"]

DEBOUNCE = 0.15
# A change of a control is one message (dropdowns, checkboxes, and text fields on Enter), so the Load tab and its
# Train mode plan a change at once: no quiet time. A burst still ends on its last change: the worker keeps only the
# newest job, and a job made stale by a newer change stops at its next part (its dry run between two ops).
CONTROL_DELAY = 0.0
THREAD_NAME = "nbhw-panel"


def unexpected(exc: Exception) -> str:
    """The message for a bug: shown in the tab rather than leaving it waiting."""
    return f"nbhw failed here ({type(exc).__name__}: {exc}); please report it with %hw report"


@dataclass
class Job:
    """One submitted piece of work: compute off the lock, apply under it if still the newest of its kind.

    With ``progress``, ``compute`` is called with a function that hands it a partial result: applied at once by
    ``progress`` under the lock, unless a newer job of the same kind came in (the slow parts fill in after). That
    function returns False once the job is stale, so ``compute`` can stop early.
    """

    key: Hashable
    generation: int
    compute: Callable[..., Any]
    apply: Callable[[Any], None]
    due: float
    progress: Callable[[Any], None] | None = None


class Worker:
    """One background thread running the newest job per key, debounced; stale results are dropped."""

    def __init__(self, debounce: float = DEBOUNCE, name: str = THREAD_NAME) -> None:
        self.debounce = debounce
        self.name = name
        self.errors: list[BaseException] = []  # kept, never printed: a thread must not write to a cell
        self.applied = 0
        self.dropped = 0
        self._cond = threading.Condition()
        self._pending: dict[Hashable, Job] = {}
        self._newest: dict[Hashable, int] = {}
        self._generations = itertools.count(1)
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        key: Hashable,
        compute: Callable[..., Any],
        apply: Callable[[Any], None],
        delay: float | None = None,
        progress: Callable[[Any], None] | None = None,
    ) -> int:
        """Queue work for ``key``, replacing any not yet started; its generation (0 once stopped).

        ``progress``: ``compute`` takes one argument, a function it calls with each partial result (see Job).
        """
        with self._cond:
            if self._stopped:
                return 0
            generation = next(self._generations)
            self._newest[key] = generation
            due = time.monotonic() + (self.debounce if delay is None else delay)
            self._pending[key] = Job(key, generation, compute, apply, due, progress)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return generation

    def current(self, key: Hashable, generation: int) -> bool:
        """Whether ``generation`` is still the newest job submitted for ``key``."""
        with self._cond:
            return not self._stopped and self._newest.get(key) == generation

    def _next(self) -> Job | None:
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
                result = job.compute(self._poster(job)) if job.progress is not None else job.compute()
                with LOCK:
                    if self.current(job.key, job.generation):
                        job.apply(result)
                        self.applied += 1
                    else:
                        self.dropped += 1
            except Exception as exc:  # a bug in a view must not end the thread every panel shares
                self.errors.append(exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _poster(self, job: Job) -> Poster:
        return Poster(self, job)

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
        """Drop queued work, let a running job finish (its result is dropped), and join the thread. Idempotent."""
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


class Poster:
    """What a job's ``compute`` is handed with ``progress``: call it with a partial result (applied under the lock if
    the job is still the newest of its kind; it says whether it is), ask ``stale()`` between slow steps."""

    def __init__(self, worker: Worker, job: Job) -> None:
        self.worker = worker
        self.job = job

    def __call__(self, partial: Any) -> bool:
        with LOCK:
            if self.job.progress is None or self.stale():
                return False
            self.job.progress(partial)
            return True

    def stale(self) -> bool:
        """Whether a newer job of the same kind came in (or the worker stopped)."""
        return not self.worker.current(self.job.key, self.job.generation)


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
