"""The real IPython shell with an empty session, for modules of many short tests (holders, free).

conftest's ``fresh_ip`` forgets the session before and after each test and then collects: three full
``gc.collect()`` passes a test (IPython's ``reset()`` runs one itself), each a walk over the whole heap, which in a
worker that has imported torch and transformers and run other tests is most of such a test's time. Between two tests
nothing runs but pytest, so one full collection a test leaves the same state: the session is forgotten (variables,
output history, the last error) before and after, and the garbage a test leaves is collected after it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def forget_the_session(shell: Any) -> None:
    """What ``fresh_ip`` forgets, without the full collection IPython's ``reset()`` runs (the caller collects).

    The heap is frozen while the shell resets, so reset's own ``gc.collect()`` walks only what the reset made;
    unfreezing hands every object back to the collector (in its oldest generation), nothing is lost to it.
    """
    frozen = gc.get_freeze_count() == 0  # never unfreeze what someone else froze
    if frozen:
        gc.freeze()
    try:
        shell.reset(new_session=False)
    finally:
        if frozen:
            gc.unfreeze()
    shell.last_execution_result = None
    shell.InteractiveTB.tb = None
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)


@contextmanager
def fresh_session(shell: Any) -> Iterator[Any]:
    """The shell with an empty session during the block; forgotten and collected after it.

    Each test starts right after the previous one's collection (a module's first: after its module fixture's).
    """
    forget_the_session(shell)
    try:
        yield shell
    finally:
        forget_the_session(shell)
        gc.collect()
